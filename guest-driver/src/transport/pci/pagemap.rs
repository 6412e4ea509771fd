//! Guest-physical addresses of this process's pages, from `/proc/self/pagemap`.
//!
//! Each 4 KiB page has a 64-bit entry: bit 63 "present", bit 62 "swapped", bits 0..=54 the
//! page frame number. The kernel shows PFNs only to readers with CAP_SYS_ADMIN; everybody
//! else reads 0, which this module reports as a permission problem rather than as address 0.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use crate::dma::PAGE_SIZE;

const PRESENT: u64 = 1 << 63;
const SWAPPED: u64 = 1 << 62;
const PFN_MASK: u64 = (1 << 55) - 1;

/// Why a pagemap entry gives no address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PagemapError {
    /// The page is not in memory.
    #[error("page {0:#x} is not present in memory")]
    NotPresent(usize),
    /// The page is swapped out.
    #[error("page {0:#x} is swapped out")]
    Swapped(usize),
    /// The PFN reads as 0: the reader lacks CAP_SYS_ADMIN.
    #[error(
        "/proc/self/pagemap hides physical addresses from this process (it needs CAP_SYS_ADMIN)"
    )]
    Hidden,
}

/// The physical address of the page at virtual address `page` from its pagemap `entry`.
pub fn decode_entry(page: usize, entry: u64) -> Result<u64, PagemapError> {
    if entry & PRESENT == 0 {
        return Err(if entry & SWAPPED != 0 {
            PagemapError::Swapped(page)
        } else {
            PagemapError::NotPresent(page)
        });
    }
    match entry & PFN_MASK {
        0 => Err(PagemapError::Hidden),
        pfn => Ok(pfn * PAGE_SIZE as u64),
    }
}

/// This process's pagemap.
pub struct Pagemap {
    file: File,
}

/// Errors reading the pagemap.
#[derive(Debug, thiserror::Error)]
pub enum PagemapReadError {
    /// The file could not be opened or read.
    #[error("/proc/self/pagemap: {0}")]
    Io(#[from] io::Error),
    /// An entry gives no address.
    #[error(transparent)]
    Entry(#[from] PagemapError),
}

impl Pagemap {
    /// Opens `/proc/self/pagemap`.
    pub fn open() -> io::Result<Self> {
        Ok(Pagemap {
            file: File::open("/proc/self/pagemap")?,
        })
    }

    /// Physical address of each 4 KiB page covering `[addr, addr + len)`. The pages must be
    /// resident (locked, or hugetlb).
    pub fn translate(&self, addr: usize, len: usize) -> Result<Vec<u64>, PagemapReadError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let first = addr / PAGE_SIZE;
        let end = addr
            .checked_add(len)
            .ok_or(PagemapError::NotPresent(addr))?
            .div_ceil(PAGE_SIZE);
        let mut raw = vec![0u8; (end - first) * 8];
        self.file.read_exact_at(&mut raw, first as u64 * 8)?;
        raw.chunks_exact(8)
            .enumerate()
            .map(|(i, entry)| {
                let entry = u64::from_ne_bytes(entry.try_into().expect("chunks of 8 bytes"));
                Ok(decode_entry((first + i) * PAGE_SIZE, entry)?)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_decode_to_page_addresses() {
        assert_eq!(decode_entry(0x1000, PRESENT | 0x1234), Ok(0x1234 * 4096));
        // Flag bits 55..=61 (soft-dirty, exclusive, file-page) are not part of the PFN.
        assert_eq!(
            decode_entry(0x1000, PRESENT | (1 << 55) | (1 << 61) | 7),
            Ok(7 * 4096)
        );
        assert_eq!(
            decode_entry(0x2000, 0),
            Err(PagemapError::NotPresent(0x2000))
        );
        assert_eq!(
            decode_entry(0x3000, SWAPPED | 0x55),
            Err(PagemapError::Swapped(0x3000))
        );
        assert_eq!(decode_entry(0x4000, PRESENT), Err(PagemapError::Hidden));
    }

    #[test]
    fn own_pages_are_present_or_hidden() {
        // Without CAP_SYS_ADMIN (the usual case for tests) every PFN reads as 0.
        let pagemap = Pagemap::open().unwrap();
        let data = vec![1u8; 3 * PAGE_SIZE];
        let result = pagemap.translate(data.as_ptr() as usize + 10, 2 * PAGE_SIZE);
        match result {
            Ok(pages) => {
                assert_eq!(pages.len(), 3);
                assert!(pages.iter().all(|p| p % PAGE_SIZE as u64 == 0 && *p != 0));
            }
            Err(PagemapReadError::Entry(PagemapError::Hidden)) => {}
            Err(e) => panic!("unexpected pagemap error: {e}"),
        }
        assert_eq!(
            pagemap.translate(data.as_ptr() as usize, 0).unwrap(),
            Vec::<u64>::new()
        );
    }
}

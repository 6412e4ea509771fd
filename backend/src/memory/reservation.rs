// Copyright 2026 The vrdma Authors
// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause

//! Address-space reservations: ranges of this process's address space reserved inaccessible
//! and then filled with file mappings at fixed offsets (the building block of MR windows).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use super::error::MemError;

/// A range of our address space we own, unmapped on drop.
#[derive(Debug)]
pub(super) struct Reservation {
    /// Start address; kept as an integer so that windows are `Send` and `Sync`.
    pub(super) addr: usize,
    pub(super) len: usize,
}

impl Reservation {
    /// Reserves `len` bytes of inaccessible address space starting at a multiple of `alignment`.
    pub(super) fn new(len: usize, alignment: usize) -> Result<Self, MemError> {
        let host_page_size = host_page_size() as usize;
        let alignment = alignment.max(host_page_size);
        let oversized = len
            .checked_add(alignment - host_page_size)
            .ok_or(MemError::Reserve {
                len,
                source: io::Error::from_raw_os_error(libc::ENOMEM),
            })?;
        // SAFETY: a new private anonymous mapping at an address of the kernel's choosing does not
        // touch any existing memory.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                oversized,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(MemError::Reserve {
                len: oversized,
                source: io::Error::last_os_error(),
            });
        }
        let start = raw as usize;
        let addr = start.next_multiple_of(alignment);
        // Give back the unaligned head and the tail beyond `len`.
        unmap(start, addr - start);
        unmap(addr + len, start + oversized - (addr + len));
        Ok(Reservation { addr, len })
    }

    /// Maps `len` bytes of `file` (mappable in units of `granularity`) from `file_offset` at
    /// `offset` into the reservation and [`populate`]s them for the pinning that follows.
    pub(super) fn map_file(
        &self,
        file: &File,
        offset: u64,
        file_offset: u64,
        len: u64,
        granularity: u64,
    ) -> Result<(), MemError> {
        let map_error = |source| MemError::Map {
            file_offset,
            len: len as usize,
            source,
        };
        let inside = offset
            .checked_add(len)
            .is_some_and(|end| end <= self.len as u64);
        let file_offset_arg = libc::off_t::try_from(file_offset)
            .map_err(|_| map_error(io::Error::from_raw_os_error(libc::EOVERFLOW)))?;
        if !inside {
            return Err(map_error(io::Error::from_raw_os_error(libc::EINVAL)));
        }
        let target = (self.addr + offset as usize) as *mut libc::c_void;
        // SAFETY: `target..target + len` is inside our reservation (checked above), which no
        // Rust object refers to, so replacing it with a shared mapping of guest RAM invalidates
        // nothing.
        let mapped = unsafe {
            libc::mmap(
                target,
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                file.as_raw_fd(),
                file_offset_arg,
            )
        };
        if mapped == libc::MAP_FAILED {
            return Err(map_error(io::Error::last_os_error()));
        }
        populate(target as usize, len, granularity);
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        unmap(self.addr, self.len);
    }
}

/// Unmaps address space this module reserved.
pub(super) fn unmap(addr: usize, len: usize) {
    if len == 0 {
        return;
    }
    // SAFETY: only called on ranges of reservations made by `Reservation::new`, which nothing
    // else refers to once unmapped.
    if unsafe { libc::munmap(addr as *mut libc::c_void, len) } != 0 {
        log::error!(
            "munmap({addr:#x}, {len:#x}) failed: {}",
            io::Error::last_os_error()
        );
    }
}

/// The host page size.
pub(super) fn host_page_size() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size)
        .ok()
        .filter(|size| size.is_power_of_two())
        .unwrap_or(4096)
}

/// The kernel's default fault-around window (`fault_around_bytes`, 64 KiB since Linux 3.15): a
/// read fault on a file page maps the pages of its window already in the page cache too.
const FAULT_AROUND_BYTES: usize = 64 << 10;

/// Fills this process's page tables for `addr..addr + len` (rounded out to host pages) with
/// read faults so that pinning the range afterwards finds its pages mapped instead of taking a
/// write fault per page. `granularity` is the mapping's page size (a huge page on hugetlbfs).
///
/// On pages of the host's base size it faults one page per fault-around window, which the
/// kernel fills around it: one MADV_POPULATE_READ over the whole range would also walk every
/// page table entry after its window was filled, which under TCG cost half as much again
/// (300 against 200 ms/GiB measured). A kernel tuned to a smaller window leaves pages
/// unmapped, which the pinning then faults itself; so does any failure here (best effort).
pub(super) fn populate(addr: usize, len: u64, granularity: u64) {
    let page = host_page_size() as usize;
    let start = addr & !(page - 1);
    let Some(end) = usize::try_from(len)
        .ok()
        .and_then(|len| addr.checked_add(len))
        .and_then(|end| end.checked_next_multiple_of(page))
    else {
        return;
    };
    if granularity > page as u64 {
        // Each fault maps a whole huge page, and the walk steps by huge pages.
        madvise_populate(start, end - start);
        return;
    }
    let mut window_start = start;
    while window_start < end {
        let window_end = (window_start | (FAULT_AROUND_BYTES - 1))
            .checked_add(1)
            .map_or(end, |next| next.min(end));
        // The window's last page: a fault at a mapping's first page maps the window's size
        // from there, which can reach into the next window but never to its last page, so
        // that page still faults (a page already mapped would not) and fills its window.
        madvise_populate(window_end - page, page);
        window_start = window_end;
    }
}

/// MADV_POPULATE_READ over `start..start + len`, failures logged.
fn madvise_populate(start: usize, len: usize) {
    // SAFETY: MADV_POPULATE_READ only faults pages of existing mappings in (as reading them
    // would); it changes no memory contents and fails on holes instead of mapping anything.
    let rc = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_POPULATE_READ) };
    if rc != 0 {
        log::debug!(
            "populating {len:#x} bytes at {start:#x}: {}",
            io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::test_files::{guest_memory, memfd, KIB, MIB, PAGE};
    use std::os::unix::fs::FileExt;
    use std::sync::Arc;
    use vm_memory::GuestMemoryBackend;

    /// Whether each page of `addr..addr + len` is in this process's page tables (bit 63 of its
    /// `/proc/self/pagemap` entry).
    fn present_pages(addr: usize, len: u64) -> Vec<bool> {
        let pagemap = File::open("/proc/self/pagemap").unwrap();
        let mut entries = vec![0u8; (len / PAGE) as usize * 8];
        pagemap
            .read_exact_at(&mut entries, addr as u64 / PAGE * 8)
            .unwrap();
        entries
            .chunks(8)
            .map(|entry| u64::from_le_bytes(entry.try_into().unwrap()) >> 63 == 1)
            .collect()
    }

    /// A file whose pages are all in the page cache, as guest RAM the guest has touched is.
    fn written_file(len: u64) -> File {
        let file = memfd(c"populate", len);
        file.write_all_at(&vec![0x5a; len as usize], 0).unwrap();
        file
    }

    // These rely on the kernel's default fault-around window (64 KiB): one fault per window
    // must map all of it.
    #[test]
    fn a_mapped_file_comes_populated_at_every_alignment() {
        let file = written_file(MIB);
        let window = Reservation::new(4 * MIB as usize, 2 * MIB as usize).unwrap();
        // Each start within a fault-around window, and mappings across a page table's
        // boundary (2 MiB), where the kernel ends its windows early.
        let starts = (0..16).map(|page| page * PAGE);
        for start in starts
            .clone()
            .chain(starts.map(|start| 2 * MIB - 17 * PAGE + start))
        {
            let len = MIB - 3 * PAGE;
            // An odd file offset too: the kernel's windows follow virtual addresses.
            window.map_file(&file, start, 3 * PAGE, len, PAGE).unwrap();
            let missing: Vec<usize> = present_pages(window.addr + start as usize, len)
                .iter()
                .enumerate()
                .filter_map(|(page, &present)| (!present).then_some(page))
                .collect();
            assert!(
                missing.is_empty(),
                "start {start:#x}: pages {missing:?} missing"
            );
        }
    }

    #[test]
    fn populating_covers_an_unaligned_range_of_guest_rams_mapping() {
        let file = Arc::new(written_file(MIB));
        // The daemon's own mapping of guest RAM: nothing in its page tables yet.
        let ram = guest_memory(&[(0, MIB, &file, 0)]);
        let addr = ram.iter().next().unwrap().as_ptr() as usize;
        assert!(present_pages(addr, MIB).iter().all(|&p| !p));
        let (from, to) = (60 * KIB, 200 * KIB);
        populate(addr + from as usize, to - from, PAGE);
        let present = present_pages(addr, MIB);
        let wanted = (from / PAGE) as usize..(to / PAGE) as usize;
        assert!(present[wanted].iter().all(|&p| p), "{present:?}");
    }

    #[test]
    fn populating_past_the_end_of_the_file_is_harmless() {
        let file = written_file(64 * KIB);
        let window = Reservation::new(MIB as usize, PAGE as usize).unwrap();
        // The mapping is allowed; touching its pages past the file's end would raise SIGBUS.
        window.map_file(&file, 0, 0, MIB, PAGE).unwrap();
        populate(window.addr, MIB, PAGE);
        let present = present_pages(window.addr, MIB);
        assert!(present[..16].iter().all(|&p| p));
        assert!(present[16..].iter().all(|&p| !p));
    }
}

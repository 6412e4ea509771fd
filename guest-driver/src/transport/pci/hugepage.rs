//! DMA memory of a real guest: hugepages for what the library allocates, pinned application
//! memory for what it registers.
//!
//! Allocations come from hugetlb mappings (`MAP_HUGETLB`): a hugepage is physically
//! contiguous and never moved or swapped, so rings, command buffers and the doorbell area can
//! be handed to the device by address. Allocations up to a hugepage are placed inside one;
//! larger ones get mappings of their own (contiguous per hugepage, which is all the page
//! lists of the device need). Any other memory is translated after `mlock`, page by page:
//! locked pages stay resident, but the kernel may still migrate them (compaction), which
//! hugepage-backed buffers ([`crate::Context::alloc_buffer`]) avoid.

use std::fs;
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use log::debug;
use parking_lot::Mutex;

use super::function::PciError;
use super::pagemap::{Pagemap, PagemapError, PagemapReadError};
use crate::dma::{dont_fork, DmaBuffer, DmaError, DmaMemory, PAGE_SIZE};

/// Hugepage size when /proc/meminfo does not say.
const DEFAULT_HUGEPAGE_SIZE: usize = 2 << 20;

/// The default hugepage size from a `/proc/meminfo` text.
pub fn hugepage_size_from_meminfo(meminfo: &str) -> Option<usize> {
    let line = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("Hugepagesize:"))?;
    let kib: usize = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
        .filter(|size| size.is_power_of_two() && *size >= PAGE_SIZE)
}

/// One hugetlb mapping; unmapped on drop.
struct HugeMapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: plain memory owned by this value; accesses are coordinated by its users.
unsafe impl Send for HugeMapping {}
// SAFETY: see Send.
unsafe impl Sync for HugeMapping {}

impl HugeMapping {
    fn new(len: usize) -> io::Result<Self> {
        // SAFETY: a new anonymous mapping; no existing memory is affected. Shared, so that a
        // fork never copies a page on write and moves it away from the device.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base =
            NonNull::new(addr.cast()).ok_or_else(|| io::Error::other("mmap returned NULL"))?;
        let mapping = HugeMapping { base, len };
        // The rings and command buffers are the parent's device's: a fork() child gets no
        // mapping of them.
        // SAFETY: the mapping just made, owned by `mapping`.
        unsafe { dont_fork(base.as_ptr(), len) }?;
        Ok(mapping)
    }
}

impl Drop for HugeMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; no buffer into it outlives this value.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// A hugepage shared by small allocations, with a free map of its 4 KiB pages.
struct Chunk {
    mapping: HugeMapping,
    page_free: Vec<bool>,
}

impl Chunk {
    /// First free run of `pages` pages starting at a multiple of `align_pages`.
    fn take(&mut self, pages: usize, align_pages: usize) -> Option<usize> {
        let start = (0..self.page_free.len())
            .step_by(align_pages)
            .find(|&start| {
                self.page_free
                    .get(start..start + pages)
                    .is_some_and(|run| run.iter().all(|&free| free))
            })?;
        self.page_free[start..start + pages].fill(false);
        Some(start)
    }
}

struct Pool {
    hugepage_size: usize,
    chunks: Mutex<Vec<Chunk>>,
}

/// Keeps a range of a chunk allocated; gives it back on drop.
struct ChunkAllocation {
    pool: Arc<Pool>,
    chunk: usize,
    first_page: usize,
    pages: usize,
}

impl Drop for ChunkAllocation {
    fn drop(&mut self) {
        let mut chunks = self.pool.chunks.lock();
        chunks[self.chunk].page_free[self.first_page..self.first_page + self.pages].fill(true);
    }
}

/// [`DmaMemory`] of a guest: hugepages, and locked memory translated through the pagemap.
pub struct HugepageDma {
    pool: Arc<Pool>,
    pagemap: Pagemap,
}

impl HugepageDma {
    /// Checks that hugepages can be had and that physical addresses are visible, by
    /// mapping a first hugepage and translating it.
    pub fn new() -> Result<Self, PciError> {
        let hugepage_size = fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|text| hugepage_size_from_meminfo(&text))
            .unwrap_or(DEFAULT_HUGEPAGE_SIZE);
        let pagemap = Pagemap::open().map_err(|source| PciError::Io {
            what: "opening /proc/self/pagemap".into(),
            source,
        })?;
        let dma = HugepageDma {
            pool: Arc::new(Pool {
                hugepage_size,
                chunks: Mutex::new(Vec::new()),
            }),
            pagemap,
        };
        let first = dma
            .map_chunk()
            .map_err(|e| no_hugepages(hugepage_size, e))?;
        match dma
            .pagemap
            .translate(first.mapping.base.as_ptr() as usize, PAGE_SIZE)
        {
            Ok(_) => {}
            Err(PagemapReadError::Entry(PagemapError::Hidden)) => {
                return Err(PciError::PermissionDenied(
                    "/proc/self/pagemap hides physical addresses (CAP_SYS_ADMIN needed)".into(),
                ))
            }
            Err(e) => {
                return Err(PciError::Io {
                    what: "translating a hugepage".into(),
                    source: io::Error::other(e),
                })
            }
        }
        dma.pool.chunks.lock().push(first);
        debug!("DMA memory from {} KiB hugepages", hugepage_size >> 10);
        Ok(dma)
    }

    fn map_chunk(&self) -> io::Result<Chunk> {
        let size = self.pool.hugepage_size;
        Ok(Chunk {
            mapping: HugeMapping::new(size)?,
            page_free: vec![true; size / PAGE_SIZE],
        })
    }

    fn alloc_in_chunk(&self, len: usize, align: usize) -> Result<DmaBuffer, DmaError> {
        let pages = len.div_ceil(PAGE_SIZE);
        let align_pages = align / PAGE_SIZE;
        let mut chunks = self.pool.chunks.lock();
        let found = chunks
            .iter_mut()
            .enumerate()
            .find_map(|(index, chunk)| Some((index, chunk.take(pages, align_pages)?)));
        let (chunk, first_page) = match found {
            Some(found) => found,
            None => {
                let mut chunk = self
                    .map_chunk()
                    .map_err(|e| hugepage_exhausted(self.pool.hugepage_size, e))?;
                let first_page = chunk.take(pages, align_pages).ok_or(DmaError::BadRequest {
                    len: pages * PAGE_SIZE,
                    align,
                })?;
                chunks.push(chunk);
                (chunks.len() - 1, first_page)
            }
        };
        // SAFETY: `first_page + pages` lies inside the chunk's mapping (`take` checked it).
        let ptr = unsafe { chunks[chunk].mapping.base.add(first_page * PAGE_SIZE) };
        drop(chunks);
        let owner = ChunkAllocation {
            pool: self.pool.clone(),
            chunk,
            first_page,
            pages,
        };
        Ok(zeroed_buffer(ptr, pages * PAGE_SIZE, len, Box::new(owner)))
    }
}

/// A buffer of `len` bytes at `ptr`, whose `allocated` bytes (at least `len`) `owner` keeps
/// allocated, all zeroed.
fn zeroed_buffer(
    ptr: NonNull<u8>,
    allocated: usize,
    len: usize,
    owner: Box<dyn std::any::Any + Send + Sync>,
) -> DmaBuffer {
    // SAFETY: the range is mapped writable and exclusively ours until `owner` drops.
    unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, allocated) };
    // SAFETY: valid, page aligned and zeroed while `owner` lives; handed out once.
    unsafe { DmaBuffer::from_raw_parts(ptr, len, owner) }
}

fn no_hugepages(size: usize, e: io::Error) -> PciError {
    PciError::NoHugepages(format!(
        "mapping a {} KiB hugepage failed ({e}); reserve some, e.g. \
         `echo 64 > /proc/sys/vm/nr_hugepages`",
        size >> 10
    ))
}

fn hugepage_exhausted(size: usize, e: io::Error) -> DmaError {
    DmaError::Io {
        what: "mapping more hugepages (raise /proc/sys/vm/nr_hugepages)",
        source: io::Error::new(e.kind(), format!("{size}-byte hugepage: {e}")),
    }
}

impl DmaMemory for HugepageDma {
    fn alloc(&self, len: usize, align: usize) -> Result<DmaBuffer, DmaError> {
        let size = self.pool.hugepage_size;
        if len == 0 || !align.is_power_of_two() || align > size {
            return Err(DmaError::BadRequest { len, align });
        }
        let align = align.max(PAGE_SIZE);
        if len <= size {
            return self.alloc_in_chunk(len, align);
        }
        let mapped_len = len
            .checked_next_multiple_of(size)
            .ok_or(DmaError::BadRequest { len, align })?;
        let mapping = HugeMapping::new(mapped_len).map_err(|e| hugepage_exhausted(size, e))?;
        let ptr = mapping.base;
        Ok(zeroed_buffer(ptr, mapped_len, len, Box::new(mapping)))
    }

    fn translate(&self, addr: *const u8, len: usize) -> Result<Vec<u64>, DmaError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let start = addr as usize & !(PAGE_SIZE - 1);
        let end = (addr as usize)
            .checked_add(len)
            .and_then(|end| end.checked_next_multiple_of(PAGE_SIZE))
            .ok_or(DmaError::NotDmaMemory {
                addr: addr as usize,
                len,
            })?;
        // Locked pages stay resident, so their frames stay where the device is told they are.
        // SAFETY: mlock only changes residency of the caller's own mapped pages; it fails
        // (ENOMEM) for addresses that are not mapped.
        if unsafe { libc::mlock(start as *const libc::c_void, end - start) } != 0 {
            return Err(DmaError::Io {
                what: "locking memory for DMA (mlock)",
                source: io::Error::last_os_error(),
            });
        }
        self.pagemap
            .translate(addr as usize, len)
            .map_err(|e| DmaError::Io {
                what: "translating through /proc/self/pagemap",
                source: io::Error::other(e),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hugepage_size_is_read_from_meminfo() {
        let meminfo = "MemTotal: 100 kB\nHugePages_Total: 0\nHugepagesize:       2048 kB\n";
        assert_eq!(hugepage_size_from_meminfo(meminfo), Some(2 << 20));
        assert_eq!(
            hugepage_size_from_meminfo("Hugepagesize: 1048576 kB"),
            Some(1 << 30)
        );
        assert_eq!(hugepage_size_from_meminfo("MemTotal: 1 kB"), None);
        assert_eq!(hugepage_size_from_meminfo("Hugepagesize: 3 kB"), None);
    }

    #[test]
    fn chunks_place_aligned_runs_of_free_pages() {
        let mut chunk = Chunk {
            mapping: HugeMapping::new_for_test(8 * PAGE_SIZE),
            page_free: vec![true; 8],
        };
        assert_eq!(chunk.take(1, 1), Some(0));
        assert_eq!(chunk.take(2, 2), Some(2));
        assert_eq!(chunk.take(1, 1), Some(1));
        assert_eq!(chunk.take(4, 4), Some(4));
        assert_eq!(chunk.take(1, 1), None);
        chunk.page_free[2..4].fill(true);
        assert_eq!(chunk.take(3, 1), None);
        assert_eq!(chunk.take(2, 1), Some(2));
    }

    impl HugeMapping {
        /// Ordinary anonymous pages (tests cannot count on hugepages).
        fn new_for_test(len: usize) -> Self {
            // SAFETY: a new private anonymous mapping.
            let addr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(addr, libc::MAP_FAILED);
            HugeMapping {
                base: NonNull::new(addr.cast()).unwrap(),
                len,
            }
        }
    }
}

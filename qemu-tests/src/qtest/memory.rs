//! Guest RAM of a qtest machine, as the test process sees it.
//!
//! QEMU's RAM is a `memory-backend-file` with `share=on` on a file this module creates and
//! maps shared; the machine's only RAM starts at guest-physical address 0, so a byte's bus
//! address is its offset in the file. Allocations come from above [`RESERVED_LOW`], clear of
//! the legacy VGA hole and the BIOS ROMs below 1 MiB.

use std::fs::{File, OpenOptions};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

use parking_lot::Mutex;

use vrdma::dma::{map_shared, DmaBuffer, DmaError, DmaMemory, FreeRanges, PAGE_SIZE};

/// Guest RAM below this address is never handed out.
pub const RESERVED_LOW: usize = 1 << 20;

/// The file behind guest RAM, mapped in this process.
struct Mapping {
    path: PathBuf,
    _file: File,
    base: NonNull<u8>,
    len: usize,
    free: Mutex<FreeRanges>,
}

// SAFETY: the mapping is shared memory owned by `Mapping` for its whole life; the allocator
// state is behind a mutex.
unsafe impl Send for Mapping {}
// SAFETY: as for Send; nothing hands out references to the mapped bytes.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are the mapping made in `GuestMemory::create`; every buffer
        // handed out holds an `Arc<Mapping>`, so none outlives it.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Guest RAM shared between QEMU and the test: a page allocator with bus addresses.
#[derive(Clone)]
pub struct GuestMemory {
    mapping: Arc<Mapping>,
}

impl std::fmt::Debug for GuestMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestMemory")
            .field("path", &self.mapping.path)
            .field("len", &self.mapping.len)
            .finish()
    }
}

impl GuestMemory {
    /// Creates `path` with `len` bytes (a multiple of the page size, above
    /// [`RESERVED_LOW`]) and maps it. The file stays until [`GuestMemory::unlink`].
    pub fn create(path: &Path, len: usize) -> std::io::Result<GuestMemory> {
        if len <= RESERVED_LOW || !len.is_multiple_of(PAGE_SIZE) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("guest RAM of {len:#x} bytes"),
            ));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        let mapped = file
            .set_len(len as u64)
            .and_then(|()| map_shared(file.as_fd(), len));
        let base = match mapped {
            Ok(base) => base,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(e);
            }
        };
        Ok(GuestMemory {
            mapping: Arc::new(Mapping {
                path: path.to_path_buf(),
                _file: file,
                base,
                len,
                free: Mutex::new(FreeRanges::new(RESERVED_LOW, len)),
            }),
        })
    }

    /// The backing file (for QEMU's `mem-path`).
    pub fn path(&self) -> &Path {
        &self.mapping.path
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.mapping.len
    }

    /// Never true: guest RAM is larger than [`RESERVED_LOW`].
    pub fn is_empty(&self) -> bool {
        self.mapping.len == 0
    }

    /// Removes the file's name once QEMU has opened it; the memory lives on in both mappings.
    pub fn unlink(&self) -> std::io::Result<()> {
        match std::fs::remove_file(&self.mapping.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Bus (guest-physical) address of `len` bytes at `addr`, if they lie in guest RAM.
    pub fn bus_address(&self, addr: *const u8, len: usize) -> Option<u64> {
        let start = addr as usize;
        let base = self.mapping.base.as_ptr() as usize;
        let end = start.checked_add(len)?;
        (start >= base && end <= base + self.mapping.len).then(|| (start - base) as u64)
    }

    /// Bytes available to allocations now.
    pub fn free_bytes(&self) -> usize {
        self.mapping.free.lock().total()
    }
}

impl DmaMemory for GuestMemory {
    fn alloc(&self, len: usize, align: usize) -> Result<DmaBuffer, DmaError> {
        if len == 0 || !align.is_power_of_two() {
            return Err(DmaError::BadRequest { len, align });
        }
        let pages_len = len
            .checked_next_multiple_of(PAGE_SIZE)
            .ok_or(DmaError::BadRequest { len, align })?;
        let align = align.max(PAGE_SIZE);
        let offset = self
            .mapping
            .free
            .lock()
            .take(pages_len, align)
            .ok_or(DmaError::OutOfMemory { len, align })?;
        // SAFETY: `offset + pages_len <= len` of the mapping (allocator invariant).
        let ptr = unsafe { self.mapping.base.add(offset) };
        // SAFETY: the range is inside the writable mapping and exclusively ours until freed.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, pages_len) };
        let owner = Allocation {
            mapping: self.mapping.clone(),
            offset,
            len: pages_len,
        };
        // SAFETY: valid, page aligned and zeroed while `owner` lives (it keeps the mapping
        // and frees the range on drop); the allocator hands each range out once.
        Ok(unsafe { DmaBuffer::from_raw_parts(ptr, len, Box::new(owner)) })
    }

    fn translate(&self, addr: *const u8, len: usize) -> Result<Vec<u64>, DmaError> {
        let first = self.bus_address(addr, len).ok_or(DmaError::NotDmaMemory {
            addr: addr as usize,
            len,
        })?;
        if len == 0 {
            return Ok(Vec::new());
        }
        let page = PAGE_SIZE as u64;
        Ok((first & !(page - 1)..first + len as u64)
            .step_by(PAGE_SIZE)
            .collect())
    }
}

/// One allocation; gives its pages back when dropped.
struct Allocation {
    mapping: Arc<Mapping>,
    offset: usize,
    len: usize,
}

impl Drop for Allocation {
    fn drop(&mut self) {
        self.mapping.free.lock().give_back(self.offset, self.len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("vrdma-guest-ram-{}-{name}", std::process::id()))
    }

    #[test]
    fn allocations_are_zeroed_aligned_and_translated_to_file_offsets() {
        let path = scratch("alloc");
        let ram = GuestMemory::create(&path, 4 << 20).unwrap();
        let a = ram.alloc(100, 1).unwrap();
        let b = ram.alloc(3 * PAGE_SIZE, 4 * PAGE_SIZE).unwrap();
        assert_eq!(ram.bus_address(a.as_ptr(), 100), Some(RESERVED_LOW as u64));
        let b_bus = ram.bus_address(b.as_ptr(), b.len()).unwrap();
        assert_eq!(b_bus % (4 * PAGE_SIZE as u64), 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        // The file holds what the mapping holds: QEMU sees the bytes at the bus address.
        // SAFETY: `a` is ours and nothing else writes it.
        unsafe { a.as_mut_ptr().add(10).write(0x5a) };
        let file = std::fs::read(&path).unwrap();
        assert_eq!(file[RESERVED_LOW + 10], 0x5a);
        // SAFETY: one byte inside `b`.
        let inside = unsafe { b.as_ptr().add(PAGE_SIZE + 1) };
        assert_eq!(
            ram.translate(inside, PAGE_SIZE).unwrap(),
            vec![b_bus + PAGE_SIZE as u64, b_bus + 2 * PAGE_SIZE as u64]
        );
        let outside = [0u8; 8];
        assert!(ram.translate(outside.as_ptr(), 8).is_err());
        ram.unlink().unwrap();
        assert!(!path.exists());
        ram.unlink().unwrap();
    }

    #[test]
    fn freed_pages_are_reused_and_exhaustion_is_an_error() {
        let path = scratch("reuse");
        let ram = GuestMemory::create(&path, RESERVED_LOW + 4 * PAGE_SIZE).unwrap();
        ram.unlink().unwrap();
        let all = ram.alloc(4 * PAGE_SIZE, PAGE_SIZE).unwrap();
        assert_eq!(ram.free_bytes(), 0);
        assert!(matches!(ram.alloc(1, 1), Err(DmaError::OutOfMemory { .. })));
        drop(all);
        assert_eq!(ram.free_bytes(), 4 * PAGE_SIZE);
        let one = ram.alloc(PAGE_SIZE, PAGE_SIZE).unwrap();
        let two = ram.alloc(PAGE_SIZE, PAGE_SIZE).unwrap();
        drop(one);
        let again = ram.alloc(PAGE_SIZE, PAGE_SIZE).unwrap();
        assert_eq!(
            ram.bus_address(again.as_ptr(), 1),
            Some(RESERVED_LOW as u64)
        );
        drop((two, again));
        assert_eq!(ram.free_bytes(), 4 * PAGE_SIZE);
        assert!(ram.alloc(0, 1).is_err());
        assert!(ram.alloc(1, 3).is_err());
    }

    #[test]
    fn rejects_bad_sizes_and_existing_files() {
        let path = scratch("bad");
        assert!(GuestMemory::create(&path, RESERVED_LOW).is_err());
        assert!(GuestMemory::create(&path, RESERVED_LOW + 100).is_err());
        assert!(!path.exists());
        let ram = GuestMemory::create(&path, 2 * RESERVED_LOW).unwrap();
        assert!(GuestMemory::create(&path, 2 * RESERVED_LOW).is_err());
        ram.unlink().unwrap();
    }
}

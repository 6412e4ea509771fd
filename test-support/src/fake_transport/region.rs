//! The fake's shared-memory region: an anonymous reservation whose extents become accessible
//! when the device maps a queue buffer there and inaccessible again when it unmaps it, so a use
//! after DESTROY faults.

use std::ptr::NonNull;

/// The shared-memory region: reserved inaccessible, made accessible extent by extent.
pub(crate) struct Region {
    pub(crate) base: NonNull<u8>,
    pub(crate) len: usize,
}

// SAFETY: a mapping owned by the region for its whole life; accesses go through raw pointers
// and atomics under the fake's own protocol.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    pub(crate) fn new(len: usize) -> Region {
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        Region {
            base: NonNull::new(addr.cast()).unwrap(),
            len,
        }
    }

    /// SHMEM_MAP of a zeroed extent.
    pub(crate) fn map(&self, offset: usize, len: usize) -> *mut u8 {
        assert!(offset + len <= self.len);
        // SAFETY: the extent lies in our reservation.
        let ptr = unsafe { self.base.as_ptr().add(offset) };
        // SAFETY: changes the protection of pages of our own mapping.
        let rc = unsafe { libc::mprotect(ptr.cast(), len, libc::PROT_READ | libc::PROT_WRITE) };
        assert_eq!(rc, 0);
        // SAFETY: just made writable; nobody else uses the extent yet.
        unsafe { ptr.write_bytes(0, len) };
        ptr
    }

    /// SHMEM_UNMAP: later accesses fault.
    pub(crate) fn unmap(&self, offset: usize, len: usize) {
        // SAFETY: the extent lies in our reservation.
        let ptr = unsafe { self.base.as_ptr().add(offset) };
        // SAFETY: changes the protection of pages of our own mapping.
        let rc = unsafe { libc::mprotect(ptr.cast(), len, libc::PROT_NONE) };
        assert_eq!(rc, 0);
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the reservation made in `new`.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

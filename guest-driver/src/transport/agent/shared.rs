//! What a process of an agent that shares one device among all its processes (VM mode) maps
//! besides its own RAM: the device's queue region (through the BAR's sysfs resource file the
//! agent opened) and the doorbell area the agent registered (a memfd).

use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;

use crate::dma::{dont_fork, map_shared_at, PAGE_SIZE};
use crate::transport::TransportError;

/// `len` bytes of a file mapped shared and writable; unmapped on drop.
pub(super) struct FileMapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: a plain address range owned by this value; accesses to it are the caller's own
// (atomic or volatile, shared with the device).
unsafe impl Send for FileMapping {}
// SAFETY: see Send; the struct itself is immutable.
unsafe impl Sync for FileMapping {}

impl FileMapping {
    /// Maps `[offset, offset + len)` of `fd`, page aligned, `MADV_DONTFORK` (a `fork()` child
    /// gets no mapping of the parent's queues and doorbells).
    pub(super) fn new(
        fd: &OwnedFd,
        offset: u64,
        len: u64,
        what: &'static str,
    ) -> Result<Self, TransportError> {
        let bad =
            || TransportError::DeviceFailure(format!("{what}: {len:#x} bytes at {offset:#x}"));
        let len_bytes = usize::try_from(len)
            .ok()
            .filter(|len| *len > 0)
            .ok_or_else(bad)?
            .next_multiple_of(PAGE_SIZE);
        let file_offset = libc::off_t::try_from(offset)
            .ok()
            .filter(|o| (*o as usize).is_multiple_of(PAGE_SIZE))
            .ok_or_else(bad)?;
        let base =
            map_shared_at(fd.as_fd(), file_offset, len_bytes).map_err(TransportError::io(what))?;
        let mapping = FileMapping {
            base,
            len: len_bytes,
        };
        // SAFETY: the mapping just made, owned by `mapping`.
        unsafe { dont_fork(base.as_ptr(), len_bytes) }.map_err(TransportError::io(what))?;
        Ok(mapping)
    }

    pub(super) fn base(&self) -> NonNull<u8> {
        self.base
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; nothing borrowed from it outlives the transport
        // that owns this value.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

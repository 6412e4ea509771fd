//! The process transport's view of the device's shared-memory region 0: an address range
//! reserved inaccessible at setup and filled by the backend's SHMEM_MAP requests (queue
//! buffers, the doorbell area), which arrive on the backend request channel.
//!
//! Every page of the window is `MADV_DONTFORK`: a `fork()` child has no mapping of the
//! parent's queues, so nothing it does can write into them.

use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

use log::warn;
use vhost::vhost_user::message::{VhostUserMMap, VhostUserMMapFlags};
use vhost::vhost_user::{HandlerResult, VhostUserFrontendReqHandler};

use crate::dma::{dont_fork, PAGE_SIZE};
use crate::transport::{SharedMemory, TransportError};

/// The address range of shared-memory region 0: reserved inaccessible, filled by SHMEM_MAP.
pub(super) struct ShmemWindow {
    base: Option<NonNull<u8>>,
    len: usize,
}

// SAFETY: the window is an address range reserved for the whole life of this value; the
// mappings inside it are changed only with MAP_FIXED over that range.
unsafe impl Send for ShmemWindow {}
// SAFETY: see Send; the struct itself is immutable.
unsafe impl Sync for ShmemWindow {}

impl ShmemWindow {
    pub(super) fn reserve(len: u64) -> Result<Self, TransportError> {
        if len == 0 {
            return Ok(ShmemWindow { base: None, len: 0 });
        }
        let len = usize::try_from(len)
            .ok()
            .filter(|len| len.is_multiple_of(PAGE_SIZE))
            .ok_or_else(|| {
                TransportError::DeviceFailure(format!("shared-memory size {len:#x} is unusable"))
            })?;
        // SAFETY: a new private inaccessible mapping; no existing memory is affected.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(TransportError::io(
                "cannot reserve the shared-memory window",
            )(io::Error::last_os_error()));
        }
        let window = ShmemWindow {
            base: NonNull::new(addr.cast()),
            len,
        };
        // SAFETY: the reservation just made, owned by `window`.
        unsafe { dont_fork(addr.cast(), len) }.map_err(TransportError::io(
            "MADV_DONTFORK on the shared-memory window",
        ))?;
        Ok(window)
    }

    pub(super) fn shared_memory(&self) -> SharedMemory {
        SharedMemory::new(self.base, self.len)
    }

    /// Start address of `[offset, offset + len)` of the window, if valid for a mapping.
    fn range(&self, request: &VhostUserMMap) -> io::Result<*mut libc::c_void> {
        let (shmid, offset, len) = (request.shmid, request.shm_offset, request.len);
        let fd_offset = request.fd_offset;
        let page = PAGE_SIZE as u64;
        let valid = shmid == 0
            && len != 0
            && offset.is_multiple_of(page)
            && len.is_multiple_of(page)
            && fd_offset.is_multiple_of(page)
            && offset
                .checked_add(len)
                .is_some_and(|end| end <= self.len as u64);
        match (valid, self.base) {
            (true, Some(base)) => {
                // SAFETY: `offset < self.len`, so the address is inside the window.
                Ok(unsafe { base.as_ptr().add(offset as usize) }.cast())
            }
            _ => {
                warn!("refusing shared-memory request for region {shmid} at {offset:#x}+{len:#x}");
                Err(io::Error::from_raw_os_error(libc::EINVAL))
            }
        }
    }
}

impl VhostUserFrontendReqHandler for ShmemWindow {
    fn shmem_map(&self, request: &VhostUserMMap, fd: &dyn AsRawFd) -> HandlerResult<u64> {
        let addr = self.range(request)?;
        let writable = VhostUserMMapFlags::from_bits_truncate(request.flags)
            .contains(VhostUserMMapFlags::WRITABLE);
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        let offset = libc::off_t::try_from(request.fd_offset)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: `addr..addr + len` lies inside the window reserved by this value (checked
        // by `range`); MAP_FIXED replaces only pages of that window.
        let mapped = unsafe {
            libc::mmap(
                addr,
                request.len as usize,
                prot,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                offset,
            )
        };
        if mapped == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // A MAP_FIXED mapping is a new VMA without the reservation's advice.
        // SAFETY: the pages just mapped, inside the window.
        unsafe { dont_fork(addr.cast(), request.len as usize) }?;
        Ok(0)
    }

    fn shmem_unmap(&self, request: &VhostUserMMap) -> HandlerResult<u64> {
        let addr = self.range(request)?;
        // SAFETY: as in `shmem_map`; the range becomes inaccessible again.
        let mapped = unsafe {
            libc::mmap(
                addr,
                request.len as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if mapped == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above.
        unsafe { dont_fork(addr.cast(), request.len as usize) }?;
        Ok(0)
    }
}

impl Drop for ShmemWindow {
    fn drop(&mut self) {
        if let Some(base) = self.base {
            // SAFETY: the window reserved in `reserve`; nothing in this process refers to it
            // once the transport (its only user) is gone.
            unsafe { libc::munmap(base.as_ptr().cast(), self.len) };
        }
    }
}

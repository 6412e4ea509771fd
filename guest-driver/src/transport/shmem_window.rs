//! A process's view of the device's shared-memory region 0: an address range reserved
//! inaccessible at setup and filled by the backend's SHMEM_MAP requests (queue buffers), which
//! arrive on the backend request channel (process transport), or by the same mappings passed
//! on by the guest agent (agent transport). The guest agent's process transport forwards the
//! changes instead of making them: rxe lets a queue buffer be mapped once, and the buffer
//! belongs in the application whose command created it, not in the agent.
//!
//! Every page of the window is `MADV_DONTFORK`: a `fork()` child has no mapping of the
//! parent's queues, so nothing it does can write into them.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use log::warn;
use parking_lot::Mutex;
use vhost::vhost_user::message::{VhostUserMMap, VhostUserMMapFlags};
use vhost::vhost_user::{HandlerResult, VhostUserFrontendReqHandler};

use crate::dma::{dont_fork, PAGE_SIZE};
use crate::transport::{SharedMemory, TransportError};

/// The address range of shared-memory region 0: reserved inaccessible, filled by SHMEM_MAP.
pub(super) struct ShmemWindow {
    base: Option<NonNull<u8>>,
    len: usize,
    /// While forwarding: the changes received since they were last taken, not made here.
    forwarded: Mutex<Option<Vec<WindowChange>>>,
    /// The host verbs context's file: the first character device a queue buffer was mapped
    /// from (rxe maps queue buffers from the context's uverbs file; staging rings come from
    /// other files). The back-end gives each connection one host context, so this is the file
    /// every host kick of this window's queues is made on (spec §5.3). Close-on-exec; a
    /// `fork()` child that does not exec holds it like the transport's other descriptors
    /// (and keeps the host context open while it lives), but has no queue mapping to post to.
    host_context: Mutex<Option<Arc<OwnedFd>>>,
}

/// One change of the window: a mapping of `len` bytes of a file at `offset`, or its end.
#[derive(Debug)]
pub enum WindowChange {
    /// `len` bytes of `fd` from `fd_offset` are mapped at `offset` of the region.
    Map {
        /// Offset in the region.
        offset: u64,
        /// Bytes.
        len: u64,
        /// Offset in the file.
        fd_offset: u64,
        /// Mapped writable (else read-only).
        writable: bool,
        /// The file (the host's queue buffer).
        fd: OwnedFd,
    },
    /// `[offset, offset + len)` of the region is no longer mapped.
    Unmap {
        /// Offset in the region.
        offset: u64,
        /// Bytes.
        len: u64,
    },
}

// SAFETY: the window is an address range reserved for the whole life of this value; the
// mappings inside it are changed only with MAP_FIXED over that range.
unsafe impl Send for ShmemWindow {}
// SAFETY: see Send; the struct itself is immutable.
unsafe impl Sync for ShmemWindow {}

impl ShmemWindow {
    pub(super) fn reserve(len: u64) -> Result<Self, TransportError> {
        if len == 0 {
            return Ok(ShmemWindow {
                base: None,
                len: 0,
                forwarded: Mutex::new(None),
                host_context: Mutex::new(None),
            });
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
            forwarded: Mutex::new(None),
            host_context: Mutex::new(None),
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

    /// From now on, keeps every change for [`Self::take_forwarded`] instead of making it.
    pub(super) fn forward(&self) {
        self.forwarded.lock().get_or_insert_with(Vec::new);
    }

    /// The changes received since the last call (none unless forwarding).
    pub(super) fn take_forwarded(&self) -> Vec<WindowChange> {
        self.forwarded
            .lock()
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The host verbs context's file, once a queue buffer was mapped from it.
    pub(super) fn host_context(&self) -> Option<Arc<OwnedFd>> {
        self.host_context.lock().clone()
    }

    /// Keeps `fd` as the host context's file if it is the first character device mapped. A
    /// failure only costs the kick: the driver rings the doorbell instead.
    fn note_host_context(&self, fd: BorrowedFd<'_>) {
        let mut kept = self.host_context.lock();
        if kept.is_some() {
            return;
        }
        // SAFETY: an all-zero `stat` is a valid value for fstat to overwrite.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open for the duration of the borrow; `stat` is writable.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
            warn!(
                "fstat of a queue buffer's file: {}",
                io::Error::last_os_error()
            );
            return;
        }
        if stat.st_mode & libc::S_IFMT != libc::S_IFCHR {
            return;
        }
        match fd.try_clone_to_owned() {
            Ok(file) => *kept = Some(Arc::new(file)),
            Err(e) => warn!("keeping the host context's file: {e}"),
        }
    }

    /// Makes a change another process's window went through (the agent passes them on).
    pub(super) fn apply(&self, change: &WindowChange) -> io::Result<()> {
        match change {
            WindowChange::Map {
                offset,
                len,
                fd_offset,
                writable,
                fd,
            } => self.map(0, *offset, *len, *fd_offset, *writable, fd.as_fd()),
            WindowChange::Unmap { offset, len } => self.unmap(0, *offset, *len),
        }
    }

    /// Start address of `[offset, offset + len)` of region `shmid`, if valid for a mapping.
    fn range(
        &self,
        shmid: u8,
        offset: u64,
        len: u64,
        fd_offset: u64,
    ) -> io::Result<*mut libc::c_void> {
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
                warn!("refusing shared-memory mapping of region {shmid} at {offset:#x}+{len:#x}");
                Err(io::Error::from_raw_os_error(libc::EINVAL))
            }
        }
    }

    fn map(
        &self,
        shmid: u8,
        offset: u64,
        len: u64,
        fd_offset: u64,
        writable: bool,
        fd: BorrowedFd<'_>,
    ) -> io::Result<()> {
        let addr = self.range(shmid, offset, len, fd_offset)?;
        if let Some(forwarded) = self.forwarded.lock().as_mut() {
            forwarded.push(WindowChange::Map {
                offset,
                len,
                fd_offset,
                writable,
                fd: fd.try_clone_to_owned()?,
            });
            return Ok(());
        }
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        let file_offset = libc::off_t::try_from(fd_offset)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: `addr..addr + len` lies inside the window reserved by this value (checked
        // by `range`); MAP_FIXED replaces only pages of that window.
        let mapped = unsafe {
            libc::mmap(
                addr,
                len as usize,
                prot,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                file_offset,
            )
        };
        if mapped == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // A MAP_FIXED mapping is a new VMA without the reservation's advice.
        // SAFETY: the pages just mapped, inside the window.
        unsafe { dont_fork(addr.cast(), len as usize) }?;
        self.note_host_context(fd);
        Ok(())
    }

    fn unmap(&self, shmid: u8, offset: u64, len: u64) -> io::Result<()> {
        let addr = self.range(shmid, offset, len, 0)?;
        if let Some(forwarded) = self.forwarded.lock().as_mut() {
            forwarded.push(WindowChange::Unmap { offset, len });
            return Ok(());
        }
        // SAFETY: as in `map`; the range becomes inaccessible again.
        let mapped = unsafe {
            libc::mmap(
                addr,
                len as usize,
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
        unsafe { dont_fork(addr.cast(), len as usize) }?;
        Ok(())
    }
}

impl VhostUserFrontendReqHandler for ShmemWindow {
    fn shmem_map(&self, request: &VhostUserMMap, fd: &dyn AsRawFd) -> HandlerResult<u64> {
        let writable = VhostUserMMapFlags::from_bits_truncate(request.flags)
            .contains(VhostUserMMapFlags::WRITABLE);
        // SAFETY: the descriptor came with the request and is open for this call.
        let fd = unsafe { BorrowedFd::borrow_raw(fd.as_raw_fd()) };
        let (shmid, offset, len, fd_offset) = (
            request.shmid,
            request.shm_offset,
            request.len,
            request.fd_offset,
        );
        self.map(shmid, offset, len, fd_offset, writable, fd)?;
        Ok(0)
    }

    fn shmem_unmap(&self, request: &VhostUserMMap) -> HandlerResult<u64> {
        let (shmid, offset, len) = (request.shmid, request.shm_offset, request.len);
        self.unmap(shmid, offset, len)?;
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

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::os::fd::AsFd;

    use super::*;

    fn memfd() -> OwnedFd {
        // SAFETY: a new anonymous file; the name is a NUL-terminated literal.
        let fd = unsafe { libc::memfd_create(c"queue".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
        // SAFETY: `fd` was just created and is owned by nobody else.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let file = File::from(fd);
        file.set_len(2 * PAGE_SIZE as u64).unwrap();
        file.into()
    }

    #[test]
    fn the_host_context_is_the_first_character_device_a_queue_came_from() {
        let window = ShmemWindow::reserve(4 * PAGE_SIZE as u64).unwrap();
        let page = PAGE_SIZE as u64;
        // A staging ring's file (a memfd) is not the host context.
        let staging = memfd();
        window.map(0, 0, page, 0, true, staging.as_fd()).unwrap();
        assert!(window.host_context().is_none());
        // A character device is (rxe maps queue buffers from the uverbs file; /dev/zero
        // stands in for it here), and the first one stays.
        let first = File::open("/dev/zero").unwrap();
        window.map(0, page, page, 0, false, first.as_fd()).unwrap();
        let kept = window.host_context().expect("kept the character device");
        let second = File::open("/dev/zero").unwrap();
        window
            .map(0, 2 * page, page, 0, false, second.as_fd())
            .unwrap();
        assert!(Arc::ptr_eq(&kept, &window.host_context().unwrap()));
        // The window keeps its own descriptor: closing the one the mapping came with does
        // not close it.
        drop(first);
        // SAFETY: F_GETFD on a descriptor this test holds open through `kept`.
        assert!(unsafe { libc::fcntl(kept.as_raw_fd(), libc::F_GETFD) } >= 0);
    }

    #[test]
    fn a_forwarding_window_keeps_no_host_context() {
        let window = ShmemWindow::reserve(2 * PAGE_SIZE as u64).unwrap();
        window.forward();
        let file = File::open("/dev/zero").unwrap();
        window
            .map(0, 0, PAGE_SIZE as u64, 0, false, file.as_fd())
            .unwrap();
        assert!(window.host_context().is_none());
        assert_eq!(window.take_forwarded().len(), 1);
    }
}

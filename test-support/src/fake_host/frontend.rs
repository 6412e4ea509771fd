//! The fake frontend side of the backend request channel: SHMEM_MAP/UNMAP served with the
//! placement rules QEMU enforces.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use vhost::vhost_user::message::VhostUserMMap;
use vhost::vhost_user::{Backend, FrontendReqHandler, VhostUserFrontendReqHandler};

/// Serves SHMEM_MAP/UNMAP like QEMU: in bounds, no overlap, unmap of exact extents.
pub struct FakeFrontend {
    /// Size of the shared-memory region the mappings must fit.
    region_size: u64,
    /// Mapped extents: offset to length.
    maps: Mutex<BTreeMap<u64, u64>>,
    refuse: AtomicBool,
}

impl VhostUserFrontendReqHandler for FakeFrontend {
    fn shmem_map(&self, req: &VhostUserMMap, _fd: &dyn AsRawFd) -> io::Result<u64> {
        let (offset, len) = (req.shm_offset, req.len);
        let mut maps = self.maps.lock().unwrap();
        let overlaps = maps
            .iter()
            .any(|(&o, &l)| offset < o + l && o < offset + len);
        if self.refuse.load(Ordering::SeqCst)
            || len == 0
            || offset + len > self.region_size
            || overlaps
            || req.flags != 1
        {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        maps.insert(offset, len);
        Ok(0)
    }

    fn shmem_unmap(&self, req: &VhostUserMMap) -> io::Result<u64> {
        let (offset, len) = (req.shm_offset, req.len);
        let mut maps = self.maps.lock().unwrap();
        match maps.get(&offset) {
            Some(&mapped) if mapped == len => {
                maps.remove(&offset);
                Ok(0)
            }
            _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }
}

impl FakeFrontend {
    /// A frontend with nothing mapped in a region of `region_size` bytes.
    pub fn new(region_size: u64) -> Self {
        FakeFrontend {
            region_size,
            maps: Mutex::default(),
            refuse: AtomicBool::new(false),
        }
    }

    /// Makes every following SHMEM_MAP fail (`true`) or succeed again (`false`).
    pub fn set_refusing(&self, refuse: bool) {
        self.refuse.store(refuse, Ordering::SeqCst);
    }

    /// Drops every mapping without the backend asking, as QEMU does on a device reset.
    pub fn forget_mappings(&self) {
        self.maps.lock().unwrap().clear();
    }

    /// The mapped extents, (offset, length), by offset.
    pub fn mapped(&self) -> Vec<(u64, u64)> {
        self.maps
            .lock()
            .unwrap()
            .iter()
            .map(|(&o, &l)| (o, l))
            .collect()
    }
}

/// A backend request channel served by `frontend` on a thread of its own, with REPLY_ACK and
/// SHMEM negotiated: what the backend gets from SET_BACKEND_REQ_FD.
pub fn serve_backend_channel(frontend: Arc<FakeFrontend>) -> Backend {
    let mut handler = FrontendReqHandler::new(frontend).unwrap();
    handler.set_reply_ack_flag(true);
    // SAFETY: duplicates an fd the handler owns; the copy is owned by the stream built below.
    let fd = unsafe { libc::fcntl(handler.get_tx_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    assert!(fd >= 0);
    // SAFETY: `fd` was just duplicated and has no other owner.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    // A refused request is answered and serving goes on; a broken socket ends it.
    std::thread::spawn(move || {
        while let Ok(_) | Err(vhost::vhost_user::Error::ReqHandlerError(_)) =
            handler.handle_request()
        {}
    });
    let backend = Backend::from_stream(stream);
    backend.set_reply_ack_flag(true);
    backend.set_shmem_flag(true);
    backend
}

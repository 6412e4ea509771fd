//! The fake frontend side of the backend request channel: SHMEM_MAP/UNMAP served with the
//! placement rules QEMU enforces.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use vhost::vhost_user::message::{VhostUserMMap, VhostUserProtocolFeatures};
use vhost::vhost_user::{FrontendReqHandler, VhostUserFrontendReqHandler};

/// Serves SHMEM_MAP/UNMAP like QEMU: in bounds, no overlap, unmap of exact extents.
pub struct FakeFrontend {
    /// Size of the shared-memory region the mappings must fit.
    region_size: u64,
    /// Mapped extents: offset to length.
    maps: Mutex<BTreeMap<u64, u64>>,
    /// What each extent maps: offset to the file and the file offset.
    files: Mutex<BTreeMap<u64, (File, u64)>>,
    refuse: AtomicBool,
    /// Runs before the next SHMEM_MAP or SHMEM_UNMAP is answered (see
    /// [`FakeFrontend::before_next_request`]).
    before_request: Mutex<Option<RequestHook>>,
}

/// What a front-end does before it answers a back-end request.
pub type RequestHook = Box<dyn FnOnce() + Send>;

impl VhostUserFrontendReqHandler for FakeFrontend {
    fn shmem_map(&self, req: &VhostUserMMap, fd: &dyn AsRawFd) -> io::Result<u64> {
        self.run_hook();
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
        // SAFETY: duplicates the fd of the request; the copy is owned by the `File` below.
        let copy = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if copy >= 0 {
            // SAFETY: `copy` was just duplicated and has no other owner.
            let file = unsafe { File::from_raw_fd(copy) };
            self.files
                .lock()
                .unwrap()
                .insert(offset, (file, req.fd_offset));
        }
        Ok(0)
    }

    fn shmem_unmap(&self, req: &VhostUserMMap) -> io::Result<u64> {
        self.run_hook();
        let (offset, len) = (req.shm_offset, req.len);
        let mut maps = self.maps.lock().unwrap();
        match maps.get(&offset) {
            Some(&mapped) if mapped == len => {
                maps.remove(&offset);
                self.files.lock().unwrap().remove(&offset);
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
            files: Mutex::default(),
            refuse: AtomicBool::new(false),
            before_request: Mutex::default(),
        }
    }

    /// Runs `hook` on the channel's serving thread when the next SHMEM_MAP or SHMEM_UNMAP
    /// arrives, before it is answered, while the backend waits for the answer: as QEMU's main
    /// loop may first finish something of its own (a memory-table change whose answer it
    /// waits for, a device reset).
    pub fn before_next_request(&self, hook: RequestHook) {
        *self.before_request.lock().unwrap() = Some(hook);
    }

    fn run_hook(&self) {
        let hook = self.before_request.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
    }

    /// Makes every following SHMEM_MAP fail (`true`) or succeed again (`false`).
    pub fn set_refusing(&self, refuse: bool) {
        self.refuse.store(refuse, Ordering::SeqCst);
    }

    /// Drops every mapping without the backend asking, as QEMU does on a device reset.
    pub fn forget_mappings(&self) {
        self.maps.lock().unwrap().clear();
        self.files.lock().unwrap().clear();
    }

    /// The mapping holding region offset `offset`: its file and the file offset of `offset`.
    fn backing(&self, offset: u64, len: usize) -> (File, u64) {
        let maps = self.maps.lock().unwrap();
        let (&start, &mapped) = maps
            .range(..=offset)
            .next_back()
            .expect("offset not mapped");
        assert!(
            offset + len as u64 <= start + mapped,
            "range leaves its mapping"
        );
        let files = self.files.lock().unwrap();
        let (file, fd_offset) = &files[&start];
        (file.try_clone().unwrap(), fd_offset + (offset - start))
    }

    /// The file mapped at region offset `offset` (what QEMU would hand back as guest memory).
    pub fn mapped_file(&self, offset: u64) -> File {
        self.backing(offset, 1).0
    }

    /// Reads `len` bytes of the region at `offset` through the mapped file, as the guest would.
    pub fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let (file, at) = self.backing(offset, len);
        let mut bytes = vec![0; len];
        file.read_exact_at(&mut bytes, at).unwrap();
        bytes
    }

    /// Writes `bytes` into the region at `offset` through the mapped file, as the guest would.
    pub fn write(&self, offset: u64, bytes: &[u8]) {
        let (file, at) = self.backing(offset, bytes.len());
        file.write_all_at(bytes, at).unwrap();
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

/// The serving side of a backend request channel: dropping it ends the serving thread.
///
/// The thread would otherwise wait forever: the frontend handler keeps its own copy of the
/// backend's end of the socket, so the backend dropping its end is no disconnect, and every
/// guest of a test run would leave a thread and two descriptors behind (fuzzing runs out of
/// descriptors).
pub struct BackendChannel {
    socket: UnixStream,
    thread: Option<JoinHandle<()>>,
}

impl Drop for BackendChannel {
    fn drop(&mut self) {
        // Shuts the socket itself down, for every descriptor of it: the handler reads EOF.
        let _ = self.socket.shutdown(Shutdown::Both);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A backend request channel served by `frontend` on a thread of its own, with REPLY_ACK and
/// SHMEM negotiated: what the backend takes from SET_BACKEND_REQ_FD; and the serving side, to
/// keep until the backend is gone.
pub fn serve_backend_channel(
    frontend: Arc<FakeFrontend>,
) -> (
    vrdma_backend::vhost_device::backend_channel::BackendChannel,
    BackendChannel,
) {
    let mut handler = FrontendReqHandler::new(frontend).unwrap();
    handler.set_reply_ack_flag(true);
    // SAFETY: duplicates an fd the handler owns; the copy is owned by the stream built below.
    let fd = unsafe { libc::fcntl(handler.get_tx_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    assert!(fd >= 0, "dup: {}", io::Error::last_os_error());
    // SAFETY: `fd` was just duplicated and has no other owner.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    let socket = stream.try_clone().unwrap();
    // A refused request is answered and serving goes on; a broken socket ends it.
    let thread = std::thread::spawn(move || {
        while let Ok(_) | Err(vhost::vhost_user::Error::ReqHandlerError(_)) =
            handler.handle_request()
        {}
    });
    let acked = VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::SHMEM;
    (
        vrdma_backend::vhost_device::backend_channel::BackendChannel::new(stream, acked.bits()),
        BackendChannel {
            socket,
            thread: Some(thread),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropping_the_channel_ends_the_serving_thread() {
        // Found by fuzzing: every guest left its serving thread, holding the frontend and two
        // descriptors, until the process ran out of descriptors.
        let frontend = Arc::new(FakeFrontend::new(1 << 20));
        let (backend, serving) = serve_backend_channel(Arc::clone(&frontend));
        drop(backend);
        drop(serving);
        assert_eq!(Arc::strong_count(&frontend), 1, "the handler is gone");
    }
}

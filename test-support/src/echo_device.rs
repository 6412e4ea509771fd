//! A small vhost-user test device behind the backend's `Listener`, for the vhost-user
//! plumbing's end-to-end tests (the backend's own, and the guest agent's): commands echo,
//! map and unmap host pages into the queue region, emit events, answer with a given length
//! and say which device instance answers.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vrdma::transport::process::{ProcessOptions, ProcessTransport};
use vrdma_backend::listener::{Listener, StopHandle};
use vrdma_backend::vhost_device::event_queue::EventClass;
use vrdma_backend::vhost_device::guest_io::GuestIo;
use vrdma_backend::vhost_device::handler::{CommandRejection, DeviceHandler};
use vrdma_backend::vhost_device::shmem::SHMEM_PAGE_SIZE;

use crate::fake_host::device::memfd;

pub const PAGE: usize = SHMEM_PAGE_SIZE as usize;
pub const SHMEM_SIZE: u64 = 16 * SHMEM_PAGE_SIZE;
pub const HOST_PAGES: usize = 2;
pub const MAX_REQUEST: usize = 64 * 1024;
pub const CONFIG: &[u8] = b"vrdma-test-config";
pub const DEVICE_FEATURES: u64 = 0b11;
pub const WAIT: Duration = Duration::from_secs(10);

// Commands of the test device: first byte opcode, then arguments.
pub const ECHO_REVERSED: u8 = 1;
pub const MAP_HOST_PAGES: u8 = 2;
pub const READ_HOST_PAGES: u8 = 3;
pub const EMIT_EVENT: u8 = 4;
pub const EMIT_EVENT_VIA_FD: u8 = 5;
pub const ANSWER_OF_LEN: u8 = 6;
pub const UNMAP_HOST_PAGES: u8 = 7;
pub const WHO_AM_I: u8 = 8;

pub const OK: u8 = 0;
pub const FAILED: u8 = 1;
pub const REJECTED: u8 = 0xEE;
pub const FD_EVENT: &[u8] = b"from-the-fd";

/// What the test sees of one device instance.
#[derive(Default)]
pub struct Stats {
    pub id: usize,
    pub doorbells: AtomicUsize,
    pub resets: AtomicUsize,
    pub memory_changes: AtomicUsize,
    pub rejections: Mutex<Vec<CommandRejection>>,
}

pub struct TestDevice {
    stats: Arc<Stats>,
    host_pages: File,
    notifier: EventFd,
}

impl TestDevice {
    pub fn new(stats: Arc<Stats>) -> Self {
        let host_pages = memfd((HOST_PAGES * PAGE) as u64);
        host_pages.write_all_at(b"written by the host", 0).unwrap();
        TestDevice {
            stats,
            host_pages,
            notifier: EventFd::new(EFD_NONBLOCK).unwrap(),
        }
    }

    fn status(ok: bool) -> u8 {
        if ok {
            OK
        } else {
            FAILED
        }
    }
}

impl DeviceHandler for TestDevice {
    fn device_features(&self) -> u64 {
        DEVICE_FEATURES
    }

    fn config_space(&self) -> Vec<u8> {
        CONFIG.to_vec()
    }

    fn shmem_size(&self) -> u64 {
        SHMEM_SIZE
    }

    fn max_request_size(&self) -> usize {
        MAX_REQUEST
    }

    fn handle_command(
        &self,
        guest_io: &GuestIo,
        request: &[u8],
        _response_capacity: usize,
        response: &mut Vec<u8>,
    ) {
        let (opcode, args) = request.split_first().unwrap_or((&0, &[]));
        let offset_arg = || {
            args.get(..8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
        };
        match *opcode {
            ECHO_REVERSED => response.extend(args.iter().rev()),
            MAP_HOST_PAGES => {
                let ok = offset_arg().is_some_and(|offset| {
                    guest_io
                        .shmem()
                        .map(
                            self.host_pages.as_fd(),
                            0,
                            offset,
                            (HOST_PAGES * PAGE) as u64,
                            true,
                        )
                        .is_ok()
                });
                response.push(Self::status(ok));
            }
            UNMAP_HOST_PAGES => {
                let ok = offset_arg().is_some_and(|offset| {
                    guest_io
                        .shmem()
                        .unmap(offset, (HOST_PAGES * PAGE) as u64)
                        .is_ok()
                });
                response.push(Self::status(ok));
            }
            READ_HOST_PAGES => {
                let mut bytes = [0u8; 32];
                self.host_pages.read_exact_at(&mut bytes, 0).unwrap();
                response.extend_from_slice(&bytes);
            }
            EMIT_EVENT => {
                let ok = guest_io.events().push(args, EventClass::Completion).is_ok();
                response.push(Self::status(ok));
            }
            EMIT_EVENT_VIA_FD => {
                self.notifier.write(1).unwrap();
                response.push(OK);
            }
            ANSWER_OF_LEN => {
                let len = args
                    .get(..4)
                    .map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap()));
                response.extend((0..len).map(|i| i as u8));
            }
            WHO_AM_I => response.extend_from_slice(&(self.stats.id as u64).to_le_bytes()),
            _ => response.push(FAILED),
        }
    }

    fn reject_command(&self, _ctx: &GuestIo, rejection: CommandRejection, response: &mut Vec<u8>) {
        self.stats.rejections.lock().unwrap().push(rejection);
        response.push(REJECTED);
    }

    fn doorbell(&self, _ctx: &GuestIo, _rung: &[u8]) {
        self.stats.doorbells.fetch_add(1, Ordering::SeqCst);
    }

    fn watched_fds(&self) -> Vec<RawFd> {
        vec![self.notifier.as_raw_fd()]
    }

    fn fd_ready(&self, guest_io: &GuestIo, index: usize) {
        assert_eq!(index, 0);
        if self.notifier.read().is_ok() {
            guest_io.events().push(FD_EVENT, EventClass::Async).unwrap();
        }
    }

    fn memory_changed(&self, _ctx: &GuestIo) {
        self.stats.memory_changes.fetch_add(1, Ordering::SeqCst);
    }

    fn reset(&self) {
        self.stats.resets.fetch_add(1, Ordering::SeqCst);
    }
}

/// A listener serving test devices on its own thread.
pub struct Server {
    pub path: PathBuf,
    devices: Arc<Mutex<Vec<Arc<Stats>>>>,
    stop: StopHandle,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    pub fn start(name: &str) -> Self {
        let _ = env_logger::builder().is_test(true).try_init();
        let path = std::env::temp_dir().join(format!(
            "vrdma-vhost-test-{}-{name}.sock",
            std::process::id()
        ));
        // A stale file where the socket goes (a daemon that died) must not stop the listener.
        std::fs::write(&path, b"stale").unwrap();
        let devices: Arc<Mutex<Vec<Arc<Stats>>>> = Arc::default();
        let registry = devices.clone();
        let mut listener = Listener::bind(&path, move || {
            let mut devices = registry.lock().unwrap();
            let stats = Arc::new(Stats {
                id: devices.len(),
                ..Stats::default()
            });
            devices.push(stats.clone());
            Ok::<_, std::io::Error>(TestDevice::new(stats))
        })
        .unwrap();
        let stop = listener.stop_handle();
        let thread = thread::spawn(move || listener.run().unwrap());
        Server {
            path,
            devices,
            stop,
            thread: Some(thread),
        }
    }

    pub fn connect(&self) -> ProcessTransport {
        self.connect_with(small_options())
    }

    pub fn connect_with(&self, options: ProcessOptions) -> ProcessTransport {
        ProcessTransport::connect(&self.path, options).unwrap()
    }

    pub fn device(&self, id: usize) -> Arc<Stats> {
        self.devices.lock().unwrap()[id].clone()
    }

    pub fn device_count(&self) -> usize {
        self.devices.lock().unwrap().len()
    }

    pub fn stop(mut self) {
        self.stop.stop();
        self.thread.take().unwrap().join().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.stop.stop();
            let _ = thread.join();
        }
    }
}

/// A small process transport for the test device.
pub fn small_options() -> ProcessOptions {
    ProcessOptions {
        guest_ram_size: 8 << 20,
        queue_size: 64,
        command_timeout: WAIT,
        device_features: 0b01,
        ..ProcessOptions::default()
    }
}

/// Waits until `condition` holds; fails the test after [`WAIT`] (a bound on a hang, not a
/// timing assertion).
pub fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// Executes `request` on `transport` with room for `response_len` bytes of answer; the answer.
pub fn command(
    transport: &dyn vrdma::transport::Transport,
    request: &[u8],
    response_len: usize,
) -> Vec<u8> {
    let mut response = vec![0; response_len];
    let len = transport.round_trip(request, &mut response).unwrap();
    response.truncate(len);
    response
}

/// A command of `opcode` with an offset argument (MAP/UNMAP_HOST_PAGES).
pub fn with_offset(opcode: u8, offset: u64) -> Vec<u8> {
    let mut request = vec![opcode];
    request.extend_from_slice(&offset.to_le_bytes());
    request
}

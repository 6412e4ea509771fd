//! `fork()` with a process transport connected to the backend: the child's copy of the
//! transport neither drives nor tears down the parent's device (its commands and events fail
//! with `ForkedChild`, the queues and guest RAM are not mapped in it, and dropping it closes
//! only its own descriptors), and the parent's connection works on.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use vrdma::transport::process::{ProcessOptions, ProcessTransport};
use vrdma::transport::{Transport, TransportError};
use vrdma_backend::listener::{Listener, StopHandle};
use vrdma_backend::vhost_device::guest_io::GuestIo;
use vrdma_backend::vhost_device::handler::{CommandRejection, DeviceHandler};
use vrdma_backend::vhost_device::shmem::SHMEM_PAGE_SIZE;
use vrdma_test_support::fake_host::device::memfd;
use vrdma_test_support::fork::in_child;

const SHMEM_SIZE: u64 = 4 * SHMEM_PAGE_SIZE;
// Commands of the device: ECHO answers its argument bytes; MAP maps its host page at the
// start of the shared-memory region.
const ECHO: u8 = 1;
const MAP: u8 = 2;

/// A device that echoes, maps one host page, and counts resets (disconnects).
struct EchoDevice {
    host_page: File,
    resets: Arc<AtomicUsize>,
}

impl DeviceHandler for EchoDevice {
    fn device_features(&self) -> u64 {
        0
    }

    fn config_space(&self) -> Vec<u8> {
        Vec::new()
    }

    fn shmem_size(&self) -> u64 {
        SHMEM_SIZE
    }

    fn max_request_size(&self) -> usize {
        4096
    }

    fn handle_command(
        &self,
        guest_io: &GuestIo,
        request: &[u8],
        _response_capacity: usize,
        response: &mut Vec<u8>,
    ) {
        match request.split_first() {
            Some((&ECHO, args)) => response.extend_from_slice(args),
            Some((&MAP, _)) => {
                let mapped =
                    guest_io
                        .shmem()
                        .map(self.host_page.as_fd(), 0, 0, SHMEM_PAGE_SIZE, true);
                response.push(u8::from(mapped.is_err()));
            }
            _ => response.push(0xff),
        }
    }

    fn reject_command(&self, _ctx: &GuestIo, _rejection: CommandRejection, response: &mut Vec<u8>) {
        response.push(0xee);
    }

    fn doorbell(&self, _ctx: &GuestIo, _rung: &[u8]) {}

    fn reset(&self) {
        self.resets.fetch_add(1, Ordering::SeqCst);
    }
}

struct Server {
    path: PathBuf,
    resets: Arc<AtomicUsize>,
    stop: StopHandle,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn start() -> Self {
        let path =
            std::env::temp_dir().join(format!("vrdma-vhost-fork-test-{}.sock", std::process::id()));
        let resets = Arc::new(AtomicUsize::new(0));
        let counter = resets.clone();
        let mut listener = Listener::bind(&path, move || {
            let host_page = memfd(SHMEM_PAGE_SIZE);
            host_page.write_all_at(b"host page", 0)?;
            Ok::<_, std::io::Error>(EchoDevice {
                host_page,
                resets: counter.clone(),
            })
        })
        .unwrap();
        let stop = listener.stop_handle();
        let thread = thread::spawn(move || listener.run().unwrap());
        Server {
            path,
            resets,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn echo(transport: &dyn Transport, bytes: &[u8]) -> Result<Vec<u8>, TransportError> {
    let mut request = vec![ECHO];
    request.extend_from_slice(bytes);
    let mut response = vec![0; 64];
    let len = transport.round_trip(&request, &mut response)?;
    response.truncate(len);
    Ok(response)
}

/// Whether the page at `addr` is mapped (mincore fails with ENOMEM where it is not).
fn mapped(addr: usize) -> bool {
    let mut resident = 0u8;
    // SAFETY: one page, one byte of result.
    unsafe { libc::mincore(addr as *mut libc::c_void, 4096, &mut resident) == 0 }
}

#[test]
fn a_fork_child_neither_drives_nor_tears_down_the_parents_device() {
    let server = Server::start();
    let options = ProcessOptions {
        guest_ram_size: 4 << 20,
        queue_size: 16,
        command_timeout: Duration::from_secs(10),
        ..ProcessOptions::default()
    };
    let transport = ProcessTransport::connect(&server.path, options).unwrap();
    assert_eq!(echo(&transport, b"before").unwrap(), b"before");
    let mut response = [0u8; 1];
    transport.round_trip(&[MAP], &mut response).unwrap();
    assert_eq!(response, [0]);
    let window = transport.shared_memory().base().unwrap().as_ptr() as usize;
    let ram = transport.process_dma().guest_ram().host_base() as usize;
    assert!(mapped(window) && mapped(ram));

    let status = in_child(|| {
        if !matches!(echo(&transport, b"child"), Err(TransportError::ForkedChild)) {
            return 1;
        }
        let mut event = [0u8; 16];
        let next = transport.next_event(&mut event, Some(Duration::ZERO));
        if !matches!(next, Err(TransportError::ForkedChild)) {
            return 2;
        }
        if mapped(window) || mapped(ram) {
            return 3;
        }
        // Dropping the child's copy closes the child's descriptors only: no shutdown of the
        // shared sockets, no join of the parent's backend-request thread.
        // SAFETY: this is the child's own copy of the parent's memory; the child leaves with
        // _exit right after, never using or dropping `transport` again.
        drop(unsafe { std::ptr::read(&transport) });
        0
    });
    assert_eq!(status, 0);

    // The parent's device is untouched: no reset (the backend saw no disconnect), commands
    // run, the shared-memory mapping is still there.
    assert_eq!(echo(&transport, b"after").unwrap(), b"after");
    assert_eq!(server.resets.load(Ordering::SeqCst), 0);
    let mut seen = [0u8; 9];
    // SAFETY: the backend mapped its host page at the start of the window (MAP succeeded).
    unsafe { std::ptr::copy_nonoverlapping(window as *const u8, seen.as_mut_ptr(), 9) };
    assert_eq!(&seen, b"host page");
    drop(transport);
}

//! End-to-end tests of the vhost-user plumbing: the backend's `Listener` serving a small test
//! device, driven by the guest library's process transport (and by a raw frontend for
//! malformed input).

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vrdma::dma::DmaMemory;
use vrdma::transport::process::{ProcessDma, ProcessOptions};
use vrdma::transport::{Transport, TransportError};
use vrdma::virtq::{Buffer, SplitQueue};
use vrdma_backend::vhost_device::handler::CommandRejection;
use vrdma_backend::vhost_device::shmem::SHMEM_PAGE_SIZE;
use vrdma_test_support::echo_device::*;

#[test]
fn negotiation_and_configuration() {
    let server = Server::start("negotiation");
    let transport = server.connect();
    // The device offers bits 0 and 1, the driver accepts only bit 0.
    assert_eq!(transport.device_features(), 0b01);
    let config = transport.device_config();
    assert_eq!(config.len(), 256);
    assert_eq!(&config[..CONFIG.len()], CONFIG);
    assert!(config[CONFIG.len()..].iter().all(|&b| b == 0));
    let shared = transport.shared_memory();
    assert_eq!(shared.len() as u64, SHMEM_SIZE);
    assert!(shared.base().is_some());
    // SET_MEM_TABLE is not acknowledged, so the backend may still be applying it.
    let device = server.device(0);
    wait_until("the memory table", || {
        device.memory_changes.load(Ordering::SeqCst) == 1
    });
}

#[test]
fn control_commands_round_trip() {
    let server = Server::start("commands");
    let transport = Arc::new(server.connect());
    assert_eq!(
        command(&*transport, &[ECHO_REVERSED, 1, 2, 3], 16),
        vec![3, 2, 1]
    );

    // A request spanning several pages, and a response spanning several pages.
    let mut big = vec![ECHO_REVERSED];
    big.extend((0..3 * PAGE + 5).map(|i| (i % 251) as u8));
    let expected: Vec<u8> = big[1..].iter().rev().copied().collect();
    assert_eq!(command(&*transport, &big, 4 * PAGE), expected);

    // Several threads share the control queue.
    let workers: Vec<_> = (0..4u8)
        .map(|t| {
            let transport = transport.clone();
            thread::spawn(move || {
                for i in 0..50u8 {
                    let answer = command(&*transport, &[ECHO_REVERSED, t, i], 8);
                    assert_eq!(answer, vec![i, t]);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
}

#[test]
fn oversized_requests_and_small_response_buffers_are_rejected() {
    let server = Server::start("rejections");
    let transport = server.connect();
    let huge = vec![ECHO_REVERSED; MAX_REQUEST + 1];
    assert_eq!(command(&transport, &huge, 8), vec![REJECTED]);

    let mut request = vec![ANSWER_OF_LEN];
    request.extend_from_slice(&100u32.to_le_bytes());
    assert_eq!(command(&transport, &request, 16), vec![REJECTED]);
    assert_eq!(command(&transport, &request, 100).len(), 100);

    let rejections = server.device(0).rejections.lock().unwrap().clone();
    assert_eq!(
        rejections,
        vec![
            CommandRejection::RequestTooLarge {
                len: MAX_REQUEST + 1,
                max: MAX_REQUEST
            },
            CommandRejection::ResponseTooSmall {
                needed: 100,
                capacity: 16
            }
        ]
    );
    // The transport refuses requests it cannot send at all.
    assert!(matches!(
        transport.round_trip(&[], &mut [0; 4]),
        Err(TransportError::InvalidRequest(_))
    ));
}

#[test]
fn shared_memory_mappings_are_visible_both_ways() {
    let server = Server::start("shmem");
    let transport = server.connect();
    let offset = 4 * SHMEM_SIZE / 16;
    assert_eq!(
        command(&transport, &with_offset(MAP_HOST_PAGES, offset), 1),
        vec![OK]
    );
    let shared = transport.shared_memory();
    let window = shared.range(offset as usize, HOST_PAGES * PAGE).unwrap();
    let mut seen = [0u8; 19];
    // SAFETY: the backend mapped HOST_PAGES pages there (the command succeeded).
    unsafe { std::ptr::copy_nonoverlapping(window.as_ptr(), seen.as_mut_ptr(), seen.len()) };
    assert_eq!(&seen, b"written by the host");

    let guest_bytes = b"written by the guest through the shared region";
    // SAFETY: as above; the mapping is writable and large enough.
    unsafe {
        std::ptr::copy_nonoverlapping(guest_bytes.as_ptr(), window.as_ptr(), 32);
    }
    assert_eq!(
        command(&transport, &[READ_HOST_PAGES], 32),
        guest_bytes[..32].to_vec()
    );

    // Ranges outside the region are refused by the backend before they reach the frontend.
    assert_eq!(
        command(
            &transport,
            &with_offset(MAP_HOST_PAGES, SHMEM_SIZE - SHMEM_PAGE_SIZE),
            1
        ),
        vec![FAILED]
    );
    assert_eq!(
        command(&transport, &with_offset(UNMAP_HOST_PAGES, offset), 1),
        vec![OK]
    );
}

#[test]
fn doorbell_notifications_reach_the_handler() {
    let server = Server::start("doorbell");
    let transport = server.connect();
    let device = server.device(0);
    transport.notify_doorbell().unwrap();
    wait_until("the first doorbell", || {
        device.doorbells.load(Ordering::SeqCst) >= 1
    });
    let before = device.doorbells.load(Ordering::SeqCst);
    transport.notify_doorbell().unwrap();
    wait_until("the second doorbell", || {
        device.doorbells.load(Ordering::SeqCst) > before
    });
}

#[test]
fn events_are_delivered_in_order_and_buffers_reused() {
    let server = Server::start("events");
    let transport = server.connect_with(ProcessOptions {
        event_buffers: 4,
        ..small_options()
    });
    let mut out = [0u8; 64];
    assert_eq!(
        transport
            .next_event(&mut out, Some(Duration::ZERO))
            .unwrap(),
        None
    );

    // More events than posted buffers: they wait in the backend until buffers come back.
    for i in 0..10u8 {
        assert_eq!(command(&transport, &[EMIT_EVENT, b'e', i], 1), vec![OK]);
    }
    for i in 0..10u8 {
        let len = transport.next_event(&mut out, Some(WAIT)).unwrap().unwrap();
        assert_eq!(&out[..len], &[b'e', i]);
    }

    // Events produced from a watched fd.
    assert_eq!(command(&transport, &[EMIT_EVENT_VIA_FD], 1), vec![OK]);
    let len = transport.next_event(&mut out, Some(WAIT)).unwrap().unwrap();
    assert_eq!(&out[..len], FD_EVENT);
    assert_eq!(
        transport
            .next_event(&mut out, Some(Duration::from_millis(20)))
            .unwrap(),
        None
    );
}

#[test]
fn clients_get_their_own_device_and_disconnects_reset_it() {
    let server = Server::start("clients");
    let first = server.connect();
    let second = server.connect();
    assert_eq!(command(&first, &[WHO_AM_I], 8), 0u64.to_le_bytes());
    assert_eq!(command(&second, &[WHO_AM_I], 8), 1u64.to_le_bytes());

    drop(first);
    let device = server.device(0);
    wait_until("the first device's reset", || {
        device.resets.load(Ordering::SeqCst) == 1
    });
    assert_eq!(server.device(1).resets.load(Ordering::SeqCst), 0);
    assert_eq!(command(&second, &[ECHO_REVERSED, 1, 2], 8), vec![2, 1]);

    let third = server.connect();
    assert_eq!(command(&third, &[WHO_AM_I], 8), 2u64.to_le_bytes());
    assert_eq!(server.device_count(), 3);

    // Stopping the listener disconnects and resets everyone still connected.
    let (second_device, third_device) = (server.device(1), server.device(2));
    assert!(second.check_alive().is_ok());
    server.stop();
    assert_eq!(second_device.resets.load(Ordering::SeqCst), 1);
    assert_eq!(third_device.resets.load(Ordering::SeqCst), 1);
    // A program that only polls its CQs learns it without waiting for anything, and the
    // check reads nothing away: it keeps saying so.
    for _ in 0..2 {
        assert!(matches!(
            third.check_alive(),
            Err(TransportError::Disconnected)
        ));
    }
    // The transport notices that the backend went away instead of waiting for the timeout.
    let started = Instant::now();
    assert!(matches!(
        second.round_trip(&[ECHO_REVERSED, 1], &mut [0; 4]),
        Err(TransportError::Disconnected)
    ));
    assert!(started.elapsed() < WAIT);
}

/// A frontend that sets up only the control queue, by hand, to send chains the process
/// transport never would.
struct RawFrontend {
    frontend: Frontend,
    dma: ProcessDma,
    queue: SplitQueue,
    kick: EventFd,
    call: EventFd,
}

impl RawFrontend {
    fn connect(server: &Server) -> Self {
        let mut frontend = Frontend::connect(&server.path, 3).unwrap();
        frontend.set_owner().unwrap();
        let features = frontend.get_features().unwrap();
        frontend
            .set_features(features & (1 << 32 | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()))
            .unwrap();
        let protocol = frontend.get_protocol_features().unwrap();
        frontend
            .set_protocol_features(protocol & VhostUserProtocolFeatures::RESET_DEVICE)
            .unwrap();
        let dma = ProcessDma::new(1 << 20).unwrap();
        let ram = dma.guest_ram();
        frontend
            .set_mem_table(&[VhostUserMemoryRegionInfo {
                guest_phys_addr: ram.guest_base(),
                memory_size: ram.len() as u64,
                userspace_addr: ram.host_base() as u64,
                mmap_offset: 0,
                mmap_handle: ram.fd().as_raw_fd(),
            }])
            .unwrap();
        let queue = SplitQueue::new(&dma, 16, false).unwrap();
        let host = queue.host_addresses();
        let kick = EventFd::new(EFD_NONBLOCK).unwrap();
        let call = EventFd::new(EFD_NONBLOCK).unwrap();
        frontend.set_vring_num(0, 16).unwrap();
        frontend
            .set_vring_addr(
                0,
                &VringConfigData {
                    queue_max_size: 16,
                    queue_size: 16,
                    flags: 0,
                    desc_table_addr: host.desc,
                    used_ring_addr: host.used,
                    avail_ring_addr: host.avail,
                    log_addr: None,
                },
            )
            .unwrap();
        frontend.set_vring_base(0, 0).unwrap();
        frontend.set_vring_call(0, &call).unwrap();
        frontend.set_vring_kick(0, &kick).unwrap();
        frontend.set_vring_enable(0, true).unwrap();
        RawFrontend {
            frontend,
            dma,
            queue,
            kick,
            call,
        }
    }

    /// Sends one chain and returns its used length.
    fn send(&mut self, readable: &[Buffer], writable: &[Buffer]) -> u32 {
        let head = self.queue.add(readable, writable).unwrap();
        self.kick.write(1).unwrap();
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(used) = self.queue.pop_used().unwrap() {
                assert_eq!(used.head, head);
                return used.len;
            }
            assert!(Instant::now() < deadline, "the chain never came back");
            let _ = self.call.read();
            thread::sleep(Duration::from_millis(1));
        }
    }

    fn buffer(&self, bytes: &[u8], len: usize) -> (vrdma::dma::DmaBuffer, Buffer) {
        let mut memory = self.dma.alloc(len, 1).unwrap();
        memory.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
        let addr = self.dma.guest_address(&memory).unwrap();
        let descriptor = Buffer {
            addr,
            len: len as u32,
        };
        (memory, descriptor)
    }
}

#[test]
fn malformed_chains_do_not_stop_the_device() {
    let server = Server::start("malformed");
    let mut raw = RawFrontend::connect(&server);
    let (_request, request) = raw.buffer(&[ECHO_REVERSED, 7, 8, 9], 4);
    let (response_memory, response) = raw.buffer(&[], 64);
    let outside = Buffer {
        addr: 0xdead_0000_0000,
        len: 64,
    };

    // Only device-readable descriptors: nowhere to answer.
    assert_eq!(raw.send(&[request], &[]), 0);
    // Only device-writable descriptors: an empty request the handler answers.
    assert_eq!(raw.send(&[], &[response]), 1);
    // Addresses outside guest RAM, readable and writable.
    assert_eq!(raw.send(&[outside], &[response]), 0);
    assert_eq!(raw.send(&[request], &[outside]), 0);
    // A writable length far beyond guest RAM.
    let huge = Buffer {
        addr: response.addr,
        len: u32::MAX,
    };
    assert_eq!(raw.send(&[request], &[huge]), 0);
    // A request split over many descriptors still arrives whole.
    let pieces: Vec<Buffer> = (0..4)
        .map(|i| Buffer {
            addr: request.addr + i,
            len: 1,
        })
        .collect();
    assert_eq!(raw.send(&pieces, &[response]), 3);
    assert_eq!(&response_memory.as_slice()[..3], &[9, 8, 7]);

    // The protocol-level reset reaches the handler.
    raw.frontend.reset_device().unwrap();
    wait_until("the reset", || {
        server.device(0).resets.load(Ordering::SeqCst) == 1
    });

    // Other guests are served as usual.
    let transport = server.connect();
    assert_eq!(command(&transport, &[ECHO_REVERSED, 1, 2], 8), vec![2, 1]);
}

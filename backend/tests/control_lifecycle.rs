//! The per-guest device across its life: malformed input, reset, DISCARD_STATE, isolation between
//! guests, host events.
//!
//! The real per-guest device (`GuestDevice`) driven through the `DeviceHandler` API on a host
//! without RDMA, over the fake host device and fake frontend of `vrdma_test_support::fake_host`.

use vrdma_backend::guest_device::GuestDeviceFactory;
use vrdma_backend::host::*;
use vrdma_backend::vhost_device::handler::DeviceHandler;
use vrdma_spec::control::{HEADER_SIZE, MAX_RESPONSE_SIZE};
use vrdma_spec::features::*;
use vrdma_spec::{ControlRequest, ControlResponse, Opcode, Status};
use vrdma_test_support::fake_host::device::*;
use vrdma_test_support::fake_host::harness::*;

#[test]
fn malformed_input_is_answered_and_never_stops_the_device() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), ALL_FEATURES);
    let status_of = |bytes: &[u8]| -> (u32, usize) {
        let r = guest.raw(bytes, MAX_RESPONSE_SIZE);
        assert!(r.len() >= HEADER_SIZE, "{bytes:?}");
        (u32::from_le_bytes(r[..4].try_into().unwrap()), r.len())
    };
    let invalid = Status::Invalid as u32;
    assert_eq!(status_of(&[]), (invalid, 8));
    assert_eq!(status_of(&[1, 0, 0]), (invalid, 8));
    assert_eq!(
        status_of(&[0x99, 0x99, 0, 0, 0, 0, 0, 0]).0,
        Status::Unsupported as u32
    );
    assert_eq!(status_of(&[0x10, 0, 1, 0, 0, 0, 0, 0]).0, invalid, "flags");
    assert_eq!(
        status_of(&[0x10, 0, 0, 0, 0, 0, 0, 1]).0,
        invalid,
        "reserved"
    );
    assert_eq!(
        status_of(&[0x10, 0, 0, 0, 0, 0, 0, 0, 0]).0,
        invalid,
        "trailing"
    );
    // Oversized request (the plumbing rejects it unread).
    let huge = vec![0u8; guest.dev().max_request_size() + 1];
    assert_eq!(status_of(&huge).0, invalid);
    // A response buffer too small for the success body: not executed.
    let alloc = ControlRequest::AllocPd.to_vec();
    let r = guest.raw(&alloc, HEADER_SIZE + 4);
    assert_eq!(u32::from_le_bytes(r[..4].try_into().unwrap()), invalid);
    assert_eq!(fake.world().pds.len(), 0);
    // No room for even a status: nothing written, nothing done.
    assert!(guest.raw(&alloc, 4).is_empty());
    assert_eq!(fake.world().pds.len(), 0);

    // Random bodies behind every opcode, from a fixed seed.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(4).cq.get();
    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);
    for round in 0..4000 {
        let op = Opcode::ALL[(next() % Opcode::ALL.len() as u64) as usize];
        let len = if round % 2 == 0 {
            op.request_body_len()
        } else {
            (next() % 200) as usize
        };
        let mut request = vec![0u8; HEADER_SIZE + len];
        request[..2].copy_from_slice(&(op as u16).to_le_bytes());
        for chunk in request[HEADER_SIZE..].chunks_mut(4) {
            // Mostly small numbers and live handles, so that decoding often succeeds.
            let v: u32 = match next() % 4 {
                0 => (next() % 8) as u32,
                1 => pd,
                2 => cq,
                _ => next() as u32,
            };
            let bytes = v.to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        let response = guest.raw(&request, MAX_RESPONSE_SIZE);
        let status = u32::from_le_bytes(response[..4].try_into().unwrap());
        assert!(Status::try_from(status).is_ok());
    }
    // Still serving, and every extent it placed is mapped exactly once.
    guest.ok(ControlRequest::QueryDevice);
    let counts = guest.dev().object_counts();
    assert_eq!(counts.shm_extents, guest.frontend.mapped().len());
    guest.dev().reset_requested();
    guest.dev().reset();
    assert_eq!(fake.world().live(), 0);
}

#[test]
fn reset_releases_everything_and_bumps_the_epoch() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), ALL_FEATURES);
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(8).cq.get();
    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);
    let qp = guest.create_qp(qp_req(pd, cq, 0)).unwrap();
    assert!(matches!(
        reg_mr(&guest, pd, 0x1000, PAGE, &[RAM_BASE + PAGE]),
        ControlResponse::Ok(_)
    ));
    let epoch = guest.config().epoch.get();
    assert_eq!(fake.world().live(), 4);

    // The epoch moves when the reset is requested: its discard may come only after the
    // command it interrupted, when the next driver has read the configuration already.
    guest.dev().reset_requested();
    assert_eq!(guest.config().epoch.get(), epoch + 1);
    assert_eq!(fake.world().live(), 4, "the discard has not run yet");
    guest.dev().reset();
    // As QEMU does on a device reset.
    guest.frontend.forget_mappings();
    assert_eq!(fake.world().live(), 0);
    assert!(guest.dev().object_counts().is_empty());
    assert_eq!(guest.config().epoch.get(), epoch + 1);
    // Reset again: nothing to drop; a new epoch all the same (every reset starts one).
    guest.dev().reset_requested();
    guest.dev().reset();
    assert_eq!(guest.config().epoch.get(), epoch + 2);

    // The driver renegotiates; old handles are unknown; DEVICE_FATAL is owed.
    guest
        .dev()
        .features_acked(VIRTIO_F_VERSION_1 | ALL_FEATURES);
    assert_eq!(guest.guest_io().events().len(), 0);
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::BadHandle
    );
    assert_eq!(guest.guest_io().events().len(), 1);
    // It names the epoch the new driver read: a driver that started after the discard knows
    // it is not about its own objects (spec §11.1).
    let queued = queued_events(&guest);
    assert_eq!(queued.len(), 1);
    assert_eq!(queued[0].event_type, vrdma_spec::EventType::DeviceFatal);
    assert_eq!(queued[0].detail, guest.config().epoch.get());
    assert_eq!(guest.create_qp(qp_req(pd, cq, 0)), Err(Status::BadHandle));
    let qph = qp.qp.get();
    assert_eq!(
        guest.status(ControlRequest::DestroyQp(handle(qph))),
        Status::BadHandle
    );
    // The doorbell area went too.
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(8).cq.get();
    assert_eq!(guest.create_qp(qp_req(pd, cq, 0)), Err(Status::BadState));
    // The whole region is free again.
    assert_eq!(guest.create_cq(8).ring.shm_offset.get() % PAGE, 0);

    // Dropping the device releases what is left.
    drop(guest);
    assert_eq!(fake.world().live(), 0);
}

#[test]
fn discard_state_releases_everything_and_unmaps_the_queues_itself() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), ALL_FEATURES);
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(8).cq.get();
    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);
    guest.create_qp(qp_req(pd, cq, 0)).unwrap();
    let epoch = guest.config().epoch.get();
    assert!(!guest.frontend.mapped().is_empty());

    assert_eq!(guest.status(ControlRequest::DiscardState), Status::Ok);
    // Unlike a reset, the device removed its mappings itself (QEMU 11.1.3 crashes when it
    // removes live mappings during a reset).
    assert!(guest.frontend.mapped().is_empty());
    assert_eq!(fake.world().live(), 0);
    assert!(guest.dev().object_counts().is_empty());
    assert_eq!(guest.config().epoch.get(), epoch + 1);
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::BadHandle
    );
    // The driver asked: no DEVICE_FATAL is owed.
    assert_eq!(guest.guest_io().events().len(), 0);
    // Nothing left: a second discard changes nothing.
    assert_eq!(guest.status(ControlRequest::DiscardState), Status::Ok);
    assert_eq!(guest.config().epoch.get(), epoch + 1);
}

#[test]
fn guests_of_one_factory_cannot_see_each_other() {
    let fake = FakeDevice::new();
    let factory = GuestDeviceFactory::new(fake.clone(), test_options()).unwrap();
    let a = TestGuest::from_factory(&factory, ALL_FEATURES);
    let b = TestGuest::from_factory(&factory, ALL_FEATURES);
    assert_ne!(a.dev().id(), b.dev().id());
    let pd_a = a.alloc_pd();
    let cq_a = a.create_cq(4).cq.get();
    assert_eq!(
        b.status(ControlRequest::DeallocPd(handle(pd_a))),
        Status::BadHandle
    );
    assert_eq!(
        b.status(ControlRequest::DestroyCq(handle(cq_a))),
        Status::BadHandle
    );
    // B's objects may carry the same values; they are B's.
    let pd_b = b.alloc_pd();
    assert_eq!(
        b.status(ControlRequest::DeallocPd(handle(pd_b))),
        Status::Ok
    );
    assert_eq!(fake.world().pds.len(), 1, "A's PD is untouched");
    // Each guest has its own queue region.
    assert_eq!(b.create_cq(4).ring.shm_offset.get(), 0);
    assert_eq!(a.frontend.mapped().len(), 1);
    assert_eq!(b.frontend.mapped().len(), 1);
    drop(b);
    assert_eq!(fake.world().cqs.len(), 1, "only B's objects went with B");
    assert_eq!(
        a.status(ControlRequest::DestroyCq(handle(cq_a))),
        Status::Ok
    );
}

#[test]
fn host_events_become_guest_events() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), ALL_FEATURES);
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(4).cq.get();
    let cq2 = guest.create_cq(4).cq.get();
    let user_handle = |i: usize| *fake.world().cqs.values().nth(i).unwrap();
    let (uh1, uh2) = (user_handle(0), user_handle(1));
    fake.world().comp_events.extend([
        CompEvent {
            cq_user_handle: uh1,
        },
        CompEvent {
            cq_user_handle: 0xdead,
        },
    ]);
    guest.dev().fd_ready(guest.guest_io(), 0);
    assert_eq!(guest.guest_io().events().len(), 1, "unknown CQ dropped");
    assert!(fake.world().comp_events.is_empty());

    // Events of a destroyed object are not delivered.
    assert_eq!(
        guest.status(ControlRequest::DestroyCq(handle(cq2))),
        Status::Ok
    );
    fake.world().comp_events.push_back(CompEvent {
        cq_user_handle: uh2,
    });
    guest.dev().fd_ready(guest.guest_io(), 0);
    assert_eq!(guest.guest_io().events().len(), 1);

    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);
    guest.create_qp(qp_req(pd, cq, 0)).unwrap();
    let qp_user = fake.world().qps.values().next().unwrap().1;
    fake.world().async_events.extend([
        AsyncEvent {
            kind: AsyncEventKind::QpFatal,
            element: qp_user,
        },
        AsyncEvent {
            kind: AsyncEventKind::PortActive,
            element: 1,
        },
        AsyncEvent {
            kind: AsyncEventKind::PortActive,
            element: 7,
        },
        AsyncEvent {
            kind: AsyncEventKind::LidChange,
            element: 1,
        },
        // The host's GID table changed (an address came or went on its interface): the guest
        // drops its cached GID table on it.
        AsyncEvent {
            kind: AsyncEventKind::GidChange,
            element: 1,
        },
        // A CQ event naming a QP's user handle is not a CQ event.
        AsyncEvent {
            kind: AsyncEventKind::CqErr,
            element: qp_user,
        },
    ]);
    guest.dev().fd_ready(guest.guest_io(), 1);
    assert_eq!(guest.guest_io().events().len(), 4);

    // A fatal host error discards everything and refuses commands until reset.
    fake.world().async_events.push_back(AsyncEvent {
        kind: AsyncEventKind::DeviceFatal,
        element: 1,
    });
    guest.dev().fd_ready(guest.guest_io(), 1);
    assert_eq!(guest.guest_io().events().len(), 5, "DEVICE_FATAL");
    assert_eq!(fake.world().live(), 0);
    match guest.run(ControlRequest::AllocPd) {
        ControlResponse::Err(e) => {
            assert_eq!(
                (e.status(), e.detail()),
                (Status::DeviceError, libc::ENODEV as u32)
            )
        }
        other => panic!("{other:?}"),
    }
    guest.dev().reset_requested();
    guest.dev().reset();
    guest
        .dev()
        .features_acked(VIRTIO_F_VERSION_1 | ALL_FEATURES);
    guest.alloc_pd();
}

#[test]
fn events_queued_for_an_object_are_gone_once_its_destroy_is_answered() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), ALL_FEATURES);
    let keep = guest.create_cq(4).cq.get();
    let doomed = guest.create_cq(4).cq.get();
    let user_handle = |i: usize| *fake.world().cqs.values().nth(i).unwrap();
    let (uh_keep, uh_doomed) = (user_handle(0), user_handle(1));
    // The guest supplies no eventq buffer: both completion events wait in the queue.
    fake.world().comp_events.extend([
        CompEvent {
            cq_user_handle: uh_doomed,
        },
        CompEvent {
            cq_user_handle: uh_keep,
        },
    ]);
    guest.dev().fd_ready(guest.guest_io(), 0);
    assert_eq!(guest.guest_io().events().len(), 2);
    assert_eq!(
        guest.status(ControlRequest::DestroyCq(handle(doomed))),
        Status::Ok
    );
    // Only the event of the CQ that still exists is left to deliver; it goes with its CQ.
    assert_eq!(guest.guest_io().events().len(), 1);
    assert_eq!(
        guest.status(ControlRequest::DestroyCq(handle(keep))),
        Status::Ok
    );
    assert_eq!(guest.guest_io().events().len(), 0);
}

#[test]
fn a_discard_postponed_past_the_next_drivers_negotiation_leaves_it_alone() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), ALL_FEATURES);
    guest.alloc_pd();
    // The reset is requested while a command runs: negotiation is forgotten at once, the
    // discard waits for the command. Meanwhile the next driver negotiates.
    guest.dev().reset_requested();
    guest
        .dev()
        .features_acked(VIRTIO_F_VERSION_1 | ALL_FEATURES);
    // The postponed discard drops the old driver's objects and nothing of the new driver's.
    guest.dev().reset();
    assert_eq!(fake.world().live(), 0);
    guest.alloc_pd();
    assert_eq!(fake.world().pds.len(), 1);
}

#[test]
fn a_reset_requested_during_discard_state_moves_the_epoch_once() {
    // The driver sends DISCARD_STATE and resets the device while it runs (the discard waits
    // for the front-end to unmap the queues). The reset starts the next driver's epoch; the
    // discard, the old driver's, must not move it again under the new driver.
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), ALL_FEATURES);
    guest.create_cq(8);
    let epoch = guest.config().epoch.get();
    let (unmap_asked, asked) = std::sync::mpsc::channel();
    let (answer, answer_now) = std::sync::mpsc::channel::<()>();
    guest.frontend.before_next_request(Box::new(move || {
        unmap_asked.send(()).unwrap();
        answer_now.recv().unwrap();
    }));
    std::thread::scope(|scope| {
        let discard = scope.spawn(|| guest.status(ControlRequest::DiscardState));
        asked.recv().unwrap();
        guest.dev().reset_requested();
        answer.send(()).unwrap();
        assert_eq!(discard.join().unwrap(), Status::Ok);
    });
    assert_eq!(guest.config().epoch.get(), epoch + 1);
    // An uninterrupted DISCARD_STATE with something to discard moves it once, too.
    guest
        .dev()
        .features_acked(VIRTIO_F_VERSION_1 | ALL_FEATURES);
    guest.create_cq(8);
    assert_eq!(guest.status(ControlRequest::DiscardState), Status::Ok);
    assert_eq!(guest.config().epoch.get(), epoch + 2);
}

/// Spec §11.5: a device given a connection that served a lost daemon starts past the epoch
/// that daemon last showed, announces DEVICE_FATAL naming it, and fails commands until the
/// driver resets; after the reset it serves as any device.
#[test]
fn a_resumed_device_fails_until_reset_past_the_lost_daemons_epoch() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), ALL_FEATURES);
    let mut lost = guest.config();
    lost.epoch = vrdma_spec::Le32::new(41);
    guest
        .dev()
        .resumed(guest.guest_io(), zerocopy::IntoBytes::as_bytes(&lost));
    assert_eq!(guest.config().epoch.get(), 42);
    let queued = queued_events(&guest);
    assert_eq!(queued.len(), 1);
    assert_eq!(queued[0].event_type, vrdma_spec::EventType::DeviceFatal);
    assert_eq!(queued[0].detail, 42);
    assert_eq!(
        guest.status(ControlRequest::AllocPd),
        Status::DeviceError,
        "nothing runs until the driver resets"
    );
    assert_eq!(fake.world().live(), 0);

    guest.dev().reset_requested();
    guest.dev().reset();
    guest
        .dev()
        .features_acked(VIRTIO_F_VERSION_1 | ALL_FEATURES);
    assert_eq!(guest.config().epoch.get(), 43);
    guest.alloc_pd();
    assert_eq!(fake.world().live(), 1);

    // Without a configuration to go by, the epoch still moves.
    let other = TestGuest::new(&fake, test_options(), ALL_FEATURES);
    let before = other.config().epoch.get();
    other.dev().resumed(other.guest_io(), &[]);
    assert_eq!(other.config().epoch.get(), before + 1);
}

/// The events queued for `guest`'s event queue, decoded (they stay queued).
fn queued_events(guest: &TestGuest) -> Vec<vrdma_spec::Event> {
    let mut queued = Vec::new();
    guest.guest_io().events().discard_where(|bytes| {
        queued.push(vrdma_spec::Event::decode(bytes).unwrap());
        false
    });
    queued
}

//! RESIZE_CQ on the per-guest device: the new buffer replaces the old one in the queue region,
//! and every refusal (handles of this guest only, limits, completions the CQ holds, region
//! space) leaves the CQ and its mapping as they were.
//!
//! The real per-guest device over the fake host device and fake frontend of
//! `vrdma_test_support::fake_host`; the fake host refuses a resize below the completions a test
//! says the CQ holds, as rxe does.

use vrdma_backend::guest::options::DeviceOptions;
use vrdma_backend::guest_device::GuestDeviceFactory;
use vrdma_backend::vhost_device::handler::DeviceHandler;
use vrdma_spec::features::*;
use vrdma_spec::wire::*;
use vrdma_spec::{ControlRequest, ControlResponse, Le32, ResponseBody, Status};
use vrdma_test_support::fake_host::device::*;
use vrdma_test_support::fake_host::harness::*;

fn resize_req(cq: u32, cqe: u32) -> ControlRequest<'static> {
    ControlRequest::ResizeCq(ResizeCqReq {
        cq: Le32::new(cq),
        cqe: Le32::new(cqe),
    })
}

fn resize(guest: &TestGuest, cq: u32, cqe: u32) -> Result<ResizeCqResp, Status> {
    match guest.run(resize_req(cq, cqe)) {
        ControlResponse::Ok(ResponseBody::ResizeCq(r)) => Ok(r),
        ControlResponse::Ok(other) => panic!("{other:?}"),
        ControlResponse::Err(e) => Err(e.status()),
    }
}

/// The host handle of the only CQ of the fake device.
fn only_host_cq(fake: &FakeDevice) -> u32 {
    let world = fake.world();
    assert_eq!(world.cqs.len(), 1);
    *world.cqs.keys().next().unwrap()
}

#[test]
fn resize_grows_and_shrinks_and_remaps_the_buffer() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), ALL_FEATURES);
    let pd = guest.alloc_pd();
    let created = guest.create_cq(100);
    let cq = created.cq.get();
    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);
    // A QP using the CQ does not keep it from being resized.
    guest.create_qp(qp_req(pd, cq, 0)).unwrap();
    let before = guest.frontend.mapped().len();

    let grown = resize(&guest, cq, 500).unwrap();
    assert_eq!(grown.cqe.get(), 511);
    assert_eq!(grown.reserved.get(), 0);
    grown.ring.check_rxe_v1(SHM_SIZE, PAGE).unwrap();
    assert_eq!(
        (grown.ring.num_slots.get(), grown.ring.log2_slot_size.get()),
        (512, 7)
    );
    let mapped = guest.frontend.mapped();
    assert_eq!(mapped.len(), before, "one buffer replaced by another");
    assert!(mapped.contains(&extent(&grown.ring)));
    assert!(
        !mapped.contains(&extent(&created.ring)),
        "old buffer unmapped"
    );

    let shrunk = resize(&guest, cq, 10).unwrap();
    assert_eq!(shrunk.cqe.get(), 15);
    let mapped = guest.frontend.mapped();
    assert!(mapped.contains(&extent(&shrunk.ring)));
    assert!(!mapped.contains(&extent(&grown.ring)));

    let host = only_host_cq(&fake);
    assert_eq!(fake.world().resized, vec![(host, 511), (host, 15)]);
    let counts = guest.dev().object_counts();
    assert_eq!((counts.cqs, counts.shm_extents), (1, mapped.len()));
}

#[test]
fn shrinking_below_the_pending_completions_changes_nothing() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), ALL_FEATURES);
    let created = guest.create_cq(100);
    let cq = created.cq.get();
    let host = only_host_cq(&fake);
    fake.world().cq_pending.insert(host, 50);

    assert_eq!(resize(&guest, cq, 49), Err(Status::Invalid));
    assert_eq!(guest.frontend.mapped(), vec![extent(&created.ring)]);
    assert!(fake.world().resized.is_empty());
    // Room for exactly the pending completions is enough.
    assert_eq!(resize(&guest, cq, 50).unwrap().cqe.get(), 63);
}

#[test]
fn only_this_guests_live_cqs_can_be_resized() {
    let fake = FakeDevice::new();
    let factory = GuestDeviceFactory::new(fake.clone(), test_options()).unwrap();
    let a = TestGuest::from_factory(&factory, ALL_FEATURES);
    let b = TestGuest::from_factory(&factory, ALL_FEATURES);
    let cq = a.create_cq(8);
    let cqh = cq.cq.get();

    // Guest B has no CQ: A's handle means nothing in its namespace.
    assert_eq!(resize(&b, cqh, 16), Err(Status::BadHandle));
    assert_eq!(resize(&a, 0, 16), Err(Status::BadHandle));
    assert_eq!(resize(&a, cqh ^ 0x1, 16), Err(Status::BadHandle));
    assert!(fake.world().resized.is_empty());
    assert_eq!(a.frontend.mapped(), vec![extent(&cq.ring)]);
    assert!(b.frontend.mapped().is_empty());

    // A destroyed CQ's handle is stale.
    assert_eq!(a.status(ControlRequest::DestroyCq(handle(cqh))), Status::Ok);
    assert_eq!(resize(&a, cqh, 16), Err(Status::BadHandle));
    assert!(fake.world().resized.is_empty());
}

#[test]
fn limits_region_space_and_host_failures() {
    let fake = FakeDevice::new();
    let small = DeviceOptions {
        shm_size: 8 * PAGE,
        ..test_options()
    };
    let guest = TestGuest::new(&fake, small, VRDMA_F_RING_RXE_V1);
    let created = guest.create_cq(4);
    let cq = created.cq.get();
    let unchanged = |guest: &TestGuest| {
        assert_eq!(guest.frontend.mapped(), vec![extent(&created.ring)]);
        assert_eq!(guest.dev().object_counts().cqs, 1);
    };

    // Over the per-object limit (max_cqe) and zero entries: INVALID, host never asked.
    let ResponseBody::QueryDevice(attr) = guest.ok(ControlRequest::QueryDevice) else {
        panic!("QUERY_DEVICE body");
    };
    let max_cqe = attr.max_cqe.get();
    assert_eq!(resize(&guest, cq, max_cqe + 1), Err(Status::Invalid));
    assert_eq!(resize(&guest, cq, 0), Err(Status::Invalid));
    // 1023 CQEs of 128 bytes: 33 pages, more than the region: refused before the host resizes.
    assert_eq!(resize(&guest, cq, 1000), Err(Status::NoMemory));
    assert!(fake.world().resized.is_empty());
    unchanged(&guest);

    // A host refusal is a failed command without effect.
    fake.world().fail_next = Some("RESIZE_CQ");
    assert_eq!(resize(&guest, cq, 8), Err(Status::Invalid));
    unchanged(&guest);

    // The CQ count quota is untouched by a resize: the remaining CQs can still be created.
    let resized = resize(&guest, cq, 20).unwrap();
    assert_eq!(resized.cqe.get(), 31);
    for _ in 1..test_options().quotas.cqs {
        guest.create_cq(2);
    }
    let one_more = CreateCqReq {
        cqe: Le32::new(2),
        reserved: Le32::ZERO,
    };
    assert_eq!(
        guest.status(ControlRequest::CreateCq(one_more)),
        Status::Quota
    );

    // The frontend refusing the new mapping after the host resized: DEVICE_ERROR, and the
    // device still tracks exactly the extents that are mapped.
    guest.frontend.set_refusing(true);
    match guest.run(resize_req(cq, 8)) {
        ControlResponse::Err(e) => assert_eq!(e.status(), Status::DeviceError),
        other => panic!("{other:?}"),
    }
    guest.frontend.set_refusing(false);
    let counts = guest.dev().object_counts();
    assert_eq!(counts.shm_extents, guest.frontend.mapped().len());
    guest.dev().reset_requested();
    guest.dev().reset();
    assert_eq!(fake.world().live(), 0);
}

#[test]
fn resize_needs_the_ring_format() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), VRDMA_F_UD);
    assert_eq!(resize(&guest, 1, 8), Err(Status::Unsupported));
}

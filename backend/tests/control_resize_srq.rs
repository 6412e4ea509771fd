//! RESIZE_SRQ on the per-guest device: the new buffer replaces the old one in the queue
//! region, and every refusal (handles of this guest only, limits, the receives the SRQ holds,
//! an armed limit) leaves the SRQ and its mapping as they were.
//!
//! The real per-guest device over the fake host device and fake frontend of
//! `vrdma_test_support::fake_host`; the fake host refuses a resize below the receives a test
//! says the SRQ holds, as rxe does.

use vrdma_backend::guest_device::GuestDeviceFactory;
use vrdma_spec::features::*;
use vrdma_spec::wire::*;
use vrdma_spec::{ControlRequest, ControlResponse, Le32, ResponseBody, Status};
use vrdma_test_support::fake_host::device::*;
use vrdma_test_support::fake_host::harness::*;

fn resize(guest: &TestGuest, srq: u32, max_wr: u32) -> Result<ResizeSrqResp, Status> {
    let req = ControlRequest::ResizeSrq(ResizeSrqReq {
        srq: Le32::new(srq),
        max_wr: Le32::new(max_wr),
    });
    match guest.run(req) {
        ControlResponse::Ok(ResponseBody::ResizeSrq(r)) => Ok(r),
        ControlResponse::Ok(other) => panic!("{other:?}"),
        ControlResponse::Err(e) => Err(e.status()),
    }
}

fn create_srq(guest: &TestGuest, pd: u32, max_wr: u32, srq_limit: u32) -> CreateSrqResp {
    let req = CreateSrqReq {
        pd: Le32::new(pd),
        max_wr: Le32::new(max_wr),
        max_sge: Le32::new(2),
        srq_limit: Le32::new(srq_limit),
    };
    let ResponseBody::CreateSrq(srq) = guest.ok(ControlRequest::CreateSrq(req)) else {
        panic!("not CREATE_SRQ")
    };
    srq
}

fn query_max_wr(guest: &TestGuest, srq: u32) -> u32 {
    let ResponseBody::QuerySrq(q) = guest.ok(ControlRequest::QuerySrq(handle(srq))) else {
        panic!("not QUERY_SRQ")
    };
    q.max_wr.get()
}

/// The host handle of the only SRQ of the fake device.
fn only_host_srq(fake: &FakeDevice) -> u32 {
    let world = fake.world();
    assert_eq!(world.srqs.len(), 1);
    *world.srqs.keys().next().unwrap()
}

#[test]
fn resize_grows_and_shrinks_and_remaps_the_buffer() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), ALL_FEATURES);
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(16).cq.get();
    let created = create_srq(&guest, pd, 8, 0);
    let srq = created.srq.get();
    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);
    // A QP on the SRQ does not keep it from being resized.
    guest.create_qp(qp_req(pd, cq, srq)).unwrap();
    let before = guest.frontend.mapped().len();

    let grown = resize(&guest, srq, 100).unwrap();
    assert_eq!(grown.max_wr.get(), 127);
    assert_eq!(grown.reserved.get(), 0);
    grown.ring.check_rxe_v1(SHM_SIZE, PAGE).unwrap();
    assert_eq!(
        (grown.ring.num_slots.get(), grown.ring.log2_slot_size.get()),
        (128, 7),
        "receive WQEs of 2 SGEs in 128-byte slots"
    );
    let mapped = guest.frontend.mapped();
    assert_eq!(mapped.len(), before, "one buffer replaced by another");
    assert!(mapped.contains(&extent(&grown.ring)));
    assert!(
        !mapped.contains(&extent(&created.ring)),
        "old buffer unmapped"
    );
    assert_eq!(query_max_wr(&guest, srq), 127);

    let shrunk = resize(&guest, srq, 3).unwrap();
    assert_eq!(shrunk.max_wr.get(), 3);
    let mapped = guest.frontend.mapped();
    assert!(mapped.contains(&extent(&shrunk.ring)));
    assert!(!mapped.contains(&extent(&grown.ring)));
    assert_eq!(query_max_wr(&guest, srq), 3);

    let host = only_host_srq(&fake);
    assert_eq!(fake.world().srq_resized, vec![(host, 127), (host, 3)]);
    let counts = guest.dev().object_counts();
    assert_eq!((counts.srqs, counts.shm_extents), (1, mapped.len()));
}

#[test]
fn refusals_change_nothing() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), ALL_FEATURES);
    let pd = guest.alloc_pd();
    let created = create_srq(&guest, pd, 60, 10);
    let srq = created.srq.get();
    let host = only_host_srq(&fake);
    fake.world().srq_pending.insert(host, 20);
    let ResponseBody::QueryDevice(attr) = guest.ok(ControlRequest::QueryDevice) else {
        panic!("not QUERY_DEVICE")
    };
    assert_ne!(attr.device_cap_flags.get() & (1 << 13), 0, "SRQ_RESIZE");

    // Fewer entries than the receives posted (the host's EINVAL).
    assert_eq!(resize(&guest, srq, 19), Err(Status::Invalid));
    // Below the armed limit (rxe checks it before resizing).
    fake.world().srq_pending.insert(host, 0);
    assert_eq!(resize(&guest, srq, 9), Err(Status::Invalid));
    // Over the host's limit (the fake's 2^14, as CREATE_SRQ checks it).
    assert_eq!(resize(&guest, srq, (1 << 14) + 1), Err(Status::Invalid));
    // Within it but more than the queue region holds.
    assert_eq!(resize(&guest, srq, 1 << 14), Err(Status::NoMemory));
    // Zero entries is malformed.
    assert_eq!(resize(&guest, srq, 0), Err(Status::Invalid));
    // A host failure of its own.
    fake.world().fail_next = Some("MODIFY_SRQ");
    assert_eq!(resize(&guest, srq, 30), Err(Status::Invalid));
    assert!(fake.world().srq_resized.is_empty());
    assert_eq!(guest.frontend.mapped(), vec![extent(&created.ring)]);
    assert_eq!(query_max_wr(&guest, srq), 63);

    // Room for exactly the armed limit is enough.
    assert_eq!(resize(&guest, srq, 10).unwrap().max_wr.get(), 15);
}

#[test]
fn only_this_guests_live_srqs_can_be_resized() {
    let fake = FakeDevice::new();
    let factory = GuestDeviceFactory::new(fake.clone(), test_options()).unwrap();
    let a = TestGuest::from_factory(&factory, ALL_FEATURES);
    let b = TestGuest::from_factory(&factory, ALL_FEATURES);
    let pd = a.alloc_pd();
    let created = create_srq(&a, pd, 8, 0);
    let srq = created.srq.get();

    // Guest B has no SRQ: A's handle means nothing in its namespace.
    assert_eq!(resize(&b, srq, 16), Err(Status::BadHandle));
    assert_eq!(resize(&a, 0, 16), Err(Status::BadHandle));
    assert_eq!(resize(&a, srq ^ 0x1, 16), Err(Status::BadHandle));
    // A CQ's handle is not an SRQ's.
    let cq = a.create_cq(4).cq.get();
    assert_eq!(resize(&a, cq, 16), Err(Status::BadHandle));
    assert!(fake.world().srq_resized.is_empty());
    assert!(b.frontend.mapped().is_empty());

    // A destroyed SRQ's handle is stale.
    assert_eq!(
        a.status(ControlRequest::DestroySrq(handle(srq))),
        Status::Ok
    );
    assert_eq!(resize(&a, srq, 16), Err(Status::BadHandle));
    assert!(fake.world().srq_resized.is_empty());
}

#[test]
fn resize_needs_the_srq_feature() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), ALL_FEATURES & !VRDMA_F_SRQ);
    assert_eq!(resize(&guest, 1, 16), Err(Status::Unsupported));
}

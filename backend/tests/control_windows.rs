//! Memory windows of the per-guest device (ALLOC_MW, DEALLOC_MW, REG_MR with MW_BIND): the
//! option and feature that gate them, validation, PD references, quota, another guest's
//! handles, and the discard of a guest's state.
//!
//! The real per-guest device over the fake host device of `vrdma_test_support::fake_host`.

use vrdma_backend::guest::options::DeviceOptions;
use vrdma_backend::vhost_device::handler::DeviceHandler;
use vrdma_spec::control::encode_page_list;
use vrdma_spec::features::*;
use vrdma_spec::verbs::{AccessFlags, MwType};
use vrdma_spec::wire::{AllocMwReq, AllocMwResp};
use vrdma_spec::{ControlRequest, ControlResponse, Le32, RegMr, ResponseBody, Status};
use vrdma_test_support::fake_host::device::*;
use vrdma_test_support::fake_host::harness::*;

const FEATURES: u64 = VRDMA_F_RING_RXE_V1 | VRDMA_F_MW;

fn mw_options() -> DeviceOptions {
    DeviceOptions {
        allow_memory_windows: true,
        ..test_options()
    }
}

fn alloc_req(pd: u32, mw_type: u32) -> ControlRequest<'static> {
    ControlRequest::AllocMw(AllocMwReq {
        pd: Le32::new(pd),
        mw_type: Le32::new(mw_type),
    })
}

fn alloc_mw(guest: &TestGuest, pd: u32, mw_type: MwType) -> AllocMwResp {
    let ResponseBody::AllocMw(resp) = guest.ok(alloc_req(pd, mw_type as u32)) else {
        panic!("ALLOC_MW answered with another body")
    };
    resp
}

fn reg_mr_with(guest: &TestGuest, pd: u32, access: AccessFlags) -> ControlResponse {
    let mut list = Vec::new();
    encode_page_list([RAM_BASE], &mut list);
    let req = reg_mr_req(pd, 0x7000_0000, PAGE, access.bits(), 1);
    guest.run(ControlRequest::RegMr(RegMr::new(req, &list)))
}

#[test]
fn windows_are_offered_only_when_allowed() {
    let fake = FakeDevice::new();
    let plain = TestGuest::new(&fake, test_options(), VRDMA_F_RING_RXE_V1);
    assert_eq!(plain.dev().device_features() & VRDMA_F_MW, 0);
    let pd = plain.alloc_pd();
    // Without the feature: both commands and MW_BIND access are UNSUPPORTED, nothing is made.
    assert_eq!(plain.status(alloc_req(pd, 1)), Status::Unsupported);
    assert_eq!(
        plain.status(ControlRequest::DeallocMw(handle(1))),
        Status::Unsupported
    );
    let bindable = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
    let ControlResponse::Err(e) = reg_mr_with(&plain, pd, bindable) else {
        panic!("an MW_BIND MR without VRDMA_F_MW")
    };
    assert_eq!(e.status(), Status::Unsupported);
    assert!(fake.world().mws.is_empty() && fake.world().mrs.is_empty());
    let ResponseBody::QueryDevice(attr) = plain.ok(ControlRequest::QueryDevice) else {
        panic!()
    };
    assert_eq!(attr.device_cap_flags.get() & ((1 << 17) | (1 << 24)), 0);

    let guest = TestGuest::new(&fake, mw_options(), FEATURES);
    assert_ne!(guest.dev().device_features() & VRDMA_F_MW, 0);
    let ResponseBody::QueryDevice(attr) = guest.ok(ControlRequest::QueryDevice) else {
        panic!()
    };
    assert_eq!(
        attr.device_cap_flags.get() & ((1 << 17) | (1 << 24)),
        (1 << 17) | (1 << 24),
        "MEM_WINDOW and MEM_WINDOW_TYPE_2B as the host reports them"
    );
    let pd = guest.alloc_pd();
    let ControlResponse::Ok(ResponseBody::RegMr(_)) = reg_mr_with(&guest, pd, bindable) else {
        panic!("REG_MR with MW_BIND failed")
    };
    let init = *fake.world().mrs.values().next().unwrap();
    assert!(
        init.access.contains(AccessFlags::MW_BIND),
        "passed to the host"
    );
}

#[test]
fn alloc_and_dealloc_with_pd_references() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, mw_options(), FEATURES);
    let pd = guest.alloc_pd();
    let one = alloc_mw(&guest, pd, MwType::Type1);
    let two = alloc_mw(&guest, pd, MwType::Type2);
    assert_ne!(one.mw.get(), two.mw.get());
    {
        let w = fake.world();
        let types: Vec<MwType> = w.mws.values().map(|(_, t)| *t).collect();
        assert_eq!(types, [MwType::Type1, MwType::Type2]);
        // The host's rkeys go to the guest unchanged: its WQEs carry them.
        let host_rkey = (*w.mws.keys().next().unwrap() << 8) | 0x42;
        assert_eq!(one.rkey.get(), host_rkey);
    }
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::Busy,
        "windows hold their PD"
    );
    for mw in [one.mw.get(), two.mw.get()] {
        assert_eq!(
            guest.status(ControlRequest::DeallocMw(handle(mw))),
            Status::Ok
        );
        assert_eq!(
            guest.status(ControlRequest::DeallocMw(handle(mw))),
            Status::BadHandle
        );
    }
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::Ok
    );
    assert_eq!(fake.world().live(), 0);
}

#[test]
fn bad_requests_change_nothing() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, mw_options(), FEATURES);
    let pd = guest.alloc_pd();
    for mw_type in [0, 3, 0x100] {
        assert_eq!(guest.status(alloc_req(pd, mw_type)), Status::Invalid);
    }
    // Unknown and stale PDs; an MW handle of another guest is unknown here.
    assert_eq!(guest.status(alloc_req(0, 1)), Status::BadHandle);
    assert_eq!(guest.status(alloc_req(pd + 1, 1)), Status::BadHandle);
    // Handles are per guest: the other guest's second PD has a value this guest never issued.
    let other = TestGuest::new(&fake, mw_options(), FEATURES);
    other.alloc_pd();
    let other_pd = other.alloc_pd();
    let foreign = alloc_mw(&other, other_pd, MwType::Type2);
    assert_eq!(
        guest.status(ControlRequest::DeallocMw(handle(foreign.mw.get()))),
        Status::BadHandle
    );
    assert_eq!(guest.status(alloc_req(other_pd, 2)), Status::BadHandle);
    assert_eq!(fake.world().mws.len(), 1, "only the other guest's window");
    // The host failing: DEVICE_ERROR, nothing recorded, the PD free again.
    fake.world().fail_next = Some("ALLOC_MW");
    assert_eq!(guest.status(alloc_req(pd, 1)), Status::DeviceError);
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::Ok
    );
}

#[test]
fn the_window_quota_is_per_guest() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, mw_options(), FEATURES);
    let pd = guest.alloc_pd();
    let first = alloc_mw(&guest, pd, MwType::Type1);
    alloc_mw(&guest, pd, MwType::Type2);
    assert_eq!(guest.status(alloc_req(pd, 1)), Status::Quota, "quota of 2");
    assert_eq!(fake.world().mws.len(), 2);
    assert_eq!(
        guest.status(ControlRequest::DeallocMw(handle(first.mw.get()))),
        Status::Ok
    );
    alloc_mw(&guest, pd, MwType::Type1);
    // Another guest has a quota of its own.
    let other = TestGuest::new(&fake, mw_options(), FEATURES);
    let other_pd = other.alloc_pd();
    alloc_mw(&other, other_pd, MwType::Type2);
}

#[test]
fn discard_releases_windows_before_their_pd() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, mw_options(), FEATURES);
    let pd = guest.alloc_pd();
    let mw = alloc_mw(&guest, pd, MwType::Type2);
    alloc_mw(&guest, pd, MwType::Type1);
    assert_eq!(guest.dev().object_counts().mws, 2);
    // The fake host asserts that no PD goes while a window uses it.
    assert_eq!(guest.status(ControlRequest::DiscardState), Status::Ok);
    assert_eq!(fake.world().live(), 0);
    assert_eq!(guest.dev().object_counts().mws, 0);
    assert_eq!(
        guest.status(ControlRequest::DeallocMw(handle(mw.mw.get()))),
        Status::BadHandle
    );
}

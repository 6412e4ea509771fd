//! Creates that fail after taking something give all of it back (`control/unwind.rs`): no
//! host object, queue mapping, reference or budget charge outlives a failed CREATE_CQ,
//! CREATE_SRQ, CREATE_AH or REG_MR. (CREATE_QP: `control_queues.rs`.)
//!
//! Real per-guest devices over the fake host device of `vrdma_test_support::fake_host`.

use vrdma_backend::guest::options::DeviceOptions;
use vrdma_backend::guest_device::MemoryUsage;
use vrdma_spec::features::*;
use vrdma_spec::wire::{self, CreateAhReq, CreateCqReq, CreateSrqReq};
use vrdma_spec::{ControlRequest, ControlResponse, Le32, ResponseBody, Status};
use vrdma_test_support::fake_host::device::*;
use vrdma_test_support::fake_host::harness::*;

/// Dealloc of `pd` succeeds: nothing holds a reference on it.
fn pd_is_free(guest: &TestGuest, pd: u32) {
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::Ok,
        "a failed create kept a reference on the PD"
    );
}

/// A CQ whose ring the front-end refuses to map is destroyed at the host again; without staged
/// CQs (spec §9.8) its ring is the host's buffer, mapped on its own.
#[test]
fn a_cq_whose_ring_cannot_be_mapped_leaves_nothing() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), VRDMA_F_RING_RXE_V1);
    let before = (fake.world().live(), guest.frontend.mapped());
    guest.frontend.set_refusing(true);
    let cq = CreateCqReq {
        cqe: Le32::new(4),
        reserved: Le32::ZERO,
    };
    assert_eq!(
        guest.status(ControlRequest::CreateCq(cq)),
        Status::DeviceError
    );
    assert_eq!((fake.world().live(), guest.frontend.mapped()), before);
    guest.frontend.set_refusing(false);
    guest.create_cq(4);
}

/// An SRQ the host refuses, or whose ring cannot be mapped, keeps no reference on its PD and
/// no host SRQ.
#[test]
fn a_failed_srq_keeps_no_pd_reference_and_no_host_srq() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), VRDMA_F_RING_RXE_V1 | VRDMA_F_SRQ);
    let pd = guest.alloc_pd();
    let before = (fake.world().live(), guest.frontend.mapped());
    let srq = ControlRequest::CreateSrq(CreateSrqReq {
        pd: Le32::new(pd),
        max_wr: Le32::new(8),
        max_sge: Le32::new(1),
        srq_limit: Le32::new(0),
    });
    fake.world().fail_next = Some("CREATE_SRQ");
    assert_eq!(guest.status(srq), Status::DeviceError);
    guest.frontend.set_refusing(true);
    assert_eq!(guest.status(srq), Status::DeviceError);
    guest.frontend.set_refusing(false);
    assert_eq!((fake.world().live(), guest.frontend.mapped()), before);
    pd_is_free(&guest, pd);
}

/// An AH the host refuses keeps no reference on its PD.
#[test]
fn a_refused_ah_keeps_no_pd_reference() {
    let fake = FakeDevice::new();
    let ud = DeviceOptions {
        allow_ud: true,
        ..test_options()
    };
    let guest = TestGuest::new(&fake, ud, ALL_FEATURES);
    let pd = guest.alloc_pd();
    let before = fake.world().live();
    fake.world().fail_next = Some("CREATE_AH");
    let ah = ControlRequest::CreateAh(CreateAhReq {
        pd: Le32::new(pd),
        reserved: Le32::ZERO,
        ah_attr: wire::AhAttr {
            is_global: 1,
            ..roce_av(0, GID0)
        },
    });
    assert_eq!(guest.status(ah), Status::DeviceError);
    assert_eq!(fake.world().live(), before);
    pd_is_free(&guest, pd);
}

/// An MR the host refuses keeps no reference on its PD, no window and no budget charge.
#[test]
fn a_refused_mr_keeps_no_pd_reference_window_or_charge() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), VRDMA_F_RING_RXE_V1);
    let pd = guest.alloc_pd();
    // Two pages that do not continue each other: a window of two mappings.
    let pages = [RAM_BASE + 8 * PAGE, RAM_BASE + 3 * PAGE];
    fake.world().fail_next = Some("REG_MR");
    assert!(matches!(
        reg_mr(&guest, pd, 0x1000, 2 * PAGE, &pages),
        ControlResponse::Err(e) if e.status() == Status::DeviceError
    ));
    assert_eq!(guest.dev().memory_usage(), MemoryUsage::default());
    assert_eq!(fake.world().mrs.len(), 0);
    pd_is_free(&guest, pd);

    // The same registration succeeds once the host takes it, and charges what it maps.
    let pd = guest.alloc_pd();
    let ControlResponse::Ok(ResponseBody::RegMr(_)) = reg_mr(&guest, pd, 0x1000, 2 * PAGE, &pages)
    else {
        panic!("REG_MR failed")
    };
    assert_eq!(guest.dev().memory_usage().mappings, 2);
}

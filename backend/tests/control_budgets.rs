//! Host-resource budgets of MR windows (spec §10): memory mappings per MR, per guest and per
//! daemon, and distinct pinned guest bytes per daemon; failures that change nothing, and
//! release at DEREG_MR, REREG_MR, revocation, DISCARD_STATE and disconnect.
//!
//! Real per-guest devices over the fake host device of `vrdma_test_support::fake_host`; guests
//! of one factory share its budget, as the guests of one daemon do.

use std::sync::Arc;

use vrdma_backend::guest::options::{DeviceOptions, StagedRings};
use vrdma_backend::guest_device::{GuestDeviceFactory, MemoryUsage};
use vrdma_backend::memory::budget::{HostBudget, HostBudgetLimits};
use vrdma_backend::resources::quotas::Quotas;
use vrdma_backend::vhost_device::handler::DeviceHandler;
use vrdma_spec::control::{encode_page_list, rereg_flags, ReregMr};
use vrdma_spec::features::*;
use vrdma_spec::wire::{CreateCqReq, ReregMrReq};
use vrdma_spec::{ControlRequest, ControlResponse, Le32, Le64, ResponseBody, Status};
use vrdma_test_support::fake_host::device::*;
use vrdma_test_support::fake_host::harness::*;
use zerocopy::FromZeros;

/// Room for many MRs; `max_mr_mappings` per MR and `guest_mappings` per guest.
fn options(max_mr_mappings: u32, guest_mappings: u32) -> DeviceOptions {
    let base = test_options();
    DeviceOptions {
        max_mr_mappings,
        quotas: Quotas {
            mrs: 16,
            mr_bytes: 256 * PAGE,
            mappings: guest_mappings,
            ..base.quotas
        },
        ..base
    }
}

/// A factory whose guests share a budget of `mappings` and `pinned_pages` pages.
fn factory(
    options: DeviceOptions,
    mappings: u64,
    pinned_pages: u64,
) -> (Arc<FakeDevice>, GuestDeviceFactory) {
    factory_with_limits(
        options,
        HostBudgetLimits {
            mappings,
            pinned_bytes: pinned_pages * PAGE,
            locked_bytes: u64::MAX,
        },
    )
}

/// A factory whose guests share a budget of `limits`.
fn factory_with_limits(
    options: DeviceOptions,
    limits: HostBudgetLimits,
) -> (Arc<FakeDevice>, GuestDeviceFactory) {
    let fake = FakeDevice::new();
    let budget = Arc::new(HostBudget::new(limits));
    let factory = GuestDeviceFactory::with_budget(fake.clone(), options, budget).unwrap();
    (fake, factory)
}

/// `n` pages no two of which continue each other: `n` mappings.
fn scattered(first: u64, n: u64) -> Vec<u64> {
    (0..n).map(|i| RAM_BASE + (first + 2 * i) * PAGE).collect()
}

/// `n` pages in a row: one mapping.
fn contiguous(first: u64, n: u64) -> Vec<u64> {
    (0..n).map(|i| RAM_BASE + (first + i) * PAGE).collect()
}

/// REG_MR of whole `pages`: the MR handle, or the status.
fn register(guest: &TestGuest, pd: u32, pages: &[u64]) -> Result<u32, Status> {
    match reg_mr(guest, pd, 0x10_0000, pages.len() as u64 * PAGE, pages) {
        ControlResponse::Ok(ResponseBody::RegMr(r)) => Ok(r.mr.get()),
        ControlResponse::Ok(other) => panic!("{other:?}"),
        ControlResponse::Err(e) => Err(e.status()),
    }
}

fn dereg(guest: &TestGuest, mr: u32) {
    assert_eq!(
        guest.status(ControlRequest::DeregMr(handle(mr))),
        Status::Ok
    );
}

/// REREG_MR of `mr` to whole `pages`.
fn rereg(guest: &TestGuest, mr: u32, pages: &[u64]) -> Status {
    let mut req = ReregMrReq::new_zeroed();
    req.mr = Le32::new(mr);
    req.flags = Le32::new(rereg_flags::CHANGE_TRANSLATION);
    req.iova = Le64::new(0x20_0000);
    req.length = Le64::new(pages.len() as u64 * PAGE);
    req.page_shift = Le32::new(12);
    req.npages = Le32::new(pages.len() as u32);
    let mut list = Vec::new();
    encode_page_list(pages.iter().copied(), &mut list);
    guest.status(ControlRequest::ReregMr(ReregMr::new(req, &list)))
}

fn usage(guest: &TestGuest) -> MemoryUsage {
    guest.dev().memory_usage()
}

fn daemon(factory: &GuestDeviceFactory) -> (u64, u64) {
    let budget = factory.budget();
    (budget.mappings(), budget.pinned_bytes() / PAGE)
}

#[test]
fn scattered_pages_over_the_per_mr_limit_are_invalid() {
    let (fake, factory) = factory(options(8, 1024), 1024, 1024);
    let guest = TestGuest::from_factory(&factory, VRDMA_F_RING_RXE_V1);
    let pd = guest.alloc_pd();
    // Nine scattered pages need nine mappings: refused, nothing mapped or charged.
    assert_eq!(register(&guest, pd, &scattered(0, 9)), Err(Status::Invalid));
    assert_eq!(usage(&guest), MemoryUsage::default());
    assert_eq!(fake.world().mrs.len(), 0);
    // Eight fit; so do 64 contiguous pages, which are registered over the daemon's mapping
    // of guest RAM and map nothing of their own.
    let mr = register(&guest, pd, &scattered(0, 8)).unwrap();
    assert_eq!(usage(&guest).mappings, 8);
    register(&guest, pd, &contiguous(100, 64)).unwrap();
    assert_eq!(usage(&guest).mappings, 8);
    // REREG_MR to a page list over the limit: refused, the MR stays as it was.
    assert_eq!(rereg(&guest, mr, &scattered(0, 9)), Status::Invalid);
    assert_eq!(usage(&guest).mappings, 8);
    assert_eq!(fake.world().mrs.len(), 2);
}

#[test]
fn a_guest_at_its_mapping_quota_leaves_others_registering() {
    let (_fake, factory) = factory(options(64, 20), 1024, 1024);
    let greedy = TestGuest::from_factory(&factory, VRDMA_F_RING_RXE_V1);
    let other = TestGuest::from_factory(&factory, VRDMA_F_RING_RXE_V1);
    let (pd, other_pd) = (greedy.alloc_pd(), other.alloc_pd());
    register(&greedy, pd, &scattered(0, 16)).unwrap();
    assert_eq!(register(&greedy, pd, &scattered(0, 8)), Err(Status::Quota));
    // Four more still fit the guest's 20.
    register(&greedy, pd, &scattered(0, 4)).unwrap();
    assert_eq!(register(&greedy, pd, &scattered(0, 2)), Err(Status::Quota));
    // A contiguous MR needs no mapping of its own: still registered.
    register(&greedy, pd, &contiguous(50, 8)).unwrap();
    assert_eq!(usage(&greedy).mappings, 20);
    // The other guest is not affected.
    register(&other, other_pd, &scattered(0, 16)).unwrap();
    assert_eq!(daemon(&factory).0, 36);
}

#[test]
fn the_daemon_budget_is_shared_and_released_on_dereg() {
    let (_fake, factory) = factory(options(64, 20), 30, 1024);
    let first = TestGuest::from_factory(&factory, VRDMA_F_RING_RXE_V1);
    let second = TestGuest::from_factory(&factory, VRDMA_F_RING_RXE_V1);
    let (pd1, pd2) = (first.alloc_pd(), second.alloc_pd());
    let mr = register(&first, pd1, &scattered(0, 16)).unwrap();
    // Within its own quota of 20, but 16 + 16 is over the daemon's 30.
    assert_eq!(
        register(&second, pd2, &scattered(0, 16)),
        Err(Status::Quota)
    );
    assert_eq!(usage(&second), MemoryUsage::default());
    assert_eq!(daemon(&factory).0, 16);
    dereg(&first, mr);
    assert_eq!(daemon(&factory), (0, 0));
    register(&second, pd2, &scattered(0, 16)).unwrap();
    assert_eq!(daemon(&factory).0, 16);
}

#[test]
fn overlapping_mrs_pin_their_pages_once() {
    let (_fake, factory) = factory(options(64, 1024), 1024, 8);
    let first = TestGuest::from_factory(&factory, VRDMA_F_RING_RXE_V1);
    let second = TestGuest::from_factory(&factory, VRDMA_F_RING_RXE_V1);
    let (pd1, pd2) = (first.alloc_pd(), second.alloc_pd());
    let a = register(&first, pd1, &contiguous(0, 6)).unwrap();
    // The same six pages again, and pages 4..8: 8 distinct pages pinned, 18 registered.
    let b = register(&first, pd1, &contiguous(0, 6)).unwrap();
    let c = register(&first, pd1, &contiguous(4, 4)).unwrap();
    let used = usage(&first);
    assert_eq!((used.pinned_bytes, used.mr_bytes), (8 * PAGE, 16 * PAGE));
    // The daemon's 8 pages are taken: the other guest cannot pin even one.
    assert_eq!(
        register(&second, pd2, &contiguous(0, 1)),
        Err(Status::Quota)
    );
    assert_eq!(daemon(&factory).1, 8);
    // Deregistering one copy unpins nothing; the other frees pages 0..4.
    dereg(&first, a);
    assert_eq!(daemon(&factory).1, 8);
    dereg(&first, b);
    assert_eq!(daemon(&factory).1, 4);
    register(&second, pd2, &contiguous(0, 4)).unwrap();
    dereg(&first, c);
    assert_eq!(usage(&first), MemoryUsage::default());
    assert_eq!(daemon(&factory), (0, 4));
}

#[test]
fn repeated_pages_need_a_place_each_but_pin_once() {
    let (_fake, factory) = factory(options(4, 1024), 1024, 1024);
    let guest = TestGuest::from_factory(&factory, VRDMA_F_RING_RXE_V1);
    let pd = guest.alloc_pd();
    // One page five times is five places in the window: over the per-MR limit of 4.
    assert_eq!(register(&guest, pd, &[RAM_BASE; 5]), Err(Status::Invalid));
    let mr = register(&guest, pd, &[RAM_BASE; 4]).unwrap();
    assert_eq!(
        (usage(&guest).mappings, usage(&guest).pinned_bytes),
        (4, PAGE)
    );
    // A buffer listed twice in a row (a mirrored ring) is two runs, pinned once.
    let ring: Vec<u64> = contiguous(10, 32).into_iter().cycle().take(64).collect();
    register(&guest, pd, &ring).unwrap();
    assert_eq!(
        (usage(&guest).mappings, usage(&guest).pinned_bytes),
        (6, 33 * PAGE)
    );
    // Pages repeated across MRs pin no new bytes (and one contiguous run maps nothing).
    register(&guest, pd, &contiguous(10, 32)).unwrap();
    assert_eq!(
        (usage(&guest).mappings, usage(&guest).pinned_bytes),
        (6, 33 * PAGE)
    );
    dereg(&guest, mr);
    assert_eq!(usage(&guest).pinned_bytes, 32 * PAGE);
}

#[test]
fn rereg_moves_the_charge_and_a_failed_one_changes_nothing() {
    let (fake, factory) = factory(options(64, 20), 1024, 64);
    let guest = TestGuest::from_factory(&factory, VRDMA_F_RING_RXE_V1);
    let pd = guest.alloc_pd();
    let mr = register(&guest, pd, &scattered(0, 12)).unwrap();
    assert_eq!(usage(&guest).mappings, 12);
    // The new window is mapped while the old one is still registered: 12 + 12 > 20.
    assert_eq!(rereg(&guest, mr, &scattered(0, 12)), Status::Quota);
    assert_eq!(usage(&guest).mappings, 12);
    // A host failure gives back what the new window took.
    let before = usage(&guest);
    fake.world().fail_next = Some("REG_MR");
    assert_eq!(rereg(&guest, mr, &contiguous(40, 8)), Status::DeviceError);
    assert_eq!(usage(&guest), before);
    fake.world().fail_next = Some("DEREG_MR");
    assert_eq!(rereg(&guest, mr, &contiguous(40, 8)), Status::DeviceError);
    assert_eq!(usage(&guest), before);
    assert_eq!(daemon(&factory), (12, 12));
    // Success: the old window's charge goes, the new one's stays.
    assert_eq!(rereg(&guest, mr, &contiguous(40, 8)), Status::Ok);
    let used = usage(&guest);
    assert_eq!((used.mappings, used.pinned_bytes), (0, 8 * PAGE));
    assert_eq!(daemon(&factory), (0, 8));
    // Over the daemon's pinned budget (64 pages): refused, unchanged.
    assert_eq!(rereg(&guest, mr, &contiguous(100, 60)), Status::Quota);
    assert_eq!(daemon(&factory), (0, 8));
}

#[test]
fn a_failed_registration_gives_everything_back() {
    let (fake, factory) = factory(options(64, 1024), 1024, 1024);
    let guest = TestGuest::from_factory(&factory, VRDMA_F_RING_RXE_V1);
    let pd = guest.alloc_pd();
    fake.world().fail_next = Some("REG_MR");
    assert_eq!(
        register(&guest, pd, &scattered(0, 5)),
        Err(Status::DeviceError)
    );
    assert_eq!(usage(&guest), MemoryUsage::default());
    assert_eq!(daemon(&factory), (0, 0));
}

#[test]
fn discard_revocation_and_disconnect_release_everything() {
    let (_fake, factory) = factory(options(64, 1024), 1024, 1024);
    let guest = TestGuest::from_factory(&factory, VRDMA_F_RING_RXE_V1);
    let pd = guest.alloc_pd();
    register(&guest, pd, &scattered(0, 5)).unwrap();
    register(&guest, pd, &contiguous(0, 3)).unwrap();
    assert_eq!(daemon(&factory), (5, 6));
    assert_eq!(guest.status(ControlRequest::DiscardState), Status::Ok);
    assert_eq!(usage(&guest), MemoryUsage::default());
    assert_eq!(daemon(&factory), (0, 0));

    // A memory change that revokes the MRs releases them at once, windowed or over guest
    // RAM's mapping.
    let pd = guest.alloc_pd();
    register(&guest, pd, &scattered(0, 5)).unwrap();
    register(&guest, pd, &contiguous(64, 4)).unwrap();
    assert_eq!(daemon(&factory), (5, 9));
    let other = memfd(RAM_SIZE);
    guest.memory.lock().unwrap().replace(guest_memory(&other));
    guest.dev().memory_changed(guest.guest_io());
    assert_eq!(usage(&guest), MemoryUsage::default());
    assert_eq!(daemon(&factory), (0, 0));
    guest
        .memory
        .lock()
        .unwrap()
        .replace(guest_memory(&guest.ram));

    // A guest that goes away gives back what its MRs held.
    register(&guest, pd, &scattered(0, 5)).unwrap();
    let second = TestGuest::from_factory(&factory, VRDMA_F_RING_RXE_V1);
    let pd2 = second.alloc_pd();
    register(&second, pd2, &contiguous(0, 4)).unwrap();
    assert_eq!(daemon(&factory), (5, 9));
    drop(guest);
    assert_eq!(daemon(&factory), (0, 4));
    second.dev().reset_requested();
    second.dev().reset();
    assert_eq!(daemon(&factory), (0, 0));
}

#[test]
fn a_host_mr_whose_deregistration_failed_stays_mapped_until_a_later_discard() {
    let (fake, factory) = factory(options(64, 1024), 1024, 1024);
    let guest = TestGuest::from_factory(&factory, VRDMA_F_RING_RXE_V1);
    let pd = guest.alloc_pd();
    register(&guest, pd, &scattered(0, 3)).unwrap();
    // The host refuses the deregistration during the discard: its MR still pins the pages and
    // accepts its rkey, so its window stays mapped and charged (forgetting it would leave the
    // host MR reaching memory the device no longer accounts for).
    fake.world().fail_next = Some("DEREG_MR");
    assert_eq!(guest.status(ControlRequest::DiscardState), Status::Ok);
    assert_eq!(fake.world().mrs.len(), 1, "the host MR is still registered");
    assert_eq!(daemon(&factory), (3, 3), "its window stays charged");
    // The next discard (a reset, a new driver's DISCARD_STATE) deregisters it.
    assert_eq!(guest.status(ControlRequest::DiscardState), Status::Ok);
    assert!(fake.world().mrs.is_empty());
    assert_eq!(daemon(&factory), (0, 0));
    assert_eq!(usage(&guest), MemoryUsage::default());

    // Failing again, it waits for the disconnect, which closes the host context.
    let pd = guest.alloc_pd();
    register(&guest, pd, &scattered(0, 2)).unwrap();
    fake.world().fail_next = Some("DEREG_MR");
    assert_eq!(guest.status(ControlRequest::DiscardState), Status::Ok);
    assert_eq!(daemon(&factory), (2, 2));
    drop(guest);
    assert_eq!(daemon(&factory), (0, 0));
}

#[test]
fn staged_queues_are_charged_to_the_guest_quota_and_the_daemon_budget() {
    // Every staged queue (a CQ's, a QP's send and receive queues) is a mapping of its host
    // buffer in the daemon: five mappings of budget hold a CQ and two QPs, and the third QP
    // is refused with QUOTA, leaving nothing behind on the host.
    let staged = DeviceOptions {
        staged_rings: StagedRings::Always,
        staged_cqs: StagedRings::Always,
        ..options(64, 1024)
    };
    let (fake, factory) = factory(staged, 5, 1024);
    let guest = TestGuest::from_factory(&factory, ALL_FEATURES);
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(16).cq.get();
    assert_eq!(guest.set_doorbell_area(RAM_BASE + 512 * PAGE), Status::Ok);
    assert_eq!(daemon(&factory).0, 1);
    let first = guest.create_qp(qp_req(pd, cq, 0)).unwrap().qp.get();
    guest.create_qp(qp_req(pd, cq, 0)).unwrap();
    assert_eq!((daemon(&factory).0, usage(&guest).mappings), (5, 5));
    let host_qps = fake.world().qps.len();
    assert_eq!(guest.create_qp(qp_req(pd, cq, 0)), Err(Status::Quota));
    assert_eq!(
        fake.world().qps.len(),
        host_qps,
        "the refused QP's host QP is gone"
    );
    assert_eq!(daemon(&factory).0, 5);
    // A second guest is refused by the same budget; an MR over one run needs no mapping.
    let second = TestGuest::from_factory(&factory, ALL_FEATURES);
    assert_eq!(
        second.status(ControlRequest::CreateCq(CreateCqReq {
            cqe: Le32::new(16),
            reserved: Le32::ZERO,
        })),
        Status::Quota
    );
    // A destroyed QP gives its two back.
    assert_eq!(
        guest.status(ControlRequest::DestroyQp(handle(first))),
        Status::Ok
    );
    assert_eq!(daemon(&factory).0, 3);
    guest.create_qp(qp_req(pd, cq, 0)).unwrap();
    // A discard gives back everything.
    assert_eq!(guest.status(ControlRequest::DiscardState), Status::Ok);
    assert_eq!((daemon(&factory).0, usage(&guest).mappings), (0, 0));
}

#[test]
fn the_same_pages_registered_again_are_charged_as_the_kernel_locks_them() {
    // Without CAP_IPC_LOCK the kernel charges every MR its pages against RLIMIT_MEMLOCK:
    // a guest registering the same pages again and again must run out of the daemon's locked
    // budget (QUOTA) before the kernel refuses another guest's registration.
    let (_fake, factory) = factory_with_limits(
        options(64, 1024),
        HostBudgetLimits {
            mappings: 1024,
            pinned_bytes: 1024 * PAGE,
            locked_bytes: 12 * PAGE,
        },
    );
    let guest = TestGuest::from_factory(&factory, VRDMA_F_RING_RXE_V1);
    let pd = guest.alloc_pd();
    let four = contiguous(0, 4);
    let mrs: Vec<u32> = (0..3)
        .map(|_| register(&guest, pd, &four).unwrap())
        .collect();
    assert_eq!(daemon(&factory).1, 4, "pinned once");
    assert_eq!(factory.budget().locked_bytes(), 12 * PAGE, "locked thrice");
    assert_eq!(register(&guest, pd, &four), Err(Status::Quota));
    let other = TestGuest::from_factory(&factory, VRDMA_F_RING_RXE_V1);
    let other_pd = other.alloc_pd();
    assert_eq!(
        register(&other, other_pd, &contiguous(8, 1)),
        Err(Status::Quota)
    );
    dereg(&guest, mrs[0]);
    register(&other, other_pd, &contiguous(8, 1)).unwrap();
    assert_eq!(factory.budget().locked_bytes(), 9 * PAGE);
    drop(guest);
    drop(other);
    assert_eq!(factory.budget().locked_bytes(), 0);
}

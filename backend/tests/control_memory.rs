//! PDs and MRs of the per-guest device: registration, validation, references, and MRs revoked by
//! memory-table changes.
//!
//! The real per-guest device (`GuestDevice`) driven through the `DeviceHandler` API on a host
//! without RDMA, over the fake host device and fake frontend of `vrdma_test_support::fake_host`.

use std::fs::File;

use vm_memory::{Bytes, GuestAddress, GuestAddressSpace};
use vrdma_backend::vhost_device::handler::DeviceHandler;
use vrdma_spec::control::encode_page_list;
use vrdma_spec::features::*;
use vrdma_spec::verbs::AccessFlags;
use vrdma_spec::{ControlRequest, ControlResponse, Le32, RegMr, ResponseBody, Status};
use vrdma_test_support::fake_host::device::*;
use vrdma_test_support::fake_host::harness::*;

#[test]
fn pd_and_mr_lifecycle_with_references() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), VRDMA_F_RING_RXE_V1);
    let pd = guest.alloc_pd();
    // Two pages, the MR starting 0x10 bytes into the first, pages out of order.
    let pages = [RAM_BASE + 5 * PAGE, RAM_BASE + 2 * PAGE];
    let ControlResponse::Ok(ResponseBody::RegMr(mr)) =
        reg_mr(&guest, pd, 0x7000_0010, PAGE + 8, &pages)
    else {
        panic!("REG_MR failed")
    };
    {
        let w = fake.world();
        let init = w.mrs.values().next().unwrap();
        assert_eq!((init.iova, init.length), (0x7000_0010, PAGE + 8));
        // The window maps the guest's pages: what the guest wrote is at `start`.
        drop(w);
    }
    guest
        .memory
        .memory()
        .write_obj(0xfeed_f00d_u32, GuestAddress(RAM_BASE + 5 * PAGE + 0x10))
        .unwrap();
    guest
        .memory
        .memory()
        .write_obj(0xabad_cafe_u32, GuestAddress(RAM_BASE + 2 * PAGE))
        .unwrap();
    let start = fake.world().mrs.values().next().unwrap().start;
    let read = |at: u64| {
        let mut word = [0u8; 4];
        let file = File::open("/proc/self/mem").unwrap();
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut word, at).unwrap();
        u32::from_ne_bytes(word)
    };
    assert_eq!(read(start), 0xfeed_f00d);
    assert_eq!(read(start + PAGE - 0x10), 0xabad_cafe);

    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::Busy
    );
    assert_eq!(
        guest.status(ControlRequest::DeregMr(handle(mr.mr.get()))),
        Status::Ok
    );
    assert_eq!(
        guest.status(ControlRequest::DeregMr(handle(mr.mr.get()))),
        Status::BadHandle
    );
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::Ok
    );
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::BadHandle
    );
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(0))),
        Status::BadHandle
    );
    assert_eq!(fake.world().live(), 0);
}

/// With a host whose on-demand paging serves any iova, VRDMA_F_ODP is offered, the
/// configuration space carries the host's capabilities, and an ON_DEMAND registration reaches
/// the host as one; otherwise nothing is offered and the same registration is refused before
/// the host.
#[test]
fn on_demand_registrations_follow_the_hosts_odp() {
    let odp_access = AccessFlags::LOCAL_WRITE | AccessFlags::ON_DEMAND;
    let register = |guest: &TestGuest, pd: u32| {
        let pages = [RAM_BASE + 3 * PAGE];
        let mut list = Vec::new();
        encode_page_list(pages.iter().copied(), &mut list);
        let req = reg_mr_req(pd, 0x9000, PAGE, odp_access.bits(), 1);
        guest.run(ControlRequest::RegMr(RegMr::new(req, &list)))
    };

    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), VRDMA_F_RING_RXE_V1 | VRDMA_F_ODP);
    assert_ne!(guest.dev().device_features() & VRDMA_F_ODP, 0);
    assert_eq!(guest.config().odp_caps(), RXE_ODP_CAPS);
    let pd = guest.alloc_pd();
    assert!(matches!(
        register(&guest, pd),
        ControlResponse::Ok(ResponseBody::RegMr(_))
    ));
    assert_eq!(fake.world().mrs.values().next().unwrap().access, odp_access);

    // Offered but not accepted by the driver: refused, nothing registered.
    let guest = TestGuest::new(&fake, test_options(), VRDMA_F_RING_RXE_V1);
    let pd = guest.alloc_pd();
    let before = fake.world().mrs.len();
    assert!(matches!(
        register(&guest, pd),
        ControlResponse::Err(e) if e.status() == Status::Unsupported
    ));
    assert_eq!(fake.world().mrs.len(), before);

    // A host without ODP, or whose ODP serves only MRs at their own address (rxe's): not
    // offered, no capabilities described.
    for at_address_only in [false, true] {
        let fake = FakeDevice::new();
        fake.world().no_odp = !at_address_only;
        fake.world().odp_at_address_only = at_address_only;
        let guest = TestGuest::new(&fake, test_options(), VRDMA_F_RING_RXE_V1 | VRDMA_F_ODP);
        assert_eq!(guest.dev().device_features() & VRDMA_F_ODP, 0);
        assert_eq!(guest.config().odp_caps(), Default::default());
    }
}

#[test]
fn reg_mr_validation() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), VRDMA_F_RING_RXE_V1);
    let pd = guest.alloc_pd();
    let status = |r: ControlResponse| match r {
        ControlResponse::Ok(_) => Status::Ok,
        ControlResponse::Err(e) => e.status(),
    };
    // Outside RAM, crossing its end, absurd addresses.
    assert_eq!(
        status(reg_mr(&guest, pd, 0, PAGE, &[0])),
        Status::BadAddress
    );
    let last = RAM_BASE + RAM_SIZE - PAGE;
    assert_eq!(
        status(reg_mr(&guest, pd, 0, 2 * PAGE, &[last, last + PAGE])),
        Status::BadAddress
    );
    let top = u64::MAX - PAGE + 1;
    assert_eq!(status(reg_mr(&guest, pd, 0, PAGE, &[top])), Status::Invalid);
    // Unaligned page, wrong page count, bad access, bad page shift.
    assert_eq!(
        status(reg_mr(&guest, pd, 0, PAGE, &[RAM_BASE + 8])),
        Status::Invalid
    );
    assert_eq!(
        status(reg_mr(&guest, pd, 0, PAGE, &[RAM_BASE, RAM_BASE])),
        Status::Invalid
    );
    let mut list = Vec::new();
    encode_page_list([RAM_BASE], &mut list);
    let bad_access = reg_mr_req(pd, 0, PAGE, AccessFlags::REMOTE_WRITE.bits(), 1);
    assert_eq!(
        guest.status(ControlRequest::RegMr(RegMr::new(bad_access, &list))),
        Status::Invalid
    );
    let mut bad_shift = reg_mr_req(pd, 0, PAGE, AccessFlags::LOCAL_WRITE.bits(), 1);
    bad_shift.page_shift = Le32::new(31);
    assert_eq!(
        guest.status(ControlRequest::RegMr(RegMr::new(bad_shift, &list))),
        Status::Invalid
    );
    // More pages than max_mr_pages.
    let many: Vec<u64> = (0..65).map(|i| RAM_BASE + i * PAGE).collect();
    assert_eq!(
        status(reg_mr(&guest, pd, 0, 65 * PAGE, &many)),
        Status::Invalid
    );
    // Foreign PD.
    assert_eq!(
        status(reg_mr(&guest, pd + 1, 0, PAGE, &[RAM_BASE])),
        Status::BadHandle
    );
    // Byte quota: 64 pages in all.
    let big: Vec<u64> = (0..40).map(|i| RAM_BASE + i * PAGE).collect();
    assert_eq!(status(reg_mr(&guest, pd, 0, 40 * PAGE, &big)), Status::Ok);
    assert_eq!(
        status(reg_mr(&guest, pd, 0, 40 * PAGE, &big)),
        Status::Quota
    );
    // Count quota: 4 MRs.
    for _ in 0..3 {
        assert_eq!(status(reg_mr(&guest, pd, 0, PAGE, &[RAM_BASE])), Status::Ok);
    }
    assert_eq!(
        status(reg_mr(&guest, pd, 0, PAGE, &[RAM_BASE])),
        Status::Quota
    );
    // A host failure is DEVICE_ERROR with the errno, and leaves nothing behind.
    let live = fake.world().live();
    fake.world().fail_next = Some("ALLOC_PD");
    match guest.run(ControlRequest::AllocPd) {
        ControlResponse::Err(e) => {
            assert_eq!(
                (e.status(), e.detail()),
                (Status::DeviceError, libc::EINVAL as u32)
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(fake.world().live(), live);
    assert_eq!(guest.dev().object_counts().mrs, 4);
}

#[test]
fn memory_changes_revoke_unbacked_mrs() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), ALL_FEATURES);
    let pd = guest.alloc_pd();
    let ControlResponse::Ok(ResponseBody::RegMr(mr)) =
        reg_mr(&guest, pd, 0x1000, PAGE, &[RAM_BASE + 3 * PAGE])
    else {
        panic!()
    };
    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);

    // The same table again (QEMU re-sends it on unrelated changes): nothing happens.
    guest
        .memory
        .lock()
        .unwrap()
        .replace(guest_memory(&guest.ram));
    guest.dev().memory_changed(guest.guest_io());
    assert_eq!(fake.world().mrs.len(), 1);
    assert_eq!(guest.guest_io().events().len(), 0);

    // The region is replaced by other memory: the MR is revoked.
    let other = memfd(RAM_SIZE);
    guest.memory.lock().unwrap().replace(guest_memory(&other));
    guest.dev().memory_changed(guest.guest_io());
    assert_eq!(fake.world().mrs.len(), 0);
    assert_eq!(guest.guest_io().events().len(), 1, "MR_REVOKED");
    // The PD is free of it, the handle still deregisters once.
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::Ok
    );
    assert_eq!(
        guest.status(ControlRequest::DeregMr(handle(mr.mr.get()))),
        Status::Ok
    );
    assert_eq!(
        guest.status(ControlRequest::DeregMr(handle(mr.mr.get()))),
        Status::BadHandle
    );
    // The doorbell area was re-located in the new memory.
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(4).cq.get();
    assert!(guest.create_qp(qp_req(pd, cq, 0)).is_ok());
}

#[test]
fn a_memory_change_while_a_command_waits_for_the_frontend_does_not_wait_for_the_command() {
    // QEMU answers SHMEM_MAP in its main loop, which first finishes whatever it is doing: a
    // memory-table change it waits on the back-end to answer. The device must answer that
    // change while the command that sent the SHMEM_MAP holds the guest's state; the MR the
    // change unbacks is revoked once the command lets the state go.
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), ALL_FEATURES);
    let pd = guest.alloc_pd();
    let ControlResponse::Ok(ResponseBody::RegMr(_)) =
        reg_mr(&guest, pd, 0x1000, PAGE, &[RAM_BASE + 3 * PAGE])
    else {
        panic!()
    };
    let (map_asked, asked) = std::sync::mpsc::channel();
    let (answer, answer_now) = std::sync::mpsc::channel::<()>();
    guest.frontend.before_next_request(Box::new(move || {
        map_asked.send(()).unwrap();
        answer_now.recv().unwrap();
    }));
    let other = memfd(RAM_SIZE);
    std::thread::scope(|scope| {
        let command = scope.spawn(|| guest.create_cq(4));
        asked.recv().unwrap();
        // The command holds the state and waits for the map's answer, which waits for this.
        guest.memory.lock().unwrap().replace(guest_memory(&other));
        guest.dev().memory_changed(guest.guest_io());
        assert_eq!(
            fake.world().mrs.len(),
            1,
            "revoked only once the command is done"
        );
        answer.send(()).unwrap();
        command.join().unwrap();
    });
    assert_eq!(fake.world().mrs.len(), 0);
    assert_eq!(guest.guest_io().events().len(), 1, "MR_REVOKED");
}

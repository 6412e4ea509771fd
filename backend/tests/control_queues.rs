//! CQs, QPs, SRQs and AHs of the per-guest device: queue buffers mapped into the queue region and
//! described to the guest, doorbells, quotas, and failures that leave nothing behind.
//!
//! The real per-guest device (`GuestDevice`) driven through the `DeviceHandler` API on a host
//! without RDMA, over the fake host device and fake frontend of `vrdma_test_support::fake_host`.

use vm_memory::{Bytes, GuestAddress, GuestAddressSpace};
use vrdma_backend::guest::options::DeviceOptions;
use vrdma_backend::vhost_device::handler::DeviceHandler;
use vrdma_spec::doorbell::{area_bytes, HEAD_WORD, RING_WORD, TAIL_WORD};
use vrdma_spec::features::*;
use vrdma_spec::verbs::{AccessFlags, QpAttrMask, QpState, QpType};
use vrdma_spec::wire::{self, *};
use vrdma_spec::{ControlRequest, ControlResponse, Le16, Le32, Le64, ResponseBody, Status};
use vrdma_test_support::fake_host::device::*;
use vrdma_test_support::fake_host::harness::*;
use zerocopy::FromZeros;

#[test]
fn queues_are_mapped_described_and_unmapped() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), ALL_FEATURES);
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(100);
    assert_eq!(cq.cqe.get(), 127);
    cq.ring.check_rxe_v1(SHM_SIZE, PAGE).unwrap();
    assert_eq!(
        (cq.ring.num_slots.get(), cq.ring.log2_slot_size.get()),
        (128, 7)
    );
    assert_eq!(
        guest.frontend.mapped(),
        vec![(cq.ring.shm_offset.get(), u64::from(cq.ring.map_len.get()))]
    );
    let cqh = cq.cq.get();
    let too_deep = CreateCqReq {
        cqe: Le32::new((1 << 15) + 1),
        reserved: Le32::ZERO,
    };
    assert_eq!(
        guest.status(ControlRequest::CreateCq(too_deep)),
        Status::Invalid
    );

    // No QP before the doorbell area.
    assert_eq!(guest.create_qp(qp_req(pd, cqh, 0)), Err(Status::BadState));
    assert_eq!(guest.set_doorbell_area(0), Status::BadAddress);
    assert_eq!(
        guest.set_doorbell_area(RAM_BASE + RAM_SIZE),
        Status::BadAddress
    );
    assert_eq!(guest.set_doorbell_area(RAM_BASE + 8), Status::Invalid);
    let wrong_slots = SetDoorbellAreaReq {
        gpa: Le64::new(RAM_BASE),
        slots: Le32::new(8),
        reserved: Le32::ZERO,
    };
    assert_eq!(
        guest.status(ControlRequest::SetDoorbellArea(wrong_slots)),
        Status::Invalid
    );
    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);

    // Bad caps and handles.
    let mut deep = qp_req(pd, cqh, 0);
    deep.max_send_wr = Le32::new((1 << 14) + 1);
    assert_eq!(guest.create_qp(deep), Err(Status::Invalid));
    let mut sges = qp_req(pd, cqh, 0);
    sges.max_recv_sge = Le32::new(33);
    assert_eq!(guest.create_qp(sges), Err(Status::Invalid));
    assert_eq!(
        guest.create_qp(qp_req(pd, pd ^ 0x100, 0)),
        Err(Status::BadHandle)
    );
    assert_eq!(
        guest.create_qp(qp_req(cqh + 1, cqh, 0)),
        Err(Status::BadHandle)
    );

    let qp = guest.create_qp(qp_req(pd, cqh, 0)).unwrap();
    assert!(qp.doorbell_index.get() < 4);
    assert_eq!(qp.max_send_wr.get(), 31);
    qp.sq.check_rxe_v1(SHM_SIZE, PAGE).unwrap();
    qp.rq.check_rxe_v1(SHM_SIZE, PAGE).unwrap();
    // 2 SGEs or 64 inline bytes: 208 + 64 -> 512-byte slots.
    assert_eq!(qp.sq.log2_slot_size.get(), 9);
    assert_eq!(qp.rq.log2_slot_size.get(), 7);
    assert_eq!(guest.frontend.mapped().len(), 3);
    assert_eq!(guest.set_doorbell_area(RAM_BASE + PAGE), Status::Busy);

    // SRQ and a QP on it: no RQ.
    let srq_req = CreateSrqReq {
        pd: Le32::new(pd),
        max_wr: Le32::new(8),
        max_sge: Le32::new(1),
        srq_limit: Le32::new(15),
    };
    assert_eq!(
        guest.status(ControlRequest::CreateSrq(srq_req)),
        Status::Invalid
    );
    let srq_req = CreateSrqReq {
        srq_limit: Le32::new(2),
        ..srq_req
    };
    let ResponseBody::CreateSrq(srq) = guest.ok(ControlRequest::CreateSrq(srq_req)) else {
        panic!()
    };
    srq.ring.check_rxe_v1(SHM_SIZE, PAGE).unwrap();
    let srqh = srq.srq.get();
    let qp2 = guest.create_qp(qp_req(pd, cqh, srqh)).unwrap();
    assert_eq!(qp2.rq, RingDesc::new_zeroed());
    assert_ne!(qp2.doorbell_index.get(), qp.doorbell_index.get());
    let ResponseBody::QuerySrq(q) = guest.ok(ControlRequest::QuerySrq(handle(srqh))) else {
        panic!()
    };
    assert_eq!(
        (q.max_wr.get(), q.max_sge.get(), q.srq_limit.get()),
        (15, 1, 2)
    );
    let modify = |mask, limit| ModifySrqReq {
        srq: Le32::new(srqh),
        attr_mask: Le32::new(mask),
        max_wr: Le32::ZERO,
        srq_limit: Le32::new(limit),
    };
    assert_eq!(
        guest.status(ControlRequest::ModifySrq(modify(1, 0))),
        Status::Unsupported
    );
    assert_eq!(
        guest.status(ControlRequest::ModifySrq(modify(2, 15))),
        Status::Invalid
    );
    assert_eq!(
        guest.status(ControlRequest::ModifySrq(modify(2, 4))),
        Status::Ok
    );

    // Dependents keep their objects alive.
    assert_eq!(
        guest.status(ControlRequest::DestroyCq(handle(cqh))),
        Status::Busy
    );
    assert_eq!(
        guest.status(ControlRequest::DestroySrq(handle(srqh))),
        Status::Busy
    );
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::Busy
    );

    // State machine.
    let qph = qp.qp.get();
    let modify_qp = |mask: QpAttrMask, state: u32| {
        let mut attr = wire::QpAttr::new_zeroed();
        attr.qp_state = Le32::new(state);
        attr.port_num = 1;
        attr.qp_access_flags = Le32::new(AccessFlags::LOCAL_WRITE.bits());
        ControlRequest::ModifyQp(ModifyQpReq {
            qp: Le32::new(qph),
            attr_mask: Le32::new(mask.bits()),
            attr,
        })
    };
    let init_mask =
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    // The port's fixed attributes were read when the guest's context opened: transitions
    // check against them without a QUERY_PORT each.
    let port_queries = fake.world().port_queries;
    assert_eq!(
        guest.status(modify_qp(QpAttrMask::STATE, 3)),
        Status::BadState
    );
    assert_eq!(
        guest.status(modify_qp(QpAttrMask::STATE, 1)),
        Status::Invalid,
        "missing attrs"
    );
    assert_eq!(
        guest.status(modify_qp(init_mask | QpAttrMask::CAP, 1)),
        Status::Unsupported
    );
    assert_eq!(guest.status(modify_qp(init_mask, 1)), Status::Ok);
    assert_eq!(
        fake.world().modified.last().map(|m| m.2),
        Some(QpState::Init)
    );
    let mut bad_pkey = modify_qp(init_mask, 1);
    if let ControlRequest::ModifyQp(r) = &mut bad_pkey {
        r.attr.pkey_index = Le16::new(1);
    }
    assert_eq!(guest.status(bad_pkey), Status::Invalid);
    assert_eq!(fake.world().port_queries, port_queries);
    let ResponseBody::QueryQp(q) = guest.ok(ControlRequest::QueryQp(QueryQpReq {
        qp: Le32::new(qph),
        attr_mask: Le32::new(QpAttrMask::STATE.bits()),
    })) else {
        panic!()
    };
    assert_eq!((q.attr.qp_state.get(), q.attr.port_num), (1, 1));
    assert_ne!(q.attr_mask.get() & QpAttrMask::STATE.bits(), 0);

    // Arming.
    let arm = ArmCqReq {
        cq: Le32::new(cqh),
        flags: Le32::new(1),
    };
    assert_eq!(guest.status(ControlRequest::ArmCq(arm)), Status::Ok);
    assert_eq!(fake.world().armed.len(), 1);
    assert!(fake.world().armed[0].1);

    // Teardown in order; every extent is unmapped.
    for qp in [qph, qp2.qp.get()] {
        assert_eq!(
            guest.status(ControlRequest::DestroyQp(handle(qp))),
            Status::Ok
        );
    }
    assert_eq!(
        guest.status(ControlRequest::DestroySrq(handle(srqh))),
        Status::Ok
    );
    assert_eq!(
        guest.status(ControlRequest::DestroyCq(handle(cqh))),
        Status::Ok
    );
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::Ok
    );
    assert_eq!(guest.frontend.mapped(), vec![]);
    assert_eq!(fake.world().live(), 0);
    assert!(guest.dev().object_counts().is_empty());
}

#[test]
fn address_handles_need_ud_and_a_valid_vector() {
    let fake = FakeDevice::new();
    let ud = DeviceOptions {
        allow_ud: true,
        ..test_options()
    };
    let guest = TestGuest::new(&fake, ud, ALL_FEATURES);
    let pd = guest.alloc_pd();
    let ah = |sgid_index, is_global| {
        ControlRequest::CreateAh(CreateAhReq {
            pd: Le32::new(pd),
            reserved: Le32::ZERO,
            ah_attr: wire::AhAttr {
                is_global,
                ..roce_av(sgid_index, GID0)
            },
        })
    };
    assert_eq!(guest.status(ah(1, 1)), Status::Invalid, "empty GID entry");
    assert_eq!(guest.status(ah(0, 0)), Status::Invalid, "RoCE needs a GRH");
    let ResponseBody::CreateAh(resp) = guest.ok(ah(0, 1)) else {
        panic!()
    };
    assert_ne!(resp.ah_num.get(), 0);
    assert_eq!(
        (resp.av.port_num, resp.av.network_type, resp.av.dgid),
        (1, 2, GID0)
    );
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::Busy
    );
    assert_eq!(
        guest.status(ControlRequest::DestroyAh(handle(resp.ah.get()))),
        Status::Ok
    );
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::Ok
    );

    // Without UD negotiated.
    guest
        .dev()
        .features_acked(VIRTIO_F_VERSION_1 | VRDMA_F_RING_RXE_V1);
    let pd = guest.alloc_pd();
    let mut req = ah(0, 1);
    if let ControlRequest::CreateAh(r) = &mut req {
        r.pd = Le32::new(pd);
    }
    assert_eq!(guest.status(req), Status::Unsupported);
    let cq = guest.create_cq(4).cq.get();
    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);
    let mut ud_qp = qp_req(pd, cq, 0);
    ud_qp.qp_type = 4;
    assert_eq!(guest.create_qp(ud_qp), Err(Status::Unsupported));
    assert_eq!(
        guest.create_qp(qp_req(pd, cq, 1)),
        Err(Status::Unsupported),
        "SRQ"
    );
}

#[test]
fn doorbells_kick_exactly_the_rung_qps() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), VRDMA_F_RING_RXE_V1);
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(16).cq.get();
    let area = RAM_BASE + 8 * PAGE;
    assert_eq!(guest.set_doorbell_area(area), Status::Ok);
    let qps: Vec<CreateQpResp> = (0..3)
        .map(|_| guest.create_qp(qp_req(pd, cq, 0)).unwrap())
        .collect();
    let host_of = |qpn: u32| fake.world().qp_by_qpn(qpn).unwrap();
    let memory = guest.memory.memory();
    let slots = guest.dev().options().doorbell_slots();
    let word = |i: usize| GuestAddress(area + 4 * i as u64);
    let mut tail = 0u32;
    let mut ring = |index: u32| {
        memory
            .write_obj(1u32, word(RING_WORD + slots as usize + index as usize))
            .unwrap();
        memory
            .write_obj(index + 1, word(RING_WORD + (tail % slots) as usize))
            .unwrap();
        tail += 1;
        memory.write_obj(tail, word(TAIL_WORD)).unwrap();
    };
    let (a, c) = (&qps[0], &qps[2]);
    ring(c.doorbell_index.get());
    ring(a.doorbell_index.get());
    // An index of no QP and one beyond the area are dropped.
    ring(3);
    guest.dev().doorbell(guest.guest_io(), &[]);
    let kicks = fake.world().kicks.clone();
    assert_eq!(kicks, vec![host_of(c.qpn.get()), host_of(a.qpn.get())]);
    let head: u32 = memory.read_obj(word(HEAD_WORD)).unwrap();
    assert_eq!(head, 3);
    let pending: u32 = memory
        .read_obj(word(
            RING_WORD + slots as usize + a.doorbell_index.get() as usize,
        ))
        .unwrap();
    assert_eq!(pending, 0, "pending cleared");

    // A notification with nothing queued (and doorbellq bytes) kicks nothing.
    fake.world().kicks.clear();
    guest.dev().doorbell(guest.guest_io(), b"ignored");
    assert!(fake.world().kicks.is_empty());

    // A command kicks what was queued before it, notified or not (spec §5.3): the doorbell
    // worker may not have drained it yet, and the command must see the posts.
    ring(c.doorbell_index.get());
    assert_eq!(guest.status(ControlRequest::QueryDevice), Status::Ok);
    let expected = vec![host_of(c.qpn.get())];
    assert_eq!(fake.world().kicks, expected);
    guest.dev().doorbell(guest.guest_io(), &[]);
    assert_eq!(fake.world().kicks.len(), 1, "a drained doorbell kicks once");
    fake.world().kicks.clear();

    // A destroyed QP's doorbell kicks nothing.
    assert_eq!(
        guest.status(ControlRequest::DestroyQp(handle(a.qp.get()))),
        Status::Ok
    );
    ring(a.doorbell_index.get());
    guest.dev().doorbell(guest.guest_io(), &[]);
    assert!(fake.world().kicks.is_empty());

    // Garbage in the whole area costs one lap and kicks only live QPs.
    for i in 0..area_bytes(slots) / 4 {
        memory.write_obj(0xffff_ffffu32, word(i)).unwrap();
    }
    guest.dev().doorbell(guest.guest_io(), &[]);
    assert!(fake.world().kicks.is_empty());
}

#[test]
fn quotas_at_the_limit() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), ALL_FEATURES);
    let pds: Vec<u32> = (0..4).map(|_| guest.alloc_pd()).collect();
    assert_eq!(guest.status(ControlRequest::AllocPd), Status::Quota);
    let cqs: Vec<u32> = (0..4).map(|_| guest.create_cq(2).cq.get()).collect();
    let cq = CreateCqReq {
        cqe: Le32::new(2),
        reserved: Le32::ZERO,
    };
    assert_eq!(guest.status(ControlRequest::CreateCq(cq)), Status::Quota);
    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);
    for _ in 0..3 {
        guest.create_qp(qp_req(pds[0], cqs[0], 0)).unwrap();
    }
    assert_eq!(
        guest.create_qp(qp_req(pds[0], cqs[0], 0)),
        Err(Status::Quota)
    );
    let live = fake.world().live();
    assert_eq!(live, 4 + 4 + 3);
    // Freeing one makes room again.
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pds[3]))),
        Status::Ok
    );
    guest.alloc_pd();
}

#[test]
fn queue_region_exhaustion_and_map_failures_leave_nothing() {
    let fake = FakeDevice::new();
    let small = DeviceOptions {
        shm_size: 4 * PAGE,
        ..test_options()
    };
    let guest = TestGuest::new(&fake, small, VRDMA_F_RING_RXE_V1);
    // 1023 CQEs of 128 bytes: 33 pages, more than the region.
    let cq = CreateCqReq {
        cqe: Le32::new(1000),
        reserved: Le32::ZERO,
    };
    assert_eq!(guest.status(ControlRequest::CreateCq(cq)), Status::NoMemory);
    assert_eq!(fake.world().live(), 0, "host CQ destroyed again");

    guest.frontend.set_refusing(true);
    let cq = CreateCqReq {
        cqe: Le32::new(4),
        reserved: Le32::ZERO,
    };
    match guest.run(ControlRequest::CreateCq(cq)) {
        ControlResponse::Err(e) => assert_eq!(e.status(), Status::DeviceError),
        other => panic!("{other:?}"),
    }
    assert_eq!(fake.world().live(), 0);
    assert!(guest.dev().object_counts().is_empty());
    guest.frontend.set_refusing(false);
    let created = guest.create_cq(4);
    assert_eq!(
        created.ring.shm_offset.get(),
        0,
        "the failed extent was freed"
    );
}

/// A QP's send and receive queues are placed first and mapped together: when the receive
/// queue finds no room, or the front-end refuses the mappings, neither stays placed or mapped
/// and the host QP is destroyed again.
#[test]
fn a_qp_whose_queues_cannot_both_be_mapped_leaves_nothing() {
    let fake = FakeDevice::new();
    let small = DeviceOptions {
        shm_size: 8 * PAGE,
        ..test_options()
    };
    let guest = TestGuest::new(&fake, small, VRDMA_F_RING_RXE_V1);
    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(4);
    let cqh = cq.cq.get();
    let before = (fake.world().live(), guest.frontend.mapped());

    // The send queue fits in what is left; 256 receive slots of 128 bytes do not.
    let mut deep_rq = qp_req(pd, cqh, 0);
    deep_rq.max_recv_wr = Le32::new(255);
    assert_eq!(guest.create_qp(deep_rq), Err(Status::NoMemory));
    assert_eq!((fake.world().live(), guest.frontend.mapped()), before);

    guest.frontend.set_refusing(true);
    assert_eq!(
        guest.create_qp(qp_req(pd, cqh, 0)),
        Err(Status::DeviceError)
    );
    assert_eq!((fake.world().live(), guest.frontend.mapped()), before);
    guest.frontend.set_refusing(false);

    let qp = guest.create_qp(qp_req(pd, cqh, 0)).unwrap();
    let after_cq = cq.ring.shm_offset.get() + u64::from(cq.ring.map_len.get());
    assert_eq!(
        qp.sq.shm_offset.get(),
        after_cq,
        "the failed extents were freed"
    );
    assert_eq!(guest.frontend.mapped().len(), 3);
}

/// A CREATE_QP the host refuses gives back everything it took on the way: no host object
/// and no mapping stays, its PD and CQ keep no reference (they can be destroyed), and its
/// doorbell slot is free again (as many QPs as the quota allows, one slot each, fit after as
/// many refusals).
#[test]
fn a_qp_the_host_refuses_leaves_nothing_held() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), VRDMA_F_RING_RXE_V1);
    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);
    let pd = guest.alloc_pd();
    let cqh = guest.create_cq(4).cq.get();
    let before = (fake.world().live(), guest.frontend.mapped());
    let quota = guest.dev().options().quotas.qps;
    for _ in 0..quota {
        fake.world().fail_next = Some("CREATE_QP");
        assert_eq!(
            guest.create_qp(qp_req(pd, cqh, 0)),
            Err(Status::DeviceError)
        );
    }
    assert_eq!((fake.world().live(), guest.frontend.mapped()), before);
    let qps: Vec<u32> = (0..quota)
        .map(|_| guest.create_qp(qp_req(pd, cqh, 0)).unwrap().qp.get())
        .collect();
    for qp in qps {
        assert_eq!(
            guest.status(ControlRequest::DestroyQp(handle(qp))),
            Status::Ok
        );
    }
    assert_eq!(
        guest.status(ControlRequest::DestroyCq(handle(cqh))),
        Status::Ok
    );
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::Ok
    );
}

/// A front-end that counts every queue mapping as a memory slot (QEMU: it acknowledged
/// CONFIGURE_MEM_SLOTS, and aborts past 512 slots) gets at most
/// `SLOT_COUNTING_FRONTEND_MAPPINGS` queue buffers; the next create is QUOTA, nothing is left
/// behind, and one freed makes room again. Other front-ends (the process transport) are not
/// limited by it.
#[test]
fn queue_mappings_stay_below_a_slot_counting_frontends_limit() {
    use vhost::vhost_user::VhostUserProtocolFeatures as Protocol;
    use vrdma_backend::resources::quotas::Quotas;
    use vrdma_backend::vhost_device::shmem::SLOT_COUNTING_FRONTEND_MAPPINGS as LIMIT;

    let fake = FakeDevice::new();
    let options = DeviceOptions {
        shm_size: (2 * LIMIT as u64 * PAGE).next_power_of_two(),
        quotas: Quotas {
            cqs: 2 * LIMIT as u32,
            ..test_options().quotas
        },
        ..test_options()
    };
    // A driver without staged CQs (spec §9.8): each CQ is a mapping of its own.
    let features = ALL_FEATURES & !vrdma_spec::features::VRDMA_F_STAGED_CQS;
    let guest = TestGuest::new(&fake, options, features);
    guest
        .dev()
        .frontend_protocol_features((Protocol::CONFIGURE_MEM_SLOTS | Protocol::SHMEM).bits());
    let cqs: Vec<u32> = (0..LIMIT).map(|_| guest.create_cq(2).cq.get()).collect();
    let cq = CreateCqReq {
        cqe: Le32::new(2),
        reserved: Le32::ZERO,
    };
    assert_eq!(guest.status(ControlRequest::CreateCq(cq)), Status::Quota);
    assert_eq!(
        fake.world().live(),
        LIMIT,
        "the refused CQ was destroyed again"
    );
    assert_eq!(
        guest.status(ControlRequest::DestroyCq(handle(cqs[0]))),
        Status::Ok
    );
    guest.create_cq(2);
    // A front-end that does not count slots: no such limit.
    guest
        .dev()
        .frontend_protocol_features(Protocol::SHMEM.bits());
    guest.create_cq(2);
    assert_eq!(fake.world().live(), LIMIT + 1);
}

#[test]
fn a_directly_mapped_send_queue_names_its_host_kick_only_when_the_driver_takes_it() {
    for (features, kicks) in [
        (VRDMA_F_RING_RXE_V1, false),
        (VRDMA_F_RING_RXE_V1 | VRDMA_F_HOST_KICK, true),
    ] {
        let fake = FakeDevice::new();
        let guest = TestGuest::new(&fake, test_options(), features);
        assert_ne!(guest.dev().device_features() & VRDMA_F_HOST_KICK, 0);
        let pd = guest.alloc_pd();
        let cq = guest.create_cq(16).cq.get();
        assert_eq!(guest.set_doorbell_area(RAM_BASE + 8 * PAGE), Status::Ok);
        let qp = guest.create_qp(qp_req(pd, cq, 0)).unwrap();
        let host = fake.world().qp_by_qpn(qp.qpn.get()).unwrap();
        assert_eq!(qp.sq.host_kick_handle(), kicks.then_some(host));
        qp.sq.check_rxe_v1(SHM_SIZE, PAGE).unwrap();
        assert_eq!(
            qp.rq.host_kick_handle(),
            None,
            "only a send queue is kicked"
        );
        assert_eq!(qp.rq.flags.get(), 0);
    }
}

#[test]
fn a_staged_send_queue_never_names_a_host_kick() {
    let fake = FakeDevice::new();
    let features = ALL_FEATURES | VRDMA_F_HOST_KICK;
    let options = DeviceOptions {
        allow_ud: true,
        ..test_options()
    };
    let guest = TestGuest::new(&fake, options, features);
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(16).cq.get();
    assert_eq!(guest.set_doorbell_area(RAM_BASE + 8 * PAGE), Status::Ok);
    let ud = CreateQpReq {
        qp_type: QpType::Ud as u8,
        ..qp_req(pd, cq, 0)
    };
    let qp = guest.create_qp(ud).unwrap();
    assert_ne!(qp.sq.flags.get() & ring_flags::STAGED, 0);
    assert_eq!(
        qp.sq.host_kick_handle(),
        None,
        "the device copies and checks it"
    );
}

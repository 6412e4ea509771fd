//! Control verbs against the fake device: opening a device, queries, the order objects are
//! destroyed in, QP transitions and their masks, and device failures.

use vrdma::dma::PAGE_SIZE;
use vrdma::spec::config::ring_format;
use vrdma::spec::control::{ControlRequest, Opcode};
use vrdma::spec::verbs::QpState;
use vrdma::spec::{features, Le16, Le32, Status, StatusError};
use vrdma::verbs::{
    AccessFlags, Ah, AhAttr, ConnectOptions, Context, Cq, Gid, GidType, GlobalRoute, Mtu,
    ProtocolError, Qp, QpAttr, QpAttrMask, QpCaps, QpInitAttr, QpType, RemoteQp, VerbsError,
};
use vrdma_test_support::fake_transport::{
    default_config, doorbell_area_bytes, FakeTransport, Fault, DOORBELL_SLOTS, LOCAL_GID,
    MAX_INLINE, MAX_QP_INIT_RD_ATOM, MAX_QP_RD_ATOM, MAX_QP_WR, MAX_SGE,
};

use crate::helpers::*;

#[test]
fn open_reads_the_device_and_registers_a_zeroed_doorbell_area() {
    let (t, ctx) = open();
    assert_eq!(
        t.device().ops(),
        [Opcode::QueryDevice, Opcode::SetDoorbellArea]
    );
    let attr = ctx.query_device();
    assert_eq!(attr.fw_ver(), "fake 1.0");
    assert_eq!(attr.max_qp_wr.get(), MAX_QP_WR);
    assert_eq!(attr.max_inline_data.get(), MAX_INLINE);
    assert_eq!(attr.phys_port_cnt, 1);

    let raw = t.device().log[1].1.clone();
    let Ok(ControlRequest::SetDoorbellArea(r)) = ControlRequest::decode(&raw) else {
        panic!("not SET_DOORBELL_AREA");
    };
    assert_eq!(r.slots.get(), DOORBELL_SLOTS);
    let host = t
        .device()
        .ram_range(r.gpa.get(), doorbell_area_bytes())
        .unwrap();
    // SAFETY: the registered area lies in guest RAM (checked by `ram_range`).
    let area = unsafe { std::slice::from_raw_parts(host, doorbell_area_bytes()) };
    assert!(area.iter().all(|&b| b == 0));
}

#[test]
fn open_refuses_devices_it_cannot_drive() {
    let rxe = features::VRDMA_F_RING_RXE_V1;
    let mut bad_magic = default_config();
    bad_magic.magic = Le32::new(0x1234);
    let mut major_2 = default_config();
    major_2.version_major = Le16::new(2);
    let mut bad_slots = default_config();
    bad_slots.doorbell_slots = Le32::new(48);
    let mut bad_page = default_config();
    bad_page.shm_page_shift = Le32::new(40);
    let cases = [
        (bad_magic, rxe),
        (major_2, rxe),
        (bad_slots, rxe),
        (bad_page, rxe),
        // The configuration says rxe v1 but the format bit was not negotiated.
        (default_config(), 0),
    ];
    for (cfg, features) in cases {
        let t = FakeTransport::with(cfg, features);
        let err = Context::open(t.clone()).expect_err("open must fail");
        assert!(matches!(err, VerbsError::Protocol(_)), "{err}");
        assert!(t.device().is_empty());
    }

    // No ring format at all: control verbs work, queues are refused without a command.
    let mut none = default_config();
    none.ring_format = Le32::new(ring_format::NONE);
    let t = FakeTransport::with(none, 0);
    let ctx = Context::open(t.clone()).unwrap();
    let _pd = ctx.alloc_pd().unwrap();
    assert!(matches!(Cq::new(&ctx, 4), Err(VerbsError::Unsupported(_))));
    assert!(!t.device().ops().contains(&Opcode::CreateCq));
}

#[test]
fn queries_return_typed_attributes() {
    let (t, ctx) = open();
    let port = ctx.query_port(1).unwrap();
    assert!(port.is_active());
    assert_eq!(port.active_mtu(), Some(Mtu::Mtu1024));
    assert_eq!(port.link_layer, 2);
    assert_eq!(port.gid_tbl_len.get(), 2);

    let gid = ctx.query_gid(1, 0).unwrap().unwrap();
    assert_eq!(Gid(gid.gid), Gid(LOCAL_GID));
    assert_eq!(Gid(gid.gid).to_string(), "fe80::1");
    assert_eq!(gid.gid_type(), Ok(GidType::RoceV2));
    assert_eq!(ctx.query_gid(1, 1).unwrap(), None, "empty entry");
    // The whole table in one command: the populated entries only.
    t.device().log.clear();
    assert_eq!(ctx.query_gid_table(1).unwrap(), [(0, gid)]);
    assert_eq!(t.device().ops(), [Opcode::QueryGidTable]);
    assert_eq!(
        status_of(&ctx.query_gid_table(2).unwrap_err()),
        Some(Status::Invalid)
    );
    assert_eq!(ctx.query_pkey(1, 0).unwrap(), 0xffff);

    let err = ctx.query_port(2).unwrap_err();
    assert_eq!(status_of(&err), Some(Status::Invalid));
    assert!(err.to_string().contains("QUERY_PORT"), "{err}");
    assert_eq!(
        status_of(&ctx.query_gid(1, 7).unwrap_err()),
        Some(Status::Invalid)
    );
}

#[test]
fn objects_are_destroyed_in_dependency_order_whatever_the_drop_order() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let buf = ctx.alloc_buffer(3 * PAGE_SIZE + 100).unwrap();
    let mr = pd.register(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    let cq = Cq::new(&ctx, 8).unwrap();
    let qp = create_qp(&pd, &cq, QpType::Rc);
    let ah = Ah::new(
        &pd,
        &AhAttr::default()
            .with_grh(GlobalRoute {
                dgid: Gid(LOCAL_GID),
                ..GlobalRoute::default()
            })
            .with_port_num(1),
    )
    .unwrap();
    assert_eq!(
        mr.addr(),
        buf.as_ptr() as u64,
        "iova is the process address"
    );
    assert_eq!(mr.len(), buf.len());
    {
        let dev = t.device();
        let fake = dev.mrs.values().next().unwrap();
        assert_eq!(fake.iova, buf.as_ptr() as u64);
        assert_eq!(fake.pages.len(), 4);
        assert_eq!((fake.lkey, fake.rkey), (mr.lkey(), mr.rkey()));
    }
    t.device().log.clear();

    // The application drops the PD and the CQ first; the device must still see the QP go
    // before its CQ and everything go before the PD.
    drop(pd);
    drop(cq);
    assert!(t.device().log.is_empty(), "nothing destroyed while in use");
    drop(ah);
    drop(qp);
    assert_eq!(
        t.device().ops(),
        [Opcode::DestroyAh, Opcode::DestroyQp, Opcode::DestroyCq]
    );
    drop(mr);
    assert_eq!(t.device().ops()[3..], [Opcode::DeregMr, Opcode::DeallocPd]);
    assert!(t.device().is_empty(), "no leak on the device");
    drop(ctx);
}

#[test]
fn connect_sends_the_rc_transitions_with_their_masks_and_values() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let cq = Cq::new(&ctx, 8).unwrap();
    let qp = create_qp(&pd, &cq, QpType::Rc);
    let peer = RemoteQp {
        qpn: 0x1234,
        psn: 0xabcdef,
        gid: Gid([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]),
        lid: 0,
    };
    let opts = ConnectOptions {
        sgid_index: 1,
        path_mtu: Mtu::Mtu4096,
        sq_psn: 0x42,
        ..ConnectOptions::default()
    };
    qp.connect(&peer, &opts).unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Rts);

    let m = modify_requests(&t);
    assert_eq!(m.len(), 3);
    assert_eq!(
        m[0].attr_mask.get(),
        (QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS)
            .bits()
    );
    assert_eq!(m[0].attr.qp_state.get(), QpState::Init as u32);
    assert_eq!(m[0].attr.port_num, 1);
    assert_eq!(m[0].attr.qp_access_flags.get(), 0x7);

    assert_eq!(
        m[1].attr_mask.get(),
        (QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER)
            .bits()
    );
    let rtr = &m[1].attr;
    assert_eq!(rtr.qp_state.get(), QpState::Rtr as u32);
    assert_eq!(rtr.path_mtu.get(), 5);
    assert_eq!(rtr.dest_qp_num.get(), 0x1234);
    assert_eq!(rtr.rq_psn.get(), 0xabcdef);
    assert_eq!(
        rtr.max_dest_rd_atomic as u32, MAX_QP_RD_ATOM,
        "device limit < 16"
    );
    assert_eq!(rtr.min_rnr_timer, 12);
    assert_eq!(rtr.ah_attr.is_global, 1);
    assert_eq!(rtr.ah_attr.dgid, peer.gid.0);
    assert_eq!(rtr.ah_attr.sgid_index, 1);
    assert_eq!(rtr.ah_attr.hop_limit, 64);
    assert_eq!(rtr.ah_attr.port_num, 1);

    assert_eq!(
        m[2].attr_mask.get(),
        (QpAttrMask::STATE
            | QpAttrMask::SQ_PSN
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC)
            .bits()
    );
    let rts = &m[2].attr;
    assert_eq!(rts.qp_state.get(), QpState::Rts as u32);
    assert_eq!(rts.sq_psn.get(), 0x42);
    assert_eq!((rts.timeout, rts.retry_cnt, rts.rnr_retry), (14, 7, 7));
    assert_eq!(rts.max_rd_atomic as u32, MAX_QP_INIT_RD_ATOM);

    qp.to_error().unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Err);
    qp.reset().unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Reset);
    let (attr, valid) = qp.query(QpAttrMask::STATE | QpAttrMask::DEST_QPN).unwrap();
    assert!(valid.contains(QpAttrMask::DEST_QPN));
    assert_eq!(attr.dest_qp_num, 0x1234);
}

#[test]
fn illegal_transitions_and_masks_surface_the_device_status() {
    let (_t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let cq = Cq::new(&ctx, 8).unwrap();
    let qp = create_qp(&pd, &cq, QpType::Rc);
    let opts = ConnectOptions::default();
    let err = qp.to_rtr(&remote(&qp, 0), &opts).unwrap_err();
    assert_eq!(status_of(&err), Some(Status::BadState), "RESET -> RTR");
    assert!(err.to_string().starts_with("MODIFY_QP failed"), "{err}");

    // RESET -> INIT without the access flags RC requires.
    let attr = QpAttr::default()
        .with_qp_state(QpState::Init)
        .with_port_num(1);
    let err = qp
        .modify(
            &attr,
            QpAttrMask::STATE | QpAttrMask::PORT | QpAttrMask::PKEY_INDEX,
        )
        .unwrap_err();
    assert_eq!(status_of(&err), Some(Status::Invalid));
    assert!(matches!(
        qp.ud_to_rts(1, 1, 0),
        Err(VerbsError::InvalidArgument(_))
    ));
}

#[test]
fn device_failures_map_to_verbs_errors_and_leave_nothing_behind() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();

    t.inject(Fault::Fail(
        Opcode::CreateCq,
        StatusError::new(Status::Quota),
    ));
    let err = Cq::new(&ctx, 8).unwrap_err();
    assert!(matches!(
        &err,
        VerbsError::Status { opcode: Opcode::CreateCq, source } if source.status() == Status::Quota
    ));

    t.inject(Fault::Fail(Opcode::AllocPd, StatusError::device_error(12)));
    let err = ctx.alloc_pd().unwrap_err();
    assert!(err.to_string().contains("ALLOC_PD"), "{err}");
    assert!(err.to_string().contains("errno 12"), "{err}");

    t.inject(Fault::Truncate(Opcode::QueryPort));
    let err = ctx.query_port(1).unwrap_err();
    assert!(
        matches!(
            err,
            VerbsError::Protocol(ProtocolError::Response {
                opcode: Opcode::QueryPort,
                ..
            })
        ),
        "{err}"
    );

    // Bad ring descriptions: refused, and the half-created object is destroyed.
    t.device().log.clear();
    t.inject(Fault::RingOutsideRegion);
    let err = Cq::new(&ctx, 8).unwrap_err();
    assert!(
        matches!(err, VerbsError::Protocol(ProtocolError::Ring(_))),
        "{err}"
    );
    assert_eq!(t.device().ops(), [Opcode::CreateCq, Opcode::DestroyCq]);

    let cq = Cq::new(&ctx, 8).unwrap();
    t.device().log.clear();
    t.inject(Fault::RingHeaderMismatch);
    let init = init_attr(&cq, QpType::Rc);
    let err = Qp::new(&pd, &init).unwrap_err();
    assert!(
        matches!(err, VerbsError::Protocol(ProtocolError::Queue(_))),
        "{err}"
    );
    assert_eq!(t.device().ops(), [Opcode::CreateQp, Opcode::DestroyQp]);

    // Caps beyond the device's limits: the device says INVALID.
    let big = QpInitAttr {
        caps: QpCaps {
            max_send_sge: MAX_SGE + 1,
            ..rc_caps()
        },
        ..init
    };
    assert_eq!(
        status_of(&Qp::new(&pd, &big).unwrap_err()),
        Some(Status::Invalid)
    );
    // Registering memory that is not DMA memory fails before any command.
    let stack = [0u8; 64];
    // SAFETY: refused before registration; nothing keeps the address.
    let err = unsafe { pd.register_raw(stack.as_ptr(), stack.len(), AccessFlags::empty()) };
    assert!(matches!(err, Err(VerbsError::Transport(_))));
    assert!(matches!(
        Cq::new(&ctx, 0),
        Err(VerbsError::InvalidArgument(_))
    ));

    drop(cq);
    drop(pd);
    assert!(t.device().is_empty());
}

//! The data path against the fake device's loopback kernel: SEND, RDMA WRITE, RDMA READ and UD
//! sends, the doorbell, refused work requests, completion events and MR SGEs.

use std::time::Duration;

use vrdma::spec::control::ControlRequest;
use vrdma::spec::event::EventType;
use vrdma::spec::verbs::{self as sv, QpAttrMask};
use vrdma::verbs::{
    AccessFlags, Ah, AhAttr, Cq, DeviceEvent, Gid, GlobalRoute, Mr, PostError, PostSendError,
    QpType, RecvWr, SendFlags, SendWr, Sge, VerbsError, WcFlags, WcOpcode, WcStatus, WrOpcode,
};
use vrdma_test_support::fake_transport::{object_event, LOCAL_GID};
use zerocopy::IntoBytes;

use crate::helpers::*;

#[test]
fn send_write_and_read_round_trip_through_the_kernel() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (Cq::new(&ctx, 16).unwrap(), Cq::new(&ctx, 16).unwrap());
    let (a, b) = connected_pair(&pd, &cq_a, &cq_b);

    let message: Vec<u8> = (0..6000u32).map(|i| (i * 7) as u8).collect();
    let src = filled(&ctx, &message);
    let src_mr = pd.register(&src, AccessFlags::empty()).unwrap();
    let dst = ctx.alloc_buffer(8192).unwrap();
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let dst_mr = pd.register(&dst, rw).unwrap();

    // SEND with immediate data, split over two SGEs, into a posted receive at offset 100.
    let recv_sge = [dst_mr.sge(100, 7000).unwrap()];
    b.post_recv(&[RecvWr {
        wr_id: 77,
        sg_list: &recv_sge,
    }])
    .unwrap();
    let sges = [
        src_mr.sge(0, 2000).unwrap(),
        src_mr.sge(2000, 4000).unwrap(),
    ];
    post(
        &a,
        &[SendWr {
            wr_id: 1,
            opcode: WrOpcode::SendWithImm,
            flags: SendFlags::SIGNALED,
            sg_list: &sges,
            imm_data: 0xdead_beef_u32.to_be(),
            ..SendWr::default()
        }],
    )
    .unwrap();
    assert!(poll_all(&cq_a).is_empty(), "nothing before the kernel ran");
    t.run_kernel();
    let sent = poll_all(&cq_a);
    assert_eq!(sent.len(), 1);
    assert_eq!((sent[0].wr_id, sent[0].status), (1, WcStatus::Success));
    assert_eq!(sent[0].opcode, WcOpcode::Send);
    assert_eq!(sent[0].qp_num, a.qpn());
    let got = poll_all(&cq_b);
    assert_eq!(got.len(), 1);
    let wc = got[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (77, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!(wc.byte_len, 6000);
    assert_eq!((wc.qp_num, wc.src_qp), (b.qpn(), a.qpn()));
    assert!(wc.wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(u32::from_be(wc.imm_data), 0xdead_beef);
    assert_eq!(&dst.as_slice()[100..6100], &message[..]);

    // Inline RDMA WRITE (no MR needed locally) to the peer's region, then an RDMA READ back
    // into the source-side region.
    let inline = *b"written inline!";
    let inline_sge = [Sge {
        addr: inline.as_ptr() as u64,
        length: inline.len() as u32,
        lkey: 0,
    }];
    post(
        &a,
        &[SendWr {
            wr_id: 2,
            opcode: WrOpcode::RdmaWrite,
            flags: SendFlags::SIGNALED | SendFlags::INLINE,
            sg_list: &inline_sge,
            remote_addr: dst_mr.addr() + 8000,
            rkey: dst_mr.rkey(),
            ..SendWr::default()
        }],
    )
    .unwrap();
    let back = ctx.alloc_buffer(64).unwrap();
    let back_mr = pd.register(&back, AccessFlags::LOCAL_WRITE).unwrap();
    let back_sge = [back_mr.sge(0, inline.len()).unwrap()];
    post(
        &b,
        &[SendWr {
            wr_id: 3,
            opcode: WrOpcode::RdmaRead,
            flags: SendFlags::SIGNALED,
            sg_list: &back_sge,
            remote_addr: src_mr.addr() + 10,
            rkey: src_mr.rkey(),
            ..SendWr::default()
        }],
    )
    .unwrap();
    t.run_kernel();
    assert_eq!(&dst.as_slice()[8000..8000 + inline.len()], &inline);
    assert_eq!(poll_all(&cq_a)[0].opcode, WcOpcode::RdmaWrite);
    let read = poll_all(&cq_b);
    // The source region was registered without remote read: the peer is refused.
    assert_eq!(read[0].status, WcStatus::RemAccessErr);
    assert!(back.as_slice().iter().all(|&x| x == 0));

    // An unknown lkey is a local protection error, reported in the completion.
    let bad = [Sge {
        lkey: 0xbad,
        ..src_mr.sge(0, 8).unwrap()
    }];
    post(
        &a,
        &[SendWr {
            wr_id: 4,
            opcode: WrOpcode::RdmaWrite,
            sg_list: &bad,
            remote_addr: dst_mr.addr(),
            rkey: dst_mr.rkey(),
            ..SendWr::default()
        }],
    )
    .unwrap();
    t.run_kernel();
    let wc = poll_all(&cq_a);
    assert_eq!((wc[0].wr_id, wc[0].status), (4, WcStatus::LocProtErr));
}

#[test]
fn the_doorbell_notifies_only_when_the_qp_is_not_already_queued() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let cq = Cq::new(&ctx, 32).unwrap();
    let (a, b) = connected_pair(&pd, &cq, &cq);
    let dst = ctx.alloc_buffer(64).unwrap();
    let dst_mr = pd
        .register(&dst, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let byte = [0x5au8];
    let sge = [Sge {
        addr: byte.as_ptr() as u64,
        length: 1,
        lkey: 0,
    }];
    let write = |wr_id| SendWr {
        wr_id,
        opcode: WrOpcode::RdmaWrite,
        flags: SendFlags::SIGNALED | SendFlags::INLINE,
        sg_list: &sge,
        remote_addr: dst_mr.addr() + wr_id,
        rkey: dst_mr.rkey(),
        ..SendWr::default()
    };

    assert_eq!(t.notifications(), 0);
    post(&a, &[write(0), write(1)]).unwrap();
    assert_eq!(t.notifications(), 1, "one notification for a batch");
    post(&a, &[write(2)]).unwrap();
    assert_eq!(t.notifications(), 1, "still queued: no second notification");
    post(&b, &[]).unwrap();
    assert_eq!(t.notifications(), 1, "nothing posted: no ring");
    t.run_kernel();
    assert_eq!(
        poll_all(&cq).len(),
        3,
        "the queued QP was kicked once for all three"
    );
    assert_eq!(&dst.as_slice()[..3], &[0x5a; 3]);

    post(&a, &[write(3)]).unwrap();
    post(&b, &[write(4)]).unwrap();
    assert_eq!(t.notifications(), 3, "drained: each QP rings again");
    t.run_kernel();
    assert_eq!(poll_all(&cq).len(), 2);
}

#[test]
fn refused_requests_are_reported_after_ringing_for_the_posted_ones() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let cq = Cq::new(&ctx, 32).unwrap();
    let (a, _b) = connected_pair(&pd, &cq, &cq);
    let buf = ctx.alloc_buffer(64).unwrap();
    let mr = pd.register(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    let one = [mr.sge(0, 8).unwrap()];
    let three = [one[0]; 3];
    let wr = |sg_list| SendWr {
        opcode: WrOpcode::Send,
        sg_list,
        ..SendWr::default()
    };
    let err = post(&a, &[wr(&one), wr(&three), wr(&one)]).unwrap_err();
    assert!(matches!(
        err,
        PostSendError::Refused {
            index: 1,
            error: PostError::TooManySges { num: 3, max: 2 }
        }
    ));
    assert_eq!(err.posted(), 1);
    assert_eq!(t.notifications(), 1, "the posted request was rung");

    let err = post(&a, &[wr(&three)]).unwrap_err();
    assert_eq!(err.posted(), 0);
    assert_eq!(t.notifications(), 1);

    // Receives go straight to the RQ; a full queue is refused without the device.
    let caps = a.caps();
    let recv = [RecvWr {
        wr_id: 0,
        sg_list: &one,
    }];
    for _ in 0..caps.max_recv_wr {
        a.post_recv(&recv).unwrap();
    }
    assert_eq!(a.post_recv(&recv), Err((0, PostError::QueueFull)));
}

#[test]
fn completion_events_reach_the_waiter_of_their_cq() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (Cq::new(&ctx, 16).unwrap(), Cq::new(&ctx, 16).unwrap());
    let (a, b) = connected_pair(&pd, &cq_a, &cq_b);
    let buf = ctx.alloc_buffer(64).unwrap();
    let mr = pd.register(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    let sge = [mr.sge(0, 16).unwrap()];

    assert!(!cq_a.wait_event(Some(Duration::from_millis(20))).unwrap());
    cq_a.arm(false).unwrap();
    cq_b.arm(false).unwrap();
    b.post_recv(&[RecvWr {
        wr_id: 9,
        sg_list: &sge,
    }])
    .unwrap();
    post(
        &a,
        &[SendWr {
            wr_id: 8,
            opcode: WrOpcode::Send,
            flags: SendFlags::SIGNALED,
            sg_list: &sge,
            ..SendWr::default()
        }],
    )
    .unwrap();
    // An asynchronous event and an event of an unknown CQ arrive first.
    t.post_event(object_event(EventType::QpFatal, a.handle()));
    t.post_event(object_event(EventType::Completion, 0x7777));
    assert_eq!(t.run_kernel(), 2, "both armed CQs fired");

    // B's waiter reads past A's completion and the QP event, which stay for their waiters.
    assert!(cq_b.wait_event(Some(WAIT)).unwrap());
    assert!(cq_a.wait_event(Some(WAIT)).unwrap());
    assert_eq!(
        ctx.next_event(Some(WAIT)).unwrap(),
        Some(DeviceEvent::QpFatal { qp: a.handle() })
    );
    assert_eq!(
        ctx.next_event(Some(Duration::from_millis(20))).unwrap(),
        None
    );
    assert!(
        !cq_a.wait_event(Some(Duration::from_millis(20))).unwrap(),
        "one event per arm"
    );
    assert_eq!(poll_all(&cq_a)[0].wr_id, 8);
    assert_eq!(poll_all(&cq_b)[0].wr_id, 9);

    // Two threads wait on two CQs at once; events arrive in the "wrong" order.
    cq_a.arm(false).unwrap();
    cq_b.arm(true).unwrap();
    std::thread::scope(|s| {
        let wa = s.spawn(|| cq_a.wait_event(Some(WAIT)).unwrap());
        let wb = s.spawn(|| cq_b.wait_event(Some(WAIT)).unwrap());
        std::thread::sleep(Duration::from_millis(50));
        t.post_event(object_event(EventType::Completion, cq_b.handle()));
        t.post_event(object_event(EventType::Completion, cq_a.handle()));
        assert!(wa.join().unwrap());
        assert!(wb.join().unwrap());
    });
    let armed =
        t.device()
            .log
            .iter()
            .rev()
            .find_map(|(_, raw)| match ControlRequest::decode(raw) {
                Ok(ControlRequest::ArmCq(r)) => Some(r),
                _ => None,
            });
    assert_eq!(armed.unwrap().flags.get(), sv::arm_flags::SOLICITED_ONLY);
}

#[test]
fn ud_sends_name_the_address_handle() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let cq = Cq::new(&ctx, 16).unwrap();
    let (a, b) = (
        create_qp(&pd, &cq, QpType::Ud),
        create_qp(&pd, &cq, QpType::Ud),
    );
    a.ud_to_rts(1, 0x1111_1111, 0).unwrap();
    b.ud_to_rts(1, 0x1111_1111, 0).unwrap();
    assert!(matches!(
        a.to_init(1, AccessFlags::empty()),
        Err(VerbsError::InvalidArgument(_))
    ));
    let masks: Vec<QpAttrMask> = modify_requests(&t)
        .iter()
        .map(|m| QpAttrMask::from_bits_retain(m.attr_mask.get()))
        .collect();
    assert_eq!(
        masks[..3],
        [
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
            QpAttrMask::STATE,
            QpAttrMask::STATE | QpAttrMask::SQ_PSN
        ]
    );

    let ah = Ah::new(
        &pd,
        &AhAttr::default()
            .with_grh(GlobalRoute {
                dgid: Gid(LOCAL_GID),
                hop_limit: 1,
                ..GlobalRoute::default()
            })
            .with_port_num(1),
    )
    .unwrap();
    assert_ne!(ah.rxe().ah_num, 0);
    assert_eq!(&ah.rxe().av.as_bytes()[8..24], &LOCAL_GID);

    let buf = ctx.alloc_buffer(256).unwrap();
    let mr = pd.register(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    let recv = [mr.sge(0, 128).unwrap()];
    b.post_recv(&[RecvWr {
        wr_id: 5,
        sg_list: &recv,
    }])
    .unwrap();
    let payload = *b"datagram";
    let sge = [Sge {
        addr: payload.as_ptr() as u64,
        length: payload.len() as u32,
        lkey: 0,
    }];
    post(
        &a,
        &[SendWr {
            wr_id: 6,
            opcode: WrOpcode::Send,
            flags: SendFlags::SIGNALED | SendFlags::INLINE,
            sg_list: &sge,
            ud: Some(ah.dest(b.qpn(), 0x1111_1111)),
            ..SendWr::default()
        }],
    )
    .unwrap();
    t.run_kernel();
    let wcs = poll_all(&cq);
    assert_eq!(wcs.len(), 2);
    assert!(wcs.iter().all(|wc| wc.status == WcStatus::Success));
    assert_eq!(&buf.as_slice()[..8], b"datagram");
}

#[test]
fn mr_sges_stay_inside_the_region() {
    let (_t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let buf = ctx.alloc_buffer(100).unwrap();
    let mr: Mr<'_> = pd.register(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(mr.sge(90, 10).unwrap().addr, mr.addr() + 90);
    assert!(mr.sge(90, 11).is_none());
    assert!(mr.sge(usize::MAX, 2).is_none());
    assert!(matches!(
        pd.register(&buf, AccessFlags::REMOTE_WRITE),
        Err(VerbsError::InvalidArgument(_))
    ));
    let owned = pd
        .register_owned(ctx.alloc_buffer(10).unwrap(), AccessFlags::empty())
        .unwrap();
    assert_eq!(owned.buffer().unwrap().as_ptr() as u64, owned.addr());
}

/// A polling program learns from `check_alive` that the device lost its objects (spec
/// §11.5: DEVICE_FATAL naming a new epoch); one naming the epoch the context opened at is
/// about a discard before it and changes nothing. The event stays for its reader.
#[test]
fn check_alive_reports_a_device_fatal_of_a_later_epoch() {
    let (t, ctx) = open();
    ctx.check_alive().unwrap();
    // The fake device opened at epoch 0.
    let fatal = |epoch| vrdma::spec::Event {
        event_type: EventType::DeviceFatal,
        handle: 0,
        detail: epoch,
    };
    t.post_event(fatal(0));
    ctx.check_alive().unwrap();
    t.post_event(fatal(3));
    assert!(matches!(
        ctx.check_alive(),
        Err(VerbsError::DeviceLost { epoch: 3 })
    ));
    // It stays so, and the event is still there for an event reader.
    assert!(matches!(
        ctx.check_alive(),
        Err(VerbsError::DeviceLost { epoch: 3 })
    ));
    assert_eq!(
        ctx.next_event(Some(WAIT)).unwrap(),
        Some(DeviceEvent::DeviceFatal { epoch: 3 })
    );
}

//! UC queue pairs: connecting with UC's attribute masks, SEND, RDMA WRITE and RDMA WRITE with
//! immediate data through the fake's kernel with every byte checked, READ and atomics refused
//! at post time, silent drops at the responder, and the feature UC needs.

use vrdma::spec::features;
use vrdma::spec::verbs::QpAttrMask;
use vrdma::spec::Status;
use vrdma::verbs::{
    AccessFlags, ConnectOptions, Context, Cq, Pd, PostError, PostSendError, Qp, QpInitAttr, QpType,
    RecvWr, SendFlags, SendWr, Sge, VerbsError, WcFlags, WcOpcode, WcStatus, WrOpcode,
};
use vrdma_test_support::fake_transport::{default_config, FakeTransport};

use crate::helpers::*;

/// Two UC QPs of one context connected to each other, each with its own CQ.
fn uc_pair(pd: &Pd, cq_a: &Cq, cq_b: &Cq) -> (Qp, Qp) {
    let a = create_qp(pd, cq_a, QpType::Uc);
    let b = create_qp(pd, cq_b, QpType::Uc);
    assert_eq!(a.qp_type(), QpType::Uc);
    let opts = |sq_psn| ConnectOptions {
        sq_psn,
        ..ConnectOptions::default()
    };
    a.connect(&remote(&b, 20), &opts(10)).unwrap();
    b.connect(&remote(&a, 10), &opts(20)).unwrap();
    (a, b)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn uc_connects_without_rc_attributes() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (Cq::new(&ctx, 16).unwrap(), Cq::new(&ctx, 16).unwrap());
    let (a, _b) = uc_pair(&pd, &cq_a, &cq_b);
    let masks: Vec<QpAttrMask> = modify_requests(&t)
        .iter()
        .filter(|r| r.qp.get() == a.handle())
        .map(|r| QpAttrMask::from_bits_retain(r.attr_mask.get()))
        .collect();
    type M = QpAttrMask;
    assert_eq!(
        masks,
        [
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
            M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
            M::STATE | M::SQ_PSN,
        ]
    );
    assert_eq!(a.state().unwrap(), vrdma::verbs::QpState::Rts);
    // UD's helper is not for a connected QP.
    assert!(matches!(
        a.ud_to_rts(1, 0x1111, 0),
        Err(VerbsError::InvalidArgument(_))
    ));
}

#[test]
fn uc_send_write_and_write_with_imm_move_every_byte() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (Cq::new(&ctx, 16).unwrap(), Cq::new(&ctx, 16).unwrap());
    let (a, b) = uc_pair(&pd, &cq_a, &cq_b);

    let message = pattern(5000, 3);
    let src = filled(&ctx, &message);
    let src_mr = pd.register(&src, AccessFlags::empty()).unwrap();
    let dst = ctx.alloc_buffer(16384).unwrap();
    let dst_mr = pd
        .register(&dst, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();

    // SEND with immediate data, over two SGEs, into a receive at offset 64.
    let recv_sge = [dst_mr.sge(64, 6000).unwrap()];
    b.post_recv(&[RecvWr {
        wr_id: 7,
        sg_list: &recv_sge,
    }])
    .unwrap();
    let sges = [
        src_mr.sge(0, 1000).unwrap(),
        src_mr.sge(1000, 4000).unwrap(),
    ];
    post(
        &a,
        &[SendWr {
            wr_id: 1,
            opcode: WrOpcode::SendWithImm,
            flags: SendFlags::SIGNALED,
            sg_list: &sges,
            imm_data: 0x0102_0304_u32.to_be(),
            ..SendWr::default()
        }],
    )
    .unwrap();
    t.run_kernel();
    let sent = poll_all(&cq_a);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (sent[0].wr_id, sent[0].status, sent[0].opcode),
        (1, WcStatus::Success, WcOpcode::Send)
    );
    let got = poll_all(&cq_b);
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].wr_id, got[0].status, got[0].opcode, got[0].byte_len),
        (7, WcStatus::Success, WcOpcode::Recv, 5000)
    );
    assert_eq!((got[0].qp_num, got[0].src_qp), (b.qpn(), a.qpn()));
    assert!(got[0].wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(u32::from_be(got[0].imm_data), 0x0102_0304);
    assert_eq!(&dst.as_slice()[64..5064], &message[..]);

    // RDMA WRITE from registered memory: no receive consumed, nothing at the target's CQ.
    let write = pattern(3000, 101);
    let write_src = filled(&ctx, &write);
    let write_mr = pd.register(&write_src, AccessFlags::empty()).unwrap();
    let write_sge = [write_mr.sge(0, write.len()).unwrap()];
    post(
        &a,
        &[SendWr {
            wr_id: 2,
            opcode: WrOpcode::RdmaWrite,
            flags: SendFlags::SIGNALED,
            sg_list: &write_sge,
            remote_addr: dst_mr.addr() + 8192,
            rkey: dst_mr.rkey(),
            ..SendWr::default()
        }],
    )
    .unwrap();
    t.run_kernel();
    let sent = poll_all(&cq_a);
    assert_eq!(
        (sent[0].wr_id, sent[0].status, sent[0].opcode),
        (2, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert!(poll_all(&cq_b).is_empty());
    assert_eq!(&dst.as_slice()[8192..8192 + write.len()], &write[..]);

    // Inline RDMA WRITE with immediate data: written, and a receive completes with the
    // immediate and the written length.
    let inline = pattern(48, 200);
    let inline_sge = [Sge {
        addr: inline.as_ptr() as u64,
        length: inline.len() as u32,
        lkey: 0,
    }];
    b.post_recv(&[RecvWr {
        wr_id: 8,
        sg_list: &[],
    }])
    .unwrap();
    post(
        &a,
        &[SendWr {
            wr_id: 3,
            opcode: WrOpcode::RdmaWriteWithImm,
            flags: SendFlags::SIGNALED | SendFlags::INLINE,
            sg_list: &inline_sge,
            imm_data: 0xcafe_u32.to_be(),
            remote_addr: dst_mr.addr() + 12000,
            rkey: dst_mr.rkey(),
            ..SendWr::default()
        }],
    )
    .unwrap();
    t.run_kernel();
    let sent = poll_all(&cq_a);
    assert_eq!(
        (sent[0].wr_id, sent[0].status, sent[0].opcode),
        (3, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    let got = poll_all(&cq_b);
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].wr_id, got[0].status, got[0].opcode, got[0].byte_len),
        (8, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 48)
    );
    assert_eq!(u32::from_be(got[0].imm_data), 0xcafe);
    assert_eq!(&dst.as_slice()[12000..12048], &inline[..]);
}

#[test]
fn uc_refuses_read_and_atomics_at_post_time() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (Cq::new(&ctx, 16).unwrap(), Cq::new(&ctx, 16).unwrap());
    let (a, _b) = uc_pair(&pd, &cq_a, &cq_b);
    let buf = ctx.alloc_buffer(64).unwrap();
    let mr = pd.register(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    let sge = [mr.sge(0, 8).unwrap()];
    let before = t.notifications();
    for opcode in [
        WrOpcode::RdmaRead,
        WrOpcode::AtomicCmpAndSwp,
        WrOpcode::AtomicFetchAndAdd,
    ] {
        let err = post(
            &a,
            &[SendWr {
                wr_id: 9,
                opcode,
                flags: SendFlags::SIGNALED,
                sg_list: &sge,
                remote_addr: mr.addr(),
                rkey: mr.rkey(),
                ..SendWr::default()
            }],
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                PostSendError::Refused {
                    index: 0,
                    error: PostError::OpcodeNotSupported {
                        opcode: o,
                        qp_type: QpType::Uc
                    }
                } if o == opcode
            ),
            "{opcode:?}: {err:?}"
        );
    }
    assert_eq!(t.notifications(), before, "nothing was posted");
    t.run_kernel();
    assert!(poll_all(&cq_a).is_empty());
}

#[test]
fn uc_messages_the_responder_drops_complete_at_the_sender() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (Cq::new(&ctx, 16).unwrap(), Cq::new(&ctx, 16).unwrap());
    let (a, _b) = uc_pair(&pd, &cq_a, &cq_b);
    let data = b"nobody listens";
    let sge = [Sge {
        addr: data.as_ptr() as u64,
        length: data.len() as u32,
        lkey: 0,
    }];
    let wr = |wr_id, opcode| SendWr {
        wr_id,
        opcode,
        flags: SendFlags::SIGNALED | SendFlags::INLINE,
        sg_list: &sge,
        remote_addr: 0x1000,
        rkey: 0xbad,
        ..SendWr::default()
    };
    // No receive posted at the peer, and an rkey the peer never gave out.
    post(&a, &[wr(1, WrOpcode::Send), wr(2, WrOpcode::RdmaWrite)]).unwrap();
    t.run_kernel();
    let sent = poll_all(&cq_a);
    let seen: Vec<_> = sent.iter().map(|wc| (wc.wr_id, wc.status)).collect();
    assert_eq!(seen, [(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert!(poll_all(&cq_b).is_empty());
}

#[test]
fn uc_needs_its_feature() {
    let t = FakeTransport::with(
        default_config(),
        features::VRDMA_F_RING_RXE_V1 | features::VRDMA_F_UD,
    );
    let ctx = Context::open(t).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = Cq::new(&ctx, 4).unwrap();
    let init = QpInitAttr {
        qp_type: QpType::Uc,
        send_cq: &cq,
        recv_cq: &cq,
        caps: rc_caps(),
        sq_sig_all: false,
    };
    let err = Qp::new(&pd, &init).unwrap_err();
    assert_eq!(status_of(&err), Some(Status::Unsupported));
    // RC needs nothing more than the ring format.
    create_qp(&pd, &cq, QpType::Rc);
}

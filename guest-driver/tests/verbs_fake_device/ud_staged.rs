//! UD sends through staged send queues (`VRDMA_F_UD_STAGED_SQ`, spec §9.6): WQEs name address
//! handles by handle, the fake device checks them as the backend does, and data arrives; a WQE
//! the device refuses completes with an error and flushes what follows.

use std::sync::Arc;

use vrdma::spec::features;
use vrdma::verbs::{
    AccessFlags, Ah, AhAttr, Context, Cq, Gid, GlobalRoute, Pd, Qp, QpType, RecvWr, SendFlags,
    SendWr, WcOpcode, WcStatus, WrOpcode,
};
use vrdma_test_support::fake_transport::{default_config, FakeTransport, LOCAL_GID};

use crate::helpers::*;

const QKEY: u32 = 0x1111_1111;

fn ah(pd: &Pd) -> Ah {
    let attr = AhAttr::default()
        .with_grh(GlobalRoute {
            dgid: Gid(LOCAL_GID),
            hop_limit: 1,
            ..GlobalRoute::default()
        })
        .with_port_num(1);
    Ah::new(pd, &attr).unwrap()
}

fn ud_pair(pd: &Pd, cq: &Cq) -> (Qp, Qp) {
    let (a, b) = (create_qp(pd, cq, QpType::Ud), create_qp(pd, cq, QpType::Ud));
    a.ud_to_rts(1, QKEY, 0).unwrap();
    b.ud_to_rts(1, QKEY, 0).unwrap();
    (a, b)
}

/// Sends 1000 bytes from registered memory in two SGEs through `ah` from `a` to `b`, with
/// immediate data, and checks what arrived.
fn send_and_verify(t: &FakeTransport, ctx: &Context, pd: &Pd, cq: &Cq, ah: &Ah) {
    let (a, b) = ud_pair(pd, cq);
    let message: Vec<u8> = (0..1000u32).map(|i| (i * 13) as u8).collect();
    let src = filled(ctx, &message);
    let src_mr = pd.register(&src, AccessFlags::empty()).unwrap();
    let dst = ctx.alloc_buffer(2048).unwrap();
    let dst_mr = pd.register(&dst, AccessFlags::LOCAL_WRITE).unwrap();
    let recv = [dst_mr.sge(0, 2048).unwrap()];
    b.post_recv(&[RecvWr {
        wr_id: 10,
        sg_list: &recv,
    }])
    .unwrap();
    let sges = [src_mr.sge(0, 300).unwrap(), src_mr.sge(300, 700).unwrap()];
    post(
        &a,
        &[SendWr {
            wr_id: 11,
            opcode: WrOpcode::SendWithImm,
            flags: SendFlags::SIGNALED,
            sg_list: &sges,
            imm_data: 0x0102_0304_u32.to_be(),
            ud: Some(ah.dest(b.qpn(), QKEY)),
            ..SendWr::default()
        }],
    )
    .unwrap();
    t.run_kernel();
    let wcs = poll_all(cq);
    let sent = wcs.iter().find(|wc| wc.wr_id == 11).unwrap();
    let received = wcs.iter().find(|wc| wc.wr_id == 10).unwrap();
    assert_eq!(
        (sent.status, sent.opcode),
        (WcStatus::Success, WcOpcode::Send)
    );
    assert_eq!(received.status, WcStatus::Success);
    assert_eq!(received.byte_len, 1000);
    assert_eq!(received.src_qp, a.qpn());
    assert_eq!(&dst.as_slice()[..1000], &message[..]);
}

#[test]
fn ud_wqes_name_the_handle_and_data_arrives() {
    let (t, ctx) = open();
    assert_ne!(ctx.features() & features::VRDMA_F_UD_STAGED_SQ, 0);
    let pd = ctx.alloc_pd().unwrap();
    let cq = Cq::new(&ctx, 16).unwrap();
    let ah = ah(&pd);
    assert_eq!(
        ah.rxe().ah_num,
        ah.handle(),
        "the handle, not the host's number"
    );
    send_and_verify(&t, &ctx, &pd, &cq, &ah);
}

#[test]
fn without_staging_wqes_carry_the_host_number() {
    let t: Arc<FakeTransport> = FakeTransport::with(
        default_config(),
        features::VRDMA_F_RING_RXE_V1 | features::VRDMA_F_UD,
    );
    let ctx = Context::open(t.clone()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = Cq::new(&ctx, 16).unwrap();
    let ah = ah(&pd);
    assert_ne!(ah.rxe().ah_num, ah.handle());
    send_and_verify(&t, &ctx, &pd, &cq, &ah);
}

#[test]
fn a_refused_wqe_completes_with_an_error_and_flushes_the_rest() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let cq = Cq::new(&ctx, 16).unwrap();
    let (a, b) = ud_pair(&pd, &cq);
    // An AH of another PD: rxe would refuse it too, the device refuses it before the host.
    let other_pd = ctx.alloc_pd().unwrap();
    let foreign = ah(&other_pd);
    let own = ah(&pd);
    let buf = ctx.alloc_buffer(256).unwrap();
    let mr = pd.register(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    let recv = [mr.sge(0, 256).unwrap()];
    b.post_recv(&[RecvWr {
        wr_id: 20,
        sg_list: &recv,
    }])
    .unwrap();
    let payload = *b"not sent";
    let sge = [vrdma::verbs::Sge {
        addr: payload.as_ptr() as u64,
        length: payload.len() as u32,
        lkey: 0,
    }];
    for (wr_id, ah) in [(21, &foreign), (22, &own)] {
        let wr = SendWr {
            wr_id,
            opcode: WrOpcode::Send,
            flags: SendFlags::SIGNALED | SendFlags::INLINE,
            sg_list: &sge,
            ud: Some(ah.dest(b.qpn(), QKEY)),
            ..SendWr::default()
        };
        post(&a, &[wr]).unwrap();
    }
    t.run_kernel();
    let wcs: Vec<(u64, WcStatus)> = poll_all(&cq)
        .iter()
        .map(|wc| (wc.wr_id, wc.status))
        .collect();
    assert_eq!(
        wcs,
        [(21, WcStatus::LocQpOpErr), (22, WcStatus::WrFlushErr)]
    );
    assert_eq!(&buf.as_slice()[..8], &[0; 8], "nothing arrived");
}

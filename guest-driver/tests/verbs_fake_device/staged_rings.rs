//! Staged receive queues (`VRDMA_F_STAGED_RINGS`, spec §9.7): a receive posted to a QP whose
//! receive queue the device describes as a staging ring is followed by the QP's doorbell (the
//! device copies it then); a directly mapped receive queue needs none. Data arrives either way.

use vrdma::verbs::{AccessFlags, RecvWr, SendFlags, SendWr, WcStatus, WrOpcode};

use crate::helpers::*;

/// Posts one receive on `b` and sends 100 bytes from `a` into it; returns how many doorbell
/// notifications the receive cost.
fn receive_costs(staged: bool) -> usize {
    let (t, ctx) = open();
    t.device().stage_receive_queues = staged;
    let pd = ctx.alloc_pd().unwrap();
    let cq = vrdma::verbs::Cq::new(&ctx, 16).unwrap();
    let (a, b) = connected_pair(&pd, &cq, &cq);
    assert_eq!(b.receives_staged(), staged);
    let message: Vec<u8> = (0..100u8).collect();
    let src = filled(&ctx, &message);
    let src_mr = pd.register(&src, AccessFlags::empty()).unwrap();
    let dst = ctx.alloc_buffer(4096).unwrap();
    let dst_mr = pd.register(&dst, AccessFlags::LOCAL_WRITE).unwrap();
    let before = t.notifications();
    b.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &[dst_mr.sge(0, 4096).unwrap()],
    }])
    .unwrap();
    // An empty list posts nothing and rings nothing.
    b.post_recv(&[]).unwrap();
    let receive = t.notifications() - before;
    post(
        &a,
        &[SendWr {
            wr_id: 2,
            opcode: WrOpcode::Send,
            flags: SendFlags::SIGNALED,
            sg_list: &[src_mr.sge(0, 100).unwrap()],
            ..SendWr::default()
        }],
    )
    .unwrap();
    t.run_kernel();
    let wcs = poll_all(&cq);
    assert!(wcs
        .iter()
        .any(|wc| wc.wr_id == 1 && wc.status == WcStatus::Success && wc.byte_len == 100));
    assert_eq!(&dst.as_slice()[..100], &message[..]);
    // The send rang as always.
    assert!(t.notifications() > before + receive);
    receive
}

#[test]
fn receives_ring_the_doorbell_only_when_the_receive_queue_is_staged() {
    assert_eq!(receive_costs(false), 0);
    assert_eq!(receive_costs(true), 1);
}

//! UD sends through `ibv_post_send` (the classic path) over the fake device, which checks them
//! as the device checks staged UD send queues (spec §9.6): an application's AH reaches the
//! device as its handle, data arrives, and an AH of another PD fails the request.

use vrdma::verbs::{AccessFlags, RecvWr};

use super::tests::{vqp, Fixture};
use crate::sys::{
    ibv_ah, ibv_ah_attr, ibv_qp, ibv_qp_type_IBV_QPT_UD, ibv_send_flags_IBV_SEND_SIGNALED,
    ibv_send_wr, ibv_sge, ibv_wr_opcode_IBV_WR_SEND_WITH_IMM,
};
use vrdma_test_support::fake_transport::LOCAL_GID;

const QKEY: u32 = 0x1111;

fn create_ah(pd: *mut crate::sys::ibv_pd) -> *mut ibv_ah {
    // SAFETY: all-zero is a valid ibv_ah_attr.
    let mut attr: ibv_ah_attr = unsafe { std::mem::zeroed() };
    attr.is_global = 1;
    attr.port_num = 1;
    attr.grh.dgid.raw = LOCAL_GID;
    attr.grh.hop_limit = 64;
    // SAFETY: a live PD of this library and a valid attribute structure.
    let ah = unsafe { crate::objects::ibv_create_ah(pd, &mut attr) };
    assert!(!ah.is_null());
    ah
}

/// `ibv_post_send` of one signaled SEND_WITH_IMM of `sge` through `ah` to `dest`.
fn post_send(qp: *mut ibv_qp, wr_id: u64, sge: &mut ibv_sge, ah: *mut ibv_ah, dest: u32) -> i32 {
    // SAFETY: all-zero is a valid ibv_send_wr.
    let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = wr_id;
    wr.sg_list = sge;
    wr.num_sge = 1;
    wr.opcode = ibv_wr_opcode_IBV_WR_SEND_WITH_IMM;
    wr.send_flags = ibv_send_flags_IBV_SEND_SIGNALED;
    wr.__bindgen_anon_1.imm_data = 0x0a0b_0c0d_u32.to_be();
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = dest;
    wr.wr.ud.remote_qkey = QKEY;
    let mut bad = std::ptr::null_mut();
    // SAFETY: a QP of this library, a valid one-element list, SGEs in registered memory.
    unsafe { crate::datapath::post_send(qp, &mut wr, &mut bad) }
}

#[test]
fn ibv_post_send_ud_delivers_through_the_applications_ah() {
    let f = Fixture::new();
    let a = f.create(f.attr(ibv_qp_type_IBV_QPT_UD, None)).unwrap();
    let b = f.create(f.attr(ibv_qp_type_IBV_QPT_UD, None)).unwrap();
    for qp in [a, b] {
        vqp(qp).qp.ud_to_rts(1, QKEY, 0).unwrap();
        super::tests::set_rts(qp);
    }
    let ah = create_ah(f.pd);
    let vctx = f.vctx();
    let mut buf = vctx.alloc_buffer(4096).unwrap();
    let message: Vec<u8> = (0..500u32).map(|i| (i * 3) as u8).collect();
    buf.as_mut_slice()[..500].copy_from_slice(&message);
    let mr = f.vpd().pd.register(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    let recv = [mr.sge(2048, 1024).unwrap()];
    vqp(b)
        .qp
        .post_recv(&[RecvWr {
            wr_id: 30,
            sg_list: &recv,
        }])
        .unwrap();
    let mut sge = ibv_sge {
        addr: mr.addr(),
        length: 500,
        lkey: mr.lkey(),
    };
    let b_qpn = vqp(b).qp.qpn();
    assert_eq!(post_send(a, 31, &mut sge, ah, b_qpn), 0);
    f.fake.run_kernel();
    let wcs: Vec<(u64, u32, u32)> = f
        .poll()
        .iter()
        .map(|w| (w.wr_id, w.status, w.byte_len))
        .collect();
    assert_eq!(wcs, [(30, 0, 500), (31, 0, 500)]);
    assert_eq!(&buf.as_slice()[2048..2548], &message[..]);

    // An AH of another PD is refused by the device: an error completion, nothing delivered.
    // SAFETY: the fixture's live context.
    let other_pd = unsafe { crate::objects::ibv_alloc_pd(f.ctx) };
    let foreign = create_ah(other_pd);
    vqp(b)
        .qp
        .post_recv(&[RecvWr {
            wr_id: 32,
            sg_list: &recv,
        }])
        .unwrap();
    assert_eq!(post_send(a, 33, &mut sge, foreign, b_qpn), 0);
    f.fake.run_kernel();
    let wcs: Vec<(u64, u32)> = f.poll().iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(wcs, [(33, crate::sys::ibv_wc_status_IBV_WC_LOC_QP_OP_ERR)]);

    drop(mr);
    // SAFETY: the AHs and PD, no longer used.
    unsafe {
        assert_eq!(crate::objects::ibv_destroy_ah(ah), 0);
        assert_eq!(crate::objects::ibv_destroy_ah(foreign), 0);
        assert_eq!(crate::objects::ibv_dealloc_pd(other_pd), 0);
    }
    f.close(&[a, b]);
}

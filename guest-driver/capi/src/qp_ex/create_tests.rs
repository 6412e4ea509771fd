//! `ibv_create_qp_ex` and `ibv_create_srq_ex` over the fake device: what they refuse, as rxe,
//! and which operations an extended QP gets; the errnos of refused batches.

use super::tests::{qp_ex, Fixture};
use super::*;
use crate::cq_ex::tests::verbs_get_ctx;
use crate::sys::{
    ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_TSO as WITH_TSO, ibv_qp_type_IBV_QPT_RC,
    ibv_qp_type_IBV_QPT_UC, ibv_qp_type_IBV_QPT_UD, ibv_srq_init_attr_ex,
    ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_PD as SRQ_PD,
    ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_TYPE as SRQ_TYPE, ibv_srq_type_IBV_SRQT_XRC,
};

#[test]
fn create_qp_ex_refuses_what_rxe_refuses_and_sets_only_the_asked_opcodes() {
    let f = Fixture::new();
    let rc = |ops| f.attr(ibv_qp_type_IBV_QPT_RC, Some(ops));
    assert_eq!(f.create(rc(u64::from(WITH_TSO))), Err(libc::EOPNOTSUPP));
    assert_eq!(f.create(rc(1 << 40)), Err(libc::EOPNOTSUPP));
    let uc_read = f.attr(
        ibv_qp_type_IBV_QPT_UC,
        Some(u64::from(WITH_SEND | WITH_READ)),
    );
    assert_eq!(f.create(uc_read), Err(libc::EOPNOTSUPP));
    let ud_write = f.attr(ibv_qp_type_IBV_QPT_UD, Some(u64::from(WITH_WRITE)));
    assert_eq!(f.create(ud_write), Err(libc::EOPNOTSUPP));
    let mut flags = rc(0);
    flags.comp_mask |= ATTR_CREATE_FLAGS;
    flags.create_flags = 1;
    assert_eq!(f.create(flags), Err(libc::EOPNOTSUPP));
    let mut xrcd = rc(0);
    xrcd.comp_mask |= 2; // IBV_QP_INIT_ATTR_XRCD
    assert_eq!(f.create(xrcd), Err(libc::EOPNOTSUPP));
    let mut no_pd = rc(0);
    no_pd.comp_mask &= !ATTR_PD;
    assert_eq!(f.create(no_pd), Err(libc::EINVAL));
    let mut xrc = rc(0);
    xrc.qp_type = 9; // IBV_QPT_XRC_SEND
    assert_eq!(f.create(xrc), Err(libc::EOPNOTSUPP));

    // Only the opcodes asked for; the setters and the batch operations always.
    let uc = f
        .create(f.attr(ibv_qp_type_IBV_QPT_UC, Some(u64::from(WITH_WRITE))))
        .unwrap();
    let ex = qp_ex(uc);
    // SAFETY: the QP just made.
    let ops = unsafe { &*ex };
    assert!(ops.wr_rdma_write.is_some() && ops.wr_send.is_none() && ops.wr_rdma_read.is_none());
    assert!(ops.wr_set_sge.is_some() && ops.wr_set_ud_addr.is_some() && ops.wr_start.is_some());
    assert!(ops.wr_send_tso.is_none() && ops.wr_set_xrc_srqn.is_none());
    // SAFETY: as above.
    assert_eq!(unsafe { (*uc).qp_type }, ibv_qp_type_IBV_QPT_UC);
    // A QP made without SEND_OPS_FLAGS has only the setters and batch operations.
    let plain = f.create(rc(0).without_send_ops()).unwrap();
    // SAFETY: the QP just made.
    let ops = unsafe { &*qp_ex(plain) };
    assert!(ops.wr_send.is_none() && ops.wr_complete.is_some());

    // A QP of ibv_create_qp has no ibv_qp_ex, as in rdma-core.
    let mut classic_attr = rc(0);
    // SAFETY: the fixture's PD and a valid attribute structure (its classic prefix).
    let classic = unsafe {
        crate::qp::ibv_create_qp(f.pd, (&raw mut classic_attr).cast::<ibv_qp_init_attr>())
    };
    assert!(!classic.is_null());
    // SAFETY: a live QP.
    assert!(unsafe { ibv_qp_to_qp_ex(classic) }.is_null());

    // FLUSH (rdma-core 45+): RC only; `wr_flush` right after the rdma-core 44 `ibv_qp_ex`,
    // set only when asked for.
    let uc_flush = f.attr(
        ibv_qp_type_IBV_QPT_UC,
        Some(WITH_FLUSH | u64::from(WITH_SEND)),
    );
    assert_eq!(f.create(uc_flush), Err(libc::EOPNOTSUPP));
    let flushing = f.create(rc(WITH_FLUSH)).unwrap();
    let wr_flush_of = |qp: *mut ibv_qp| {
        // SAFETY: a live extended QP of this library: the word after its `ibv_qp_ex`, where
        // a program built against rdma-core 45+ reads `wr_flush`.
        unsafe {
            qp.cast::<u8>()
                .add(size_of::<ibv_qp_ex>())
                .cast::<usize>()
                .read()
        }
    };
    assert_ne!(wr_flush_of(flushing), 0);
    assert_eq!(wr_flush_of(plain), 0);
    f.close(&[uc, plain, classic, flushing]);
}

trait WithoutSendOps {
    fn without_send_ops(self) -> Self;
}

impl WithoutSendOps for ibv_qp_init_attr_ex {
    fn without_send_ops(mut self) -> Self {
        self.comp_mask &= !ATTR_SEND_OPS_FLAGS;
        self
    }
}

#[test]
fn create_srq_ex_makes_basic_srqs_only() {
    let f = Fixture::new();
    let create = verbs_get_ctx(f.ctx).create_srq_ex.unwrap();
    let errno_of = |mut attr: ibv_srq_init_attr_ex| {
        // SAFETY: a live context and a valid attribute structure.
        let srq = unsafe { create(f.ctx, &mut attr) };
        assert!(srq.is_null());
        std::io::Error::last_os_error().raw_os_error().unwrap()
    };
    // SAFETY: all-zero is a valid ibv_srq_init_attr_ex.
    let mut attr: ibv_srq_init_attr_ex = unsafe { std::mem::zeroed() };
    attr.attr.max_wr = 16;
    attr.attr.max_sge = 1;
    attr.comp_mask = SRQ_PD | SRQ_TYPE;
    attr.pd = f.pd;
    let mut xrc = attr;
    xrc.srq_type = ibv_srq_type_IBV_SRQT_XRC;
    assert_eq!(errno_of(xrc), libc::EOPNOTSUPP);
    let mut tm = attr;
    tm.srq_type = 2; // IBV_SRQT_TM
    assert_eq!(errno_of(tm), libc::EOPNOTSUPP);
    let mut reserved = attr;
    reserved.comp_mask |= 1 << 5;
    assert_eq!(errno_of(reserved), libc::EOPNOTSUPP);
    let mut no_pd = attr;
    no_pd.comp_mask = SRQ_TYPE;
    assert_eq!(errno_of(no_pd), libc::EINVAL);
    // A basic SRQ is an ibv_create_srq: the same answer (this fake device has no SRQs), and
    // the sizes written back the same way.
    let basic = errno_of(attr);
    let mut classic = crate::sys::ibv_srq_init_attr {
        srq_context: std::ptr::null_mut(),
        attr: attr.attr,
    };
    // SAFETY: the fixture's PD and a valid attribute structure.
    let srq = unsafe { crate::srq::ibv_create_srq(f.pd, &mut classic) };
    assert!(srq.is_null());
    assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(basic));
    assert_ne!(basic, libc::EINVAL);
    f.close(&[]);
}

#[test]
fn rxe_errnos_of_refused_batches() {
    let refused = |error| SendBatchError::Refused { index: 0, error };
    assert_eq!(batch_errno(&refused(PostError::QueueFull)), libc::ENOSPC);
    assert_eq!(
        batch_errno(&refused(PostError::MissingUdDest)),
        libc::EINVAL
    );
    assert_eq!(batch_errno(&refused(PostError::NoRequest)), libc::EINVAL);
    let unsupported = refused(PostError::Unsupported("x"));
    assert_eq!(batch_errno(&unsupported), libc::EOPNOTSUPP);
    assert_eq!(QpType::try_from(ibv_qp_type_IBV_QPT_RC), Ok(QpType::Rc));
}

//! Queue pairs (RC, UC and UD): create, modify, query, destroy. `ibv_create_qp_ex` and the
//! `ibv_wr_*` operations (module `qp_ex`) build on these.

use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use vrdma::verbs::{AccessFlags, Mtu, QpAttr, QpAttrMask, QpCaps, QpState, QpType, SendBatch};
use vrdma::{Qp, QpInitAttr};

use crate::async_events::{AsyncEvents, ObjectKind};
use crate::cq::VrdmaCq;
use crate::ffi::{guard, null_with, report};
use crate::objects::{ah_attr_from, ah_attr_to, VrdmaPd};
use crate::srq::VrdmaSrq;
use crate::sys::{ibv_pd, ibv_qp, ibv_qp_attr, ibv_qp_cap, ibv_qp_ex, ibv_qp_init_attr};

/// A queue pair: `ibv_qp_ex` first, whose first member is the `ibv_qp` handed to the
/// application (so `ibv_qp_to_qp_ex` needs no lookup, as in rdma-core). A QP made by
/// `ibv_create_qp` leaves the extended part zero; one made by `ibv_create_qp_ex` has its
/// `ibv_wr_*` operations set. Every classic verb works on both.
#[repr(C)]
pub(crate) struct VrdmaQp {
    pub(crate) ibv: ibv_qp_ex,
    /// `ibv_qp_ex.wr_flush`, which rdma-core 45 and later append after `wr_atomic_write`
    /// (the `ibv_qp_ex` of `sys`, rdma-core 44's, ends before it): here, right after `ibv`, a
    /// program built against a newer `verbs.h` finds it at its offset.
    pub(crate) wr_flush: Option<WrFlush>,
    /// The open `ibv_wr_*` batch; declared before `qp`, which it borrows.
    pub(crate) batch: BatchSlot,
    pub(crate) qp: Qp,
    sq_sig_all: bool,
    /// Made by `ibv_create_qp_ex`: `ibv_qp_to_qp_ex` hands out `ibv`.
    pub(crate) extended: bool,
    /// The context's asynchronous events, held by the QP: `ibv_destroy_qp` must not reach
    /// them through the context, which `ibv_close_device` may have freed already.
    async_events: Arc<AsyncEvents>,
}

/// `ibv_qp_ex.wr_flush` (rdma-core 45+): `(qp, rkey, remote_addr, len, type, level)`.
pub(crate) type WrFlush = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, usize, u8, u8);

// `wr_flush` directly follows the rdma-core 44 `ibv_qp_ex`, where newer headers put it.
const _: () = assert!(std::mem::offset_of!(VrdmaQp, wr_flush) == size_of::<ibv_qp_ex>());

/// The open `ibv_wr_*` batch of a QP, between `ibv_wr_start` and `ibv_wr_complete` or
/// `ibv_wr_abort`.
///
/// Only the thread that opened the batch touches it, as the `ibv_qp_ex` contract requires (a
/// batch is one thread's sequence of calls); the batch holds the QP's send lock meanwhile,
/// which orders one batch's accesses before the next's.
#[derive(Default)]
pub(crate) struct BatchSlot {
    /// The open batch. Its lifetime is the QP's own (`VrdmaQp::qp`, declared after this
    /// slot, so a batch left open is dropped before the QP it borrows).
    pub(crate) open: UnsafeCell<Option<SendBatch<'static>>>,
}

impl VrdmaQp {
    /// # Safety
    /// `ptr` is NULL or a live QP of this library.
    pub(crate) unsafe fn from_ptr<'a>(ptr: *mut ibv_qp) -> Option<&'a VrdmaQp> {
        // SAFETY: caller contract; `ibv` is the first field of a repr(C) struct.
        unsafe { ptr.cast::<VrdmaQp>().as_ref() }
    }
}

fn caps_from(c: &ibv_qp_cap) -> QpCaps {
    QpCaps {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

fn caps_to(c: &QpCaps) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// The wire form of the attributes `mask` selects; `None` if a selected value is not
/// defined. Unselected enumerated fields and address vectors are not interpreted
/// (applications leave them uninitialised) and keep their defaults.
pub(crate) fn qp_attr_from(a: &ibv_qp_attr, mask: QpAttrMask) -> Option<QpAttr> {
    let mut attr = QpAttr::default()
        .with_path_mig_state(a.path_mig_state)
        .with_qkey(a.qkey)
        .with_rq_psn(a.rq_psn)
        .with_sq_psn(a.sq_psn)
        .with_dest_qp_num(a.dest_qp_num)
        .with_caps(caps_from(&a.cap))
        .with_pkey_index(a.pkey_index)
        .with_alt_pkey_index(a.alt_pkey_index)
        .with_en_sqd_async_notify(a.en_sqd_async_notify != 0)
        .with_max_rd_atomic(a.max_rd_atomic)
        .with_max_dest_rd_atomic(a.max_dest_rd_atomic)
        .with_min_rnr_timer(a.min_rnr_timer)
        .with_port_num(a.port_num)
        .with_timeout(a.timeout)
        .with_retry_cnt(a.retry_cnt)
        .with_rnr_retry(a.rnr_retry)
        .with_alt_port_num(a.alt_port_num)
        .with_alt_timeout(a.alt_timeout)
        .with_rate_limit(a.rate_limit);
    if mask.contains(QpAttrMask::STATE) {
        attr = attr.with_qp_state(QpState::try_from(a.qp_state).ok()?);
    }
    if mask.contains(QpAttrMask::CUR_STATE) {
        attr = attr.with_cur_qp_state(QpState::try_from(a.cur_qp_state).ok()?);
    }
    if mask.contains(QpAttrMask::PATH_MTU) {
        attr = attr.with_path_mtu(Mtu::try_from(a.path_mtu).ok()?);
    }
    if mask.contains(QpAttrMask::ACCESS_FLAGS) {
        attr = attr.with_qp_access_flags(AccessFlags::qp_from_bits(a.qp_access_flags)?);
    }
    if mask.contains(QpAttrMask::AV) {
        attr = attr.with_ah_attr(ah_attr_from(&a.ah_attr));
    }
    if mask.contains(QpAttrMask::ALT_PATH) {
        attr = attr.with_alt_ah_attr(ah_attr_from(&a.alt_ah_attr));
    }
    Some(attr)
}

/// The `ibv_qp_attr` of attributes in wire form.
pub(crate) fn qp_attr_to(a: &QpAttr) -> ibv_qp_attr {
    ibv_qp_attr {
        qp_state: a.qp_state.get(),
        cur_qp_state: a.cur_qp_state.get(),
        path_mtu: a.path_mtu.get(),
        path_mig_state: a.path_mig_state.get(),
        qkey: a.qkey.get(),
        rq_psn: a.rq_psn.get(),
        sq_psn: a.sq_psn.get(),
        dest_qp_num: a.dest_qp_num.get(),
        qp_access_flags: a.qp_access_flags.get(),
        cap: caps_to(&a.caps()),
        ah_attr: ah_attr_to(&a.ah_attr),
        alt_ah_attr: ah_attr_to(&a.alt_ah_attr),
        pkey_index: a.pkey_index.get(),
        alt_pkey_index: a.alt_pkey_index.get(),
        en_sqd_async_notify: a.en_sqd_async_notify,
        sq_draining: a.sq_draining,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: a.alt_port_num,
        alt_timeout: a.alt_timeout,
        rate_limit: a.rate_limit.get(),
    }
}

/// `ibv_create_qp`: RC, UC and UD QPs, with or without SRQ. The actual queue sizes are written
/// back into `init_attr->cap`, as rdma-core does.
///
/// # Safety
/// `pd` is a PD of this library; `init_attr` is valid for reads and writes and names CQs of
/// the same context.
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    init_attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard("ibv_create_qp", std::ptr::null_mut(), || {
        // SAFETY: caller contract.
        match unsafe { create(pd, init_attr) } {
            Ok(raw) => raw.cast(),
            Err(errno) => null_with("ibv_create_qp", errno),
        }
    })
}

/// Creates a QP in `pd` as `ibv_create_qp` does (its extended part zero, not registered as
/// extended yet); an errno value on failure.
///
/// # Safety
/// As [`ibv_create_qp`].
pub(crate) unsafe fn create(
    pd: *mut ibv_pd,
    init_attr: *mut ibv_qp_init_attr,
) -> Result<*mut VrdmaQp, c_int> {
    // SAFETY: caller contract.
    let (Some(vpd), Some(init)) = (unsafe { (VrdmaPd::from_ptr(pd), init_attr.as_mut()) }) else {
        return Err(libc::EINVAL);
    };
    let Ok(qp_type) = QpType::try_from(init.qp_type) else {
        log::debug!(
            "vrdma: ibv_create_qp: QP type {} not supported",
            init.qp_type
        );
        return Err(libc::EOPNOTSUPP);
    };
    // SAFETY: caller contract: NULL or an SRQ of this library.
    let srq = unsafe { VrdmaSrq::from_ptr(init.srq) };
    // SAFETY: caller contract.
    let (Some(send_cq), Some(recv_cq)) = (unsafe {
        (
            VrdmaCq::from_ptr(init.send_cq),
            VrdmaCq::from_ptr(init.recv_cq),
        )
    }) else {
        return Err(libc::EINVAL);
    };
    let attr = QpInitAttr {
        qp_type,
        send_cq: &send_cq.cq,
        recv_cq: &recv_cq.cq,
        caps: caps_from(&init.cap),
        sq_sig_all: init.sq_sig_all != 0,
    };
    let created = match srq {
        Some(srq) => Qp::with_srq(&vpd.pd, &attr, &srq.srq),
        None => Qp::new(&vpd.pd, &attr),
    };
    let qp = created.map_err(|e| report("ibv_create_qp", &e))?;
    init.cap = caps_to(&qp.caps());
    // SAFETY: all-zero is a valid ibv_qp_ex (glibc's initializers are zero, the operations
    // NULL); set below.
    let mut ibv: ibv_qp_ex = unsafe { std::mem::zeroed() };
    let base = &mut ibv.qp_base;
    base.context = vpd.ibv.context;
    base.qp_context = init.qp_context;
    base.pd = pd;
    base.send_cq = init.send_cq;
    base.recv_cq = init.recv_cq;
    base.srq = init.srq;
    base.handle = qp.handle();
    base.qp_num = qp.qpn();
    base.state = QpState::Reset as u32;
    base.qp_type = init.qp_type;
    for users in [&vpd.users, &send_cq.users, &recv_cq.users] {
        users.fetch_add(1, Ordering::AcqRel);
    }
    if let Some(srq) = srq {
        srq.users.fetch_add(1, Ordering::AcqRel);
    }
    let handle = qp.handle();
    let async_events = vpd.context().async_events.clone();
    let qp = VrdmaQp {
        ibv,
        wr_flush: None,
        batch: BatchSlot::default(),
        qp,
        sq_sig_all: init.sq_sig_all != 0,
        extended: false,
        async_events: async_events.clone(),
    };
    let raw = Box::into_raw(Box::new(qp));
    async_events.register(ObjectKind::Qp, handle, raw as usize);
    Ok(raw)
}

/// `ibv_modify_qp`: 0, or an errno value.
///
/// # Safety
/// `qp` is a QP of this library; `attr` is valid for a read.
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    guard("ibv_modify_qp", libc::EIO, || {
        // SAFETY: caller contract.
        let (Some(vqp), Some(attr)) = (unsafe { (VrdmaQp::from_ptr(qp), attr.as_ref()) }) else {
            return libc::EINVAL;
        };
        let Some(mask) = QpAttrMask::from_bits(mask as u32) else {
            return libc::EINVAL;
        };
        let Some(converted) = qp_attr_from(attr, mask) else {
            return libc::EINVAL;
        };
        match vqp.qp.modify(&converted, mask) {
            Ok(()) => {
                if mask.contains(QpAttrMask::STATE) {
                    // SAFETY: caller contract (the QP is live); the application reads this
                    // field, nothing else writes it concurrently by ibverbs rules.
                    unsafe { (*qp).state = converted.qp_state.get() };
                }
                0
            }
            Err(e) => report("ibv_modify_qp", &e),
        }
    })
}

/// `ibv_query_qp`: 0, or an errno value.
///
/// # Safety
/// `qp` is a QP of this library; `attr` and `init_attr` are valid for writes.
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard("ibv_query_qp", libc::EIO, || {
        // SAFETY: caller contract.
        let Some(vqp) = (unsafe { VrdmaQp::from_ptr(qp) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() || init_attr.is_null() {
            return libc::EINVAL;
        }
        // Like rdma-core, ask for everything the mask allows; the device fills what it has.
        let Some(mask) = QpAttrMask::from_bits(mask as u32 & QpAttrMask::ALL.bits()) else {
            return libc::EINVAL;
        };
        match vqp.qp.query(mask) {
            Ok((queried, _valid)) => {
                let init = ibv_qp_init_attr {
                    qp_context: vqp.ibv.qp_base.qp_context,
                    send_cq: vqp.ibv.qp_base.send_cq,
                    recv_cq: vqp.ibv.qp_base.recv_cq,
                    srq: vqp.ibv.qp_base.srq,
                    cap: caps_to(&vqp.qp.caps()),
                    qp_type: vqp.ibv.qp_base.qp_type,
                    sq_sig_all: c_int::from(vqp.sq_sig_all),
                };
                // SAFETY: caller contract.
                unsafe {
                    attr.write(qp_attr_to(&queried));
                    init_attr.write(init);
                    (*qp).state = queried.qp_state.get();
                }
                0
            }
            Err(e) => report("ibv_query_qp", &e),
        }
    })
}

/// `ibv_destroy_qp`: waits until every asynchronous event handed out for the QP was
/// acknowledged, as rdma-core does; 0, or an errno value.
///
/// # Safety
/// `qp` is a QP of this library, not used afterwards.
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard("ibv_destroy_qp", libc::EIO, || {
        // SAFETY: caller contract.
        let Some(live) = (unsafe { VrdmaQp::from_ptr(qp) }) else {
            return libc::EINVAL;
        };
        // Not through the PD's context: the context may be closed (and freed) already.
        live.async_events
            .retire(ObjectKind::Qp, live.ibv.qp_base.handle, qp as usize);
        // SAFETY: made by Box::into_raw in ibv_create_qp; the caller gives it up.
        let vqp = unsafe { Box::from_raw(qp.cast::<VrdmaQp>()) };
        let (pd, send_cq, recv_cq) = (
            vqp.ibv.qp_base.pd,
            vqp.ibv.qp_base.send_cq,
            vqp.ibv.qp_base.recv_cq,
        );
        let srq = vqp.ibv.qp_base.srq;
        drop(vqp);
        // SAFETY: PD, CQs and SRQ outlive their QPs (their destroy refuses while it exists).
        unsafe {
            if let Some(srq) = VrdmaSrq::from_ptr(srq) {
                srq.users.fetch_sub(1, Ordering::AcqRel);
            }
            if let Some(pd) = VrdmaPd::from_ptr(pd) {
                pd.users.fetch_sub(1, Ordering::AcqRel);
            }
            for cq in [send_cq, recv_cq] {
                if let Some(cq) = VrdmaCq::from_ptr(cq) {
                    cq.users.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::{
        ibv_qp_type_IBV_QPT_RAW_PACKET, ibv_qp_type_IBV_QPT_RC, ibv_qp_type_IBV_QPT_UC,
        ibv_qp_type_IBV_QPT_UD, ibv_qp_type_IBV_QPT_XRC_RECV, ibv_qp_type_IBV_QPT_XRC_SEND,
    };

    #[test]
    fn selected_attributes_convert_and_garbage_elsewhere_is_ignored() {
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = QpState::Rtr as u32;
        a.path_mtu = 5;
        a.dest_qp_num = 0x42;
        a.rq_psn = 0x1234;
        a.max_dest_rd_atomic = 4;
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = 1;
        a.ah_attr.grh.hop_limit = 64;
        a.cur_qp_state = 99; // not selected
        let mask = QpAttrMask::STATE
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER
            | QpAttrMask::AV;
        let attr = qp_attr_from(&a, mask).unwrap();
        assert_eq!(attr.qp_state(), Ok(QpState::Rtr));
        assert_eq!(attr.path_mtu(), Ok(Mtu::Mtu4096));
        assert_eq!(attr.dest_qp_num.get(), 0x42);
        assert_eq!(attr.ah_attr.grh().unwrap().hop_limit, 64);
        assert_eq!(
            attr.cur_qp_state(),
            Ok(QpState::Reset),
            "not selected: default"
        );
        let back = qp_attr_to(&attr);
        assert_eq!((back.qp_state, back.path_mtu, back.rq_psn), (2, 5, 0x1234));
        // Selected but undefined values are refused.
        a.path_mtu = 9;
        assert!(qp_attr_from(&a, mask).is_none());
        a.path_mtu = 5;
        a.qp_access_flags = 0x10; // IBV_ACCESS_MW_BIND
        assert!(qp_attr_from(&a, mask | QpAttrMask::ACCESS_FLAGS).is_none());
    }

    #[test]
    fn rc_uc_and_ud_are_supported() {
        assert_eq!(QpType::try_from(ibv_qp_type_IBV_QPT_RC), Ok(QpType::Rc));
        assert_eq!(QpType::try_from(ibv_qp_type_IBV_QPT_UC), Ok(QpType::Uc));
        assert_eq!(QpType::try_from(ibv_qp_type_IBV_QPT_UD), Ok(QpType::Ud));
        // rxe has no raw-packet or XRC QPs: ibv_create_qp answers EOPNOTSUPP.
        for other in [
            ibv_qp_type_IBV_QPT_RAW_PACKET,
            ibv_qp_type_IBV_QPT_XRC_SEND,
            ibv_qp_type_IBV_QPT_XRC_RECV,
        ] {
            assert_eq!(QpType::try_from(other), Err(other));
        }
    }

    #[test]
    fn uc_connection_attributes_convert() {
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = QpState::Rts as u32;
        a.sq_psn = 0xabcdef;
        // RC's RTS attributes are left uninitialised by a UC application.
        a.path_mtu = 77;
        let attr = qp_attr_from(&a, QpAttrMask::STATE | QpAttrMask::SQ_PSN).unwrap();
        assert_eq!(attr.qp_state(), Ok(QpState::Rts));
        assert_eq!(attr.sq_psn.get(), 0xabcdef);
    }
}

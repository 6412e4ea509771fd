//! Shared receive queues: create (also through `verbs_context.create_srq_ex`), modify (limit,
//! resize), query, destroy. Posting is `ops.post_srq_recv` in [`crate::datapath`].

use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use vrdma::Srq;

use crate::async_events::{AsyncEvents, ObjectKind};
use crate::ffi::{guard, null_with, report};
use crate::objects::VrdmaPd;
use crate::sys::{
    ibv_context, ibv_pd, ibv_srq, ibv_srq_attr, ibv_srq_attr_mask_IBV_SRQ_LIMIT,
    ibv_srq_attr_mask_IBV_SRQ_MAX_WR, ibv_srq_init_attr, ibv_srq_init_attr_ex,
    ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_PD as SRQ_ATTR_PD,
    ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_RESERVED as SRQ_ATTR_RESERVED,
    ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_TYPE as SRQ_ATTR_TYPE, ibv_srq_type_IBV_SRQT_BASIC,
};

/// A shared receive queue: `ibv_srq` first.
#[repr(C)]
pub(crate) struct VrdmaSrq {
    pub(crate) ibv: ibv_srq,
    pub(crate) srq: Srq,
    /// QPs attached to the SRQ and not destroyed yet.
    pub(crate) users: AtomicU32,
    /// The context's asynchronous events, held by the SRQ (see `VrdmaQp::async_events`).
    async_events: Arc<AsyncEvents>,
}

impl VrdmaSrq {
    /// # Safety
    /// `ptr` is NULL or a live SRQ of this library.
    pub(crate) unsafe fn from_ptr<'a>(ptr: *mut ibv_srq) -> Option<&'a VrdmaSrq> {
        // SAFETY: caller contract; `ibv` is the first field of a repr(C) struct.
        unsafe { ptr.cast::<VrdmaSrq>().as_ref() }
    }
}

/// `ibv_create_srq`. The actual `max_wr` and `max_sge` are written back into
/// `srq_init_attr->attr`, as rdma-core does.
///
/// # Safety
/// `pd` is a PD of this library; `srq_init_attr` is valid for reads and writes.
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    srq_init_attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    guard("ibv_create_srq", std::ptr::null_mut(), || {
        // SAFETY: caller contract.
        let (Some(vpd), Some(init)) = (unsafe { (VrdmaPd::from_ptr(pd), srq_init_attr.as_mut()) })
        else {
            return null_with("ibv_create_srq", libc::EINVAL);
        };
        let attr = init.attr;
        let srq = match Srq::new(&vpd.pd, attr.max_wr, attr.max_sge, attr.srq_limit) {
            Ok(srq) => srq,
            Err(e) => return null_with("ibv_create_srq", report("ibv_create_srq", &e)),
        };
        init.attr.max_wr = srq.max_wr();
        init.attr.max_sge = srq.max_sge();
        // SAFETY: all-zero is a valid ibv_srq (glibc's mutex and condition initializers are
        // zero); set below.
        let mut ibv: ibv_srq = unsafe { std::mem::zeroed() };
        ibv.context = vpd.ibv.context;
        ibv.srq_context = init.srq_context;
        ibv.pd = pd;
        ibv.handle = srq.handle();
        vpd.users.fetch_add(1, Ordering::AcqRel);
        let handle = srq.handle();
        let async_events = vpd.context().async_events.clone();
        let srq = VrdmaSrq {
            ibv,
            srq,
            users: AtomicU32::new(0),
            async_events: async_events.clone(),
        };
        let raw = Box::into_raw(Box::new(srq));
        async_events.register(ObjectKind::Srq, handle, raw as usize);
        raw.cast()
    })
}

/// `verbs_context.create_srq_ex` (behind the inline `ibv_create_srq_ex`, which calls
/// `ibv_create_srq` itself for the plainest requests): a basic SRQ, made as `ibv_create_srq`
/// makes it, or NULL and errno as rdma-core: EOPNOTSUPP for `comp_mask` bits it does not know
/// and for XRC and tag-matching SRQs (rxe has neither), EINVAL without a PD of the context.
/// The XRCD, CQ and tag-matching fields of a basic SRQ are not used, as in rdma-core.
///
/// # Safety
/// `context` is a context of this library; `attr` is valid for reads and writes; its PD is
/// NULL or a PD of the context.
pub(crate) unsafe extern "C" fn create_srq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    guard("ibv_create_srq_ex", std::ptr::null_mut(), || {
        // SAFETY: caller contract.
        let Some(init) = (unsafe { attr.as_ref() }) else {
            return null_with("ibv_create_srq_ex", libc::EINVAL);
        };
        if init.comp_mask >= SRQ_ATTR_RESERVED {
            return null_with("ibv_create_srq_ex (comp_mask)", libc::EOPNOTSUPP);
        }
        // SAFETY: caller contract: NULL or a PD of this library.
        let pd_context = unsafe { init.pd.as_ref() }.map(|pd| pd.context);
        if init.comp_mask & SRQ_ATTR_PD == 0 || pd_context != Some(context) {
            return null_with("ibv_create_srq_ex (PD)", libc::EINVAL);
        }
        if init.comp_mask & SRQ_ATTR_TYPE != 0 && init.srq_type != ibv_srq_type_IBV_SRQT_BASIC {
            return null_with("ibv_create_srq_ex (SRQ type)", libc::EOPNOTSUPP);
        }
        // SAFETY: `ibv_srq_init_attr_ex` begins with the fields of `ibv_srq_init_attr` (as
        // rdma-core's own cast in `ibv_create_srq_ex` relies on); caller contract.
        unsafe { ibv_create_srq(init.pd, attr.cast::<ibv_srq_init_attr>()) }
    })
}

/// `ibv_modify_srq`: 0, or an errno value. `IBV_SRQ_MAX_WR` resizes the SRQ (RESIZE_SRQ; the
/// posted receives are kept), `IBV_SRQ_LIMIT` arms the limit event; with both, the resize comes
/// first, so that the limit is checked against the new size.
///
/// # Safety
/// `srq` is an SRQ of this library; `attr` is valid for a read.
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    guard("ibv_modify_srq", libc::EIO, || {
        // SAFETY: caller contract.
        let (Some(vsrq), Some(attr)) = (unsafe { (VrdmaSrq::from_ptr(srq), attr.as_ref()) }) else {
            return libc::EINVAL;
        };
        let mask = mask as u32;
        let known = ibv_srq_attr_mask_IBV_SRQ_MAX_WR | ibv_srq_attr_mask_IBV_SRQ_LIMIT;
        if mask == 0 || mask & !known != 0 {
            return libc::EINVAL;
        }
        if mask & ibv_srq_attr_mask_IBV_SRQ_MAX_WR != 0 {
            if let Err(e) = vsrq.srq.resize(attr.max_wr) {
                return report("ibv_modify_srq (max_wr)", &e);
            }
        }
        if mask & ibv_srq_attr_mask_IBV_SRQ_LIMIT == 0 {
            return 0;
        }
        match vsrq.srq.modify(attr.srq_limit) {
            Ok(()) => 0,
            Err(e) => report("ibv_modify_srq", &e),
        }
    })
}

/// `ibv_query_srq`: 0, or an errno value.
///
/// # Safety
/// `srq` is an SRQ of this library; `attr` is valid for a write.
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    guard("ibv_query_srq", libc::EIO, || {
        // SAFETY: caller contract.
        let Some(vsrq) = (unsafe { VrdmaSrq::from_ptr(srq) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        match vsrq.srq.query() {
            Ok(queried) => {
                // SAFETY: caller contract.
                unsafe {
                    attr.write(ibv_srq_attr {
                        max_wr: queried.max_wr,
                        max_sge: queried.max_sge,
                        srq_limit: queried.srq_limit,
                    })
                };
                0
            }
            Err(e) => report("ibv_query_srq", &e),
        }
    })
}

/// `ibv_destroy_srq`: waits until every asynchronous event handed out for the SRQ was
/// acknowledged, as rdma-core does; 0, EBUSY while QPs use the SRQ, or another errno value.
///
/// # Safety
/// `srq` is an SRQ of this library, not used afterwards on success.
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    guard("ibv_destroy_srq", libc::EIO, || {
        // SAFETY: caller contract.
        let Some(vsrq) = (unsafe { VrdmaSrq::from_ptr(srq) }) else {
            return libc::EINVAL;
        };
        if vsrq.users.load(Ordering::Acquire) != 0 {
            return libc::EBUSY;
        }
        // Not through the PD's context: the context may be closed (and freed) already.
        vsrq.async_events
            .retire(ObjectKind::Srq, vsrq.ibv.handle, srq as usize);
        // SAFETY: made by Box::into_raw in ibv_create_srq; the caller gives it up.
        let vsrq = unsafe { Box::from_raw(srq.cast::<VrdmaSrq>()) };
        let pd = vsrq.ibv.pd;
        drop(vsrq);
        // SAFETY: the PD outlives its SRQs (ibv_dealloc_pd refuses while they exist).
        if let Some(pd) = unsafe { VrdmaPd::from_ptr(pd) } {
            pd.users.fetch_sub(1, Ordering::AcqRel);
        }
        0
    })
}

//! QPs, SRQs and endpoints of ids: `rdma_create_qp(_ex)`, `rdma_destroy_qp`,
//! `rdma_create_srq(_ex)`, `rdma_destroy_srq`, `rdma_create_ep`, `rdma_destroy_ep` and
//! `rdma_get_request`, as librdmacm does them: CQs and completion channels made for the id
//! when the application gives none (the `rdma_verbs.h` helpers poll them), the QP moved to
//! INIT with the device's attributes (UD on to RTS).

use std::ffi::c_int;

use vrdma::verbs::{QpAttrMask, QpState};

use super::cm_id::{modify_qp, CmIdPriv};
use super::device::fail;
use super::event::complete;
use super::id::{
    rdma_bind_addr, rdma_create_id, rdma_destroy_id, rdma_resolve_addr, rdma_resolve_route,
};
use crate::cq::{
    create_many, ibv_create_comp_channel, ibv_destroy_comp_channel, ibv_destroy_cq, CqSpec,
};
use crate::ffi::{errno, guard};
use crate::qp::{ibv_create_qp, ibv_destroy_qp, VrdmaQp};
use crate::srq::{create_srq_ex, ibv_destroy_srq};
use crate::sys::*;

/// How long `rdma_create_ep` waits for address and route resolution (librdmacm's 2000 ms).
const EP_RESOLVE_MS: c_int = 2000;

/// Makes the CQs (with completion channels) `attr` lacks, on the id's context, in one batch
/// of commands (one round trip for both). What was made is recorded in the id (and
/// [`destroy_cqs`] unwinds it) even when the other failed.
///
/// # Safety
/// `id` is a live id of this library.
unsafe fn make_cqs(
    id: *mut rdma_cm_id,
    send: &mut *mut ibv_cq,
    recv: &mut *mut ibv_cq,
    send_wr: u32,
    recv_wr: u32,
) -> Result<bool, c_int> {
    // SAFETY: caller contract.
    let verbs = unsafe { CmIdPriv::of(id) }.ok_or(libc::EINVAL)?.ctx;
    // SAFETY: caller contract: a live id, whose fields are this library's to write.
    let fields = unsafe {
        [
            (&raw mut (*id).recv_cq_channel, &raw mut (*id).recv_cq),
            (&raw mut (*id).send_cq_channel, &raw mut (*id).send_cq),
        ]
    };
    let mut wanted = Vec::with_capacity(2);
    for ((cq, depth), fields) in [(recv, recv_wr), (send, send_wr)].into_iter().zip(fields) {
        if !cq.is_null() {
            continue;
        }
        // SAFETY: a live context of this library.
        let channel = unsafe { ibv_create_comp_channel(verbs) };
        if channel.is_null() {
            let e = errno();
            for (_, _, channel, _) in wanted {
                // SAFETY: a channel just made, unused.
                unsafe { ibv_destroy_comp_channel(channel) };
            }
            return Err(e);
        }
        wanted.push((cq, depth, channel, fields));
    }
    if wanted.is_empty() {
        return Ok(false);
    }
    let specs: Vec<CqSpec> = wanted
        .iter()
        .map(|&(_, depth, channel, _)| CqSpec {
            cqe: depth.max(1),
            cq_context: id.cast(),
            channel,
        })
        .collect();
    // SAFETY: a live context of this library and channels of it.
    let made = unsafe { create_many(verbs, &specs) };
    let mut failure = None;
    for ((cq, _, channel, (channel_field, cq_field)), result) in wanted.into_iter().zip(made) {
        match result {
            Ok(made_cq) => {
                let made_cq: *mut ibv_cq = made_cq.cast();
                // SAFETY: caller contract.
                unsafe {
                    channel_field.write(channel);
                    cq_field.write(made_cq);
                }
                *cq = made_cq;
            }
            Err(e) => {
                // SAFETY: the channel just made, unused.
                unsafe { ibv_destroy_comp_channel(channel) };
                failure.get_or_insert(e);
            }
        }
    }
    failure.map_or(Ok(true), Err)
}

/// Destroys the CQs and channels `make_cqs` made for the id.
///
/// # Safety
/// `id` is a live id of this library whose QP is gone.
unsafe fn destroy_cqs(id: *mut rdma_cm_id) {
    // SAFETY: caller contract.
    unsafe {
        for cq in [&raw mut (*id).send_cq, &raw mut (*id).recv_cq] {
            let c = cq.replace(std::ptr::null_mut());
            if !c.is_null() {
                ibv_destroy_cq(c);
            }
        }
        for channel in [
            &raw mut (*id).send_cq_channel,
            &raw mut (*id).recv_cq_channel,
        ] {
            let c = channel.replace(std::ptr::null_mut());
            if !c.is_null() {
                ibv_destroy_comp_channel(c);
            }
        }
    }
}

/// Moves a new QP of the id to INIT (UD: to RTS), with the device's attributes.
///
/// # Safety
/// `id` is a live id of this library with a QP.
unsafe fn ready_qp(id: *mut rdma_cm_id) -> Result<(), c_int> {
    // SAFETY: caller contract.
    unsafe { modify_qp(id, QpState::Init, None)? };
    // SAFETY: caller contract.
    if unsafe { (*id).qp_type } != ibv_qp_type_IBV_QPT_UD {
        return Ok(());
    }
    // SAFETY: caller contract.
    let Some(qp) = (unsafe { VrdmaQp::from_ptr((*id).qp) }) else {
        return Err(libc::EINVAL);
    };
    let mut attr: vrdma::verbs::QpAttr = zerocopy::FromZeros::new_zeroed();
    attr.qp_state = vrdma::spec::Le32::new(QpState::Rtr as u32);
    qp.qp
        .modify(&attr, QpAttrMask::STATE)
        .map_err(|e| crate::ffi::errno_of(&e))?;
    attr.qp_state = vrdma::spec::Le32::new(QpState::Rts as u32);
    qp.qp
        .modify(&attr, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
        .map_err(|e| crate::ffi::errno_of(&e))?;
    // SAFETY: caller contract.
    unsafe { (*(*id).qp).state = QpState::Rts as u32 };
    Ok(())
}

/// `rdma_create_qp`: a QP for the id (on `pd`, or the id's PD), with CQs made when `attr`
/// names none. 0, or -1 with errno.
///
/// # Safety
/// `id` is a live id of this library; `pd` NULL or a PD of the id's context; `attr`
/// readable and writable, its CQs and SRQ NULL or objects of the id's context.
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard("rdma_create_qp", -1, || {
        // SAFETY: caller contract.
        let (Some(p), Some(init)) = (unsafe { (CmIdPriv::of(id), attr.as_mut()) }) else {
            return fail(libc::EINVAL);
        };
        let pd = if pd.is_null() { p.id.pd } else { pd };
        // An id not bound to the device yet has no QP to make (librdmacm: its NULL `verbs`
        // is not the PD's context).
        if !p.id.qp.is_null() || p.id.verbs.is_null() {
            return fail(libc::EINVAL);
        }
        init.qp_type = p.id.qp_type;
        // SAFETY: caller contract.
        let made = match unsafe {
            make_cqs(
                id,
                &mut init.send_cq,
                &mut init.recv_cq,
                init.cap.max_send_wr,
                init.cap.max_recv_wr,
            )
        } {
            Ok(made) => made,
            Err(e) => {
                // SAFETY: caller contract.
                unsafe { destroy_cqs(id) };
                return fail(e);
            }
        };
        p.state.lock().own_cqs = made;
        // SAFETY: caller contract.
        let qp = unsafe { ibv_create_qp(pd, init) };
        if qp.is_null() {
            let e = errno();
            // SAFETY: caller contract.
            unsafe { destroy_cqs(id) };
            return fail(e);
        }
        // SAFETY: caller contract: the id's field is this library's to write.
        unsafe { (*id).qp = qp };
        // SAFETY: the id now has its QP.
        if let Err(e) = unsafe { ready_qp(id) } {
            // SAFETY: caller contract.
            unsafe { destroy_qp(id) };
            return fail(e);
        }
        0
    })
}

/// `rdma_create_qp_ex`: as [`rdma_create_qp`] for the basic attributes (PD, CQs, SRQ,
/// capabilities, `sq_sig_all`); extended ones are `EOPNOTSUPP`.
///
/// # Safety
/// As [`rdma_create_qp`], with `attr` an `ibv_qp_init_attr_ex`.
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    guard("rdma_create_qp_ex", -1, || {
        // SAFETY: caller contract.
        let Some(ex) = (unsafe { attr.as_mut() }) else {
            return fail(libc::EINVAL);
        };
        if ex.comp_mask & !ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_PD != 0 {
            return fail(libc::EOPNOTSUPP);
        }
        let mut init = ibv_qp_init_attr {
            qp_context: ex.qp_context,
            send_cq: ex.send_cq,
            recv_cq: ex.recv_cq,
            srq: ex.srq,
            cap: ex.cap,
            qp_type: ex.qp_type,
            sq_sig_all: ex.sq_sig_all,
        };
        // SAFETY: caller contract.
        let ret = unsafe { rdma_create_qp(id, ex.pd, &mut init) };
        ex.cap = init.cap;
        ex.send_cq = init.send_cq;
        ex.recv_cq = init.recv_cq;
        ret
    })
}

/// Destroys the id's QP and the CQs made for it.
///
/// # Safety
/// `id` is a live id of this library.
unsafe fn destroy_qp(id: *mut rdma_cm_id) {
    // SAFETY: caller contract.
    unsafe {
        let qp = std::mem::replace(&mut (*id).qp, std::ptr::null_mut());
        if !qp.is_null() {
            ibv_destroy_qp(qp);
        }
    }
    // SAFETY: caller contract.
    let Some(p) = (unsafe { CmIdPriv::of(id) }) else {
        return;
    };
    if std::mem::take(&mut p.state.lock().own_cqs) {
        // SAFETY: the QP is gone.
        unsafe { destroy_cqs(id) };
    }
}

/// `rdma_destroy_qp`.
///
/// # Safety
/// `id` is a live id of this library.
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard("rdma_destroy_qp", (), || {
        if !id.is_null() {
            // SAFETY: caller contract.
            unsafe { destroy_qp(id) };
        }
    })
}

/// `rdma_create_srq_ex`: an SRQ for the id (basic attributes only; on the id's PD when the
/// attributes name none).
///
/// # Safety
/// `id` is a live id of this library; `attr` readable and writable.
pub unsafe extern "C" fn rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    guard("rdma_create_srq_ex", -1, || {
        // SAFETY: caller contract.
        let (Some(p), Some(ex)) = (unsafe { (CmIdPriv::of(id), attr.as_mut()) }) else {
            return fail(libc::EINVAL);
        };
        if ex.pd.is_null() {
            ex.pd = p.id.pd;
            ex.comp_mask |= ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_PD;
        }
        // SAFETY: caller contract.
        let srq = unsafe { create_srq_ex(p.ctx, ex) };
        if srq.is_null() {
            return fail(errno());
        }
        // SAFETY: caller contract.
        unsafe { (*id).srq = srq };
        0
    })
}

/// `rdma_create_srq`.
///
/// # Safety
/// `id` is a live id of this library; `pd` NULL or a PD of its context; `attr` readable and
/// writable.
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    guard("rdma_create_srq", -1, || {
        // SAFETY: caller contract.
        let Some(init) = (unsafe { attr.as_mut() }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: all-zero is a valid ibv_srq_init_attr_ex.
        let mut ex: ibv_srq_init_attr_ex = unsafe { std::mem::zeroed() };
        ex.srq_context = init.srq_context;
        ex.attr = init.attr;
        ex.pd = pd;
        ex.comp_mask = if pd.is_null() {
            0
        } else {
            ibv_srq_init_attr_mask_IBV_SRQ_INIT_ATTR_PD
        };
        // SAFETY: caller contract.
        let ret = unsafe { rdma_create_srq_ex(id, &mut ex) };
        init.attr = ex.attr;
        ret
    })
}

/// `rdma_destroy_srq`.
///
/// # Safety
/// `id` is a live id of this library.
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    guard("rdma_destroy_srq", (), || {
        if id.is_null() {
            return;
        }
        // SAFETY: caller contract.
        let srq = unsafe { std::mem::replace(&mut (*id).srq, std::ptr::null_mut()) };
        if !srq.is_null() {
            // SAFETY: the id's SRQ, not used afterwards.
            unsafe { ibv_destroy_srq(srq) };
        }
    })
}

/// `rdma_create_ep`: a synchronous id for `res`: bound for a passive one (its QP attributes
/// kept for `rdma_get_request`), resolved (address and route) with a QP for an active one.
///
/// # Safety
/// `id` valid for a write; `res` a readable `rdma_addrinfo`; `pd` NULL or a PD of this
/// library; `qp_init_attr` NULL or readable and writable.
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard("rdma_create_ep", -1, || {
        // SAFETY: caller contract.
        let Some(res) = (unsafe { res.as_ref() }) else {
            return fail(libc::EINVAL);
        };
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        let mut new = std::ptr::null_mut();
        // SAFETY: a NULL channel (synchronous); `new` is a local.
        if unsafe {
            rdma_create_id(
                std::ptr::null_mut(),
                &mut new,
                std::ptr::null_mut(),
                res.ai_port_space as rdma_port_space,
            )
        } != 0
        {
            return -1;
        }
        if !pd.is_null() {
            // SAFETY: the id just made.
            unsafe { (*new).pd = pd };
        }
        let ret = if res.ai_flags as u32 & RAI_PASSIVE != 0 {
            // SAFETY: caller contract.
            let ret = unsafe { rdma_bind_addr(new, res.ai_src_addr) };
            // SAFETY: caller contract.
            if let Some(attr) = unsafe { qp_init_attr.as_ref() } {
                // SAFETY: the id just made.
                unsafe { CmIdPriv::of(new) }
                    .expect("the id just made")
                    .state
                    .lock()
                    .qp_init_attr = Some(*attr);
            }
            ret
        } else {
            // SAFETY: caller contract; the id just made.
            let mut ret =
                unsafe { rdma_resolve_addr(new, res.ai_src_addr, res.ai_dst_addr, EP_RESOLVE_MS) };
            if ret == 0 {
                // SAFETY: as above.
                ret = unsafe { rdma_resolve_route(new, EP_RESOLVE_MS) };
            }
            if ret == 0 && !qp_init_attr.is_null() {
                // SAFETY: as above.
                ret = unsafe { rdma_create_qp(new, pd, qp_init_attr) };
            }
            ret
        };
        if ret != 0 {
            let e = errno();
            // SAFETY: the id just made, not used afterwards.
            unsafe { rdma_destroy_id(new) };
            return fail(e);
        }
        // SAFETY: caller contract.
        unsafe { id.write(new) };
        0
    })
}

/// `rdma_destroy_ep`: the id's QP, SRQ and the id.
///
/// # Safety
/// `id` is a live id of this library, not used afterwards.
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard("rdma_destroy_ep", (), || {
        if id.is_null() {
            return;
        }
        // SAFETY: caller contract.
        unsafe {
            destroy_qp(id);
            rdma_destroy_srq(id);
            rdma_destroy_id(id);
        }
    })
}

/// `rdma_get_request`: the next connect request of a synchronous listener, with a QP made
/// from the attributes its `rdma_create_ep` was given. 0, or -1 with errno.
///
/// # Safety
/// `listen` is a live id of this library; `id` valid for a write.
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    guard("rdma_get_request", -1, || {
        // SAFETY: caller contract.
        let Some(l) = (unsafe { CmIdPriv::of(listen) }) else {
            return fail(libc::EINVAL);
        };
        if !l.is_sync() || id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: caller contract; waits for the listener's next event into listen->event.
        if unsafe { complete(listen) } != 0 {
            return -1;
        }
        // SAFETY: the event complete() left.
        let event = unsafe { (*listen).event };
        // SAFETY: as above.
        if unsafe { (*event).event } != rdma_cm_event_type_RDMA_CM_EVENT_CONNECT_REQUEST {
            return fail(libc::EINVAL);
        }
        // SAFETY: as above: the request's new id.
        let new = unsafe { (*event).id };
        // The event moves to the new id (librdmacm's `(*id)->event = event`).
        // SAFETY: caller contract; both ids are live.
        unsafe {
            (*listen).event = std::ptr::null_mut();
            (*new).event = event;
        }
        if let Some(mut attr) = l.state.lock().qp_init_attr {
            // SAFETY: the new id, live; `attr` a local copy.
            if unsafe { rdma_create_qp(new, (*listen).pd, &mut attr) } != 0 {
                return -1;
            }
        }
        // SAFETY: caller contract.
        unsafe { id.write(new) };
        0
    })
}

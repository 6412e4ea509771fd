//! `rdma_get_cm_event` and `rdma_ack_cm_event`: the device's events as `struct rdma_cm_event`,
//! with the work librdmacm does for each before the application sees it:
//! - a connect request gets its new id (on the listener's channel, or a channel of its own
//!   when the listener is synchronous) with the listener's context and addresses;
//! - address and route resolution refresh the id's addresses;
//! - a reply (CONNECT_RESPONSE) to an id with a QP moves the QP to RTR and RTS and
//!   establishes the connection, and the application sees ESTABLISHED (CONNECT_ERROR if that
//!   fails);
//! - a rejection moves the id's QP to ERR.

use std::ffi::c_int;

use vrdma::spec::cm::{cm_event, CmEventResp, CM_MAX_PRIVATE_DATA};
use vrdma::verbs::cm::{CmId, ConnParam, PortSpace};
use vrdma::verbs::QpState;

use super::cm_id::{modify_qp, new_id, qp_to_error, set_addresses, CmIdPriv, HOST_DEPTH};
use super::device::fail;
use crate::cm_events::channel::CmChannel;
use crate::ffi::guard;
use crate::objects::ah_attr_to;
use crate::sys::*;

/// An event handed to the application: `rdma_cm_event` first, then what its pointers point at.
#[repr(C)]
struct EventPriv {
    event: rdma_cm_event,
    /// The id whose acknowledgement count this event is on (`None`: a connect request, which
    /// librdmacm counts on nobody).
    counted: Option<*mut CmIdPriv>,
    private_data: [u8; CM_MAX_PRIVATE_DATA],
}

/// `rdma_get_cm_event`: the next event of the channel (blocking unless its fd is
/// non-blocking). 0, or -1 with errno.
///
/// # Safety
/// `channel` is a live channel of this library; `event` is valid for a write.
pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    guard("rdma_get_cm_event", -1, || {
        // SAFETY: caller contract.
        let Some(channel) = (unsafe { CmChannel::from_ptr(channel) }) else {
            return fail(libc::EINVAL);
        };
        if event.is_null() {
            return fail(libc::EINVAL);
        }
        loop {
            let raw = match channel.next() {
                Ok(raw) => raw,
                Err(e) => return fail(e.raw_os_error().unwrap_or(libc::EIO)),
            };
            let delivered = deliver(&channel, &raw);
            log::trace!(
                "vrdma: rdma_get_cm_event: event {} of id {:#x}: {}",
                raw.event.get(),
                raw.id.get(),
                match &delivered {
                    Ok(Some(_)) => "handed out",
                    Ok(None) => "id gone, skipped",
                    Err(_) => "failed",
                }
            );
            match delivered {
                Ok(Some(ready)) => {
                    // SAFETY: caller contract.
                    unsafe { event.write(ready) };
                    return 0;
                }
                Ok(None) => continue,
                Err(errno) => return fail(errno),
            }
        }
    })
}

/// The application's event for `raw`; `None` when its id is gone.
fn deliver(
    channel: &std::sync::Arc<CmChannel>,
    raw: &CmEventResp,
) -> Result<Option<*mut rdma_cm_event>, c_int> {
    let kind = raw.event.get();
    let (id, listener) = if kind == cm_event::CONNECT_REQUEST {
        // Claimed while the request's id is made from it (a request is counted on nobody).
        let Some(listener) = claim(raw.listen_id.get()) else {
            return Ok(None);
        };
        let id = connect_request(channel, listener, raw);
        // SAFETY: claimed above, not handed out.
        unsafe { unclaim(listener) };
        (id?, listener)
    } else {
        // Claimed: counted as handed out from here on (every path below hands it out).
        let Some(id) = claim(raw.id.get()) else {
            return Ok(None);
        };
        (id, std::ptr::null_mut())
    };
    // SAFETY: a live id of this library: claimed above, or a request's new id nobody else
    // knows yet.
    let p = unsafe { &*id.cast::<CmIdPriv>() };
    let mut kind = kind;
    let mut status = raw.status.get() as i32;
    match kind {
        cm_event::ADDR_RESOLVED | cm_event::ROUTE_RESOLVED | cm_event::ESTABLISHED => {
            // SAFETY: as above.
            unsafe { set_addresses(id, raw.src.socket_addr(), raw.dst.socket_addr()) };
        }
        cm_event::CONNECT_RESPONSE if !p.id.qp.is_null() => match establish(id) {
            Ok(()) => kind = cm_event::ESTABLISHED,
            Err(errno) => {
                log::warn!("vrdma: establishing a connection failed (errno {errno})");
                // Wherever the moves stopped, the QP must not send (librdmacm does the same).
                // SAFETY: as above.
                unsafe { qp_to_error(id) };
                let _ = p.with_cm(|cm| cm.reject(&[]));
                kind = cm_event::CONNECT_ERROR;
                status = -errno;
            }
        },
        cm_event::REJECTED => {
            // SAFETY: as above.
            unsafe { qp_to_error(id) };
        }
        _ => {}
    }
    let mut ready = Box::new(EventPriv {
        // SAFETY: all-zero is a valid rdma_cm_event.
        event: unsafe { std::mem::zeroed() },
        counted: (kind != cm_event::CONNECT_REQUEST).then_some(id.cast::<CmIdPriv>()),
        private_data: raw.private_data,
    });
    ready.event.id = id;
    ready.event.listen_id = listener;
    ready.event.event = kind;
    ready.event.status = status;
    let len = raw.private_data_len;
    let data = if len > 0 {
        ready.private_data.as_ptr().cast()
    } else {
        std::ptr::null()
    };
    if p.id.ps == rdma_port_space_RDMA_PS_UDP {
        let ud = rdma_ud_param {
            private_data: data,
            private_data_len: len,
            ah_attr: ah_attr_to(&raw.ah_attr),
            qp_num: raw.qp_num.get(),
            qkey: raw.qkey.get(),
        };
        ready.event.param.ud = ud;
    } else {
        ready.event.param.conn = rdma_conn_param {
            private_data: data,
            private_data_len: len,
            responder_resources: raw.responder_resources,
            initiator_depth: raw.initiator_depth,
            flow_control: raw.flow_control,
            retry_count: raw.retry_count,
            rnr_retry_count: raw.rnr_retry_count,
            srq: raw.srq,
            qp_num: raw.qp_num.get(),
        };
    }
    // `data` points into the box's heap allocation, which stays where it is.
    Ok(Some(Box::into_raw(ready).cast()))
}

/// The id of `handle`, if it was not destroyed, with one more event counted as handed out on
/// it (`given`), so that `rdma_destroy_id` cannot free it while the event is delivered. The
/// caller hands the event out, or [`unclaim`]s it.
fn claim(handle: u32) -> Option<*mut rdma_cm_id> {
    let device = super::device::cm_device().ok()?;
    // SAFETY: the CM's live context.
    unsafe { crate::context::VrdmaContext::of(device.ibv) }
        .cm
        .claim(handle, |id| {
            // SAFETY: a routed id is live: its route goes, under the lock held while this
            // runs, before it is freed.
            unsafe { (*id.cast::<CmIdPriv>()).state.lock().given += 1 };
        })
}

/// Gives back a [`claim`] whose event was not handed out.
///
/// # Safety
/// `id` was claimed and not unclaimed or acknowledged since.
unsafe fn unclaim(id: *mut rdma_cm_id) {
    // SAFETY: caller contract: the claim keeps the id alive.
    let p = unsafe { &*id.cast::<CmIdPriv>() };
    p.state.lock().acknowledged += 1;
    p.acked.notify_all();
}

/// The new id of a connect request on `listener`.
fn connect_request(
    channel: &std::sync::Arc<CmChannel>,
    listener: *mut rdma_cm_id,
    raw: &CmEventResp,
) -> Result<*mut rdma_cm_id, c_int> {
    // SAFETY: a live id (found through its route).
    let l = unsafe { &*listener.cast::<CmIdPriv>() };
    let space = if l.id.ps == rdma_port_space_RDMA_PS_UDP {
        PortSpace::Udp
    } else {
        PortSpace::Tcp
    };
    // SAFETY: the listener's context is a live context of this library.
    let ctx = &unsafe { crate::context::VrdmaContext::of(l.ctx) }.ctx;
    let cm = CmId::from_request(ctx, raw, space).map_err(|e| crate::ffi::errno_of(&e))?;
    // A synchronous listener's requests get channels of their own (librdmacm migrates them).
    let own = (!l.is_sync()).then(|| std::sync::Arc::clone(channel));
    let id = new_id(cm, own, l.id.context, l.id.ps, true)?;

    {
        // The peer's depths are what this side may grant (librdmacm's defaults for accept).
        // SAFETY: the id just made.
        let p = unsafe { &*id.cast::<CmIdPriv>() };
        let mut state = p.state.lock();
        state.responder_resources = state.responder_resources.min(raw.initiator_depth);
        state.initiator_depth = state.initiator_depth.min(raw.responder_resources);
        state.from_request = true;
    }
    // SAFETY: the id just made; its PD is the listener's, as `rdma_get_request` gives it.
    unsafe {
        (*id).pd = l.id.pd;
        set_addresses(id, raw.src.socket_addr(), raw.dst.socket_addr());
    }
    Ok(id)
}

/// The active side's part after the peer's reply: QP to RTR (refreshing INIT first, as the
/// reply may grant reads) and RTS, then the establishing accept.
fn establish(id: *mut rdma_cm_id) -> Result<(), c_int> {
    // SAFETY: a live id of this library with a QP.
    let p = unsafe { &*id.cast::<CmIdPriv>() };
    if p.device_moves_qp() {
        // The device moves the QP of the id's connect and establishes: one round trip. The
        // depths are the ones the reply agreed on (0xff: the host's, as librdmacm takes them
        // after a reply).
        let param = ConnParam {
            responder_resources: HOST_DEPTH,
            initiator_depth: HOST_DEPTH,
            ..Default::default()
        };
        p.with_cm(|cm| cm.accept_moving_qp(None, &param))?;
        // SAFETY: the id has a QP (the caller checked), live while the id has it.
        unsafe { (*(*id).qp).state = QpState::Rts as u32 };
        return Ok(());
    }
    // SAFETY: as above.
    unsafe {
        modify_qp(id, QpState::Init, None)?;
        modify_qp(id, QpState::Rtr, Some((HOST_DEPTH, HOST_DEPTH)))?;
        modify_qp(id, QpState::Rts, Some((HOST_DEPTH, HOST_DEPTH)))?;
        let p = &*id.cast::<CmIdPriv>();
        p.with_cm(|cm| cm.accept(None, &Default::default()))
    }
}

/// `rdma_ack_cm_event`: frees the event; counts it for `rdma_destroy_id`. 0, or -1 with
/// errno.
///
/// # Safety
/// `event` was returned by [`rdma_get_cm_event`] and is not used afterwards.
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    guard("rdma_ack_cm_event", -1, || {
        if event.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: caller contract: the allocation made by deliver.
        let event = unsafe { Box::from_raw(event.cast::<EventPriv>()) };
        if let Some(counted) = event.counted {
            // SAFETY: the id outlives its unacknowledged events (rdma_destroy_id waits).
            let p = unsafe { &*counted };
            p.state.lock().acknowledged += 1;
            p.acked.notify_all();
        }
        0
    })
}

/// Acknowledges the event a synchronous operation left in `id->event`.
///
/// # Safety
/// `id` is a live id of this library.
pub(crate) unsafe fn ack_pending(id: *mut rdma_cm_id) {
    // SAFETY: caller contract.
    let event = unsafe { std::mem::replace(&mut (*id).event, std::ptr::null_mut()) };
    if !event.is_null() {
        // SAFETY: an event this library handed out and nobody acknowledged.
        unsafe { rdma_ack_cm_event(event) };
    }
}

/// For a synchronous id: waits for the operation's event and leaves it in `id->event`; an
/// error status becomes the errno (`ucma_complete`). Asynchronous ids: nothing to do.
///
/// # Safety
/// `id` is a live id of this library.
pub(crate) unsafe fn complete(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: caller contract.
    let Some(p) = (unsafe { CmIdPriv::of(id) }) else {
        return fail(libc::EINVAL);
    };
    if !p.is_sync() {
        return 0;
    }
    // SAFETY: caller contract.
    unsafe { ack_pending(id) };
    let channel = std::ptr::from_ref(&p.channel.lock().c).cast_mut();
    let mut event = std::ptr::null_mut();
    // SAFETY: the id's own live channel; `event` is a local to write.
    if unsafe { rdma_get_cm_event(channel, &mut event) } != 0 {
        return -1;
    }
    // SAFETY: caller contract; the event was just handed out.
    unsafe { (*id).event = event };
    // SAFETY: as above.
    let (kind, status) = unsafe { ((*event).event, (*event).status) };
    if status == 0 {
        return 0;
    }
    if kind == rdma_cm_event_type_RDMA_CM_EVENT_REJECTED {
        fail(libc::ECONNREFUSED)
    } else {
        fail(status.unsigned_abs() as c_int)
    }
}

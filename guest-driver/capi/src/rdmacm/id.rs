//! The commands on rdma_cm ids (`rdma_create_id` … `rdma_get_dst_port`); the id object is in
//! [`super::cm_id`], the waiting of synchronous ids for their events in [`super::event`].

use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::time::Duration;

use vrdma::spec::cm::cm_option;
use vrdma::verbs::cm::{CmId, ConnParam};
use vrdma::verbs::QpState;
use vrdma::VerbsError;

use super::cm_id::{
    device_rd_atomic, external_qp, id_qp, modify_qp, new_id, port_space, qp_to_error,
    refresh_addresses, set_addresses, show_loopback_binding, CmIdPriv,
};
use super::device::{cm_device, fail};
use super::event::{ack_pending, complete};
use super::sockaddr as c_addr;
use crate::cm_events::channel::CmChannel;
use crate::context::VrdmaContext;
use crate::ffi::{errno_of, guard};
use crate::sys::*;

/// The mutable part of an id's bookkeeping.
/// A new id of the device's id `cm`: its `rdma_cm_id` filled from `like` (the listener of a
/// `rdma_create_id`: 0, or -1 with errno.
///
/// # Safety
/// `channel` is NULL or a live channel of this library; `id` is valid for a write.
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
) -> c_int {
    guard("rdma_create_id", -1, || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        let Some((space, _)) = port_space(ps) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: caller contract.
        let channel = unsafe { CmChannel::from_ptr(channel) };
        let device = match cm_device() {
            Ok(device) => device,
            Err(errno) => return fail(errno),
        };
        // SAFETY: a live context of this library.
        let ctx = &unsafe { VrdmaContext::of(device.ibv) }.ctx;
        let cm = match CmId::new(ctx, space) {
            Ok(cm) => cm,
            Err(e) => return fail(errno_of(&e)),
        };
        match new_id(cm, channel, context, ps, false) {
            Ok(new) => {
                // SAFETY: caller contract.
                unsafe { id.write(new) };
                0
            }
            Err(errno) => fail(errno),
        }
    })
}

/// `rdma_destroy_id`: acknowledges the event a synchronous operation left, waits until every
/// event handed out for the id was acknowledged, and destroys it. 0, or -1 with errno.
///
/// # Safety
/// `id` is a live id of this library, not used afterwards.
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_destroy_id", -1, || {
        // SAFETY: caller contract.
        let Some(p) = (unsafe { CmIdPriv::of(id) }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: caller contract: a live id; its pending event is this library's.
        unsafe { ack_pending(id) };
        // No event can claim the id once its route is gone; then those handed out (or being
        // handed out) are waited for.
        p.router.remove(p.handle);
        {
            let mut state = p.state.lock();
            while state.acknowledged < state.given {
                p.acked.wait(&mut state);
            }
        }
        let cm = p.cm.lock().take();
        let result = cm.map(CmId::destroy);
        // SAFETY: caller contract: the allocation made by new_id, not used afterwards.
        drop(unsafe { Box::from_raw(id.cast::<CmIdPriv>()) });
        match result {
            Some(Err(e)) => fail(errno_of(&e)),
            _ => 0,
        }
    })
}

/// Runs a command on the id behind `id`: 0, or -1 with errno.
///
/// # Safety
/// `id` is NULL or a live id of this library.
unsafe fn run(id: *mut rdma_cm_id, f: impl FnOnce(&CmId) -> Result<(), VerbsError>) -> c_int {
    // SAFETY: caller contract.
    let Some(p) = (unsafe { CmIdPriv::of(id) }) else {
        return fail(libc::EINVAL);
    };
    match p.with_cm(f) {
        Ok(()) => 0,
        Err(errno) => fail(errno),
    }
}

/// The calling thread's errno.
fn errno_now() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `rdma_bind_addr`.
///
/// # Safety
/// `id` is a live id of this library; `addr` a readable socket address.
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    guard("rdma_bind_addr", -1, || {
        // SAFETY: caller contract.
        let Some(addr) = (unsafe { c_addr::read(addr) }) else {
            return fail(libc::EAFNOSUPPORT);
        };
        // SAFETY: caller contract.
        let ret = unsafe { run(id, |cm| cm.bind(addr)) };
        if ret != 0 && errno_now() == libc::EBUSY {
            // The device's BUSY for a bind: the address and port are taken, as the kernel
            // says it.
            crate::ffi::set_errno(libc::EADDRINUSE);
        }
        if ret == 0 {
            if addr.ip().to_canonical().is_loopback() {
                // SAFETY: caller contract.
                unsafe { show_loopback_binding(id, addr) };
            } else if addr.port() == 0 {
                // The device chose the port: ask it.
                // SAFETY: caller contract.
                unsafe { refresh_addresses(id) };
            } else {
                // Bound as asked (a wildcard stays a wildcard): no round trip, which also
                // matters to programs that race their peer to a listen (perftest -R).
                // SAFETY: caller contract.
                unsafe { set_addresses(id, Some(addr), None) };
            }
        }
        ret
    })
}

/// `rdma_resolve_addr`.
///
/// # Safety
/// `id` is a live id of this library; `src` NULL or readable; `dst` readable.
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut sockaddr,
    dst: *mut sockaddr,
    timeout_ms: c_int,
) -> c_int {
    guard("rdma_resolve_addr", -1, || {
        // SAFETY: caller contract.
        let (src, dst) = unsafe { (c_addr::read(src), c_addr::read(dst)) };
        let Some(dst) = dst else {
            return fail(libc::EAFNOSUPPORT);
        };
        let timeout = Duration::from_millis(timeout_ms.max(0) as u64);
        // SAFETY: caller contract.
        let ret = unsafe { run(id, |cm| cm.resolve_addr(src, dst, timeout)) };
        if ret != 0 {
            return ret;
        }
        // SAFETY: caller contract.
        unsafe {
            set_addresses(id, None, Some(dst));
            complete(id)
        }
    })
}

/// `rdma_resolve_route`.
///
/// # Safety
/// `id` is a live id of this library.
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int {
    guard("rdma_resolve_route", -1, || {
        let timeout = Duration::from_millis(timeout_ms.max(0) as u64);
        // SAFETY: caller contract.
        let ret = unsafe { run(id, |cm| cm.resolve_route(timeout)) };
        if ret != 0 {
            return ret;
        }
        // SAFETY: caller contract.
        unsafe { complete(id) }
    })
}

/// `rdma_listen`.
///
/// # Safety
/// `id` is a live id of this library.
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    guard("rdma_listen", -1, || {
        // The id's address is the one its bind set (the device listens only on bound ids).
        // SAFETY: caller contract.
        unsafe { run(id, |cm| cm.listen(backlog.max(0) as u32)) }
    })
}

/// Applies the application's connection parameters to the id's (librdmacm's
/// `ucma_valid_param` and defaults): `RDMA_MAX_RESP_RES`/`RDMA_MAX_INIT_DEPTH` mean the
/// device's most, larger values are `EINVAL`.
fn take_param(p: &CmIdPriv, param: Option<&rdma_conn_param>) -> Result<(u8, u8, u8, u8), c_int> {
    let (max_resp, max_init) = device_rd_atomic(p.ctx);
    let mut state = p.state.lock();
    let Some(param) = param else {
        return Ok((state.responder_resources, state.initiator_depth, 7, 7));
    };
    let pick = |value: u8, max: u8, all: u32| -> Result<u8, c_int> {
        if u32::from(value) == all {
            Ok(max)
        } else if value > max {
            Err(libc::EINVAL)
        } else {
            Ok(value)
        }
    };
    state.responder_resources = pick(param.responder_resources, max_resp, RDMA_MAX_RESP_RES)?;
    state.initiator_depth = pick(param.initiator_depth, max_init, RDMA_MAX_INIT_DEPTH)?;
    Ok((
        state.responder_resources,
        state.initiator_depth,
        param.retry_count.min(7),
        param.rnr_retry_count.min(7),
    ))
}

/// The private data of `param`.
///
/// # Safety
/// `param` is NULL or its `private_data` is readable for `private_data_len` bytes.
unsafe fn private_data(param: Option<&rdma_conn_param>) -> &[u8] {
    match param {
        Some(p) if !p.private_data.is_null() && p.private_data_len > 0 => {
            // SAFETY: caller contract.
            unsafe { std::slice::from_raw_parts(p.private_data.cast(), p.private_data_len.into()) }
        }
        _ => &[],
    }
}

/// The application's connection parameters in the device's terms (librdmacm's defaults
/// without them).
///
/// # Safety
/// `param` is NULL or its `private_data` is readable for `private_data_len` bytes.
unsafe fn wire_param<'a>(
    p: &CmIdPriv,
    param: Option<&'a rdma_conn_param>,
) -> Result<ConnParam<'a>, c_int> {
    let (responder_resources, initiator_depth, retry_count, rnr_retry_count) =
        take_param(p, param)?;
    Ok(ConnParam {
        // SAFETY: caller contract.
        private_data: unsafe { private_data(param) },
        responder_resources,
        initiator_depth,
        flow_control: param.map_or(1, |c| c.flow_control),
        retry_count,
        rnr_retry_count,
    })
}

/// `rdma_connect`: the id's QP goes to the peer; an id without one connects the QP of its
/// device that `conn_param->qp_num` names (librdmacm's external QP, which the application
/// moves itself after CONNECT_RESPONSE and completes with `rdma_establish`).
///
/// # Safety
/// `id` is a live id of this library; `conn_param` NULL or readable.
pub unsafe extern "C" fn rdma_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    guard("rdma_connect", -1, || {
        // SAFETY: caller contract.
        let (Some(p), param) = (unsafe { (CmIdPriv::of(id), conn_param.as_ref()) }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: caller contract.
        let qp = unsafe { id_qp(id) }
            // SAFETY: caller contract.
            .or_else(|| param.and_then(|c| unsafe { external_qp(p, c.qp_num) }));
        let Some(qp) = qp else {
            log::warn!(
                "vrdma: rdma_connect needs the id's QP (rdma_create_qp) or conn_param->qp_num \
                 of a QP of the id's device"
            );
            return fail(libc::EINVAL);
        };
        // SAFETY: caller contract.
        let wire = match unsafe { wire_param(p, param) } {
            Ok(wire) => wire,
            Err(errno) => return fail(errno),
        };
        if let Err(errno) = p.with_cm(|cm| cm.connect(&qp.qp, &wire)) {
            return fail(errno);
        }
        // SAFETY: caller contract.
        unsafe { complete(id) }
    })
}

/// `rdma_accept`: moves an RC QP to RTS first, then accepts.
///
/// # Safety
/// `id` is a live id of this library; `conn_param` NULL or readable.
pub unsafe extern "C" fn rdma_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    guard("rdma_accept", -1, || {
        // SAFETY: caller contract.
        let (Some(p), param) = (unsafe { (CmIdPriv::of(id), conn_param.as_ref()) }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: caller contract.
        let wire = match unsafe { wire_param(p, param) } {
            Ok(wire) => wire,
            Err(errno) => return fail(errno),
        };
        // SAFETY: caller contract.
        let qp = unsafe { id_qp(id) };
        let rc_qp = qp.filter(|_| p.id.qp_type == ibv_qp_type_IBV_QPT_RC);
        if let Some(qp) = rc_qp.filter(|_| p.device_moves_qp()) {
            // The device moves it through INIT, RTR and RTS (the depths are the wire
            // parameters', as the id's state has them) and accepts: one round trip.
            if let Err(errno) = p.with_cm(|cm| cm.accept_moving_qp(Some(&qp.qp), &wire)) {
                // SAFETY: caller contract.
                unsafe { qp_to_error(id) };
                return fail(errno);
            }
            // SAFETY: caller contract (the QP is live); applications read this field.
            unsafe { (*(*id).qp).state = QpState::Rts as u32 };
            // SAFETY: caller contract.
            return unsafe { complete(id) };
        }
        if rc_qp.is_some() {
            for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
                // SAFETY: caller contract.
                if let Err(errno) = unsafe { modify_qp(id, state, None) } {
                    // SAFETY: as above.
                    unsafe { qp_to_error(id) };
                    return fail(errno);
                }
            }
        }
        // An id without a QP accepts with the external QP `conn_param->qp_num` names (its
        // number goes to the peer; the application moved it itself).
        // SAFETY: caller contract.
        let conn_qp = qp.or_else(|| param.and_then(|c| unsafe { external_qp(p, c.qp_num) }));
        if let Err(errno) = p.with_cm(|cm| cm.accept(conn_qp.map(|q| &q.qp), &wire)) {
            // SAFETY: caller contract.
            unsafe { qp_to_error(id) };
            return fail(errno);
        }
        // SAFETY: caller contract.
        unsafe { complete(id) }
    })
}

/// `rdma_reject`.
///
/// # Safety
/// `id` is a live id of this library; `private_data` readable for `len` bytes.
pub unsafe extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    len: u8,
) -> c_int {
    guard("rdma_reject", -1, || {
        let data = if private_data.is_null() || len == 0 {
            &[][..]
        } else {
            // SAFETY: caller contract.
            unsafe { std::slice::from_raw_parts(private_data.cast::<u8>(), len.into()) }
        };
        // SAFETY: caller contract.
        unsafe { run(id, |cm| cm.reject(data)) }
    })
}

/// `rdma_disconnect`: the id's QP goes to ERR first, as in librdmacm.
///
/// # Safety
/// `id` is a live id of this library.
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_disconnect", -1, || {
        // SAFETY: caller contract.
        unsafe {
            qp_to_error(id);
            run(id, CmId::disconnect)
        }
    })
}

/// `rdma_establish`: after CONNECT_RESPONSE, for an application that moved its QP itself.
///
/// # Safety
/// `id` is a live id of this library.
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_establish", -1, || {
        // SAFETY: caller contract.
        unsafe { run(id, |cm| cm.accept(None, &ConnParam::default())) }
    })
}

/// `rdma_notify`.
///
/// # Safety
/// `id` is a live id of this library.
pub unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, event: ibv_event_type) -> c_int {
    guard("rdma_notify", -1, || {
        // SAFETY: caller contract.
        unsafe { run(id, |cm| cm.notify(event)) }
    })
}

/// `rdma_set_option`: the id options of spec §7.5; `RDMA_OPTION_IB_PATH` (an arbitrary path
/// record) is `EOPNOTSUPP`.
///
/// # Safety
/// `id` is a live id of this library; `optval` readable for `optlen` bytes.
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    guard("rdma_set_option", -1, || {
        if level as u32 != RDMA_OPTION_ID {
            return fail(libc::EOPNOTSUPP);
        }
        if optval.is_null() {
            return fail(libc::EINVAL);
        }
        let name = optname as u32;
        let value = match (name, optlen) {
            (cm_option::TOS | cm_option::ACK_TIMEOUT, 1) => {
                // SAFETY: caller contract: one readable byte.
                u32::from(unsafe { optval.cast::<u8>().read() })
            }
            (cm_option::REUSEADDR | cm_option::AFONLY, 4) => {
                // SAFETY: caller contract: a readable int.
                u32::from(unsafe { optval.cast::<c_int>().read_unaligned() } != 0)
            }
            _ => return fail(libc::EINVAL),
        };
        // SAFETY: caller contract.
        unsafe { run(id, |cm| cm.set_option(name, value)) }
    })
}

/// `rdma_init_qp_attr`: the attributes for `qp_attr->qp_state`, in the application's terms.
///
/// # Safety
/// `id` is a live id of this library; `qp_attr` readable and writable; `qp_attr_mask`
/// writable.
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    guard("rdma_init_qp_attr", -1, || {
        // SAFETY: caller contract.
        let (Some(p), Some(attr)) = (unsafe { (CmIdPriv::of(id), qp_attr.as_mut()) }) else {
            return fail(libc::EINVAL);
        };
        if qp_attr_mask.is_null() {
            return fail(libc::EINVAL);
        }
        let Ok(state) = QpState::try_from(attr.qp_state) else {
            return fail(libc::EINVAL);
        };
        match p.with_cm(|cm| cm.init_qp_attr(state)) {
            Ok((wire, mask)) => {
                *attr = crate::qp::qp_attr_to(&wire);
                // SAFETY: caller contract.
                unsafe { qp_attr_mask.write(mask.bits() as c_int) };
                0
            }
            Err(errno) => fail(errno),
        }
    })
}

/// `rdma_migrate_id`: the id's events (those queued too) go to `channel` from now on; a
/// NULL channel makes the id synchronous with a channel of its own. Waits until its events
/// handed out were acknowledged, as librdmacm does.
///
/// # Safety
/// `id` is a live id of this library; `channel` NULL or a live channel.
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    guard("rdma_migrate_id", -1, || {
        // SAFETY: caller contract.
        let Some(p) = (unsafe { CmIdPriv::of(id) }) else {
            return fail(libc::EINVAL);
        };
        // Migrating to no channel makes the id synchronous, with a channel of its own; one
        // that is already so has nowhere to go (librdmacm's rules).
        let sync = channel.is_null();
        if sync && p.is_sync() {
            return fail(libc::EINVAL);
        }
        // SAFETY: caller contract.
        let target = match unsafe { CmChannel::from_ptr(channel) } {
            Some(channel) => channel,
            None => match CmChannel::new() {
                Ok(channel) => channel,
                Err(e) => return fail(e.raw_os_error().unwrap_or(libc::EMFILE)),
            },
        };
        {
            let mut state = p.state.lock();
            while state.acknowledged < state.given {
                p.acked.wait(&mut state);
            }
        }
        let mut current = p.channel.lock();
        for event in current.take(p.handle) {
            target.push(Box::new(event));
        }
        p.router.migrate(p.handle, Arc::clone(&target));
        // SAFETY: caller contract: the id's field is this library's to write.
        unsafe { (*id).channel = std::ptr::from_ref(&target.c).cast_mut() };
        *current = target;
        // From here its operations no longer wait for their events (a synchronous id that
        // moved to the application's channel: libfabric makes its endpoints' ids so).
        p.set_sync(sync);
        0
    })
}

/// `rdma_get_src_port`: the bound port, in network order.
///
/// # Safety
/// `id` is a live id.
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: caller contract; reading the storage member of the union.
    let storage = unsafe { &(*id).route.addr.__bindgen_anon_1.src_storage };
    c_addr::port_of(storage).to_be()
}

/// `rdma_get_dst_port`: the destination port, in network order.
///
/// # Safety
/// `id` is a live id.
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: caller contract; reading the storage member of the union.
    let storage = unsafe { &(*id).route.addr.__bindgen_anon_2.dst_storage };
    c_addr::port_of(storage).to_be()
}

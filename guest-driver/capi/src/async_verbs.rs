//! `ibv_get_async_event` and `ibv_ack_async_event`: the C entry points over a context's
//! asynchronous event queue ([`crate::async_events`]).

use std::ffi::c_int;

use crate::async_events::ObjectKind;
use crate::context::VrdmaContext;
use crate::ffi::{guard, minus_one};
use crate::sys::{ibv_async_event, ibv_context};

/// `ibv_get_async_event`: the next asynchronous event of `context` (blocking unless the
/// application made `async_fd` non-blocking). 0, or -1 and errno (EAGAIN: none pending on a
/// non-blocking fd; EIO: the device is gone and every event was read).
///
/// # Safety
/// `context` is a context of this library; `event` is valid for a write.
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    guard("ibv_get_async_event", -1, || {
        // SAFETY: caller contract.
        let Some(ctx) = (unsafe { VrdmaContext::from_ptr(context) }) else {
            return minus_one(libc::EINVAL);
        };
        if event.is_null() {
            return minus_one(libc::EINVAL);
        }
        match ctx.async_events.next() {
            Ok(next) => {
                // SAFETY: caller contract.
                unsafe { event.write(next) };
                0
            }
            Err(e) => minus_one(e.raw_os_error().unwrap_or(libc::EIO)),
        }
    })
}

/// `ibv_ack_async_event`: acknowledges an event from [`ibv_get_async_event`]; destroying its
/// CQ, QP or SRQ waits for this.
///
/// # Safety
/// `event` was filled by `ibv_get_async_event` and is acknowledged once; its object is live.
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    guard("ibv_ack_async_event", (), || {
        // SAFETY: caller contract.
        let Some(event) = (unsafe { event.as_ref() }) else {
            return;
        };
        let Some(kind) = ObjectKind::of(event.event_type) else {
            return;
        };
        // SAFETY: caller contract: the element is a live object of the kind its type names.
        let object = unsafe {
            match kind {
                ObjectKind::Cq => event.element.cq.as_ref().map(|o| (o.context, addr(o))),
                ObjectKind::Qp => event.element.qp.as_ref().map(|o| (o.context, addr(o))),
                ObjectKind::Srq => event.element.srq.as_ref().map(|o| (o.context, addr(o))),
            }
        };
        let Some((context, object)) = object else {
            return;
        };
        // SAFETY: the object's context is a live context of this library.
        if let Some(ctx) = unsafe { VrdmaContext::from_ptr(context) } {
            ctx.async_events.ack(kind, object);
        }
    })
}

/// The address of an object, as events carry it.
fn addr<T>(object: &T) -> usize {
    std::ptr::from_ref(object) as usize
}

#[cfg(test)]
mod tests;

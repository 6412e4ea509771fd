//! The host event pump: host completion and async events to guest events (spec §8).
//!
//! The host context has two event sources, both watched by the connection's fast worker:
//! the completion channel (one event per armed CQ that got a completion) and the async event
//! fd (errors, port changes). Each host event names its object by the `user_handle` the
//! device chose at creation; it is translated into this guest's handle, and dropped if the
//! object is gone. The state lock is held from reading an event to queuing it, so an event
//! can never be queued after the DESTROY of its object was answered: the host discards the
//! queued events of an object when it is destroyed, and destruction takes the same lock.

use log::{debug, warn};
use vrdma_spec::event::Subject;
use vrdma_spec::{Event, EventType};

use parking_lot::Mutex;

use crate::guest::objects::EventOwner;
use crate::guest::shared::GuestShared;
use crate::guest::state::GuestState;
use crate::host::{AsyncEvent, AsyncEventKind};
use crate::vhost_device::event_queue::EventClass;
use crate::vhost_device::guest_io::GuestIo;

/// Index of the completion channel in `watched_fds`.
pub const COMP_CHANNEL_FD: usize = 0;
/// Index of the async event fd in `watched_fds`.
pub const ASYNC_FD: usize = 1;

/// Events handled per wake-up; epoll is level-triggered, so the rest come at the next one.
const BATCH: usize = 256;

/// What a host async event means for the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Translation {
    /// An event about a CQ, QP or SRQ.
    Object(EventType),
    /// An event about a port.
    Port(EventType),
    /// The host device failed.
    DeviceFatal,
    /// Nothing the spec carries.
    Ignored,
}

/// The spec event of a host async event kind.
pub fn translate(kind: AsyncEventKind) -> Translation {
    use AsyncEventKind as K;
    match kind {
        K::CqErr => Translation::Object(EventType::CqErr),
        K::QpFatal => Translation::Object(EventType::QpFatal),
        K::QpReqErr => Translation::Object(EventType::QpReqErr),
        K::QpAccessErr => Translation::Object(EventType::QpAccessErr),
        K::CommEst => Translation::Object(EventType::CommEst),
        K::SqDrained => Translation::Object(EventType::SqDrained),
        K::QpLastWqeReached => Translation::Object(EventType::QpLastWqeReached),
        K::SrqErr => Translation::Object(EventType::SrqErr),
        K::SrqLimitReached => Translation::Object(EventType::SrqLimitReached),
        K::PortActive => Translation::Port(EventType::PortActive),
        K::PortErr => Translation::Port(EventType::PortErr),
        K::GidChange => Translation::Port(EventType::GidChange),
        K::DeviceFatal => Translation::DeviceFatal,
        K::PathMig
        | K::PathMigErr
        | K::LidChange
        | K::PkeyChange
        | K::SmChange
        | K::ClientReregister
        | K::WqFatal
        | K::Other(_) => Translation::Ignored,
    }
}

fn push(guest: &GuestShared, guest_io: &GuestIo, event: Event, class: EventClass) {
    if let Err(e) = guest_io.events().push(&event.to_bytes(), class) {
        warn!(
            "guest {}: cannot queue {:?}: {e}",
            guest.id(),
            event.event_type
        );
    }
}

/// The guest handle of a live object named by a host `user_handle`, if it has the subject the
/// event type needs.
fn object_handle(state: &GuestState, user_handle: u64, event_type: EventType) -> Option<u32> {
    let owner = state.owners.get(&user_handle)?;
    match (owner, event_type.subject()) {
        (EventOwner::Cq(h), Subject::Cq) if state.cqs.contains(*h) => Some(h.raw()),
        (EventOwner::Qp(h), Subject::Qp) if state.qps.contains(*h) => Some(h.raw()),
        (EventOwner::Srq(h), Subject::Srq) if state.srqs.contains(*h) => Some(h.raw()),
        _ => None,
    }
}

/// Drains the completion channel into COMPLETION events; for a staged CQ (spec §9.8) the
/// event first has the device copy the host's completions into the guest's ring, and reaches
/// the guest only if it armed the CQ.
pub(crate) fn completions(guest: &GuestShared, state: &Mutex<GuestState>, guest_io: &GuestIo) {
    let mut state = state.lock();
    guest.announce_discard(guest_io, &mut state);
    for _ in 0..BATCH {
        let event = match guest.host().read_comp_event() {
            Ok(Some(event)) => event,
            Ok(None) => return,
            Err(e) => {
                warn!("guest {}: completion channel: {e}", guest.id());
                return;
            }
        };
        if let Some(staged) = state.staged_cq(event.cq_user_handle) {
            // The device's own arming: copy, and raise the guest's event only if it armed
            // (spec §9.8).
            if !staged.on_host_event(guest.host()) {
                continue;
            }
        }
        match object_handle(&state, event.cq_user_handle, EventType::Completion) {
            Some(handle) => push(
                guest,
                guest_io,
                Event {
                    event_type: EventType::Completion,
                    handle,
                    detail: 0,
                },
                EventClass::Completion,
            ),
            None => debug!(
                "guest {}: completion event of unknown CQ {:#x}",
                guest.id(),
                event.cq_user_handle
            ),
        }
    }
}

/// Drains the async event fd into the guest's events. Returns true if the host device reported
/// a fatal error (spec §11.2), which the caller handles once the state lock is released.
pub(crate) fn async_events(
    guest: &GuestShared,
    state: &Mutex<GuestState>,
    guest_io: &GuestIo,
) -> bool {
    let mut fatal = false;
    {
        let mut state = state.lock();
        for _ in 0..BATCH {
            let event = match guest.host().read_async_event() {
                Ok(Some(event)) => event,
                Ok(None) => break,
                Err(e) => {
                    warn!("guest {}: async event fd: {e}", guest.id());
                    break;
                }
            };
            fatal |= deliver_async(guest, guest_io, &mut state, event);
        }
    }
    fatal
}

/// Queues the guest event of one host async event; returns true for a fatal device error.
fn deliver_async(
    guest: &GuestShared,
    guest_io: &GuestIo,
    state: &mut GuestState,
    event: AsyncEvent,
) -> bool {
    match translate(event.kind) {
        Translation::Object(event_type) => {
            let Some(handle) = object_handle(state, event.element, event_type) else {
                debug!(
                    "guest {}: {:?} of unknown object {:#x}",
                    guest.id(),
                    event.kind,
                    event.element
                );
                return false;
            };
            if event_type == EventType::SrqLimitReached {
                // The host disarms the limit when it fires.
                if let Ok(srq) = state
                    .srqs
                    .get_mut(crate::resources::table::Handle::from_raw(handle))
                {
                    srq.srq_limit = 0;
                }
            }
            push(
                guest,
                guest_io,
                Event {
                    event_type,
                    handle,
                    detail: 0,
                },
                EventClass::Async,
            );
            false
        }
        Translation::Port(event_type) => {
            let port = u8::try_from(event.element)
                .map(|port| guest.guest_port(port))
                .unwrap_or(0);
            if port != 0 {
                push(
                    guest,
                    guest_io,
                    Event {
                        event_type,
                        handle: port.into(),
                        detail: 0,
                    },
                    EventClass::Async,
                );
            }
            false
        }
        Translation::DeviceFatal => true,
        Translation::Ignored => {
            debug!("guest {}: ignoring host event {:?}", guest.id(), event.kind);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vrdma_spec::event::Subject;

    #[test]
    fn every_object_event_names_an_object_and_port_events_a_port() {
        for raw in 0..32 {
            let kind = AsyncEventKind::from_kernel(raw);
            match translate(kind) {
                Translation::Object(t) => {
                    assert!(matches!(
                        t.subject(),
                        Subject::Cq | Subject::Qp | Subject::Srq
                    ))
                }
                Translation::Port(t) => assert_eq!(t.subject(), Subject::Port),
                Translation::DeviceFatal => assert_eq!(kind, AsyncEventKind::DeviceFatal),
                Translation::Ignored => {}
            }
        }
        assert_eq!(
            translate(AsyncEventKind::QpLastWqeReached),
            Translation::Object(EventType::QpLastWqeReached)
        );
        assert_eq!(translate(AsyncEventKind::LidChange), Translation::Ignored);
        // Guests cache GID tables and drop them on this event.
        assert_eq!(
            translate(AsyncEventKind::GidChange),
            Translation::Port(EventType::GidChange)
        );
    }
}

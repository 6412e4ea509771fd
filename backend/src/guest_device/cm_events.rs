//! The connection manager's event pump (spec §7.5, §8): every host CM event of the guest's ids
//! becomes one CM_EVENT notification on the event queue, and its full form, translated into
//! the guest's terms, waits in the guest's state for CM_GET_EVENT.
//!
//! A connect request gets a new id of the guest's at once, counted against the guest's id
//! quota and the listener's backlog; over either, the host id is destroyed, which rejects the
//! peer. Other events find their id by the host's id number (ids born of a connect request
//! carry their listener's `uid` until accepted). The state lock is held from reading an event
//! to queuing it, as for the other pumps: a destroyed id's events are dropped by the host and
//! never queued after its CM_DESTROY_ID was answered.

use log::{debug, trace, warn};
use parking_lot::Mutex;
use vrdma_spec::cm::{cm_event, cm_port_space, CmEventResp};
use vrdma_spec::{Event, EventType, Le32};
use zerocopy::FromZeros;

use crate::control::cm::{guest_av, guest_cm_addr};
use crate::guest::cm_ids::{CmIdEntry, PendingCmEvent};
use crate::guest::objects::EventOwner;
use crate::guest::shared::GuestShared;
use crate::guest::state::GuestState;
use crate::host::cm::{CmAddresses, CmEvent, HostCm, PrivateData};
use crate::resources::table::Handle;
use crate::vhost_device::event_queue::EventClass;
use crate::vhost_device::guest_io::GuestIo;

/// Index of the connection manager's fd in `watched_fds`.
pub const CM_FD: usize = 3;

/// Events handled per wake-up; epoll is level-triggered, so the rest come at the next one.
const BATCH: usize = 64;

/// Drains the host CM's events into the guest's pending events.
pub(crate) fn cm_events(guest: &GuestShared, state: &Mutex<GuestState>, guest_io: &GuestIo) {
    let Some(cm) = guest.cm() else { return };
    let mut state = state.lock();
    guest.announce_discard(guest_io, &mut state);
    for _ in 0..BATCH {
        let event = match cm.get_event() {
            Ok(Some(event)) => event,
            Ok(None) => return,
            Err(e) => {
                warn!("guest {}: connection manager: {e}", guest.id());
                return;
            }
        };
        let queued = if event.event == cm_event::CONNECT_REQUEST {
            connect_request(guest, cm, &mut state, &event)
        } else {
            id_event(guest, cm, &mut state, &event)
        };
        if let Some(pending) = queued {
            trace!(
                "guest {}: CM event {} (status {}) of host id {} for id {}",
                guest.id(),
                event.event,
                event.status,
                event.id.0,
                pending.id
            );
            let notice = notice_of(&pending, event.event);
            // In the inbox before the notice is queued: a delivery of the notice may take it.
            state.cm.pending.push(pending);
            notify(guest, guest_io, notice);
        }
    }
}

fn notice_of(pending: &PendingCmEvent, event: u32) -> Event {
    Event {
        event_type: EventType::CmEvent,
        handle: pending.listener.unwrap_or(pending.id).raw(),
        detail: event,
    }
}

fn notify(guest: &GuestShared, guest_io: &GuestIo, notice: Event) {
    if let Err(e) = guest_io
        .events()
        .push(&notice.to_bytes(), EventClass::Async)
    {
        // The event itself still waits for CM_GET_EVENT; EVENTS_LOST tells the driver to ask.
        warn!("guest {}: cannot queue CM_EVENT: {e}", guest.id());
    }
}

/// A connect request on a listener: a new id of the guest's, or the host id destroyed.
fn connect_request(
    guest: &GuestShared,
    cm: &dyn HostCm,
    state: &mut GuestState,
    event: &CmEvent,
) -> Option<PendingCmEvent> {
    let listener = match state.owners.get(&event.uid) {
        Some(&EventOwner::CmId(h)) => h,
        _ => {
            debug!(
                "guest {}: connect request for a listener that is gone",
                guest.id()
            );
            drop_request(guest, cm, event);
            return None;
        }
    };
    let Ok(l) = state.cm.ids.get(listener) else {
        drop_request(guest, cm, event);
        return None;
    };
    let (port_space, guest_scope) = (l.port_space, l.guest_scope);
    if l.loopback && !from_itself(cm, event) {
        debug!(
            "guest {}: listener {listener} is a loopback one: rejecting a request from elsewhere",
            guest.id()
        );
        drop_request(guest, cm, event);
        return None;
    }
    let listener_counters = std::sync::Arc::clone(&l.counters);
    if listener_counters.waiting_requests() >= l.backlog.unwrap_or(0)
        || state.cm.ids.check_room(0).is_err()
    {
        debug!(
            "guest {}: listener {listener}: backlog or id quota full, rejecting a request",
            guest.id()
        );
        drop_request(guest, cm, event);
        return None;
    }
    let uid = state.new_user_handle();
    let mut entry = CmIdEntry::new(event.id, uid, port_space);
    entry.guest_scope = guest_scope;
    let Ok(handle) = state.cm.insert(entry) else {
        drop_request(guest, cm, event);
        return None;
    };
    state.owners.insert(uid, EventOwner::CmId(handle));
    listener_counters.request_waits();
    let body = translate(guest, cm, state, handle, Some(listener), event);
    Some(PendingCmEvent {
        id: handle,
        listener: Some(listener),
        body,
        counted: listener_counters,
    })
}

/// Whether a connect request comes from the very address it is aimed at (the guest talking to
/// itself through loopback); one whose addresses the host cannot tell does not.
fn from_itself(cm: &dyn HostCm, event: &CmEvent) -> bool {
    match cm.query_addr(event.id) {
        Ok(CmAddresses {
            src: Some(local),
            dst: Some(peer),
        }) => local.ip().to_canonical() == peer.ip().to_canonical(),
        _ => false,
    }
}

/// Destroying a connect request's host id rejects the peer.
fn drop_request(guest: &GuestShared, cm: &dyn HostCm, event: &CmEvent) {
    if let Err(e) = cm.destroy_id(event.id) {
        warn!(
            "guest {}: destroying a refused request's CM id {}: {e}",
            guest.id(),
            event.id.0
        );
    }
}

/// Any other event: about an id the guest has.
fn id_event(
    guest: &GuestShared,
    cm: &dyn HostCm,
    state: &mut GuestState,
    event: &CmEvent,
) -> Option<PendingCmEvent> {
    let Some(&handle) = state.cm.by_host.get(&event.id) else {
        debug!(
            "guest {}: CM event {} of an id the guest no longer has",
            guest.id(),
            event.event
        );
        return None;
    };
    let body = translate(guest, cm, state, handle, None, event);
    let counted = std::sync::Arc::clone(&state.cm.ids.get(handle).ok()?.counters);
    Some(PendingCmEvent {
        id: handle,
        listener: None,
        body,
        counted,
    })
}

/// The event in the guest's terms.
fn translate(
    guest: &GuestShared,
    cm: &dyn HostCm,
    state: &GuestState,
    handle: Handle,
    listener: Option<Handle>,
    event: &CmEvent,
) -> Box<CmEventResp> {
    let mut body = Box::new(CmEventResp::new_zeroed());
    body.id = Le32::new(handle.raw());
    body.listen_id = Le32::new(listener.map_or(0, Handle::raw));
    body.event = Le32::new(event.event);
    body.status = Le32::new(event.status as u32);
    let (port_space, scope) = state
        .cm
        .ids
        .get(handle)
        .map_or((cm_port_space::TCP, 0), |e| (e.port_space, e.guest_scope));
    let private_data: PrivateData;
    if port_space == cm_port_space::UDP {
        let ud = &event.params.ud;
        body.qp_num = Le32::new(ud.qp_num);
        body.qkey = Le32::new(ud.qkey);
        let mut av = ud.ah_attr;
        if av.is_global != 0 {
            // The address vector a datagram id learns (a request's, or the reply's with
            // ESTABLISHED): in the guest's terms, or none at all.
            match guest_av(guest, &mut av) {
                Ok(()) => body.ah_attr = av,
                Err(e) => warn!("guest {}: CM event address vector: {e}", guest.id()),
            }
        }
        private_data = ud.private_data;
    } else {
        let c = &event.params.conn;
        body.qp_num = Le32::new(c.qp_num);
        body.responder_resources = c.responder_resources;
        body.initiator_depth = c.initiator_depth;
        body.flow_control = c.flow_control;
        body.retry_count = c.retry_count;
        body.rnr_retry_count = c.rnr_retry_count;
        body.srq = u8::from(c.srq);
        private_data = c.private_data;
    }
    body.private_data_len = private_data.len();
    body.private_data = *private_data.padded();
    let host_id = state.cm.ids.get(handle).map(|e| e.host).unwrap_or(event.id);
    // An id the host is removing may no longer answer: its event then has no addresses.
    let addresses = cm.query_addr(host_id).unwrap_or(CmAddresses {
        src: None,
        dst: None,
    });
    body.src = guest_cm_addr(addresses.src, scope);
    body.dst = guest_cm_addr(addresses.dst, scope);
    body
}

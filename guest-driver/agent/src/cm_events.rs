//! The connection manager's events in VM mode, kept per process.
//!
//! The device keeps one queue of CM events per guest: CM_GET_EVENT answers the next event of
//! any of the guest's ids (spec §7.5). With one PCI function shared by many processes, the
//! agent fetches every event itself, gives each to the process that owns its id (a connect
//! request's new id becomes the listener owner's), and answers each process's CM_GET_EVENT
//! from that process's own queue. It also counts what each process was given: CM_DESTROY_ID
//! must answer how many events of the id the *process* received (librdmacm waits for that many
//! acknowledgements), not how many the agent fetched.
//!
//! Bounds: the device refuses commands that make events once too many are undelivered, but the
//! agent delivers (to itself) at once, so it applies the same rule per process ([`busy`]), and
//! refuses connect requests past it (the caller destroys the new id: the kernel rejects the
//! peer), as the device does past a listener's backlog. Every other event answers one of the
//! process's own commands or ends one of its connections, so it is bounded by its ids.
//!
//! [`busy`]: CmEvents::busy

#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};

use vrdma_spec::cm::{CmEventResp, CM_EVENT_NONE};
use vrdma_spec::{Event, EventType, Status};

use zerocopy::FromZeros;

use crate::ownership::{ClientId, ObjectKind, Ownership};

/// Where one fetched event went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routed {
    /// Queued for this process (tell it: it waits for a CM_EVENT on its event socket).
    Queued(ClientId),
    /// A connect request nobody takes (its listener is gone, or its owner is past a bound):
    /// the caller destroys this new id on the device, which rejects the peer.
    Refused(u32),
    /// An event of an id nobody owns any more (destroyed, or its process left): dropped, as
    /// the device drops the events of a destroyed id.
    Dropped,
}

/// Every process's undelivered CM events and delivery counts.
#[derive(Debug)]
pub struct CmEvents {
    processes: HashMap<ClientId, ProcessEvents>,
    /// Undelivered events past which a process's event-making commands are `BUSY` and its
    /// listeners' connect requests refused.
    limit: usize,
}

#[derive(Debug, Default)]
struct ProcessEvents {
    pending: VecDeque<CmEventResp>,
    /// Per id, the events the process received (a connect request counts against its
    /// listener, as librdmacm counts it).
    delivered: HashMap<u32, u32>,
}

impl CmEvents {
    /// No events yet; at most `limit` undelivered per process (at least 1).
    pub fn new(limit: usize) -> Self {
        CmEvents {
            processes: HashMap::new(),
            limit: limit.max(1),
        }
    }

    /// The bound for `quotas.cm_ids` ids per process: the device's own rule, 4 per id of the
    /// quota and at least 64 (spec §7.5).
    pub fn limit_for(cm_ids: u32) -> usize {
        usize::try_from(cm_ids)
            .unwrap_or(usize::MAX)
            .saturating_mul(4)
            .max(64)
    }

    /// Routes one event the agent fetched from the device. A connect request's new id is
    /// recorded in `ownership` as the listener owner's (charged to its quota).
    pub fn route(&mut self, ownership: &mut Ownership, event: CmEventResp) -> Routed {
        let id = event.id.get();
        let listener = event.listen_id.get();
        if event.event.get() == CM_EVENT_NONE {
            return Routed::Dropped;
        }
        if listener == 0 {
            return match ownership.owner(ObjectKind::CmId, id) {
                Some(owner) => self.queue(owner, event),
                None => Routed::Dropped,
            };
        }
        let Some(owner) = ownership.owner(ObjectKind::CmId, listener) else {
            return Routed::Refused(id);
        };
        if self.busy(owner) || ownership.adopt(owner, ObjectKind::CmId, id).is_err() {
            return Routed::Refused(id);
        }
        self.queue(owner, event)
    }

    fn queue(&mut self, owner: ClientId, event: CmEventResp) -> Routed {
        self.processes
            .entry(owner)
            .or_default()
            .pending
            .push_back(event);
        Routed::Queued(owner)
    }

    /// `client`'s next event (CM_GET_EVENT), counted as delivered.
    pub fn next(&mut self, client: ClientId) -> Option<CmEventResp> {
        let process = self.processes.get_mut(&client)?;
        let event = process.pending.pop_front()?;
        let n = process.delivered.entry(counted_id(&event)).or_default();
        *n = n.saturating_add(1);
        Some(event)
    }

    /// [`CmEvents::next`], or the event number `CM_EVENT_NONE` that says there is none.
    pub fn next_or_none(&mut self, client: ClientId) -> CmEventResp {
        self.next(client).unwrap_or_else(|| {
            let mut none = CmEventResp::new_zeroed();
            none.event = CM_EVENT_NONE.into();
            none
        })
    }

    /// Whether `client` has as many undelivered events as it may: its commands that make the
    /// host queue events answer `BUSY` until it fetches some.
    pub fn busy(&self, client: ClientId) -> bool {
        self.processes
            .get(&client)
            .is_some_and(|p| p.pending.len() >= self.limit)
    }

    /// `client` destroyed `id`: drops the id's undelivered events and answers how many it
    /// received, and the new ids of connect requests to it that it never received (now the
    /// caller's to destroy).
    pub fn destroyed(&mut self, client: ClientId, id: u32) -> (u32, Vec<u32>) {
        let Some(process) = self.processes.get_mut(&client) else {
            return (0, Vec::new());
        };
        let mut orphans = Vec::new();
        process.pending.retain(|event| {
            if event.listen_id.get() == id {
                orphans.push(event.id.get());
                false
            } else {
                event.id.get() != id
            }
        });
        (process.delivered.remove(&id).unwrap_or(0), orphans)
    }

    /// `client` is gone: its queue goes (its ids, connect requests' new ones included, are in
    /// the ownership table and destroyed with its other objects).
    pub fn forget(&mut self, client: ClientId) {
        self.processes.remove(&client);
    }

    /// The status for a command of `client` that would make the host queue an event.
    pub fn admit(&self, client: ClientId) -> Result<(), Status> {
        if self.busy(client) {
            Err(Status::Busy)
        } else {
            Ok(())
        }
    }
}

/// The id an event is counted against and announced for, as librdmacm and the device do:
/// a connect request's listener, else the event's own id.
fn counted_id(event: &CmEventResp) -> u32 {
    match event.listen_id.get() {
        0 => event.id.get(),
        listener => listener,
    }
}

/// The eventq event telling a process that `event` waits for its CM_GET_EVENT, as the device
/// tells a guest: the id (a connect request: its listener) and the rdma_cm event number.
pub fn notice(event: &CmEventResp) -> Event {
    Event {
        event_type: EventType::CmEvent,
        handle: counted_id(event),
        detail: event.event.get(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ownership::Quotas;
    use vrdma_spec::cm::cm_event;
    use vrdma_spec::Le32;

    fn event(id: u32, listener: u32, number: u32) -> CmEventResp {
        let mut e = CmEventResp::new_zeroed();
        e.id = Le32::new(id);
        e.listen_id = Le32::new(listener);
        e.event = Le32::new(number);
        e
    }

    /// An ownership table where client 1 owns CM id 10 and client 2 owns CM id 20.
    fn owned(quota: u32) -> Ownership {
        let mut ownership = Ownership::new(Quotas {
            cm_ids: quota,
            ..Quotas::default()
        });
        for (client, id) in [(1, 10), (2, 20)] {
            ownership.adopt(client, ObjectKind::CmId, id).unwrap();
        }
        ownership
    }

    #[test]
    fn events_go_to_the_owner_of_their_id_and_nobody_else() {
        let mut ownership = owned(8);
        let mut events = CmEvents::new(64);
        let resolved = event(10, 0, cm_event::ADDR_RESOLVED);
        assert_eq!(events.route(&mut ownership, resolved), Routed::Queued(1));
        assert_eq!(events.next(2), None);
        assert_eq!(events.next(1), Some(resolved));
        assert_eq!(events.next(1), None);
        assert_eq!(events.next_or_none(1).event.get(), CM_EVENT_NONE);
        // An id nobody owns: dropped.
        assert_eq!(
            events.route(&mut ownership, event(99, 0, cm_event::ADDR_RESOLVED)),
            Routed::Dropped
        );
        assert_eq!(events.next(1), None);
    }

    #[test]
    fn a_connect_request_makes_its_new_id_the_listener_owners() {
        let mut ownership = owned(8);
        let mut events = CmEvents::new(64);
        let request = event(21, 20, cm_event::CONNECT_REQUEST);
        assert_eq!(events.route(&mut ownership, request), Routed::Queued(2));
        assert_eq!(ownership.owner(ObjectKind::CmId, 21), Some(2));
        // The new id's own events now go to the same process.
        assert_eq!(
            events.route(&mut ownership, event(21, 0, cm_event::ESTABLISHED)),
            Routed::Queued(2)
        );
        // A request to a listener nobody owns is refused: its new id is the caller's to end.
        assert_eq!(
            events.route(&mut ownership, event(31, 30, cm_event::CONNECT_REQUEST)),
            Routed::Refused(31)
        );
        assert_eq!(ownership.owner(ObjectKind::CmId, 31), None);
    }

    #[test]
    fn connect_requests_past_the_quota_or_the_bound_are_refused() {
        // Client 2 owns one id of a quota of two: one request fits, the next does not.
        let mut ownership = owned(2);
        let mut events = CmEvents::new(64);
        let first = event(21, 20, cm_event::CONNECT_REQUEST);
        assert_eq!(events.route(&mut ownership, first), Routed::Queued(2));
        let second = event(22, 20, cm_event::CONNECT_REQUEST);
        assert_eq!(events.route(&mut ownership, second), Routed::Refused(22));
        assert_eq!(ownership.owner(ObjectKind::CmId, 22), None);

        // With room in the quota but a full queue, the same.
        let mut ownership = owned(1000);
        let mut events = CmEvents::new(3);
        for new in 21..24 {
            let request = event(new, 20, cm_event::CONNECT_REQUEST);
            assert_eq!(events.route(&mut ownership, request), Routed::Queued(2));
        }
        assert!(events.busy(2));
        assert_eq!(events.admit(2), Err(Status::Busy));
        assert_eq!(events.admit(1), Ok(()));
        let late = event(24, 20, cm_event::CONNECT_REQUEST);
        assert_eq!(events.route(&mut ownership, late), Routed::Refused(24));
        // Fetching one makes room again.
        assert!(events.next(2).is_some());
        assert_eq!(events.admit(2), Ok(()));
    }

    #[test]
    fn destroying_an_id_answers_what_its_process_received_and_drops_the_rest() {
        let mut ownership = owned(8);
        let mut events = CmEvents::new(64);
        for number in [cm_event::CONNECT_REQUEST, cm_event::CONNECT_REQUEST] {
            let new = 21
                + events
                    .processes
                    .get(&2)
                    .map_or(0, |p| p.pending.len() as u32);
            let routed = events.route(&mut ownership, event(new, 20, number));
            assert_eq!(routed, Routed::Queued(2));
        }
        let closed = event(20, 0, cm_event::DISCONNECTED);
        assert_eq!(events.route(&mut ownership, closed), Routed::Queued(2));
        // The process received the first request only: it counts against the listener.
        assert_eq!(events.next(2).map(|e| e.id.get()), Some(21));
        let (delivered, orphans) = events.destroyed(2, 20);
        assert_eq!((delivered, orphans), (1, vec![22]));
        assert_eq!(events.next(2), None, "the listener's events went with it");
        // A new id's events are counted on their own.
        events.route(&mut ownership, event(21, 0, cm_event::ESTABLISHED));
        events.next(2);
        assert_eq!(events.destroyed(2, 21), (1, Vec::new()));
        assert_eq!(events.destroyed(7, 21), (0, Vec::new()));
    }

    #[test]
    fn a_process_that_left_loses_its_queue() {
        let mut ownership = owned(8);
        let mut events = CmEvents::new(64);
        events.route(&mut ownership, event(10, 0, cm_event::ADDR_RESOLVED));
        events.forget(1);
        assert_eq!(events.next(1), None);
        assert!(!events.busy(1));
    }

    #[test]
    fn a_notice_names_the_id_or_a_requests_listener() {
        let resolved = notice(&event(10, 0, cm_event::ADDR_RESOLVED));
        assert_eq!(
            (resolved.handle, resolved.detail),
            (10, cm_event::ADDR_RESOLVED)
        );
        let request = notice(&event(21, 20, cm_event::CONNECT_REQUEST));
        assert_eq!(request.event_type, EventType::CmEvent);
        assert_eq!(
            (request.handle, request.detail),
            (20, cm_event::CONNECT_REQUEST)
        );
    }

    #[test]
    fn the_bound_follows_the_devices_rule() {
        assert_eq!(CmEvents::limit_for(0), 64);
        assert_eq!(CmEvents::limit_for(1024), 4096);
    }
}

//! A guest's connection-manager ids (spec §7.5): the host id behind each handle, what the
//! device remembers to keep the guest on its own addresses and QPs, and the events waiting
//! for CM_GET_EVENT. Part of the guest's state, under its lock, except the waiting events
//! ([`CmInbox`]), which a delivery into an event buffer also takes from (spec §7.5,
//! `VRDMA_F_CM_EVENT_INLINE`) without the state: a leaf lock, taken after the state's or the
//! event queue's and never holding another.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use vrdma_spec::cm::CmEventResp;

use crate::host::cm::CmId;
use crate::resources::kind::{ResourceError, ResourceKind};
use crate::resources::table::{Handle, HandleTable};

/// One id of the guest.
#[derive(Debug)]
pub struct CmIdEntry {
    /// The host's id.
    pub host: CmId,
    /// Its `uid` on the host (names it in events; `owners` maps it back).
    pub uid: u64,
    /// `vrdma_spec::cm::cm_port_space`: RC or UD.
    pub port_space: u16,
    /// The scope id the guest gave its link-local addresses (written back in answers).
    pub guest_scope: u32,
    /// Bound by CM_BIND to one of the guest's addresses: it may listen.
    pub bound: bool,
    /// Bound to a loopback address (the guest's own address stands for it): as a listener it
    /// takes connect requests from that address only, as a kernel loopback listener gets none
    /// from another machine.
    pub loopback: bool,
    /// Listening, with this many connect requests waiting at most.
    pub backlog: Option<u32>,
    /// The QP of CM_CONNECT or CM_ACCEPT: no other id may connect it.
    pub qp: Option<Handle>,
    /// It sent a connect request (CM_CONNECT): only such an id establishes with a CM_ACCEPT
    /// naming no QP, after the peer's reply.
    pub active: bool,
    /// What deliveries of its events change.
    pub counters: Arc<CmIdCounters>,
}

/// What delivering an id's events changes, shared by the id and its waiting events so that
/// a delivery counts without the guest's state lock.
#[derive(Debug, Default)]
pub struct CmIdCounters {
    /// Events of the id delivered (a listener's connect requests count on it).
    events_delivered: AtomicU32,
    /// Connect requests on this listener not yet delivered.
    waiting_requests: AtomicU32,
}

impl CmIdCounters {
    /// Events of the id delivered so far.
    pub fn events_delivered(&self) -> u32 {
        self.events_delivered.load(Ordering::Acquire)
    }

    /// Connect requests on this listener waiting for delivery.
    pub fn waiting_requests(&self) -> u32 {
        self.waiting_requests.load(Ordering::Acquire)
    }

    /// A connect request on this listener now waits.
    pub fn request_waits(&self) {
        self.waiting_requests.fetch_add(1, Ordering::AcqRel);
    }

    /// A connect request on this listener no longer waits (delivered, or dropped).
    fn request_gone(&self) {
        // Never below zero: every decrement follows its own increment.
        let _ = self
            .waiting_requests
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
}

impl CmIdEntry {
    /// A fresh id of `port_space`.
    pub fn new(host: CmId, uid: u64, port_space: u16) -> CmIdEntry {
        CmIdEntry {
            host,
            uid,
            port_space,
            guest_scope: 0,
            bound: false,
            loopback: false,
            backlog: None,
            qp: None,
            active: false,
            counters: Arc::default(),
        }
    }
}

/// An event translated into the guest's terms, waiting for CM_GET_EVENT.
#[derive(Debug, Clone)]
pub struct PendingCmEvent {
    /// The id it is about (a connect request: the new id).
    pub id: Handle,
    /// A connect request's listener.
    pub listener: Option<Handle>,
    /// The body CM_GET_EVENT answers with.
    pub body: Box<CmEventResp>,
    /// The counters its delivery changes: its listener's for a connect request, else its id's.
    pub counted: Arc<CmIdCounters>,
}

impl PendingCmEvent {
    /// The body, the event counted as delivered.
    fn delivered(self) -> Box<CmEventResp> {
        self.counted.events_delivered.fetch_add(1, Ordering::AcqRel);
        if self.listener.is_some() {
            self.counted.request_gone();
        }
        self.body
    }
}

/// A guest's undelivered CM events, in the order the host gave them.
#[derive(Debug, Default)]
pub struct CmInbox {
    events: Mutex<VecDeque<PendingCmEvent>>,
}

impl CmInbox {
    pub(crate) fn push(&self, event: PendingCmEvent) {
        self.events.lock().push_back(event);
    }

    /// Delivers the oldest waiting event: its body, counted.
    pub fn take_oldest(&self) -> Option<Box<CmEventResp>> {
        let event = self.events.lock().pop_front()?;
        Some(event.delivered())
    }

    /// Events waiting.
    pub fn len(&self) -> usize {
        self.events.lock().len()
    }

    /// True if none waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Every CM id of a guest and its undelivered events.
pub(crate) struct CmIds {
    pub(crate) ids: HandleTable<CmIdEntry>,
    /// The handle of each host id.
    pub(crate) by_host: HashMap<CmId, Handle>,
    /// Events in the order the host gave them.
    pub(crate) pending: Arc<CmInbox>,
}

impl CmIds {
    pub(crate) fn new(limit: u32) -> Result<CmIds, ResourceError> {
        Ok(CmIds {
            ids: HandleTable::new(ResourceKind::CmId, limit)?,
            by_host: HashMap::new(),
            pending: Arc::default(),
        })
    }

    /// Enters a new id.
    pub(crate) fn insert(&mut self, entry: CmIdEntry) -> Result<Handle, ResourceError> {
        let host = entry.host;
        let handle = self.ids.insert(entry)?;
        self.by_host.insert(host, handle);
        Ok(handle)
    }

    /// Forgets an id and its undelivered events; returns it. The waiting connect requests
    /// of a listener are returned too, for the caller to destroy (the guest never saw them),
    /// with every event of theirs dropped. An id removed before its own connect request was
    /// delivered gives its listener's backlog slot back.
    pub(crate) fn remove(
        &mut self,
        handle: Handle,
    ) -> Result<(CmIdEntry, Vec<(Handle, CmIdEntry)>), ResourceError> {
        let entry = self.ids.remove(handle)?;
        self.by_host.remove(&entry.host);
        let mut pending = self.pending.events.lock();
        let orphans: Vec<Handle> = pending
            .iter()
            .filter(|e| e.listener == Some(handle))
            .map(|e| e.id)
            .collect();
        pending.retain(|e| {
            if e.id == handle {
                // Its own connect request, never delivered: its listener's slot comes back.
                if e.listener.is_some() {
                    e.counted.request_gone();
                }
                return false;
            }
            e.listener != Some(handle) && !orphans.contains(&e.id)
        });
        drop(pending);
        let orphans = orphans
            .into_iter()
            .filter_map(|h| {
                let entry = self.ids.remove(h).ok()?;
                self.by_host.remove(&entry.host);
                Some((h, entry))
            })
            .collect();
        Ok((entry, orphans))
    }

    /// Whether the undelivered events reached `limit` (commands that would make more wait).
    pub(crate) fn backlogged(&self, limit: usize) -> bool {
        self.pending.len() >= limit
    }

    /// Ids that named QP `qp` no longer do (it was destroyed).
    pub(crate) fn forget_qp(&mut self, qp: Handle) {
        let named: Vec<Handle> = self
            .ids
            .iter()
            .filter(|(_, e)| e.qp == Some(qp))
            .map(|(h, _)| h)
            .collect();
        for h in named {
            if let Ok(e) = self.ids.get_mut(h) {
                e.qp = None;
            }
        }
    }

    /// The id connected with `qp`, if any.
    pub(crate) fn connecting(&self, qp: Handle) -> Option<Handle> {
        self.ids
            .iter()
            .find_map(|(h, e)| (e.qp == Some(qp)).then_some(h))
    }

    /// Forgets everything (the host ids must be gone already); returns the host ids.
    pub(crate) fn drain(&mut self) -> Vec<CmId> {
        self.pending.events.lock().clear();
        self.by_host.clear();
        self.ids.drain().into_iter().map(|(_, e)| e.host).collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }
}

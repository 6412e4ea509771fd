//! A guest's connection-manager ids (spec §7.5): the host id behind each handle, what the
//! device remembers to keep the guest on its own addresses and QPs, and the events waiting
//! for CM_GET_EVENT. Part of the guest's state, under its lock.

use std::collections::{HashMap, VecDeque};

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
    /// Connect requests on this listener not yet delivered to the guest.
    pub waiting_requests: u32,
    /// The QP of CM_CONNECT or CM_ACCEPT: no other id may connect it.
    pub qp: Option<Handle>,
    /// It sent a connect request (CM_CONNECT): only such an id establishes with a CM_ACCEPT
    /// naming no QP, after the peer's reply.
    pub active: bool,
    /// Events of the id CM_GET_EVENT delivered (a listener's connect requests count on it).
    pub events_delivered: u32,
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
            waiting_requests: 0,
            qp: None,
            active: false,
            events_delivered: 0,
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
}

/// Every CM id of a guest and its undelivered events.
pub(crate) struct CmIds {
    pub(crate) ids: HandleTable<CmIdEntry>,
    /// The handle of each host id.
    pub(crate) by_host: HashMap<CmId, Handle>,
    /// Events in the order the host gave them.
    pub(crate) pending: VecDeque<PendingCmEvent>,
}

impl CmIds {
    pub(crate) fn new(limit: u32) -> Result<CmIds, ResourceError> {
        Ok(CmIds {
            ids: HandleTable::new(ResourceKind::CmId, limit)?,
            by_host: HashMap::new(),
            pending: VecDeque::new(),
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
        let orphans: Vec<Handle> = self
            .pending
            .iter()
            .filter(|e| e.listener == Some(handle))
            .map(|e| e.id)
            .collect();
        let mut freed_slots = Vec::new();
        self.pending.retain(|e| {
            if e.id == handle {
                // Its own connect request, never delivered: its listener's slot comes back.
                freed_slots.extend(e.listener);
                return false;
            }
            e.listener != Some(handle) && !orphans.contains(&e.id)
        });
        for listener in freed_slots {
            if let Ok(l) = self.ids.get_mut(listener) {
                l.waiting_requests = l.waiting_requests.saturating_sub(1);
            }
        }
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
        self.pending.clear();
        self.by_host.clear();
        self.ids.drain().into_iter().map(|(_, e)| e.host).collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }
}

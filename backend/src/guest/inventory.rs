//! A snapshot of everything one guest holds, as its handle tables record it: each object with
//! the host object behind it, its reference count and the objects it references, and the
//! quota and event bookkeeping. Tests and the handler fuzzer compare it with what the host
//! device really holds; nothing on the serving path uses it.

use vrdma_spec::wire::ring_flags;

use super::objects::EventOwner;
use super::state::GuestState;
use crate::memory::queue_region::MappedRing;
use crate::resources::kind::ResourceKind;
use crate::resources::table::Handle;

/// One guest object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldObject {
    /// Its kind.
    pub kind: ResourceKind,
    /// Its guest handle.
    pub handle: u32,
    /// The host object's handle; `None` for an MR revoked by a memory change.
    pub host: Option<u32>,
    /// References other objects hold on it, as its table counts them.
    pub refs: u32,
    /// The objects it holds a reference on (one entry per reference).
    pub holds: Vec<(ResourceKind, u32)>,
    /// Bytes it is charged against a byte quota (live MRs only).
    pub bytes: u64,
    /// Its host `user_handle` (CQs, QPs, SRQs; a CM id's `uid`).
    pub user_handle: Option<u64>,
}

/// Everything one guest holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    /// Every object of every table.
    pub objects: Vec<HeldObject>,
    /// Bytes of live MRs as the MR byte quota counts them.
    pub mr_bytes: u64,
    /// The `user_handle`s events are mapped back through, with the object each names.
    pub event_owners: Vec<(u64, ResourceKind, u32)>,
    /// Memory mappings the guest's objects hold in the daemon, counted from the objects: the
    /// MR windows' (deregistered ones the host still holds included) and one per staged
    /// queue (the device's mapping of its host buffer).
    pub daemon_mappings: u64,
    /// Host AHs the guest destroyed that the host keeps while its forwarded UD sends may
    /// still name them (spec §9.6).
    pub lingering_ahs: Vec<u32>,
}

impl Inventory {
    /// The objects of one kind.
    pub fn of(&self, kind: ResourceKind) -> impl Iterator<Item = &HeldObject> {
        self.objects.iter().filter(move |o| o.kind == kind)
    }
}

fn object(kind: ResourceKind, handle: Handle, host: Option<u32>, refs: u32) -> HeldObject {
    HeldObject {
        kind,
        handle: handle.raw(),
        host,
        refs,
        holds: Vec::new(),
        bytes: 0,
        user_handle: None,
    }
}

impl GuestState {
    /// The snapshot of everything this guest holds.
    pub(crate) fn inventory(&self) -> Inventory {
        use ResourceKind::*;
        let mut objects = Vec::new();
        for (h, e) in self.pds.iter() {
            objects.push(object(Pd, h, Some(e.host.0), self.pds.refs(h).unwrap_or(0)));
        }
        for (h, e) in self.mrs.iter() {
            let mut o = object(Mr, h, e.live.as_ref().map(|l| l.host.handle.0), 0);
            if e.live.is_some() {
                o.holds.push((Pd, e.pd.raw()));
                o.bytes = e.bytes;
            }
            objects.push(o);
        }
        for (h, e) in self.mws.iter() {
            let mut o = object(Mw, h, Some(e.host.handle.0), 0);
            o.holds.push((Pd, e.pd.raw()));
            objects.push(o);
        }
        for (h, e) in self.cqs.iter() {
            let mut o = object(Cq, h, Some(e.host.0), self.cqs.refs(h).unwrap_or(0));
            o.user_handle = Some(e.user_handle);
            objects.push(o);
        }
        for (h, e) in self.qps.iter() {
            let mut o = object(Qp, h, Some(e.host.0), 0);
            o.holds.push((Pd, e.deps.pd.raw()));
            o.holds.push((Cq, e.deps.send_cq.raw()));
            o.holds.push((Cq, e.deps.recv_cq.raw()));
            if let Some(srq) = e.deps.srq {
                o.holds.push((Srq, srq.raw()));
            }
            o.user_handle = Some(e.user_handle);
            objects.push(o);
        }
        for (h, e) in self.srqs.iter() {
            let mut o = object(Srq, h, Some(e.host.0), self.srqs.refs(h).unwrap_or(0));
            o.holds.push((Pd, e.pd.raw()));
            o.user_handle = Some(e.user_handle);
            objects.push(o);
        }
        for (h, e) in self.ahs.iter() {
            let mut o = object(Ah, h, Some(e.host.0), 0);
            o.holds.push((Pd, e.pd.raw()));
            objects.push(o);
        }
        for (h, e) in self.cm.ids.iter() {
            let mut o = object(CmId, h, Some(e.host.0), 0);
            o.user_handle = Some(e.uid);
            objects.push(o);
        }
        let event_owners = self
            .owners
            .iter()
            .map(|(&user_handle, owner)| match *owner {
                EventOwner::Cq(h) => (user_handle, Cq, h.raw()),
                EventOwner::Qp(h) => (user_handle, Qp, h.raw()),
                EventOwner::Srq(h) => (user_handle, Srq, h.raw()),
                EventOwner::CmId(h) => (user_handle, CmId, h.raw()),
            })
            .collect();
        let windows = self
            .mrs
            .iter()
            .filter_map(|(_, e)| e.live.as_ref())
            .chain(self.lingering_mrs.iter().map(|(_, live)| live))
            .map(|live| live.window.mappings());
        let staged = |ring: &MappedRing| ring.desc.flags.get() & ring_flags::STAGED != 0;
        let staged_cqs = self.cqs.iter().filter(|(_, e)| e.staged.is_some()).count();
        let staged_qp_queues = self
            .qps
            .iter()
            .flat_map(|(_, e)| std::iter::once(&e.sq).chain(e.rq.as_ref()))
            .filter(|ring| staged(ring))
            .count();
        Inventory {
            objects,
            mr_bytes: self.mr_bytes,
            event_owners,
            daemon_mappings: windows.sum::<u64>() + (staged_cqs + staged_qp_queues) as u64,
            lingering_ahs: Vec::new(),
        }
    }
}

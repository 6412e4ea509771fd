//! Per-process isolation of device objects.
//!
//! The device knows one namespace of handles per guest (spec §7.3): every process the agent
//! serves would see every other's PDs, MRs, QPs, … if the agent forwarded requests blindly.
//! This module closes that gap. For each raw request a client sends, [`plan`] works out what
//! it names, creates, destroys and which guest memory the device would reach; [`Ownership`]
//! remembers which client owns each live handle, refuses requests that name someone else's
//! handle exactly as the device refuses an unknown one (`BAD_HANDLE`), enforces per-client
//! object quotas, and knows how to tear a client's objects down when it goes away.
//!
//! Isolation rests on PDs: an object can only be created in a PD its client owns, and the
//! device and the host NIC check keys and AHs against the PD of the QP that uses them
//! (spec §9.6, §12), so a client cannot reach another client's objects through the data path
//! either (memory windows excepted, spec §12).
//!
//! The table is not synchronised: a caller that runs commands concurrently must hold it
//! locked from [`Ownership::check`] to [`Ownership::record`] of the same command, or accept
//! that two creates racing from one client may exceed its quota by one.

#![forbid(unsafe_code)]

use std::collections::HashMap;

use vrdma_spec::control::{CmRequest, CmResponseBody, ControlResponse};
use vrdma_spec::wire::HandleReq;
use vrdma_spec::Le32;
use vrdma_spec::{ControlRequest, DecodeError, Opcode, ResponseBody, Status, StatusError};

#[cfg(test)]
mod tests;

/// Identifies one client (application process) of the agent.
pub type ClientId = u64;

/// The object types whose handles are separate namespaces (spec §7.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    /// Protection domain.
    Pd,
    /// Memory region.
    Mr,
    /// Memory window.
    Mw,
    /// Completion queue.
    Cq,
    /// Queue pair.
    Qp,
    /// Shared receive queue.
    Srq,
    /// Address handle.
    Ah,
    /// Connection-manager id.
    CmId,
}

impl ObjectKind {
    /// Every kind.
    pub const ALL: [ObjectKind; 8] = [
        ObjectKind::Pd,
        ObjectKind::Mr,
        ObjectKind::Mw,
        ObjectKind::Cq,
        ObjectKind::Qp,
        ObjectKind::Srq,
        ObjectKind::Ah,
        ObjectKind::CmId,
    ];

    /// Every kind, in the order that destroys a client's objects without `BUSY` (spec §11.1):
    /// connection-manager ids first (an id holds the QP it connected; destroying it ends the
    /// connection before the QP goes, as the kernel's rdma_cm does at exit), then windows (a bound window holds its MR and, type 2, its QP), then QPs (they hold
    /// their CQs, SRQ and PD), SRQs, CQs, AHs, MRs, and PDs last (every other object but a
    /// CQ holds one).
    pub const RELEASE_ORDER: [ObjectKind; 8] = [
        ObjectKind::CmId,
        ObjectKind::Mw,
        ObjectKind::Qp,
        ObjectKind::Srq,
        ObjectKind::Cq,
        ObjectKind::Ah,
        ObjectKind::Mr,
        ObjectKind::Pd,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// What one request needs checked before it is forwarded, and recorded after it succeeded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandPlan {
    /// The request's opcode (needed to decode its response).
    pub opcode: Opcode,
    /// Every handle the request names, in field order (the destroyed one included; handle
    /// fields the request leaves unused, such as CREATE_QP's `srq` 0, are not listed).
    pub names: Vec<(ObjectKind, u32)>,
    /// The kind of object whose new handle a successful response carries.
    pub creates: Option<ObjectKind>,
    /// The handle a successful response releases.
    pub destroys: Option<(ObjectKind, u32)>,
    /// Every guest-physical range `(gpa, len)` the device would map because of the request:
    /// REG_MR's and REREG_MR's page lists as whole pages of the request's page size (adjacent
    /// pages merged), REG_MR_EXTENTS' extents as listed.
    pub guest_ranges: Vec<(u64, u64)>,
}

/// Why the agent refuses a request without forwarding it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A command only the agent itself may send (it affects the whole device).
    #[error("{} is reserved to the agent", .0.name())]
    AgentOnly(Opcode),
    /// A command the agent does not serve.
    #[error("{} is not served through the agent", .0.name())]
    Unsupported(Opcode),
    /// The request does not decode.
    #[error("malformed request: {0}")]
    Malformed(#[from] DecodeError),
}

impl Refusal {
    /// The status to answer the client with.
    pub fn status(&self) -> Status {
        match self {
            Refusal::AgentOnly(_) => Status::Invalid,
            Refusal::Unsupported(_) => Status::Unsupported,
            Refusal::Malformed(e) => e.status(),
        }
    }
}

/// The refusal for commands a client may not send at all, judged by opcode alone.
fn refuse_opcode(op: Opcode) -> Option<Refusal> {
    match op {
        Opcode::SetDoorbellArea | Opcode::DiscardState => Some(Refusal::AgentOnly(op)),
        _ => None,
    }
}

/// Whole pages of `1 << shift` bytes at `pages`, adjacent ones merged into one range.
fn page_ranges(pages: impl Iterator<Item = u64>, shift: u32) -> Vec<(u64, u64)> {
    let size = 1u64 << shift.min(63);
    let mut out: Vec<(u64, u64)> = Vec::new();
    for gpa in pages {
        match out.last_mut() {
            Some((start, len)) if start.checked_add(*len) == Some(gpa) => {
                *len = len.saturating_add(size);
            }
            _ => out.push((gpa, size)),
        }
    }
    out
}

/// Decodes `request` (a whole raw control request) from a client, or says why it must not be
/// forwarded. Commands the client may never send are refused by opcode before their body is
/// looked at.
pub fn decode(request: &[u8]) -> Result<ControlRequest<'_>, Refusal> {
    if let Some(op) = request
        .first_chunk::<2>()
        .and_then(|b| Opcode::try_from(u16::from_le_bytes(*b)).ok())
    {
        if let Some(refusal) = refuse_opcode(op) {
            return Err(refusal);
        }
    }
    Ok(ControlRequest::decode(request)?)
}

/// Works out what `request` (a whole raw control request) names, creates, destroys and
/// reaches, or why it must not be forwarded ([`decode`], then [`plan_of`]).
pub fn plan(request: &[u8]) -> Result<CommandPlan, Refusal> {
    plan_of(&decode(request)?)
}

/// What a decoded request names, creates, destroys and reaches, or why it must not be
/// forwarded.
pub fn plan_of(req: &ControlRequest<'_>) -> Result<CommandPlan, Refusal> {
    let opcode = req.opcode();
    let mut plan = CommandPlan {
        opcode,
        names: Vec::new(),
        creates: None,
        destroys: None,
        guest_ranges: Vec::new(),
    };
    // One object named, and destroyed by the command.
    let destroy = |plan: &mut CommandPlan, kind: ObjectKind, r: &HandleReq| {
        let h = (kind, r.handle.get());
        plan.names.push(h);
        plan.destroys = Some(h);
    };
    use ObjectKind::*;
    match req {
        ControlRequest::QueryDevice
        | ControlRequest::QueryPort(_)
        | ControlRequest::QueryGid(_)
        | ControlRequest::QueryPkey(_)
        | ControlRequest::QueryGidTable(_) => {}
        ControlRequest::Cm(cm) => plan_cm(&mut plan, cm),
        ControlRequest::SetDoorbellArea(_) | ControlRequest::DiscardState => {
            // Refused above by opcode; kept here so that the match stays exhaustive.
            return Err(refuse_opcode(opcode).unwrap_or(Refusal::Unsupported(opcode)));
        }
        ControlRequest::AllocPd => plan.creates = Some(Pd),
        ControlRequest::DeallocPd(r) => destroy(&mut plan, Pd, r),
        ControlRequest::RegMr(m) => {
            plan.names.push((Pd, m.req.pd.get()));
            plan.creates = Some(Mr);
            plan.guest_ranges = page_ranges(m.pages.iter(), m.req.page_shift.get());
        }
        ControlRequest::RegMrExtents(m) => {
            plan.names.push((Pd, m.req.pd.get()));
            plan.creates = Some(Mr);
            plan.guest_ranges = m.extents.iter().collect();
        }
        ControlRequest::ReregMr(m) => {
            plan.names.push((Mr, m.req.mr.get()));
            if let Some(pd) = m.new_pd() {
                plan.names.push((Pd, pd));
            }
            if m.changes_translation() {
                plan.guest_ranges = page_ranges(m.pages.iter(), m.req.page_shift.get());
            }
        }
        ControlRequest::DeregMr(r) => destroy(&mut plan, Mr, r),
        ControlRequest::AllocMw(r) => {
            plan.names.push((Pd, r.pd.get()));
            plan.creates = Some(Mw);
        }
        ControlRequest::DeallocMw(r) => destroy(&mut plan, Mw, r),
        ControlRequest::CreateCq(_) => plan.creates = Some(Cq),
        ControlRequest::DestroyCq(r) => destroy(&mut plan, Cq, r),
        ControlRequest::ArmCq(r) => plan.names.push((Cq, r.cq.get())),
        ControlRequest::ResizeCq(r) => plan.names.push((Cq, r.cq.get())),
        ControlRequest::CreateQp(r) => {
            plan.names.extend([
                (Pd, r.pd.get()),
                (Cq, r.send_cq.get()),
                (Cq, r.recv_cq.get()),
            ]);
            if r.srq.get() != 0 {
                plan.names.push((Srq, r.srq.get()));
            }
            plan.creates = Some(Qp);
        }
        // The attributes hold address vectors inline, never an AH or any other handle.
        ControlRequest::ModifyQp(r) => plan.names.push((Qp, r.qp.get())),
        ControlRequest::QueryQp(r) => plan.names.push((Qp, r.qp.get())),
        ControlRequest::DestroyQp(r) => destroy(&mut plan, Qp, r),
        ControlRequest::CreateSrq(r) => {
            plan.names.push((Pd, r.pd.get()));
            plan.creates = Some(Srq);
        }
        ControlRequest::ModifySrq(r) => plan.names.push((Srq, r.srq.get())),
        ControlRequest::ResizeSrq(r) => plan.names.push((Srq, r.srq.get())),
        ControlRequest::QuerySrq(r) => plan.names.push((Srq, r.handle.get())),
        ControlRequest::DestroySrq(r) => destroy(&mut plan, Srq, r),
        ControlRequest::CreateAh(r) => {
            plan.names.push((Pd, r.pd.get()));
            plan.creates = Some(Ah);
        }
        ControlRequest::DestroyAh(r) => destroy(&mut plan, Ah, r),
    }
    Ok(plan)
}

/// What a connection-manager request names, creates and destroys. CM_GET_EVENT names nothing:
/// the device's events are of every process, so the agent answers it from the caller's own
/// events and never forwards it.
fn plan_cm(plan: &mut CommandPlan, req: &CmRequest) {
    use ObjectKind::{CmId, Qp};
    let id = |plan: &mut CommandPlan, id: &Le32| plan.names.push((CmId, id.get()));
    match req {
        CmRequest::CreateId(_) => plan.creates = Some(CmId),
        CmRequest::DestroyId(r) => {
            plan.names.push((CmId, r.handle.get()));
            plan.destroys = Some((CmId, r.handle.get()));
        }
        CmRequest::Disconnect(r) | CmRequest::QueryAddr(r) => id(plan, &r.handle),
        CmRequest::Bind(r) => id(plan, &r.id),
        CmRequest::ResolveAddr(r) => id(plan, &r.id),
        CmRequest::ResolveRoute(r) => id(plan, &r.id),
        CmRequest::Listen(r) => id(plan, &r.id),
        CmRequest::Reject(r) => id(plan, &r.id),
        CmRequest::InitQpAttr(r) => id(plan, &r.id),
        CmRequest::SetOption(r) => id(plan, &r.id),
        CmRequest::Notify(r) => id(plan, &r.id),
        CmRequest::Connect(r) => {
            id(plan, &r.id);
            plan.names.push((Qp, r.qp.get()));
        }
        CmRequest::MoveQp(r) => {
            id(plan, &r.id);
            plan.names.push((Qp, r.qp.get()));
        }
        CmRequest::Accept(r) => {
            id(plan, &r.id);
            // QP 0: establish the connection CM_CONNECT set up with its QP.
            if r.qp.get() != 0 {
                plan.names.push((Qp, r.qp.get()));
            }
        }
        CmRequest::GetEvent => {}
    }
}

/// True if `response` is a well-formed success response to a request with `opcode`.
pub fn succeeded(opcode: Opcode, response: &[u8]) -> bool {
    matches!(
        ControlResponse::decode(opcode, response),
        Ok(ControlResponse::Ok(_))
    )
}

/// The new handle of kind `kind` that a successful `response` to `opcode` carries; `None` for
/// a failure, a malformed response, a body of another kind, or the never valid handle 0.
pub fn created_handle(kind: ObjectKind, opcode: Opcode, response: &[u8]) -> Option<u32> {
    let Ok(ControlResponse::Ok(body)) = ControlResponse::decode(opcode, response) else {
        return None;
    };
    let handle = match (kind, body) {
        (ObjectKind::Pd, ResponseBody::AllocPd(b)) => b.handle.get(),
        (ObjectKind::Mr, ResponseBody::RegMr(b)) => b.mr.get(),
        (ObjectKind::Mw, ResponseBody::AllocMw(b)) => b.mw.get(),
        (ObjectKind::Cq, ResponseBody::CreateCq(b)) => b.cq.get(),
        (ObjectKind::Qp, ResponseBody::CreateQp(b)) => b.qp.get(),
        (ObjectKind::Srq, ResponseBody::CreateSrq(b)) => b.srq.get(),
        (ObjectKind::Ah, ResponseBody::CreateAh(b)) => b.ah.get(),
        (ObjectKind::CmId, ResponseBody::Cm(CmResponseBody::CreateId(b))) => b.handle.get(),
        _ => return None,
    };
    (handle != 0).then_some(handle)
}

/// Per-client limits on the number of live objects of each kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quotas {
    /// Protection domains.
    pub pds: u32,
    /// Memory regions.
    pub mrs: u32,
    /// Memory windows.
    pub mws: u32,
    /// Completion queues.
    pub cqs: u32,
    /// Queue pairs.
    pub qps: u32,
    /// Shared receive queues.
    pub srqs: u32,
    /// Address handles.
    pub ahs: u32,
    /// Connection-manager ids (a connect request's new id counts against its listener's
    /// owner).
    pub cm_ids: u32,
}

impl Quotas {
    /// The limit for `kind`.
    pub fn limit(&self, kind: ObjectKind) -> u32 {
        match kind {
            ObjectKind::Pd => self.pds,
            ObjectKind::Mr => self.mrs,
            ObjectKind::Mw => self.mws,
            ObjectKind::Cq => self.cqs,
            ObjectKind::Qp => self.qps,
            ObjectKind::Srq => self.srqs,
            ObjectKind::Ah => self.ahs,
            ObjectKind::CmId => self.cm_ids,
        }
    }
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas {
            pds: 64,
            mrs: 4096,
            mws: 1024,
            cqs: 4096,
            qps: 4096,
            srqs: 1024,
            ahs: 4096,
            cm_ids: 1024,
        }
    }
}

/// Live objects of one client, per kind (indexed by [`ObjectKind::index`]).
type Counts = [usize; ObjectKind::ALL.len()];

/// The agent-wide table of which client owns each live device object.
#[derive(Debug)]
pub struct Ownership {
    quotas: Quotas,
    owners: HashMap<(ObjectKind, u32), ClientId>,
    counts: HashMap<ClientId, Counts>,
}

impl Ownership {
    /// An empty table enforcing `quotas`.
    pub fn new(quotas: Quotas) -> Self {
        Ownership {
            quotas,
            owners: HashMap::new(),
            counts: HashMap::new(),
        }
    }

    /// Whether `client` may send the planned request: every named handle must be its own
    /// (`BAD_HANDLE` otherwise, as the device answers for an unknown handle, so other
    /// clients' objects look nonexistent), and a create must stay within its quota (`QUOTA`).
    /// Guest ranges are not checked here.
    pub fn check(&self, client: ClientId, plan: &CommandPlan) -> Result<(), Status> {
        if plan
            .names
            .iter()
            .any(|n| self.owners.get(n) != Some(&client))
        {
            return Err(Status::BadHandle);
        }
        match plan.creates {
            Some(kind) => self.within_quota(client, kind),
            None => Ok(()),
        }
    }

    /// `QUOTA` if `client` already has as many objects of `kind` as it may.
    fn within_quota(&self, client: ClientId, kind: ObjectKind) -> Result<(), Status> {
        let limit = usize::try_from(self.quotas.limit(kind)).unwrap_or(usize::MAX);
        if self.count(client, kind) >= limit {
            return Err(Status::Quota);
        }
        Ok(())
    }

    /// Records the outcome of a forwarded request: on success, the created handle becomes
    /// `client`'s and the destroyed one is forgotten. Failures change nothing.
    ///
    /// Commands of different clients may run on the device between their check and their
    /// record: a handle `client` destroyed may already be another client's new object (the
    /// device reused it, and that client recorded it first). Then the entry is that client's
    /// and stays.
    pub fn record(&mut self, client: ClientId, plan: &CommandPlan, response: &[u8]) {
        if !succeeded(plan.opcode, response) {
            if response.first_chunk::<4>() == Some(&[0; 4]) {
                log::warn!(
                    "{}: undecodable success response of {} bytes; ownership not updated",
                    plan.opcode.name(),
                    response.len()
                );
            }
            return;
        }
        if let Some(kind) = plan.creates {
            match created_handle(kind, plan.opcode, response) {
                Some(handle) => self.insert(client, kind, handle),
                None => log::warn!("{}: success without a {kind:?} handle", plan.opcode.name()),
            }
        }
        if let Some((kind, handle)) = plan.destroys {
            match self.owner(kind, handle) {
                Some(owner) if owner == client => {
                    self.remove(kind, handle);
                }
                Some(owner) => log::debug!(
                    "{kind:?} {handle:#x} client {client} destroyed is client {owner}'s new one"
                ),
                None => log::warn!("destroyed {kind:?} {handle:#x} was not in the table"),
            }
        }
    }

    /// Records `handle` of `kind` as `client`'s although no command of it created it (a
    /// connect request's new CM id is its listener owner's), within its quota (`QUOTA`).
    pub fn adopt(&mut self, client: ClientId, kind: ObjectKind, handle: u32) -> Result<(), Status> {
        self.within_quota(client, kind)?;
        self.insert(client, kind, handle);
        Ok(())
    }

    /// Forgets `handle` of `kind` (destroyed by the agent itself); returns its owner.
    pub fn disown(&mut self, kind: ObjectKind, handle: u32) -> Option<ClientId> {
        self.remove(kind, handle)
    }

    fn insert(&mut self, client: ClientId, kind: ObjectKind, handle: u32) {
        if let Some(old) = self.remove(kind, handle) {
            // The device reused the handle of an object `old` destroyed and has not recorded
            // yet (see `record`).
            log::debug!("new {kind:?} {handle:#x} of client {client} replaces client {old}'s");
        }
        self.owners.insert((kind, handle), client);
        self.counts.entry(client).or_default()[kind.index()] += 1;
    }

    fn remove(&mut self, kind: ObjectKind, handle: u32) -> Option<ClientId> {
        let owner = self.owners.remove(&(kind, handle))?;
        if let Some(c) = self.counts.get_mut(&owner) {
            c[kind.index()] = c[kind.index()].saturating_sub(1);
            if c.iter().all(|&n| n == 0) {
                self.counts.remove(&owner);
            }
        }
        Some(owner)
    }

    fn count(&self, client: ClientId, kind: ObjectKind) -> usize {
        self.counts.get(&client).map_or(0, |c| c[kind.index()])
    }

    /// The client owning `handle` of `kind`, if any (to route events).
    pub fn owner(&self, kind: ObjectKind, handle: u32) -> Option<ClientId> {
        self.owners.get(&(kind, handle)).copied()
    }

    /// Every object of `client`, in an order in which destroying them one after the other
    /// never meets `BUSY` (see [`ObjectKind::RELEASE_ORDER`]); handles ascending within a kind.
    pub fn release_order(&self, client: ClientId) -> Vec<(ObjectKind, u32)> {
        let mut out: Vec<(ObjectKind, u32)> = self
            .owners
            .iter()
            .filter(|(_, &owner)| owner == client)
            .map(|(&key, _)| key)
            .collect();
        out.sort_by_key(|&(kind, handle)| {
            let rank = ObjectKind::RELEASE_ORDER.iter().position(|&k| k == kind);
            (rank, handle)
        });
        out
    }

    /// The encoded request destroying `handle` of `kind`.
    pub fn destroy_request(kind: ObjectKind, handle: u32) -> Vec<u8> {
        let r = HandleReq {
            handle: handle.into(),
            reserved: 0.into(),
        };
        match kind {
            ObjectKind::Pd => ControlRequest::DeallocPd(r),
            ObjectKind::Mr => ControlRequest::DeregMr(r),
            ObjectKind::Mw => ControlRequest::DeallocMw(r),
            ObjectKind::Cq => ControlRequest::DestroyCq(r),
            ObjectKind::Qp => ControlRequest::DestroyQp(r),
            ObjectKind::Srq => ControlRequest::DestroySrq(r),
            ObjectKind::Ah => ControlRequest::DestroyAh(r),
            ObjectKind::CmId => ControlRequest::Cm(CmRequest::DestroyId(r)),
        }
        .to_vec()
    }

    /// Forgets every object `client` still owns (after the agent tried to destroy them);
    /// returns how many there were.
    pub fn forget_client(&mut self, client: ClientId) -> usize {
        let before = self.owners.len();
        self.owners.retain(|_, owner| *owner != client);
        self.counts.remove(&client);
        before - self.owners.len()
    }

    /// How many objects of each kind `client` owns (for logs).
    pub fn counts(&self, client: ClientId) -> [(ObjectKind, usize); ObjectKind::ALL.len()] {
        ObjectKind::ALL.map(|kind| (kind, self.count(client, kind)))
    }

    /// The failure response the device would send with `status`.
    pub fn refusal_response(status: Status) -> Vec<u8> {
        ControlResponse::Err(StatusError::new(status)).to_vec()
    }
}

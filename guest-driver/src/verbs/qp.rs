//! Queue pairs: creation, state changes, and the send/receive data path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use log::{debug, warn};
use parking_lot::{Mutex, MutexGuard};
use vrdma_spec::attr::qp::{QpCaps, UndefinedValue};
use vrdma_spec::control::{ControlRequest, Opcode, ResponseBody};
use vrdma_spec::verbs::{AccessFlags, Gid, Mtu, QpAttrMask, QpState, QpType};
use vrdma_spec::wire::{ring_flags, CreateQpReq, ModifyQpReq, QpAttr, QueryQpReq, QueryQpResp};
use vrdma_spec::{Le16, Le32};

use super::command::{handle_req, nonzero_handle, unexpected_body};
use super::context::ContextInner;
use super::cq::{Cq, CqShared};
use super::error::{PostSendError, ProtocolError, Result, VerbsError};
use super::pd::{Pd, PdInner};
use super::ring::map_ring;
use super::srq::{Srq, SrqShared};
use crate::provider::rxe_v1::{RecvQueue, SendQueue, SendQueueCaps};
use crate::provider::{PostError, RecvWr, SendWr};
use crate::transport::{HostKick, TransportError};

mod connect;

/// What a QP is created with (`ibv_qp_init_attr`).
#[derive(Clone, Copy, Debug)]
pub struct QpInitAttr<'a> {
    /// Transport.
    pub qp_type: QpType,
    /// CQ of send completions.
    pub send_cq: &'a Cq,
    /// CQ of receive completions (may be the same).
    pub recv_cq: &'a Cq,
    /// Requested queue sizes; the device may round them up ([`Qp::caps`]).
    pub caps: QpCaps,
    /// Every send request generates a completion, signaled or not.
    pub sq_sig_all: bool,
}

/// What the peer of a connected (RC or UC) QP tells us about its end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteQp {
    /// Its QP number.
    pub qpn: u32,
    /// The first PSN it sends with (our receive PSN).
    pub psn: u32,
    /// Its GID.
    pub gid: Gid,
    /// Its LID (InfiniBand only; 0 on RoCE).
    pub lid: u16,
}

/// One modification of a batch ([`Qp::modify_many`]).
#[derive(Clone, Copy, Debug)]
pub struct QpChange<'a> {
    /// The QP to modify.
    pub qp: &'a Qp,
    /// Attributes, of which `mask` selects those to apply.
    pub attr: &'a QpAttr,
    /// Which attributes to apply.
    pub mask: QpAttrMask,
}

/// Local settings of a connection; the defaults are those of perftest. A UC connection uses
/// only the path, access and PSN settings: it has no acknowledgements, so no timeouts,
/// retries, RNR timer or read/atomic depths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectOptions {
    /// Local port.
    pub port: u8,
    /// Index of the local GID to send from.
    pub sgid_index: u8,
    /// Remote access granted to the peer.
    pub access: AccessFlags,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Our first send PSN (the peer's receive PSN).
    pub sq_psn: u32,
    /// Local ACK timeout (4.096 µs · 2^timeout).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7 = forever).
    pub rnr_retry: u8,
    /// RNR NAK timer we ask peers to wait.
    pub min_rnr_timer: u8,
    /// Outstanding reads/atomics as initiator; `None`: the device's limit, at most 16.
    pub max_rd_atomic: Option<u8>,
    /// Outstanding reads/atomics as responder; `None`: the device's limit, at most 16.
    pub max_dest_rd_atomic: Option<u8>,
    /// GRH hop limit.
    pub hop_limit: u8,
    /// GRH traffic class.
    pub traffic_class: u8,
    /// Service level.
    pub sl: u8,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            port: 1,
            sgid_index: 0,
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            path_mtu: Mtu::Mtu1024,
            sq_psn: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: None,
            max_dest_rd_atomic: None,
            hop_limit: 64,
            traffic_class: 0,
            sl: 0,
        }
    }
}

/// Default of `max_rd_atomic`/`max_dest_rd_atomic` when the device allows more.
const DEFAULT_RD_ATOMIC: u32 = 16;

/// A queue pair (`ibv_qp`). Destroyed when dropped, before the CQs and PD it uses.
///
/// Posting writes native WQEs straight into the mapped queues. Each queue has a lock of its
/// own, so sends, receives and commands on one QP may come from different threads, and QPs
/// never contend with each other.
pub struct Qp {
    // The queues are declared first: the mappings must not be used after DESTROY_QP.
    sq: Mutex<SendQueue>,
    /// `None` when the QP receives through an SRQ.
    rq: Option<Mutex<RecvQueue>>,
    /// The receive queue is a staging ring (spec §9.7): receives are followed by a doorbell.
    rq_staged: bool,
    /// Sends start the host's processing themselves (spec §5.3) rather than ring.
    host_kick: Option<HostKick>,
    /// Host kicks the kernel refused (each followed by a doorbell).
    refused_kicks: AtomicU64,
    object: QpObject,
    qpn: u32,
    qp_type: QpType,
    doorbell_index: u32,
    caps: QpCaps,
    // Dropped after `object`: DESTROY_QP precedes DESTROY_CQ and DEALLOC_PD.
    _send_cq: Arc<CqShared>,
    _recv_cq: Arc<CqShared>,
    // Dropped after `object`: DESTROY_QP precedes DESTROY_SRQ.
    srq: Option<Arc<SrqShared>>,
}

/// The device object.
struct QpObject {
    pd: Arc<PdInner>,
    handle: u32,
}

impl QpObject {
    fn ctx(&self) -> &ContextInner {
        &self.pd.ctx
    }
}

impl Drop for QpObject {
    fn drop(&mut self) {
        let req = ControlRequest::DestroyQp(handle_req(self.handle));
        if let Err(e) = self.ctx().execute_empty(&req) {
            warn!("DESTROY_QP of QP {:#x} failed: {e}", self.handle);
        }
    }
}

impl Qp {
    /// Creates a QP in `pd` (CREATE_QP) in state RESET and wraps its mapped queues.
    pub fn new(pd: &Pd, init: &QpInitAttr<'_>) -> Result<Qp> {
        Self::create(pd, init, None)
    }

    /// Creates a QP in `pd` that receives through `srq` (CREATE_QP with `srq`; needs the
    /// SRQ feature). The QP has no receive queue of its own: `init.caps.max_recv_wr` and
    /// `max_recv_sge` are ignored.
    pub fn with_srq(pd: &Pd, init: &QpInitAttr<'_>, srq: &Srq) -> Result<Qp> {
        Self::create(pd, init, Some(srq))
    }

    fn create(pd: &Pd, init: &QpInitAttr<'_>, srq: Option<&Srq>) -> Result<Qp> {
        let req = Self::create_request(pd, init, srq)?;
        let resp = pd.inner.ctx.execute(&req)?;
        Self::created(pd, init, srq, resp)
    }

    /// Creates a QP in `pd` for each of `inits` with one batch of CREATE_QP commands (one
    /// round trip where the transport batches); each result is that QP's.
    pub fn create_many(pd: &Pd, inits: &[QpInitAttr<'_>]) -> Result<Vec<Result<Qp>>> {
        let mut requests = Vec::with_capacity(inits.len());
        let mut checked = Vec::with_capacity(inits.len());
        for init in inits {
            match Self::create_request(pd, init, None) {
                Ok(req) => {
                    checked.push(Ok(()));
                    requests.push(req);
                }
                Err(e) => checked.push(Err(e)),
            }
        }
        let mut answers = pd.inner.ctx.execute_batch(&requests)?.into_iter();
        Ok(inits
            .iter()
            .zip(checked)
            .map(|(init, checked)| {
                checked?;
                let resp = answers
                    .next()
                    .ok_or_else(|| unexpected_body(Opcode::CreateQp))??;
                Self::created(pd, init, None, resp)
            })
            .collect())
    }

    /// Checks a creation and builds its CREATE_QP.
    fn create_request(
        pd: &Pd,
        init: &QpInitAttr<'_>,
        srq: Option<&Srq>,
    ) -> Result<ControlRequest<'static>> {
        let ctx = &pd.inner.ctx;
        if !ctx.has_rxe_v1() {
            return Err(VerbsError::Unsupported(
                "QPs need the rxe v1 ring format, which was not negotiated",
            ));
        }
        for cq in [init.send_cq, init.recv_cq] {
            if !Arc::ptr_eq(&cq.shared.ctx, ctx) {
                return Err(VerbsError::InvalidArgument(
                    "the CQs belong to another context than the PD",
                ));
            }
        }
        if let Some(srq) = srq {
            if !Arc::ptr_eq(srq.shared.ctx(), ctx) {
                return Err(VerbsError::InvalidArgument(
                    "the SRQ belongs to another context than the PD",
                ));
            }
        }
        let caps = requested_caps(init, srq);
        let req = ControlRequest::CreateQp(CreateQpReq {
            pd: Le32::new(pd.inner.handle),
            send_cq: Le32::new(init.send_cq.shared.handle),
            recv_cq: Le32::new(init.recv_cq.shared.handle),
            srq: Le32::new(srq.map_or(0, |srq| srq.shared.handle)),
            max_send_wr: Le32::new(caps.max_send_wr),
            max_recv_wr: Le32::new(caps.max_recv_wr),
            max_send_sge: Le32::new(caps.max_send_sge),
            max_recv_sge: Le32::new(caps.max_recv_sge),
            max_inline_data: Le32::new(caps.max_inline_data),
            qp_type: init.qp_type as u8,
            sq_sig_all: u8::from(init.sq_sig_all),
            reserved: Le16::ZERO,
        });
        Ok(req)
    }

    /// The QP a successful CREATE_QP made: checks the answer and maps its queues.
    fn created(
        pd: &Pd,
        init: &QpInitAttr<'_>,
        srq: Option<&Srq>,
        resp: ResponseBody,
    ) -> Result<Qp> {
        let ctx = &pd.inner.ctx;
        let caps = requested_caps(init, srq);
        let ResponseBody::CreateQp(resp) = resp else {
            return Err(unexpected_body(Opcode::CreateQp));
        };
        let handle = nonzero_handle(Opcode::CreateQp, resp.qp.get())?;
        // From here on, dropping `object` (on any error below) destroys the QP again.
        let object = QpObject {
            pd: pd.inner.clone(),
            handle,
        };
        let bad = |field, value: u32| ProtocolError::ResponseValue {
            opcode: Opcode::CreateQp,
            field,
            value: value.into(),
        };
        let doorbell_index = resp.doorbell_index.get();
        if doorbell_index >= ctx.doorbell.slots() {
            return Err(bad("doorbell_index", doorbell_index).into());
        }
        let actual = QpCaps {
            max_send_wr: resp.max_send_wr.get(),
            max_recv_wr: resp.max_recv_wr.get(),
            max_send_sge: resp.max_send_sge.get(),
            max_recv_sge: resp.max_recv_sge.get(),
            max_inline_data: resp.max_inline_data.get(),
        };
        let short = [
            ("max_send_wr", actual.max_send_wr, caps.max_send_wr),
            ("max_recv_wr", actual.max_recv_wr, caps.max_recv_wr),
            ("max_send_sge", actual.max_send_sge, caps.max_send_sge),
            ("max_recv_sge", actual.max_recv_sge, caps.max_recv_sge),
            (
                "max_inline_data",
                actual.max_inline_data,
                caps.max_inline_data,
            ),
        ]
        .into_iter()
        .find(|(_, got, wanted)| got < wanted);
        if let Some((field, got, _)) = short {
            return Err(bad(field, got).into());
        }
        // SAFETY: DESTROY_QP is sent by `object`'s drop, after the queues (declared before it
        // in `Qp`, or dropped on the error paths below before it) are gone; each ring is
        // wrapped once.
        let sq = unsafe { map_ring(ctx, &resp.sq) }?;
        let rq = match srq {
            None => {
                // SAFETY: as for the SQ.
                let ring = unsafe { map_ring(ctx, &resp.rq) }?;
                let rq = RecvQueue::new(ring, actual.max_recv_sge).map_err(ProtocolError::Queue)?;
                if rq.capacity() < actual.max_recv_wr {
                    return Err(bad("max_recv_wr", actual.max_recv_wr).into());
                }
                Some(Mutex::new(rq))
            }
            // Spec §6: the RQ descriptor of a QP attached to an SRQ is all zero.
            Some(_) if resp.rq.map_len.get() != 0 => {
                return Err(bad("rq.map_len", resp.rq.map_len.get()).into());
            }
            Some(_) => None,
        };
        let rq_staged = rq.is_some() && resp.rq.flags.get() & ring_flags::STAGED != 0;
        let sq = SendQueue::new(
            sq,
            SendQueueCaps {
                qp_type: init.qp_type,
                max_sge: actual.max_send_sge,
                max_inline: actual.max_inline_data,
            },
        )
        .map_err(ProtocolError::Queue)?;
        if sq.capacity() < actual.max_send_wr {
            return Err(bad("max_send_wr", actual.max_send_wr).into());
        }
        let host_kick = match resp.sq.host_kick_handle() {
            Some(handle) if ctx.has_host_kick() => ctx.transport().host_kick(handle),
            _ => None,
        };
        Ok(Qp {
            sq: Mutex::new(sq),
            rq,
            rq_staged,
            host_kick,
            refused_kicks: AtomicU64::new(0),
            object,
            qpn: resp.qpn.get(),
            qp_type: init.qp_type,
            doorbell_index,
            caps: actual,
            _send_cq: init.send_cq.shared.clone(),
            _recv_cq: init.recv_cq.shared.clone(),
            srq: srq.map(|srq| srq.shared.clone()),
        })
    }

    /// Whether the device gave this QP a staged receive queue (spec §9.7): its receives are
    /// copied by the device, which the QP's doorbell tells.
    pub fn receives_staged(&self) -> bool {
        self.rq_staged
    }

    /// The device's handle of this QP (as found in QP events).
    pub fn handle(&self) -> u32 {
        self.object.handle
    }

    /// The QP number peers address and completions carry.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// Transport type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// Actual queue sizes.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// Whether the QP receives through an SRQ.
    pub fn has_srq(&self) -> bool {
        self.srq.is_some()
    }

    /// This QP's slot in the context's doorbell area.
    pub fn doorbell_index(&self) -> u32 {
        self.doorbell_index
    }

    /// Whether sends start the host's processing from this process (a host kick, spec §5.3)
    /// rather than through the doorbell.
    pub fn kicks_host(&self) -> bool {
        self.host_kick.is_some()
    }

    /// How many host kicks the kernel refused so far (rxe refuses them in a state that does
    /// not send); each was followed by a doorbell.
    pub fn refused_host_kicks(&self) -> u64 {
        self.refused_kicks.load(Ordering::Relaxed)
    }

    /// Applies the attributes `mask` selects (MODIFY_QP, like `ibv_modify_qp`). The device
    /// checks the transition and the attributes against the InfiniBand state table.
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        let req = ControlRequest::ModifyQp(ModifyQpReq {
            qp: Le32::new(self.object.handle),
            attr_mask: Le32::new(mask.bits()),
            attr: *attr,
        });
        self.object.ctx().execute_empty(&req)
    }

    /// Applies several modifications, to QPs of one context, with one batch of MODIFY_QP
    /// commands (one round trip where the transport batches). The commands run in order, so
    /// a QP may appear more than once (INIT, then RTR, then RTS); each result is that
    /// command's.
    pub fn modify_many(changes: &[QpChange<'_>]) -> Result<Vec<Result<()>>> {
        let Some(first) = changes.first() else {
            return Ok(Vec::new());
        };
        let ctx = first.qp.object.ctx();
        if changes
            .iter()
            .any(|c| !Arc::ptr_eq(&c.qp.object.pd.ctx, &first.qp.object.pd.ctx))
        {
            return Err(VerbsError::InvalidArgument(
                "a batch of modifications must stay within one context",
            ));
        }
        let requests: Vec<ControlRequest<'static>> = changes
            .iter()
            .map(|c| {
                ControlRequest::ModifyQp(ModifyQpReq {
                    qp: Le32::new(c.qp.object.handle),
                    attr_mask: Le32::new(c.mask.bits()),
                    attr: *c.attr,
                })
            })
            .collect();
        Ok(ctx
            .execute_batch(&requests)?
            .into_iter()
            .map(|answer| answer.map(drop))
            .collect())
    }

    /// Current attributes (QUERY_QP); the returned mask says which are valid, and the
    /// enumerated ones among them hold defined values (else [`ProtocolError::ResponseValue`]).
    pub fn query(&self, mask: QpAttrMask) -> Result<(QpAttr, QpAttrMask)> {
        let req = ControlRequest::QueryQp(QueryQpReq {
            qp: Le32::new(self.object.handle),
            attr_mask: Le32::new(mask.bits()),
        });
        let ResponseBody::QueryQp(resp) = self.object.ctx().execute(&req)? else {
            return Err(unexpected_body(Opcode::QueryQp));
        };
        Ok(queried_attributes(&resp)?)
    }

    /// The current state (QUERY_QP).
    pub fn state(&self) -> Result<QpState> {
        let (attr, valid) = self.query(QpAttrMask::STATE)?;
        if !valid.contains(QpAttrMask::STATE) {
            return Err(ProtocolError::ResponseValue {
                opcode: Opcode::QueryQp,
                field: "attr_mask",
                value: valid.bits().into(),
            }
            .into());
        }
        Ok(attr.qp_state().map_err(undefined_in_query)?)
    }

    /// Moves the QP to RESET (from any state).
    pub fn reset(&self) -> Result<()> {
        self.to_state(QpState::Reset)
    }

    /// Moves the QP to ERR: outstanding requests complete as flushed.
    pub fn to_error(&self) -> Result<()> {
        self.to_state(QpState::Err)
    }

    fn to_state(&self, state: QpState) -> Result<()> {
        let attr = QpAttr::default().with_qp_state(state);
        self.modify(&attr, QpAttrMask::STATE)
    }

    fn require_connected(&self) -> Result<()> {
        match self.qp_type {
            QpType::Rc | QpType::Uc => Ok(()),
            QpType::Ud => Err(VerbsError::InvalidArgument(
                "this transition helper is for connected (RC or UC) QPs",
            )),
        }
    }

    /// Posts send requests, like `ibv_post_send`, and rings this QP's doorbell if any was
    /// posted and the QP was not already queued for the device.
    ///
    /// On [`PostSendError::Refused`], the requests before the refused one were posted.
    /// Allocates nothing. With a host kick ([`Qp::kicks_host`]) every post that posted
    /// anything makes one system call, as a native rxe post does; else the only device
    /// interaction is the doorbell notification, and only when
    /// [`DoorbellArea::ring`](vrdma_spec::DoorbellArea::ring) asks for it.
    ///
    /// # Safety
    ///
    /// For requests with [`SendFlags::INLINE`](crate::provider::SendFlags::INLINE), every SGE
    /// must describe `length` readable bytes at `addr` in this process (they are copied now).
    /// Other SGEs are checked by the device against their memory regions, whose memory the
    /// [`Mr`](super::Mr) keeps alive; they must stay registered until the request completes.
    pub unsafe fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostSendError> {
        // SAFETY: forwarded contract.
        let posted = unsafe { self.sq.lock().post_send(wrs) };
        let (count, refused) = match posted {
            Ok(()) => (wrs.len(), None),
            Err((index, error)) => (index, Some(PostSendError::Refused { index, error })),
        };
        if count > 0 {
            if let Err(source) = self.start_sending() {
                return Err(PostSendError::Doorbell {
                    posted: count,
                    source,
                });
            }
        }
        refused.map_or(Ok(()), Err)
    }

    /// The send queue, locked for the caller (see [`super::send_batch`]).
    pub(super) fn lock_send_queue(&self) -> MutexGuard<'_, SendQueue> {
        self.sq.lock()
    }

    /// Has the host process what was just published in the send queue: with a host kick,
    /// from here, as a native rxe process does; else (or if the kick fails, for example in a
    /// state that does not send) through the doorbell, whose outcome the device keeps, as
    /// before, to itself.
    pub(super) fn start_sending(&self) -> std::result::Result<(), TransportError> {
        // The provider published the producer index with a Release store; the system call
        // orders it before the kernel's Acquire load.
        if let Some(kick) = &self.host_kick {
            match kick.kick() {
                Ok(()) => return Ok(()),
                Err(e) => {
                    // Only the first refusal is logged: a QP posting outside RTS in a loop
                    // would log every post. The count says how many followed.
                    if self.refused_kicks.fetch_add(1, Ordering::Relaxed) == 0 {
                        debug!(
                            "host kick of QP {:#x}: {e}; ringing (further refusals are only \
                             counted)",
                            self.object.handle
                        );
                    }
                }
            }
        }
        self.ring_doorbell()
    }

    /// Rings this QP's doorbell after requests were published in its send queue (or in its
    /// staged receive queue).
    fn ring_doorbell(&self) -> std::result::Result<(), TransportError> {
        // The provider published the producer index with a Release store; `ring` fences and
        // queues the doorbell index, and says whether to notify: not when it was still queued,
        // nor while a device that negotiated polling says it polls (spec §5.3).
        if self.object.ctx().doorbell.ring(self.doorbell_index) {
            self.object.ctx().transport().notify_doorbell()?;
        }
        Ok(())
    }

    /// Posts receive requests, like `ibv_post_recv`. On `Err((n, e))` the first `n` were
    /// posted. No allocation, and no device involvement unless the receive queue is a staging
    /// ring (spec §9.7), which the device copies on this QP's doorbell: it is rung when
    /// anything was posted.
    ///
    /// A QP attached to an SRQ has no receive queue (capacity 0): any request is refused
    /// with [`PostError::QueueFull`]; post to the [`Srq`] instead.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), (usize, PostError)> {
        let Some(rq) = &self.rq else {
            return if wrs.is_empty() {
                Ok(())
            } else {
                Err((0, PostError::QueueFull))
            };
        };
        let posted = rq.lock().post_recv(wrs);
        if self.rq_staged {
            let count = match &posted {
                Ok(()) => wrs.len(),
                Err((n, _)) => *n,
            };
            if count > 0 && self.ring_doorbell().is_err() {
                return Err((count, PostError::Doorbell));
            }
        }
        posted
    }
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("handle", &self.object.handle)
            .field("qpn", &self.qpn)
            .field("qp_type", &self.qp_type)
            .field("doorbell_index", &self.doorbell_index)
            .finish()
    }
}

/// The attributes of a QUERY_QP response and the mask of the valid ones; refused if the mask
/// or a valid enumerated field holds an undefined value.
fn queried_attributes(resp: &QueryQpResp) -> Result<(QpAttr, QpAttrMask), ProtocolError> {
    let bits = resp.attr_mask.get();
    let valid = QpAttrMask::from_bits(bits).ok_or(ProtocolError::ResponseValue {
        opcode: Opcode::QueryQp,
        field: "attr_mask",
        value: bits.into(),
    })?;
    resp.attr.check_defined(valid).map_err(undefined_in_query)?;
    Ok((resp.attr, valid))
}

/// A QUERY_QP response field holding an undefined value, as the error the caller sees.
fn undefined_in_query(e: UndefinedValue) -> ProtocolError {
    ProtocolError::ResponseValue {
        opcode: Opcode::QueryQp,
        field: e.field,
        value: e.value,
    }
}

/// `wanted`, or the device's `limit` capped at [`DEFAULT_RD_ATOMIC`].
fn rd_atomic(wanted: Option<u8>, limit: u32) -> u8 {
    wanted.unwrap_or(limit.min(DEFAULT_RD_ATOMIC) as u8)
}

/// The queue sizes a creation asks for: a QP attached to an SRQ receives through it, so its
/// own receive sizes are ignored, as the verbs say (and rxe does; UCX passes a receive SGE
/// count with an SRQ).
fn requested_caps(init: &QpInitAttr<'_>, srq: Option<&Srq>) -> QpCaps {
    match srq {
        Some(_) => QpCaps {
            max_recv_wr: 0,
            max_recv_sge: 0,
            ..init.caps
        },
        None => init.caps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(attr: QpAttr, valid: QpAttrMask) -> QueryQpResp {
        QueryQpResp {
            attr_mask: Le32::new(valid.bits()),
            reserved: Le32::ZERO,
            attr,
        }
    }

    #[test]
    fn undefined_values_in_a_query_response_are_named() {
        let attr = QpAttr {
            qp_state: Le32::new(9),
            ..QpAttr::default()
        };
        let refused = queried_attributes(&response(attr, QpAttrMask::STATE));
        assert!(
            matches!(
                refused,
                Err(ProtocolError::ResponseValue {
                    opcode: Opcode::QueryQp,
                    field: "qp_state",
                    value: 9,
                })
            ),
            "{refused:?}"
        );
        // Not selected: not interpreted.
        let (queried, valid) = queried_attributes(&response(attr, QpAttrMask::PATH_MTU)).unwrap();
        assert_eq!((queried, valid), (attr, QpAttrMask::PATH_MTU));
        let mut bad_mask = response(attr, QpAttrMask::PATH_MTU);
        bad_mask.attr_mask = Le32::new(1 << 31);
        assert!(matches!(
            queried_attributes(&bad_mask),
            Err(ProtocolError::ResponseValue {
                field: "attr_mask",
                ..
            })
        ));
    }
}

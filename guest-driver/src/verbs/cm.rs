//! The connection manager (spec §7.5, `VRDMA_F_CM`): ids that resolve addresses, listen and
//! connect on the host's rdma_cm through the device, and their events. The librdmacm of this
//! library's users; QPs stay ordinary [`Qp`]s, moved with the attributes
//! [`CmId::init_qp_attr`] answers, as librdmacm moves them.
//!
//! Events of every id of a context come in order through [`Context::next_cm_event`]: the
//! device announces each with a CM_EVENT notification and keeps it until CM_GET_EVENT. The
//! notification only wakes the waiter; an event whose notification was lost (the event queue
//! overflowed) is still found, at the latest at the next periodic CM_GET_EVENT.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::warn;
use vrdma_spec::cm::*;
use vrdma_spec::control::{CmRequest, CmResponseBody, ControlRequest, Opcode, ResponseBody};
use vrdma_spec::features::{VRDMA_F_CM, VRDMA_F_CM_MOVES_QP};
use vrdma_spec::verbs::{QpAttrMask, QpState};
use vrdma_spec::wire::{HandleReq, QpAttr};
use vrdma_spec::{Le16, Le32};
use zerocopy::FromZeros;

use super::command::{nonzero_handle, unexpected_body};
use super::context::{Context, ContextInner};
use super::error::{Result, VerbsError};
use super::event::Wanted;
use super::qp::Qp;

/// How often a waiter for CM events asks the device even without a notification.
const CM_EVENT_RECHECK: Duration = Duration::from_secs(1);

/// The port space of an id: connected (RC) or datagram (UD).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortSpace {
    /// `RDMA_PS_TCP`: RC connections.
    Tcp,
    /// `RDMA_PS_UDP`: UD datagrams.
    Udp,
}

impl PortSpace {
    fn wire(self) -> u16 {
        match self {
            PortSpace::Tcp => cm_port_space::TCP,
            PortSpace::Udp => cm_port_space::UDP,
        }
    }
}

/// Parameters of a connect or accept (`struct rdma_conn_param` without the QP fields: the
/// device takes the QP number from the QP).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnParam<'a> {
    /// For the peer (the CM's per-message limits apply: 56 bytes in a request).
    pub private_data: &'a [u8],
    /// RDMA reads/atomics the peer may have outstanding towards this side.
    pub responder_resources: u8,
    /// RDMA reads/atomics this side may have outstanding.
    pub initiator_depth: u8,
    /// Flow control (0 or 1).
    pub flow_control: u8,
    /// Transport retries (0..=7).
    pub retry_count: u8,
    /// RNR retries (0..=7, 7: infinite).
    pub rnr_retry_count: u8,
}

impl ConnParam<'_> {
    fn wire(&self) -> Result<CmConnParam> {
        if self.private_data.len() >= CM_MAX_PRIVATE_DATA {
            return Err(VerbsError::InvalidArgument("private data over 255 bytes"));
        }
        let mut p = CmConnParam::new_zeroed();
        p.private_data_len = self.private_data.len() as u8;
        p.private_data[..self.private_data.len()].copy_from_slice(self.private_data);
        p.responder_resources = self.responder_resources;
        p.initiator_depth = self.initiator_depth;
        p.flow_control = self.flow_control;
        p.retry_count = self.retry_count;
        p.rnr_retry_count = self.rnr_retry_count;
        Ok(p)
    }
}

/// A connection-manager event (CM_GET_EVENT), as the device reports it.
pub type CmEvent = CmEventResp;

/// An id's source and destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmAddresses {
    /// Its source, if bound.
    pub src: Option<SocketAddr>,
    /// Its destination, if resolved.
    pub dst: Option<SocketAddr>,
}

/// A connection-manager id (`rdma_cm_id`): destroyed when dropped.
pub struct CmId {
    ctx: Arc<ContextInner>,
    handle: u32,
    port_space: PortSpace,
    /// Destroyed by [`CmId::destroy`] already.
    destroyed: bool,
}

impl Drop for CmId {
    fn drop(&mut self) {
        if self.destroyed {
            return;
        }
        if let Err(e) = self.destroy_on_device() {
            warn!("CM_DESTROY_ID of id {:#x} failed: {e}", self.handle);
        }
    }
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CmId({:#x}, {:?})", self.handle, self.port_space)
    }
}

fn cm_body(ctx: &ContextInner, request: CmRequest, opcode: Opcode) -> Result<CmResponseBody> {
    match ctx.execute(&ControlRequest::Cm(request))? {
        ResponseBody::Cm(body) => Ok(body),
        _ => Err(unexpected_body(opcode)),
    }
}

fn handle_req(handle: u32) -> HandleReq {
    HandleReq {
        handle: Le32::new(handle),
        reserved: Le32::ZERO,
    }
}

impl CmId {
    /// A new id in `port_space` (CM_CREATE_ID; needs `VRDMA_F_CM`).
    pub fn new(ctx: &Context, port_space: PortSpace) -> Result<CmId> {
        if ctx.features() & VRDMA_F_CM == 0 {
            return Err(VerbsError::Unsupported(
                "the device has no connection manager",
            ));
        }
        let request = CmRequest::CreateId(CmCreateIdReq {
            port_space: Le16::new(port_space.wire()),
            reserved: [0; 6],
        });
        let CmResponseBody::CreateId(resp) = cm_body(&ctx.inner, request, Opcode::CmCreateId)?
        else {
            return Err(unexpected_body(Opcode::CmCreateId));
        };
        Ok(CmId {
            ctx: Arc::clone(&ctx.inner),
            handle: nonzero_handle(Opcode::CmCreateId, resp.handle.get())?,
            port_space,
            destroyed: false,
        })
    }

    /// The id of a connect request (`event.id` of a CONNECT_REQUEST on a listener of
    /// `port_space`): the application owns it from then on.
    pub fn from_request(ctx: &Context, event: &CmEvent, port_space: PortSpace) -> Result<CmId> {
        if event.event.get() != cm_event::CONNECT_REQUEST {
            return Err(VerbsError::InvalidArgument("not a connect request"));
        }
        Ok(CmId {
            ctx: Arc::clone(&ctx.inner),
            handle: nonzero_handle(Opcode::CmGetEvent, event.id.get())?,
            port_space,
            destroyed: false,
        })
    }

    /// The device's handle of the id (events name it).
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Its port space.
    pub fn port_space(&self) -> PortSpace {
        self.port_space
    }

    fn run(&self, request: CmRequest) -> Result<()> {
        self.ctx.execute_empty(&ControlRequest::Cm(request))
    }

    fn destroy_on_device(&self) -> Result<u32> {
        let body = cm_body(
            &self.ctx,
            CmRequest::DestroyId(handle_req(self.handle)),
            Opcode::CmDestroyId,
        )?;
        let CmResponseBody::DestroyId(resp) = body else {
            return Err(unexpected_body(Opcode::CmDestroyId));
        };
        Ok(resp.events_delivered.get())
    }

    /// Binds the id to one of the guest's addresses (CM_BIND); a wildcard stands for the
    /// guest's one address of that family.
    pub fn bind(&self, addr: SocketAddr) -> Result<()> {
        self.run(CmRequest::Bind(CmBindReq {
            id: Le32::new(self.handle),
            reserved: Le32::ZERO,
            addr: CmAddr::from_socket_addr(&addr),
        }))
    }

    /// Starts resolving `dst` from `src` (`None`: the device picks the guest's address);
    /// ADDR_RESOLVED or ADDR_ERROR follows.
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        self.run(CmRequest::ResolveAddr(CmResolveAddrReq {
            id: Le32::new(self.handle),
            timeout_ms: Le32::new(timeout_ms(timeout)),
            src: src.as_ref().map_or(CmAddr::NONE, CmAddr::from_socket_addr),
            dst: CmAddr::from_socket_addr(&dst),
        }))
    }

    /// Starts resolving the route; ROUTE_RESOLVED or ROUTE_ERROR follows.
    pub fn resolve_route(&self, timeout: Duration) -> Result<()> {
        self.run(CmRequest::ResolveRoute(CmResolveRouteReq {
            id: Le32::new(self.handle),
            timeout_ms: Le32::new(timeout_ms(timeout)),
        }))
    }

    /// Listens on the bound address (0: the device's largest backlog).
    pub fn listen(&self, backlog: u32) -> Result<()> {
        self.run(CmRequest::Listen(CmListenReq {
            id: Le32::new(self.handle),
            backlog: Le32::new(backlog),
        }))
    }

    /// Sends a connect request for `qp`.
    pub fn connect(&self, qp: &Qp, param: &ConnParam<'_>) -> Result<()> {
        self.run(CmRequest::Connect(CmConnReq {
            id: Le32::new(self.handle),
            qp: Le32::new(qp.handle()),
            param: param.wire()?,
        }))
    }

    /// Accepts a connect request with `qp`, or with `None` establishes the connection after
    /// the peer's reply (CONNECT_RESPONSE).
    pub fn accept(&self, qp: Option<&Qp>, param: &ConnParam<'_>) -> Result<()> {
        self.run(CmRequest::Accept(CmConnReq {
            id: Le32::new(self.handle),
            qp: Le32::new(qp.map_or(0, Qp::handle)),
            param: param.wire()?,
        }))
    }

    /// Whether the device moves an accept's QP itself ([`CmId::accept_moving_qp`],
    /// `VRDMA_F_CM_MOVES_QP`).
    pub fn device_moves_qp(&self) -> bool {
        self.ctx.features() & VRDMA_F_CM_MOVES_QP != 0
    }

    /// As [`CmId::accept`], the device first moving the RC QP (`qp`; without one, the QP of
    /// this id's connect, after its reply) through INIT, RTR and RTS with the attributes
    /// [`CmId::init_qp_attr`] would give, RTR's and RTS's read/atomic depths from `param`
    /// (0xff: the host's), as librdmacm moves it: one command instead of seven. Each move is
    /// the guest's own MODIFY_QP with every check; a refused one ends it before anything
    /// reaches the peer.
    pub fn accept_moving_qp(&self, qp: Option<&Qp>, param: &ConnParam<'_>) -> Result<()> {
        if !self.device_moves_qp() {
            return Err(VerbsError::Unsupported(
                "the device does not move a QP on accept (VRDMA_F_CM_MOVES_QP)",
            ));
        }
        let mut wire = param.wire()?;
        wire.flags = cm_conn_flags::MOVE_QP;
        self.run(CmRequest::Accept(CmConnReq {
            id: Le32::new(self.handle),
            qp: Le32::new(qp.map_or(0, Qp::handle)),
            param: wire,
        }))
    }

    /// Rejects a connect request (consumer-defined reason).
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        if private_data.len() >= CM_MAX_PRIVATE_DATA {
            return Err(VerbsError::InvalidArgument("private data over 255 bytes"));
        }
        let mut r = CmRejectReq::new_zeroed();
        r.id = Le32::new(self.handle);
        r.private_data_len = private_data.len() as u8;
        r.private_data[..private_data.len()].copy_from_slice(private_data);
        self.run(CmRequest::Reject(r))
    }

    /// Disconnects; DISCONNECTED follows.
    pub fn disconnect(&self) -> Result<()> {
        self.run(CmRequest::Disconnect(handle_req(self.handle)))
    }

    /// The attributes and mask that move the id's QP to `state`, in this guest's terms.
    pub fn init_qp_attr(&self, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        let body = cm_body(
            &self.ctx,
            CmRequest::InitQpAttr(CmInitQpAttrReq {
                id: Le32::new(self.handle),
                qp_state: Le32::new(state as u32),
            }),
            Opcode::CmInitQpAttr,
        )?;
        let CmResponseBody::InitQpAttr(resp) = body else {
            return Err(unexpected_body(Opcode::CmInitQpAttr));
        };
        Ok((
            resp.attr,
            QpAttrMask::from_bits_retain(resp.attr_mask.get()),
        ))
    }

    /// Moves `qp` to `state` with the attributes the connection manager computes: one
    /// CM_MOVE_QP where the device moves QPs, else CM_INIT_QP_ATTR and MODIFY_QP.
    pub fn modify_qp(&self, qp: &Qp, state: QpState) -> Result<()> {
        if self.device_moves_qp() {
            return self.move_qp(qp, state, CM_HOST_DEPTH, CM_HOST_DEPTH);
        }
        let (attr, mask) = self.init_qp_attr(state)?;
        qp.modify(&attr, mask)
    }

    /// Moves `qp` to `state` (INIT, RTR or RTS) with the attributes the connection manager
    /// computes, RTR's `max_dest_rd_atomic` set to `responder_resources` and RTS's
    /// `max_rd_atomic` to `initiator_depth` unless [`CM_HOST_DEPTH`], in one command (CM_MOVE_QP,
    /// where [`device_moves_qp`](Self::device_moves_qp)).
    pub fn move_qp(
        &self,
        qp: &Qp,
        state: QpState,
        responder_resources: u8,
        initiator_depth: u8,
    ) -> Result<()> {
        if !self.device_moves_qp() {
            return Err(VerbsError::Unsupported(
                "the device does not move QPs (VRDMA_F_CM_MOVES_QP)",
            ));
        }
        if !matches!(state, QpState::Init | QpState::Rtr | QpState::Rts) {
            return Err(VerbsError::InvalidArgument(
                "CM_MOVE_QP moves a QP to INIT, RTR or RTS",
            ));
        }
        self.run(CmRequest::MoveQp(CmMoveQpReq {
            id: Le32::new(self.handle),
            qp: Le32::new(qp.handle()),
            qp_state: Le32::new(state as u32),
            responder_resources,
            initiator_depth,
            reserved: Le16::ZERO,
        }))
    }

    /// The id's addresses.
    pub fn query_addr(&self) -> Result<CmAddresses> {
        let body = cm_body(
            &self.ctx,
            CmRequest::QueryAddr(handle_req(self.handle)),
            Opcode::CmQueryAddr,
        )?;
        let CmResponseBody::QueryAddr(resp) = body else {
            return Err(unexpected_body(Opcode::CmQueryAddr));
        };
        Ok(CmAddresses {
            src: resp.src.socket_addr(),
            dst: resp.dst.socket_addr(),
        })
    }

    /// Sets option `name` (`vrdma_spec::cm::cm_option`) to `value`.
    pub fn set_option(&self, name: u32, value: u32) -> Result<()> {
        self.run(CmRequest::SetOption(CmSetOptionReq {
            id: Le32::new(self.handle),
            name: Le32::new(name),
            value: Le32::new(value),
            reserved: Le32::ZERO,
        }))
    }

    /// Tells the connection manager of a QP event (`IBV_EVENT_COMM_EST`).
    pub fn notify(&self, event: u32) -> Result<()> {
        self.run(CmRequest::Notify(CmNotifyReq {
            id: Le32::new(self.handle),
            event: Le32::new(event),
        }))
    }

    /// Destroys the id; answers how many of its events were delivered (librdmacm waits
    /// until it acknowledged that many).
    pub fn destroy(mut self) -> Result<u32> {
        self.destroyed = true;
        self.destroy_on_device()
    }
}

fn timeout_ms(timeout: Duration) -> u32 {
    u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX)
}

impl Context {
    /// The next connection-manager event of any id of this context, waiting up to
    /// `timeout` (`None`: forever); `None` on timeout.
    pub fn next_cm_event(&self, timeout: Option<Duration>) -> Result<Option<CmEvent>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            // Older than any the device still holds.
            if let Some(event) = self.inner.events.take_cm_event() {
                return Ok(Some(event));
            }
            let body = cm_body(&self.inner, CmRequest::GetEvent, Opcode::CmGetEvent)?;
            let CmResponseBody::GetEvent(event) = body else {
                return Err(unexpected_body(Opcode::CmGetEvent));
            };
            if event.event.get() != CM_EVENT_NONE {
                return Ok(Some(event));
            }
            let wait = match deadline {
                None => CM_EVENT_RECHECK,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => left.min(CM_EVENT_RECHECK),
                    _ => return Ok(None),
                },
            };
            self.inner.wait_event(Wanted::CmEvent, Some(wait))?;
        }
    }
}

//! The connection manager's commands (spec §7.5, `VRDMA_F_CM`): their decoded form, the
//! panic-free decoder with the structural checks of each body, the encoder, and the success
//! bodies.

use zerocopy::IntoBytes;

use super::body::{handle_req, range, take_body, zero};
use super::opcode::{Opcode, HEADER_SIZE};
use crate::cm::*;
use crate::error::DecodeError;
use crate::verbs::QpState;
use crate::wire::*;
use crate::Le16;

/// A decoded, structurally valid connection-manager request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmRequest {
    /// CM_CREATE_ID.
    CreateId(CmCreateIdReq),
    /// CM_DESTROY_ID.
    DestroyId(HandleReq),
    /// CM_BIND.
    Bind(CmBindReq),
    /// CM_RESOLVE_ADDR.
    ResolveAddr(CmResolveAddrReq),
    /// CM_RESOLVE_ROUTE.
    ResolveRoute(CmResolveRouteReq),
    /// CM_LISTEN.
    Listen(CmListenReq),
    /// CM_CONNECT.
    Connect(CmConnReq),
    /// CM_ACCEPT.
    Accept(CmConnReq),
    /// CM_REJECT.
    Reject(CmRejectReq),
    /// CM_DISCONNECT.
    Disconnect(HandleReq),
    /// CM_INIT_QP_ATTR.
    InitQpAttr(CmInitQpAttrReq),
    /// CM_GET_EVENT.
    GetEvent,
    /// CM_SET_OPTION.
    SetOption(CmSetOptionReq),
    /// CM_NOTIFY.
    Notify(CmNotifyReq),
    /// CM_QUERY_ADDR.
    QueryAddr(HandleReq),
    /// CM_MOVE_QP.
    MoveQp(CmMoveQpReq),
}

/// Reject reasons a guest may give, those the kernel's rdma_cm accepts: 0 (it means
/// consumer-defined), 28 (consumer-defined, named) and 35 (vendor option not supported).
pub const CM_REJECT_REASONS: [u8; 3] = [0, 28, 35];

impl CmRequest {
    /// Decodes the body of CM opcode `op`.
    pub(super) fn decode(op: Opcode, body: &[u8]) -> Result<CmRequest, DecodeError> {
        Ok(match op {
            Opcode::CmCreateId => {
                let r: CmCreateIdReq = take_body(body)?;
                let ps = r.port_space.get();
                if ps != cm_port_space::TCP && ps != cm_port_space::UDP {
                    return Err(DecodeError::InvalidValue {
                        field: "port_space",
                        value: ps.into(),
                    });
                }
                if r.reserved != [0; 6] {
                    return Err(DecodeError::Reserved("reserved"));
                }
                CmRequest::CreateId(r)
            }
            Opcode::CmDestroyId => CmRequest::DestroyId(handle_req(body)?),
            Opcode::CmBind => {
                let r: CmBindReq = take_body(body)?;
                zero(r.reserved.get().into(), "reserved")?;
                check_cm_addr(&r.addr, false)?;
                CmRequest::Bind(r)
            }
            Opcode::CmResolveAddr => {
                let r: CmResolveAddrReq = take_body(body)?;
                check_cm_addr(&r.src, true)?;
                check_cm_addr(&r.dst, false)?;
                CmRequest::ResolveAddr(r)
            }
            Opcode::CmResolveRoute => CmRequest::ResolveRoute(take_body(body)?),
            Opcode::CmListen => CmRequest::Listen(take_body(body)?),
            Opcode::CmConnect | Opcode::CmAccept => {
                let r: CmConnReq = take_body(body)?;
                let p = &r.param;
                if p.reserved != 0 {
                    return Err(DecodeError::Reserved("param.reserved"));
                }
                if p.flags & !cm_conn_flags::ALL != 0 {
                    return Err(DecodeError::Reserved("param.flags"));
                }
                // The active side's QP moves after the reply, with CM_ACCEPT.
                if op == Opcode::CmConnect && p.flags != 0 {
                    return Err(DecodeError::InvalidValue {
                        field: "param.flags",
                        value: p.flags.into(),
                    });
                }
                range(p.flow_control.into(), 0, 1, "flow_control")?;
                range(p.retry_count.into(), 0, 7, "retry_count")?;
                range(p.rnr_retry_count.into(), 0, 7, "rnr_retry_count")?;
                if op == Opcode::CmConnect {
                    range(r.qp.get().into(), 1, u32::MAX.into(), "qp")?;
                    CmRequest::Connect(r)
                } else {
                    CmRequest::Accept(r)
                }
            }
            Opcode::CmReject => {
                let r: CmRejectReq = take_body(body)?;
                if r.reserved != [0; 2] {
                    return Err(DecodeError::Reserved("reserved"));
                }
                if !CM_REJECT_REASONS.contains(&r.reason) {
                    return Err(DecodeError::InvalidValue {
                        field: "reason",
                        value: r.reason.into(),
                    });
                }
                CmRequest::Reject(r)
            }
            Opcode::CmDisconnect => CmRequest::Disconnect(handle_req(body)?),
            Opcode::CmInitQpAttr => {
                let r: CmInitQpAttrReq = take_body(body)?;
                QpState::try_from(r.qp_state.get()).map_err(|v| DecodeError::InvalidValue {
                    field: "qp_state",
                    value: v.into(),
                })?;
                CmRequest::InitQpAttr(r)
            }
            Opcode::CmGetEvent => {
                if !body.is_empty() {
                    return Err(DecodeError::Trailing {
                        expected: HEADER_SIZE,
                        got: HEADER_SIZE + body.len(),
                    });
                }
                CmRequest::GetEvent
            }
            Opcode::CmSetOption => {
                let r: CmSetOptionReq = take_body(body)?;
                zero(r.reserved.get().into(), "reserved")?;
                let max = match r.name.get() {
                    cm_option::TOS => u8::MAX.into(),
                    cm_option::REUSEADDR | cm_option::AFONLY => 1,
                    cm_option::ACK_TIMEOUT => 31,
                    other => {
                        return Err(DecodeError::InvalidValue {
                            field: "name",
                            value: other.into(),
                        })
                    }
                };
                range(r.value.get().into(), 0, max, "value")?;
                CmRequest::SetOption(r)
            }
            Opcode::CmNotify => CmRequest::Notify(take_body(body)?),
            Opcode::CmQueryAddr => CmRequest::QueryAddr(handle_req(body)?),
            Opcode::CmMoveQp => {
                let r: CmMoveQpReq = take_body(body)?;
                if r.reserved != Le16::ZERO {
                    return Err(DecodeError::Reserved("reserved"));
                }
                match QpState::try_from(r.qp_state.get()) {
                    Ok(QpState::Init | QpState::Rtr | QpState::Rts) => {}
                    _ => {
                        return Err(DecodeError::InvalidValue {
                            field: "qp_state",
                            value: r.qp_state.get().into(),
                        })
                    }
                }
                CmRequest::MoveQp(r)
            }
            other => return Err(DecodeError::UnknownOpcode(other as u16)),
        })
    }

    /// The request's opcode.
    pub fn opcode(&self) -> Opcode {
        match self {
            CmRequest::CreateId(_) => Opcode::CmCreateId,
            CmRequest::DestroyId(_) => Opcode::CmDestroyId,
            CmRequest::Bind(_) => Opcode::CmBind,
            CmRequest::ResolveAddr(_) => Opcode::CmResolveAddr,
            CmRequest::ResolveRoute(_) => Opcode::CmResolveRoute,
            CmRequest::Listen(_) => Opcode::CmListen,
            CmRequest::Connect(_) => Opcode::CmConnect,
            CmRequest::Accept(_) => Opcode::CmAccept,
            CmRequest::Reject(_) => Opcode::CmReject,
            CmRequest::Disconnect(_) => Opcode::CmDisconnect,
            CmRequest::InitQpAttr(_) => Opcode::CmInitQpAttr,
            CmRequest::GetEvent => Opcode::CmGetEvent,
            CmRequest::SetOption(_) => Opcode::CmSetOption,
            CmRequest::Notify(_) => Opcode::CmNotify,
            CmRequest::QueryAddr(_) => Opcode::CmQueryAddr,
            CmRequest::MoveQp(_) => Opcode::CmMoveQp,
        }
    }

    /// Whether the command makes the host queue an event of the guest's later: the commands
    /// a device answers `BUSY` past its bound of undelivered events (spec §7.5).
    pub fn makes_events(&self) -> bool {
        matches!(
            self,
            CmRequest::ResolveAddr(_)
                | CmRequest::ResolveRoute(_)
                | CmRequest::Listen(_)
                | CmRequest::Connect(_)
                | CmRequest::Accept(_)
                | CmRequest::Disconnect(_)
                | CmRequest::Notify(_)
        )
    }

    /// The body bytes.
    pub fn body(&self) -> &[u8] {
        match self {
            CmRequest::CreateId(r) => r.as_bytes(),
            CmRequest::DestroyId(r) | CmRequest::Disconnect(r) | CmRequest::QueryAddr(r) => {
                r.as_bytes()
            }
            CmRequest::Bind(r) => r.as_bytes(),
            CmRequest::ResolveAddr(r) => r.as_bytes(),
            CmRequest::ResolveRoute(r) => r.as_bytes(),
            CmRequest::Listen(r) => r.as_bytes(),
            CmRequest::Connect(r) | CmRequest::Accept(r) => r.as_bytes(),
            CmRequest::Reject(r) => r.as_bytes(),
            CmRequest::MoveQp(r) => r.as_bytes(),
            CmRequest::InitQpAttr(r) => r.as_bytes(),
            CmRequest::GetEvent => &[],
            CmRequest::SetOption(r) => r.as_bytes(),
            CmRequest::Notify(r) => r.as_bytes(),
        }
    }
}

/// Checks a `cm_addr`: IPv4 (mapped, no flow label or scope) or IPv6, reserved zero; with
/// `allow_none` the `NONE` family, all zero.
pub fn check_cm_addr(a: &CmAddr, allow_none: bool) -> Result<(), DecodeError> {
    zero(a.reserved.get().into(), "addr.reserved")?;
    match a.family.get() {
        cm_family::INET6 => Ok(()),
        cm_family::INET => {
            if a.addr[..12] != [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] {
                return Err(DecodeError::InvalidValue {
                    field: "addr (IPv4 not mapped)",
                    value: u128::from_be_bytes(a.addr) as u64,
                });
            }
            zero(a.flowinfo.get().into(), "addr.flowinfo")?;
            zero(a.scope_id.get().into(), "addr.scope_id")
        }
        cm_family::NONE if allow_none => {
            if *a != CmAddr::NONE {
                return Err(DecodeError::Reserved("addr"));
            }
            Ok(())
        }
        other => Err(DecodeError::InvalidValue {
            field: "addr.family",
            value: other.into(),
        }),
    }
}

/// The success body of a connection-manager command that has one.
// A response is decoded once per command round trip; copying CM_GET_EVENT's 384 bytes costs
// nothing next to it, and keeps bodies plain `Copy` data.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmResponseBody {
    /// CM_CREATE_ID: the new id's handle.
    CreateId(HandleResp),
    /// CM_DESTROY_ID.
    DestroyId(CmDestroyIdResp),
    /// CM_INIT_QP_ATTR.
    InitQpAttr(CmInitQpAttrResp),
    /// CM_GET_EVENT.
    GetEvent(CmEventResp),
    /// CM_QUERY_ADDR.
    QueryAddr(CmQueryAddrResp),
}

impl CmResponseBody {
    /// The body bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            CmResponseBody::CreateId(b) => b.as_bytes(),
            CmResponseBody::DestroyId(b) => b.as_bytes(),
            CmResponseBody::InitQpAttr(b) => b.as_bytes(),
            CmResponseBody::GetEvent(b) => b.as_bytes(),
            CmResponseBody::QueryAddr(b) => b.as_bytes(),
        }
    }

    /// The opcode whose success this body is.
    pub fn opcode(&self) -> Opcode {
        match self {
            CmResponseBody::CreateId(_) => Opcode::CmCreateId,
            CmResponseBody::DestroyId(_) => Opcode::CmDestroyId,
            CmResponseBody::InitQpAttr(_) => Opcode::CmInitQpAttr,
            CmResponseBody::GetEvent(_) => Opcode::CmGetEvent,
            CmResponseBody::QueryAddr(_) => Opcode::CmQueryAddr,
        }
    }

    /// Decodes the success body of CM opcode `op` that has one; `None` for the others.
    pub(super) fn decode(op: Opcode, b: &[u8]) -> Result<Option<CmResponseBody>, DecodeError> {
        Ok(Some(match op {
            Opcode::CmCreateId => CmResponseBody::CreateId(take_body(b)?),
            Opcode::CmDestroyId => CmResponseBody::DestroyId(take_body(b)?),
            Opcode::CmInitQpAttr => CmResponseBody::InitQpAttr(take_body(b)?),
            Opcode::CmGetEvent => CmResponseBody::GetEvent(take_body(b)?),
            Opcode::CmQueryAddr => CmResponseBody::QueryAddr(take_body(b)?),
            _ => return Ok(None),
        }))
    }
}

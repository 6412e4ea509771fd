//! Control requests: the decoded form of every command, its panic-free decoder (everything
//! checkable without device state), and its encoder.

use zerocopy::{FromBytes, IntoBytes};

use super::attr::{check_ah_attr, check_qp_attr};
use super::body::{handle_req, range, table_req, take_body, zero};
use super::cm::CmRequest;
use super::mr_extents::{take_extent_list, RegMrExtents};
use super::opcode::{Opcode, HEADER_SIZE};
use super::reg_mr::{check_mr_span, check_reg_mr, reg_mr_prefix, take_page_list, RegMr};
use super::rereg_mr::{decode_rereg_mr, encode_rereg_mr, ReregMr};
use crate::error::DecodeError;
use crate::features;
use crate::verbs::{self, QpAttrMask, QpType};
use crate::wire::*;
use crate::{Le16, Le32};

/// A decoded, structurally valid control request.
///
/// Decoding checks everything that can be checked without device state (see the
/// README's per-command "validation" lists); handles, quotas, guest addresses and
/// state transitions are the device's to check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlRequest<'a> {
    /// QUERY_DEVICE.
    QueryDevice,
    /// QUERY_PORT.
    QueryPort(QueryPortReq),
    /// QUERY_GID.
    QueryGid(QueryTableReq),
    /// QUERY_PKEY.
    QueryPkey(QueryTableReq),
    /// SET_DOORBELL_AREA.
    SetDoorbellArea(SetDoorbellAreaReq),
    /// DISCARD_STATE.
    DiscardState,
    /// QUERY_GID_TABLE (`index`: the first index to look at).
    QueryGidTable(QueryTableReq),
    /// ALLOC_PD.
    AllocPd,
    /// DEALLOC_PD.
    DeallocPd(HandleReq),
    /// REG_MR with its page list.
    RegMr(RegMr<'a>),
    /// DEREG_MR.
    DeregMr(HandleReq),
    /// REG_MR_EXTENTS with its extent list.
    RegMrExtents(RegMrExtents<'a>),
    /// REREG_MR with the page list of a translation change.
    ReregMr(ReregMr<'a>),
    /// ALLOC_MW.
    AllocMw(AllocMwReq),
    /// DEALLOC_MW.
    DeallocMw(HandleReq),
    /// CREATE_CQ.
    CreateCq(CreateCqReq),
    /// DESTROY_CQ.
    DestroyCq(HandleReq),
    /// ARM_CQ.
    ArmCq(ArmCqReq),
    /// RESIZE_CQ.
    ResizeCq(ResizeCqReq),
    /// CREATE_QP.
    CreateQp(CreateQpReq),
    /// MODIFY_QP.
    ModifyQp(ModifyQpReq),
    /// QUERY_QP.
    QueryQp(QueryQpReq),
    /// DESTROY_QP.
    DestroyQp(HandleReq),
    /// CREATE_SRQ.
    CreateSrq(CreateSrqReq),
    /// MODIFY_SRQ.
    ModifySrq(ModifySrqReq),
    /// QUERY_SRQ.
    QuerySrq(HandleReq),
    /// DESTROY_SRQ.
    DestroySrq(HandleReq),
    /// RESIZE_SRQ.
    ResizeSrq(ResizeSrqReq),
    /// CREATE_AH.
    CreateAh(CreateAhReq),
    /// DESTROY_AH.
    DestroyAh(HandleReq),
    /// A connection-manager command (`VRDMA_F_CM`).
    Cm(CmRequest),
}

impl<'a> ControlRequest<'a> {
    /// Decodes the whole device-readable part of a control chain.
    pub fn decode(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let (hdr, body) =
            RequestHeader::read_from_prefix(bytes).map_err(|_| DecodeError::Short {
                needed: HEADER_SIZE,
                got: bytes.len(),
            })?;
        let op = Opcode::try_from(hdr.opcode.get())?;
        zero(hdr.flags.get().into(), "flags")?;
        zero(hdr.reserved.get().into(), "reserved")?;
        let empty = |body: &[u8]| {
            if body.is_empty() {
                Ok(())
            } else {
                Err(DecodeError::Trailing {
                    expected: HEADER_SIZE,
                    got: HEADER_SIZE + body.len(),
                })
            }
        };
        Ok(match op {
            Opcode::QueryDevice => {
                empty(body)?;
                ControlRequest::QueryDevice
            }
            Opcode::AllocPd => {
                empty(body)?;
                ControlRequest::AllocPd
            }
            Opcode::DiscardState => {
                empty(body)?;
                ControlRequest::DiscardState
            }
            Opcode::QueryPort => {
                let r: QueryPortReq = take_body(body)?;
                range(r.port_num.get().into(), 1, u8::MAX.into(), "port_num")?;
                zero(r.reserved.get().into(), "reserved")?;
                ControlRequest::QueryPort(r)
            }
            Opcode::QueryGid => ControlRequest::QueryGid(table_req(body)?),
            Opcode::QueryPkey => ControlRequest::QueryPkey(table_req(body)?),
            Opcode::QueryGidTable => ControlRequest::QueryGidTable(table_req(body)?),
            Opcode::SetDoorbellArea => {
                let r: SetDoorbellAreaReq = take_body(body)?;
                zero(r.reserved.get().into(), "reserved")?;
                if !r.gpa.get().is_multiple_of(4096) {
                    return Err(DecodeError::Misaligned {
                        field: "gpa",
                        value: r.gpa.get(),
                    });
                }
                let slots = r.slots.get();
                if !slots.is_power_of_two() || slots > crate::doorbell::MAX_SLOTS {
                    return Err(DecodeError::InvalidValue {
                        field: "slots",
                        value: slots.into(),
                    });
                }
                ControlRequest::SetDoorbellArea(r)
            }
            Opcode::DeallocPd => ControlRequest::DeallocPd(handle_req(body)?),
            Opcode::DeregMr => ControlRequest::DeregMr(handle_req(body)?),
            Opcode::DeallocMw => ControlRequest::DeallocMw(handle_req(body)?),
            Opcode::AllocMw => {
                let r: AllocMwReq = take_body(body)?;
                verbs::MwType::try_from(r.mw_type.get()).map_err(|v| {
                    DecodeError::InvalidValue {
                        field: "mw_type",
                        value: v.into(),
                    }
                })?;
                ControlRequest::AllocMw(r)
            }
            Opcode::DestroyCq => ControlRequest::DestroyCq(handle_req(body)?),
            Opcode::DestroyQp => ControlRequest::DestroyQp(handle_req(body)?),
            Opcode::QuerySrq => ControlRequest::QuerySrq(handle_req(body)?),
            Opcode::DestroySrq => ControlRequest::DestroySrq(handle_req(body)?),
            Opcode::DestroyAh => ControlRequest::DestroyAh(handle_req(body)?),
            Opcode::RegMr => {
                let fixed = core::mem::size_of::<RegMrReq>();
                let (req, list) = reg_mr_prefix(body, bytes.len())?;
                let npages = check_reg_mr(&req)?;
                let pages = take_page_list(list, npages, req.page_shift.get(), fixed, bytes.len())?;
                ControlRequest::RegMr(RegMr { req, pages })
            }
            Opcode::RegMrExtents => {
                let fixed = core::mem::size_of::<RegMrReq>();
                let (req, list) = reg_mr_prefix(body, bytes.len())?;
                let pages = check_mr_span(&req)?;
                let extents = take_extent_list(
                    list,
                    req.npages.get(),
                    req.page_shift.get(),
                    pages,
                    fixed,
                    bytes.len(),
                )?;
                ControlRequest::RegMrExtents(RegMrExtents { req, extents })
            }
            Opcode::ReregMr => ControlRequest::ReregMr(decode_rereg_mr(body, bytes.len())?),
            Opcode::CreateCq => {
                let r: CreateCqReq = take_body(body)?;
                range(r.cqe.get().into(), 1, u32::MAX.into(), "cqe")?;
                zero(r.reserved.get().into(), "reserved")?;
                ControlRequest::CreateCq(r)
            }
            Opcode::ArmCq => {
                let r: ArmCqReq = take_body(body)?;
                if r.flags.get() & !verbs::arm_flags::SOLICITED_ONLY != 0 {
                    return Err(DecodeError::Reserved("flags"));
                }
                ControlRequest::ArmCq(r)
            }
            Opcode::ResizeCq => {
                let r: ResizeCqReq = take_body(body)?;
                range(r.cqe.get().into(), 1, u32::MAX.into(), "cqe")?;
                ControlRequest::ResizeCq(r)
            }
            Opcode::CreateQp => {
                let r: CreateQpReq = take_body(body)?;
                QpType::try_from(r.qp_type).map_err(|v| DecodeError::InvalidValue {
                    field: "qp_type",
                    value: v.into(),
                })?;
                range(r.sq_sig_all.into(), 0, 1, "sq_sig_all")?;
                zero(r.reserved.get().into(), "reserved")?;
                if r.srq.get() != 0 {
                    zero(r.max_recv_wr.get().into(), "max_recv_wr")?;
                    zero(r.max_recv_sge.get().into(), "max_recv_sge")?;
                }
                ControlRequest::CreateQp(r)
            }
            Opcode::ModifyQp => {
                let r: ModifyQpReq = take_body(body)?;
                check_qp_attr(r.attr_mask.get(), &r.attr)?;
                ControlRequest::ModifyQp(r)
            }
            Opcode::QueryQp => {
                let r: QueryQpReq = take_body(body)?;
                if QpAttrMask::from_bits(r.attr_mask.get()).is_none() {
                    return Err(DecodeError::InvalidValue {
                        field: "attr_mask",
                        value: r.attr_mask.get().into(),
                    });
                }
                ControlRequest::QueryQp(r)
            }
            Opcode::CreateSrq => {
                let r: CreateSrqReq = take_body(body)?;
                range(r.max_wr.get().into(), 1, u32::MAX.into(), "max_wr")?;
                range(r.max_sge.get().into(), 1, u32::MAX.into(), "max_sge")?;
                ControlRequest::CreateSrq(r)
            }
            Opcode::ModifySrq => {
                let r: ModifySrqReq = take_body(body)?;
                let all = verbs::srq_attr::MAX_WR | verbs::srq_attr::LIMIT;
                let m = r.attr_mask.get();
                if m == 0 || m & !all != 0 {
                    return Err(DecodeError::InvalidValue {
                        field: "attr_mask",
                        value: m.into(),
                    });
                }
                ControlRequest::ModifySrq(r)
            }
            Opcode::ResizeSrq => {
                let r: ResizeSrqReq = take_body(body)?;
                range(r.max_wr.get().into(), 1, u32::MAX.into(), "max_wr")?;
                ControlRequest::ResizeSrq(r)
            }
            Opcode::CreateAh => {
                let r: CreateAhReq = take_body(body)?;
                zero(r.reserved.get().into(), "reserved")?;
                check_ah_attr(&r.ah_attr)?;
                ControlRequest::CreateAh(r)
            }
            Opcode::CmCreateId
            | Opcode::CmDestroyId
            | Opcode::CmBind
            | Opcode::CmResolveAddr
            | Opcode::CmResolveRoute
            | Opcode::CmListen
            | Opcode::CmConnect
            | Opcode::CmAccept
            | Opcode::CmReject
            | Opcode::CmDisconnect
            | Opcode::CmInitQpAttr
            | Opcode::CmGetEvent
            | Opcode::CmSetOption
            | Opcode::CmNotify
            | Opcode::CmQueryAddr
            | Opcode::CmMoveQp => ControlRequest::Cm(CmRequest::decode(op, body)?),
        })
    }

    /// The request's opcode.
    pub fn opcode(&self) -> Opcode {
        match self {
            ControlRequest::QueryDevice => Opcode::QueryDevice,
            ControlRequest::QueryPort(_) => Opcode::QueryPort,
            ControlRequest::QueryGid(_) => Opcode::QueryGid,
            ControlRequest::QueryPkey(_) => Opcode::QueryPkey,
            ControlRequest::SetDoorbellArea(_) => Opcode::SetDoorbellArea,
            ControlRequest::DiscardState => Opcode::DiscardState,
            ControlRequest::QueryGidTable(_) => Opcode::QueryGidTable,
            ControlRequest::AllocPd => Opcode::AllocPd,
            ControlRequest::DeallocPd(_) => Opcode::DeallocPd,
            ControlRequest::RegMr(_) => Opcode::RegMr,
            ControlRequest::DeregMr(_) => Opcode::DeregMr,
            ControlRequest::ReregMr(_) => Opcode::ReregMr,
            ControlRequest::RegMrExtents(_) => Opcode::RegMrExtents,
            ControlRequest::AllocMw(_) => Opcode::AllocMw,
            ControlRequest::DeallocMw(_) => Opcode::DeallocMw,
            ControlRequest::CreateCq(_) => Opcode::CreateCq,
            ControlRequest::DestroyCq(_) => Opcode::DestroyCq,
            ControlRequest::ArmCq(_) => Opcode::ArmCq,
            ControlRequest::ResizeCq(_) => Opcode::ResizeCq,
            ControlRequest::CreateQp(_) => Opcode::CreateQp,
            ControlRequest::ModifyQp(_) => Opcode::ModifyQp,
            ControlRequest::QueryQp(_) => Opcode::QueryQp,
            ControlRequest::DestroyQp(_) => Opcode::DestroyQp,
            ControlRequest::CreateSrq(_) => Opcode::CreateSrq,
            ControlRequest::ModifySrq(_) => Opcode::ModifySrq,
            ControlRequest::QuerySrq(_) => Opcode::QuerySrq,
            ControlRequest::DestroySrq(_) => Opcode::DestroySrq,
            ControlRequest::ResizeSrq(_) => Opcode::ResizeSrq,
            ControlRequest::CreateAh(_) => Opcode::CreateAh,
            ControlRequest::DestroyAh(_) => Opcode::DestroyAh,
            ControlRequest::Cm(r) => r.opcode(),
        }
    }

    /// Feature bits this particular request needs (a CREATE_QP may need SRQ, and UD or UC; a
    /// REG_MR or an access-changing REREG_MR with `MW_BIND` access needs memory windows, with
    /// `ON_DEMAND` access on-demand paging; a CM_ACCEPT that moves its QP the device's moves).
    pub fn required_features(&self) -> u64 {
        let mut f = self.opcode().required_feature().unwrap_or(0);
        let mr_access = match self {
            ControlRequest::RegMr(m) => Some(m.req.access.get()),
            ControlRequest::RegMrExtents(m) => Some(m.req.access.get()),
            ControlRequest::ReregMr(m) => m.new_access(),
            _ => None,
        };
        if mr_access.is_some_and(|a| a & verbs::AccessFlags::MW_BIND.bits() != 0) {
            f |= features::VRDMA_F_MW;
        }
        if mr_access.is_some_and(|a| a & verbs::AccessFlags::ON_DEMAND.bits() != 0) {
            f |= features::VRDMA_F_ODP;
        }
        if let ControlRequest::Cm(super::cm::CmRequest::Accept(r)) = self {
            if r.param.flags & crate::cm::cm_conn_flags::MOVE_QP != 0 {
                f |= features::VRDMA_F_CM_MOVES_QP;
            }
        }
        if let ControlRequest::CreateQp(r) = self {
            if r.srq.get() != 0 {
                f |= features::VRDMA_F_SRQ;
            }
            if r.qp_type == QpType::Ud as u8 {
                f |= features::VRDMA_F_UD;
            }
            if r.qp_type == QpType::Uc as u8 {
                f |= features::VRDMA_F_UC;
            }
        }
        f
    }

    /// Length of the encoded request.
    pub fn encoded_len(&self) -> usize {
        HEADER_SIZE
            + self.opcode().request_body_len()
            + match self {
                ControlRequest::RegMr(m) => m.pages.as_bytes().len(),
                ControlRequest::ReregMr(m) => m.pages.as_bytes().len(),
                ControlRequest::RegMrExtents(m) => m.extents.as_bytes().len(),
                _ => 0,
            }
    }

    /// Appends the encoded request (header, body, REG_MR / REREG_MR page list) to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.reserve(self.encoded_len());
        let hdr = RequestHeader {
            opcode: Le16::new(self.opcode() as u16),
            flags: Le16::ZERO,
            reserved: Le32::ZERO,
        };
        out.extend_from_slice(hdr.as_bytes());
        match self {
            ControlRequest::QueryDevice
            | ControlRequest::AllocPd
            | ControlRequest::DiscardState => {}
            ControlRequest::QueryPort(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::QueryGid(r)
            | ControlRequest::QueryPkey(r)
            | ControlRequest::QueryGidTable(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::SetDoorbellArea(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::DeallocPd(r)
            | ControlRequest::DeregMr(r)
            | ControlRequest::DeallocMw(r)
            | ControlRequest::DestroyCq(r)
            | ControlRequest::DestroyQp(r)
            | ControlRequest::QuerySrq(r)
            | ControlRequest::DestroySrq(r)
            | ControlRequest::DestroyAh(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::RegMr(m) => {
                out.extend_from_slice(m.req.as_bytes());
                out.extend_from_slice(m.pages.as_bytes());
            }
            ControlRequest::ReregMr(m) => encode_rereg_mr(m, out),
            ControlRequest::RegMrExtents(m) => {
                out.extend_from_slice(m.req.as_bytes());
                out.extend_from_slice(m.extents.as_bytes());
            }
            ControlRequest::AllocMw(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::CreateCq(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::ArmCq(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::ResizeCq(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::CreateQp(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::ModifyQp(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::QueryQp(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::CreateSrq(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::ModifySrq(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::ResizeSrq(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::CreateAh(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::Cm(r) => out.extend_from_slice(r.body()),
        }
    }

    /// Encodes into a fresh vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.encoded_len());
        self.encode_into(&mut v);
        v
    }
}

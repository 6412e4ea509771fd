//! Control responses: the success bodies, the response with its status mapping (a
//! [`StatusError`] or a [`DecodeError`] becomes a failure response), decoder and encoder.

use zerocopy::{FromBytes, IntoBytes};

use super::body::take_body;
use super::cm::CmResponseBody;
use super::opcode::{Opcode, HEADER_SIZE};
use crate::error::DecodeError;
use crate::status::{Status, StatusError};
use crate::wire::*;
use crate::Le32;

/// Body of a successful response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseBody {
    /// Commands whose success carries no body.
    Empty,
    /// QUERY_DEVICE.
    QueryDevice(DeviceAttr),
    /// QUERY_PORT.
    QueryPort(PortAttr),
    /// QUERY_GID.
    QueryGid(GidEntry),
    /// QUERY_PKEY.
    QueryPkey(PkeyEntry),
    /// QUERY_GID_TABLE.
    QueryGidTable(GidTableResp),
    /// ALLOC_PD.
    AllocPd(HandleResp),
    /// REG_MR.
    RegMr(RegMrResp),
    /// REREG_MR.
    ReregMr(ReregMrResp),
    /// ALLOC_MW.
    AllocMw(AllocMwResp),
    /// CREATE_CQ.
    CreateCq(CreateCqResp),
    /// RESIZE_CQ.
    ResizeCq(ResizeCqResp),
    /// CREATE_QP.
    CreateQp(CreateQpResp),
    /// QUERY_QP.
    QueryQp(QueryQpResp),
    /// CREATE_SRQ.
    CreateSrq(CreateSrqResp),
    /// QUERY_SRQ.
    QuerySrq(QuerySrqResp),
    /// RESIZE_SRQ.
    ResizeSrq(ResizeSrqResp),
    /// CREATE_AH.
    CreateAh(CreateAhResp),
    /// A connection-manager command's body.
    Cm(CmResponseBody),
}

impl ResponseBody {
    /// The body bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            ResponseBody::Empty => &[],
            ResponseBody::QueryDevice(b) => b.as_bytes(),
            ResponseBody::QueryPort(b) => b.as_bytes(),
            ResponseBody::QueryGid(b) => b.as_bytes(),
            ResponseBody::QueryPkey(b) => b.as_bytes(),
            ResponseBody::QueryGidTable(b) => b.as_bytes(),
            ResponseBody::AllocPd(b) => b.as_bytes(),
            ResponseBody::RegMr(b) => b.as_bytes(),
            ResponseBody::ReregMr(b) => b.as_bytes(),
            ResponseBody::AllocMw(b) => b.as_bytes(),
            ResponseBody::CreateCq(b) => b.as_bytes(),
            ResponseBody::ResizeCq(b) => b.as_bytes(),
            ResponseBody::CreateQp(b) => b.as_bytes(),
            ResponseBody::QueryQp(b) => b.as_bytes(),
            ResponseBody::CreateSrq(b) => b.as_bytes(),
            ResponseBody::QuerySrq(b) => b.as_bytes(),
            ResponseBody::ResizeSrq(b) => b.as_bytes(),
            ResponseBody::CreateAh(b) => b.as_bytes(),
            ResponseBody::Cm(b) => b.as_bytes(),
        }
    }

    /// True if this body is the one `op` returns on success.
    pub fn matches(&self, op: Opcode) -> bool {
        matches!(
            (self, op),
            (ResponseBody::QueryDevice(_), Opcode::QueryDevice)
                | (ResponseBody::QueryPort(_), Opcode::QueryPort)
                | (ResponseBody::QueryGid(_), Opcode::QueryGid)
                | (ResponseBody::QueryPkey(_), Opcode::QueryPkey)
                | (ResponseBody::QueryGidTable(_), Opcode::QueryGidTable)
                | (ResponseBody::AllocPd(_), Opcode::AllocPd)
                | (ResponseBody::RegMr(_), Opcode::RegMr | Opcode::RegMrExtents)
                | (ResponseBody::ReregMr(_), Opcode::ReregMr)
                | (ResponseBody::AllocMw(_), Opcode::AllocMw)
                | (ResponseBody::CreateCq(_), Opcode::CreateCq)
                | (ResponseBody::ResizeCq(_), Opcode::ResizeCq)
                | (ResponseBody::CreateQp(_), Opcode::CreateQp)
                | (ResponseBody::QueryQp(_), Opcode::QueryQp)
                | (ResponseBody::CreateSrq(_), Opcode::CreateSrq)
                | (ResponseBody::QuerySrq(_), Opcode::QuerySrq)
                | (ResponseBody::ResizeSrq(_), Opcode::ResizeSrq)
                | (ResponseBody::CreateAh(_), Opcode::CreateAh)
        ) || matches!(self, ResponseBody::Cm(b) if b.opcode() == op)
            || (matches!(self, ResponseBody::Empty) && op.response_body_len() == 0)
    }

    fn decode(op: Opcode, b: &[u8]) -> Result<Self, DecodeError> {
        Ok(match op {
            Opcode::QueryDevice => ResponseBody::QueryDevice(take_body(b)?),
            Opcode::QueryPort => ResponseBody::QueryPort(take_body(b)?),
            Opcode::QueryGid => ResponseBody::QueryGid(take_body(b)?),
            Opcode::QueryPkey => ResponseBody::QueryPkey(take_body(b)?),
            Opcode::QueryGidTable => ResponseBody::QueryGidTable(take_body(b)?),
            Opcode::AllocPd => ResponseBody::AllocPd(take_body(b)?),
            Opcode::RegMr | Opcode::RegMrExtents => ResponseBody::RegMr(take_body(b)?),
            Opcode::ReregMr => ResponseBody::ReregMr(take_body(b)?),
            Opcode::AllocMw => ResponseBody::AllocMw(take_body(b)?),
            Opcode::CreateCq => ResponseBody::CreateCq(take_body(b)?),
            Opcode::ResizeCq => ResponseBody::ResizeCq(take_body(b)?),
            Opcode::CreateQp => ResponseBody::CreateQp(take_body(b)?),
            Opcode::QueryQp => ResponseBody::QueryQp(take_body(b)?),
            Opcode::CreateSrq => ResponseBody::CreateSrq(take_body(b)?),
            Opcode::QuerySrq => ResponseBody::QuerySrq(take_body(b)?),
            Opcode::ResizeSrq => ResponseBody::ResizeSrq(take_body(b)?),
            Opcode::CreateAh => ResponseBody::CreateAh(take_body(b)?),
            op if op.is_cm() && op.response_body_len() != 0 => ResponseBody::Cm(
                CmResponseBody::decode(op, b)?.ok_or(DecodeError::UnknownOpcode(op as u16))?,
            ),
            _ => {
                if !b.is_empty() {
                    return Err(DecodeError::Trailing {
                        expected: HEADER_SIZE,
                        got: HEADER_SIZE + b.len(),
                    });
                }
                ResponseBody::Empty
            }
        })
    }
}

/// A control response: success with its body, or a failure status.
// Bodies are plain data up to CM_GET_EVENT's 384 bytes, decoded once per round trip.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlResponse {
    /// Status OK.
    Ok(ResponseBody),
    /// Any other status (header only).
    Err(StatusError),
}

impl ControlResponse {
    /// Decodes the bytes the device wrote (the used length) for a request with `op`.
    ///
    /// Success responses must be exactly header + body; failures exactly the header,
    /// with `detail` zero unless the status is DEVICE_ERROR. Reserved fields inside
    /// bodies are not checked (drivers ignore them for forward compatibility).
    pub fn decode(op: Opcode, bytes: &[u8]) -> Result<Self, DecodeError> {
        let (hdr, body) =
            ResponseHeader::read_from_prefix(bytes).map_err(|_| DecodeError::Short {
                needed: HEADER_SIZE,
                got: bytes.len(),
            })?;
        let status = Status::try_from(hdr.status.get()).map_err(DecodeError::UnknownStatus)?;
        if status == Status::Ok {
            if hdr.detail.get() != 0 {
                return Err(DecodeError::Reserved("detail"));
            }
            return Ok(ControlResponse::Ok(ResponseBody::decode(op, body)?));
        }
        if !body.is_empty() {
            return Err(DecodeError::Trailing {
                expected: HEADER_SIZE,
                got: bytes.len(),
            });
        }
        StatusError::from_wire(status, hdr.detail.get())
            .map(ControlResponse::Err)
            .ok_or(DecodeError::Reserved("detail"))
    }

    /// Length of the encoding.
    pub fn encoded_len(&self) -> usize {
        HEADER_SIZE
            + match self {
                ControlResponse::Ok(b) => b.as_bytes().len(),
                ControlResponse::Err(_) => 0,
            }
    }

    /// Appends the encoded response to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let (status, detail, body): (Status, u32, &[u8]) = match self {
            ControlResponse::Ok(b) => (Status::Ok, 0, b.as_bytes()),
            ControlResponse::Err(e) => (e.status(), e.detail(), &[]),
        };
        let hdr = ResponseHeader {
            status: Le32::new(status.to_u32()),
            detail: Le32::new(detail),
        };
        out.extend_from_slice(hdr.as_bytes());
        out.extend_from_slice(body);
    }

    /// Encodes into a fresh vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.encoded_len());
        self.encode_into(&mut v);
        v
    }

    /// Converts to a `Result` for `?`-style use on the driver side.
    pub fn into_result(self) -> Result<ResponseBody, StatusError> {
        match self {
            ControlResponse::Ok(b) => Ok(b),
            ControlResponse::Err(e) => Err(e),
        }
    }
}

impl From<StatusError> for ControlResponse {
    fn from(e: StatusError) -> Self {
        ControlResponse::Err(e)
    }
}

impl From<DecodeError> for ControlResponse {
    fn from(e: DecodeError) -> Self {
        ControlResponse::Err(StatusError::new(e.status()))
    }
}

//! The control header's vocabulary: opcodes, with the body sizes and feature bit each one
//! implies, and the header and largest-response sizes.

use crate::error::DecodeError;
use crate::features;
use crate::wire::*;

/// Control opcodes (`le16` at offset 0 of the request header).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Opcode {
    /// Device attributes and per-guest limits.
    QueryDevice = 0x0001,
    /// Port attributes.
    QueryPort = 0x0002,
    /// One GID table entry.
    QueryGid = 0x0003,
    /// One P_Key table entry.
    QueryPkey = 0x0004,
    /// Register the driver's doorbell area.
    SetDoorbellArea = 0x0005,
    /// Discard every object of the guest (spec §11.1) before a reset.
    DiscardState = 0x0006,
    /// The populated GID table entries of a port, several per command.
    QueryGidTable = 0x0007,
    /// Allocate a protection domain.
    AllocPd = 0x0010,
    /// Free a protection domain.
    DeallocPd = 0x0011,
    /// Register guest pages as a memory region.
    RegMr = 0x0020,
    /// Deregister a memory region.
    DeregMr = 0x0021,
    /// Change a memory region's PD, access or translation in place.
    ReregMr = 0x0022,
    /// Allocate a memory window (needs `VRDMA_F_MW`).
    AllocMw = 0x0024,
    /// Free a memory window (needs `VRDMA_F_MW`).
    DeallocMw = 0x0025,
    /// Create a completion queue and map its buffer.
    CreateCq = 0x0030,
    /// Destroy a completion queue.
    DestroyCq = 0x0031,
    /// Request one completion event.
    ArmCq = 0x0032,
    /// Resize a completion queue and map its new buffer.
    ResizeCq = 0x0033,
    /// Create a queue pair and map its buffers.
    CreateQp = 0x0040,
    /// Modify QP attributes / state.
    ModifyQp = 0x0041,
    /// Query QP attributes.
    QueryQp = 0x0042,
    /// Destroy a queue pair.
    DestroyQp = 0x0043,
    /// Create a shared receive queue and map its buffer.
    CreateSrq = 0x0050,
    /// Arm the SRQ limit (or resize: unsupported).
    ModifySrq = 0x0051,
    /// Query SRQ attributes.
    QuerySrq = 0x0052,
    /// Destroy a shared receive queue.
    DestroySrq = 0x0053,
    /// Create an address handle.
    CreateAh = 0x0060,
    /// Destroy an address handle.
    DestroyAh = 0x0061,
}

impl Opcode {
    /// Every opcode, in numeric order.
    pub const ALL: [Opcode; 28] = [
        Opcode::QueryDevice,
        Opcode::QueryPort,
        Opcode::QueryGid,
        Opcode::QueryPkey,
        Opcode::SetDoorbellArea,
        Opcode::DiscardState,
        Opcode::QueryGidTable,
        Opcode::AllocPd,
        Opcode::DeallocPd,
        Opcode::RegMr,
        Opcode::DeregMr,
        Opcode::ReregMr,
        Opcode::AllocMw,
        Opcode::DeallocMw,
        Opcode::CreateCq,
        Opcode::DestroyCq,
        Opcode::ArmCq,
        Opcode::ResizeCq,
        Opcode::CreateQp,
        Opcode::ModifyQp,
        Opcode::QueryQp,
        Opcode::DestroyQp,
        Opcode::CreateSrq,
        Opcode::ModifySrq,
        Opcode::QuerySrq,
        Opcode::DestroySrq,
        Opcode::CreateAh,
        Opcode::DestroyAh,
    ];

    /// Size of the fixed request body (REG_MR, REREG_MR: without the page list).
    pub const fn request_body_len(self) -> usize {
        use core::mem::size_of;
        match self {
            Opcode::QueryDevice | Opcode::AllocPd | Opcode::DiscardState => 0,
            Opcode::QueryPort => size_of::<QueryPortReq>(),
            Opcode::QueryGid | Opcode::QueryPkey | Opcode::QueryGidTable => {
                size_of::<QueryTableReq>()
            }
            Opcode::SetDoorbellArea => size_of::<SetDoorbellAreaReq>(),
            Opcode::RegMr => size_of::<RegMrReq>(),
            Opcode::ReregMr => size_of::<ReregMrReq>(),
            Opcode::AllocMw => size_of::<AllocMwReq>(),
            Opcode::CreateCq => size_of::<CreateCqReq>(),
            Opcode::ArmCq => size_of::<ArmCqReq>(),
            Opcode::ResizeCq => size_of::<ResizeCqReq>(),
            Opcode::CreateQp => size_of::<CreateQpReq>(),
            Opcode::ModifyQp => size_of::<ModifyQpReq>(),
            Opcode::QueryQp => size_of::<QueryQpReq>(),
            Opcode::CreateSrq => size_of::<CreateSrqReq>(),
            Opcode::ModifySrq => size_of::<ModifySrqReq>(),
            Opcode::CreateAh => size_of::<CreateAhReq>(),
            Opcode::DeallocPd
            | Opcode::DeregMr
            | Opcode::DeallocMw
            | Opcode::DestroyCq
            | Opcode::DestroyQp
            | Opcode::QuerySrq
            | Opcode::DestroySrq
            | Opcode::DestroyAh => size_of::<HandleReq>(),
        }
    }

    /// Size of the response body on success (the header's 8 bytes not included).
    pub const fn response_body_len(self) -> usize {
        use core::mem::size_of;
        match self {
            Opcode::QueryDevice => size_of::<DeviceAttr>(),
            Opcode::QueryPort => size_of::<PortAttr>(),
            Opcode::QueryGid => size_of::<GidEntry>(),
            Opcode::QueryGidTable => size_of::<GidTableResp>(),
            Opcode::QueryPkey => size_of::<PkeyEntry>(),
            Opcode::AllocPd => size_of::<HandleResp>(),
            Opcode::RegMr => size_of::<RegMrResp>(),
            Opcode::ReregMr => size_of::<ReregMrResp>(),
            Opcode::AllocMw => size_of::<AllocMwResp>(),
            Opcode::CreateCq => size_of::<CreateCqResp>(),
            Opcode::ResizeCq => size_of::<ResizeCqResp>(),
            Opcode::CreateQp => size_of::<CreateQpResp>(),
            Opcode::QueryQp => size_of::<QueryQpResp>(),
            Opcode::CreateSrq => size_of::<CreateSrqResp>(),
            Opcode::QuerySrq => size_of::<QuerySrqResp>(),
            Opcode::CreateAh => size_of::<CreateAhResp>(),
            Opcode::SetDoorbellArea
            | Opcode::DiscardState
            | Opcode::DeallocPd
            | Opcode::DeregMr
            | Opcode::DeallocMw
            | Opcode::DestroyCq
            | Opcode::ArmCq
            | Opcode::ModifyQp
            | Opcode::DestroyQp
            | Opcode::ModifySrq
            | Opcode::DestroySrq
            | Opcode::DestroyAh => 0,
        }
    }

    /// Feature bit the command needs, if any (without it the device answers UNSUPPORTED).
    pub const fn required_feature(self) -> Option<u64> {
        match self {
            Opcode::CreateSrq | Opcode::ModifySrq | Opcode::QuerySrq | Opcode::DestroySrq => {
                Some(features::VRDMA_F_SRQ)
            }
            Opcode::CreateAh | Opcode::DestroyAh => Some(features::VRDMA_F_UD),
            Opcode::AllocMw | Opcode::DeallocMw => Some(features::VRDMA_F_MW),
            _ => None,
        }
    }
}

impl TryFrom<u16> for Opcode {
    type Error = DecodeError;
    fn try_from(v: u16) -> Result<Self, DecodeError> {
        Opcode::ALL
            .iter()
            .copied()
            .find(|o| *o as u16 == v)
            .ok_or(DecodeError::UnknownOpcode(v))
    }
}

/// Size of a request/response header.
pub const HEADER_SIZE: usize = 8;
/// Largest response of this version: header + QUERY_DEVICE body.
pub const MAX_RESPONSE_SIZE: usize = HEADER_SIZE + core::mem::size_of::<DeviceAttr>();

// Every success body fits the largest response.
const _: () = {
    let mut i = 0;
    while i < Opcode::ALL.len() {
        assert!(HEADER_SIZE + Opcode::ALL[i].response_body_len() <= MAX_RESPONSE_SIZE);
        i += 1;
    }
};

//! The control header's vocabulary: opcodes, with the body sizes and feature bit each one
//! implies, and the header and largest-response sizes.

use crate::cm::*;
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
    /// Register guest memory given as extents (runs of pages) as a memory region (needs
    /// `VRDMA_F_MR_EXTENTS`).
    RegMrExtents = 0x0023,
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
    /// Arm the SRQ limit (resizing is RESIZE_SRQ).
    ModifySrq = 0x0051,
    /// Query SRQ attributes.
    QuerySrq = 0x0052,
    /// Destroy a shared receive queue.
    DestroySrq = 0x0053,
    /// Resize a shared receive queue and map its new buffer.
    ResizeSrq = 0x0054,
    /// Create an address handle.
    CreateAh = 0x0060,
    /// Destroy an address handle.
    DestroyAh = 0x0061,
    /// Create a connection-manager id (needs `VRDMA_F_CM`, like every CM_* command).
    CmCreateId = 0x0070,
    /// Destroy a CM id (and its connection).
    CmDestroyId = 0x0071,
    /// Bind a CM id to one of the guest's addresses.
    CmBind = 0x0072,
    /// Resolve a destination address.
    CmResolveAddr = 0x0073,
    /// Resolve the route to the destination.
    CmResolveRoute = 0x0074,
    /// Listen for connect requests.
    CmListen = 0x0075,
    /// Send a connect request for one of the guest's QPs.
    CmConnect = 0x0076,
    /// Accept a connect request, or establish after a reply.
    CmAccept = 0x0077,
    /// Reject a connect request.
    CmReject = 0x0078,
    /// Disconnect.
    CmDisconnect = 0x0079,
    /// The attributes that move the id's QP to a state.
    CmInitQpAttr = 0x007a,
    /// The next CM event of the guest's ids.
    CmGetEvent = 0x007b,
    /// Set an option of a CM id.
    CmSetOption = 0x007c,
    /// Tell the CM of a QP event.
    CmNotify = 0x007d,
    /// A CM id's addresses, GUID and port.
    CmQueryAddr = 0x007e,
    /// Move a QP one state with the attributes the id's CM computes (`VRDMA_F_CM_MOVES_QP`).
    CmMoveQp = 0x007f,
}

impl Opcode {
    /// Every opcode, in numeric order.
    pub const ALL: [Opcode; 46] = [
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
        Opcode::RegMrExtents,
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
        Opcode::ResizeSrq,
        Opcode::CreateAh,
        Opcode::DestroyAh,
        Opcode::CmCreateId,
        Opcode::CmDestroyId,
        Opcode::CmBind,
        Opcode::CmResolveAddr,
        Opcode::CmResolveRoute,
        Opcode::CmListen,
        Opcode::CmConnect,
        Opcode::CmAccept,
        Opcode::CmReject,
        Opcode::CmDisconnect,
        Opcode::CmInitQpAttr,
        Opcode::CmGetEvent,
        Opcode::CmSetOption,
        Opcode::CmNotify,
        Opcode::CmQueryAddr,
        Opcode::CmMoveQp,
    ];

    /// Size of the fixed request body (REG_MR, REREG_MR: without the page list; REG_MR_EXTENTS:
    /// without the extent list).
    pub const fn request_body_len(self) -> usize {
        use core::mem::size_of;
        match self {
            Opcode::QueryDevice | Opcode::AllocPd | Opcode::DiscardState => 0,
            Opcode::QueryPort => size_of::<QueryPortReq>(),
            Opcode::QueryGid | Opcode::QueryPkey | Opcode::QueryGidTable => {
                size_of::<QueryTableReq>()
            }
            Opcode::SetDoorbellArea => size_of::<SetDoorbellAreaReq>(),
            Opcode::RegMr | Opcode::RegMrExtents => size_of::<RegMrReq>(),
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
            Opcode::ResizeSrq => size_of::<ResizeSrqReq>(),
            Opcode::CreateAh => size_of::<CreateAhReq>(),
            Opcode::CmCreateId => size_of::<CmCreateIdReq>(),
            Opcode::CmBind => size_of::<CmBindReq>(),
            Opcode::CmResolveAddr => size_of::<CmResolveAddrReq>(),
            Opcode::CmResolveRoute => size_of::<CmResolveRouteReq>(),
            Opcode::CmListen => size_of::<CmListenReq>(),
            Opcode::CmConnect | Opcode::CmAccept => size_of::<CmConnReq>(),
            Opcode::CmReject => size_of::<CmRejectReq>(),
            Opcode::CmInitQpAttr => size_of::<CmInitQpAttrReq>(),
            Opcode::CmMoveQp => size_of::<CmMoveQpReq>(),
            Opcode::CmGetEvent => 0,
            Opcode::CmSetOption => size_of::<CmSetOptionReq>(),
            Opcode::CmNotify => size_of::<CmNotifyReq>(),
            Opcode::CmDestroyId | Opcode::CmDisconnect | Opcode::CmQueryAddr => {
                size_of::<HandleReq>()
            }
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
            Opcode::RegMr | Opcode::RegMrExtents => size_of::<RegMrResp>(),
            Opcode::ReregMr => size_of::<ReregMrResp>(),
            Opcode::AllocMw => size_of::<AllocMwResp>(),
            Opcode::CreateCq => size_of::<CreateCqResp>(),
            Opcode::ResizeCq => size_of::<ResizeCqResp>(),
            Opcode::CreateQp => size_of::<CreateQpResp>(),
            Opcode::QueryQp => size_of::<QueryQpResp>(),
            Opcode::CreateSrq => size_of::<CreateSrqResp>(),
            Opcode::QuerySrq => size_of::<QuerySrqResp>(),
            Opcode::ResizeSrq => size_of::<ResizeSrqResp>(),
            Opcode::CreateAh => size_of::<CreateAhResp>(),
            Opcode::CmCreateId => size_of::<HandleResp>(),
            Opcode::CmDestroyId => size_of::<CmDestroyIdResp>(),
            Opcode::CmInitQpAttr => size_of::<CmInitQpAttrResp>(),
            Opcode::CmGetEvent => size_of::<CmEventResp>(),
            Opcode::CmQueryAddr => size_of::<CmQueryAddrResp>(),
            Opcode::CmBind
            | Opcode::CmResolveAddr
            | Opcode::CmResolveRoute
            | Opcode::CmListen
            | Opcode::CmConnect
            | Opcode::CmAccept
            | Opcode::CmReject
            | Opcode::CmDisconnect
            | Opcode::CmSetOption
            | Opcode::CmNotify
            | Opcode::CmMoveQp => 0,
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
            Opcode::CreateSrq
            | Opcode::ModifySrq
            | Opcode::QuerySrq
            | Opcode::DestroySrq
            | Opcode::ResizeSrq => Some(features::VRDMA_F_SRQ),
            Opcode::CreateAh | Opcode::DestroyAh => Some(features::VRDMA_F_UD),
            Opcode::AllocMw | Opcode::DeallocMw => Some(features::VRDMA_F_MW),
            Opcode::RegMrExtents => Some(features::VRDMA_F_MR_EXTENTS),
            Opcode::CmMoveQp => Some(features::VRDMA_F_CM | features::VRDMA_F_CM_MOVES_QP),
            op if op.is_cm() => Some(features::VRDMA_F_CM),
            _ => None,
        }
    }
}

impl Opcode {
    /// The specification's name of the opcode (README §7.4, §7.5).
    pub const fn name(self) -> &'static str {
        match self {
            Opcode::QueryDevice => "QUERY_DEVICE",
            Opcode::QueryPort => "QUERY_PORT",
            Opcode::QueryGid => "QUERY_GID",
            Opcode::QueryPkey => "QUERY_PKEY",
            Opcode::SetDoorbellArea => "SET_DOORBELL_AREA",
            Opcode::DiscardState => "DISCARD_STATE",
            Opcode::QueryGidTable => "QUERY_GID_TABLE",
            Opcode::AllocPd => "ALLOC_PD",
            Opcode::DeallocPd => "DEALLOC_PD",
            Opcode::RegMr => "REG_MR",
            Opcode::DeregMr => "DEREG_MR",
            Opcode::ReregMr => "REREG_MR",
            Opcode::RegMrExtents => "REG_MR_EXTENTS",
            Opcode::AllocMw => "ALLOC_MW",
            Opcode::DeallocMw => "DEALLOC_MW",
            Opcode::CreateCq => "CREATE_CQ",
            Opcode::DestroyCq => "DESTROY_CQ",
            Opcode::ArmCq => "ARM_CQ",
            Opcode::ResizeCq => "RESIZE_CQ",
            Opcode::CreateQp => "CREATE_QP",
            Opcode::ModifyQp => "MODIFY_QP",
            Opcode::QueryQp => "QUERY_QP",
            Opcode::DestroyQp => "DESTROY_QP",
            Opcode::CreateSrq => "CREATE_SRQ",
            Opcode::ModifySrq => "MODIFY_SRQ",
            Opcode::QuerySrq => "QUERY_SRQ",
            Opcode::DestroySrq => "DESTROY_SRQ",
            Opcode::ResizeSrq => "RESIZE_SRQ",
            Opcode::CreateAh => "CREATE_AH",
            Opcode::DestroyAh => "DESTROY_AH",
            Opcode::CmCreateId => "CM_CREATE_ID",
            Opcode::CmDestroyId => "CM_DESTROY_ID",
            Opcode::CmBind => "CM_BIND",
            Opcode::CmResolveAddr => "CM_RESOLVE_ADDR",
            Opcode::CmResolveRoute => "CM_RESOLVE_ROUTE",
            Opcode::CmListen => "CM_LISTEN",
            Opcode::CmConnect => "CM_CONNECT",
            Opcode::CmAccept => "CM_ACCEPT",
            Opcode::CmReject => "CM_REJECT",
            Opcode::CmDisconnect => "CM_DISCONNECT",
            Opcode::CmInitQpAttr => "CM_INIT_QP_ATTR",
            Opcode::CmGetEvent => "CM_GET_EVENT",
            Opcode::CmSetOption => "CM_SET_OPTION",
            Opcode::CmNotify => "CM_NOTIFY",
            Opcode::CmQueryAddr => "CM_QUERY_ADDR",
            Opcode::CmMoveQp => "CM_MOVE_QP",
        }
    }

    /// Whether this is a connection-manager command (0x0070..=0x007f).
    pub const fn is_cm(self) -> bool {
        self as u16 & 0xfff0 == 0x0070
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
/// Largest response of a device without `VRDMA_F_CM`: header + QUERY_DEVICE body (the
/// configuration space's `max_response_size`).
pub const MAX_RESPONSE_SIZE: usize = HEADER_SIZE + core::mem::size_of::<DeviceAttr>();
/// Largest response of a device with `VRDMA_F_CM`: header + CM_GET_EVENT body.
pub const MAX_CM_RESPONSE_SIZE: usize = HEADER_SIZE + core::mem::size_of::<CmEventResp>();

// Every success body fits the largest response of the device that offers it.
const _: () = {
    let mut i = 0;
    while i < Opcode::ALL.len() {
        let op = Opcode::ALL[i];
        let max = if op.is_cm() {
            MAX_CM_RESPONSE_SIZE
        } else {
            MAX_RESPONSE_SIZE
        };
        assert!(HEADER_SIZE + op.response_body_len() <= max);
        i += 1;
    }
};

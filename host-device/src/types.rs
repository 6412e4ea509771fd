//! Typed arguments and results of host-device verbs (independent of any driver).

use std::fmt;

use vrdma_spec::attr::qp::QpCaps;
use vrdma_spec::verbs::{AccessFlags, QpType};
use vrdma_spec::wire::{AhAttr, QpAttr};

macro_rules! handle {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub u32);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

handle!(
    /// Kernel handle of a protection domain in one context.
    PdHandle
);
handle!(
    /// Kernel handle of a memory region in one context.
    MrHandle
);
handle!(
    /// Kernel handle of a memory window in one context.
    MwHandle
);
handle!(
    /// Kernel handle of a completion queue in one context.
    CqHandle
);
handle!(
    /// Kernel handle of a queue pair in one context (not its QP number).
    QpHandle
);
handle!(
    /// Kernel handle of a shared receive queue in one context.
    SrqHandle
);
handle!(
    /// Kernel handle of an address handle in one context.
    AhHandle
);

/// A queue buffer the host device allocated, as the frontend must map it: `len` bytes of the
/// context's [`super::HostContext::queue_fd`] at `offset`, `MAP_SHARED`, read/write. rxe lets
/// that mapping happen exactly once (the kernel forgets the offset after the first mmap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueBuffer {
    /// mmap offset on the queue fd.
    pub offset: u64,
    /// Length in bytes (a multiple of the page size).
    pub len: usize,
}

/// QUERY_QP result.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    /// The attributes, with the host's port numbers; the states are defined values.
    pub attr: QpAttr,
    pub sq_sig_all: bool,
}

/// MR registration request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrInit {
    pub pd: PdHandle,
    /// Start of the registered range in this (the backend's) address space.
    pub start: u64,
    pub length: u64,
    /// Address the peer and the guest use for the range's first byte (same in-page offset as
    /// `start`).
    pub iova: u64,
    pub access: AccessFlags,
}

/// A registered MR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mr {
    pub handle: MrHandle,
    pub lkey: u32,
    pub rkey: u32,
}

/// An allocated memory window: its kernel handle and its initial rkey.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mw {
    pub handle: MwHandle,
    pub rkey: u32,
}

/// CQ creation request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqInit {
    /// Minimum number of entries.
    pub cqe: u32,
    /// Completion vector (below the context's `num_comp_vectors`).
    pub comp_vector: u32,
    /// Deliver completion events to the context's completion channel.
    pub use_comp_channel: bool,
    /// Reported back in completion and async events for this CQ.
    pub user_handle: u64,
}

/// A created CQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cq {
    pub handle: CqHandle,
    /// Actual capacity.
    pub cqe: u32,
    pub buffer: QueueBuffer,
}

/// A resized CQ: its new capacity and the new buffer that replaces the old one (rxe frees the
/// old buffer once its last mapping is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqResize {
    /// Actual capacity of the new buffer.
    pub cqe: u32,
    pub buffer: QueueBuffer,
}

/// QP creation request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInit {
    pub qp_type: QpType,
    pub pd: PdHandle,
    pub send_cq: CqHandle,
    pub recv_cq: CqHandle,
    /// Receives come from this SRQ; the QP then has no RQ of its own.
    pub srq: Option<SrqHandle>,
    pub caps: QpCaps,
    pub sq_sig_all: bool,
    /// Reported back in async events for this QP.
    pub user_handle: u64,
}

/// A created QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Qp {
    pub handle: QpHandle,
    pub qpn: u32,
    /// Actual capacities.
    pub caps: QpCaps,
    pub sq: QueueBuffer,
    /// `None` when the QP receives through an SRQ.
    pub rq: Option<QueueBuffer>,
}

/// SRQ creation request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqInit {
    pub pd: PdHandle,
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
    /// Reported back in async events for this SRQ.
    pub user_handle: u64,
}

/// A created SRQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Srq {
    pub handle: SrqHandle,
    pub max_wr: u32,
    pub max_sge: u32,
    /// Number the device uses for the SRQ (XRC addressing, events).
    pub srq_num: u32,
    pub buffer: QueueBuffer,
}

/// MODIFY_SRQ request: each field applies only if `Some`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SrqModify {
    /// Resize to at least this many WRs (`IB_SRQ_MAX_WR`); rxe then allocates a new buffer.
    pub max_wr: Option<u32>,
    /// Arm the limit event at this level (`IB_SRQ_LIMIT`).
    pub srq_limit: Option<u32>,
}

/// AH creation request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AhInit {
    pub pd: PdHandle,
    pub attr: AhAttr,
    pub user_handle: u64,
}

/// A created AH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ah {
    pub handle: AhHandle,
    /// rxe: the index a UD send WQE carries in `wr.ud.ah_num` (never 0).
    pub ah_num: u32,
}

/// Asynchronous event types (`enum ib_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AsyncEventKind {
    CqErr,
    QpFatal,
    QpReqErr,
    QpAccessErr,
    CommEst,
    SqDrained,
    PathMig,
    PathMigErr,
    DeviceFatal,
    PortActive,
    PortErr,
    LidChange,
    PkeyChange,
    SmChange,
    SrqErr,
    SrqLimitReached,
    QpLastWqeReached,
    ClientReregister,
    GidChange,
    WqFatal,
    /// A value this layer does not know (newer kernel).
    Other(u32),
}

impl AsyncEventKind {
    /// From the kernel's `event_type`.
    pub fn from_kernel(value: u32) -> AsyncEventKind {
        use AsyncEventKind::*;
        match value {
            0 => CqErr,
            1 => QpFatal,
            2 => QpReqErr,
            3 => QpAccessErr,
            4 => CommEst,
            5 => SqDrained,
            6 => PathMig,
            7 => PathMigErr,
            8 => DeviceFatal,
            9 => PortActive,
            10 => PortErr,
            11 => LidChange,
            12 => PkeyChange,
            13 => SmChange,
            14 => SrqErr,
            15 => SrqLimitReached,
            16 => QpLastWqeReached,
            17 => ClientReregister,
            18 => GidChange,
            19 => WqFatal,
            other => Other(other),
        }
    }

    /// What [`AsyncEvent::element`] names for this kind.
    pub fn element(self) -> EventElement {
        use AsyncEventKind::*;
        match self {
            CqErr => EventElement::Cq,
            QpFatal | QpReqErr | QpAccessErr | CommEst | SqDrained | PathMig | PathMigErr
            | QpLastWqeReached => EventElement::Qp,
            SrqErr | SrqLimitReached => EventElement::Srq,
            WqFatal => EventElement::Wq,
            DeviceFatal | PortActive | PortErr | LidChange | PkeyChange | SmChange
            | ClientReregister | GidChange => EventElement::Port,
            Other(_) => EventElement::Unknown,
        }
    }
}

/// What an async event's `element` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventElement {
    /// The `user_handle` given when the CQ was created.
    Cq,
    /// The `user_handle` given when the QP was created.
    Qp,
    /// The `user_handle` given when the SRQ was created.
    Srq,
    /// A work queue's `user_handle` (not created by this layer).
    Wq,
    /// A port number (device-wide events too).
    Port,
    /// Unknown event kind.
    Unknown,
}

/// One asynchronous event from the context's async fd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    pub kind: AsyncEventKind,
    /// See [`AsyncEventKind::element`].
    pub element: u64,
}

/// One completion event from the context's completion channel: the CQ's `user_handle`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompEvent {
    pub cq_user_handle: u64,
}

//! Verbs-level constants carried in commands and in native queue entries.
//!
//! Numeric values are those of rdma-core's `<infiniband/verbs.h>` (`ibv_*`), which are
//! also the kernel uverbs ABI values, so both sides can pass them through unchanged.

use std::fmt;
use std::net::Ipv6Addr;
use std::ops::{BitAnd, BitOr, BitOrAssign, Not};

use crate::status::Status;

/// Defines a set of flag bits: a `u32` newtype with the shared constructors, queries and
/// operators. Each type defines its own checked `from_bits` (what "defined" means differs).
macro_rules! flag_set {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
        pub struct $name(u32);

        impl $name {
            /// No flag.
            pub const fn empty() -> Self {
                $name(0)
            }

            /// Exactly these bits, defined or not (for values already checked elsewhere, or
            /// passed through from the kernel unchanged).
            pub const fn from_bits_retain(bits: u32) -> Self {
                $name(bits)
            }

            /// The raw bits.
            pub const fn bits(self) -> u32 {
                self.0
            }

            /// Whether every bit of `other` is set.
            pub const fn contains(self, other: $name) -> bool {
                self.0 & other.0 == other.0
            }

            /// Whether any bit of `other` is set.
            pub const fn intersects(self, other: $name) -> bool {
                self.0 & other.0 != 0
            }
        }

        impl BitOr for $name {
            type Output = $name;
            fn bitor(self, rhs: $name) -> $name {
                $name(self.0 | rhs.0)
            }
        }

        impl BitOrAssign for $name {
            fn bitor_assign(&mut self, rhs: $name) {
                self.0 |= rhs.0;
            }
        }

        impl BitAnd for $name {
            type Output = $name;
            fn bitand(self, rhs: $name) -> $name {
                $name(self.0 & rhs.0)
            }
        }

        /// The complement over all 32 bits (undefined ones included).
        impl Not for $name {
            type Output = $name;
            fn not(self) -> $name {
                $name(!self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({:#x})"), self.0)
            }
        }
    };
}

/// Declares a verbs enum from one list of `Variant = value`: the enum, with those
/// discriminants and the `repr` after its name, and the fallible conversion from that raw type
/// and from each `impl TryFrom<T>;` listed after the enum. A conversion hands back the raw
/// value it rejects.
macro_rules! verbs_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident: $repr:ident {
            $($(#[$vmeta:meta])* $variant:ident = $value:literal,)+
        }
        $($(#[$imeta:meta])* impl TryFrom<$wider:ident>;)*
    ) => {
        $(#[$meta])*
        #[repr($repr)]
        pub enum $name {
            $($(#[$vmeta])* $variant = $value,)+
        }

        verbs_enum!(@conversions $name { $($variant = $value),+ } $repr $($(#[$imeta])* $wider)*);
    };
    (@conversions $name:ident $variants:tt $($(#[$imeta:meta])* $raw:ident)+) => {
        $(verbs_enum!(@try_from $(#[$imeta])* $name: $raw $variants);)+
    };
    (@try_from $(#[$imeta:meta])* $name:ident: $raw:ident { $($variant:ident = $value:literal),+ }) => {
        $(#[$imeta])*
        impl TryFrom<$raw> for $name {
            type Error = $raw;
            fn try_from(v: $raw) -> Result<Self, $raw> {
                match v {
                    $($value => Ok($name::$variant),)+
                    v => Err(v),
                }
            }
        }
    };
}

flag_set!(
    /// Memory-region and QP access flags (`ibv_access_flags`, the kernel's `IB_ACCESS_*`).
    AccessFlags
);

impl AccessFlags {
    /// Local write access (required by remote write and remote atomic).
    pub const LOCAL_WRITE: AccessFlags = AccessFlags(1 << 0);
    /// Remote RDMA write access.
    pub const REMOTE_WRITE: AccessFlags = AccessFlags(1 << 1);
    /// Remote RDMA read access.
    pub const REMOTE_READ: AccessFlags = AccessFlags(1 << 2);
    /// Remote atomic access.
    pub const REMOTE_ATOMIC: AccessFlags = AccessFlags(1 << 3);
    /// Memory-window binding (not supported by vrdma 1.0).
    pub const MW_BIND: AccessFlags = AccessFlags(1 << 4);
    /// Zero-based addressing (not supported by vrdma 1.0).
    pub const ZERO_BASED: AccessFlags = AccessFlags(1 << 5);
    /// On-demand paging (not supported by vrdma 1.0).
    pub const ON_DEMAND: AccessFlags = AccessFlags(1 << 6);
    /// Relaxed ordering (optional hint; the device may ignore it).
    pub const RELAXED_ORDERING: AccessFlags = AccessFlags(1 << 20);
    /// Flags REG_MR accepts.
    pub const MR_ALLOWED: AccessFlags = AccessFlags(
        Self::LOCAL_WRITE.0
            | Self::REMOTE_WRITE.0
            | Self::REMOTE_READ.0
            | Self::REMOTE_ATOMIC.0
            | Self::RELAXED_ORDERING.0,
    );
    /// Flags MODIFY_QP (`IBV_QP_ACCESS_FLAGS`) accepts.
    pub const QP_ALLOWED: AccessFlags = AccessFlags(
        Self::LOCAL_WRITE.0 | Self::REMOTE_WRITE.0 | Self::REMOTE_READ.0 | Self::REMOTE_ATOMIC.0,
    );

    /// Flags from `ibv_access_flags` bits; `None` if a bit is not one vrdma carries (outside
    /// [`AccessFlags::MR_ALLOWED`]).
    pub const fn from_bits(bits: u32) -> Option<Self> {
        if bits & !Self::MR_ALLOWED.0 == 0 {
            Some(AccessFlags(bits))
        } else {
            None
        }
    }
}

verbs_enum! {
    /// QP transport types supported by vrdma (`ibv_qp_type` values).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum QpType: u8 {
        /// Reliable connected.
        Rc = 2,
        /// Unreliable datagram (needs `VRDMA_F_UD`).
        Ud = 4,
    }
    /// From `ibv_qp_type` as the C API passes it (an `enum`, so 32 bits wide).
    impl TryFrom<u32>;
}

verbs_enum! {
    /// QP states (`ibv_qp_state`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum QpState: u32 {
        /// Reset.
        #[default]
        Reset = 0,
        /// Initialized.
        Init = 1,
        /// Ready to receive.
        Rtr = 2,
        /// Ready to send.
        Rts = 3,
        /// Send queue drained.
        Sqd = 4,
        /// Send queue error.
        Sqe = 5,
        /// Error.
        Err = 6,
    }
}

flag_set!(
    /// Which QP attributes MODIFY_QP applies / QUERY_QP returns (`ibv_qp_attr_mask`).
    QpAttrMask
);

impl QpAttrMask {
    /// `qp_state`.
    pub const STATE: QpAttrMask = QpAttrMask(1 << 0);
    /// `cur_qp_state`.
    pub const CUR_STATE: QpAttrMask = QpAttrMask(1 << 1);
    /// `en_sqd_async_notify`.
    pub const EN_SQD_ASYNC_NOTIFY: QpAttrMask = QpAttrMask(1 << 2);
    /// `qp_access_flags`.
    pub const ACCESS_FLAGS: QpAttrMask = QpAttrMask(1 << 3);
    /// `pkey_index`.
    pub const PKEY_INDEX: QpAttrMask = QpAttrMask(1 << 4);
    /// `port_num`.
    pub const PORT: QpAttrMask = QpAttrMask(1 << 5);
    /// `qkey`.
    pub const QKEY: QpAttrMask = QpAttrMask(1 << 6);
    /// `ah_attr` (primary address vector).
    pub const AV: QpAttrMask = QpAttrMask(1 << 7);
    /// `path_mtu`.
    pub const PATH_MTU: QpAttrMask = QpAttrMask(1 << 8);
    /// `timeout`.
    pub const TIMEOUT: QpAttrMask = QpAttrMask(1 << 9);
    /// `retry_cnt`.
    pub const RETRY_CNT: QpAttrMask = QpAttrMask(1 << 10);
    /// `rnr_retry`.
    pub const RNR_RETRY: QpAttrMask = QpAttrMask(1 << 11);
    /// `rq_psn`.
    pub const RQ_PSN: QpAttrMask = QpAttrMask(1 << 12);
    /// `max_rd_atomic`.
    pub const MAX_QP_RD_ATOMIC: QpAttrMask = QpAttrMask(1 << 13);
    /// `alt_ah_attr`, `alt_pkey_index`, `alt_port_num`, `alt_timeout`.
    pub const ALT_PATH: QpAttrMask = QpAttrMask(1 << 14);
    /// `min_rnr_timer`.
    pub const MIN_RNR_TIMER: QpAttrMask = QpAttrMask(1 << 15);
    /// `sq_psn`.
    pub const SQ_PSN: QpAttrMask = QpAttrMask(1 << 16);
    /// `max_dest_rd_atomic`.
    pub const MAX_DEST_RD_ATOMIC: QpAttrMask = QpAttrMask(1 << 17);
    /// `path_mig_state`.
    pub const PATH_MIG_STATE: QpAttrMask = QpAttrMask(1 << 18);
    /// `cap` (never valid in MODIFY_QP: queues are not resizable).
    pub const CAP: QpAttrMask = QpAttrMask(1 << 19);
    /// `dest_qp_num`.
    pub const DEST_QPN: QpAttrMask = QpAttrMask(1 << 20);
    /// `rate_limit` (never valid for RC/UD).
    pub const RATE_LIMIT: QpAttrMask = QpAttrMask(1 << 25);
    /// Every bit the kernel's legacy MODIFY_QP / QUERY_QP commands take (`STATE` through
    /// `DEST_QPN`; `RATE_LIMIT` needs the extended command).
    pub const LEGACY_ALL: QpAttrMask = QpAttrMask((1 << 21) - 1);
    /// Every bit defined by this version; the others are reserved.
    pub const ALL: QpAttrMask = QpAttrMask(Self::LEGACY_ALL.0 | Self::RATE_LIMIT.0);

    /// A mask from raw bits; `None` if a bit is not defined (outside [`QpAttrMask::ALL`]).
    pub const fn from_bits(bits: u32) -> Option<Self> {
        if bits & !Self::ALL.0 == 0 {
            Some(QpAttrMask(bits))
        } else {
            None
        }
    }
}

verbs_enum! {
    /// Path MTU (`ibv_mtu`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum Mtu: u32 {
        /// 256 bytes.
        Mtu256 = 1,
        /// 512 bytes.
        Mtu512 = 2,
        /// 1024 bytes.
        #[default]
        Mtu1024 = 3,
        /// 2048 bytes.
        Mtu2048 = 4,
        /// 4096 bytes.
        Mtu4096 = 5,
    }
}

impl Mtu {
    /// Size in bytes.
    pub const fn bytes(self) -> u32 {
        128 << self as u32
    }
}

/// `static_rate` upper bound (`IBV_RATE_1200_GBPS`); 0 means "port rate".
pub const MAX_STATIC_RATE: u8 = 24;

/// A GID, in network byte order as in `union ibv_gid`.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The raw bytes.
    pub const fn raw(&self) -> &[u8; 16] {
        &self.0
    }

    /// True for the all-zero GID (an empty table entry).
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(addr: Ipv6Addr) -> Self {
        Gid(addr.octets())
    }
}

impl From<Gid> for Ipv6Addr {
    fn from(gid: Gid) -> Self {
        Ipv6Addr::from(gid.0)
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Ipv6Addr::from(self.0).fmt(f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

verbs_enum! {
    /// GID types (`ibv_gid_type`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum GidType: u32 {
        /// InfiniBand GID.
        Ib = 0,
        /// RoCE v1.
        RoceV1 = 1,
        /// RoCE v2 (UDP encapsulated); what rxe reports.
        RoceV2 = 2,
    }
}

verbs_enum! {
    /// Port states (`ibv_port_state`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum PortState: u32 {
        /// No state change.
        Nop = 0,
        /// Down.
        Down = 1,
        /// Initializing.
        Init = 2,
        /// Armed.
        Armed = 3,
        /// Active.
        Active = 4,
        /// Active, deferring (`IB_PORT_ACTIVE_DEFER`).
        ActiveDefer = 5,
    }
}

verbs_enum! {
    /// Send work-request opcodes vrdma carries (`ibv_wr_opcode`), as written into
    /// `rxe_send_wr.opcode`. The other `ibv_wr_opcode` values (local invalidate,
    /// memory-window bind, send with invalidate, …) are refused by `try_from`.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub enum WrOpcode: u32 {
        /// RDMA write.
        RdmaWrite = 0,
        /// RDMA write with immediate data (consumes a receive at the target).
        RdmaWriteWithImm = 1,
        /// Send.
        #[default]
        Send = 2,
        /// Send with immediate data.
        SendWithImm = 3,
        /// RDMA read.
        RdmaRead = 4,
        /// 64-bit atomic compare and swap.
        AtomicCmpAndSwp = 5,
        /// 64-bit atomic fetch and add.
        AtomicFetchAndAdd = 6,
    }
}

impl WrOpcode {
    /// Whether the opcode carries immediate data.
    pub const fn has_imm(self) -> bool {
        matches!(self, WrOpcode::RdmaWriteWithImm | WrOpcode::SendWithImm)
    }

    /// Whether the opcode addresses remote memory through `remote_addr`/`rkey`.
    pub const fn is_rdma(self) -> bool {
        matches!(
            self,
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm | WrOpcode::RdmaRead
        )
    }

    /// Whether the opcode is a remote atomic operation.
    pub const fn is_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
        )
    }

    /// Whether the payload may be given inline (it flows from the local buffer to the wire).
    pub const fn allows_inline(self) -> bool {
        matches!(
            self,
            WrOpcode::Send
                | WrOpcode::SendWithImm
                | WrOpcode::RdmaWrite
                | WrOpcode::RdmaWriteWithImm
        )
    }
}

/// Send flags written into `rxe_send_wr.send_flags` (`ibv_send_flags`).
pub mod send_flags {
    /// Fence.
    pub const FENCE: u32 = 1 << 0;
    /// Generate a completion.
    pub const SIGNALED: u32 = 1 << 1;
    /// Solicited event.
    pub const SOLICITED: u32 = 1 << 2;
    /// Payload inline in the WQE.
    pub const INLINE: u32 = 1 << 3;
}

/// Defines a completion enum whose raw value comes from shared memory: every known value has
/// a variant, any other value is kept in `Other` instead of being trusted or dropped.
macro_rules! completion_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident = $value:expr,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
            /// A value this library does not know.
            Other(u32),
        }

        impl $name {
            /// Decodes the raw value found in a completion.
            pub const fn from_raw(raw: u32) -> Self {
                match raw {
                    $($value => $name::$variant,)+
                    other => $name::Other(other),
                }
            }

            /// The raw (`ibv_*`) value.
            pub const fn raw(self) -> u32 {
                match self {
                    $($name::$variant => $value,)+
                    $name::Other(other) => other,
                }
            }
        }
    };
}

completion_enum! {
    /// Completion status (`ibv_wc_status`), as found in native CQEs.
    pub enum WcStatus {
        /// Success.
        #[default]
        Success = 0,
        /// Local length error.
        LocLenErr = 1,
        /// Local QP operation error.
        LocQpOpErr = 2,
        /// Local EE context operation error.
        LocEecOpErr = 3,
        /// Local protection error.
        LocProtErr = 4,
        /// Flushed: the QP entered the error state.
        WrFlushErr = 5,
        /// Memory-window bind error.
        MwBindErr = 6,
        /// Bad response.
        BadRespErr = 7,
        /// Local access error.
        LocAccessErr = 8,
        /// Remote invalid request.
        RemInvReqErr = 9,
        /// Remote access error.
        RemAccessErr = 10,
        /// Remote operation error.
        RemOpErr = 11,
        /// Transport retry counter exceeded.
        RetryExcErr = 12,
        /// RNR retry counter exceeded.
        RnrRetryExcErr = 13,
        /// Local RDD violation.
        LocRddViolErr = 14,
        /// Remote invalid RD request.
        RemInvRdReqErr = 15,
        /// Remote aborted.
        RemAbortErr = 16,
        /// Invalid EE context number.
        InvEecnErr = 17,
        /// Invalid EE context state.
        InvEecStateErr = 18,
        /// Fatal error.
        FatalErr = 19,
        /// Response timeout.
        RespTimeoutErr = 20,
        /// General error.
        GeneralErr = 21,
    }
}

completion_enum! {
    /// Completion opcode (`ibv_wc_opcode`), as found in native CQEs. Only meaningful when the
    /// status is success.
    pub enum WcOpcode {
        /// Send.
        #[default]
        Send = 0,
        /// RDMA write.
        RdmaWrite = 1,
        /// RDMA read.
        RdmaRead = 2,
        /// Compare and swap.
        CompSwap = 3,
        /// Fetch and add.
        FetchAdd = 4,
        /// Memory-window bind.
        BindMw = 5,
        /// Local invalidate.
        LocalInv = 6,
        /// TCP segmentation offload.
        Tso = 7,
        /// Flush.
        Flush = 8,
        /// Atomic write.
        AtomicWrite = 9,
        /// Receive (test `raw() & 128` for "any receive", as with ibverbs).
        Recv = 128,
        /// Receive of an RDMA write with immediate data.
        RecvRdmaWithImm = 129,
    }
}

/// Work-completion flags (`ibv_wc_flags`).
pub mod wc_flags {
    /// A GRH is present in the first 40 bytes of the receive buffer (UD).
    pub const GRH: u32 = 1 << 0;
    /// `imm_data` is valid.
    pub const WITH_IMM: u32 = 1 << 1;
    /// `invalidate_rkey` is valid.
    pub const WITH_INV: u32 = 1 << 3;
}

/// ARM_CQ flags.
pub mod arm_flags {
    /// Notify only for solicited completions (`ibv_req_notify_cq(cq, 1)`).
    pub const SOLICITED_ONLY: u32 = 1 << 0;
}

/// MODIFY_SRQ `attr_mask` bits (`ibv_srq_attr_mask`).
pub mod srq_attr {
    /// Resize (`max_wr`); answered with UNSUPPORTED by vrdma 1.0.
    pub const MAX_WR: u32 = 1 << 0;
    /// Arm the limit event (`srq_limit`).
    pub const LIMIT: u32 = 1 << 1;
}

/// Maximum value of a 24-bit packet sequence number or QP number.
pub const MAX_PSN: u32 = 0x00ff_ffff;
/// Maximum value of a 20-bit IPv6 flow label.
pub const MAX_FLOW_LABEL: u32 = 0x000f_ffff;

/// Required and optional `attr_mask` bits of one legal QP state transition, per the
/// InfiniBand state table (the same table as the kernel's `ib_modify_qp_is_ok`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    /// Bits that must be present (besides `STATE`).
    pub required: QpAttrMask,
    /// Bits that may be present.
    pub optional: QpAttrMask,
}

/// Looks up the transition `cur -> next` for `qp_type`; `None` if it is not legal.
pub fn qp_transition(qp_type: QpType, cur: QpState, next: QpState) -> Option<Transition> {
    use QpState::*;
    // The state table's own names, so the table below reads like the specification's.
    const NONE: QpAttrMask = QpAttrMask::empty();
    const CUR_STATE: QpAttrMask = QpAttrMask::CUR_STATE;
    const EN_SQD_ASYNC_NOTIFY: QpAttrMask = QpAttrMask::EN_SQD_ASYNC_NOTIFY;
    const ACCESS_FLAGS: QpAttrMask = QpAttrMask::ACCESS_FLAGS;
    const PKEY_INDEX: QpAttrMask = QpAttrMask::PKEY_INDEX;
    const PORT: QpAttrMask = QpAttrMask::PORT;
    const QKEY: QpAttrMask = QpAttrMask::QKEY;
    const AV: QpAttrMask = QpAttrMask::AV;
    const PATH_MTU: QpAttrMask = QpAttrMask::PATH_MTU;
    const TIMEOUT: QpAttrMask = QpAttrMask::TIMEOUT;
    const RETRY_CNT: QpAttrMask = QpAttrMask::RETRY_CNT;
    const RNR_RETRY: QpAttrMask = QpAttrMask::RNR_RETRY;
    const RQ_PSN: QpAttrMask = QpAttrMask::RQ_PSN;
    const MAX_QP_RD_ATOMIC: QpAttrMask = QpAttrMask::MAX_QP_RD_ATOMIC;
    const ALT_PATH: QpAttrMask = QpAttrMask::ALT_PATH;
    const MIN_RNR_TIMER: QpAttrMask = QpAttrMask::MIN_RNR_TIMER;
    const SQ_PSN: QpAttrMask = QpAttrMask::SQ_PSN;
    const MAX_DEST_RD_ATOMIC: QpAttrMask = QpAttrMask::MAX_DEST_RD_ATOMIC;
    const PATH_MIG_STATE: QpAttrMask = QpAttrMask::PATH_MIG_STATE;
    const DEST_QPN: QpAttrMask = QpAttrMask::DEST_QPN;
    let rc = qp_type == QpType::Rc;
    let t = |required: QpAttrMask, optional: QpAttrMask| Some(Transition { required, optional });
    match (cur, next) {
        (Reset, Reset) => t(NONE, NONE),
        (Reset, Init) => t(
            PKEY_INDEX | PORT | if rc { ACCESS_FLAGS } else { QKEY },
            NONE,
        ),
        // Every state except RESET may go to RESET or ERR with no attributes.
        (Init | Rtr | Rts | Sqd | Sqe | Err, Reset | Err) => t(NONE, NONE),
        (Init, Init) => t(
            NONE,
            PKEY_INDEX | PORT | if rc { ACCESS_FLAGS } else { QKEY },
        ),
        (Init, Rtr) if rc => t(
            AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER,
            ALT_PATH | ACCESS_FLAGS | PKEY_INDEX,
        ),
        (Init, Rtr) => t(NONE, PKEY_INDEX | QKEY),
        (Rtr, Rts) if rc => t(
            TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC,
            CUR_STATE | ALT_PATH | ACCESS_FLAGS | MIN_RNR_TIMER | PATH_MIG_STATE,
        ),
        (Rtr, Rts) => t(SQ_PSN, CUR_STATE | QKEY),
        (Rts | Sqd, Rts) if rc => t(
            NONE,
            CUR_STATE | ACCESS_FLAGS | ALT_PATH | PATH_MIG_STATE | MIN_RNR_TIMER,
        ),
        (Rts | Sqd | Sqe, Rts) if !rc => t(NONE, CUR_STATE | QKEY),
        (Rts, Sqd) => t(NONE, EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) if rc => t(
            NONE,
            PORT | AV
                | TIMEOUT
                | RETRY_CNT
                | RNR_RETRY
                | MAX_QP_RD_ATOMIC
                | MAX_DEST_RD_ATOMIC
                | ALT_PATH
                | ACCESS_FLAGS
                | PKEY_INDEX
                | MIN_RNR_TIMER
                | PATH_MIG_STATE,
        ),
        (Sqd, Sqd) => t(NONE, PKEY_INDEX | QKEY),
        _ => None,
    }
}

/// Checks a MODIFY_QP `attr_mask` against the QP's type and current state.
///
/// Returns [`Status::BadState`] when the transition is illegal (including a
/// `cur_qp_state` that differs from the actual state, or `CUR_STATE` given from a state
/// that does not allow it), and [`Status::Invalid`] when the transition is legal but the
/// mask lacks a required attribute or carries one that is not allowed.
pub fn check_modify_qp(
    qp_type: QpType,
    cur: QpState,
    attr_mask: QpAttrMask,
    next: QpState,
    claimed_cur: Option<QpState>,
) -> Result<(), Status> {
    if let Some(claimed) = claimed_cur {
        if claimed != cur
            || !matches!(
                cur,
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            )
        {
            return Err(Status::BadState);
        }
    }
    let t = qp_transition(qp_type, cur, next).ok_or(Status::BadState)?;
    if !attr_mask.contains(t.required) {
        return Err(Status::Invalid);
    }
    if attr_mask.intersects(!(t.required | t.optional | QpAttrMask::STATE)) {
        return Err(Status::Invalid);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_types_convert_both_ways_and_refuse_others() {
        for t in [QpType::Rc, QpType::Ud] {
            assert_eq!(QpType::try_from(t as u8), Ok(t));
            assert_eq!(QpType::try_from(t as u8 as u32), Ok(t));
        }
        assert_eq!(QpType::Rc as u8, 2);
        assert_eq!(QpType::Ud as u8, 4);
        // UC (3) and everything else is not carried.
        for v in [0u8, 1, 3, 5, u8::MAX] {
            assert_eq!(QpType::try_from(v), Err(v));
        }
        for v in [3u32, 0x102, 0x104, u32::MAX] {
            assert_eq!(QpType::try_from(v), Err(v));
        }
    }

    #[test]
    fn qp_states_convert_both_ways_and_refuse_others() {
        use QpState::*;
        for (raw, state) in [Reset, Init, Rtr, Rts, Sqd, Sqe, Err]
            .into_iter()
            .enumerate()
        {
            assert_eq!(state as u32, raw as u32);
            assert_eq!(QpState::try_from(raw as u32), Ok(state));
        }
        assert_eq!(QpState::try_from(7), Result::Err(7));
        assert_eq!(QpState::try_from(u32::MAX), Result::Err(u32::MAX));
        assert_eq!(QpState::default(), Reset);
    }

    #[test]
    fn mtu_values_and_sizes() {
        assert_eq!(Mtu::Mtu256.bytes(), 256);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        assert_eq!(Mtu::try_from(3), Ok(Mtu::Mtu1024));
        assert_eq!(Mtu::try_from(6), Err(6));
        for mtu in [
            Mtu::Mtu256,
            Mtu::Mtu512,
            Mtu::Mtu1024,
            Mtu::Mtu2048,
            Mtu::Mtu4096,
        ] {
            assert_eq!(Mtu::try_from(mtu as u32), Ok(mtu));
        }
        assert_eq!(Mtu::try_from(0), Err(0));
    }

    #[test]
    fn gid_and_port_states_convert_both_ways_and_refuse_others() {
        for t in [GidType::Ib, GidType::RoceV1, GidType::RoceV2] {
            assert_eq!(GidType::try_from(t as u32), Ok(t));
        }
        assert_eq!(GidType::RoceV2 as u32, 2);
        assert_eq!(GidType::try_from(3), Err(3));
        use PortState::*;
        for (raw, state) in [Nop, Down, Init, Armed, Active, ActiveDefer]
            .into_iter()
            .enumerate()
        {
            assert_eq!(state as u32, raw as u32);
            assert_eq!(PortState::try_from(raw as u32), Ok(state));
        }
        assert_eq!(PortState::try_from(6), Err(6));
    }

    #[test]
    fn access_flags_keep_ibverbs_values() {
        let f = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        assert_eq!(f.bits(), 0x7);
        assert_eq!(AccessFlags::REMOTE_ATOMIC.bits(), 0x8);
        assert_eq!(AccessFlags::RELAXED_ORDERING.bits(), 1 << 20);
        assert_eq!(AccessFlags::from_bits(0x7), Some(f));
        assert_eq!(AccessFlags::from_bits(AccessFlags::MW_BIND.bits()), None);
        assert_eq!(AccessFlags::MR_ALLOWED.bits(), 0xf | (1 << 20));
        assert_eq!(AccessFlags::QP_ALLOWED.bits(), 0xf);
        for undefined in [AccessFlags::ZERO_BASED, AccessFlags::ON_DEMAND] {
            assert_eq!(AccessFlags::from_bits(undefined.bits()), None);
        }
        assert_eq!(AccessFlags::from_bits(1 << 31), None);
        assert_eq!(AccessFlags::from_bits_retain(1 << 31).bits(), 1 << 31);
        let mut g = AccessFlags::empty();
        g |= AccessFlags::REMOTE_READ;
        assert!(f.contains(g) && !g.contains(f) && g.intersects(f));
        assert_eq!(format!("{f:?}"), "AccessFlags(0x7)");
    }

    #[test]
    fn qp_attr_masks_keep_ibverbs_values() {
        assert_eq!(QpAttrMask::DEST_QPN.bits(), 1 << 20);
        assert_eq!(QpAttrMask::LEGACY_ALL.bits(), (1 << 21) - 1);
        assert_eq!(QpAttrMask::ALL.bits(), ((1 << 21) - 1) | (1 << 25));
        assert_eq!(
            QpAttrMask::from_bits(QpAttrMask::ALL.bits()),
            Some(QpAttrMask::ALL)
        );
        assert_eq!(QpAttrMask::from_bits(1 << 21), None);
        assert_eq!(QpAttrMask::from_bits_retain(1 << 21).bits(), 1 << 21);
        assert!(!QpAttrMask::LEGACY_ALL.contains(QpAttrMask::RATE_LIMIT));
        assert!((!QpAttrMask::LEGACY_ALL).contains(QpAttrMask::RATE_LIMIT));
        let m = QpAttrMask::STATE | QpAttrMask::AV;
        assert_eq!(m & QpAttrMask::AV, QpAttrMask::AV);
        assert_eq!(format!("{m:?}"), "QpAttrMask(0x81)");
    }

    #[test]
    fn wr_opcodes_convert_both_ways_and_refuse_others() {
        use WrOpcode::*;
        let all = [
            RdmaWrite,
            RdmaWriteWithImm,
            Send,
            SendWithImm,
            RdmaRead,
            AtomicCmpAndSwp,
            AtomicFetchAndAdd,
        ];
        for (raw, op) in all.into_iter().enumerate() {
            assert_eq!(op as u32, raw as u32);
            assert_eq!(WrOpcode::try_from(raw as u32), Ok(op));
        }
        // LOCAL_INV, BIND_MW, SEND_WITH_INV, TSO and the rest are not carried.
        for v in [7, 8, 9, 10, 15, u32::MAX] {
            assert_eq!(WrOpcode::try_from(v), Err(v));
        }
    }

    #[test]
    fn completion_values_round_trip_and_keep_unknown_ones() {
        // ibv_wc_opcode values from rdma-core's verbs.h that the 6.1 uapi header lacks.
        assert_eq!(WcOpcode::from_raw(8), WcOpcode::Flush);
        assert_eq!(WcOpcode::from_raw(9), WcOpcode::AtomicWrite);
        assert_eq!(WcOpcode::from_raw(128), WcOpcode::Recv);
        assert_eq!(WcOpcode::from_raw(129), WcOpcode::RecvRdmaWithImm);
        assert_eq!(WcOpcode::from_raw(10), WcOpcode::Other(10));
        assert_eq!(WcStatus::from_raw(5), WcStatus::WrFlushErr);
        assert_eq!(WcStatus::from_raw(21), WcStatus::GeneralErr);
        assert_eq!(WcStatus::from_raw(22), WcStatus::Other(22));
        for raw in (0..300).chain([u32::MAX]) {
            assert_eq!(WcOpcode::from_raw(raw).raw(), raw);
            assert_eq!(WcStatus::from_raw(raw).raw(), raw);
        }
    }

    #[test]
    fn opcode_classes() {
        use WrOpcode::*;
        let all = [
            RdmaWrite,
            RdmaWriteWithImm,
            Send,
            SendWithImm,
            RdmaRead,
            AtomicCmpAndSwp,
            AtomicFetchAndAdd,
        ];
        let inline: Vec<_> = all.iter().filter(|op| op.allows_inline()).collect();
        assert_eq!(inline, [&RdmaWrite, &RdmaWriteWithImm, &Send, &SendWithImm]);
        let imm: Vec<_> = all.iter().filter(|op| op.has_imm()).collect();
        assert_eq!(imm, [&RdmaWriteWithImm, &SendWithImm]);
        let rdma: Vec<_> = all.iter().filter(|op| op.is_rdma()).collect();
        assert_eq!(rdma, [&RdmaWrite, &RdmaWriteWithImm, &RdmaRead]);
        let atomic: Vec<_> = all.iter().filter(|op| op.is_atomic()).collect();
        assert_eq!(atomic, [&AtomicCmpAndSwp, &AtomicFetchAndAdd]);
    }
}

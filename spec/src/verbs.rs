//! Verbs-level constants carried in commands and in native queue entries.
//!
//! Numeric values are those of rdma-core's `<infiniband/verbs.h>` (`ibv_*`), which are
//! also the kernel uverbs ABI values, so both sides can pass them through unchanged.

use crate::status::Status;

/// Memory-region and QP access flags (`ibv_access_flags`).
pub mod access {
    /// Local write access (required by remote write and remote atomic).
    pub const LOCAL_WRITE: u32 = 1 << 0;
    /// Remote RDMA write access.
    pub const REMOTE_WRITE: u32 = 1 << 1;
    /// Remote RDMA read access.
    pub const REMOTE_READ: u32 = 1 << 2;
    /// Remote atomic access.
    pub const REMOTE_ATOMIC: u32 = 1 << 3;
    /// Memory-window binding (not supported by vrdma 1.0).
    pub const MW_BIND: u32 = 1 << 4;
    /// Zero-based addressing (not supported by vrdma 1.0).
    pub const ZERO_BASED: u32 = 1 << 5;
    /// On-demand paging (not supported by vrdma 1.0).
    pub const ON_DEMAND: u32 = 1 << 6;
    /// Relaxed ordering (optional hint; the device may ignore it).
    pub const RELAXED_ORDERING: u32 = 1 << 20;
    /// Flags REG_MR accepts.
    pub const MR_ALLOWED: u32 =
        LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC | RELAXED_ORDERING;
    /// Flags MODIFY_QP (`IBV_QP_ACCESS_FLAGS`) accepts.
    pub const QP_ALLOWED: u32 = LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC;
}

/// QP transport types supported by vrdma (`ibv_qp_type` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum QpType {
    /// Reliable connected.
    Rc = 2,
    /// Unreliable datagram (needs `VRDMA_F_UD`).
    Ud = 4,
}

impl TryFrom<u8> for QpType {
    type Error = u8;
    fn try_from(v: u8) -> Result<Self, u8> {
        match v {
            2 => Ok(QpType::Rc),
            4 => Ok(QpType::Ud),
            v => Err(v),
        }
    }
}

/// QP states (`ibv_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum QpState {
    /// Reset.
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

impl TryFrom<u32> for QpState {
    type Error = u32;
    fn try_from(v: u32) -> Result<Self, u32> {
        Ok(match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            6 => QpState::Err,
            v => return Err(v),
        })
    }
}

/// `attr_mask` bits of MODIFY_QP / QUERY_QP (`ibv_qp_attr_mask`).
pub mod qp_attr {
    /// `qp_state`.
    pub const STATE: u32 = 1 << 0;
    /// `cur_qp_state`.
    pub const CUR_STATE: u32 = 1 << 1;
    /// `en_sqd_async_notify`.
    pub const EN_SQD_ASYNC_NOTIFY: u32 = 1 << 2;
    /// `qp_access_flags`.
    pub const ACCESS_FLAGS: u32 = 1 << 3;
    /// `pkey_index`.
    pub const PKEY_INDEX: u32 = 1 << 4;
    /// `port_num`.
    pub const PORT: u32 = 1 << 5;
    /// `qkey`.
    pub const QKEY: u32 = 1 << 6;
    /// `ah_attr` (primary address vector).
    pub const AV: u32 = 1 << 7;
    /// `path_mtu`.
    pub const PATH_MTU: u32 = 1 << 8;
    /// `timeout`.
    pub const TIMEOUT: u32 = 1 << 9;
    /// `retry_cnt`.
    pub const RETRY_CNT: u32 = 1 << 10;
    /// `rnr_retry`.
    pub const RNR_RETRY: u32 = 1 << 11;
    /// `rq_psn`.
    pub const RQ_PSN: u32 = 1 << 12;
    /// `max_rd_atomic`.
    pub const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    /// `alt_ah_attr`, `alt_pkey_index`, `alt_port_num`, `alt_timeout`.
    pub const ALT_PATH: u32 = 1 << 14;
    /// `min_rnr_timer`.
    pub const MIN_RNR_TIMER: u32 = 1 << 15;
    /// `sq_psn`.
    pub const SQ_PSN: u32 = 1 << 16;
    /// `max_dest_rd_atomic`.
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    /// `path_mig_state`.
    pub const PATH_MIG_STATE: u32 = 1 << 18;
    /// `cap` (never valid in MODIFY_QP: queues are not resizable).
    pub const CAP: u32 = 1 << 19;
    /// `dest_qp_num`.
    pub const DEST_QPN: u32 = 1 << 20;
    /// `rate_limit` (never valid for RC/UD).
    pub const RATE_LIMIT: u32 = 1 << 25;
    /// Every bit defined by this version; the others are reserved.
    pub const ALL: u32 = ((1 << 21) - 1) | RATE_LIMIT;
}

/// Path MTU values (`ibv_mtu`): 1 = 256 … 5 = 4096.
pub mod mtu {
    /// 256 bytes.
    pub const MTU_256: u32 = 1;
    /// 4096 bytes.
    pub const MTU_4096: u32 = 5;
}

/// `static_rate` upper bound (`IBV_RATE_1200_GBPS`); 0 means "port rate".
pub const MAX_STATIC_RATE: u8 = 24;

/// GID types (`ibv_gid_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GidType {
    /// InfiniBand GID.
    Ib = 0,
    /// RoCE v1.
    RoceV1 = 1,
    /// RoCE v2 (UDP encapsulated); what rxe reports.
    RoceV2 = 2,
}

impl TryFrom<u32> for GidType {
    type Error = u32;
    fn try_from(v: u32) -> Result<Self, u32> {
        match v {
            0 => Ok(GidType::Ib),
            1 => Ok(GidType::RoceV1),
            2 => Ok(GidType::RoceV2),
            v => Err(v),
        }
    }
}

/// Port states (`ibv_port_state`).
pub mod port_state {
    /// No state change.
    pub const NOP: u32 = 0;
    /// Down.
    pub const DOWN: u32 = 1;
    /// Initializing.
    pub const INIT: u32 = 2;
    /// Armed.
    pub const ARMED: u32 = 3;
    /// Active.
    pub const ACTIVE: u32 = 4;
}

/// Send opcodes written into `rxe_send_wr.opcode` (`ibv_wr_opcode`).
pub mod wr_opcode {
    /// RDMA write.
    pub const RDMA_WRITE: u32 = 0;
    /// RDMA write with immediate.
    pub const RDMA_WRITE_WITH_IMM: u32 = 1;
    /// Send.
    pub const SEND: u32 = 2;
    /// Send with immediate.
    pub const SEND_WITH_IMM: u32 = 3;
    /// RDMA read.
    pub const RDMA_READ: u32 = 4;
    /// Atomic compare and swap.
    pub const ATOMIC_CMP_AND_SWP: u32 = 5;
    /// Atomic fetch and add.
    pub const ATOMIC_FETCH_AND_ADD: u32 = 6;
    /// Local invalidate.
    pub const LOCAL_INV: u32 = 7;
    /// Bind memory window (not supported by vrdma 1.0).
    pub const BIND_MW: u32 = 8;
    /// Send with invalidate.
    pub const SEND_WITH_INV: u32 = 9;
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

/// Work-completion status (`ibv_wc_status`), as found in native CQEs.
pub mod wc_status {
    /// Success.
    pub const SUCCESS: u32 = 0;
    /// Local length error.
    pub const LOC_LEN_ERR: u32 = 1;
    /// Local QP operation error.
    pub const LOC_QP_OP_ERR: u32 = 2;
    /// Local protection error.
    pub const LOC_PROT_ERR: u32 = 4;
    /// Work request flushed.
    pub const WR_FLUSH_ERR: u32 = 5;
    /// Local access error.
    pub const LOC_ACCESS_ERR: u32 = 8;
    /// Remote invalid request.
    pub const REM_INV_REQ_ERR: u32 = 9;
    /// Remote access error.
    pub const REM_ACCESS_ERR: u32 = 10;
    /// Remote operation error.
    pub const REM_OP_ERR: u32 = 11;
    /// Transport retry counter exceeded.
    pub const RETRY_EXC_ERR: u32 = 12;
    /// RNR retry counter exceeded.
    pub const RNR_RETRY_EXC_ERR: u32 = 13;
    /// Fatal error.
    pub const FATAL_ERR: u32 = 19;
    /// General error.
    pub const GENERAL_ERR: u32 = 21;
}

/// Work-completion opcodes (`ibv_wc_opcode`), as found in native CQEs.
pub mod wc_opcode {
    /// Send completed.
    pub const SEND: u32 = 0;
    /// RDMA write completed.
    pub const RDMA_WRITE: u32 = 1;
    /// RDMA read completed.
    pub const RDMA_READ: u32 = 2;
    /// Compare and swap completed.
    pub const COMP_SWAP: u32 = 3;
    /// Fetch and add completed.
    pub const FETCH_ADD: u32 = 4;
    /// Memory-window bind completed.
    pub const BIND_MW: u32 = 5;
    /// Local invalidate completed.
    pub const LOCAL_INV: u32 = 6;
    /// Receive completed (bit 7 marks every receive opcode).
    pub const RECV: u32 = 1 << 7;
    /// Receive of RDMA write with immediate.
    pub const RECV_RDMA_WITH_IMM: u32 = RECV + 1;
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
    pub required: u32,
    /// Bits that may be present.
    pub optional: u32,
}

/// Looks up the transition `cur -> next` for `qp_type`; `None` if it is not legal.
pub fn qp_transition(qp_type: QpType, cur: QpState, next: QpState) -> Option<Transition> {
    use qp_attr::*;
    use QpState::*;
    let rc = qp_type == QpType::Rc;
    let t = |required: u32, optional: u32| Some(Transition { required, optional });
    match (cur, next) {
        (Reset, Reset) => t(0, 0),
        (Reset, Init) => t(PKEY_INDEX | PORT | if rc { ACCESS_FLAGS } else { QKEY }, 0),
        // Every state except RESET may go to RESET or ERR with no attributes.
        (Init | Rtr | Rts | Sqd | Sqe | Err, Reset | Err) => t(0, 0),
        (Init, Init) => t(0, PKEY_INDEX | PORT | if rc { ACCESS_FLAGS } else { QKEY }),
        (Init, Rtr) if rc => t(
            AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER,
            ALT_PATH | ACCESS_FLAGS | PKEY_INDEX,
        ),
        (Init, Rtr) => t(0, PKEY_INDEX | QKEY),
        (Rtr, Rts) if rc => t(
            TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC,
            CUR_STATE | ALT_PATH | ACCESS_FLAGS | MIN_RNR_TIMER | PATH_MIG_STATE,
        ),
        (Rtr, Rts) => t(SQ_PSN, CUR_STATE | QKEY),
        (Rts | Sqd, Rts) if rc => t(
            0,
            CUR_STATE | ACCESS_FLAGS | ALT_PATH | PATH_MIG_STATE | MIN_RNR_TIMER,
        ),
        (Rts | Sqd | Sqe, Rts) if !rc => t(0, CUR_STATE | QKEY),
        (Rts, Sqd) => t(0, EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) if rc => t(
            0,
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
        (Sqd, Sqd) => t(0, PKEY_INDEX | QKEY),
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
    attr_mask: u32,
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
    if attr_mask & t.required != t.required {
        return Err(Status::Invalid);
    }
    if attr_mask & !(t.required | t.optional | qp_attr::STATE) != 0 {
        return Err(Status::Invalid);
    }
    Ok(())
}

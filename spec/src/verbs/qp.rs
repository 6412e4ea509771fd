//! QP enums (type, state, path MTU), QP number limits and the QP state-transition table.

use super::flags::QpAttrMask;
use crate::status::Status;

verbs_enum! {
    /// QP transport types supported by vrdma (`ibv_qp_type` values).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum QpType: u8 {
        /// Reliable connected.
        Rc = 2,
        /// Unreliable connected (needs `VRDMA_F_UC`): connected like RC, without
        /// acknowledgements, so without RDMA READ, atomics and their attributes.
        Uc = 3,
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

/// Maximum value of a 24-bit packet sequence number or QP number.
pub const MAX_PSN: u32 = 0x00ff_ffff;

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
///
/// The rows and masks are those of Linux's `qp_state_table` (`ib_modify_qp_is_ok`) for the
/// three types: UC is connected like RC (a path, a destination QP and PSNs) but has no
/// acknowledgements, so none of RC's read/atomic depths, retry counts, timeouts or RNR timer.
pub fn qp_transition(qp_type: QpType, cur: QpState, next: QpState) -> Option<Transition> {
    use QpState::*;
    use QpType::{Rc, Uc, Ud};
    // Short names, so the table below reads like the specification's.
    type M = QpAttrMask;
    const NONE: M = M::empty();
    let t = |required: QpAttrMask, optional: QpAttrMask| Some(Transition { required, optional });
    // The attribute a datagram QP has where a connected one has its remote access rights.
    let access_or_qkey = match qp_type {
        Rc | Uc => M::ACCESS_FLAGS,
        Ud => M::QKEY,
    };
    match (cur, next) {
        (Reset, Reset) => t(NONE, NONE),
        (Reset, Init) => t(M::PKEY_INDEX | M::PORT | access_or_qkey, NONE),
        // Every state except RESET may go to RESET or ERR with no attributes.
        (Init | Rtr | Rts | Sqd | Sqe | Err, Reset | Err) => t(NONE, NONE),
        (Init, Init) => t(NONE, M::PKEY_INDEX | M::PORT | access_or_qkey),
        (Init, Rtr) => match qp_type {
            Rc => t(
                M::AV
                    | M::PATH_MTU
                    | M::DEST_QPN
                    | M::RQ_PSN
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
            Uc => t(
                M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
            Ud => t(NONE, M::PKEY_INDEX | M::QKEY),
        },
        (Rtr, Rts) => match qp_type {
            Rc => t(
                M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
            ),
            Uc => t(
                M::SQ_PSN,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE,
            ),
            Ud => t(M::SQ_PSN, M::CUR_STATE | M::QKEY),
        },
        (Rts | Sqd, Rts) => match qp_type {
            Rc => t(
                NONE,
                M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER,
            ),
            Uc => t(
                NONE,
                M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE,
            ),
            Ud => t(NONE, M::CUR_STATE | M::QKEY),
        },
        // An RC QP never enters SQE: its send errors take it to ERR.
        (Sqe, Rts) => match qp_type {
            Rc => None,
            Uc => t(NONE, M::CUR_STATE | M::ACCESS_FLAGS),
            Ud => t(NONE, M::CUR_STATE | M::QKEY),
        },
        (Rts, Sqd) => t(NONE, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => match qp_type {
            Rc => t(
                NONE,
                M::PORT
                    | M::AV
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC
                    | M::MAX_DEST_RD_ATOMIC
                    | M::ALT_PATH
                    | M::ACCESS_FLAGS
                    | M::PKEY_INDEX
                    | M::MIN_RNR_TIMER
                    | M::PATH_MIG_STATE,
            ),
            Uc => t(
                NONE,
                M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE,
            ),
            Ud => t(NONE, M::PKEY_INDEX | M::QKEY),
        },
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
        for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
            assert_eq!(QpType::try_from(t as u8), Ok(t));
            assert_eq!(QpType::try_from(t as u8 as u32), Ok(t));
        }
        // The values of `ibv_qp_type` and of the kernel's `ib_qp_type`.
        assert_eq!(QpType::Rc as u8, 2);
        assert_eq!(QpType::Uc as u8, 3);
        assert_eq!(QpType::Ud as u8, 4);
        // Raw packet (8), XRC (9, 10) and everything else is not carried.
        for v in [0u8, 1, 5, 8, 9, 10, u8::MAX] {
            assert_eq!(QpType::try_from(v), Err(v));
        }
        for v in [0x102u32, 0x103, 0x104, u32::MAX] {
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
}

//! QP enums (type, state, path MTU), QP number limits and the QP state-transition table.

use super::flags::QpAttrMask;
use crate::status::Status;

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
}

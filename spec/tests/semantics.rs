//! QP state table and rxe v1 geometry helpers.

use vrdma_spec::rxe_v1::{self, GeometryError};
use vrdma_spec::verbs::{check_modify_qp, qp_attr::*, qp_transition, QpState, QpType};
use vrdma_spec::wire::RingDesc;
use vrdma_spec::{Le32, Le64, Status};

#[test]
fn rc_connection_sequence_is_legal() {
    use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};
    let rc = QpType::Rc;
    assert_eq!(
        check_modify_qp(
            rc,
            Reset,
            STATE | PKEY_INDEX | PORT | ACCESS_FLAGS,
            Init,
            None
        ),
        Ok(())
    );
    let rtr = STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER;
    assert_eq!(check_modify_qp(rc, Init, rtr, Rtr, None), Ok(()));
    let rts = STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC;
    assert_eq!(check_modify_qp(rc, Rtr, rts, Rts, None), Ok(()));
    assert_eq!(
        check_modify_qp(rc, Rtr, rts | CUR_STATE, Rts, Some(Rtr)),
        Ok(())
    );
    // missing a required attribute
    assert_eq!(
        check_modify_qp(rc, Init, rtr & !DEST_QPN, Rtr, None),
        Err(Status::Invalid)
    );
    // attribute not allowed in this transition
    assert_eq!(
        check_modify_qp(
            rc,
            Reset,
            STATE | PKEY_INDEX | PORT | ACCESS_FLAGS | QKEY,
            Init,
            None
        ),
        Err(Status::Invalid)
    );
    // illegal transitions
    assert_eq!(
        check_modify_qp(rc, Reset, STATE, Rts, None),
        Err(Status::BadState)
    );
    assert_eq!(
        check_modify_qp(rc, Reset, STATE, QpState::Err, None),
        Err(Status::BadState)
    );
    assert_eq!(
        check_modify_qp(rc, Init, STATE, Sqe, None),
        Err(Status::BadState)
    );
    assert_eq!(
        check_modify_qp(rc, Sqe, STATE, Rts, None),
        Err(Status::BadState)
    );
    // claimed current state must match and be one that allows CUR_STATE
    assert_eq!(
        check_modify_qp(rc, Rts, STATE | CUR_STATE, Rts, Some(Rtr)),
        Err(Status::BadState)
    );
    assert_eq!(
        check_modify_qp(rc, Init, STATE | CUR_STATE, Init, Some(Init)),
        Err(Status::BadState)
    );
    // anything (but RESET) to ERR and RESET
    for s in [Init, Rtr, Rts, Sqd, Sqe, QpState::Err] {
        assert_eq!(check_modify_qp(rc, s, STATE, QpState::Err, None), Ok(()));
        assert_eq!(check_modify_qp(rc, s, STATE, Reset, None), Ok(()));
    }
}

#[test]
fn ud_sequence_is_legal() {
    use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};
    let ud = QpType::Ud;
    assert_eq!(
        check_modify_qp(ud, Reset, STATE | PKEY_INDEX | PORT | QKEY, Init, None),
        Ok(())
    );
    assert_eq!(check_modify_qp(ud, Init, STATE, Rtr, None), Ok(()));
    assert_eq!(check_modify_qp(ud, Rtr, STATE | SQ_PSN, Rts, None), Ok(()));
    assert_eq!(check_modify_qp(ud, Sqe, STATE | QKEY, Rts, None), Ok(()));
    assert_eq!(
        check_modify_qp(ud, Init, STATE | AV, Rtr, None),
        Err(Status::Invalid)
    );
    assert!(qp_transition(ud, Rts, Sqd).is_some());
    assert!(qp_transition(ud, Rtr, Rtr).is_none());
}

fn desc() -> RingDesc {
    RingDesc {
        shm_offset: Le64::new(0x10000),
        map_len: Le32::new(0x3000),
        num_slots: Le32::new(64),
        log2_slot_size: Le32::new(7),
        format: Le32::new(rxe_v1::FORMAT_ID),
        db_offset: Le64::ZERO,
        db_len: Le32::ZERO,
        reserved: Le32::ZERO,
    }
}

#[test]
fn ring_geometry_checks() {
    let d = desc();
    assert_eq!(d.check_rxe_v1(1 << 20, 4096), Ok(()));
    assert_eq!(d.check_header(7, 63), Ok(()));
    assert!(matches!(
        d.check_header(7, 127),
        Err(GeometryError::HeaderMismatch { .. })
    ));
    assert!(matches!(
        d.check_header(8, 63),
        Err(GeometryError::HeaderMismatch { .. })
    ));
    // 384 + 64 * 128 = 8576 <= 0x3000
    let mut small = d;
    small.map_len = Le32::new(0x2000);
    assert_eq!(
        small.check_rxe_v1(1 << 20, 4096),
        Err(GeometryError::Bounds)
    );
    assert_eq!(d.check_rxe_v1(0x12000, 4096), Err(GeometryError::Bounds));
    let mut odd = d;
    odd.num_slots = Le32::new(48);
    assert_eq!(
        odd.check_rxe_v1(1 << 20, 4096),
        Err(GeometryError::NumSlots(48))
    );
    let mut mis = d;
    mis.shm_offset = Le64::new(0x10010);
    assert_eq!(
        mis.check_rxe_v1(1 << 20, 4096),
        Err(GeometryError::Alignment)
    );
    let mut huge = d;
    huge.shm_offset = Le64::new(!0xfffu64);
    assert_eq!(
        huge.check_rxe_v1(u64::MAX, 4096),
        Err(GeometryError::Bounds)
    );
    let mut db = d;
    db.db_len = Le32::new(4096);
    assert_eq!(
        db.check_rxe_v1(1 << 20, 4096),
        Err(GeometryError::DoorbellPage)
    );
    let mut fmt = d;
    fmt.format = Le32::new(2);
    assert_eq!(
        fmt.check_rxe_v1(1 << 20, 4096),
        Err(GeometryError::Format(2))
    );
    let mut slot = d;
    slot.log2_slot_size = Le32::new(40);
    assert_eq!(
        slot.check_rxe_v1(u64::MAX, 4096),
        Err(GeometryError::SlotSize(40))
    );
}

#[test]
fn slot_math() {
    assert_eq!(rxe_v1::num_slots_for(0), Some(1));
    assert_eq!(rxe_v1::num_slots_for(1), Some(2));
    assert_eq!(rxe_v1::num_slots_for(127), Some(128));
    assert_eq!(rxe_v1::num_slots_for(128), Some(256));
    assert_eq!(rxe_v1::num_slots_for(u32::MAX), None);
    assert_eq!(rxe_v1::slot_offset(65, 63, 7), 384 + 128);
    assert_eq!(rxe_v1::send_wqe_size(4, 64), 208 + 64);
    assert_eq!(rxe_v1::send_wqe_size(1, 200), 408);
    assert_eq!(rxe_v1::recv_wqe_size(2), 72);
}

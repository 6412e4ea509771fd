//! QP state table, the features a CREATE_QP needs, and rxe v1 geometry helpers.

mod common;

use vrdma_spec::control::ControlRequest;
use vrdma_spec::features::{VRDMA_F_SRQ, VRDMA_F_UC, VRDMA_F_UD};
use vrdma_spec::rxe_v1::{self, GeometryError, RingGeometry};
use vrdma_spec::verbs::{check_modify_qp, qp_transition, QpAttrMask, QpState, QpType};
use vrdma_spec::wire::{ring_flags, RingDesc};
use vrdma_spec::{Le32, Le64, Status};

#[test]
fn rc_connection_sequence_is_legal() {
    use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};
    let rc = QpType::Rc;
    assert_eq!(
        check_modify_qp(
            rc,
            Reset,
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
            Init,
            None
        ),
        Ok(())
    );
    let rtr = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    assert_eq!(check_modify_qp(rc, Init, rtr, Rtr, None), Ok(()));
    let rts = QpAttrMask::STATE
        | QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::SQ_PSN
        | QpAttrMask::MAX_QP_RD_ATOMIC;
    assert_eq!(check_modify_qp(rc, Rtr, rts, Rts, None), Ok(()));
    assert_eq!(
        check_modify_qp(rc, Rtr, rts | QpAttrMask::CUR_STATE, Rts, Some(Rtr)),
        Ok(())
    );
    // missing a required attribute
    assert_eq!(
        check_modify_qp(rc, Init, rtr & !QpAttrMask::DEST_QPN, Rtr, None),
        Err(Status::Invalid)
    );
    // attribute not allowed in this transition
    assert_eq!(
        check_modify_qp(
            rc,
            Reset,
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS
                | QpAttrMask::QKEY,
            Init,
            None
        ),
        Err(Status::Invalid)
    );
    // illegal transitions
    assert_eq!(
        check_modify_qp(rc, Reset, QpAttrMask::STATE, Rts, None),
        Err(Status::BadState)
    );
    assert_eq!(
        check_modify_qp(rc, Reset, QpAttrMask::STATE, QpState::Err, None),
        Err(Status::BadState)
    );
    assert_eq!(
        check_modify_qp(rc, Init, QpAttrMask::STATE, Sqe, None),
        Err(Status::BadState)
    );
    assert_eq!(
        check_modify_qp(rc, Sqe, QpAttrMask::STATE, Rts, None),
        Err(Status::BadState)
    );
    // claimed current state must match and be one that allows QpAttrMask::CUR_STATE
    assert_eq!(
        check_modify_qp(
            rc,
            Rts,
            QpAttrMask::STATE | QpAttrMask::CUR_STATE,
            Rts,
            Some(Rtr)
        ),
        Err(Status::BadState)
    );
    assert_eq!(
        check_modify_qp(
            rc,
            Init,
            QpAttrMask::STATE | QpAttrMask::CUR_STATE,
            Init,
            Some(Init)
        ),
        Err(Status::BadState)
    );
    // anything (but RESET) to ERR and RESET
    for s in [Init, Rtr, Rts, Sqd, Sqe, QpState::Err] {
        assert_eq!(
            check_modify_qp(rc, s, QpAttrMask::STATE, QpState::Err, None),
            Ok(())
        );
        assert_eq!(
            check_modify_qp(rc, s, QpAttrMask::STATE, Reset, None),
            Ok(())
        );
    }
}

#[test]
fn ud_sequence_is_legal() {
    use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};
    let ud = QpType::Ud;
    assert_eq!(
        check_modify_qp(
            ud,
            Reset,
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
            Init,
            None
        ),
        Ok(())
    );
    assert_eq!(
        check_modify_qp(ud, Init, QpAttrMask::STATE, Rtr, None),
        Ok(())
    );
    assert_eq!(
        check_modify_qp(ud, Rtr, QpAttrMask::STATE | QpAttrMask::SQ_PSN, Rts, None),
        Ok(())
    );
    assert_eq!(
        check_modify_qp(ud, Sqe, QpAttrMask::STATE | QpAttrMask::QKEY, Rts, None),
        Ok(())
    );
    assert_eq!(
        check_modify_qp(ud, Init, QpAttrMask::STATE | QpAttrMask::AV, Rtr, None),
        Err(Status::Invalid)
    );
    assert!(qp_transition(ud, Rts, Sqd).is_some());
    assert!(qp_transition(ud, Rtr, Rtr).is_none());
}

#[test]
fn uc_sequence_takes_the_connected_attributes_without_rc_ones() {
    use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};
    type M = QpAttrMask;
    let uc = QpType::Uc;
    let init = M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
    assert_eq!(check_modify_qp(uc, Reset, init, Init, None), Ok(()));
    // A Q_Key belongs to datagram QPs.
    assert_eq!(
        check_modify_qp(uc, Reset, init | M::QKEY, Init, None),
        Err(Status::Invalid)
    );
    let rtr = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    assert_eq!(check_modify_qp(uc, Init, rtr, Rtr, None), Ok(()));
    assert_eq!(
        check_modify_qp(uc, Init, rtr | M::ACCESS_FLAGS | M::PKEY_INDEX, Rtr, None),
        Ok(())
    );
    for missing in [M::AV, M::PATH_MTU, M::DEST_QPN, M::RQ_PSN] {
        assert_eq!(
            check_modify_qp(uc, Init, rtr & !missing, Rtr, None),
            Err(Status::Invalid),
            "{missing:?}"
        );
    }
    // RC's responder attributes are refused on UC, in RTR as in RTS.
    for rc_only in [M::MAX_DEST_RD_ATOMIC, M::MIN_RNR_TIMER, M::QKEY] {
        assert_eq!(
            check_modify_qp(uc, Init, rtr | rc_only, Rtr, None),
            Err(Status::Invalid),
            "{rc_only:?}"
        );
    }
    let rts = M::STATE | M::SQ_PSN;
    assert_eq!(check_modify_qp(uc, Rtr, rts, Rts, None), Ok(()));
    assert_eq!(
        check_modify_qp(
            uc,
            Rtr,
            rts | M::CUR_STATE | M::PATH_MIG_STATE,
            Rts,
            Some(Rtr)
        ),
        Ok(())
    );
    assert_eq!(
        check_modify_qp(uc, Rtr, M::STATE, Rts, None),
        Err(Status::Invalid)
    );
    for rc_only in [
        M::TIMEOUT,
        M::RETRY_CNT,
        M::RNR_RETRY,
        M::MAX_QP_RD_ATOMIC,
        M::MIN_RNR_TIMER,
    ] {
        assert_eq!(
            check_modify_qp(uc, Rtr, rts | rc_only, Rts, None),
            Err(Status::Invalid),
            "{rc_only:?}"
        );
    }
    // Unlike RC, UC can leave SQE for RTS (a send error does not break the connection).
    assert_eq!(
        check_modify_qp(uc, Sqe, M::STATE | M::ACCESS_FLAGS, Rts, None),
        Ok(())
    );
    assert_eq!(qp_transition(QpType::Rc, Sqe, Rts), None);
    assert_eq!(
        check_modify_qp(uc, Sqe, M::STATE | M::ALT_PATH, Rts, None),
        Err(Status::Invalid)
    );
    // SQD -> SQD may change the path but not the port, as in Linux's table.
    assert_eq!(
        check_modify_qp(uc, Sqd, M::STATE | M::AV | M::PKEY_INDEX, Sqd, None),
        Ok(())
    );
    assert_eq!(
        check_modify_qp(uc, Sqd, M::STATE | M::PORT, Sqd, None),
        Err(Status::Invalid)
    );
    assert!(qp_transition(uc, Rts, Sqd).is_some());
    assert!(qp_transition(uc, Rts, Rts).is_some());
    assert!(qp_transition(uc, Reset, Rtr).is_none());
    assert_eq!(
        check_modify_qp(uc, Rts, M::STATE | M::MIN_RNR_TIMER, Rts, None),
        Err(Status::Invalid)
    );
}

#[test]
fn create_qp_needs_the_feature_of_its_type() {
    let needs = |qp_type: QpType, srq: u32| {
        let mut r = common::create_qp_req();
        r.qp_type = qp_type as u8;
        r.srq = Le32::new(srq);
        ControlRequest::CreateQp(r).required_features()
    };
    assert_eq!(needs(QpType::Rc, 0), 0);
    assert_eq!(needs(QpType::Uc, 0), VRDMA_F_UC);
    assert_eq!(needs(QpType::Ud, 0), VRDMA_F_UD);
    assert_eq!(needs(QpType::Uc, 7), VRDMA_F_UC | VRDMA_F_SRQ);
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
        flags: Le32::ZERO,
    }
}

#[test]
fn ring_geometry_checks() {
    let d = desc();
    let geometry = d.check_rxe_v1(1 << 20, 4096).unwrap();
    assert_eq!(geometry, RingGeometry::new(64, 7).unwrap());
    assert_eq!(geometry.check_header(7, 63), Ok(()));
    assert!(matches!(
        geometry.check_header(7, 127),
        Err(GeometryError::HeaderMismatch { .. })
    ));
    assert!(matches!(
        geometry.check_header(8, 63),
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
    // A host kick names the QP's host handle in db_offset; without the flag, or on a
    // staging ring, or beyond 32 bits, db_offset is a doorbell page rxe v1 does not have.
    let mut kick = d;
    kick.set_host_kick(7);
    assert_eq!(kick.host_kick_handle(), Some(7));
    assert!(kick.check_rxe_v1(1 << 20, 4096).is_ok());
    assert_eq!(d.host_kick_handle(), None);
    let mut unflagged = d;
    unflagged.db_offset = Le64::new(7);
    assert_eq!(
        unflagged.check_rxe_v1(1 << 20, 4096),
        Err(GeometryError::DoorbellPage)
    );
    let mut staged = kick;
    staged.flags = Le32::new(staged.flags.get() | ring_flags::STAGED);
    assert_eq!(
        staged.check_rxe_v1(1 << 20, 4096),
        Err(GeometryError::DoorbellPage)
    );
    let mut wide = kick;
    wide.db_offset = Le64::new(1 << 32);
    assert_eq!(
        wide.check_rxe_v1(1 << 20, 4096),
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
    let ring = RingGeometry::new(64, 7).unwrap();
    assert_eq!(ring.slot_offset(65), 384 + 128);
    assert_eq!(ring.next(63), 0);
    assert_eq!(ring.count(2, 62), 4);
    assert_eq!(ring.mask(u32::MAX), 63);
    assert_eq!(ring.buffer_len(), 384 + 64 * 128);
    assert_eq!(ring.check_len(384 + 64 * 128), Ok(()));
    assert_eq!(
        ring.check_len(384 + 64 * 128 - 1),
        Err(GeometryError::TooSmall {
            need: 384 + 64 * 128,
            mapped: 384 + 64 * 128 - 1
        })
    );
    assert_eq!(
        ring.check_entry(129),
        Err(GeometryError::SlotTooSmall {
            need: 129,
            slot: 128
        })
    );
    assert_eq!(
        ring.check_index("producer", 64),
        Err(GeometryError::IndexOutOfRange {
            which: "producer",
            value: 64
        })
    );
    assert_eq!(RingGeometry::new(48, 7), Err(GeometryError::NumSlots(48)));
    assert_eq!(RingGeometry::new(1, 7), Err(GeometryError::NumSlots(1)));
    assert_eq!(RingGeometry::new(64, 5), Err(GeometryError::SlotSize(5)));
    assert_eq!(RingGeometry::new(64, 17), Err(GeometryError::SlotSize(17)));
    assert_eq!(
        RingGeometry::with_index_mask(u32::MAX, 7),
        Err(GeometryError::NumSlots(0))
    );
    assert_eq!(RingGeometry::with_index_mask(63, 7), Ok(ring));
    assert_eq!(rxe_v1::send_wqe_size(4, 64), 208 + 64);
    assert_eq!(rxe_v1::send_wqe_size(1, 200), 408);
    assert_eq!(rxe_v1::recv_wqe_size(2), 72);
}

/// Doorbell notification suppression (spec §5.3, `VRDMA_F_DOORBELL_POLL`): a device that polls
/// the area in short phases and otherwise sleeps until notified never misses a doorbell.
///
/// Each producer publishes a sequence number per QP (its "SQ producer"), rings with
/// [`DoorbellArea::ring_polled`], notifies only when told to, and waits until a kick has seen
/// that number. The device sleeps (spins on the notification counter) between polling phases of
/// varying length, so rings keep landing next to the end of a phase: a device that drained
/// before clearing `polling` (or without a fence in between) would go to sleep while a
/// producer that saw the flag still set skipped its notification, and that producer would stall
/// until its deadline.
#[test]
fn no_doorbell_is_lost_when_the_device_stops_polling() {
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    use vrdma_spec::doorbell::{area_bytes, DoorbellArea};

    const QPS: u32 = 8;
    const ROUNDS: u32 = 100_000;
    let words: Arc<Vec<AtomicU32>> = Arc::new(
        (0..area_bytes(QPS) / 4)
            .map(|_| AtomicU32::new(0))
            .collect(),
    );
    let producers: Arc<Vec<AtomicU32>> = Arc::new((0..QPS).map(|_| AtomicU32::new(0)).collect());
    let seen: Arc<Vec<AtomicU32>> = Arc::new((0..QPS).map(|_| AtomicU32::new(0)).collect());
    let notifications = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));

    let device = {
        let (words, producers, seen, notifications, done) = (
            words.clone(),
            producers.clone(),
            seen.clone(),
            notifications.clone(),
            done.clone(),
        );
        std::thread::spawn(move || {
            let area = DoorbellArea::new(&words, QPS).unwrap();
            let kick = |i: u32| {
                let v = producers[i as usize].load(Ordering::Acquire);
                seen[i as usize].store(v, Ordering::Release);
            };
            let (mut head, mut handled, mut phase) = (0u32, 0u64, 0u32);
            while !done.load(Ordering::Acquire) {
                // Asleep until notified.
                let now = notifications.load(Ordering::Acquire);
                if now == handled {
                    std::hint::spin_loop();
                    continue;
                }
                handled = now;
                area.drain(&mut head, kick);
                area.start_polling();
                phase = phase.wrapping_add(1);
                for _ in 0..phase % 4 {
                    area.drain(&mut head, kick);
                }
                area.stop_polling(&mut head, kick);
            }
        })
    };
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let (words, producers, seen, notifications) = (
                words.clone(),
                producers.clone(),
                seen.clone(),
                notifications.clone(),
            );
            std::thread::spawn(move || {
                let area = DoorbellArea::new(&words, QPS).unwrap();
                let mut skipped = 0u32;
                for round in 1..=ROUNDS {
                    for qp in (t..QPS).step_by(2) {
                        producers[qp as usize].store(round, Ordering::Release);
                        if area.ring_polled(qp) {
                            notifications.fetch_add(1, Ordering::Release);
                        } else {
                            skipped += 1;
                        }
                    }
                    for qp in (t..QPS).step_by(2) {
                        let deadline = Instant::now() + Duration::from_secs(10);
                        while seen[qp as usize].load(Ordering::Acquire) < round {
                            assert!(
                                Instant::now() < deadline,
                                "QP {qp} lost its doorbell in round {round}"
                            );
                            std::hint::spin_loop();
                        }
                    }
                }
                skipped
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join()).collect();
    done.store(true, Ordering::Release);
    device.join().unwrap();
    let mut skipped = 0;
    for r in results {
        skipped += r.unwrap();
    }
    // The test only means something if producers really met a polling device.
    assert!(skipped > 0, "no notification was ever suppressed");
}

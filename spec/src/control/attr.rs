//! Validation of the attribute bodies that MODIFY_QP and CREATE_AH carry: address vectors and
//! the QP attributes an attribute mask selects.

use super::body::{range, zero};
use crate::error::DecodeError;
use crate::verbs::{self, AccessFlags, Mtu, QpAttrMask};
use crate::wire::{AhAttr, QpAttr};

/// Validates an address vector (CREATE_AH, and MODIFY_QP with AV / ALT_PATH).
pub fn check_ah_attr(ah: &AhAttr) -> Result<(), DecodeError> {
    zero(ah.reserved.get().into(), "ah_attr.reserved")?;
    range(ah.is_global.into(), 0, 1, "ah_attr.is_global")?;
    range(
        ah.flow_label.get().into(),
        0,
        verbs::MAX_FLOW_LABEL.into(),
        "ah_attr.flow_label",
    )?;
    range(ah.sl.into(), 0, 15, "ah_attr.sl")?;
    range(
        ah.static_rate.into(),
        0,
        verbs::MAX_STATIC_RATE.into(),
        "ah_attr.static_rate",
    )?;
    range(ah.port_num.into(), 1, u8::MAX.into(), "ah_attr.port_num")?;
    Ok(())
}

/// Validates the fields of `attr` selected by `attr_mask` (MODIFY_QP).
pub fn check_qp_attr(attr_mask: u32, a: &QpAttr) -> Result<(), DecodeError> {
    let Some(mask) = QpAttrMask::from_bits(attr_mask) else {
        return Err(DecodeError::InvalidValue {
            field: "attr_mask",
            value: attr_mask.into(),
        });
    };
    zero(a.reserved0.into(), "attr.reserved0")?;
    zero(a.reserved1.get().into(), "attr.reserved1")?;
    zero(a.ah_attr.reserved.get().into(), "ah_attr.reserved")?;
    zero(a.alt_ah_attr.reserved.get().into(), "alt_ah_attr.reserved")?;
    let has = |bits: QpAttrMask| mask.contains(bits);
    if has(QpAttrMask::STATE) {
        range(a.qp_state.get().into(), 0, 6, "qp_state")?;
    }
    if has(QpAttrMask::CUR_STATE) {
        range(a.cur_qp_state.get().into(), 0, 6, "cur_qp_state")?;
    }
    if has(QpAttrMask::EN_SQD_ASYNC_NOTIFY) {
        range(a.en_sqd_async_notify.into(), 0, 1, "en_sqd_async_notify")?;
    }
    if has(QpAttrMask::ACCESS_FLAGS)
        && a.qp_access_flags.get() & !AccessFlags::QP_ALLOWED.bits() != 0
    {
        return Err(DecodeError::InvalidValue {
            field: "qp_access_flags",
            value: a.qp_access_flags.get().into(),
        });
    }
    if has(QpAttrMask::PORT) {
        range(a.port_num.into(), 1, u8::MAX.into(), "port_num")?;
    }
    if has(QpAttrMask::AV) {
        check_ah_attr(&a.ah_attr)?;
    }
    if has(QpAttrMask::PATH_MTU) {
        range(
            a.path_mtu.get().into(),
            (Mtu::Mtu256 as u32).into(),
            (Mtu::Mtu4096 as u32).into(),
            "path_mtu",
        )?;
    }
    if has(QpAttrMask::TIMEOUT) {
        range(a.timeout.into(), 0, 31, "timeout")?;
    }
    if has(QpAttrMask::RETRY_CNT) {
        range(a.retry_cnt.into(), 0, 7, "retry_cnt")?;
    }
    if has(QpAttrMask::RNR_RETRY) {
        range(a.rnr_retry.into(), 0, 7, "rnr_retry")?;
    }
    if has(QpAttrMask::RQ_PSN) {
        range(a.rq_psn.get().into(), 0, verbs::MAX_PSN.into(), "rq_psn")?;
    }
    if has(QpAttrMask::SQ_PSN) {
        range(a.sq_psn.get().into(), 0, verbs::MAX_PSN.into(), "sq_psn")?;
    }
    if has(QpAttrMask::ALT_PATH) {
        check_ah_attr(&a.alt_ah_attr)?;
        range(a.alt_port_num.into(), 1, u8::MAX.into(), "alt_port_num")?;
        range(a.alt_timeout.into(), 0, 31, "alt_timeout")?;
    }
    if has(QpAttrMask::MIN_RNR_TIMER) {
        range(a.min_rnr_timer.into(), 0, 31, "min_rnr_timer")?;
    }
    if has(QpAttrMask::PATH_MIG_STATE) {
        range(a.path_mig_state.get().into(), 0, 2, "path_mig_state")?;
    }
    if has(QpAttrMask::DEST_QPN) {
        range(
            a.dest_qp_num.get().into(),
            0,
            verbs::MAX_PSN.into(),
            "dest_qp_num",
        )?;
    }
    Ok(())
}

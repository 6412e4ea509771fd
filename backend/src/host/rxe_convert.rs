//! Conversions between the host verbs types and rxe's uverbs command ABI: attributes to
//! commands, responses to attributes, memory-map replies to queue buffers.

use vrdma_spec::verbs::{AccessFlags, QpAttrMask, QpState};

use super::error::{DeviceError, Result};
use super::rxe_abi::MmInfo;
use super::types::*;
use super::uverbs;

pub(super) fn queue_buffer(command: &'static str, mi: &MmInfo) -> Result<QueueBuffer> {
    if mi.size == 0 {
        return Err(DeviceError::InvalidReply {
            command,
            reason: "queue buffer of size 0".into(),
        });
    }
    Ok(QueueBuffer {
        offset: mi.offset,
        len: mi.size as usize,
    })
}

fn dest_from_attr(ah: &AhAttr) -> uverbs::QpDest {
    uverbs::QpDest {
        dgid: ah.dgid,
        flow_label: ah.flow_label,
        dlid: ah.dlid,
        reserved: 0,
        sgid_index: ah.sgid_index,
        hop_limit: ah.hop_limit,
        traffic_class: ah.traffic_class,
        sl: ah.sl,
        src_path_bits: ah.src_path_bits,
        static_rate: ah.static_rate,
        is_global: u8::from(ah.is_global),
        port_num: ah.port_num,
    }
}

fn attr_from_dest(dest: &uverbs::QpDest) -> AhAttr {
    AhAttr {
        dgid: dest.dgid,
        flow_label: dest.flow_label,
        sgid_index: dest.sgid_index,
        hop_limit: dest.hop_limit,
        traffic_class: dest.traffic_class,
        dlid: dest.dlid,
        sl: dest.sl,
        src_path_bits: dest.src_path_bits,
        static_rate: dest.static_rate,
        is_global: dest.is_global != 0,
        port_num: dest.port_num,
    }
}

/// Builds `struct ib_uverbs_modify_qp` the way rdma-core's `copy_modify_qp_fields` does: only
/// the fields selected by `mask` are copied, everything else stays zero.
pub fn encode_modify_qp(qp: QpHandle, attr: &QpAttr, mask: QpAttrMask) -> uverbs::ModifyQp {
    let mut cmd = uverbs::ModifyQp {
        qp_handle: qp.0,
        attr_mask: mask.bits(),
        ..Default::default()
    };
    if mask.contains(QpAttrMask::STATE) {
        cmd.qp_state = attr.qp_state as u8;
    }
    if mask.contains(QpAttrMask::CUR_STATE) {
        cmd.cur_qp_state = attr.cur_qp_state as u8;
    }
    if mask.contains(QpAttrMask::EN_SQD_ASYNC_NOTIFY) {
        cmd.en_sqd_async_notify = u8::from(attr.en_sqd_async_notify);
    }
    if mask.contains(QpAttrMask::ACCESS_FLAGS) {
        cmd.qp_access_flags = attr.qp_access_flags.bits();
    }
    if mask.contains(QpAttrMask::PKEY_INDEX) {
        cmd.pkey_index = attr.pkey_index;
    }
    if mask.contains(QpAttrMask::PORT) {
        cmd.port_num = attr.port_num;
    }
    if mask.contains(QpAttrMask::QKEY) {
        cmd.qkey = attr.qkey;
    }
    if mask.contains(QpAttrMask::AV) {
        cmd.dest = dest_from_attr(&attr.ah_attr);
    }
    if mask.contains(QpAttrMask::PATH_MTU) {
        cmd.path_mtu = attr.path_mtu;
    }
    if mask.contains(QpAttrMask::TIMEOUT) {
        cmd.timeout = attr.timeout;
    }
    if mask.contains(QpAttrMask::RETRY_CNT) {
        cmd.retry_cnt = attr.retry_cnt;
    }
    if mask.contains(QpAttrMask::RNR_RETRY) {
        cmd.rnr_retry = attr.rnr_retry;
    }
    if mask.contains(QpAttrMask::RQ_PSN) {
        cmd.rq_psn = attr.rq_psn;
    }
    if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC) {
        cmd.max_rd_atomic = attr.max_rd_atomic;
    }
    if mask.contains(QpAttrMask::ALT_PATH) {
        cmd.alt_pkey_index = attr.alt_pkey_index;
        cmd.alt_port_num = attr.alt_port_num;
        cmd.alt_timeout = attr.alt_timeout;
        cmd.alt_dest = dest_from_attr(&attr.alt_ah_attr);
    }
    if mask.contains(QpAttrMask::MIN_RNR_TIMER) {
        cmd.min_rnr_timer = attr.min_rnr_timer;
    }
    if mask.contains(QpAttrMask::SQ_PSN) {
        cmd.sq_psn = attr.sq_psn;
    }
    if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC) {
        cmd.max_dest_rd_atomic = attr.max_dest_rd_atomic;
    }
    if mask.contains(QpAttrMask::PATH_MIG_STATE) {
        cmd.path_mig_state = attr.path_mig_state;
    }
    if mask.contains(QpAttrMask::DEST_QPN) {
        cmd.dest_qp_num = attr.dest_qp_num;
    }
    cmd
}

pub(super) fn decode_query_qp(resp: &uverbs::QueryQpResp) -> Result<QpInfo> {
    let state = |value: u8| {
        QpState::try_from(u32::from(value)).map_err(|_| DeviceError::InvalidReply {
            command: "QUERY_QP",
            reason: format!("unknown QP state {value}"),
        })
    };
    Ok(QpInfo {
        attr: QpAttr {
            qp_state: state(resp.qp_state)?,
            cur_qp_state: state(resp.cur_qp_state)?,
            path_mtu: resp.path_mtu,
            path_mig_state: resp.path_mig_state,
            qkey: resp.qkey,
            rq_psn: resp.rq_psn,
            sq_psn: resp.sq_psn,
            dest_qp_num: resp.dest_qp_num,
            qp_access_flags: AccessFlags::from_bits_retain(resp.qp_access_flags),
            ah_attr: attr_from_dest(&resp.dest),
            alt_ah_attr: attr_from_dest(&resp.alt_dest),
            pkey_index: resp.pkey_index,
            alt_pkey_index: resp.alt_pkey_index,
            en_sqd_async_notify: false,
            sq_draining: resp.sq_draining != 0,
            max_rd_atomic: resp.max_rd_atomic,
            max_dest_rd_atomic: resp.max_dest_rd_atomic,
            min_rnr_timer: resp.min_rnr_timer,
            port_num: resp.port_num,
            timeout: resp.timeout,
            retry_cnt: resp.retry_cnt,
            rnr_retry: resp.rnr_retry,
            alt_port_num: resp.alt_port_num,
            alt_timeout: resp.alt_timeout,
        },
        caps: QpCaps {
            max_send_wr: resp.max_send_wr,
            max_recv_wr: resp.max_recv_wr,
            max_send_sge: resp.max_send_sge,
            max_recv_sge: resp.max_recv_sge,
            max_inline_data: resp.max_inline_data,
        },
        sq_sig_all: resp.sq_sig_all != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modify_qp_copies_only_masked_fields() {
        let attr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: 3,
            dest_qp_num: 0x11,
            rq_psn: 0x22,
            max_dest_rd_atomic: 4,
            min_rnr_timer: 12,
            qkey: 0x1234,
            ah_attr: AhAttr {
                dgid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
                is_global: true,
                hop_limit: 64,
                port_num: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        let mask = QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER;
        let cmd = encode_modify_qp(QpHandle(5), &attr, mask);
        assert_eq!(cmd.qp_handle, 5);
        assert_eq!(cmd.attr_mask, mask.bits());
        assert_eq!(cmd.qp_state, 2);
        assert_eq!(cmd.path_mtu, 3);
        assert_eq!(cmd.dest_qp_num, 0x11);
        assert_eq!(cmd.rq_psn, 0x22);
        assert_eq!(cmd.max_dest_rd_atomic, 4);
        assert_eq!(cmd.min_rnr_timer, 12);
        assert_eq!(cmd.dest.dgid, attr.ah_attr.dgid);
        assert_eq!(cmd.dest.is_global, 1);
        assert_eq!(cmd.dest.hop_limit, 64);
        assert_eq!(cmd.dest.port_num, 1);
        assert_eq!(cmd.qkey, 0, "QKEY not in mask");
        assert_eq!(cmd.alt_dest, uverbs::QpDest::default());
    }

    #[test]
    fn query_qp_with_an_unknown_state_is_an_error() {
        let resp = uverbs::QueryQpResp {
            qp_state: 42,
            ..Default::default()
        };
        assert!(matches!(
            decode_query_qp(&resp),
            Err(DeviceError::InvalidReply { .. })
        ));
        let ok = uverbs::QueryQpResp {
            qp_state: 3,
            max_send_wr: 15,
            sq_sig_all: 1,
            ..Default::default()
        };
        let info = decode_query_qp(&ok).unwrap();
        assert_eq!(info.attr.qp_state, QpState::Rts);
        assert_eq!(info.caps.max_send_wr, 15);
        assert!(info.sq_sig_all);
    }

    #[test]
    fn zero_sized_queue_buffers_are_rejected() {
        assert!(queue_buffer("X", &MmInfo::default()).is_err());
        let mi = MmInfo {
            offset: 0x1000,
            size: 8192,
            pad: 0,
        };
        assert_eq!(
            queue_buffer("X", &mi).unwrap(),
            QueueBuffer {
                offset: 0x1000,
                len: 8192
            }
        );
    }
}

//! Conversions between the host verbs types and rxe's uverbs command ABI: the one conversion
//! of QP and address-vector attributes (spec's wire form) to and from the kernel ABI, device
//! and port attributes from their responses, memory-map replies to queue buffers.

use vrdma_spec::attr::qp::QpCaps;
use vrdma_spec::verbs::{QpAttrMask, QpState};
use vrdma_spec::wire::{AhAttr, QpAttr};
use vrdma_spec::{Le16, Le32};
use zerocopy::FromZeros;

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
        flow_label: ah.flow_label.get(),
        dlid: ah.dlid.get(),
        reserved: 0,
        sgid_index: ah.sgid_index,
        hop_limit: ah.hop_limit,
        traffic_class: ah.traffic_class,
        sl: ah.sl,
        src_path_bits: ah.src_path_bits,
        static_rate: ah.static_rate,
        is_global: ah.is_global,
        port_num: ah.port_num,
    }
}

fn attr_from_dest(dest: &uverbs::QpDest) -> AhAttr {
    AhAttr {
        dgid: dest.dgid,
        flow_label: Le32::new(dest.flow_label),
        sgid_index: dest.sgid_index,
        hop_limit: dest.hop_limit,
        traffic_class: dest.traffic_class,
        sl: dest.sl,
        dlid: Le16::new(dest.dlid),
        src_path_bits: dest.src_path_bits,
        static_rate: dest.static_rate,
        is_global: u8::from(dest.is_global != 0),
        port_num: dest.port_num,
        reserved: Le16::ZERO,
    }
}

/// `struct ib_uverbs_ah_attr` of an address vector (CREATE_AH).
pub(super) fn kernel_ah_attr(a: &AhAttr) -> uverbs::AhAttr {
    uverbs::AhAttr {
        grh: uverbs::GlobalRoute {
            dgid: a.dgid,
            flow_label: a.flow_label.get(),
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
            reserved: 0,
        },
        dlid: a.dlid.get(),
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: a.is_global,
        port_num: a.port_num,
        reserved: 0,
    }
}

/// An address vector of the kernel's (`struct ib_uverbs_ah_attr`) in the spec's wire form.
pub(crate) fn wire_ah_attr(a: &uverbs::AhAttr) -> AhAttr {
    AhAttr {
        dgid: a.grh.dgid,
        flow_label: Le32::new(a.grh.flow_label),
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        sl: a.sl,
        dlid: Le16::new(a.dlid),
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: u8::from(a.is_global != 0),
        port_num: a.port_num,
        reserved: Le16::ZERO,
    }
}

/// The attributes and mask the connection manager computed for a QP (INIT_QP_ATTR's
/// `struct ib_uverbs_qp_attr`), in the form MODIFY_QP takes. Host terms: GID indices and ports
/// are the host's. Mask bits the spec does not know stay set, for the caller to judge.
pub fn qp_attr_from_cm(a: &uverbs::QpAttrResp) -> (QpAttr, QpAttrMask) {
    let mut attr = QpAttr::new_zeroed();
    attr.qp_state = Le32::new(a.qp_state);
    attr.cur_qp_state = Le32::new(a.cur_qp_state);
    attr.path_mtu = Le32::new(a.path_mtu);
    attr.path_mig_state = Le32::new(a.path_mig_state);
    attr.qkey = Le32::new(a.qkey);
    attr.rq_psn = Le32::new(a.rq_psn);
    attr.sq_psn = Le32::new(a.sq_psn);
    attr.dest_qp_num = Le32::new(a.dest_qp_num);
    attr.qp_access_flags = Le32::new(a.qp_access_flags);
    attr.max_send_wr = Le32::new(a.max_send_wr);
    attr.max_recv_wr = Le32::new(a.max_recv_wr);
    attr.max_send_sge = Le32::new(a.max_send_sge);
    attr.max_recv_sge = Le32::new(a.max_recv_sge);
    attr.max_inline_data = Le32::new(a.max_inline_data);
    attr.ah_attr = wire_ah_attr(&a.ah_attr);
    attr.alt_ah_attr = wire_ah_attr(&a.alt_ah_attr);
    attr.pkey_index = Le16::new(a.pkey_index);
    attr.alt_pkey_index = Le16::new(a.alt_pkey_index);
    attr.en_sqd_async_notify = a.en_sqd_async_notify;
    attr.sq_draining = a.sq_draining;
    attr.max_rd_atomic = a.max_rd_atomic;
    attr.max_dest_rd_atomic = a.max_dest_rd_atomic;
    attr.min_rnr_timer = a.min_rnr_timer;
    attr.port_num = a.port_num;
    attr.timeout = a.timeout;
    attr.retry_cnt = a.retry_cnt;
    attr.rnr_retry = a.rnr_retry;
    attr.alt_port_num = a.alt_port_num;
    attr.alt_timeout = a.alt_timeout;
    (attr, QpAttrMask::from_bits_retain(a.qp_attr_mask))
}

/// Builds `struct ib_uverbs_modify_qp` the way rdma-core's `copy_modify_qp_fields` does: only
/// the fields selected by `mask` are copied, everything else stays zero. The enumerated
/// values were checked by the caller (states, MTU 1..=5, migration state 0..=2), so they fit
/// the kernel's `u8` fields.
pub fn encode_modify_qp(qp: QpHandle, attr: &QpAttr, mask: QpAttrMask) -> uverbs::ModifyQp {
    let mut cmd = uverbs::ModifyQp {
        qp_handle: qp.0,
        attr_mask: mask.bits(),
        ..Default::default()
    };
    if mask.contains(QpAttrMask::STATE) {
        cmd.qp_state = attr.qp_state.get() as u8;
    }
    if mask.contains(QpAttrMask::CUR_STATE) {
        cmd.cur_qp_state = attr.cur_qp_state.get() as u8;
    }
    if mask.contains(QpAttrMask::EN_SQD_ASYNC_NOTIFY) {
        cmd.en_sqd_async_notify = attr.en_sqd_async_notify;
    }
    if mask.contains(QpAttrMask::ACCESS_FLAGS) {
        cmd.qp_access_flags = attr.qp_access_flags.get();
    }
    if mask.contains(QpAttrMask::PKEY_INDEX) {
        cmd.pkey_index = attr.pkey_index.get();
    }
    if mask.contains(QpAttrMask::PORT) {
        cmd.port_num = attr.port_num;
    }
    if mask.contains(QpAttrMask::QKEY) {
        cmd.qkey = attr.qkey.get();
    }
    if mask.contains(QpAttrMask::AV) {
        cmd.dest = dest_from_attr(&attr.ah_attr);
    }
    if mask.contains(QpAttrMask::PATH_MTU) {
        cmd.path_mtu = attr.path_mtu.get() as u8;
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
        cmd.rq_psn = attr.rq_psn.get();
    }
    if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC) {
        cmd.max_rd_atomic = attr.max_rd_atomic;
    }
    if mask.contains(QpAttrMask::ALT_PATH) {
        cmd.alt_pkey_index = attr.alt_pkey_index.get();
        cmd.alt_port_num = attr.alt_port_num;
        cmd.alt_timeout = attr.alt_timeout;
        cmd.alt_dest = dest_from_attr(&attr.alt_ah_attr);
    }
    if mask.contains(QpAttrMask::MIN_RNR_TIMER) {
        cmd.min_rnr_timer = attr.min_rnr_timer;
    }
    if mask.contains(QpAttrMask::SQ_PSN) {
        cmd.sq_psn = attr.sq_psn.get();
    }
    if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC) {
        cmd.max_dest_rd_atomic = attr.max_dest_rd_atomic;
    }
    if mask.contains(QpAttrMask::PATH_MIG_STATE) {
        cmd.path_mig_state = attr.path_mig_state.get() as u8;
    }
    if mask.contains(QpAttrMask::DEST_QPN) {
        cmd.dest_qp_num = attr.dest_qp_num.get();
    }
    cmd
}

/// The attributes of a QUERY_QP response; a state the verbs ABI does not define is an
/// invalid reply.
pub(super) fn decode_query_qp(resp: &uverbs::QueryQpResp) -> Result<QpInfo> {
    let state = |value: u8| {
        QpState::try_from(u32::from(value)).map_err(|_| DeviceError::InvalidReply {
            command: "QUERY_QP",
            reason: format!("unknown QP state {value}"),
        })
    };
    let caps = QpCaps {
        max_send_wr: resp.max_send_wr,
        max_recv_wr: resp.max_recv_wr,
        max_send_sge: resp.max_send_sge,
        max_recv_sge: resp.max_recv_sge,
        max_inline_data: resp.max_inline_data,
    };
    let mut attr = QpAttr::new_zeroed()
        .with_qp_state(state(resp.qp_state)?)
        .with_cur_qp_state(state(resp.cur_qp_state)?)
        .with_path_mig_state(resp.path_mig_state.into())
        .with_qkey(resp.qkey)
        .with_rq_psn(resp.rq_psn)
        .with_sq_psn(resp.sq_psn)
        .with_dest_qp_num(resp.dest_qp_num)
        .with_caps(caps)
        .with_ah_attr(attr_from_dest(&resp.dest))
        .with_alt_ah_attr(attr_from_dest(&resp.alt_dest))
        .with_pkey_index(resp.pkey_index)
        .with_alt_pkey_index(resp.alt_pkey_index)
        .with_max_rd_atomic(resp.max_rd_atomic)
        .with_max_dest_rd_atomic(resp.max_dest_rd_atomic)
        .with_min_rnr_timer(resp.min_rnr_timer)
        .with_port_num(resp.port_num)
        .with_timeout(resp.timeout)
        .with_retry_cnt(resp.retry_cnt)
        .with_rnr_retry(resp.rnr_retry)
        .with_alt_port_num(resp.alt_port_num)
        .with_alt_timeout(resp.alt_timeout);
    // Carried as the kernel reports them: an MTU or flags outside the verbs ABI are the
    // guest's to refuse.
    attr.path_mtu = Le32::new(resp.path_mtu.into());
    attr.qp_access_flags = Le32::new(resp.qp_access_flags);
    attr.sq_draining = u8::from(resp.sq_draining != 0);
    Ok(QpInfo {
        attr,
        sq_sig_all: resp.sq_sig_all != 0,
    })
}

#[cfg(test)]
mod tests {
    use vrdma_spec::attr::qp::GlobalRoute;
    use vrdma_spec::verbs::{Gid, Mtu};

    use super::*;

    #[test]
    fn modify_qp_copies_only_masked_fields() {
        let route = GlobalRoute {
            dgid: Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]),
            hop_limit: 64,
            ..GlobalRoute::default()
        };
        let attr = QpAttr::default()
            .with_qp_state(QpState::Rtr)
            .with_path_mtu(Mtu::Mtu1024)
            .with_dest_qp_num(0x11)
            .with_rq_psn(0x22)
            .with_max_dest_rd_atomic(4)
            .with_min_rnr_timer(12)
            .with_qkey(0x1234)
            .with_ah_attr(AhAttr::default().with_grh(route).with_port_num(1));
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
    fn address_vectors_convert_both_ways() {
        let ah = AhAttr::default()
            .with_grh(GlobalRoute {
                dgid: Gid([0xfe; 16]),
                flow_label: 0x12345,
                sgid_index: 1,
                hop_limit: 64,
                traffic_class: 3,
            })
            .with_dlid(7)
            .with_sl(2)
            .with_src_path_bits(1)
            .with_static_rate(3)
            .with_port_num(1);
        let dest = dest_from_attr(&ah);
        assert_eq!(
            (dest.flow_label, dest.dlid, dest.is_global),
            (0x12345, 7, 1)
        );
        assert_eq!(attr_from_dest(&dest), ah);
        let kernel = kernel_ah_attr(&ah);
        assert_eq!(kernel.grh.dgid, [0xfe; 16]);
        assert_eq!(
            (
                kernel.grh.flow_label,
                kernel.grh.sgid_index,
                kernel.grh.hop_limit
            ),
            (0x12345, 1, 64)
        );
        assert_eq!(
            (
                kernel.dlid,
                kernel.sl,
                kernel.src_path_bits,
                kernel.static_rate
            ),
            (7, 2, 1, 3)
        );
        assert_eq!((kernel.is_global, kernel.port_num), (1, 1));
    }

    #[test]
    fn queried_attributes_carry_what_the_kernel_reports() {
        let resp = uverbs::QueryQpResp {
            qp_state: 3,
            cur_qp_state: 3,
            path_mtu: 4,
            qp_access_flags: 0x7,
            dest_qp_num: 0x42,
            sq_psn: 0x100,
            port_num: 1,
            timeout: 14,
            dest: dest_from_attr(&AhAttr::default().with_dlid(9).with_port_num(1)),
            ..Default::default()
        };
        let attr = decode_query_qp(&resp).unwrap().attr;
        assert_eq!(attr.qp_state(), Ok(QpState::Rts));
        assert_eq!(attr.path_mtu(), Ok(Mtu::Mtu2048));
        assert_eq!(attr.qp_access_flags.get(), 0x7);
        assert_eq!((attr.dest_qp_num.get(), attr.sq_psn.get()), (0x42, 0x100));
        assert_eq!((attr.port_num, attr.timeout), (1, 14));
        assert_eq!(attr.ah_attr.dlid.get(), 9);
        // And back: the selected fields reach the kernel unchanged.
        let mask = QpAttrMask::STATE
            | QpAttrMask::PATH_MTU
            | QpAttrMask::ACCESS_FLAGS
            | QpAttrMask::DEST_QPN
            | QpAttrMask::SQ_PSN
            | QpAttrMask::PORT
            | QpAttrMask::TIMEOUT
            | QpAttrMask::AV;
        let cmd = encode_modify_qp(QpHandle(1), &attr, mask);
        assert_eq!(
            (cmd.qp_state, cmd.path_mtu, cmd.qp_access_flags),
            (3, 4, 0x7)
        );
        assert_eq!((cmd.dest_qp_num, cmd.sq_psn), (0x42, 0x100));
        assert_eq!((cmd.port_num, cmd.timeout), (1, 14));
        assert_eq!(cmd.dest, resp.dest);
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
        assert_eq!(info.attr.qp_state(), Ok(QpState::Rts));
        assert_eq!(info.attr.caps().max_send_wr, 15);
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

//! Device, port and GID-table attribute types of the verbs API and their wire forms (QP and
//! address-handle attributes are spec's, [`vrdma_spec::attr::qp`]).
//!
//! Values are those of rdma-core's `<infiniband/verbs.h>`, which the device carries unchanged;
//! the types here only make the valid ones explicit.

use vrdma_spec::verbs::{Gid, GidType, Mtu, PortState};
use vrdma_spec::wire;

/// Device attributes and this guest's limits (`ibv_device_attr` as QUERY_DEVICE reports it:
/// every `max_*` is the smaller of the host limit and the guest's quota).
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // Field names and meanings are those of `ibv_device_attr`.
pub struct DeviceAttr {
    pub fw_ver: String,
    pub node_guid: [u8; 8],
    pub sys_image_guid: [u8; 8],
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    /// Quota on the sum of registered MR sizes.
    pub max_mr_bytes: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub device_cap_flags: u32,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_sge_rd: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_qp_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub max_res_rd_atom: u32,
    pub atomic_cap: u32,
    pub max_ah: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    pub max_inline_data: u32,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

impl From<&wire::DeviceAttr> for DeviceAttr {
    fn from(w: &wire::DeviceAttr) -> Self {
        let fw_len = w
            .fw_ver
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(w.fw_ver.len());
        DeviceAttr {
            fw_ver: String::from_utf8_lossy(&w.fw_ver[..fw_len]).into_owned(),
            node_guid: w.node_guid,
            sys_image_guid: w.sys_image_guid,
            max_mr_size: w.max_mr_size.get(),
            page_size_cap: w.page_size_cap.get(),
            max_mr_bytes: w.max_mr_bytes.get(),
            vendor_id: w.vendor_id.get(),
            vendor_part_id: w.vendor_part_id.get(),
            hw_ver: w.hw_ver.get(),
            device_cap_flags: w.device_cap_flags.get(),
            max_qp: w.max_qp.get(),
            max_qp_wr: w.max_qp_wr.get(),
            max_sge: w.max_sge.get(),
            max_sge_rd: w.max_sge_rd.get(),
            max_cq: w.max_cq.get(),
            max_cqe: w.max_cqe.get(),
            max_mr: w.max_mr.get(),
            max_pd: w.max_pd.get(),
            max_qp_rd_atom: w.max_qp_rd_atom.get(),
            max_qp_init_rd_atom: w.max_qp_init_rd_atom.get(),
            max_res_rd_atom: w.max_res_rd_atom.get(),
            atomic_cap: w.atomic_cap.get(),
            max_ah: w.max_ah.get(),
            max_srq: w.max_srq.get(),
            max_srq_wr: w.max_srq_wr.get(),
            max_srq_sge: w.max_srq_sge.get(),
            max_inline_data: w.max_inline_data.get(),
            max_pkeys: w.max_pkeys.get(),
            local_ca_ack_delay: w.local_ca_ack_delay,
            phys_port_cnt: w.phys_port_cnt,
        }
    }
}

/// Port attributes (`ibv_port_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // Field names and meanings are those of `ibv_port_attr`.
pub struct PortAttr {
    /// `ibv_port_state` ([`PortState`] value).
    pub state: u32,
    /// `ibv_mtu` value.
    pub max_mtu: u32,
    /// `ibv_mtu` value.
    pub active_mtu: u32,
    pub gid_tbl_len: u32,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    /// 1 InfiniBand, 2 Ethernet.
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
    pub active_speed_ex: u32,
}

impl PortAttr {
    /// True if the port is ACTIVE.
    pub fn is_active(&self) -> bool {
        self.state == PortState::Active as u32
    }

    /// The active MTU, if it is a defined value.
    pub fn active_mtu(&self) -> Option<Mtu> {
        Mtu::try_from(self.active_mtu).ok()
    }
}

impl From<&wire::PortAttr> for PortAttr {
    fn from(w: &wire::PortAttr) -> Self {
        PortAttr {
            state: w.state.get(),
            max_mtu: w.max_mtu.get(),
            active_mtu: w.active_mtu.get(),
            gid_tbl_len: w.gid_tbl_len.get(),
            port_cap_flags: w.port_cap_flags.get(),
            max_msg_sz: w.max_msg_sz.get(),
            bad_pkey_cntr: w.bad_pkey_cntr.get(),
            qkey_viol_cntr: w.qkey_viol_cntr.get(),
            pkey_tbl_len: w.pkey_tbl_len.get(),
            lid: w.lid.get(),
            sm_lid: w.sm_lid.get(),
            lmc: w.lmc,
            max_vl_num: w.max_vl_num,
            sm_sl: w.sm_sl,
            subnet_timeout: w.subnet_timeout,
            init_type_reply: w.init_type_reply,
            active_width: w.active_width,
            active_speed: w.active_speed,
            phys_state: w.phys_state,
            link_layer: w.link_layer,
            flags: w.flags,
            port_cap_flags2: w.port_cap_flags2.get(),
            active_speed_ex: w.active_speed_ex.get(),
        }
    }
}

/// One GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// The GID.
    pub gid: Gid,
    /// Its type (rxe: RoCE v2).
    pub gid_type: GidType,
}

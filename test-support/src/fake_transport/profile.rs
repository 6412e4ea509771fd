//! What the fake device is: its limits, its configuration space and the attributes it reports.

use vrdma::spec::config::{odp_caps, ring_format, DeviceConfig, MAGIC};
use vrdma::spec::verbs::PortState;
use vrdma::spec::wire::{DeviceAttr, PortAttr};
use vrdma::spec::{Le16, Le32, Le64, Status};

/// Size of the shared-memory region where the fake places queue buffers.
pub const SHM_SIZE: usize = 4 << 20;
/// Size of the fake's guest RAM (a memfd, as the process transport's).
pub const RAM_SIZE: usize = 16 << 20;
/// Doorbell slots of the fake device (and so its most QPs).
pub const DOORBELL_SLOTS: u32 = 64;
/// Most pages of one REG_MR page list.
pub const MAX_MR_PAGES: u32 = 1024;
/// Most work requests of one queue.
pub const MAX_QP_WR: u32 = 256;
/// Most SGEs of one work request.
pub const MAX_SGE: u32 = 4;
/// Most inline bytes of one send.
pub const MAX_INLINE: u32 = 128;
/// Most outstanding RDMA reads a QP answers.
pub const MAX_QP_RD_ATOM: u32 = 8;
/// Most outstanding RDMA reads a QP issues.
pub const MAX_QP_INIT_RD_ATOM: u32 = 4;
/// What the fake's on-demand-paging MRs serve on RC QPs (with `VRDMA_F_ODP`; rxe's set).
pub const ODP_RC_CAPS: u32 = odp_caps::SEND
    | odp_caps::RECV
    | odp_caps::WRITE
    | odp_caps::READ
    | odp_caps::ATOMIC
    | odp_caps::SRQ_RECV;
/// GID index 0 of port 1 (index 1 is an empty entry).
pub const LOCAL_GID: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

/// The configuration space of a device the library can drive: rxe v1 rings, one port, the
/// limits above.
pub fn default_config() -> DeviceConfig {
    DeviceConfig {
        magic: Le32::new(MAGIC),
        version_major: Le16::new(1),
        version_minor: Le16::new(0),
        ring_format: Le32::new(ring_format::RXE_V1),
        num_ports: Le32::new(1),
        shm_size: Le64::new(SHM_SIZE as u64),
        shm_id: Le32::ZERO,
        shm_page_shift: Le32::new(12),
        max_request_size: Le32::new(8 + 32 + 8 * MAX_MR_PAGES),
        max_response_size: Le32::new(200),
        max_mr_pages: Le32::new(MAX_MR_PAGES),
        doorbell_slots: Le32::new(DOORBELL_SLOTS),
        epoch: Le32::ZERO,
        odp_rc_caps: Le32::new(ODP_RC_CAPS),
        odp_uc_caps: Le32::ZERO,
        odp_ud_caps: Le32::new(odp_caps::SEND | odp_caps::RECV),
    }
}

/// Bytes of the doorbell area the fake expects (SET_DOORBELL_AREA).
pub fn doorbell_area_bytes() -> usize {
    vrdma::spec::doorbell::area_bytes(DOORBELL_SLOTS)
}

/// Port 1 is the only port.
pub(crate) fn check_port(port: u32) -> Result<(), Status> {
    if port == 1 {
        Ok(())
    } else {
        Err(Status::Invalid)
    }
}

/// QUERY_DEVICE's answer.
pub(crate) fn device_attr() -> DeviceAttr {
    let n = Le32::new;
    DeviceAttr {
        fw_ver: DeviceAttr::encode_fw_ver("fake 1.0"),
        node_guid: [1; 8],
        sys_image_guid: [2; 8],
        max_mr_size: Le64::new(1 << 32),
        page_size_cap: Le64::new(0xffff_f000),
        max_mr_bytes: Le64::new(RAM_SIZE as u64),
        vendor_id: n(0xffffff),
        vendor_part_id: n(0),
        hw_ver: n(0),
        device_cap_flags: n(0),
        max_qp: n(DOORBELL_SLOTS),
        max_qp_wr: n(MAX_QP_WR),
        max_sge: n(MAX_SGE),
        max_sge_rd: n(MAX_SGE),
        max_cq: n(64),
        max_cqe: n(4096),
        max_mr: n(64),
        max_pd: n(16),
        max_qp_rd_atom: n(MAX_QP_RD_ATOM),
        max_qp_init_rd_atom: n(MAX_QP_INIT_RD_ATOM),
        max_res_rd_atom: n(0),
        // IBV_ATOMIC_HCA, as rdma_rxe: the loopback kernel executes atomics.
        atomic_cap: n(1),
        max_ah: n(16),
        max_srq: n(0),
        max_srq_wr: n(0),
        max_srq_sge: n(0),
        max_inline_data: n(MAX_INLINE),
        max_pkeys: Le16::new(1),
        local_ca_ack_delay: 15,
        phys_port_cnt: 1,
    }
}

/// QUERY_PORT's answer for port 1.
pub(crate) fn port_attr() -> PortAttr {
    let n = Le32::new;
    PortAttr {
        state: n(PortState::Active as u32),
        max_mtu: n(5),
        active_mtu: n(3),
        gid_tbl_len: n(2),
        port_cap_flags: n(0),
        max_msg_sz: n(1 << 31),
        bad_pkey_cntr: n(0),
        qkey_viol_cntr: n(0),
        pkey_tbl_len: Le16::new(1),
        lid: Le16::ZERO,
        sm_lid: Le16::ZERO,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        active_width: 1,
        active_speed: 1,
        phys_state: 5,
        link_layer: 2,
        flags: 0,
        port_cap_flags2: Le16::ZERO,
        reserved: Le16::ZERO,
        active_speed_ex: n(0),
    }
}

//! The context commands: GET_CONTEXT, QUERY_DEVICE, QUERY_PORT, CREATE_COMP_CHANNEL, and the
//! descriptors read from the context's async event fd and from a completion channel fd.

use super::framing::{abi_layout, abi_struct, cmd, command, Command, CommandWithResponse};

abi_struct! {
    /// `struct ib_uverbs_async_event_desc`: one read() from the async event fd.
    pub struct AsyncEventDesc {
        pub element: u64,
        pub event_type: u32,
        pub reserved: u32,
    }
}
abi_layout!(AsyncEventDesc, 16, element @ 0, event_type @ 8, reserved @ 12);

abi_struct! {
    /// `struct ib_uverbs_comp_event_desc`: one read() from a completion channel fd.
    pub struct CompEventDesc {
        pub cq_handle: u64,
    }
}
abi_layout!(CompEventDesc, 8, cq_handle @ 0);

abi_struct! {
    /// `struct ib_uverbs_get_context` (no driver data for rxe).
    pub struct GetContext {
        pub response: u64,
    }
}
abi_layout!(GetContext, 8, response @ 0);

abi_struct! {
    /// `struct ib_uverbs_get_context_resp`.
    pub struct GetContextResp {
        pub async_fd: u32,
        pub num_comp_vectors: u32,
    }
}
abi_layout!(GetContextResp, 8, async_fd @ 0, num_comp_vectors @ 4);
command!(GetContext, cmd::GET_CONTEXT, "GET_CONTEXT", GetContextResp);

abi_struct! {
    /// `struct ib_uverbs_query_device`.
    pub struct QueryDevice {
        pub response: u64,
    }
}
abi_layout!(QueryDevice, 8, response @ 0);

abi_struct! {
    /// `struct ib_uverbs_query_device_resp`.
    pub struct QueryDeviceResp {
        pub fw_ver: u64,
        /// Big-endian in the kernel struct (`__be64`); kept as raw bytes order here.
        pub node_guid: u64,
        /// Big-endian in the kernel struct (`__be64`).
        pub sys_image_guid: u64,
        pub max_mr_size: u64,
        pub page_size_cap: u64,
        pub vendor_id: u32,
        pub vendor_part_id: u32,
        pub hw_ver: u32,
        pub max_qp: u32,
        pub max_qp_wr: u32,
        pub device_cap_flags: u32,
        pub max_sge: u32,
        pub max_sge_rd: u32,
        pub max_cq: u32,
        pub max_cqe: u32,
        pub max_mr: u32,
        pub max_pd: u32,
        pub max_qp_rd_atom: u32,
        pub max_ee_rd_atom: u32,
        pub max_res_rd_atom: u32,
        pub max_qp_init_rd_atom: u32,
        pub max_ee_init_rd_atom: u32,
        pub atomic_cap: u32,
        pub max_ee: u32,
        pub max_rdd: u32,
        pub max_mw: u32,
        pub max_raw_ipv6_qp: u32,
        pub max_raw_ethy_qp: u32,
        pub max_mcast_grp: u32,
        pub max_mcast_qp_attach: u32,
        pub max_total_mcast_qp_attach: u32,
        pub max_ah: u32,
        pub max_fmr: u32,
        pub max_map_per_fmr: u32,
        pub max_srq: u32,
        pub max_srq_wr: u32,
        pub max_srq_sge: u32,
        pub max_pkeys: u16,
        pub local_ca_ack_delay: u8,
        pub phys_port_cnt: u8,
        pub reserved: [u8; 4],
    }
}
abi_layout!(QueryDeviceResp, 176, fw_ver @ 0, node_guid @ 8, sys_image_guid @ 16,
    max_mr_size @ 24, page_size_cap @ 32, vendor_id @ 40, vendor_part_id @ 44, hw_ver @ 48,
    max_qp @ 52, max_qp_wr @ 56, device_cap_flags @ 60, max_sge @ 64, max_sge_rd @ 68,
    max_cq @ 72, max_cqe @ 76, max_mr @ 80, max_pd @ 84, max_qp_rd_atom @ 88,
    max_ee_rd_atom @ 92, max_res_rd_atom @ 96, max_qp_init_rd_atom @ 100,
    max_ee_init_rd_atom @ 104, atomic_cap @ 108, max_ee @ 112, max_rdd @ 116, max_mw @ 120,
    max_raw_ipv6_qp @ 124, max_raw_ethy_qp @ 128, max_mcast_grp @ 132,
    max_mcast_qp_attach @ 136, max_total_mcast_qp_attach @ 140, max_ah @ 144, max_fmr @ 148,
    max_map_per_fmr @ 152, max_srq @ 156, max_srq_wr @ 160, max_srq_sge @ 164,
    max_pkeys @ 168, local_ca_ack_delay @ 170, phys_port_cnt @ 171, reserved @ 172);
command!(
    QueryDevice,
    cmd::QUERY_DEVICE,
    "QUERY_DEVICE",
    QueryDeviceResp
);

abi_struct! {
    /// `struct ib_uverbs_ex_query_device` (an extended command: see [`super::frame_ex`]).
    pub struct ExQueryDevice {
        pub comp_mask: u32,
        pub reserved: u32,
    }
}
abi_layout!(ExQueryDevice, 8, comp_mask @ 0, reserved @ 4);

abi_struct! {
    /// `struct ib_uverbs_odp_caps`.
    pub struct OdpCapsAbi {
        /// `IB_ODP_SUPPORT` (bit 0), `IB_ODP_SUPPORT_IMPLICIT` (bit 1).
        pub general_caps: u64,
        pub rc_odp_caps: u32,
        pub uc_odp_caps: u32,
        pub ud_odp_caps: u32,
        pub reserved: u32,
    }
}
abi_layout!(OdpCapsAbi, 24, general_caps @ 0, rc_odp_caps @ 8, uc_odp_caps @ 12,
    ud_odp_caps @ 16, reserved @ 20);

/// `IB_ODP_SUPPORT` in [`OdpCapsAbi::general_caps`].
pub const ODP_SUPPORT: u64 = 1 << 0;

abi_struct! {
    /// `struct ib_uverbs_ex_query_device_resp` as the system's headers define it; a newer
    /// kernel may write more (the caller's buffer is larger), an older one less
    /// (`response_length` says how much).
    pub struct ExQueryDeviceResp {
        pub base: QueryDeviceResp,
        pub comp_mask: u32,
        pub response_length: u32,
        pub odp_caps: OdpCapsAbi,
        pub timestamp_mask: u64,
        pub hca_core_clock: u64,
        pub device_cap_flags_ex: u64,
        pub rss_caps: [u32; 4],
        pub max_wq_type_rq: u32,
        pub raw_packet_caps: u32,
        pub tm_caps: [u32; 6],
        pub cq_moderation_caps: [u32; 2],
        pub max_dm_size: u64,
        pub xrc_odp_caps: u32,
        pub reserved: u32,
    }
}
abi_layout!(ExQueryDeviceResp, 304, base @ 0, comp_mask @ 176, response_length @ 180,
    odp_caps @ 184, timestamp_mask @ 208, hca_core_clock @ 216, device_cap_flags_ex @ 224,
    rss_caps @ 232, max_wq_type_rq @ 248, raw_packet_caps @ 252, tm_caps @ 256,
    cq_moderation_caps @ 280, max_dm_size @ 288, xrc_odp_caps @ 296, reserved @ 300);

abi_struct! {
    /// `struct ib_uverbs_query_port`.
    pub struct QueryPort {
        pub response: u64,
        pub port_num: u8,
        pub reserved: [u8; 7],
    }
}
abi_layout!(QueryPort, 16, response @ 0, port_num @ 8, reserved @ 9);

abi_struct! {
    /// `struct ib_uverbs_query_port_resp`.
    pub struct QueryPortResp {
        pub port_cap_flags: u32,
        pub max_msg_sz: u32,
        pub bad_pkey_cntr: u32,
        pub qkey_viol_cntr: u32,
        pub gid_tbl_len: u32,
        pub pkey_tbl_len: u16,
        pub lid: u16,
        pub sm_lid: u16,
        pub state: u8,
        pub max_mtu: u8,
        pub active_mtu: u8,
        pub lmc: u8,
        pub max_vl_num: u8,
        pub sm_sl: u8,
        pub subnet_timeout: u8,
        pub init_type_reply: u8,
        pub active_width: u8,
        pub active_speed: u8,
        pub phys_state: u8,
        pub link_layer: u8,
        pub flags: u8,
        pub reserved: u8,
    }
}
abi_layout!(QueryPortResp, 40, port_cap_flags @ 0, max_msg_sz @ 4, bad_pkey_cntr @ 8,
    qkey_viol_cntr @ 12, gid_tbl_len @ 16, pkey_tbl_len @ 20, lid @ 22, sm_lid @ 24,
    state @ 26, max_mtu @ 27, active_mtu @ 28, lmc @ 29, max_vl_num @ 30, sm_sl @ 31,
    subnet_timeout @ 32, init_type_reply @ 33, active_width @ 34, active_speed @ 35,
    phys_state @ 36, link_layer @ 37, flags @ 38, reserved @ 39);
command!(QueryPort, cmd::QUERY_PORT, "QUERY_PORT", QueryPortResp);

abi_struct! {
    /// `struct ib_uverbs_create_comp_channel`.
    pub struct CreateCompChannel {
        pub response: u64,
    }
}
abi_layout!(CreateCompChannel, 8, response @ 0);

abi_struct! {
    /// `struct ib_uverbs_create_comp_channel_resp`.
    pub struct CreateCompChannelResp {
        pub fd: u32,
    }
}
abi_layout!(CreateCompChannelResp, 4, fd @ 0);
command!(
    CreateCompChannel,
    cmd::CREATE_COMP_CHANNEL,
    "CREATE_COMP_CHANNEL",
    CreateCompChannelResp
);

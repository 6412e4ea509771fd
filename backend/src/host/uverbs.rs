//! The kernel's uverbs `write()` command ABI (`include/uapi/rdma/ib_user_verbs.h`, ABI 6) and
//! the framing of one legacy write command.
//!
//! A legacy command is one `write()` on the uverbs character device of
//! `struct ib_uverbs_cmd_hdr` + the core request + the driver's request ("udata in"). `in_words`
//! counts 32-bit words of the whole buffer, header included; `out_words` counts the words of the
//! response buffer, whose address is the request's first member `response`. The kernel
//! (`drivers/infiniband/core/uverbs_main.c`, `ib_uverbs_write`/`verify_hdr`) splits both sides at
//! the size of the core structs declared in `uverbs_def_write_intf[]`: bytes past the core request
//! are the driver's input, bytes of the response past the core response are the driver's output.
//! rdma-core's `libibverbs/cmd_*.c` build exactly these buffers.
//!
//! Every struct here is `#[repr(C)]` with explicit padding; `zerocopy::IntoBytes` refuses implicit
//! padding at compile time, the `abi_layout!` asserts pin sizes and offsets, and a host test
//! compares them with the C compiler's view of the system headers.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Asserts at compile time the size of an ABI struct and the offsets of its fields.
macro_rules! abi_layout {
    ($ty:ty, $size:expr $(, $field:ident @ $off:expr)* $(,)?) => {
        const _: () = {
            assert!(::core::mem::size_of::<$ty>() == $size);
            $(assert!(::core::mem::offset_of!($ty, $field) == $off);)*
        };
    };
}
pub(crate) use abi_layout;

/// Declares a uverbs/rxe ABI struct: `#[repr(C)]` plain data that zerocopy can read from and
/// write to the kernel's buffers (padding must be explicit: `IntoBytes` refuses implicit
/// padding at compile time).
macro_rules! abi_struct {
    ($(#[$meta:meta])* pub struct $name:ident { $($(#[$fmeta:meta])* pub $field:ident: $ty:ty),* $(,)? }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(
            Debug,
            Default,
            Clone,
            Copy,
            PartialEq,
            Eq,
            ::zerocopy::FromBytes,
            ::zerocopy::IntoBytes,
            ::zerocopy::Immutable,
            ::zerocopy::KnownLayout,
        )]
        pub struct $name {
            $($(#[$fmeta])* pub $field: $ty),*
        }
    };
}
pub(crate) use abi_struct;

/// `IB_USER_VERBS_ABI_VERSION`.
pub const ABI_VERSION: u32 = 6;

/// Legacy write command numbers (`enum ib_uverbs_write_cmds`).
pub mod cmd {
    /// `IB_USER_VERBS_CMD_GET_CONTEXT`.
    pub const GET_CONTEXT: u32 = 0;
    /// `IB_USER_VERBS_CMD_QUERY_DEVICE`.
    pub const QUERY_DEVICE: u32 = 1;
    /// `IB_USER_VERBS_CMD_QUERY_PORT`.
    pub const QUERY_PORT: u32 = 2;
    /// `IB_USER_VERBS_CMD_ALLOC_PD`.
    pub const ALLOC_PD: u32 = 3;
    /// `IB_USER_VERBS_CMD_DEALLOC_PD`.
    pub const DEALLOC_PD: u32 = 4;
    /// `IB_USER_VERBS_CMD_CREATE_AH`.
    pub const CREATE_AH: u32 = 5;
    /// `IB_USER_VERBS_CMD_DESTROY_AH`.
    pub const DESTROY_AH: u32 = 8;
    /// `IB_USER_VERBS_CMD_REG_MR`.
    pub const REG_MR: u32 = 9;
    /// `IB_USER_VERBS_CMD_DEREG_MR`.
    pub const DEREG_MR: u32 = 13;
    /// `IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL`.
    pub const CREATE_COMP_CHANNEL: u32 = 17;
    /// `IB_USER_VERBS_CMD_CREATE_CQ`.
    pub const CREATE_CQ: u32 = 18;
    /// `IB_USER_VERBS_CMD_DESTROY_CQ`.
    pub const DESTROY_CQ: u32 = 20;
    /// `IB_USER_VERBS_CMD_REQ_NOTIFY_CQ`.
    pub const REQ_NOTIFY_CQ: u32 = 23;
    /// `IB_USER_VERBS_CMD_CREATE_QP`.
    pub const CREATE_QP: u32 = 24;
    /// `IB_USER_VERBS_CMD_QUERY_QP`.
    pub const QUERY_QP: u32 = 25;
    /// `IB_USER_VERBS_CMD_MODIFY_QP`.
    pub const MODIFY_QP: u32 = 26;
    /// `IB_USER_VERBS_CMD_DESTROY_QP`.
    pub const DESTROY_QP: u32 = 27;
    /// `IB_USER_VERBS_CMD_POST_SEND`.
    pub const POST_SEND: u32 = 28;
    /// `IB_USER_VERBS_CMD_CREATE_SRQ`.
    pub const CREATE_SRQ: u32 = 32;
    /// `IB_USER_VERBS_CMD_MODIFY_SRQ`.
    pub const MODIFY_SRQ: u32 = 33;
    /// `IB_USER_VERBS_CMD_DESTROY_SRQ`.
    pub const DESTROY_SRQ: u32 = 35;
}

/// A legacy write command: its number, its name for errors, its core request layout.
pub trait Command: IntoBytes + Immutable {
    /// Command number (`IB_USER_VERBS_CMD_*`).
    const CODE: u32;
    /// Name used in errors and logs.
    const NAME: &'static str;
}

/// A command whose core request starts with `__aligned_u64 response`.
pub trait CommandWithResponse: Command {
    /// The core response (`struct ib_uverbs_*_resp` without its flexible `driver_data`).
    type Response: FromBytes + IntoBytes + Immutable + KnownLayout;
    /// Stores the user address of the response buffer into the request.
    fn set_response(&mut self, address: u64);
}

macro_rules! command {
    ($req:ty, $code:expr, $name:literal) => {
        impl Command for $req {
            const CODE: u32 = $code;
            const NAME: &'static str = $name;
        }
    };
    ($req:ty, $code:expr, $name:literal, $resp:ty) => {
        command!($req, $code, $name);
        impl CommandWithResponse for $req {
            type Response = $resp;
            fn set_response(&mut self, address: u64) {
                self.response = address;
            }
        }
    };
}

/// Why a command buffer could not be framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A length is not a multiple of 4 bytes.
    #[error("{what} length {len} is not a multiple of 4 bytes")]
    Unaligned {
        /// Which part.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
    },
    /// A length does not fit the header's 16-bit word count.
    #[error("{what} length {len} exceeds the 16-bit word count of the command header")]
    TooLong {
        /// Which part.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
    },
}

fn words(what: &'static str, len: usize) -> Result<u16, FrameError> {
    if !len.is_multiple_of(4) {
        return Err(FrameError::Unaligned { what, len });
    }
    u16::try_from(len / 4).map_err(|_| FrameError::TooLong { what, len })
}

/// Builds the `write()` buffer of a legacy command: header, core request, driver request.
/// `out_len` is the size of the response buffer (core + driver response) the request points at.
pub fn frame(
    code: u32,
    core: &[u8],
    driver_in: &[u8],
    out_len: usize,
) -> Result<Vec<u8>, FrameError> {
    let total = size_of::<CmdHdr>() + core.len() + driver_in.len();
    let hdr = CmdHdr {
        command: code,
        in_words: words("command", total)?,
        out_words: words("response", out_len)?,
    };
    let mut buf = Vec::with_capacity(total);
    buf.extend_from_slice(hdr.as_bytes());
    buf.extend_from_slice(core);
    buf.extend_from_slice(driver_in);
    Ok(buf)
}

abi_struct! {
    /// `struct ib_uverbs_cmd_hdr`.
    pub struct CmdHdr {
        pub command: u32,
        pub in_words: u16,
        pub out_words: u16,
    }
}
abi_layout!(CmdHdr, 8, command @ 0, in_words @ 4, out_words @ 6);

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
    /// `struct ib_uverbs_alloc_pd`.
    pub struct AllocPd {
        pub response: u64,
    }
}
abi_layout!(AllocPd, 8, response @ 0);

abi_struct! {
    /// `struct ib_uverbs_alloc_pd_resp`.
    pub struct AllocPdResp {
        pub pd_handle: u32,
    }
}
abi_layout!(AllocPdResp, 4, pd_handle @ 0);
command!(AllocPd, cmd::ALLOC_PD, "ALLOC_PD", AllocPdResp);

abi_struct! {
    /// `struct ib_uverbs_dealloc_pd`.
    pub struct DeallocPd {
        pub pd_handle: u32,
    }
}
abi_layout!(DeallocPd, 4, pd_handle @ 0);
command!(DeallocPd, cmd::DEALLOC_PD, "DEALLOC_PD");

abi_struct! {
    /// `struct ib_uverbs_reg_mr`.
    pub struct RegMr {
        pub response: u64,
        pub start: u64,
        pub length: u64,
        pub hca_va: u64,
        pub pd_handle: u32,
        pub access_flags: u32,
    }
}
abi_layout!(RegMr, 40, response @ 0, start @ 8, length @ 16, hca_va @ 24, pd_handle @ 32,
    access_flags @ 36);

abi_struct! {
    /// `struct ib_uverbs_reg_mr_resp`.
    pub struct RegMrResp {
        pub mr_handle: u32,
        pub lkey: u32,
        pub rkey: u32,
    }
}
abi_layout!(RegMrResp, 12, mr_handle @ 0, lkey @ 4, rkey @ 8);
command!(RegMr, cmd::REG_MR, "REG_MR", RegMrResp);

abi_struct! {
    /// `struct ib_uverbs_dereg_mr`.
    pub struct DeregMr {
        pub mr_handle: u32,
    }
}
abi_layout!(DeregMr, 4, mr_handle @ 0);
command!(DeregMr, cmd::DEREG_MR, "DEREG_MR");

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

abi_struct! {
    /// `struct ib_uverbs_create_cq`.
    pub struct CreateCq {
        pub response: u64,
        pub user_handle: u64,
        pub cqe: u32,
        pub comp_vector: u32,
        /// A completion channel fd, or -1 for none.
        pub comp_channel: i32,
        pub reserved: u32,
    }
}
abi_layout!(CreateCq, 32, response @ 0, user_handle @ 8, cqe @ 16, comp_vector @ 20,
    comp_channel @ 24, reserved @ 28);

abi_struct! {
    /// `struct ib_uverbs_create_cq_resp`.
    pub struct CreateCqResp {
        pub cq_handle: u32,
        pub cqe: u32,
    }
}
abi_layout!(CreateCqResp, 8, cq_handle @ 0, cqe @ 4);
command!(CreateCq, cmd::CREATE_CQ, "CREATE_CQ", CreateCqResp);

abi_struct! {
    /// `struct ib_uverbs_req_notify_cq`.
    pub struct ReqNotifyCq {
        pub cq_handle: u32,
        pub solicited_only: u32,
    }
}
abi_layout!(ReqNotifyCq, 8, cq_handle @ 0, solicited_only @ 4);
command!(ReqNotifyCq, cmd::REQ_NOTIFY_CQ, "REQ_NOTIFY_CQ");

abi_struct! {
    /// `struct ib_uverbs_destroy_cq`.
    pub struct DestroyCq {
        pub response: u64,
        pub cq_handle: u32,
        pub reserved: u32,
    }
}
abi_layout!(DestroyCq, 16, response @ 0, cq_handle @ 8, reserved @ 12);

abi_struct! {
    /// `struct ib_uverbs_destroy_cq_resp`.
    pub struct DestroyCqResp {
        pub comp_events_reported: u32,
        pub async_events_reported: u32,
    }
}
abi_layout!(DestroyCqResp, 8, comp_events_reported @ 0, async_events_reported @ 4);
command!(DestroyCq, cmd::DESTROY_CQ, "DESTROY_CQ", DestroyCqResp);

abi_struct! {
    /// `struct ib_uverbs_global_route`.
    pub struct GlobalRoute {
        pub dgid: [u8; 16],
        pub flow_label: u32,
        pub sgid_index: u8,
        pub hop_limit: u8,
        pub traffic_class: u8,
        pub reserved: u8,
    }
}
abi_layout!(GlobalRoute, 24, dgid @ 0, flow_label @ 16, sgid_index @ 20, hop_limit @ 21,
    traffic_class @ 22, reserved @ 23);

abi_struct! {
    /// `struct ib_uverbs_ah_attr`.
    pub struct AhAttr {
        pub grh: GlobalRoute,
        pub dlid: u16,
        pub sl: u8,
        pub src_path_bits: u8,
        pub static_rate: u8,
        pub is_global: u8,
        pub port_num: u8,
        pub reserved: u8,
    }
}
abi_layout!(AhAttr, 32, grh @ 0, dlid @ 24, sl @ 26, src_path_bits @ 27, static_rate @ 28,
    is_global @ 29, port_num @ 30, reserved @ 31);

abi_struct! {
    /// `struct ib_uverbs_qp_dest`: the address vector inside QUERY_QP / MODIFY_QP.
    pub struct QpDest {
        pub dgid: [u8; 16],
        pub flow_label: u32,
        pub dlid: u16,
        pub reserved: u16,
        pub sgid_index: u8,
        pub hop_limit: u8,
        pub traffic_class: u8,
        pub sl: u8,
        pub src_path_bits: u8,
        pub static_rate: u8,
        pub is_global: u8,
        pub port_num: u8,
    }
}
abi_layout!(QpDest, 32, dgid @ 0, flow_label @ 16, dlid @ 20, reserved @ 22, sgid_index @ 24,
    hop_limit @ 25, traffic_class @ 26, sl @ 27, src_path_bits @ 28, static_rate @ 29,
    is_global @ 30, port_num @ 31);

abi_struct! {
    /// `struct ib_uverbs_create_qp`.
    pub struct CreateQp {
        pub response: u64,
        pub user_handle: u64,
        pub pd_handle: u32,
        pub send_cq_handle: u32,
        pub recv_cq_handle: u32,
        pub srq_handle: u32,
        pub max_send_wr: u32,
        pub max_recv_wr: u32,
        pub max_send_sge: u32,
        pub max_recv_sge: u32,
        pub max_inline_data: u32,
        pub sq_sig_all: u8,
        pub qp_type: u8,
        pub is_srq: u8,
        pub reserved: u8,
    }
}
abi_layout!(CreateQp, 56, response @ 0, user_handle @ 8, pd_handle @ 16, send_cq_handle @ 20,
    recv_cq_handle @ 24, srq_handle @ 28, max_send_wr @ 32, max_recv_wr @ 36,
    max_send_sge @ 40, max_recv_sge @ 44, max_inline_data @ 48, sq_sig_all @ 52,
    qp_type @ 53, is_srq @ 54, reserved @ 55);

abi_struct! {
    /// `struct ib_uverbs_create_qp_resp`.
    pub struct CreateQpResp {
        pub qp_handle: u32,
        pub qpn: u32,
        pub max_send_wr: u32,
        pub max_recv_wr: u32,
        pub max_send_sge: u32,
        pub max_recv_sge: u32,
        pub max_inline_data: u32,
        pub reserved: u32,
    }
}
abi_layout!(CreateQpResp, 32, qp_handle @ 0, qpn @ 4, max_send_wr @ 8, max_recv_wr @ 12,
    max_send_sge @ 16, max_recv_sge @ 20, max_inline_data @ 24, reserved @ 28);
command!(CreateQp, cmd::CREATE_QP, "CREATE_QP", CreateQpResp);

abi_struct! {
    /// `struct ib_uverbs_query_qp`.
    pub struct QueryQp {
        pub response: u64,
        pub qp_handle: u32,
        pub attr_mask: u32,
    }
}
abi_layout!(QueryQp, 16, response @ 0, qp_handle @ 8, attr_mask @ 12);

abi_struct! {
    /// `struct ib_uverbs_query_qp_resp`.
    pub struct QueryQpResp {
        pub dest: QpDest,
        pub alt_dest: QpDest,
        pub max_send_wr: u32,
        pub max_recv_wr: u32,
        pub max_send_sge: u32,
        pub max_recv_sge: u32,
        pub max_inline_data: u32,
        pub qkey: u32,
        pub rq_psn: u32,
        pub sq_psn: u32,
        pub dest_qp_num: u32,
        pub qp_access_flags: u32,
        pub pkey_index: u16,
        pub alt_pkey_index: u16,
        pub qp_state: u8,
        pub cur_qp_state: u8,
        pub path_mtu: u8,
        pub path_mig_state: u8,
        pub sq_draining: u8,
        pub max_rd_atomic: u8,
        pub max_dest_rd_atomic: u8,
        pub min_rnr_timer: u8,
        pub port_num: u8,
        pub timeout: u8,
        pub retry_cnt: u8,
        pub rnr_retry: u8,
        pub alt_port_num: u8,
        pub alt_timeout: u8,
        pub sq_sig_all: u8,
        pub reserved: [u8; 5],
    }
}
abi_layout!(QueryQpResp, 128, dest @ 0, alt_dest @ 32, max_send_wr @ 64, max_recv_wr @ 68,
    max_send_sge @ 72, max_recv_sge @ 76, max_inline_data @ 80, qkey @ 84, rq_psn @ 88,
    sq_psn @ 92, dest_qp_num @ 96, qp_access_flags @ 100, pkey_index @ 104,
    alt_pkey_index @ 106, qp_state @ 108, cur_qp_state @ 109, path_mtu @ 110,
    path_mig_state @ 111, sq_draining @ 112, max_rd_atomic @ 113, max_dest_rd_atomic @ 114,
    min_rnr_timer @ 115, port_num @ 116, timeout @ 117, retry_cnt @ 118, rnr_retry @ 119,
    alt_port_num @ 120, alt_timeout @ 121, sq_sig_all @ 122, reserved @ 123);
command!(QueryQp, cmd::QUERY_QP, "QUERY_QP", QueryQpResp);

abi_struct! {
    /// `struct ib_uverbs_modify_qp` (no response).
    pub struct ModifyQp {
        pub dest: QpDest,
        pub alt_dest: QpDest,
        pub qp_handle: u32,
        pub attr_mask: u32,
        pub qkey: u32,
        pub rq_psn: u32,
        pub sq_psn: u32,
        pub dest_qp_num: u32,
        pub qp_access_flags: u32,
        pub pkey_index: u16,
        pub alt_pkey_index: u16,
        pub qp_state: u8,
        pub cur_qp_state: u8,
        pub path_mtu: u8,
        pub path_mig_state: u8,
        pub en_sqd_async_notify: u8,
        pub max_rd_atomic: u8,
        pub max_dest_rd_atomic: u8,
        pub min_rnr_timer: u8,
        pub port_num: u8,
        pub timeout: u8,
        pub retry_cnt: u8,
        pub rnr_retry: u8,
        pub alt_port_num: u8,
        pub alt_timeout: u8,
        pub reserved: [u8; 2],
    }
}
abi_layout!(ModifyQp, 112, dest @ 0, alt_dest @ 32, qp_handle @ 64, attr_mask @ 68,
    qkey @ 72, rq_psn @ 76, sq_psn @ 80, dest_qp_num @ 84, qp_access_flags @ 88,
    pkey_index @ 92, alt_pkey_index @ 94, qp_state @ 96, cur_qp_state @ 97, path_mtu @ 98,
    path_mig_state @ 99, en_sqd_async_notify @ 100, max_rd_atomic @ 101,
    max_dest_rd_atomic @ 102, min_rnr_timer @ 103, port_num @ 104, timeout @ 105,
    retry_cnt @ 106, rnr_retry @ 107, alt_port_num @ 108, alt_timeout @ 109, reserved @ 110);
command!(ModifyQp, cmd::MODIFY_QP, "MODIFY_QP");

abi_struct! {
    /// `struct ib_uverbs_destroy_qp`.
    pub struct DestroyQp {
        pub response: u64,
        pub qp_handle: u32,
        pub reserved: u32,
    }
}
abi_layout!(DestroyQp, 16, response @ 0, qp_handle @ 8, reserved @ 12);

abi_struct! {
    /// `struct ib_uverbs_destroy_qp_resp`.
    pub struct DestroyQpResp {
        pub events_reported: u32,
    }
}
abi_layout!(DestroyQpResp, 4, events_reported @ 0);
command!(DestroyQp, cmd::DESTROY_QP, "DESTROY_QP", DestroyQpResp);

abi_struct! {
    /// `struct ib_uverbs_post_send` with no work requests attached.
    pub struct PostSend {
        pub response: u64,
        pub qp_handle: u32,
        pub wr_count: u32,
        pub sge_count: u32,
        pub wqe_size: u32,
    }
}
abi_layout!(PostSend, 24, response @ 0, qp_handle @ 8, wr_count @ 12, sge_count @ 16,
    wqe_size @ 20);

abi_struct! {
    /// `struct ib_uverbs_post_send_resp`.
    pub struct PostSendResp {
        pub bad_wr: u32,
    }
}
abi_layout!(PostSendResp, 4, bad_wr @ 0);
command!(PostSend, cmd::POST_SEND, "POST_SEND", PostSendResp);

abi_struct! {
    /// A complete POST_SEND write with no work requests, built without allocating: the rxe send
    /// kick runs once per doorbell on the data path.
    pub struct FramedKick {
        pub hdr: CmdHdr,
        pub req: PostSend,
    }
}
abi_layout!(FramedKick, 32, hdr @ 0, req @ 8);

impl FramedKick {
    /// The kick for QP `qp_handle`; the kernel writes a [`PostSendResp`] at `response`.
    pub fn new(qp_handle: u32, response: u64) -> FramedKick {
        FramedKick {
            hdr: CmdHdr {
                command: cmd::POST_SEND,
                in_words: (size_of::<FramedKick>() / 4) as u16,
                out_words: (size_of::<PostSendResp>() / 4) as u16,
            },
            req: PostSend {
                response,
                qp_handle,
                wr_count: 0,
                sge_count: 0,
                wqe_size: KICK_WQE_SIZE,
            },
        }
    }
}

/// `wqe_size` of the send kick: `sizeof(struct ibv_send_wr)` as rdma-core's rxe provider sends
/// it. The kernel rejects a `wqe_size` below `sizeof(struct ib_uverbs_send_wr)` even when no work
/// request follows.
pub const KICK_WQE_SIZE: u32 = 128;

abi_struct! {
    /// `struct ib_uverbs_create_srq`.
    pub struct CreateSrq {
        pub response: u64,
        pub user_handle: u64,
        pub pd_handle: u32,
        pub max_wr: u32,
        pub max_sge: u32,
        pub srq_limit: u32,
    }
}
abi_layout!(CreateSrq, 32, response @ 0, user_handle @ 8, pd_handle @ 16, max_wr @ 20,
    max_sge @ 24, srq_limit @ 28);

abi_struct! {
    /// `struct ib_uverbs_create_srq_resp`.
    pub struct CreateSrqResp {
        pub srq_handle: u32,
        pub max_wr: u32,
        pub max_sge: u32,
        pub srqn: u32,
    }
}
abi_layout!(CreateSrqResp, 16, srq_handle @ 0, max_wr @ 4, max_sge @ 8, srqn @ 12);
command!(CreateSrq, cmd::CREATE_SRQ, "CREATE_SRQ", CreateSrqResp);

abi_struct! {
    /// `struct ib_uverbs_modify_srq` (no response; the driver's request follows).
    pub struct ModifySrq {
        pub srq_handle: u32,
        pub attr_mask: u32,
        pub max_wr: u32,
        pub srq_limit: u32,
    }
}
abi_layout!(ModifySrq, 16, srq_handle @ 0, attr_mask @ 4, max_wr @ 8, srq_limit @ 12);
command!(ModifySrq, cmd::MODIFY_SRQ, "MODIFY_SRQ");

abi_struct! {
    /// `struct ib_uverbs_destroy_srq`.
    pub struct DestroySrq {
        pub response: u64,
        pub srq_handle: u32,
        pub reserved: u32,
    }
}
abi_layout!(DestroySrq, 16, response @ 0, srq_handle @ 8, reserved @ 12);

abi_struct! {
    /// `struct ib_uverbs_destroy_srq_resp`.
    pub struct DestroySrqResp {
        pub events_reported: u32,
    }
}
abi_layout!(DestroySrqResp, 4, events_reported @ 0);
command!(DestroySrq, cmd::DESTROY_SRQ, "DESTROY_SRQ", DestroySrqResp);

abi_struct! {
    /// `struct ib_uverbs_create_ah`.
    pub struct CreateAh {
        pub response: u64,
        pub user_handle: u64,
        pub pd_handle: u32,
        pub reserved: u32,
        pub attr: AhAttr,
    }
}
abi_layout!(CreateAh, 56, response @ 0, user_handle @ 8, pd_handle @ 16, reserved @ 20,
    attr @ 24);

abi_struct! {
    /// `struct ib_uverbs_create_ah_resp`.
    pub struct CreateAhResp {
        pub ah_handle: u32,
    }
}
abi_layout!(CreateAhResp, 4, ah_handle @ 0);
command!(CreateAh, cmd::CREATE_AH, "CREATE_AH", CreateAhResp);

abi_struct! {
    /// `struct ib_uverbs_destroy_ah`.
    pub struct DestroyAh {
        pub ah_handle: u32,
    }
}
abi_layout!(DestroyAh, 4, ah_handle @ 0);
command!(DestroyAh, cmd::DESTROY_AH, "DESTROY_AH");

#[cfg(test)]
mod tests {
    use super::*;

    fn u32_at(buf: &[u8], off: usize) -> u32 {
        u32::from_le_bytes(buf[off..off + 4].try_into().unwrap())
    }

    fn u64_at(buf: &[u8], off: usize) -> u64 {
        u64::from_le_bytes(buf[off..off + 8].try_into().unwrap())
    }

    #[test]
    fn kick_is_post_send_with_no_work_requests() {
        let req = PostSend {
            response: 0x1122_3344_5566_7788,
            qp_handle: 7,
            wr_count: 0,
            sge_count: 0,
            wqe_size: KICK_WQE_SIZE,
        };
        let buf = frame(
            PostSend::CODE,
            req.as_bytes(),
            &[],
            size_of::<PostSendResp>(),
        )
        .unwrap();
        // Same 32 bytes rdma-core's providers/rxe post_send_db() writes.
        assert_eq!(buf.len(), 32);
        assert_eq!(u32_at(&buf, 0), 28, "command");
        assert_eq!(
            u16::from_le_bytes([buf[4], buf[5]]),
            8,
            "in_words counts the header"
        );
        assert_eq!(u16::from_le_bytes([buf[6], buf[7]]), 1, "out_words");
        assert_eq!(u64_at(&buf, 8), 0x1122_3344_5566_7788, "response");
        assert_eq!(u32_at(&buf, 16), 7, "qp_handle");
        assert_eq!(u32_at(&buf, 20), 0, "wr_count");
        assert_eq!(u32_at(&buf, 24), 0, "sge_count");
        assert_eq!(u32_at(&buf, 28), 128, "wqe_size");
    }

    #[test]
    fn allocation_free_kick_matches_the_generic_framing() {
        let kick = FramedKick::new(7, 0x1122_3344_5566_7788);
        let req = PostSend {
            response: 0x1122_3344_5566_7788,
            qp_handle: 7,
            wr_count: 0,
            sge_count: 0,
            wqe_size: KICK_WQE_SIZE,
        };
        let framed = frame(PostSend::CODE, req.as_bytes(), &[], 4).unwrap();
        assert_eq!(kick.as_bytes(), framed.as_slice());
    }

    #[test]
    fn create_cq_response_covers_core_and_driver_parts() {
        let req = CreateCq {
            response: 0xdead_beef_0000,
            user_handle: 0x55,
            cqe: 63,
            comp_vector: 0,
            comp_channel: -1,
            reserved: 0,
        };
        // Core response 8 bytes + rxe_create_cq_resp 16 bytes.
        let buf = frame(CreateCq::CODE, req.as_bytes(), &[], 24).unwrap();
        assert_eq!(buf.len(), 40);
        assert_eq!(u32_at(&buf, 0), 18);
        assert_eq!(u16::from_le_bytes([buf[4], buf[5]]), 10);
        assert_eq!(u16::from_le_bytes([buf[6], buf[7]]), 6);
        assert_eq!(u64_at(&buf, 8), 0xdead_beef_0000);
        assert_eq!(u64_at(&buf, 16), 0x55, "user_handle");
        assert_eq!(u32_at(&buf, 24), 63, "cqe");
        assert_eq!(u32_at(&buf, 28), 0, "comp_vector");
        assert_eq!(u32_at(&buf, 32), u32::MAX, "comp_channel -1");
    }

    #[test]
    fn modify_srq_appends_driver_request_after_core() {
        let req = ModifySrq {
            srq_handle: 3,
            attr_mask: 2,
            max_wr: 0,
            srq_limit: 10,
        };
        let driver = 0x7fff_0000_1000u64.to_le_bytes();
        let buf = frame(ModifySrq::CODE, req.as_bytes(), &driver, 0).unwrap();
        assert_eq!(buf.len(), 8 + 16 + 8);
        assert_eq!(u32_at(&buf, 0), 33);
        assert_eq!(u16::from_le_bytes([buf[4], buf[5]]), 8);
        assert_eq!(u16::from_le_bytes([buf[6], buf[7]]), 0);
        assert_eq!(u32_at(&buf, 8), 3);
        assert_eq!(u32_at(&buf, 12), 2);
        assert_eq!(u32_at(&buf, 20), 10);
        assert_eq!(
            u64_at(&buf, 24),
            0x7fff_0000_1000,
            "rxe_modify_srq_cmd.mmap_info_addr"
        );
    }

    #[test]
    fn modify_qp_fields_land_where_the_kernel_reads_them() {
        let mut req = ModifyQp {
            qp_handle: 9,
            attr_mask: 0x1 | 0x80,
            qp_state: 3,
            ..Default::default()
        };
        req.dest.dgid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        req.dest.is_global = 1;
        req.dest.port_num = 1;
        req.dest.hop_limit = 64;
        let buf = frame(ModifyQp::CODE, req.as_bytes(), &[], 0).unwrap();
        assert_eq!(buf.len(), 120);
        assert_eq!(u32_at(&buf, 0), 26);
        assert_eq!(u16::from_le_bytes([buf[4], buf[5]]), 30);
        assert_eq!(&buf[8..10], &[0xfe, 0x80], "dest.dgid");
        assert_eq!(buf[8 + 25], 64, "dest.hop_limit");
        assert_eq!(buf[8 + 30], 1, "dest.is_global");
        assert_eq!(buf[8 + 31], 1, "dest.port_num");
        assert_eq!(u32_at(&buf, 8 + 64), 9, "qp_handle");
        assert_eq!(u32_at(&buf, 8 + 68), 0x81, "attr_mask");
        assert_eq!(buf[8 + 96], 3, "qp_state");
    }

    #[test]
    fn framing_rejects_lengths_the_header_cannot_express() {
        assert_eq!(
            frame(0, &[0; 6], &[], 0),
            Err(FrameError::Unaligned {
                what: "command",
                len: 14
            })
        );
        assert_eq!(
            frame(0, &[], &[], 6),
            Err(FrameError::Unaligned {
                what: "response",
                len: 6
            })
        );
        assert!(matches!(
            frame(0, &vec![0; 4 * 70000], &[], 0),
            Err(FrameError::TooLong { .. })
        ));
    }
}

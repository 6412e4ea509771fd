//! Fixed-layout wire structs of control requests and responses.
//!
//! Field order, sizes and offsets are normative (README §5); each struct's layout is
//! asserted at compile time. All multi-byte fields are little-endian and unaligned, so
//! every struct has alignment 1 and no implicit padding.

use crate::rxe_v1::RxeAv;
use crate::{Le16, Le32, Le64};

// Commands added after 1.0's first set keep their structs in files of their own.
mod gid_table;
mod mr_rereg;
mod ring_desc;
pub use gid_table::*;
pub use mr_rereg::*;

wire_struct! {
    /// Header of every control request (8 bytes).
    pub struct RequestHeader {
        /// [`crate::Opcode`].
        pub opcode: Le16,
        /// Must be zero.
        pub flags: Le16,
        /// Must be zero.
        pub reserved: Le32,
    }
}
assert_layout!(RequestHeader, 8, opcode @ 0, flags @ 2, reserved @ 4);

wire_struct! {
    /// Header of every control response (8 bytes).
    pub struct ResponseHeader {
        /// [`crate::Status`].
        pub status: Le32,
        /// Host errno for DEVICE_ERROR, else zero.
        pub detail: Le32,
    }
}
assert_layout!(ResponseHeader, 8, status @ 0, detail @ 4);

wire_struct! {
    /// Where a host queue buffer sits in the queue region and what shape it has.
    pub struct RingDesc {
        /// Offset of the buffer in shared-memory region 0 (multiple of the region page size).
        pub shm_offset: Le64,
        /// Bytes mapped at `shm_offset` (multiple of the region page size).
        pub map_len: Le32,
        /// Number of slots (power of two); capacity is `num_slots - 1`.
        pub num_slots: Le32,
        /// log2 of the slot size in bytes.
        pub log2_slot_size: Le32,
        /// Ring format of this buffer ([`crate::config::ring_format`]).
        pub format: Le32,
        /// Reserved for formats with a hardware doorbell page: offset of that page. rxe v1:
        /// zero, or with [`ring_flags::HOST_KICK`] the QP's handle in the host verbs context.
        pub db_offset: Le64,
        /// Length of the doorbell page; zero means "no doorbell page" (always for rxe v1).
        pub db_len: Le32,
        /// [`ring_flags`]; zero for a host queue buffer.
        pub flags: Le32,
    }
}
assert_layout!(RingDesc, 40, shm_offset @ 0, map_len @ 8, num_slots @ 12,
    log2_slot_size @ 16, format @ 20, db_offset @ 24, db_len @ 32, flags @ 36);

/// Flags of a [`RingDesc`].
pub mod ring_flags {
    /// The buffer is a staging ring (spec §9.6, §9.7): the device copies what the driver
    /// publishes there into a host queue on the QP's doorbell, and its `consumer_index` is the
    /// device's copy position. A driver rings after posting to a staged receive queue.
    pub const STAGED: u32 = 1 << 0;
    /// Only with `VRDMA_F_HOST_KICK`, only on a send queue that is a host queue buffer (never
    /// with [`STAGED`]): the buffer is mapped from the host verbs context's file, and
    /// `db_offset` holds the QP's handle in that context, which a host kick names (spec §5.3,
    /// [`crate::rxe_v1::kick`]). `db_len` stays 0.
    pub const HOST_KICK: u32 = 1 << 1;
}

wire_struct! {
    /// Address vector (`ibv_ah_attr` with its `ibv_global_route`), 32 bytes.
    pub struct AhAttr {
        /// Destination GID (network byte order, as in `ibv_gid`).
        pub dgid: [u8; 16],
        /// IPv6 flow label (20 bits).
        pub flow_label: Le32,
        /// Source GID table index.
        pub sgid_index: u8,
        /// Hop limit.
        pub hop_limit: u8,
        /// Traffic class.
        pub traffic_class: u8,
        /// Service level (0..=15).
        pub sl: u8,
        /// Destination LID (InfiniBand only; ignored on RoCE).
        pub dlid: Le16,
        /// Source path bits (InfiniBand only).
        pub src_path_bits: u8,
        /// Static rate (`ibv_rate`, 0..=24).
        pub static_rate: u8,
        /// 1 if the GRH fields are valid (must be 1 on RoCE ports).
        pub is_global: u8,
        /// Port number (1-based).
        pub port_num: u8,
        /// Zero.
        pub reserved: Le16,
    }
}
assert_layout!(AhAttr, 32, dgid @ 0, flow_label @ 16, sgid_index @ 20, hop_limit @ 21,
    traffic_class @ 22, sl @ 23, dlid @ 24, src_path_bits @ 26, static_rate @ 27,
    is_global @ 28, port_num @ 29, reserved @ 30);

wire_struct! {
    /// QP attributes (`ibv_qp_attr` in a fixed little-endian layout), 144 bytes.
    pub struct QpAttr {
        /// `qp_state`.
        pub qp_state: Le32,
        /// `cur_qp_state`.
        pub cur_qp_state: Le32,
        /// `path_mtu` (1..=5).
        pub path_mtu: Le32,
        /// `path_mig_state` (0..=2).
        pub path_mig_state: Le32,
        /// `qkey`.
        pub qkey: Le32,
        /// `rq_psn` (24 bits).
        pub rq_psn: Le32,
        /// `sq_psn` (24 bits).
        pub sq_psn: Le32,
        /// `dest_qp_num` (24 bits).
        pub dest_qp_num: Le32,
        /// `qp_access_flags`.
        pub qp_access_flags: Le32,
        /// `cap.max_send_wr`.
        pub max_send_wr: Le32,
        /// `cap.max_recv_wr`.
        pub max_recv_wr: Le32,
        /// `cap.max_send_sge`.
        pub max_send_sge: Le32,
        /// `cap.max_recv_sge`.
        pub max_recv_sge: Le32,
        /// `cap.max_inline_data`.
        pub max_inline_data: Le32,
        /// `ah_attr`.
        pub ah_attr: AhAttr,
        /// `alt_ah_attr`.
        pub alt_ah_attr: AhAttr,
        /// `pkey_index`.
        pub pkey_index: Le16,
        /// `alt_pkey_index`.
        pub alt_pkey_index: Le16,
        /// `en_sqd_async_notify` (0 or 1).
        pub en_sqd_async_notify: u8,
        /// `sq_draining` (output only).
        pub sq_draining: u8,
        /// `max_rd_atomic`.
        pub max_rd_atomic: u8,
        /// `max_dest_rd_atomic`.
        pub max_dest_rd_atomic: u8,
        /// `min_rnr_timer` (0..=31).
        pub min_rnr_timer: u8,
        /// `port_num`.
        pub port_num: u8,
        /// `timeout` (0..=31).
        pub timeout: u8,
        /// `retry_cnt` (0..=7).
        pub retry_cnt: u8,
        /// `rnr_retry` (0..=7).
        pub rnr_retry: u8,
        /// `alt_port_num`.
        pub alt_port_num: u8,
        /// `alt_timeout` (0..=31).
        pub alt_timeout: u8,
        /// Zero.
        pub reserved0: u8,
        /// `rate_limit`.
        pub rate_limit: Le32,
        /// Zero.
        pub reserved1: Le32,
    }
}
assert_layout!(QpAttr, 144, qp_state @ 0, cur_qp_state @ 4, path_mtu @ 8,
    path_mig_state @ 12, qkey @ 16, rq_psn @ 20, sq_psn @ 24, dest_qp_num @ 28,
    qp_access_flags @ 32, max_send_wr @ 36, max_recv_wr @ 40, max_send_sge @ 44,
    max_recv_sge @ 48, max_inline_data @ 52, ah_attr @ 56, alt_ah_attr @ 88,
    pkey_index @ 120, alt_pkey_index @ 122, en_sqd_async_notify @ 124, sq_draining @ 125,
    max_rd_atomic @ 126, max_dest_rd_atomic @ 127, min_rnr_timer @ 128, port_num @ 129,
    timeout @ 130, retry_cnt @ 131, rnr_retry @ 132, alt_port_num @ 133, alt_timeout @ 134,
    reserved0 @ 135, rate_limit @ 136, reserved1 @ 140);

// ---------------------------------------------------------------- request bodies

wire_struct! {
    /// Body naming one object (DEALLOC_PD, DEREG_MR, DESTROY_*, QUERY_SRQ).
    pub struct HandleReq {
        /// Object handle.
        pub handle: Le32,
        /// Zero.
        pub reserved: Le32,
    }
}
assert_layout!(HandleReq, 8, handle @ 0, reserved @ 4);

wire_struct! {
    /// SET_DOORBELL_AREA body.
    pub struct SetDoorbellAreaReq {
        /// Guest-physical address of the area; 4 KiB aligned.
        pub gpa: Le64,
        /// Slot count; must equal the configuration's `doorbell_slots`.
        pub slots: Le32,
        /// Zero.
        pub reserved: Le32,
    }
}
assert_layout!(SetDoorbellAreaReq, 16, gpa @ 0, slots @ 8, reserved @ 12);

wire_struct! {
    /// QUERY_PORT body.
    pub struct QueryPortReq {
        /// Port number, 1..=`num_ports`.
        pub port_num: Le32,
        /// Zero.
        pub reserved: Le32,
    }
}
assert_layout!(QueryPortReq, 8, port_num @ 0, reserved @ 4);

wire_struct! {
    /// QUERY_GID and QUERY_PKEY body.
    pub struct QueryTableReq {
        /// Port number, 1..=`num_ports`.
        pub port_num: Le32,
        /// Table index.
        pub index: Le32,
    }
}
assert_layout!(QueryTableReq, 8, port_num @ 0, index @ 4);

wire_struct! {
    /// REG_MR fixed body; `npages` le64 page addresses follow it.
    pub struct RegMrReq {
        /// PD handle.
        pub pd: Le32,
        /// Access flags ([`crate::verbs::AccessFlags::MR_ALLOWED`]).
        pub access: Le32,
        /// I/O virtual address the driver uses in SGEs and gives to peers.
        pub iova: Le64,
        /// Length in bytes (>= 1).
        pub length: Le64,
        /// log2 of the page size of the page list, 12..=30.
        pub page_shift: Le32,
        /// Number of page-list entries.
        pub npages: Le32,
    }
}
assert_layout!(RegMrReq, 32, pd @ 0, access @ 4, iova @ 8, length @ 16, page_shift @ 24,
    npages @ 28);

wire_struct! {
    /// CREATE_CQ body.
    pub struct CreateCqReq {
        /// Minimum number of CQEs (>= 1).
        pub cqe: Le32,
        /// Zero.
        pub reserved: Le32,
    }
}
assert_layout!(CreateCqReq, 8, cqe @ 0, reserved @ 4);

wire_struct! {
    /// RESIZE_CQ body.
    pub struct ResizeCqReq {
        /// CQ handle.
        pub cq: Le32,
        /// Minimum number of CQEs after the resize (>= 1).
        pub cqe: Le32,
    }
}
assert_layout!(ResizeCqReq, 8, cq @ 0, cqe @ 4);

wire_struct! {
    /// RESIZE_SRQ body.
    pub struct ResizeSrqReq {
        /// SRQ handle.
        pub srq: Le32,
        /// Minimum number of receive requests after the resize (>= 1).
        pub max_wr: Le32,
    }
}
assert_layout!(ResizeSrqReq, 8, srq @ 0, max_wr @ 4);

wire_struct! {
    /// ARM_CQ body.
    pub struct ArmCqReq {
        /// CQ handle.
        pub cq: Le32,
        /// [`crate::verbs::arm_flags`].
        pub flags: Le32,
    }
}
assert_layout!(ArmCqReq, 8, cq @ 0, flags @ 4);

wire_struct! {
    /// CREATE_QP body.
    pub struct CreateQpReq {
        /// PD handle.
        pub pd: Le32,
        /// Send CQ handle.
        pub send_cq: Le32,
        /// Receive CQ handle.
        pub recv_cq: Le32,
        /// SRQ handle, or 0 for none.
        pub srq: Le32,
        /// Requested send-queue depth.
        pub max_send_wr: Le32,
        /// Requested receive-queue depth (0 when `srq` is set).
        pub max_recv_wr: Le32,
        /// Requested SGEs per send WQE.
        pub max_send_sge: Le32,
        /// Requested SGEs per receive WQE (0 when `srq` is set).
        pub max_recv_sge: Le32,
        /// Requested inline bytes per send WQE.
        pub max_inline_data: Le32,
        /// [`crate::verbs::QpType`].
        pub qp_type: u8,
        /// 1: every send WQE generates a completion.
        pub sq_sig_all: u8,
        /// Zero.
        pub reserved: Le16,
    }
}
assert_layout!(CreateQpReq, 40, pd @ 0, send_cq @ 4, recv_cq @ 8, srq @ 12,
    max_send_wr @ 16, max_recv_wr @ 20, max_send_sge @ 24, max_recv_sge @ 28,
    max_inline_data @ 32, qp_type @ 36, sq_sig_all @ 37, reserved @ 38);

wire_struct! {
    /// MODIFY_QP body.
    pub struct ModifyQpReq {
        /// QP handle.
        pub qp: Le32,
        /// [`crate::verbs::QpAttrMask`] bits selecting the fields of `attr` to apply.
        pub attr_mask: Le32,
        /// Attribute values; unselected fields are ignored.
        pub attr: QpAttr,
    }
}
assert_layout!(ModifyQpReq, 152, qp @ 0, attr_mask @ 4, attr @ 8);

wire_struct! {
    /// QUERY_QP body.
    pub struct QueryQpReq {
        /// QP handle.
        pub qp: Le32,
        /// Attributes the driver wants (the device may return more).
        pub attr_mask: Le32,
    }
}
assert_layout!(QueryQpReq, 8, qp @ 0, attr_mask @ 4);

wire_struct! {
    /// CREATE_SRQ body.
    pub struct CreateSrqReq {
        /// PD handle.
        pub pd: Le32,
        /// Requested depth (>= 1).
        pub max_wr: Le32,
        /// Requested SGEs per WQE (>= 1).
        pub max_sge: Le32,
        /// Limit-event threshold (0 = not armed).
        pub srq_limit: Le32,
    }
}
assert_layout!(CreateSrqReq, 16, pd @ 0, max_wr @ 4, max_sge @ 8, srq_limit @ 12);

wire_struct! {
    /// MODIFY_SRQ body.
    pub struct ModifySrqReq {
        /// SRQ handle.
        pub srq: Le32,
        /// [`crate::verbs::srq_attr`] bits (non-empty).
        pub attr_mask: Le32,
        /// New depth (with `MAX_WR`).
        pub max_wr: Le32,
        /// New limit (with `LIMIT`).
        pub srq_limit: Le32,
    }
}
assert_layout!(ModifySrqReq, 16, srq @ 0, attr_mask @ 4, max_wr @ 8, srq_limit @ 12);

wire_struct! {
    /// CREATE_AH body.
    pub struct CreateAhReq {
        /// PD handle.
        pub pd: Le32,
        /// Zero.
        pub reserved: Le32,
        /// Address vector.
        pub ah_attr: AhAttr,
    }
}
assert_layout!(CreateAhReq, 40, pd @ 0, reserved @ 4, ah_attr @ 8);

// --------------------------------------------------------------- response bodies

wire_struct! {
    /// QUERY_DEVICE response body (per-guest view of `ibv_device_attr`), 192 bytes.
    pub struct DeviceAttr {
        /// Firmware version, NUL-padded ASCII.
        pub fw_ver: [u8; 64],
        /// Node GUID (network byte order).
        pub node_guid: [u8; 8],
        /// System image GUID (network byte order).
        pub sys_image_guid: [u8; 8],
        /// Largest MR length.
        pub max_mr_size: Le64,
        /// Supported page sizes (bit n set: 2^n bytes).
        pub page_size_cap: Le64,
        /// Quota on the sum of registered MR sizes, in bytes.
        pub max_mr_bytes: Le64,
        /// Host device vendor ID.
        pub vendor_id: Le32,
        /// Host device part ID.
        pub vendor_part_id: Le32,
        /// Host device hardware version.
        pub hw_ver: Le32,
        /// `ibv_device_cap_flags` as far as vrdma supports them.
        pub device_cap_flags: Le32,
        /// QP quota.
        pub max_qp: Le32,
        /// Largest QP depth.
        pub max_qp_wr: Le32,
        /// Largest SGE count per WQE.
        pub max_sge: Le32,
        /// Largest SGE count per RDMA-read WQE.
        pub max_sge_rd: Le32,
        /// CQ quota.
        pub max_cq: Le32,
        /// Largest CQ depth.
        pub max_cqe: Le32,
        /// MR quota.
        pub max_mr: Le32,
        /// PD quota.
        pub max_pd: Le32,
        /// Largest `max_dest_rd_atomic`.
        pub max_qp_rd_atom: Le32,
        /// Largest `max_rd_atomic`.
        pub max_qp_init_rd_atom: Le32,
        /// Responder resources of the device.
        pub max_res_rd_atom: Le32,
        /// `ibv_atomic_cap`.
        pub atomic_cap: Le32,
        /// AH quota.
        pub max_ah: Le32,
        /// SRQ quota.
        pub max_srq: Le32,
        /// Largest SRQ depth.
        pub max_srq_wr: Le32,
        /// Largest SGE count per SRQ WQE.
        pub max_srq_sge: Le32,
        /// Largest `max_inline_data`.
        pub max_inline_data: Le32,
        /// P_Key table size.
        pub max_pkeys: Le16,
        /// Local CA ACK delay.
        pub local_ca_ack_delay: u8,
        /// Number of ports.
        pub phys_port_cnt: u8,
    }
}
assert_layout!(DeviceAttr, 192, fw_ver @ 0, node_guid @ 64, sys_image_guid @ 72,
    max_mr_size @ 80, page_size_cap @ 88, max_mr_bytes @ 96, vendor_id @ 104,
    vendor_part_id @ 108, hw_ver @ 112, device_cap_flags @ 116, max_qp @ 120,
    max_qp_wr @ 124, max_sge @ 128, max_sge_rd @ 132, max_cq @ 136, max_cqe @ 140,
    max_mr @ 144, max_pd @ 148, max_qp_rd_atom @ 152, max_qp_init_rd_atom @ 156,
    max_res_rd_atom @ 160, atomic_cap @ 164, max_ah @ 168, max_srq @ 172, max_srq_wr @ 176,
    max_srq_sge @ 180, max_inline_data @ 184, max_pkeys @ 188, local_ca_ack_delay @ 190,
    phys_port_cnt @ 191);

wire_struct! {
    /// QUERY_PORT response body (`ibv_port_attr`), 56 bytes.
    pub struct PortAttr {
        /// `ibv_port_state`.
        pub state: Le32,
        /// `ibv_mtu`.
        pub max_mtu: Le32,
        /// `ibv_mtu`.
        pub active_mtu: Le32,
        /// GID table length.
        pub gid_tbl_len: Le32,
        /// Port capability flags.
        pub port_cap_flags: Le32,
        /// Largest message size.
        pub max_msg_sz: Le32,
        /// Bad P_Key counter.
        pub bad_pkey_cntr: Le32,
        /// Q_Key violation counter.
        pub qkey_viol_cntr: Le32,
        /// P_Key table length.
        pub pkey_tbl_len: Le16,
        /// LID.
        pub lid: Le16,
        /// SM LID.
        pub sm_lid: Le16,
        /// LMC.
        pub lmc: u8,
        /// Number of VLs.
        pub max_vl_num: u8,
        /// SM SL.
        pub sm_sl: u8,
        /// Subnet timeout.
        pub subnet_timeout: u8,
        /// Init type reply.
        pub init_type_reply: u8,
        /// Active width.
        pub active_width: u8,
        /// Active speed.
        pub active_speed: u8,
        /// Physical state.
        pub phys_state: u8,
        /// Link layer (2 = Ethernet).
        pub link_layer: u8,
        /// Port flags.
        pub flags: u8,
        /// Port capability flags 2.
        pub port_cap_flags2: Le16,
        /// Zero.
        pub reserved: Le16,
        /// Extended active speed.
        pub active_speed_ex: Le32,
    }
}
assert_layout!(PortAttr, 56, state @ 0, max_mtu @ 4, active_mtu @ 8, gid_tbl_len @ 12,
    port_cap_flags @ 16, max_msg_sz @ 20, bad_pkey_cntr @ 24, qkey_viol_cntr @ 28,
    pkey_tbl_len @ 32, lid @ 34, sm_lid @ 36, lmc @ 38, max_vl_num @ 39, sm_sl @ 40,
    subnet_timeout @ 41, init_type_reply @ 42, active_width @ 43, active_speed @ 44,
    phys_state @ 45, link_layer @ 46, flags @ 47, port_cap_flags2 @ 48, reserved @ 50,
    active_speed_ex @ 52);

/// `GidEntry::flags` bit: the entry is populated.
pub const GID_FLAG_VALID: u32 = 1 << 0;

wire_struct! {
    /// QUERY_GID response body.
    pub struct GidEntry {
        /// GID (network byte order); zero when not valid.
        pub gid: [u8; 16],
        /// [`crate::verbs::GidType`].
        pub gid_type: Le32,
        /// [`GID_FLAG_VALID`].
        pub flags: Le32,
    }
}
assert_layout!(GidEntry, 24, gid @ 0, gid_type @ 16, flags @ 20);

wire_struct! {
    /// QUERY_PKEY response body.
    pub struct PkeyEntry {
        /// P_Key (host order value).
        pub pkey: Le16,
        /// Zero.
        pub reserved: [u8; 6],
    }
}
assert_layout!(PkeyEntry, 8, pkey @ 0, reserved @ 2);

wire_struct! {
    /// Response body that returns one new handle (ALLOC_PD).
    pub struct HandleResp {
        /// New handle.
        pub handle: Le32,
        /// Zero.
        pub reserved: Le32,
    }
}
assert_layout!(HandleResp, 8, handle @ 0, reserved @ 4);

wire_struct! {
    /// REG_MR response body.
    pub struct RegMrResp {
        /// MR handle.
        pub mr: Le32,
        /// Local key for SGEs.
        pub lkey: Le32,
        /// Remote key for peers.
        pub rkey: Le32,
        /// Zero.
        pub reserved: Le32,
    }
}
assert_layout!(RegMrResp, 16, mr @ 0, lkey @ 4, rkey @ 8, reserved @ 12);

wire_struct! {
    /// ALLOC_MW request body.
    pub struct AllocMwReq {
        /// PD handle.
        pub pd: Le32,
        /// Window type: [`crate::verbs::MwType`] (1 or 2).
        pub mw_type: Le32,
    }
}
assert_layout!(AllocMwReq, 8, pd @ 0, mw_type @ 4);

wire_struct! {
    /// ALLOC_MW response body.
    pub struct AllocMwResp {
        /// MW handle.
        pub mw: Le32,
        /// The window's initial remote key (host key; its low 8 bits change on every bind).
        pub rkey: Le32,
    }
}
assert_layout!(AllocMwResp, 8, mw @ 0, rkey @ 4);

wire_struct! {
    /// CREATE_CQ response body.
    pub struct CreateCqResp {
        /// CQ handle.
        pub cq: Le32,
        /// Actual capacity (`num_slots - 1`).
        pub cqe: Le32,
        /// CQ buffer.
        pub ring: RingDesc,
    }
}
assert_layout!(CreateCqResp, 48, cq @ 0, cqe @ 4, ring @ 8);

wire_struct! {
    /// RESIZE_CQ response body.
    pub struct ResizeCqResp {
        /// Actual capacity of the new buffer (`num_slots - 1`).
        pub cqe: Le32,
        /// Zero.
        pub reserved: Le32,
        /// The new CQ buffer; the old one is unmapped.
        pub ring: RingDesc,
    }
}
assert_layout!(ResizeCqResp, 48, cqe @ 0, reserved @ 4, ring @ 8);

wire_struct! {
    /// RESIZE_SRQ response body.
    pub struct ResizeSrqResp {
        /// Actual capacity of the new buffer (`num_slots - 1`).
        pub max_wr: Le32,
        /// Zero.
        pub reserved: Le32,
        /// The new SRQ buffer; the old one is unmapped.
        pub ring: RingDesc,
    }
}
assert_layout!(ResizeSrqResp, 48, max_wr @ 0, reserved @ 4, ring @ 8);

wire_struct! {
    /// CREATE_QP response body.
    pub struct CreateQpResp {
        /// QP handle (used in commands).
        pub qp: Le32,
        /// Host QP number (appears in CQEs and on the wire).
        pub qpn: Le32,
        /// Actual send-queue capacity.
        pub max_send_wr: Le32,
        /// Actual receive-queue capacity (0 with an SRQ).
        pub max_recv_wr: Le32,
        /// Actual SGEs per send WQE.
        pub max_send_sge: Le32,
        /// Actual SGEs per receive WQE.
        pub max_recv_sge: Le32,
        /// Actual inline bytes per send WQE.
        pub max_inline_data: Le32,
        /// The QP's slot in the doorbell area (what the driver rings).
        pub doorbell_index: Le32,
        /// Send-queue buffer.
        pub sq: RingDesc,
        /// Receive-queue buffer (all zero with an SRQ).
        pub rq: RingDesc,
    }
}
assert_layout!(CreateQpResp, 112, qp @ 0, qpn @ 4, max_send_wr @ 8, max_recv_wr @ 12,
    max_send_sge @ 16, max_recv_sge @ 20, max_inline_data @ 24, doorbell_index @ 28, sq @ 32,
    rq @ 72);

wire_struct! {
    /// QUERY_QP response body.
    pub struct QueryQpResp {
        /// Bits of `attr` that hold valid values.
        pub attr_mask: Le32,
        /// Zero.
        pub reserved: Le32,
        /// Current attributes.
        pub attr: QpAttr,
    }
}
assert_layout!(QueryQpResp, 152, attr_mask @ 0, reserved @ 4, attr @ 8);

wire_struct! {
    /// CREATE_SRQ response body.
    pub struct CreateSrqResp {
        /// SRQ handle.
        pub srq: Le32,
        /// Host SRQ number.
        pub srq_num: Le32,
        /// Actual capacity.
        pub max_wr: Le32,
        /// Actual SGEs per WQE.
        pub max_sge: Le32,
        /// SRQ buffer.
        pub ring: RingDesc,
    }
}
assert_layout!(CreateSrqResp, 56, srq @ 0, srq_num @ 4, max_wr @ 8, max_sge @ 12, ring @ 16);

wire_struct! {
    /// QUERY_SRQ response body.
    pub struct QuerySrqResp {
        /// Capacity.
        pub max_wr: Le32,
        /// SGEs per WQE.
        pub max_sge: Le32,
        /// Current limit (0 = not armed).
        pub srq_limit: Le32,
        /// Zero.
        pub reserved: Le32,
    }
}
assert_layout!(QuerySrqResp, 16, max_wr @ 0, max_sge @ 4, srq_limit @ 8, reserved @ 12);

wire_struct! {
    /// CREATE_AH response body: what a native UD send WQE needs.
    pub struct CreateAhResp {
        /// AH handle.
        pub ah: Le32,
        /// rxe v1: host `ah_num` to write into `rxe_send_wr.wr.ud.ah_num` (never 0).
        pub ah_num: Le32,
        /// rxe v1: the host's `struct rxe_av` for this AH (informational; see README).
        pub av: RxeAv,
    }
}
assert_layout!(CreateAhResp, 96, ah @ 0, ah_num @ 4, av @ 8);

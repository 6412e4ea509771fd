//! The queue-pair commands: CREATE_QP, QUERY_QP, MODIFY_QP, DESTROY_QP, and POST_SEND as the
//! send kick ([`KickCall`], from the spec).

use super::ah::AhAttr;
use super::framing::{abi_layout, abi_struct, cmd, command, Command, CommandWithResponse};

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

pub use vrdma_spec::rxe_v1::kick::{KickCall, PostSend, PostSendResp, KICK_WQE_SIZE};
command!(PostSend, cmd::POST_SEND, "POST_SEND", PostSendResp);

abi_struct! {
    no_default:
    /// `struct ib_uverbs_qp_attr`: the attributes and mask of a QP state change as the
    /// kernel reports them (the rdma_cm's INIT_QP_ATTR answers with it).
    pub struct QpAttrResp {
        pub qp_attr_mask: u32,
        pub qp_state: u32,
        pub cur_qp_state: u32,
        pub path_mtu: u32,
        pub path_mig_state: u32,
        pub qkey: u32,
        pub rq_psn: u32,
        pub sq_psn: u32,
        pub dest_qp_num: u32,
        pub qp_access_flags: u32,
        pub ah_attr: AhAttr,
        pub alt_ah_attr: AhAttr,
        pub max_send_wr: u32,
        pub max_recv_wr: u32,
        pub max_send_sge: u32,
        pub max_recv_sge: u32,
        pub max_inline_data: u32,
        pub pkey_index: u16,
        pub alt_pkey_index: u16,
        pub en_sqd_async_notify: u8,
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
        pub reserved: [u8; 5],
    }
}
abi_layout!(QpAttrResp, 144, qp_attr_mask @ 0, qp_state @ 4, cur_qp_state @ 8, path_mtu @ 12,
    path_mig_state @ 16, qkey @ 20, rq_psn @ 24, sq_psn @ 28, dest_qp_num @ 32,
    qp_access_flags @ 36, ah_attr @ 40, alt_ah_attr @ 72, max_send_wr @ 104, max_recv_wr @ 108,
    max_send_sge @ 112, max_recv_sge @ 116, max_inline_data @ 120, pkey_index @ 124,
    alt_pkey_index @ 126, en_sqd_async_notify @ 128, sq_draining @ 129, max_rd_atomic @ 130,
    max_dest_rd_atomic @ 131, min_rnr_timer @ 132, port_num @ 133, timeout @ 134,
    retry_cnt @ 135, rnr_retry @ 136, alt_port_num @ 137, alt_timeout @ 138, reserved @ 139);

//! The structs and constants of the kernel's ucma `write()` ABI
//! (`include/uapi/rdma/rdma_user_cm.h`, ABI 4, unchanged from Linux 6.0 to 6.12).
//!
//! Addresses travel as a `__kernel_sockaddr_storage` (128 bytes) with their length beside them.
//! Responses go through the user pointer in a request's `response` field, never through the
//! write buffer. The kernel copies `sizeof` of most request structs whatever the header's `in`
//! says, so every request is written whole.

use crate::uverbs::{abi_layout, abi_struct, AhAttr};

/// `RDMA_USER_CM_ABI_VERSION`.
pub const ABI_VERSION: u32 = 4;

/// `enum rdma_ucm_cmd`: the commands the backend writes.
pub mod cmd {
    pub const CREATE_ID: u32 = 0;
    pub const DESTROY_ID: u32 = 1;
    pub const RESOLVE_ROUTE: u32 = 4;
    pub const CONNECT: u32 = 6;
    pub const LISTEN: u32 = 7;
    pub const ACCEPT: u32 = 8;
    pub const REJECT: u32 = 9;
    pub const DISCONNECT: u32 = 10;
    pub const INIT_QP_ATTR: u32 = 11;
    pub const GET_EVENT: u32 = 12;
    pub const SET_OPTION: u32 = 14;
    pub const NOTIFY: u32 = 15;
    pub const QUERY: u32 = 19;
    pub const BIND: u32 = 20;
    pub const RESOLVE_ADDR: u32 = 21;
}

/// `enum rdma_ucm_port_space`: the port spaces a guest may use (RC over TCP's, UD over UDP's).
/// The wire carries the kernel's numbers (spec §7.5).
pub use vrdma_spec::cm::cm_port_space as port_space;

/// `RDMA_USER_CM_QUERY_*`.
pub mod query {
    pub const ADDR: u32 = 0;
    pub const PATH: u32 = 1;
    pub const GID: u32 = 2;
}

/// `enum rdma_cm_event_type`: the wire carries the kernel's numbers (spec §7.5).
pub use vrdma_spec::cm::cm_event as event;

/// `RDMA_OPTION_ID` options (level 0); the wire carries the kernel's names (spec §7.5).
pub mod option {
    /// `RDMA_OPTION_ID`: the level of every option a guest may set.
    pub const LEVEL_ID: u32 = 0;
    pub use vrdma_spec::cm::cm_option::{ACK_TIMEOUT as ID_ACK_TIMEOUT, AFONLY as ID_AFONLY};
    pub use vrdma_spec::cm::cm_option::{REUSEADDR as ID_REUSEADDR, TOS as ID_TOS};
}

/// `RDMA_MAX_PRIVATE_DATA`.
pub use vrdma_spec::cm::CM_MAX_PRIVATE_DATA as MAX_PRIVATE_DATA;
/// `sizeof(struct __kernel_sockaddr_storage)`.
pub const SOCKADDR_STORAGE: usize = 128;

abi_struct! {
    no_default:
    /// `struct rdma_ucm_cmd_hdr` (`in` and `out` are byte counts of the request and response).
    pub struct CmHdr {
        pub cmd: u32,
        pub in_len: u16,
        pub out_len: u16,
    }
}
abi_layout!(CmHdr, 8, cmd @ 0, in_len @ 4, out_len @ 6);

abi_struct! {
    no_default:
    /// `struct rdma_ucm_create_id`.
    pub struct CreateId {
        pub uid: u64,
        pub response: u64,
        pub ps: u16,
        pub qp_type: u8,
        pub reserved: [u8; 5],
    }
}
abi_layout!(CreateId, 24, uid @ 0, response @ 8, ps @ 16, qp_type @ 18, reserved @ 19);

abi_struct! {
    no_default:
    /// `struct rdma_ucm_create_id_resp`.
    pub struct CreateIdResp {
        pub id: u32,
    }
}
abi_layout!(CreateIdResp, 4, id @ 0);

abi_struct! {
    no_default:
    /// `struct rdma_ucm_destroy_id`.
    pub struct DestroyId {
        pub response: u64,
        pub id: u32,
        pub reserved: u32,
    }
}
abi_layout!(DestroyId, 16, response @ 0, id @ 8, reserved @ 12);

abi_struct! {
    no_default:
    /// `struct rdma_ucm_destroy_id_resp`.
    pub struct DestroyIdResp {
        pub events_reported: u32,
    }
}
abi_layout!(DestroyIdResp, 4, events_reported @ 0);

abi_struct! {
    no_default:
    /// `struct rdma_ucm_bind`.
    pub struct Bind {
        pub id: u32,
        pub addr_size: u16,
        pub reserved: u16,
        pub addr: [u8; SOCKADDR_STORAGE],
    }
}
abi_layout!(Bind, 136, id @ 0, addr_size @ 4, reserved @ 6, addr @ 8);

abi_struct! {
    no_default:
    /// `struct rdma_ucm_resolve_addr`.
    pub struct ResolveAddr {
        pub id: u32,
        pub timeout_ms: u32,
        pub src_size: u16,
        pub dst_size: u16,
        pub reserved: u32,
        pub src_addr: [u8; SOCKADDR_STORAGE],
        pub dst_addr: [u8; SOCKADDR_STORAGE],
    }
}
abi_layout!(ResolveAddr, 272, id @ 0, timeout_ms @ 4, src_size @ 8, dst_size @ 10,
    reserved @ 12, src_addr @ 16, dst_addr @ 144);

abi_struct! {
    no_default:
    /// `struct rdma_ucm_resolve_route`.
    pub struct ResolveRoute {
        pub id: u32,
        pub timeout_ms: u32,
    }
}
abi_layout!(ResolveRoute, 8, id @ 0, timeout_ms @ 4);

abi_struct! {
    no_default:
    /// `struct rdma_ucm_query`.
    pub struct Query {
        pub response: u64,
        pub id: u32,
        pub option: u32,
    }
}
abi_layout!(Query, 16, response @ 0, id @ 8, option @ 12);

abi_struct! {
    no_default:
    /// `struct rdma_ucm_query_addr_resp`.
    pub struct QueryAddrResp {
        pub node_guid: u64,
        pub port_num: u8,
        pub reserved: u8,
        pub pkey: u16,
        pub src_size: u16,
        pub dst_size: u16,
        pub src_addr: [u8; SOCKADDR_STORAGE],
        pub dst_addr: [u8; SOCKADDR_STORAGE],
        pub ibdev_index: u32,
        pub reserved1: u32,
    }
}
abi_layout!(QueryAddrResp, 280, node_guid @ 0, port_num @ 8, reserved @ 9, pkey @ 10,
    src_size @ 12, dst_size @ 14, src_addr @ 16, dst_addr @ 144, ibdev_index @ 272,
    reserved1 @ 276);

abi_struct! {
    no_default:
    /// `struct rdma_ucm_conn_param`.
    pub struct ConnParam {
        pub qp_num: u32,
        pub qkey: u32,
        pub private_data: [u8; MAX_PRIVATE_DATA],
        pub private_data_len: u8,
        pub srq: u8,
        pub responder_resources: u8,
        pub initiator_depth: u8,
        pub flow_control: u8,
        pub retry_count: u8,
        pub rnr_retry_count: u8,
        pub valid: u8,
    }
}
abi_layout!(ConnParam, 272, qp_num @ 0, qkey @ 4, private_data @ 8, private_data_len @ 264,
    srq @ 265, responder_resources @ 266, initiator_depth @ 267, flow_control @ 268,
    retry_count @ 269, rnr_retry_count @ 270, valid @ 271);

abi_struct! {
    no_default:
    /// `struct rdma_ucm_ud_param`.
    pub struct UdParam {
        pub qp_num: u32,
        pub qkey: u32,
        pub ah_attr: AhAttr,
        pub private_data: [u8; MAX_PRIVATE_DATA],
        pub private_data_len: u8,
        pub reserved: [u8; 7],
    }
}
abi_layout!(UdParam, 304, qp_num @ 0, qkey @ 4, ah_attr @ 8, private_data @ 40,
    private_data_len @ 296, reserved @ 297);

abi_struct! {
    no_default:
    /// `struct rdma_ucm_ece`.
    pub struct Ece {
        pub vendor_id: u32,
        pub attr_mod: u32,
    }
}
abi_layout!(Ece, 8, vendor_id @ 0, attr_mod @ 4);

abi_struct! {
    no_default:
    /// `struct rdma_ucm_connect`.
    pub struct Connect {
        pub conn_param: ConnParam,
        pub id: u32,
        pub reserved: u32,
        pub ece: Ece,
    }
}
abi_layout!(Connect, 288, conn_param @ 0, id @ 272, reserved @ 276, ece @ 280);

abi_struct! {
    no_default:
    /// `struct rdma_ucm_listen`.
    pub struct Listen {
        pub id: u32,
        pub backlog: u32,
    }
}
abi_layout!(Listen, 8, id @ 0, backlog @ 4);

abi_struct! {
    no_default:
    /// `struct rdma_ucm_accept` (`conn_param.valid == 0`: accept the peer's REP, i.e. send
    /// the RTU, as `rdma_establish` does).
    pub struct Accept {
        pub uid: u64,
        pub conn_param: ConnParam,
        pub id: u32,
        pub reserved: u32,
        pub ece: Ece,
    }
}
abi_layout!(Accept, 296, uid @ 0, conn_param @ 8, id @ 280, reserved @ 284, ece @ 288);

abi_struct! {
    no_default:
    /// `struct rdma_ucm_reject` (`reason` 0 is the consumer-defined reject).
    pub struct Reject {
        pub id: u32,
        pub private_data_len: u8,
        pub reason: u8,
        pub reserved: [u8; 2],
        pub private_data: [u8; MAX_PRIVATE_DATA],
    }
}
abi_layout!(Reject, 264, id @ 0, private_data_len @ 4, reason @ 5, reserved @ 6,
    private_data @ 8);

abi_struct! {
    no_default:
    /// `struct rdma_ucm_disconnect`.
    pub struct Disconnect {
        pub id: u32,
    }
}
abi_layout!(Disconnect, 4, id @ 0);

abi_struct! {
    no_default:
    /// `struct rdma_ucm_init_qp_attr`.
    pub struct InitQpAttr {
        pub response: u64,
        pub id: u32,
        pub qp_state: u32,
    }
}
abi_layout!(InitQpAttr, 16, response @ 0, id @ 8, qp_state @ 12);

/// INIT_QP_ATTR answers with uverbs' own `struct ib_uverbs_qp_attr`.
pub use crate::uverbs::QpAttrResp;

abi_struct! {
    no_default:
    /// `struct rdma_ucm_get_event`.
    pub struct GetEvent {
        pub response: u64,
    }
}
abi_layout!(GetEvent, 8, response @ 0);

abi_struct! {
    no_default:
    /// `struct rdma_ucm_event_resp`. `param` is the union of [`ConnParam`] (ids of a connected
    /// port space) and [`UdParam`] (UD ids), unaligned at offset 20 as in the kernel.
    pub struct EventResp {
        pub uid: u64,
        pub id: u32,
        pub event: u32,
        pub status: u32,
        pub param: [u8; 304],
        pub reserved: u32,
        pub ece: Ece,
    }
}
abi_layout!(EventResp, 336, uid @ 0, id @ 8, event @ 12, status @ 16, param @ 20,
    reserved @ 324, ece @ 328);

abi_struct! {
    no_default:
    /// `struct rdma_ucm_set_option` (`optval` points at `optlen` bytes the kernel reads).
    pub struct SetOption {
        pub optval: u64,
        pub id: u32,
        pub level: u32,
        pub optname: u32,
        pub optlen: u32,
    }
}
abi_layout!(SetOption, 24, optval @ 0, id @ 8, level @ 12, optname @ 16, optlen @ 20);

abi_struct! {
    no_default:
    /// `struct rdma_ucm_notify`.
    pub struct Notify {
        pub id: u32,
        pub event: u32,
    }
}
abi_layout!(Notify, 8, id @ 0, event @ 4);

//! The completion-queue commands: CREATE_CQ, RESIZE_CQ, REQ_NOTIFY_CQ, DESTROY_CQ.

use super::framing::{abi_layout, abi_struct, cmd, command, Command, CommandWithResponse};

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
    /// `struct ib_uverbs_resize_cq`.
    pub struct ResizeCq {
        pub response: u64,
        pub cq_handle: u32,
        pub cqe: u32,
    }
}
abi_layout!(ResizeCq, 16, response @ 0, cq_handle @ 8, cqe @ 12);

abi_struct! {
    /// `struct ib_uverbs_resize_cq_resp`.
    pub struct ResizeCqResp {
        pub cqe: u32,
        pub reserved: u32,
    }
}
abi_layout!(ResizeCqResp, 8, cqe @ 0, reserved @ 4);
command!(ResizeCq, cmd::RESIZE_CQ, "RESIZE_CQ", ResizeCqResp);

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

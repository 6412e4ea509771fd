//! The shared-receive-queue commands: CREATE_SRQ, MODIFY_SRQ, DESTROY_SRQ.

use super::framing::{abi_layout, abi_struct, cmd, command, Command, CommandWithResponse};

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

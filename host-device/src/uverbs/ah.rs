//! The address-handle commands (CREATE_AH, DESTROY_AH) and the address vector they carry.

use super::framing::{abi_layout, abi_struct, cmd, command, Command, CommandWithResponse};

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

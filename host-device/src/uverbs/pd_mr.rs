//! The protection-domain, memory-region and memory-window commands: ALLOC_PD, DEALLOC_PD,
//! REG_MR, DEREG_MR, ALLOC_MW, DEALLOC_MW.

use super::framing::{abi_layout, abi_struct, cmd, command, Command, CommandWithResponse};

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
    /// `struct ib_uverbs_alloc_mw` (rxe adds no driver data).
    pub struct AllocMw {
        pub response: u64,
        pub pd_handle: u32,
        /// `IB_MW_TYPE_1` or `IB_MW_TYPE_2`.
        pub mw_type: u8,
        pub reserved: [u8; 3],
    }
}
abi_layout!(AllocMw, 16, response @ 0, pd_handle @ 8, mw_type @ 12, reserved @ 13);

abi_struct! {
    /// `struct ib_uverbs_alloc_mw_resp`.
    pub struct AllocMwResp {
        pub mw_handle: u32,
        pub rkey: u32,
    }
}
abi_layout!(AllocMwResp, 8, mw_handle @ 0, rkey @ 4);
command!(AllocMw, cmd::ALLOC_MW, "ALLOC_MW", AllocMwResp);

abi_struct! {
    /// `struct ib_uverbs_dealloc_mw`.
    pub struct DeallocMw {
        pub mw_handle: u32,
    }
}
abi_layout!(DeallocMw, 4, mw_handle @ 0);
command!(DeallocMw, cmd::DEALLOC_MW, "DEALLOC_MW");

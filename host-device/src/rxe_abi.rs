//! rdma_rxe's user ABI (`include/uapi/rdma/rdma_user_rxe.h`), host side: the driver parts of
//! the create and modify commands this layer issues (x86-64).
//!
//! What lives inside the queue buffers (header, WQEs, SGEs) is not the host's business: the
//! backend only hands the buffers to the frontend, and the guest library's
//! `vrdma::provider::rxe_v1` reads and writes them.

use super::uverbs::{abi_layout, abi_struct};

abi_struct! {
    /// `struct mminfo`: where user space maps one rxe queue buffer (cmd fd offset, length).
    pub struct MmInfo {
        pub offset: u64,
        pub size: u32,
        pub pad: u32,
    }
}
abi_layout!(MmInfo, 16, offset @ 0, size @ 8, pad @ 12);

abi_struct! {
    /// `struct rxe_create_cq_resp`.
    pub struct RxeCreateCqResp {
        pub mi: MmInfo,
    }
}
abi_layout!(RxeCreateCqResp, 16, mi @ 0);

abi_struct! {
    /// `struct rxe_resize_cq_resp`: where user space maps the CQ's new buffer.
    pub struct RxeResizeCqResp {
        pub mi: MmInfo,
    }
}
abi_layout!(RxeResizeCqResp, 16, mi @ 0);

abi_struct! {
    /// `struct rxe_create_qp_resp`.
    pub struct RxeCreateQpResp {
        pub rq_mi: MmInfo,
        pub sq_mi: MmInfo,
    }
}
abi_layout!(RxeCreateQpResp, 32, rq_mi @ 0, sq_mi @ 16);

abi_struct! {
    /// `struct rxe_create_srq_resp`.
    pub struct RxeCreateSrqResp {
        pub mi: MmInfo,
        pub srq_num: u32,
        pub reserved: u32,
    }
}
abi_layout!(RxeCreateSrqResp, 24, mi @ 0, srq_num @ 16, reserved @ 20);

abi_struct! {
    /// `struct rxe_modify_srq_cmd`: the user address where a resize writes the new [`MmInfo`].
    pub struct RxeModifySrqCmd {
        pub mmap_info_addr: u64,
    }
}
abi_layout!(RxeModifySrqCmd, 8, mmap_info_addr @ 0);

abi_struct! {
    /// `struct rxe_create_ah_resp` (kernel 5.10+): the AH index a UD send WQE carries.
    pub struct RxeCreateAhResp {
        pub ah_num: u32,
        pub reserved: u32,
    }
}
abi_layout!(RxeCreateAhResp, 8, ah_num @ 0, reserved @ 4);

//! rdma_rxe's user ABI (`include/uapi/rdma/rdma_user_rxe.h`): the driver parts of the create
//! responses, and the layout of the queue buffers rxe shares with user space (x86-64).

use super::uverbs::abi_layout;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `struct mminfo`: where user space maps one rxe queue buffer (cmd fd offset, length).
#[repr(C)]
#[derive(
    Debug, Default, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct MmInfo {
    pub offset: u64,
    pub size: u32,
    pub pad: u32,
}
abi_layout!(MmInfo, 16, offset @ 0, size @ 8, pad @ 12);

/// `struct rxe_create_cq_resp`.
#[repr(C)]
#[derive(
    Debug, Default, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct RxeCreateCqResp {
    pub mi: MmInfo,
}
abi_layout!(RxeCreateCqResp, 16, mi @ 0);

/// `struct rxe_create_qp_resp`.
#[repr(C)]
#[derive(
    Debug, Default, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct RxeCreateQpResp {
    pub rq_mi: MmInfo,
    pub sq_mi: MmInfo,
}
abi_layout!(RxeCreateQpResp, 32, rq_mi @ 0, sq_mi @ 16);

/// `struct rxe_create_srq_resp`.
#[repr(C)]
#[derive(
    Debug, Default, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct RxeCreateSrqResp {
    pub mi: MmInfo,
    pub srq_num: u32,
    pub reserved: u32,
}
abi_layout!(RxeCreateSrqResp, 24, mi @ 0, srq_num @ 16, reserved @ 20);

/// `struct rxe_modify_srq_cmd`: the user address where a resize writes the new [`MmInfo`].
#[repr(C)]
#[derive(
    Debug, Default, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct RxeModifySrqCmd {
    pub mmap_info_addr: u64,
}
abi_layout!(RxeModifySrqCmd, 8, mmap_info_addr @ 0);

/// `struct rxe_create_ah_resp` (kernel 5.10+): the AH index a UD send WQE carries.
#[repr(C)]
#[derive(
    Debug, Default, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct RxeCreateAhResp {
    pub ah_num: u32,
    pub reserved: u32,
}
abi_layout!(RxeCreateAhResp, 8, ah_num @ 0, reserved @ 4);

/// `struct rxe_queue_buf` without its flexible `data`: the header of every rxe queue buffer.
/// Producer and consumer indices sit on separate cache lines; slots start at
/// [`QUEUE_DATA_OFFSET`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct RxeQueueBuf {
    pub log2_elem_size: u32,
    pub index_mask: u32,
    pub pad_1: [u32; 30],
    pub producer_index: u32,
    pub pad_2: [u32; 31],
    pub consumer_index: u32,
    pub pad_3: [u32; 31],
}
abi_layout!(RxeQueueBuf, 384, log2_elem_size @ 0, index_mask @ 4, producer_index @ 128,
    consumer_index @ 256);

/// Offset of the first slot in an rxe queue buffer (`offsetof(struct rxe_queue_buf, data)`).
pub const QUEUE_DATA_OFFSET: usize = size_of::<RxeQueueBuf>();

/// `struct rxe_sge` (same layout as `ibv_sge`).
#[repr(C)]
#[derive(
    Debug, Default, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct RxeSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}
abi_layout!(RxeSge, 16, addr @ 0, length @ 8, lkey @ 12);

/// `struct rxe_send_wr`. `wr` is the 120-byte union (`rdma`, `atomic`, `ud`, `mw`); use the
/// `WR_*` offsets below to fill the member an opcode needs.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct RxeSendWr {
    pub wr_id: u64,
    pub reserved: u32,
    pub opcode: u32,
    pub send_flags: u32,
    /// `imm_data` (big-endian) or `invalidate_rkey`.
    pub ex: u32,
    pub wr: [u64; 15],
}
abi_layout!(RxeSendWr, 144, wr_id @ 0, reserved @ 8, opcode @ 12, send_flags @ 16, ex @ 20,
    wr @ 24);

impl RxeSendWr {
    /// Fills `wr.rdma` (RDMA WRITE/READ): remote address and rkey.
    pub fn set_rdma(&mut self, remote_addr: u64, rkey: u32) {
        self.wr = [0; 15];
        self.wr[0] = remote_addr;
        self.wr[1] = u64::from(rkey);
    }

    /// Fills `wr.ud` (UD SEND): remote QPN, Q_Key and the AH's `ah_num`.
    pub fn set_ud(&mut self, remote_qpn: u32, remote_qkey: u32, ah_num: u32) {
        self.wr = [0; 15];
        self.wr[0] = u64::from(remote_qpn) | (u64::from(remote_qkey) << 32);
        // pkey_index (u16) and reserved (u16) stay zero; ah_num follows them.
        self.wr[1] = u64::from(ah_num) << 32;
    }
}

/// `struct rxe_dma_info` without its flexible SGE/inline array.
#[repr(C)]
#[derive(
    Debug, Default, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct RxeDmaInfo {
    pub length: u32,
    pub resid: u32,
    pub cur_sge: u32,
    pub num_sge: u32,
    pub sge_offset: u32,
    pub reserved: u32,
}
abi_layout!(RxeDmaInfo, 24, length @ 0, resid @ 4, cur_sge @ 8, num_sge @ 12,
    sge_offset @ 16, reserved @ 20);

/// `struct rxe_send_wqe` without the SGEs / inline data that follow `dma` in the slot.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct RxeSendWqe {
    pub wr: RxeSendWr,
    pub status: u32,
    pub state: u32,
    pub iova: u64,
    pub mask: u32,
    pub first_psn: u32,
    pub last_psn: u32,
    pub ack_length: u32,
    pub ssn: u32,
    pub has_rd_atomic: u32,
    pub dma: RxeDmaInfo,
}
abi_layout!(RxeSendWqe, 208, wr @ 0, status @ 144, state @ 148, iova @ 152, mask @ 160,
    first_psn @ 164, last_psn @ 168, ack_length @ 172, ssn @ 176, has_rd_atomic @ 180,
    dma @ 184);

/// `struct rxe_recv_wqe` without the SGEs that follow `dma` in the slot.
#[repr(C)]
#[derive(
    Debug, Default, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct RxeRecvWqe {
    pub wr_id: u64,
    pub reserved: u32,
    pub padding: u32,
    pub dma: RxeDmaInfo,
}
abi_layout!(RxeRecvWqe, 40, wr_id @ 0, reserved @ 8, padding @ 12, dma @ 16);

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromZeros;

    #[test]
    fn rdma_member_lands_at_the_union_start() {
        let mut wr = RxeSendWr::new_zeroed();
        wr.set_rdma(0x1000_2000, 0xabcd);
        let bytes = wr.as_bytes();
        assert_eq!(&bytes[24..32], &0x1000_2000u64.to_le_bytes());
        assert_eq!(&bytes[32..36], &0xabcdu32.to_le_bytes());
    }

    #[test]
    fn ud_member_puts_ah_num_after_pkey_index() {
        let mut wr = RxeSendWr::new_zeroed();
        wr.set_ud(0x12, 0x1111_1111, 5);
        let bytes = wr.as_bytes();
        // struct { u32 remote_qpn; u32 remote_qkey; u16 pkey_index; u16 reserved; u32 ah_num; }
        assert_eq!(&bytes[24..28], &0x12u32.to_le_bytes());
        assert_eq!(&bytes[28..32], &0x1111_1111u32.to_le_bytes());
        assert_eq!(&bytes[32..36], &[0, 0, 0, 0]);
        assert_eq!(&bytes[36..40], &5u32.to_le_bytes());
    }
}

//! Work-queue entries: the send WQE (`struct rxe_send_wqe`) and the receive WQE
//! (`struct rxe_recv_wqe`), each a fixed part followed in its slot by SGEs or inline data.
//!
//! The fixed parts end where their flexible arrays begin, so the payload of a WQE starts at
//! `size_of` of its fixed part.

use core::mem::size_of;

use zerocopy::{FromBytes, Immutable, IntoBytes};

use super::av::RxeAv;
use crate::{Le16, Le32, Le64};

/// `state` of a freshly posted send WQE (the kernel's `wqe_state_posted`).
pub const WQE_STATE_POSTED: u32 = 0;

wire_struct! {
    /// `struct rxe_sge` / `ibv_sge`, 16 bytes.
    pub struct RxeSge {
        /// Address in the MR's iova space.
        pub addr: Le64,
        /// Length in bytes.
        pub length: Le32,
        /// MR local key.
        pub lkey: Le32,
    }
}
assert_layout!(RxeSge, 16, addr @ 0, length @ 8, lkey @ 12);

/// Size of one SGE.
pub const SGE_SIZE: usize = size_of::<RxeSge>();

wire_struct! {
    /// `struct rxe_dma_info` without its flexible SGE / inline-data array, 24 bytes.
    pub struct RxeDmaInfo {
        /// Total payload bytes.
        pub length: Le32,
        /// Bytes left to transfer (posted as `length`).
        pub resid: Le32,
        /// Current SGE (posted as 0).
        pub cur_sge: Le32,
        /// Number of SGEs.
        pub num_sge: Le32,
        /// Offset in the current SGE (posted as 0).
        pub sge_offset: Le32,
        /// Zero.
        pub reserved: Le32,
    }
}
assert_layout!(RxeDmaInfo, 24, length @ 0, resid @ 4, cur_sge @ 8, num_sge @ 12,
    sge_offset @ 16, reserved @ 20);

wire_struct! {
    /// `rxe_send_wr.wr.rdma`.
    pub struct RxeRdmaWr {
        /// Remote address.
        pub remote_addr: Le64,
        /// Remote key.
        pub rkey: Le32,
        /// Zero.
        pub reserved: Le32,
    }
}
assert_layout!(RxeRdmaWr, 16, remote_addr @ 0, rkey @ 8, reserved @ 12);

wire_struct! {
    /// `rxe_send_wr.wr.flush` (RDMA FLUSH; the range's length is `dma.length`, as rdma-core's
    /// rxe provider writes it, `length` here staying 0).
    pub struct RxeFlushWr {
        /// Remote address of the range.
        pub remote_addr: Le64,
        /// Zero.
        pub length: Le32,
        /// Remote key.
        pub rkey: Le32,
        /// `IBV_FLUSH_GLOBAL` 1 or `IBV_FLUSH_PERSISTENT` 2.
        pub flush_type: u8,
        /// `IBV_FLUSH_RANGE` 0 or `IBV_FLUSH_MR` 1.
        pub level: u8,
        /// Zero.
        pub reserved: [u8; 6],
    }
}
assert_layout!(
    RxeFlushWr,
    24,
    remote_addr @ 0,
    length @ 8,
    rkey @ 12,
    flush_type @ 16,
    level @ 17,
    reserved @ 18
);

wire_struct! {
    /// `rxe_send_wr.wr.atomic`.
    pub struct RxeAtomicWr {
        /// Remote address.
        pub remote_addr: Le64,
        /// Compare (CAS) or add (FAA) operand.
        pub compare_add: Le64,
        /// Swap operand.
        pub swap: Le64,
        /// Remote key.
        pub rkey: Le32,
        /// Zero.
        pub reserved: Le32,
    }
}
assert_layout!(RxeAtomicWr, 32, remote_addr @ 0, compare_add @ 8, swap @ 16, rkey @ 24,
    reserved @ 28);

wire_struct! {
    /// `rxe_send_wr.wr.ud`; fills the whole 120-byte union.
    pub struct RxeUdWr {
        /// Destination QPN.
        pub remote_qpn: Le32,
        /// Destination Q_Key.
        pub remote_qkey: Le32,
        /// P_Key index.
        pub pkey_index: Le16,
        /// Zero.
        pub reserved: Le16,
        /// AH index from CREATE_AH (0: use `av`).
        pub ah_num: Le32,
        /// Zero.
        pub pad: [u8; 16],
        /// Inline address vector, only used by kernels that return `ah_num` 0 (zero when
        /// `ah_num` is set).
        pub av: RxeAv,
    }
}
assert_layout!(RxeUdWr, 120, remote_qpn @ 0, remote_qkey @ 4, pkey_index @ 8, reserved @ 10,
    ah_num @ 12, pad @ 16, av @ 32);

wire_struct! {
    /// `rxe_send_wr.wr.mw`: a memory-window bind (BIND_MW work requests, and type-1 binds).
    pub struct RxeMwWr {
        /// Start of the window in the MR's iova space (or offset for zero-based windows).
        pub addr: Le64,
        /// Length of the window; 0 unbinds a type-1 window.
        pub length: Le64,
        /// Local key of the MR the window is bound to.
        pub mr_lkey: Le32,
        /// The window's current rkey (which window to bind).
        pub mw_rkey: Le32,
        /// The rkey after the bind: the window's index bits with the new low 8 key bits.
        pub rkey: Le32,
        /// The window's access (`ibv_access_flags`).
        pub access: Le32,
    }
}
assert_layout!(RxeMwWr, 32, addr @ 0, length @ 8, mr_lkey @ 16, mw_rkey @ 20, rkey @ 24,
    access @ 28);

/// Size of the `wr` union of `struct rxe_send_wr`.
const WR_UNION_SIZE: usize = 120;

wire_struct! {
    /// The `wr` union of `struct rxe_send_wr`, 120 bytes: one of [`RxeRdmaWr`],
    /// [`RxeAtomicWr`], [`RxeUdWr`] or [`RxeMwWr`] at its start, which one depending on the
    /// opcode.
    pub struct RxeSendWrUnion {
        /// The union's bytes.
        pub bytes: [u8; WR_UNION_SIZE],
    }
}
assert_layout!(RxeSendWrUnion, WR_UNION_SIZE, bytes @ 0);

impl RxeSendWrUnion {
    /// All bytes zero, as rdma-core clears the request before filling it.
    pub const ZERO: Self = RxeSendWrUnion {
        bytes: [0; WR_UNION_SIZE],
    };

    /// The union holding `rdma`, its other bytes zero.
    pub fn from_rdma(rdma: RxeRdmaWr) -> Self {
        Self::holding(&rdma)
    }

    /// The union holding `atomic`, its other bytes zero.
    pub fn from_atomic(atomic: RxeAtomicWr) -> Self {
        Self::holding(&atomic)
    }

    /// The union holding `ud`.
    pub fn from_ud(ud: RxeUdWr) -> Self {
        Self::holding(&ud)
    }

    /// The union holding `mw`, its other bytes zero.
    pub fn from_mw(mw: RxeMwWr) -> Self {
        Self::holding(&mw)
    }

    /// The union holding `flush`, its other bytes zero.
    pub fn from_flush(flush: RxeFlushWr) -> Self {
        Self::holding(&flush)
    }

    /// The union read as its `flush` member.
    pub fn flush(&self) -> RxeFlushWr {
        self.member()
    }

    /// The union read as its `rdma` member.
    pub fn rdma(&self) -> RxeRdmaWr {
        self.member()
    }

    /// The union read as its `atomic` member.
    pub fn atomic(&self) -> RxeAtomicWr {
        self.member()
    }

    /// The union read as its `ud` member.
    pub fn ud(&self) -> RxeUdWr {
        self.member()
    }

    /// The union read as its `mw` member.
    pub fn mw(&self) -> RxeMwWr {
        self.member()
    }

    fn holding<T: IntoBytes + Immutable>(member: &T) -> Self {
        const { assert!(size_of::<T>() <= WR_UNION_SIZE) };
        let mut union = Self::ZERO;
        union.bytes[..size_of::<T>()].copy_from_slice(member.as_bytes());
        union
    }

    fn member<T: FromBytes + IntoBytes>(&self) -> T {
        const { assert!(size_of::<T>() <= WR_UNION_SIZE) };
        let mut member = T::new_zeroed();
        member
            .as_mut_bytes()
            .copy_from_slice(&self.bytes[..size_of::<T>()]);
        member
    }
}

wire_struct! {
    /// `struct rxe_send_wr`, 144 bytes: the request part of a send WQE.
    pub struct RxeSendWr {
        /// Returned in the completion.
        pub wr_id: Le64,
        /// Zero (was `num_sge` before kernel 5.10; the kernel now uses `dma.num_sge`).
        pub reserved: Le32,
        /// `ibv_wr_opcode` ([`crate::verbs::WrOpcode`]).
        pub opcode: Le32,
        /// `ibv_send_flags` ([`crate::verbs::send_flags`]).
        pub send_flags: Le32,
        /// `ex.imm_data` (network byte order) or `ex.invalidate_rkey`, as raw bytes.
        pub ex: [u8; 4],
        /// Opcode-specific part.
        pub wr: RxeSendWrUnion,
    }
}
assert_layout!(RxeSendWr, 144, wr_id @ 0, reserved @ 8, opcode @ 12, send_flags @ 16,
    ex @ 20, wr @ 24);

wire_struct! {
    /// `struct rxe_send_wqe` without its flexible array, 208 bytes. The driver writes `wr`,
    /// `state`, `iova` and `dma`; the other fields belong to the host kernel once the WQE is
    /// posted.
    pub struct RxeSendWqe {
        /// The request.
        pub wr: RxeSendWr,
        /// Host-owned.
        pub status: Le32,
        /// Posted as [`WQE_STATE_POSTED`], then host-owned.
        pub state: Le32,
        /// Remote address of RDMA and atomic operations, else 0.
        pub iova: Le64,
        /// Host-owned.
        pub mask: Le32,
        /// Host-owned.
        pub first_psn: Le32,
        /// Host-owned.
        pub last_psn: Le32,
        /// Host-owned.
        pub ack_length: Le32,
        /// Host-owned.
        pub ssn: Le32,
        /// Host-owned.
        pub has_rd_atomic: Le32,
        /// Payload description; SGEs or inline bytes follow.
        pub dma: RxeDmaInfo,
    }
}
assert_layout!(RxeSendWqe, 208, wr @ 0, status @ 144, state @ 148, iova @ 152, mask @ 160,
    first_psn @ 164, last_psn @ 168, ack_length @ 172, ssn @ 176, has_rd_atomic @ 180,
    dma @ 184);

wire_struct! {
    /// `struct rxe_recv_wqe` without its flexible SGE array, 40 bytes.
    pub struct RxeRecvWqe {
        /// Returned in the completion.
        pub wr_id: Le64,
        /// Zero.
        pub reserved: Le32,
        /// Zero.
        pub padding: Le32,
        /// Buffer description; SGEs follow.
        pub dma: RxeDmaInfo,
    }
}
assert_layout!(RxeRecvWqe, 40, wr_id @ 0, reserved @ 8, padding @ 12, dma @ 16);

/// Bytes a send slot needs for `max_sge` SGEs or `max_inline` inline bytes (before the
/// host rounds it up to a power of two of at least one cache line).
pub const fn send_wqe_size(max_sge: u32, max_inline: u32) -> usize {
    let sge = max_sge as usize * SGE_SIZE;
    let inl = max_inline as usize;
    size_of::<RxeSendWqe>() + if sge > inl { sge } else { inl }
}

/// Bytes a receive slot needs for `max_sge` SGEs (before rounding).
pub const fn recv_wqe_size(max_sge: u32) -> usize {
    size_of::<RxeRecvWqe>() + max_sge as usize * SGE_SIZE
}

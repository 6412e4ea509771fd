//! Data-path providers: one per native ring format a vrdma device can report.
//!
//! A provider writes work requests in the host device's own format into queue buffers the device
//! mapped into this process, and reads the device's own completions back, like an rdma-core
//! provider does for its NIC. It knows nothing about transports: after a successful
//! `post_send` the caller rings the doorbell the transport offers.
//!
//! This module holds the format-independent work-request and completion types; the enums they
//! carry (QP types, opcodes, completion statuses) are those of `vrdma_spec::verbs`. Their numeric
//! values are those of rdma-core's `<infiniband/verbs.h>` (`ibv_*`), which are also the kernel
//! uverbs values, so they pass unchanged into native queue entries.

pub mod rxe_v1;

use rxe_v1::RxeAddressHandle;
use vrdma_spec::verbs::{AccessFlags, QpType, WcOpcode, WcStatus, WrOpcode};
/// The flag sets of work requests and completions (defined in `vrdma_spec::verbs`).
pub use vrdma_spec::verbs::{SendFlags, WcFlags};

/// A scatter/gather element (`ibv_sge`).
///
/// `addr` is an address in the iova space of the memory region named by `lkey`. vrdma
/// registers guest memory with iova = the application's own virtual address, so `addr` is
/// simply a pointer into the application's buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct Sge {
    /// Start address (iova of the MR, i.e. the application's virtual address).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the memory region.
    pub lkey: u32,
}

/// Destination of a UD send.
#[derive(Clone, Copy, Debug)]
pub struct UdDest<'a> {
    /// Address handle created on the device.
    pub ah: &'a RxeAddressHandle,
    /// Destination QP number.
    pub remote_qpn: u32,
    /// Destination Q_Key.
    pub remote_qkey: u32,
}

/// A memory-window bind: what a BIND_MW work request (`ibv_send_wr.bind_mw`) or a type-1
/// `ibv_bind_mw` asks of the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MwBind {
    /// The window's current rkey (names the window).
    pub mw_rkey: u32,
    /// The window's rkey after the bind: same index bits, new low 8 bits ([`inc_rkey`]).
    pub rkey: u32,
    /// Local key of the MR the window opens onto.
    pub mr_lkey: u32,
    /// First byte of the window, in the MR's iova space.
    pub addr: u64,
    /// Length of the window; 0 unbinds a type-1 window.
    pub length: u64,
    /// What remote peers may do through the window (within
    /// [`AccessFlags::MW_ALLOWED`]).
    pub access: AccessFlags,
}

/// The next rkey of a memory window (`ibv_inc_rkey`): the low 8 bits, the consumer-owned key,
/// advance and wrap; the index bits stay.
pub const fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// A send work request (`ibv_send_wr` without the list link: requests are posted as a slice).
///
/// Fields an opcode does not use are ignored, as in `ibv_send_wr`'s union.
#[derive(Clone, Copy, Debug, Default)]
pub struct SendWr<'a> {
    /// Returned unchanged in the completion.
    pub wr_id: u64,
    /// Operation.
    pub opcode: WrOpcode,
    /// Send flags.
    pub flags: SendFlags,
    /// Local buffers. With [`SendFlags::INLINE`] their bytes are copied into the work request
    /// (and their `lkey`s are ignored); otherwise the device reads or writes them later.
    pub sg_list: &'a [Sge],
    /// Immediate data for `*_WITH_IMM`, in network byte order like `ibv_send_wr.imm_data`
    /// (build it with `u32::to_be`): it is written unchanged.
    pub imm_data: u32,
    /// Remote address for RDMA and atomic operations.
    pub remote_addr: u64,
    /// Remote key for RDMA and atomic operations.
    pub rkey: u32,
    /// Compare operand (compare and swap), addend (fetch and add), or the 8 bytes ATOMIC_WRITE
    /// writes (`u64::from_ne_bytes` of them: they are stored in memory order).
    pub compare_add: u64,
    /// Swap operand (compare and swap).
    pub swap: u64,
    /// Destination; required on UD queue pairs, refused on connected ones.
    pub ud: Option<UdDest<'a>>,
    /// The rkey LOCAL_INV invalidates here, or SEND_WITH_INV at the responder.
    pub invalidate_rkey: u32,
    /// The bind of a BIND_MW request (required by it, ignored by other opcodes).
    pub bind: Option<MwBind>,
    /// The range of a FLUSH request (ignored by other opcodes).
    pub flush: FlushRange,
}

/// What an RDMA FLUSH request makes durable at `remote_addr` under `rkey` (`ibv_wr_flush`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlushRange {
    /// Bytes from the remote address (`IBV_FLUSH_RANGE`; the responder ignores it for
    /// `IBV_FLUSH_MR`).
    pub length: u64,
    /// `IBV_FLUSH_GLOBAL` 1 or `IBV_FLUSH_PERSISTENT` 2.
    pub flush_type: u8,
    /// `IBV_FLUSH_RANGE` 0 or `IBV_FLUSH_MR` 1.
    pub level: u8,
}

impl<'a> SendWr<'a> {
    /// The length the WQE's `dma` gives a request whose opcode fixes it rather than its
    /// payload: a FLUSH's range, the operand of ATOMIC_WRITE. `None` for the others (their
    /// SGEs or inline bytes decide).
    pub fn fixed_length(&self) -> Option<u64> {
        match self.opcode {
            WrOpcode::Flush => Some(self.flush.length),
            opcode if opcode.wqe_operand_len() != 0 => Some(opcode.wqe_operand_len() as u64),
            _ => None,
        }
    }

    /// A LOCAL_INV request: invalidates the type-2 window (or fast-registered MR) `rkey`.
    pub fn local_inv(wr_id: u64, rkey: u32, flags: SendFlags) -> Self {
        SendWr {
            wr_id,
            opcode: WrOpcode::LocalInv,
            flags,
            invalidate_rkey: rkey,
            ..SendWr::default()
        }
    }

    /// A SEND_WITH_INV request: sends `sg_list` and invalidates `rkey` at the responder.
    pub fn send_with_inv(wr_id: u64, sg_list: &'a [Sge], rkey: u32, flags: SendFlags) -> Self {
        SendWr {
            wr_id,
            opcode: WrOpcode::SendWithInv,
            flags,
            sg_list,
            invalidate_rkey: rkey,
            ..SendWr::default()
        }
    }

    /// A BIND_MW request (type-2 windows; type-1 binds go through `Qp::bind_mw`).
    pub fn bind_mw(wr_id: u64, bind: MwBind, flags: SendFlags) -> Self {
        SendWr {
            wr_id,
            opcode: WrOpcode::BindMw,
            flags,
            bind: Some(bind),
            ..SendWr::default()
        }
    }
}

/// A receive work request (`ibv_recv_wr` without the list link).
#[derive(Clone, Copy, Debug, Default)]
pub struct RecvWr<'a> {
    /// Returned unchanged in the completion.
    pub wr_id: u64,
    /// Buffers incoming data is scattered into.
    pub sg_list: &'a [Sge],
}

/// A work completion (`ibv_wc`).
///
/// For an error status only `wr_id`, `status`, `qp_num` and `vendor_err` are meaningful.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkCompletion {
    /// `wr_id` of the completed work request.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Operation that completed.
    pub opcode: WcOpcode,
    /// Bytes transferred (receives and RDMA reads).
    pub byte_len: u32,
    /// Immediate data in network byte order, as in `ibv_wc.imm_data` (valid with
    /// [`WcFlags::WITH_IMM`]; `u32::from_be` gives the sender's value).
    pub imm_data: u32,
    /// Local QP number (the host device's QPN).
    pub qp_num: u32,
    /// Source QP number (UD receives).
    pub src_qp: u32,
    /// Flags.
    pub wc_flags: WcFlags,
    /// P_Key index (UD receives).
    pub pkey_index: u16,
    /// Source LID (InfiniBand only).
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Destination LID path bits (InfiniBand only).
    pub dlid_path_bits: u8,
    /// Port number.
    pub port_num: u8,
    /// Device-specific error detail.
    pub vendor_err: u32,
}

/// Why a work request was not posted. Requests before it in the same call were posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// Every slot holds a request the device has not consumed yet.
    #[error("queue full")]
    QueueFull,
    /// More scatter/gather elements than the queue was created for.
    #[error("{num} SGEs, the queue takes at most {max}")]
    TooManySges {
        /// SGEs in the request.
        num: usize,
        /// The queue's limit.
        max: u32,
    },
    /// The SGE lengths add up to more than a message can carry.
    #[error("message of {0} bytes is too long")]
    MessageTooLong(u64),
    /// More inline bytes than the queue was created for.
    #[error("{len} inline bytes, the queue takes at most {max}")]
    InlineTooLong {
        /// Inline bytes in the request.
        len: u64,
        /// The queue's limit.
        max: u32,
    },
    /// Inline data was requested for an operation that does not send local data.
    #[error("{0:?} cannot carry inline data")]
    InlineNotAllowed(WrOpcode),
    /// The operation does not exist on this QP type.
    #[error("{opcode:?} is not supported on a {qp_type:?} QP")]
    OpcodeNotSupported {
        /// Requested operation.
        opcode: WrOpcode,
        /// The queue's QP type.
        qp_type: QpType,
    },
    /// A UD send without a destination.
    #[error("UD send without destination")]
    MissingUdDest,
    /// A destination on a connected QP.
    #[error("destination given on a connected QP")]
    UnexpectedUdDest,
    /// An atomic needs an 8-byte local buffer and an 8-byte aligned remote address.
    #[error("atomic operation needs 8 local bytes and an 8-byte aligned remote address")]
    InvalidAtomic,
    /// A BIND_MW request without its bind, or a bind with access a window cannot have.
    #[error("memory-window bind without a bind or with invalid access")]
    InvalidBind,
    /// LOCAL_INV and BIND_MW move no data: they take no SGEs.
    #[error("{0:?} takes no scatter/gather elements")]
    UnexpectedSges(WrOpcode),
    /// A batch setter (`ibv_wr_set_*`) was called before any work request of the batch was
    /// started.
    #[error("no work request started in the batch")]
    NoRequest,
    /// An operation or flag this library does not provide (named).
    #[error("{0} is not supported")]
    Unsupported(&'static str),
    /// The requests were posted to a staging ring (spec §9.7) but the device could not be
    /// notified: the transport is gone.
    #[error("doorbell notification failed")]
    Doorbell,
    /// The queue has no buffer: a resize failed after the device had replaced it.
    #[error("the queue lost its buffer in a failed resize")]
    QueueLost,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_flags_accept_only_ibverbs_bits() {
        let all = SendFlags::FENCE | SendFlags::SIGNALED | SendFlags::SOLICITED | SendFlags::INLINE;
        assert_eq!(all.bits(), 0xf);
        assert_eq!(SendFlags::from_bits(0xf), Some(all));
        // IBV_SEND_IP_CSUM (16) means nothing to Soft-RoCE.
        assert_eq!(SendFlags::from_bits(1 << 4), None);
        assert!(all.contains(SendFlags::SIGNALED | SendFlags::INLINE));
        assert!(!SendFlags::empty().contains(SendFlags::SIGNALED));
    }

    #[test]
    fn inc_rkey_advances_only_the_key_byte() {
        assert_eq!(inc_rkey(0x1234_5600), 0x1234_5601);
        assert_eq!(inc_rkey(0x1234_56ff), 0x1234_5600);
        assert_eq!(inc_rkey(u32::MAX), 0xffff_ff00);
    }
}

//! Ring format "rxe v1": the native queue layout of Linux Soft-RoCE (`rdma_rxe`) on
//! little-endian 64-bit hosts, as defined by `include/uapi/rdma/rdma_user_rxe.h` and
//! `ib_user_verbs.h` (kernel 5.16 and later: `ah_num` in UD send WQEs).
//!
//! The driver writes these structures into queue buffers the device mapped into the
//! queue region, and reads CQEs from them. Offsets are byte offsets from the start of
//! the queue buffer (header) or of one slot (WQE/CQE).

use crate::wire::{wire_struct, RingDesc};
use crate::{Le16, Le32, Le64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Ring-format identifier of rxe v1 (config `ring_format`, `RingDesc::format`).
pub const FORMAT_ID: u32 = crate::config::ring_format::RXE_V1;

/// Queue-buffer header (`struct rxe_queue_buf`) offsets.
pub mod header {
    /// `log2_elem_size`: log2 of the slot size (le32, written once by the host).
    pub const LOG2_ELEM_SIZE: usize = 0;
    /// `index_mask`: `num_slots - 1` (le32, written once by the host).
    pub const INDEX_MASK: usize = 4;
    /// `producer_index` (le32), alone in its cache line.
    pub const PRODUCER_INDEX: usize = 128;
    /// `consumer_index` (le32), alone in its cache line.
    pub const CONSUMER_INDEX: usize = 256;
    /// First slot.
    pub const DATA: usize = 384;
    /// Header size.
    pub const SIZE: usize = DATA;
}

/// Smallest slot the host uses (one cache line), as log2.
pub const MIN_LOG2_SLOT_SIZE: u32 = 6;
/// Largest slot this crate accepts from a device (64 KiB), as log2.
pub const MAX_LOG2_SLOT_SIZE: u32 = 16;

/// Byte offset of slot `index` (masked) in a queue buffer.
pub const fn slot_offset(index: u32, index_mask: u32, log2_slot_size: u32) -> usize {
    header::DATA + (((index & index_mask) as usize) << log2_slot_size)
}

/// Number of slots the host allocates for a requested depth: `roundup_pow_of_two(wr + 1)`.
/// `None` if that does not fit in 32 bits.
pub const fn num_slots_for(max_wr: u32) -> Option<u32> {
    match max_wr.checked_add(1) {
        Some(n) => n.checked_next_power_of_two(),
        None => None,
    }
}

/// Why a ring description or mapped header does not hold together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GeometryError {
    /// The descriptor names another ring format.
    #[error("ring format {0} is not rxe v1")]
    Format(u32),
    /// `num_slots` is not a power of two >= 2.
    #[error("num_slots {0} is not a power of two >= 2")]
    NumSlots(u32),
    /// `log2_slot_size` is outside the accepted range.
    #[error("log2_slot_size {0} out of range")]
    SlotSize(u32),
    /// Header plus slots exceed `map_len`, or the mapping leaves the region.
    #[error("ring does not fit its mapping or the region")]
    Bounds,
    /// `shm_offset`/`map_len` are not multiples of the region page size.
    #[error("mapping not page aligned")]
    Alignment,
    /// rxe v1 has no doorbell page, but one was described.
    #[error("unexpected doorbell page")]
    DoorbellPage,
    /// The mapped header disagrees with the descriptor.
    #[error("mapped header (log2 {log2}, mask {mask:#x}) disagrees with the descriptor")]
    HeaderMismatch {
        /// `log2_elem_size` read from the header.
        log2: u32,
        /// `index_mask` read from the header.
        mask: u32,
    },
}

impl RingDesc {
    /// Checks a ring description from a create response against the queue region
    /// (`region_size`, `page_size`) before the driver touches the mapping.
    pub fn check_rxe_v1(&self, region_size: u64, page_size: u64) -> Result<(), GeometryError> {
        let format = self.format.get();
        if format != FORMAT_ID {
            return Err(GeometryError::Format(format));
        }
        let n = self.num_slots.get();
        if n < 2 || !n.is_power_of_two() {
            return Err(GeometryError::NumSlots(n));
        }
        let log2 = self.log2_slot_size.get();
        if !(MIN_LOG2_SLOT_SIZE..=MAX_LOG2_SLOT_SIZE).contains(&log2) {
            return Err(GeometryError::SlotSize(log2));
        }
        if self.db_len.get() != 0 || self.db_offset.get() != 0 {
            return Err(GeometryError::DoorbellPage);
        }
        let off = self.shm_offset.get();
        let len = u64::from(self.map_len.get());
        if page_size == 0
            || !page_size.is_power_of_two()
            || off & (page_size - 1) != 0
            || len & (page_size - 1) != 0
        {
            return Err(GeometryError::Alignment);
        }
        let need = (header::SIZE as u64) + (u64::from(n) << log2);
        match off.checked_add(len) {
            Some(end) if end <= region_size && need <= len => Ok(()),
            _ => Err(GeometryError::Bounds),
        }
    }

    /// Cross-checks the two header words read from the mapped buffer with this
    /// description (the driver must not trust either alone).
    pub fn check_header(&self, log2_elem_size: u32, index_mask: u32) -> Result<(), GeometryError> {
        if log2_elem_size != self.log2_slot_size.get()
            || index_mask.wrapping_add(1) != self.num_slots.get()
        {
            return Err(GeometryError::HeaderMismatch {
                log2: log2_elem_size,
                mask: index_mask,
            });
        }
        Ok(())
    }
}

wire_struct! {
    /// `struct rxe_sge` / `ibv_sge`, 16 bytes.
    pub struct Sge {
        /// Address in the MR's iova space.
        pub addr: Le64,
        /// Length in bytes.
        pub length: Le32,
        /// MR local key.
        pub lkey: Le32,
    }
}
assert_layout!(Sge, 16, addr @ 0, length @ 8, lkey @ 12);
/// Size of one SGE.
pub const SGE_SIZE: usize = 16;

wire_struct! {
    /// `struct rxe_dma_info` without its flexible array, 24 bytes.
    pub struct DmaInfo {
        /// Total payload bytes.
        pub length: Le32,
        /// Bytes left (driver writes `length`).
        pub resid: Le32,
        /// Current SGE (driver writes 0).
        pub cur_sge: Le32,
        /// Number of SGEs.
        pub num_sge: Le32,
        /// Offset in the current SGE (driver writes 0).
        pub sge_offset: Le32,
        /// Zero.
        pub reserved: Le32,
    }
}
assert_layout!(DmaInfo, 24, length @ 0, resid @ 4, cur_sge @ 8, num_sge @ 12,
    sge_offset @ 16, reserved @ 20);

wire_struct! {
    /// `struct rxe_av`, 88 bytes (x86-64 layout, including the compiler's padding byte
    /// after `grh.traffic_class`).
    pub struct RxeAv {
        /// Port number.
        pub port_num: u8,
        /// 1 = IPv4, 2 = IPv6.
        pub network_type: u8,
        /// Destination MAC.
        pub dmac: [u8; 6],
        /// `grh.dgid`.
        pub dgid: [u8; 16],
        /// `grh.flow_label`.
        pub flow_label: Le32,
        /// `grh.sgid_index`.
        pub sgid_index: u8,
        /// `grh.hop_limit`.
        pub hop_limit: u8,
        /// `grh.traffic_class`.
        pub traffic_class: u8,
        /// Padding of `struct rxe_global_route`.
        pub pad: u8,
        /// Source address (`sockaddr_in` or `sockaddr_in6`).
        pub sgid_addr: [u8; 28],
        /// Destination address (`sockaddr_in` or `sockaddr_in6`).
        pub dgid_addr: [u8; 28],
    }
}
assert_layout!(RxeAv, 88, port_num @ 0, network_type @ 1, dmac @ 2, dgid @ 8,
    flow_label @ 24, sgid_index @ 28, hop_limit @ 29, traffic_class @ 30, pad @ 31,
    sgid_addr @ 32, dgid_addr @ 60);

/// Offsets inside one send-queue slot (`struct rxe_send_wqe`).
pub mod send_wqe {
    /// `wr.wr_id` (le64).
    pub const WR_ID: usize = 0;
    /// `wr.reserved` (le32, write 0; was `num_sge` in older kernels).
    pub const WR_RESERVED: usize = 8;
    /// `wr.opcode` (le32, [`crate::verbs::WrOpcode`]).
    pub const OPCODE: usize = 12;
    /// `wr.send_flags` (le32, [`crate::verbs::send_flags`]).
    pub const SEND_FLAGS: usize = 16;
    /// `wr.ex`: `imm_data` (big-endian on the wire) or `invalidate_rkey` (le32).
    pub const EX: usize = 20;
    /// `wr.wr` union (120 bytes).
    pub const WR_UNION: usize = 24;
    /// RDMA: `remote_addr` (le64).
    pub const RDMA_REMOTE_ADDR: usize = 24;
    /// RDMA: `rkey` (le32).
    pub const RDMA_RKEY: usize = 32;
    /// Atomic: `remote_addr` (le64).
    pub const ATOMIC_REMOTE_ADDR: usize = 24;
    /// Atomic: `compare_add` (le64).
    pub const ATOMIC_COMPARE_ADD: usize = 32;
    /// Atomic: `swap` (le64).
    pub const ATOMIC_SWAP: usize = 40;
    /// Atomic: `rkey` (le32).
    pub const ATOMIC_RKEY: usize = 48;
    /// UD: `remote_qpn` (le32).
    pub const UD_REMOTE_QPN: usize = 24;
    /// UD: `remote_qkey` (le32).
    pub const UD_REMOTE_QKEY: usize = 28;
    /// UD: `pkey_index` (le16).
    pub const UD_PKEY_INDEX: usize = 32;
    /// UD: `ah_num` (le32) from CREATE_AH.
    pub const UD_AH_NUM: usize = 36;
    /// UD: `av` (88 bytes; leave zero when `ah_num` is set).
    pub const UD_AV: usize = 56;
    /// `status` (le32, host-owned).
    pub const STATUS: usize = 144;
    /// `state` (le32, driver writes 0, then host-owned).
    pub const STATE: usize = 148;
    /// `iova` (le64): remote address for RDMA and atomics, else 0.
    pub const IOVA: usize = 152;
    /// `mask` (le32, host-owned).
    pub const MASK: usize = 160;
    /// `first_psn` (host-owned).
    pub const FIRST_PSN: usize = 164;
    /// `last_psn` (host-owned).
    pub const LAST_PSN: usize = 168;
    /// `ack_length` (host-owned).
    pub const ACK_LENGTH: usize = 172;
    /// `ssn` (host-owned).
    pub const SSN: usize = 176;
    /// `has_rd_atomic` (host-owned).
    pub const HAS_RD_ATOMIC: usize = 180;
    /// `dma` ([`super::DmaInfo`], 24 bytes).
    pub const DMA: usize = 184;
    /// SGE array or inline data.
    pub const SGE: usize = 208;
    /// Fixed part of a send WQE.
    pub const HEADER_SIZE: usize = 208;
}

/// Offsets inside one receive-queue or SRQ slot (`struct rxe_recv_wqe`).
pub mod recv_wqe {
    /// `wr_id` (le64).
    pub const WR_ID: usize = 0;
    /// `reserved` (le32, write 0).
    pub const RESERVED: usize = 8;
    /// `padding` (le32, write 0).
    pub const PADDING: usize = 12;
    /// `dma` ([`super::DmaInfo`]).
    pub const DMA: usize = 16;
    /// SGE array.
    pub const SGE: usize = 40;
    /// Fixed part of a receive WQE.
    pub const HEADER_SIZE: usize = 40;
}

/// Offsets inside one CQ slot (`struct ib_uverbs_wc`, 48 bytes).
pub mod cqe {
    /// `wr_id` (le64).
    pub const WR_ID: usize = 0;
    /// `status` (le32, [`crate::verbs::WcStatus`]).
    pub const STATUS: usize = 8;
    /// `opcode` (le32, [`crate::verbs::WcOpcode`]).
    pub const OPCODE: usize = 12;
    /// `vendor_err` (le32).
    pub const VENDOR_ERR: usize = 16;
    /// `byte_len` (le32).
    pub const BYTE_LEN: usize = 20;
    /// `imm_data` (big-endian) / `invalidate_rkey` (le32).
    pub const EX: usize = 24;
    /// `qp_num` (le32, host QPN).
    pub const QP_NUM: usize = 28;
    /// `src_qp` (le32).
    pub const SRC_QP: usize = 32;
    /// `wc_flags` (le32).
    pub const WC_FLAGS: usize = 36;
    /// `pkey_index` (le16).
    pub const PKEY_INDEX: usize = 40;
    /// `slid` (le16).
    pub const SLID: usize = 42;
    /// `sl` (u8).
    pub const SL: usize = 44;
    /// `dlid_path_bits` (u8).
    pub const DLID_PATH_BITS: usize = 45;
    /// `port_num` (u8).
    pub const PORT_NUM: usize = 46;
    /// Size of the user-visible CQE (the slot is larger).
    pub const SIZE: usize = 48;
}

wire_struct! {
    /// Fixed part of a send WQE (`struct rxe_send_wqe` up to its SGE array), 208 bytes.
    pub struct SendWqeHeader {
        /// `wr.wr_id`.
        pub wr_id: Le64,
        /// `wr.reserved` (0).
        pub wr_reserved: Le32,
        /// `wr.opcode`.
        pub opcode: Le32,
        /// `wr.send_flags`.
        pub send_flags: Le32,
        /// `wr.ex` (raw; `imm_data` is big-endian).
        pub ex: [u8; 4],
        /// `wr.wr` union; see [`RdmaWr`], [`AtomicWr`], [`UdWr`].
        pub wr: [u8; 120],
        /// `status` (host-owned).
        pub status: Le32,
        /// `state` (0 when posted).
        pub state: Le32,
        /// `iova`.
        pub iova: Le64,
        /// `mask` (host-owned).
        pub mask: Le32,
        /// `first_psn` (host-owned).
        pub first_psn: Le32,
        /// `last_psn` (host-owned).
        pub last_psn: Le32,
        /// `ack_length` (host-owned).
        pub ack_length: Le32,
        /// `ssn` (host-owned).
        pub ssn: Le32,
        /// `has_rd_atomic` (host-owned).
        pub has_rd_atomic: Le32,
        /// `dma`.
        pub dma: DmaInfo,
    }
}
assert_layout!(SendWqeHeader, 208, wr_id @ send_wqe::WR_ID, wr_reserved @ send_wqe::WR_RESERVED,
    opcode @ send_wqe::OPCODE, send_flags @ send_wqe::SEND_FLAGS, ex @ send_wqe::EX,
    wr @ send_wqe::WR_UNION, status @ send_wqe::STATUS, state @ send_wqe::STATE,
    iova @ send_wqe::IOVA, mask @ send_wqe::MASK, first_psn @ send_wqe::FIRST_PSN,
    last_psn @ send_wqe::LAST_PSN, ack_length @ send_wqe::ACK_LENGTH, ssn @ send_wqe::SSN,
    has_rd_atomic @ send_wqe::HAS_RD_ATOMIC, dma @ send_wqe::DMA);

wire_struct! {
    /// `wr.wr.rdma`, at [`send_wqe::WR_UNION`].
    pub struct RdmaWr {
        /// Remote address.
        pub remote_addr: Le64,
        /// Remote key.
        pub rkey: Le32,
        /// Zero.
        pub reserved: Le32,
    }
}
assert_layout!(RdmaWr, 16, remote_addr @ 0, rkey @ 8, reserved @ 12);

wire_struct! {
    /// `wr.wr.atomic`, at [`send_wqe::WR_UNION`].
    pub struct AtomicWr {
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
assert_layout!(AtomicWr, 32, remote_addr @ 0, compare_add @ 8, swap @ 16, rkey @ 24,
    reserved @ 28);

wire_struct! {
    /// `wr.wr.ud`, at [`send_wqe::WR_UNION`]; fills the whole 120-byte union.
    pub struct UdWr {
        /// Destination QPN.
        pub remote_qpn: Le32,
        /// Destination Q_Key.
        pub remote_qkey: Le32,
        /// P_Key index.
        pub pkey_index: Le16,
        /// Zero.
        pub reserved: Le16,
        /// `ah_num` from CREATE_AH.
        pub ah_num: Le32,
        /// Zero.
        pub pad: [u8; 16],
        /// Inline address vector (zero when `ah_num` is set).
        pub av: RxeAv,
    }
}
assert_layout!(UdWr, 120, remote_qpn @ 0, remote_qkey @ 4, pkey_index @ 8, reserved @ 10,
    ah_num @ 12, pad @ 16, av @ 32);

wire_struct! {
    /// Fixed part of a receive WQE (`struct rxe_recv_wqe`), 40 bytes.
    pub struct RecvWqeHeader {
        /// `wr_id`.
        pub wr_id: Le64,
        /// Zero.
        pub reserved: Le32,
        /// Zero.
        pub padding: Le32,
        /// `dma`.
        pub dma: DmaInfo,
    }
}
assert_layout!(RecvWqeHeader, 40, wr_id @ recv_wqe::WR_ID, reserved @ recv_wqe::RESERVED,
    padding @ recv_wqe::PADDING, dma @ recv_wqe::DMA);

wire_struct! {
    /// A CQE (`struct ib_uverbs_wc`), 48 bytes.
    pub struct Cqe {
        /// `wr_id`.
        pub wr_id: Le64,
        /// `status`.
        pub status: Le32,
        /// `opcode`.
        pub opcode: Le32,
        /// `vendor_err`.
        pub vendor_err: Le32,
        /// `byte_len`.
        pub byte_len: Le32,
        /// `ex` (raw; `imm_data` is big-endian).
        pub ex: [u8; 4],
        /// `qp_num`.
        pub qp_num: Le32,
        /// `src_qp`.
        pub src_qp: Le32,
        /// `wc_flags`.
        pub wc_flags: Le32,
        /// `pkey_index`.
        pub pkey_index: Le16,
        /// `slid`.
        pub slid: Le16,
        /// `sl`.
        pub sl: u8,
        /// `dlid_path_bits`.
        pub dlid_path_bits: u8,
        /// `port_num`.
        pub port_num: u8,
        /// Reserved.
        pub reserved: u8,
    }
}
assert_layout!(Cqe, 48, wr_id @ cqe::WR_ID, status @ cqe::STATUS, opcode @ cqe::OPCODE,
    vendor_err @ cqe::VENDOR_ERR, byte_len @ cqe::BYTE_LEN, ex @ cqe::EX, qp_num @ cqe::QP_NUM,
    src_qp @ cqe::SRC_QP, wc_flags @ cqe::WC_FLAGS, pkey_index @ cqe::PKEY_INDEX,
    slid @ cqe::SLID, sl @ cqe::SL, dlid_path_bits @ cqe::DLID_PATH_BITS,
    port_num @ cqe::PORT_NUM, reserved @ 47);

/// Bytes a send slot needs for `max_sge` SGEs or `max_inline` inline bytes (before the
/// host rounds it up to a power of two of at least one cache line).
pub const fn send_wqe_size(max_sge: u32, max_inline: u32) -> usize {
    let sge = max_sge as usize * SGE_SIZE;
    let inl = max_inline as usize;
    send_wqe::HEADER_SIZE + if sge > inl { sge } else { inl }
}

/// Bytes a receive slot needs for `max_sge` SGEs (before rounding).
pub const fn recv_wqe_size(max_sge: u32) -> usize {
    recv_wqe::HEADER_SIZE + max_sge as usize * SGE_SIZE
}

//! How a ring descriptor describes an rxe v1 queue buffer: the format identifier, the slot
//! geometry the driver accepts, slot addressing, and the checks a driver makes before it
//! touches a mapping.

use super::header::DATA;
use crate::wire::RingDesc;

/// Ring-format identifier of rxe v1 (config `ring_format`, `RingDesc::format`).
pub const FORMAT_ID: u32 = crate::config::ring_format::RXE_V1;

/// Smallest slot the host uses (one cache line), as log2.
pub const MIN_LOG2_SLOT_SIZE: u32 = 6;
/// Largest slot this crate accepts from a device (64 KiB), as log2.
pub const MAX_LOG2_SLOT_SIZE: u32 = 16;

/// Byte offset of slot `index` (masked) in a queue buffer.
pub const fn slot_offset(index: u32, index_mask: u32, log2_slot_size: u32) -> usize {
    DATA + (((index & index_mask) as usize) << log2_slot_size)
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
        let need = (DATA as u64) + (u64::from(n) << log2);
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

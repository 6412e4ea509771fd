//! The geometry of an rxe v1 queue buffer, defined once: the format identifier, the slot
//! geometry a driver accepts ([`RingGeometry`]: index masking, advancing, counting, slot
//! addressing), and the checks every side makes before it touches a mapping, with one error
//! type ([`GeometryError`]) for all of them. The guest's provider, the device's staging rings
//! and staged CQs, and the tests' kernel simulation all go through it (rdma-core keeps the
//! same arithmetic in one header, `providers/rxe/rxe_queue.h`).

use super::header::DATA;

/// Ring-format identifier of rxe v1 (config `ring_format`, `RingDesc::format`).
pub const FORMAT_ID: u32 = crate::config::ring_format::RXE_V1;

/// Smallest slot the host uses (one cache line), as log2.
pub const MIN_LOG2_SLOT_SIZE: u32 = 6;
/// Largest slot this crate accepts from a device (64 KiB), as log2.
pub const MAX_LOG2_SLOT_SIZE: u32 = 16;

/// Number of slots the host allocates for a requested depth: `roundup_pow_of_two(wr + 1)`.
/// `None` if that does not fit in 32 bits.
pub const fn num_slots_for(max_wr: u32) -> Option<u32> {
    match max_wr.checked_add(1) {
        Some(n) => n.checked_next_power_of_two(),
        None => None,
    }
}

/// Why a ring, its description, its mapping or its header does not hold together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GeometryError {
    /// The descriptor names another ring format.
    #[error("ring format {0} is not rxe v1")]
    Format(u32),
    /// `num_slots` is not a power of two >= 2.
    #[error("{0} slots is not a power of two >= 2")]
    NumSlots(u32),
    /// `log2_slot_size` is outside the accepted range.
    #[error("slot size 2^{0} out of range")]
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
    /// The buffer start (an address, or an offset in the region) is not aligned to a cache
    /// line.
    #[error("queue buffer at {0:#x} is not 64-byte aligned")]
    Misaligned(usize),
    /// Header and slots do not fit in the bytes there are.
    #[error("queue needs {need} bytes, {mapped} are mapped")]
    TooSmall {
        /// Bytes the geometry needs.
        need: u64,
        /// Bytes there are.
        mapped: usize,
    },
    /// The buffer's region offset plus its length does not fit in an address.
    #[error("queue buffer of {len} bytes at offset {offset:#x} overflows the address space")]
    OffsetOverflow {
        /// Offset in the region.
        offset: usize,
        /// Length.
        len: usize,
    },
    /// The mapped header disagrees with the geometry reported for it.
    #[error("mapped header (log2 {log2}, mask {mask:#x}) disagrees with the geometry")]
    HeaderMismatch {
        /// `log2_elem_size` read from the header.
        log2: u32,
        /// `index_mask` read from the header.
        mask: u32,
    },
    /// An index in the header is outside the queue.
    #[error("{which} index {value:#x} is outside the queue")]
    IndexOutOfRange {
        /// `"producer"` or `"consumer"`.
        which: &'static str,
        /// The value found.
        value: u32,
    },
    /// A slot cannot hold the largest entry the queue was created for.
    #[error("slots of {slot} bytes cannot hold entries of {need} bytes")]
    SlotTooSmall {
        /// Bytes the largest entry needs.
        need: usize,
        /// Slot size.
        slot: usize,
    },
}

/// The slot geometry of one queue buffer: a power of two of at least 2 slots, each a power of
/// two of [`MIN_LOG2_SLOT_SIZE`]..=[`MAX_LOG2_SLOT_SIZE`] bytes, after the header. A value
/// of this type always holds together; every index it hands out is masked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingGeometry {
    index_mask: u32,
    log2_slot_size: u32,
}

impl RingGeometry {
    /// `num_slots` slots of `2^log2_slot_size` bytes.
    pub const fn new(num_slots: u32, log2_slot_size: u32) -> Result<Self, GeometryError> {
        if num_slots < 2 || !num_slots.is_power_of_two() {
            return Err(GeometryError::NumSlots(num_slots));
        }
        if log2_slot_size < MIN_LOG2_SLOT_SIZE || log2_slot_size > MAX_LOG2_SLOT_SIZE {
            return Err(GeometryError::SlotSize(log2_slot_size));
        }
        Ok(RingGeometry {
            index_mask: num_slots - 1,
            log2_slot_size,
        })
    }

    /// The geometry whose header words are `index_mask` and `log2_slot_size`.
    pub const fn with_index_mask(
        index_mask: u32,
        log2_slot_size: u32,
    ) -> Result<Self, GeometryError> {
        Self::new(index_mask.wrapping_add(1), log2_slot_size)
    }

    /// Number of slots.
    pub const fn num_slots(self) -> u32 {
        self.index_mask + 1
    }

    /// `num_slots - 1`: the header's `index_mask`.
    pub const fn index_mask(self) -> u32 {
        self.index_mask
    }

    /// How many entries the queue holds at most (one slot always stays empty).
    pub const fn capacity(self) -> u32 {
        self.index_mask
    }

    /// log2 of the slot size: the header's `log2_elem_size`.
    pub const fn log2_slot_size(self) -> u32 {
        self.log2_slot_size
    }

    /// Slot size in bytes.
    pub const fn slot_size(self) -> usize {
        1 << self.log2_slot_size
    }

    /// Bytes of header and slots (at most 2^47, so any sum below cannot overflow).
    pub const fn buffer_len(self) -> u64 {
        DATA as u64 + ((self.num_slots() as u64) << self.log2_slot_size)
    }

    /// `index` masked: what a value read from shared memory names, whatever was written.
    pub const fn mask(self, index: u32) -> u32 {
        index & self.index_mask
    }

    /// `index` advanced by one slot.
    pub const fn next(self, index: u32) -> u32 {
        self.mask(index.wrapping_add(1))
    }

    /// Entries between `consumer` and `producer`.
    pub const fn count(self, producer: u32, consumer: u32) -> u32 {
        self.mask(producer.wrapping_sub(consumer))
    }

    /// Byte offset of slot `index` (masked) from the buffer start; a multiple of 64.
    pub const fn slot_offset(self, index: u32) -> usize {
        DATA + ((self.mask(index) as usize) << self.log2_slot_size)
    }

    /// Fails unless header and slots fit in `len` bytes.
    pub const fn check_len(self, len: usize) -> Result<(), GeometryError> {
        let need = self.buffer_len();
        if need > len as u64 {
            return Err(GeometryError::TooSmall { need, mapped: len });
        }
        Ok(())
    }

    /// Fails unless a slot holds an entry of `need` bytes.
    pub const fn check_entry(self, need: usize) -> Result<(), GeometryError> {
        if need > self.slot_size() {
            return Err(GeometryError::SlotTooSmall {
                need,
                slot: self.slot_size(),
            });
        }
        Ok(())
    }

    /// Cross-checks the two header words read from the mapped buffer with this geometry
    /// (a driver must not trust either alone).
    pub const fn check_header(
        self,
        log2_elem_size: u32,
        index_mask: u32,
    ) -> Result<(), GeometryError> {
        if log2_elem_size != self.log2_slot_size || index_mask != self.index_mask {
            return Err(GeometryError::HeaderMismatch {
                log2: log2_elem_size,
                mask: index_mask,
            });
        }
        Ok(())
    }

    /// Fails if the unmasked index `value` (the `which` index word) names no slot.
    pub const fn check_index(self, which: &'static str, value: u32) -> Result<(), GeometryError> {
        if value & !self.index_mask != 0 {
            return Err(GeometryError::IndexOutOfRange { which, value });
        }
        Ok(())
    }
}

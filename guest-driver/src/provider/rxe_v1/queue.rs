//! A mapped rxe queue buffer: geometry checks, slot addressing and the shared indices.

use std::mem::{offset_of, size_of};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use super::abi::RxeQueueBuf;

/// Smallest slot the kernel allocates (one cache line), as log2.
const MIN_LOG2_SLOT_SIZE: u32 = 6;
/// Largest slot accepted (64 KiB), as log2: far above what any rxe queue uses.
const MAX_LOG2_SLOT_SIZE: u32 = 16;
/// Alignment required of the buffer start: slots are then cache-line aligned, like the kernel's.
const BASE_ALIGN: usize = 64;
/// Offset of the first slot.
const DATA_OFFSET: usize = size_of::<RxeQueueBuf>();

/// Slot geometry the device reported for a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueGeometry {
    /// Number of slots: a power of two, capacity is one less.
    pub num_slots: u32,
    /// log2 of the slot size in bytes.
    pub log2_slot_size: u32,
}

/// Why a mapped queue buffer is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// The buffer start is not aligned to a cache line.
    #[error("queue buffer at {0:#x} is not 64-byte aligned")]
    Misaligned(usize),
    /// `num_slots` is not a power of two of at least 2.
    #[error("{0} slots is not a power of two >= 2")]
    NumSlots(u32),
    /// The slot size is outside the accepted range.
    #[error("slot size 2^{0} out of range")]
    SlotSize(u32),
    /// Header and slots do not fit in the mapping.
    #[error("queue needs {need} bytes, {mapped} are mapped")]
    TooSmall {
        /// Bytes the geometry needs.
        need: u64,
        /// Bytes mapped.
        mapped: usize,
    },
    /// The header in shared memory disagrees with the reported geometry.
    #[error("header (log2 {log2}, mask {mask:#x}) disagrees with the reported geometry")]
    HeaderMismatch {
        /// `log2_elem_size` found in the header.
        log2: u32,
        /// `index_mask` found in the header.
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

/// A queue buffer of the host kernel mapped into this process.
///
/// The geometry is taken from the device's report and only cross-checked against the header:
/// the header lives in memory the other side can write, so it is never consulted again.
#[derive(Debug)]
pub struct RxeQueue {
    base: NonNull<u8>,
    index_mask: u32,
    log2_slot_size: u32,
}

// SAFETY: the queue only holds a pointer to memory that `new`'s contract keeps mapped for its
// whole life; every access to it goes through `&self`/`&mut self` of the owning wrapper or
// through atomics, so moving the handle to another thread is sound.
unsafe impl Send for RxeQueue {}

impl RxeQueue {
    /// Wraps the queue buffer mapped at `base`, checking it against the geometry the device
    /// reported for it.
    ///
    /// # Safety
    ///
    /// `[base, base + mapped_len)` must be readable and writable and stay mapped until the
    /// returned value (and anything built from it) is dropped. It may be shared with the host
    /// kernel (or whatever else implements the other side of the queue), which accesses the
    /// indices only atomically; this process must not access it except through this value,
    /// and must wrap each buffer at most once at a time.
    pub unsafe fn new(
        base: NonNull<u8>,
        mapped_len: usize,
        geometry: QueueGeometry,
    ) -> Result<Self, QueueError> {
        let addr = base.as_ptr() as usize;
        if !addr.is_multiple_of(BASE_ALIGN) {
            return Err(QueueError::Misaligned(addr));
        }
        let QueueGeometry {
            num_slots,
            log2_slot_size,
        } = geometry;
        if num_slots < 2 || !num_slots.is_power_of_two() {
            return Err(QueueError::NumSlots(num_slots));
        }
        if !(MIN_LOG2_SLOT_SIZE..=MAX_LOG2_SLOT_SIZE).contains(&log2_slot_size) {
            return Err(QueueError::SlotSize(log2_slot_size));
        }
        // Both factors are bounded (2^32 slots of at most 2^16 bytes), so this cannot overflow.
        let need = DATA_OFFSET as u64 + (u64::from(num_slots) << log2_slot_size);
        if need > mapped_len as u64 {
            return Err(QueueError::TooSmall {
                need,
                mapped: mapped_len,
            });
        }
        let queue = RxeQueue {
            base,
            index_mask: num_slots - 1,
            log2_slot_size,
        };

        let log2 = queue.header_word(offset_of!(RxeQueueBuf, log2_elem_size));
        let mask = queue.header_word(offset_of!(RxeQueueBuf, index_mask));
        if log2 != log2_slot_size || mask != queue.index_mask {
            return Err(QueueError::HeaderMismatch { log2, mask });
        }
        for (which, word) in [
            ("producer", queue.producer()),
            ("consumer", queue.consumer()),
        ] {
            let value = word.load(Ordering::Relaxed);
            if value & !queue.index_mask != 0 {
                return Err(QueueError::IndexOutOfRange { which, value });
            }
        }
        Ok(queue)
    }

    /// Number of slots.
    pub fn num_slots(&self) -> u32 {
        self.index_mask + 1
    }

    /// How many entries the queue holds at most (one slot always stays empty).
    pub fn capacity(&self) -> u32 {
        self.index_mask
    }

    /// Slot size in bytes.
    pub fn slot_size(&self) -> usize {
        1 << self.log2_slot_size
    }

    /// `index` advanced by one slot.
    pub(super) fn next(&self, index: u32) -> u32 {
        index.wrapping_add(1) & self.index_mask
    }

    /// The producer index, masked: a corrupted value still names a slot of this queue.
    pub(super) fn load_producer(&self, order: Ordering) -> u32 {
        self.producer().load(order) & self.index_mask
    }

    /// The consumer index, masked like [`Self::load_producer`].
    pub(super) fn load_consumer(&self, order: Ordering) -> u32 {
        self.consumer().load(order) & self.index_mask
    }

    /// Publishes a new producer index.
    pub(super) fn store_producer(&self, index: u32, order: Ordering) {
        self.producer().store(index & self.index_mask, order);
    }

    /// Publishes a new consumer index.
    pub(super) fn store_consumer(&self, index: u32, order: Ordering) {
        self.consumer().store(index & self.index_mask, order);
    }

    /// Start of slot `index` (masked), aligned to at least 64 bytes. Whether the slot may be
    /// accessed is the caller's business (its side of the index protocol).
    pub(super) fn slot(&self, index: u32) -> *mut u8 {
        let offset = DATA_OFFSET + (((index & self.index_mask) as usize) << self.log2_slot_size);
        // SAFETY: `new` checked that header plus all slots lie in the mapping, and the masked
        // index names one of those slots.
        unsafe { self.base.as_ptr().add(offset) }
    }

    fn header_word(&self, offset: usize) -> u32 {
        // SAFETY: `offset` is a field offset of the header, which lies in the mapping (`new`
        // checked the length) and is 4-byte aligned (the base is 64-byte aligned). The host
        // wrote these words before mapping the buffer and never changes them; a volatile read
        // keeps the compiler from assuming anything about memory another party owns.
        unsafe { self.base.as_ptr().add(offset).cast::<u32>().read_volatile() }
    }

    fn index_word(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: the word lies in the mapping, is 4-byte aligned, stays mapped while `self`
        // lives (contract of `new`), and both sides access it only atomically.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(offset).cast::<u32>()) }
    }

    fn producer(&self) -> &AtomicU32 {
        self.index_word(offset_of!(RxeQueueBuf, producer_index))
    }

    fn consumer(&self) -> &AtomicU32 {
        self.index_word(offset_of!(RxeQueueBuf, consumer_index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zeroed, page-aligned buffer standing in for a mapped queue.
    struct Buffer {
        words: Vec<u64>,
    }

    impl Buffer {
        fn new(len: usize, log2: u32, mask: u32) -> Self {
            // A 64-byte aligned start is found inside a slightly larger allocation.
            let mut buf = Buffer {
                words: vec![0; len / 8 + 16],
            };
            let base = buf.base();
            // SAFETY: the header words lie inside the allocation (len >= 384 in every test).
            unsafe {
                base.as_ptr().cast::<u32>().write(log2);
                base.as_ptr().cast::<u32>().add(1).write(mask);
            }
            buf
        }

        fn base(&mut self) -> NonNull<u8> {
            let ptr = self.words.as_mut_ptr().cast::<u8>();
            let skip = ptr.align_offset(BASE_ALIGN);
            // SAFETY: `skip` < 64 bytes, within the 128 spare bytes of the allocation.
            NonNull::new(unsafe { ptr.add(skip) }).unwrap()
        }
    }

    fn geometry(num_slots: u32, log2_slot_size: u32) -> QueueGeometry {
        QueueGeometry {
            num_slots,
            log2_slot_size,
        }
    }

    #[test]
    fn accepts_consistent_header_and_addresses_slots_masked() {
        let mut buf = Buffer::new(384 + 8 * 128, 7, 7);
        let base = buf.base();
        // SAFETY: the buffer outlives the queue and is accessed only through it.
        let q = unsafe { RxeQueue::new(base, 384 + 8 * 128, geometry(8, 7)) }.unwrap();
        assert_eq!((q.num_slots(), q.capacity(), q.slot_size()), (8, 7, 128));
        let base = base.as_ptr() as usize;
        assert_eq!(q.slot(0) as usize - base, 384);
        assert_eq!(q.slot(7) as usize - base, 384 + 7 * 128);
        assert_eq!(q.slot(8) as usize - base, 384);
        assert_eq!(q.slot(u32::MAX) as usize - base, 384 + 7 * 128);
        assert_eq!(q.next(7), 0);
    }

    #[test]
    fn refuses_inconsistent_geometry() {
        let len = 384 + 8 * 128;
        let cases = [
            (
                Buffer::new(len, 7, 7),
                len,
                geometry(8, 6),
                QueueError::HeaderMismatch { log2: 7, mask: 7 },
            ),
            (
                Buffer::new(len, 7, 15),
                len,
                geometry(8, 7),
                QueueError::HeaderMismatch { log2: 7, mask: 15 },
            ),
            (
                Buffer::new(len, 7, 7),
                len - 1,
                geometry(8, 7),
                QueueError::TooSmall {
                    need: len as u64,
                    mapped: len - 1,
                },
            ),
            (
                Buffer::new(len, 7, 7),
                len,
                geometry(6, 7),
                QueueError::NumSlots(6),
            ),
            (
                Buffer::new(len, 7, 7),
                len,
                geometry(1, 7),
                QueueError::NumSlots(1),
            ),
            (
                Buffer::new(len, 5, 7),
                len,
                geometry(8, 5),
                QueueError::SlotSize(5),
            ),
            (
                Buffer::new(len, 7, 7),
                len,
                geometry(1 << 31, 16),
                QueueError::TooSmall {
                    need: 384 + (1 << 47),
                    mapped: len,
                },
            ),
        ];
        for (mut buf, mapped, geometry, want) in cases {
            let base = buf.base();
            // SAFETY: the buffer outlives the (refused) queue.
            let got = unsafe { RxeQueue::new(base, mapped, geometry) }.unwrap_err();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn refuses_out_of_range_indices_and_misalignment() {
        let len = 384 + 8 * 128;
        let mut buf = Buffer::new(len, 7, 7);
        let base = buf.base();
        // SAFETY: offset 128 is the producer word, inside the buffer.
        unsafe { base.as_ptr().add(128).cast::<u32>().write(8) };
        // SAFETY: the buffer outlives the (refused) queue.
        let got = unsafe { RxeQueue::new(base, len, geometry(8, 7)) }.unwrap_err();
        assert_eq!(
            got,
            QueueError::IndexOutOfRange {
                which: "producer",
                value: 8
            }
        );

        // SAFETY: 8 bytes past the start is still inside the allocation (64 spare bytes).
        let odd = unsafe { NonNull::new_unchecked(base.as_ptr().add(8)) };
        // SAFETY: as above; the queue is refused before any access.
        let got = unsafe { RxeQueue::new(odd, len, geometry(8, 7)) }.unwrap_err();
        assert_eq!(got, QueueError::Misaligned(odd.as_ptr() as usize));
    }
}

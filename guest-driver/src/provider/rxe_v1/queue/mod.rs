//! An rxe queue buffer in the shared-memory region: geometry checks, slot addressing, the
//! shared indices, and how entries get into and out of the slots.
//!
//! The region is either mapped into this process or reached through a [`RegionAccess`] (as
//! under qtest, where the device's BAR is only reachable through QEMU). When mapped, entries
//! are built in place in their slot and the indices are atomics in the buffer. When accessed,
//! an entry is built in a scratch slot the queue owns and reaches the region with one write;
//! the indices go through the accessor's Acquire load and Release store. The code that encodes
//! entries is the same for both: it writes through a [`SlotWriter`] and ends with
//! [`SlotWriter::commit`], which only has work to do for an accessed queue.

use std::fmt;
use std::marker::PhantomData;
use std::mem::size_of;
use std::ptr::{self, NonNull};
use std::slice;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vrdma_spec::rxe_v1::{header, GeometryError, RingGeometry};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::transport::RegionAccess;

/// Alignment required of the buffer start: slots are then cache-line aligned, like the kernel's.
const BASE_ALIGN: usize = 64;
/// How long a new queue's header may take to become visible (see `check_header`).
const HEADER_SETTLE: Duration = Duration::from_millis(200);

/// How the queue buffer is reached.
enum Memory {
    /// Mapped into this process at this (64-byte aligned) address.
    Mapped(NonNull<u8>),
    /// Reached through `access`; the buffer starts `offset` bytes into the region.
    Accessed {
        access: Arc<dyn RegionAccess>,
        offset: u64,
        /// One slot's worth of memory where entries are built before they are written out
        /// (and read into before they are parsed). Allocated with the queue, zeroed.
        scratch: Box<[u64]>,
    },
}

/// A queue buffer of the host kernel in the shared-memory region.
///
/// The geometry is taken from the device's report and only cross-checked against the header:
/// the header lives in memory the other side can write, so its values are never used; later
/// it is only compared, as a sign that the buffer is still mapped ([`Self::still_mapped`]).
pub struct RxeQueue {
    memory: Memory,
    geometry: RingGeometry,
}

// SAFETY: a mapped queue only holds a pointer to memory that `new`'s contract keeps mapped for
// its whole life; every access to it goes through `&self`/`&mut self` of the owning wrapper or
// through atomics, so moving the handle to another thread is sound. An accessed queue holds a
// `RegionAccess` (Send + Sync) and an owned buffer.
unsafe impl Send for RxeQueue {}

impl fmt::Debug for RxeQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("RxeQueue");
        match &self.memory {
            Memory::Mapped(base) => s.field("base", base),
            Memory::Accessed { offset, .. } => s.field("region_offset", offset),
        };
        s.field("num_slots", &self.num_slots())
            .field("slot_size", &self.slot_size())
            .finish()
    }
}

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
        geometry: RingGeometry,
    ) -> Result<Self, GeometryError> {
        let addr = base.as_ptr() as usize;
        if !addr.is_multiple_of(BASE_ALIGN) {
            return Err(GeometryError::Misaligned(addr));
        }
        geometry.check_len(mapped_len)?;
        RxeQueue {
            memory: Memory::Mapped(base),
            geometry,
        }
        .check_header()
    }

    /// Wraps the queue buffer of `len` bytes at `offset` in the region that `access` reaches,
    /// checking it against the geometry the device reported for it. Allocates the scratch slot
    /// every later entry is built in.
    ///
    /// `[offset, offset + len)` must lie inside the region (the queue does not know the
    /// region's size), and each buffer should be wrapped at most once at a time: two handles
    /// on one buffer would overwrite each other's entries.
    pub fn accessed(
        access: Arc<dyn RegionAccess>,
        offset: usize,
        len: usize,
        geometry: RingGeometry,
    ) -> Result<Self, GeometryError> {
        if !offset.is_multiple_of(BASE_ALIGN) {
            return Err(GeometryError::Misaligned(offset));
        }
        if offset.checked_add(len).is_none() {
            return Err(GeometryError::OffsetOverflow { offset, len });
        }
        geometry.check_len(len)?;
        let slot_words = geometry.slot_size() / size_of::<u64>();
        RxeQueue {
            memory: Memory::Accessed {
                access,
                offset: offset as u64,
                scratch: vec![0; slot_words].into_boxed_slice(),
            },
            geometry,
        }
        .check_header()
    }

    /// The queue's slot geometry.
    pub fn geometry(&self) -> RingGeometry {
        self.geometry
    }

    /// Number of slots.
    pub fn num_slots(&self) -> u32 {
        self.geometry.num_slots()
    }

    /// How many entries the queue holds at most (one slot always stays empty).
    pub fn capacity(&self) -> u32 {
        self.geometry.capacity()
    }

    /// Slot size in bytes.
    pub fn slot_size(&self) -> usize {
        self.geometry.slot_size()
    }

    /// Fails unless a slot holds an entry of `need` bytes.
    pub fn check_entry(&self, need: usize) -> Result<(), GeometryError> {
        self.geometry.check_entry(need)
    }

    /// Whether the buffer is mapped into this process (rather than reached through a
    /// [`RegionAccess`]).
    pub fn is_mapped(&self) -> bool {
        matches!(self.memory, Memory::Mapped(_))
    }

    /// `index` advanced by one slot.
    pub(super) fn next(&self, index: u32) -> u32 {
        self.geometry.next(index)
    }

    /// The producer index, masked: a corrupted value still names a slot of this queue. An
    /// accessed queue always loads with Acquire, which is at least as strong as any `order`.
    pub(super) fn load_producer(&self, order: Ordering) -> u32 {
        self.geometry
            .mask(self.load_index(header::PRODUCER_INDEX, order))
    }

    /// The consumer index, masked like [`Self::load_producer`].
    pub(super) fn load_consumer(&self, order: Ordering) -> u32 {
        self.geometry
            .mask(self.load_index(header::CONSUMER_INDEX, order))
    }

    /// Publishes a new producer index. An accessed queue always stores with Release, which is
    /// at least as strong as any `order`.
    pub(super) fn store_producer(&self, index: u32, order: Ordering) {
        self.store_index(header::PRODUCER_INDEX, self.geometry.mask(index), order);
    }

    /// Publishes a new consumer index, like [`Self::store_producer`].
    pub(super) fn store_consumer(&self, index: u32, order: Ordering) {
        self.store_index(header::CONSUMER_INDEX, self.geometry.mask(index), order);
    }

    /// Offset of slot `index` (masked) from the buffer start; a multiple of 64.
    pub(super) fn slot_offset(&self, index: u32) -> usize {
        self.geometry.slot_offset(index)
    }

    /// A writer for the entry of slot `index` (masked): the slot itself when mapped, the
    /// scratch slot when accessed. Its bytes hold whatever was there before.
    ///
    /// # Safety
    ///
    /// The other side must not access slot `index` from now until the entry is handed over by
    /// publishing the producer index (a producer slot of a queue that is not full).
    pub(super) unsafe fn slot_writer(&mut self, index: u32) -> SlotWriter<'_> {
        let slot_offset = self.slot_offset(index);
        let len = self.slot_size();
        match &mut self.memory {
            Memory::Mapped(base) => SlotWriter {
                // SAFETY: `new` checked that header plus all slots lie in the mapping, and the
                // offset names one of those slots.
                start: unsafe { base.add(slot_offset) },
                len,
                copy_to: None,
                _slot: PhantomData,
            },
            Memory::Accessed {
                access,
                offset,
                scratch,
            } => SlotWriter {
                start: NonNull::from(&mut **scratch).cast(),
                len,
                copy_to: Some((&**access, *offset + slot_offset as u64)),
                _slot: PhantomData,
            },
        }
    }

    /// Reads the entry of type `T` at the start of slot `index` (masked): in place when
    /// mapped, through the scratch slot (one [`RegionAccess::read`]) when accessed.
    ///
    /// # Safety
    ///
    /// The other side must have finished writing the slot (as published by the index it
    /// stores with Release and this side loaded with Acquire) and must not write it again
    /// before this side hands it back.
    pub(super) unsafe fn read_slot<T: FromBytes>(&mut self, index: u32) -> T {
        assert!(
            size_of::<T>() <= self.slot_size(),
            "entry larger than a slot"
        );
        let slot_offset = self.slot_offset(index);
        match &mut self.memory {
            // SAFETY: the slot lies in the mapping (`new` checked) and is at least
            // `size_of::<T>()` long (asserted); the kernel does not write it during the read
            // (the caller's contract); any bit pattern is a valid `T` (`FromBytes`).
            Memory::Mapped(base) => unsafe { base.add(slot_offset).cast::<T>().read_unaligned() },
            Memory::Accessed {
                access,
                offset,
                scratch,
            } => {
                let bytes = &mut scratch.as_mut_bytes()[..size_of::<T>()];
                access.read(*offset + slot_offset as u64, bytes);
                T::read_from_bytes(bytes)
                    .unwrap_or_else(|_| unreachable!("the bytes are exactly one `T`"))
            }
        }
    }

    /// Compares the header with the geometry and checks both indices; returns the queue.
    fn check_header(self) -> Result<Self, GeometryError> {
        // The mapping was made before the device answered, but a CPU may not see it at once:
        // QEMU under TCG applies a change of the guest's memory map to each vCPU
        // asynchronously (at its next exit to QEMU's loop), and a first read can still find
        // the range's previous contents. A few re-reads, each after a yield (which lets the
        // vCPU leave its translated code), settle it; a header that stays wrong is the device's
        // fault.
        let deadline = Instant::now() + HEADER_SETTLE;
        loop {
            let log2 = self.header_word(header::LOG2_ELEM_SIZE);
            let mask = self.header_word(header::INDEX_MASK);
            match self.geometry.check_header(log2, mask) {
                Ok(()) => break,
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => {}
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        for (which, word) in [
            ("producer", header::PRODUCER_INDEX),
            ("consumer", header::CONSUMER_INDEX),
        ] {
            self.geometry
                .check_index(which, self.load_index(word, Ordering::Relaxed))?;
        }
        Ok(self)
    }

    /// Whether the buffer still holds this queue's header, read after everything read from
    /// it before. The header never changes while the host queue lives; when the device's
    /// back-end is lost its mappings are replaced by zeroed memory, so a header that no longer
    /// matches means every slot and index read before this call may be that memory's, not
    /// the kernel's.
    pub(super) fn still_mapped(&self) -> bool {
        // Acquire fence: the slot and index reads before it are ordered before the header
        // read below. The replacement covers the whole buffer at once, so slots read before a
        // header that still matches were read from the queue.
        std::sync::atomic::fence(Ordering::Acquire);
        self.header_word(header::INDEX_MASK) == self.geometry.index_mask()
    }

    fn header_word(&self, offset: usize) -> u32 {
        match &self.memory {
            // SAFETY: `offset` is a field offset of the header, which lies in the mapping
            // (`new` checked the length) and is 4-byte aligned (the base is 64-byte aligned).
            // The host wrote these words before mapping the buffer and never changes them; a
            // volatile read keeps the compiler from assuming anything about memory another
            // party owns.
            Memory::Mapped(base) => unsafe { base.add(offset).cast::<u32>().read_volatile() },
            Memory::Accessed {
                access,
                offset: start,
                ..
            } => access.load_u32(start + offset as u64),
        }
    }

    /// The unmasked value of the index word at `offset` in the header.
    fn load_index(&self, offset: usize, order: Ordering) -> u32 {
        match &self.memory {
            Memory::Mapped(base) => index_word(base, offset).load(order),
            Memory::Accessed {
                access,
                offset: start,
                ..
            } => access.load_u32(start + offset as u64),
        }
    }

    fn store_index(&self, offset: usize, value: u32, order: Ordering) {
        match &self.memory {
            Memory::Mapped(base) => index_word(base, offset).store(value, order),
            Memory::Accessed {
                access,
                offset: start,
                ..
            } => access.store_u32(start + offset as u64, value),
        }
    }
}

/// The index word at `offset` of the header of the mapped queue at `base`, borrowed from the
/// queue that holds `base`.
fn index_word(base: &NonNull<u8>, offset: usize) -> &AtomicU32 {
    // SAFETY: `offset` is the producer or consumer field of the header, which lies in the
    // mapping and is 4-byte aligned; the mapping stays while the queue holding `base` lives
    // (contract of `RxeQueue::new`), and the reference does not outlive that borrow. Both
    // sides access the word only atomically.
    unsafe { AtomicU32::from_ptr(base.add(offset).cast::<u32>().as_ptr()) }
}

/// An entry being built for one slot (see [`RxeQueue::slot_writer`]).
///
/// Writes land in the slot itself when the queue is mapped, in the queue's scratch slot when it
/// is accessed; [`Self::commit`] then copies the scratch out. Every write is checked to stay
/// inside the slot.
pub(super) struct SlotWriter<'a> {
    /// First byte of the slot or of the scratch slot: at least 8-byte aligned, valid for
    /// writes of `len` bytes, and accessed by nobody else while the writer lives.
    start: NonNull<u8>,
    /// Slot size.
    len: usize,
    /// For a scratch entry: where `commit` writes it (the accessor and the slot's region
    /// offset).
    copy_to: Option<(&'a dyn RegionAccess, u64)>,
    /// The writer borrows the queue (its slot or scratch) mutably.
    _slot: PhantomData<&'a mut [u8]>,
}

impl SlotWriter<'_> {
    /// Writes `value` at `offset` bytes into the entry.
    ///
    /// Panics if the value would not lie inside the slot: callers size their entries against
    /// the slot when the queue is created.
    pub(super) fn put<T: IntoBytes + Immutable>(&mut self, offset: usize, value: T) {
        let bytes = value.as_bytes();
        self.check_range(offset, bytes.len());
        // SAFETY: the destination lies inside the slot (checked) and nobody else accesses it
        // while the writer lives (see `start`); the source is a local value.
        unsafe {
            ptr::copy_nonoverlapping(bytes.as_ptr(), self.start.add(offset).as_ptr(), bytes.len())
        }
    }

    /// Copies `len` bytes from `src` to `offset` bytes into the entry. The source may overlap
    /// the entry.
    ///
    /// Panics if the bytes would not lie inside the slot.
    ///
    /// # Safety
    ///
    /// `[src, src + len)` must be readable, initialised memory for the duration of the call.
    pub(super) unsafe fn put_bytes(&mut self, offset: usize, src: *const u8, len: usize) {
        self.check_range(offset, len);
        // SAFETY: the source is readable (the caller's contract), the destination lies inside
        // the slot (checked) and is not accessed by anybody else (see `start`); `copy`
        // tolerates overlap.
        unsafe { ptr::copy(src, self.start.add(offset).as_ptr(), len) }
    }

    /// Completes the entry, whose first `len` bytes are meant for the slot. When mapped the
    /// entry is already in place and nothing happens; when accessed, the bytes reach the slot
    /// with one [`RegionAccess::write`].
    pub(super) fn commit(self, len: usize) {
        self.check_range(0, len);
        if let Some((access, offset)) = self.copy_to {
            // SAFETY: `start` is the scratch slot, owned by the queue this writer borrows
            // mutably; `len` bytes are in bounds (checked) and initialised (the scratch is
            // zeroed on allocation and written only with the bytes of values and initialised bytes).
            let bytes = unsafe { slice::from_raw_parts(self.start.as_ptr(), len) };
            access.write(offset, bytes);
        }
    }

    fn check_range(&self, offset: usize, len: usize) {
        assert!(
            offset <= self.len && len <= self.len - offset,
            "entry bytes {offset}+{len} outside a slot of {}",
            self.len
        );
    }
}

#[cfg(test)]
mod tests;

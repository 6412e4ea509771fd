//! Driver side of a split virtqueue (VIRTIO 1.x, 2.7): descriptor table, available ring and
//! used ring in DMA memory.
//!
//! The rings are shared with the device, so every access to them goes through raw pointers:
//! the ring indices with atomics (Release when publishing, Acquire when consuming), the
//! entries with volatile accesses ordered by those atomics. Bookkeeping the device must not be
//! able to corrupt (the free list, chain lengths) lives in driver-private memory, and
//! everything read back from the device (used ids, lengths) is checked.
//!
//! Chains use direct descriptors only (device-readable buffers first, then device-writable
//! ones); indirect tables are not used.

use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU16, Ordering};

use crate::dma::{DmaBuffer, DmaError, DmaMemory, PAGE_SIZE};

const DESC_SIZE: usize = 16;
const VIRTQ_DESC_F_NEXT: u16 = 1;
const VIRTQ_DESC_F_WRITE: u16 = 2;
const VIRTQ_USED_F_NO_NOTIFY: u16 = 1;
/// Largest queue size of a split virtqueue.
pub const MAX_QUEUE_SIZE: u16 = 32768;

/// Errors of a split virtqueue.
#[derive(Debug, thiserror::Error)]
pub enum VirtqError {
    /// Size zero, not a power of two, or above [`MAX_QUEUE_SIZE`].
    #[error("invalid queue size {0}")]
    BadSize(u16),
    /// The ring memory could not be allocated.
    #[error("cannot allocate the rings: {0}")]
    Dma(#[source] DmaError),
    /// The ring memory is not contiguous in guest-physical space.
    #[error("the ring memory is not guest-physically contiguous")]
    NotContiguous,
    /// A chain with no buffer, or a buffer of length zero.
    #[error("a chain needs at least one buffer and no empty buffer")]
    EmptyChain,
    /// Not enough free descriptors for the chain.
    #[error("chain of {needed} descriptors, {free} free")]
    Full {
        /// Descriptors the chain needs.
        needed: usize,
        /// Descriptors free.
        free: u16,
    },
    /// The device returned an id that names no outstanding chain.
    #[error("the device returned descriptor {0}, which is not an outstanding chain head")]
    BadUsedId(u32),
}

/// One buffer of a chain, by guest-physical address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffer {
    /// Guest-physical address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
}

/// A chain the device has finished with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsedElement {
    /// Head descriptor index (as returned by [`SplitQueue::add`]).
    pub head: u16,
    /// Bytes the device wrote into the device-writable buffers.
    pub len: u32,
}

/// Addresses of the three ring parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingAddresses {
    /// Descriptor table.
    pub desc: u64,
    /// Available ring.
    pub avail: u64,
    /// Used ring.
    pub used: u64,
}

#[derive(Clone, Copy)]
struct Layout {
    avail: usize,
    used: usize,
    total: usize,
}

impl Layout {
    fn new(size: u16) -> Self {
        let size = usize::from(size);
        let avail = size * DESC_SIZE;
        // flags, idx, ring[size], used_event
        let avail_len = 4 + 2 * size + 2;
        let used = (avail + avail_len).next_multiple_of(4);
        // flags, idx, ring[size] of (id: u32, len: u32), avail_event
        let used_len = 4 + 8 * size + 2;
        Layout {
            avail,
            used,
            total: used + used_len,
        }
    }
}

/// The driver side of one split virtqueue.
pub struct SplitQueue {
    size: u16,
    memory: DmaBuffer,
    base: NonNull<u8>,
    layout: Layout,
    guest: RingAddresses,
    event_idx: bool,
    /// Driver-private free list: `next_free[i]` follows descriptor `i`.
    next_free: Vec<u16>,
    free_head: u16,
    num_free: u16,
    /// Descriptors in the chain headed by each index (0: not a head in flight).
    chain_len: Vec<u16>,
    /// Shadow of avail.idx (the driver is its only writer).
    avail_idx: u16,
    /// avail.idx at the last notification decision.
    notified_avail_idx: u16,
    /// Next used-ring entry to read.
    last_used_idx: u16,
}

// SAFETY: `base` points into `memory`, which is Send; the queue is used through `&mut self`.
unsafe impl Send for SplitQueue {}
// SAFETY: methods taking `&self` only read driver-private fields; every access to the shared
// rings goes through `&mut self`.
unsafe impl Sync for SplitQueue {}

impl SplitQueue {
    /// Allocates the rings of a queue of `size` entries. `event_idx` must match whether
    /// VIRTIO_F_EVENT_IDX was negotiated.
    pub fn new(dma: &dyn DmaMemory, size: u16, event_idx: bool) -> Result<Self, VirtqError> {
        if size == 0 || !size.is_power_of_two() || size > MAX_QUEUE_SIZE {
            return Err(VirtqError::BadSize(size));
        }
        let layout = Layout::new(size);
        let memory = dma
            .alloc(layout.total, DESC_SIZE)
            .map_err(VirtqError::Dma)?;
        let desc = first_page_address(dma, &memory)?;
        let base = memory.as_non_null();
        let guest = RingAddresses {
            desc,
            avail: desc + layout.avail as u64,
            used: desc + layout.used as u64,
        };
        Ok(SplitQueue {
            size,
            memory,
            base,
            layout,
            guest,
            event_idx,
            next_free: (1..=size).collect(),
            free_head: 0,
            num_free: size,
            chain_len: vec![0; usize::from(size)],
            avail_idx: 0,
            notified_avail_idx: 0,
            last_used_idx: 0,
        })
    }

    /// Number of entries.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Guest-physical addresses of the rings (what a device is told).
    pub fn guest_addresses(&self) -> RingAddresses {
        self.guest
    }

    /// Addresses of the rings in this process (what a vhost-user backend is told).
    pub fn host_addresses(&self) -> RingAddresses {
        let base = self.memory.as_ptr() as u64;
        RingAddresses {
            desc: base,
            avail: base + self.layout.avail as u64,
            used: base + self.layout.used as u64,
        }
    }

    /// Free descriptors.
    pub fn num_free(&self) -> u16 {
        self.num_free
    }

    /// Puts a chain of `readable` then `writable` buffers on the available ring and publishes
    /// it. Returns the head index, which [`SplitQueue::pop_used`] reports when the device is
    /// done. Call [`SplitQueue::should_notify`] afterwards to learn whether to kick.
    pub fn add(&mut self, readable: &[Buffer], writable: &[Buffer]) -> Result<u16, VirtqError> {
        let needed = readable.len() + writable.len();
        if needed == 0 || readable.iter().chain(writable).any(|b| b.len == 0) {
            return Err(VirtqError::EmptyChain);
        }
        if needed > usize::from(self.num_free) {
            return Err(VirtqError::Full {
                needed,
                free: self.num_free,
            });
        }
        let head = self.free_head;
        let mut index = head;
        let buffers = readable
            .iter()
            .map(|b| (b, 0))
            .chain(writable.iter().map(|b| (b, VIRTQ_DESC_F_WRITE)));
        for (position, (buffer, write_flag)) in buffers.enumerate() {
            let next = self.next_free[usize::from(index)];
            let last = position + 1 == needed;
            let flags = write_flag | if last { 0 } else { VIRTQ_DESC_F_NEXT };
            self.write_descriptor(index, buffer, flags, if last { 0 } else { next });
            if !last {
                index = next;
            }
        }
        self.free_head = self.next_free[usize::from(index)];
        self.num_free -= needed as u16;
        self.chain_len[usize::from(head)] = needed as u16;

        let slot = usize::from(self.avail_idx % self.size);
        // SAFETY: the avail ring entry `slot` is inside the ring memory; only the driver
        // writes it, and the device reads it only after the Release store of avail.idx below.
        unsafe {
            self.avail_ring_ptr(slot).write_volatile(head.to_le());
        }
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.avail_idx_atomic()
            .store(self.avail_idx.to_le(), Ordering::Release);
        Ok(head)
    }

    /// Whether the device wants a notification for the chains published since the last call
    /// (VIRTIO 2.7.10: avail_event with EVENT_IDX, the used ring's NO_NOTIFY flag without).
    pub fn should_notify(&mut self) -> bool {
        // The avail.idx store must be visible before the device's suppression state is read.
        fence(Ordering::SeqCst);
        let new = self.avail_idx;
        let old = std::mem::replace(&mut self.notified_avail_idx, new);
        if self.event_idx {
            // SAFETY: avail_event is the last field of the used ring, inside the ring memory.
            let event = u16::from_le(unsafe { self.avail_event_ptr().read_volatile() });
            need_event(event, new, old)
        } else {
            // SAFETY: used.flags is the first field of the used ring.
            let flags = u16::from_le(unsafe { self.used_ptr().cast::<u16>().read_volatile() });
            flags & VIRTQ_USED_F_NO_NOTIFY == 0
        }
    }

    /// The next chain the device has finished with, if any. Its descriptors are free again.
    pub fn pop_used(&mut self) -> Result<Option<UsedElement>, VirtqError> {
        let used_idx = u16::from_le(self.used_idx_atomic().load(Ordering::Acquire));
        if used_idx == self.last_used_idx {
            return Ok(None);
        }
        let slot = usize::from(self.last_used_idx % self.size);
        // SAFETY: used ring entry `slot` is inside the ring memory; the Acquire load above
        // orders this read after the device's write of the entry.
        let (id, len) = unsafe {
            let entry = self.used_ring_ptr(slot);
            (
                u32::from_le(entry.read_volatile()),
                u32::from_le(entry.add(1).read_volatile()),
            )
        };
        let head = u16::try_from(id)
            .ok()
            .filter(|&head| head < self.size && self.chain_len[usize::from(head)] != 0)
            .ok_or(VirtqError::BadUsedId(id))?;
        self.last_used_idx = self.last_used_idx.wrapping_add(1);
        self.free_chain(head);
        Ok(Some(UsedElement { head, len }))
    }

    /// Asks the device to notify when it uses the next chain. Returns true if used chains are
    /// already waiting (the caller should pop them instead of sleeping).
    pub fn enable_interrupts(&mut self) -> bool {
        self.enable_interrupts_after(1)
    }

    /// Like [`enable_interrupts`](Self::enable_interrupts), but with EVENT_IDX asks to be
    /// notified only when the `count`-th next chain is used (at least the next one), e.g. the
    /// last of a batch whose answers are all awaited anyway.
    pub fn enable_interrupts_after(&mut self, count: u16) -> bool {
        if self.event_idx {
            let event = self.last_used_idx.wrapping_add(count.max(1) - 1);
            // SAFETY: used_event is the last field of the avail ring, written only by the
            // driver.
            unsafe {
                self.used_event_ptr().write_volatile(event.to_le());
            }
        }
        // The used_event store must be visible before used.idx is read again, or a completion
        // in between would never be notified.
        fence(Ordering::SeqCst);
        u16::from_le(self.used_idx_atomic().load(Ordering::Acquire)) != self.last_used_idx
    }

    fn free_chain(&mut self, head: u16) {
        let len = std::mem::take(&mut self.chain_len[usize::from(head)]);
        // Walk the chain through the driver's own free-list links: descriptors were taken
        // from the free list in order, so `next_free` still links the chain's members.
        let mut last = head;
        for _ in 1..len {
            last = self.next_free[usize::from(last)];
        }
        self.next_free[usize::from(last)] = self.free_head;
        self.free_head = head;
        self.num_free += len;
    }

    fn write_descriptor(&mut self, index: u16, buffer: &Buffer, flags: u16, next: u16) {
        let offset = usize::from(index) * DESC_SIZE;
        // SAFETY: descriptor `index` (< size) is inside the table at the start of the ring
        // memory; the device reads it only after the chain is published (Release store).
        unsafe {
            let desc = self.base.as_ptr().add(offset);
            desc.cast::<u64>().write_volatile(buffer.addr.to_le());
            desc.add(8).cast::<u32>().write_volatile(buffer.len.to_le());
            desc.add(12).cast::<u16>().write_volatile(flags.to_le());
            desc.add(14).cast::<u16>().write_volatile(next.to_le());
        }
    }

    fn avail_ptr(&self) -> *mut u16 {
        // SAFETY: `layout.avail` is inside the ring memory.
        unsafe { self.base.as_ptr().add(self.layout.avail).cast() }
    }

    fn avail_ring_ptr(&self, slot: usize) -> *mut u16 {
        // SAFETY: ring[slot] with slot < size is inside the avail ring.
        unsafe { self.avail_ptr().add(2 + slot) }
    }

    fn used_event_ptr(&self) -> *mut u16 {
        // SAFETY: used_event follows ring[size] in the avail ring.
        unsafe { self.avail_ptr().add(2 + usize::from(self.size)) }
    }

    fn used_ptr(&self) -> *mut u8 {
        // SAFETY: `layout.used` is inside the ring memory.
        unsafe { self.base.as_ptr().add(self.layout.used) }
    }

    fn used_ring_ptr(&self, slot: usize) -> *mut u32 {
        // SAFETY: ring[slot] (8 bytes each, after flags and idx) with slot < size is inside
        // the used ring.
        unsafe { self.used_ptr().add(4 + 8 * slot).cast() }
    }

    fn avail_event_ptr(&self) -> *mut u16 {
        // SAFETY: avail_event follows ring[size] in the used ring.
        unsafe { self.used_ptr().add(4 + 8 * usize::from(self.size)).cast() }
    }

    fn avail_idx_atomic(&self) -> &AtomicU16 {
        // SAFETY: avail.idx is 2-byte aligned (ring memory is page aligned, the avail ring
        // starts at a multiple of 16), lives as long as `self`, and is accessed only
        // atomically by both sides.
        unsafe { AtomicU16::from_ptr(self.avail_ptr().add(1)) }
    }

    fn used_idx_atomic(&self) -> &AtomicU16 {
        // SAFETY: used.idx is 2-byte aligned (used ring 4-byte aligned), lives as long as
        // `self`, and is accessed only atomically by both sides.
        unsafe { AtomicU16::from_ptr(self.used_ptr().add(2).cast()) }
    }
}

/// VIRTIO's vring_need_event: did the index move past `event` going from `old` to `new`?
fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

fn first_page_address(dma: &dyn DmaMemory, memory: &DmaBuffer) -> Result<u64, VirtqError> {
    let pages = dma
        .translate(memory.as_ptr(), memory.len())
        .map_err(VirtqError::Dma)?;
    let first = *pages.first().ok_or(VirtqError::NotContiguous)?;
    let contiguous = pages
        .iter()
        .enumerate()
        .all(|(i, &page)| page == first + (i * PAGE_SIZE) as u64);
    if !contiguous {
        return Err(VirtqError::NotContiguous);
    }
    Ok(first)
}

#[cfg(test)]
pub(crate) mod test_device;

#[cfg(test)]
mod tests {
    use super::test_device::RingDevice;
    use super::*;
    use crate::transport::process::ProcessDma;

    fn buffer(addr: u64, len: u32) -> Buffer {
        Buffer { addr, len }
    }

    #[test]
    fn chain_layout_and_completion() {
        let dma = ProcessDma::new(1 << 20).unwrap();
        let mut queue = SplitQueue::new(&dma, 8, false).unwrap();
        let head = queue
            .add(
                &[buffer(0x1000, 10), buffer(0x2000, 20)],
                &[buffer(0x3000, 30)],
            )
            .unwrap();
        assert_eq!(queue.num_free(), 5);
        let mut device = RingDevice::new(dma.guest_ram(), &queue);
        let (seen_head, chain) = device.pop().unwrap();
        assert_eq!(seen_head, head);
        assert_eq!(
            chain,
            vec![
                (0x1000, 10, VIRTQ_DESC_F_NEXT),
                (0x2000, 20, VIRTQ_DESC_F_NEXT),
                (0x3000, 30, VIRTQ_DESC_F_WRITE)
            ]
        );
        assert!(device.pop().is_none());
        device.push_used(u32::from(head), 7);
        assert_eq!(
            queue.pop_used().unwrap(),
            Some(UsedElement { head, len: 7 })
        );
        assert_eq!(queue.num_free(), 8);
        assert_eq!(queue.pop_used().unwrap(), None);
    }

    #[test]
    fn descriptors_are_recycled_across_many_wraps() {
        let dma = ProcessDma::new(1 << 20).unwrap();
        let mut queue = SplitQueue::new(&dma, 4, false).unwrap();
        let mut device = RingDevice::new(dma.guest_ram(), &queue);
        for _ in 0..100 {
            let a = queue
                .add(&[buffer(0x1000, 1)], &[buffer(0x2000, 2)])
                .unwrap();
            let b = queue.add(&[buffer(0x3000, 3)], &[]).unwrap();
            assert!(matches!(
                queue.add(&[buffer(1, 1)], &[buffer(1, 1), buffer(1, 1)]),
                Err(VirtqError::Full { needed: 3, free: 1 })
            ));
            assert_eq!(device.pop().unwrap().0, a);
            assert_eq!(device.pop().unwrap().0, b);
            // Complete out of order.
            device.push_used(u32::from(b), 0);
            device.push_used(u32::from(a), 2);
            assert_eq!(queue.pop_used().unwrap().unwrap().head, b);
            assert_eq!(queue.pop_used().unwrap().unwrap().head, a);
            assert_eq!(queue.num_free(), 4);
        }
    }

    #[test]
    fn bogus_used_ids_are_rejected() {
        let dma = ProcessDma::new(1 << 20).unwrap();
        let mut queue = SplitQueue::new(&dma, 4, false).unwrap();
        let head = queue.add(&[buffer(0x1000, 1)], &[]).unwrap();
        let mut device = RingDevice::new(dma.guest_ram(), &queue);
        device.push_used(u32::from(head) + 1, 0);
        assert!(matches!(queue.pop_used(), Err(VirtqError::BadUsedId(_))));
        let mut device = RingDevice::new(dma.guest_ram(), &queue);
        device.push_used(99, 0);
        assert!(matches!(queue.pop_used(), Err(VirtqError::BadUsedId(99))));
    }

    #[test]
    fn event_idx_notification_decisions() {
        let dma = ProcessDma::new(1 << 20).unwrap();
        let mut queue = SplitQueue::new(&dma, 8, true).unwrap();
        let device = RingDevice::new(dma.guest_ram(), &queue);
        device.set_avail_event(0);
        queue.add(&[buffer(0x1000, 1)], &[]).unwrap();
        // avail idx went 0 -> 1 and the device asked for a kick at index 0.
        assert!(queue.should_notify());
        queue.add(&[buffer(0x1000, 1)], &[]).unwrap();
        // 1 -> 2, device still wants index 0: already notified.
        assert!(!queue.should_notify());
        let device = RingDevice::new(dma.guest_ram(), &queue);
        device.set_avail_event(3);
        queue.add(&[buffer(0x1000, 1)], &[]).unwrap();
        assert!(!queue.should_notify(), "2 -> 3 does not pass event 3");
        queue.add(&[buffer(0x1000, 1)], &[]).unwrap();
        assert!(queue.should_notify(), "3 -> 4 passes event 3");
    }

    #[test]
    fn enable_interrupts_reports_pending_completions() {
        let dma = ProcessDma::new(1 << 20).unwrap();
        let mut queue = SplitQueue::new(&dma, 8, true).unwrap();
        let head = queue.add(&[buffer(0x1000, 1)], &[]).unwrap();
        assert!(!queue.enable_interrupts());
        let mut device = RingDevice::new(dma.guest_ram(), &queue);
        device.pop().unwrap();
        device.push_used(u32::from(head), 0);
        assert!(queue.enable_interrupts());
        queue.pop_used().unwrap().unwrap();
        assert!(!queue.enable_interrupts());
        assert_eq!(RingDevice::new(dma.guest_ram(), &queue).used_event(), 1);
    }

    #[test]
    fn invalid_arguments() {
        let dma = ProcessDma::new(1 << 20).unwrap();
        assert!(matches!(
            SplitQueue::new(&dma, 3, false),
            Err(VirtqError::BadSize(3))
        ));
        let mut queue = SplitQueue::new(&dma, 2, false).unwrap();
        assert!(matches!(queue.add(&[], &[]), Err(VirtqError::EmptyChain)));
        assert!(matches!(
            queue.add(&[buffer(1, 0)], &[]),
            Err(VirtqError::EmptyChain)
        ));
        assert_eq!(queue.num_free(), 2);
    }

    #[test]
    fn need_event_matches_virtio() {
        assert!(need_event(0, 1, 0));
        assert!(!need_event(1, 1, 0));
        assert!(need_event(5, 10, 0));
        assert!(need_event(u16::MAX, 1, u16::MAX - 1));
        assert!(!need_event(3, 3, 3));
    }
}

//! The device's side of a split virtqueue, for tests: it finds the rings where the driver
//! published them in guest RAM (as a device does), reads available chains and their buffers,
//! and writes answers and used entries, from any thread.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;

use super::{need_event, RingAddresses, SplitQueue, DESC_SIZE, VIRTQ_DESC_F_NEXT};
use crate::dma::MemfdRam;

/// A chain as the device sees it: its head and each descriptor's (address, length, flags).
pub(crate) type SeenChain = (u16, Vec<(u64, u32, u16)>);

/// Plays the device of one queue, through guest RAM only.
pub(crate) struct RingDevice {
    ram: Arc<MemfdRam>,
    rings: RingAddresses,
    size: u16,
    next_avail: u16,
    used_idx: u16,
}

impl RingDevice {
    /// The device of `queue`, whose rings live in `ram`.
    pub(crate) fn new(ram: &Arc<MemfdRam>, queue: &SplitQueue) -> Self {
        Self::at(ram, queue.guest_addresses(), queue.size())
    }

    /// The device of the queue of `size` entries whose rings the driver put at `rings` in
    /// `ram` (as it programs them into a transport's registers).
    pub(crate) fn at(ram: &Arc<MemfdRam>, rings: RingAddresses, size: u16) -> Self {
        RingDevice {
            ram: Arc::clone(ram),
            rings,
            size,
            next_avail: 0,
            used_idx: 0,
        }
    }

    /// Where guest-physical address `gpa` is in this process.
    pub(crate) fn host(&self, gpa: u64) -> *mut u8 {
        let offset = gpa
            .checked_sub(self.ram.guest_base())
            .filter(|&offset| offset < self.ram.len() as u64)
            .unwrap_or_else(|| panic!("{gpa:#x} is outside guest RAM"));
        // SAFETY: the offset is inside the RAM mapping.
        unsafe { self.ram.host_base().add(offset as usize) }
    }

    fn u16_at(&self, gpa: u64) -> u16 {
        // SAFETY: test-only read of ring memory inside guest RAM.
        u16::from_le(unsafe { self.host(gpa).cast::<u16>().read_volatile() })
    }

    fn atomic_u16(&self, gpa: u64) -> &AtomicU16 {
        // SAFETY: ring indices are 2-byte aligned, live as long as the RAM (held here), and
        // both sides access them atomically.
        unsafe { AtomicU16::from_ptr(self.host(gpa).cast()) }
    }

    /// The next available chain, if the driver published one.
    pub(crate) fn pop(&mut self) -> Option<SeenChain> {
        let avail_idx = u16::from_le(
            self.atomic_u16(self.rings.avail + 2)
                .load(Ordering::Acquire),
        );
        if avail_idx == self.next_avail {
            return None;
        }
        let slot = u64::from(self.next_avail % self.size);
        let head = self.u16_at(self.rings.avail + 4 + 2 * slot);
        self.next_avail = self.next_avail.wrapping_add(1);
        let mut chain = Vec::new();
        let mut index = head;
        loop {
            let desc = self.host(self.rings.desc + u64::from(index) * DESC_SIZE as u64);
            // SAFETY: test-only read of a descriptor inside the table.
            let (addr, len, flags, next) = unsafe {
                (
                    u64::from_le(desc.cast::<u64>().read_volatile()),
                    u32::from_le(desc.add(8).cast::<u32>().read_volatile()),
                    u16::from_le(desc.add(12).cast::<u16>().read_volatile()),
                    u16::from_le(desc.add(14).cast::<u16>().read_volatile()),
                )
            };
            chain.push((addr, len, flags));
            if flags & VIRTQ_DESC_F_NEXT == 0 {
                break;
            }
            index = next;
        }
        Some((head, chain))
    }

    /// The driver's avail index: how many chains it has made available in all.
    pub(crate) fn avail_idx(&self) -> u16 {
        u16::from_le(
            self.atomic_u16(self.rings.avail + 2)
                .load(Ordering::Acquire),
        )
    }

    /// Index of the next available entry the device will take.
    pub(crate) fn next_avail(&self) -> u16 {
        self.next_avail
    }

    /// Publishes a used entry; returns whether the driver asked to be notified of it (always
    /// without EVENT_IDX's used_event, which a test then ignores).
    pub(crate) fn push_used(&mut self, id: u32, len: u32) -> bool {
        let old = self.used_idx;
        let entry = self.host(self.rings.used + 4 + 8 * u64::from(self.used_idx % self.size));
        // SAFETY: test-only write of a used entry inside the ring.
        unsafe {
            entry.cast::<u32>().write_volatile(id.to_le());
            entry.add(4).cast::<u32>().write_volatile(len.to_le());
        }
        self.used_idx = self.used_idx.wrapping_add(1);
        self.atomic_u16(self.rings.used + 2)
            .store(self.used_idx.to_le(), Ordering::Release);
        // The used index must be visible before the driver's used_event is read.
        std::sync::atomic::fence(Ordering::SeqCst);
        need_event(self.used_event(), self.used_idx, old)
    }

    /// Asks the driver for a notification once it publishes entry `value` (EVENT_IDX).
    pub(crate) fn set_avail_event(&self, value: u16) {
        let at = self.rings.used + 4 + 8 * u64::from(self.size);
        // SAFETY: test-only write of avail_event, inside the used ring.
        unsafe { self.host(at).cast::<u16>().write_volatile(value.to_le()) };
    }

    /// The driver's used_event (EVENT_IDX): the used index it wants a notification at.
    pub(crate) fn used_event(&self) -> u16 {
        self.u16_at(self.rings.avail + 4 + 2 * u64::from(self.size))
    }

    /// The bytes of a device-readable buffer.
    pub(crate) fn read(&self, addr: u64, len: u32) -> Vec<u8> {
        let mut bytes = vec![0; len as usize];
        // SAFETY: test-only copy out of guest RAM (bounds checked by `host` at both ends).
        unsafe {
            self.host(addr + u64::from(len.max(1)) - 1);
            std::ptr::copy_nonoverlapping(self.host(addr), bytes.as_mut_ptr(), bytes.len());
        }
        bytes
    }

    /// Writes `bytes` into a device-writable buffer.
    pub(crate) fn write(&self, addr: u64, bytes: &[u8]) {
        // SAFETY: test-only copy into guest RAM (bounds checked by `host` at both ends).
        unsafe {
            self.host(addr + bytes.len().max(1) as u64 - 1);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.host(addr), bytes.len());
        }
    }
}

//! The driver's side of the doorbell area (spec §5.3): memory the device can reach, laid out
//! by [`vrdma_spec::doorbell`], registered once per context with SET_DOORBELL_AREA.

use std::sync::atomic::AtomicU32;

use vrdma_spec::doorbell::{self, DoorbellArea};

use super::error::{ProtocolError, Result, VerbsError};
use crate::dma::{DmaBuffer, DmaMemory, PAGE_SIZE};
use crate::transport::SharedDoorbellArea;

/// The doorbell area of one context.
pub(crate) struct DoorbellRegion {
    // Declared first: a view into `buffer`, which must outlive it (it has no drop glue, but
    // the order documents the dependency).
    area: DoorbellArea<'static>,
    /// `VRDMA_F_DOORBELL_POLL` was negotiated: skip notifications while the device polls.
    device_may_poll: bool,
    gpa: u64,
    /// The memory of an area this context allocated; `None` for a shared area, whose
    /// mapping the transport keeps.
    _buffer: Option<DmaBuffer>,
}

impl DoorbellRegion {
    /// Allocates and zeroes an area of `slots` entries in memory the device reaches by DMA.
    /// `device_may_poll`: whether `VRDMA_F_DOORBELL_POLL` was negotiated.
    pub(crate) fn new(dma: &dyn DmaMemory, slots: u32, device_may_poll: bool) -> Result<Self> {
        let bad_slots = || ProtocolError::ConfigValue {
            field: "doorbell_slots",
            value: slots.into(),
        };
        if slots == 0 || !slots.is_power_of_two() || slots > doorbell::MAX_SLOTS {
            return Err(bad_slots().into());
        }
        let len = doorbell::area_bytes(slots);
        let buffer = dma.alloc(len, PAGE_SIZE)?;
        // SAFETY: the buffer is ours, `len` bytes long and not yet known to the device.
        unsafe { std::ptr::write_bytes(buffer.as_mut_ptr(), 0, len) };
        // SET_DOORBELL_AREA names one guest-physical address: the pages must be contiguous.
        let pages = dma.translate(buffer.as_ptr(), len)?;
        let gpa = *pages.first().ok_or(VerbsError::Unsupported(
            "the transport returned no page for the doorbell area",
        ))?;
        let contiguous = pages
            .iter()
            .enumerate()
            .all(|(i, &page)| page == gpa + (i * PAGE_SIZE) as u64);
        if !contiguous || gpa % PAGE_SIZE as u64 != 0 {
            return Err(VerbsError::Unsupported(
                "the transport cannot allocate a physically contiguous doorbell area",
            ));
        }
        let words_ptr = buffer.as_ptr().cast::<AtomicU32>();
        // SAFETY: the buffer is page aligned (so 4-byte aligned), `len` bytes long and zeroed;
        // it is only ever accessed atomically from here on (by us and by the device). The
        // 'static lifetime is confined to this struct, which owns the buffer and hands the
        // area out only borrowed from `&self`.
        let words: &'static [AtomicU32] = unsafe { std::slice::from_raw_parts(words_ptr, len / 4) };
        let area = DoorbellArea::new(words, slots).map_err(|_| bad_slots())?;
        Ok(DoorbellRegion {
            area,
            device_may_poll,
            gpa,
            _buffer: Some(buffer),
        })
    }

    /// The area another process registered and shares with this one (the guest agent's).
    /// The transport that returned `shared` must outlive the region (the context holds both).
    pub(crate) fn shared(
        shared: SharedDoorbellArea,
        slots: u32,
        device_may_poll: bool,
    ) -> Result<Self> {
        let bad_area = || ProtocolError::ConfigValue {
            field: "doorbell_slots",
            value: slots.into(),
        };
        if slots == 0 || !slots.is_power_of_two() || slots > doorbell::MAX_SLOTS {
            return Err(bad_area().into());
        }
        let len = doorbell::area_bytes(slots);
        if shared.len < len || !(shared.base.as_ptr() as usize).is_multiple_of(PAGE_SIZE) {
            return Err(bad_area().into());
        }
        // SAFETY: the transport maps `shared.len >= len` bytes at the page-aligned `base` for
        // as long as it lives, which is longer than this region (the context drops the
        // region first); the area is only ever accessed atomically, by every process that
        // shares it and by the device.
        let words: &'static [AtomicU32] =
            unsafe { std::slice::from_raw_parts(shared.base.as_ptr().cast(), len / 4) };
        let area = DoorbellArea::new(words, slots).map_err(|_| bad_area())?;
        Ok(DoorbellRegion {
            area,
            device_may_poll,
            gpa: shared.gpa,
            _buffer: None,
        })
    }

    /// Guest-physical address to register.
    pub(crate) fn gpa(&self) -> u64 {
        self.gpa
    }

    /// Slot count.
    pub(crate) fn slots(&self) -> u32 {
        self.area.slots()
    }

    /// Queues doorbell `index`; true if the device must be notified (see
    /// [`DoorbellArea::ring`], and [`DoorbellArea::ring_polled`] when the device may poll).
    pub(crate) fn ring(&self, index: u32) -> bool {
        if self.device_may_poll {
            self.area.ring_polled(index)
        } else {
            self.area.ring(index)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ptr::NonNull;

    use super::*;
    use crate::dma::MemfdRam;
    use vrdma_spec::doorbell::{RING_WORD, TAIL_WORD};

    #[test]
    fn a_shared_area_is_rung_in_the_memory_it_shares() {
        let ram = MemfdRam::new(2 * PAGE_SIZE).unwrap();
        let base = NonNull::new(ram.host_base()).unwrap();
        let shared = |len| SharedDoorbellArea {
            base,
            len,
            gpa: 0x7000,
        };
        // 64 slots need 128 + 8 · 64 bytes.
        assert!(DoorbellRegion::shared(shared(600), 64, false).is_err());
        assert!(DoorbellRegion::shared(shared(PAGE_SIZE), 48, false).is_err());
        let region = DoorbellRegion::shared(shared(PAGE_SIZE), 64, false).unwrap();
        assert_eq!((region.gpa(), region.slots()), (0x7000, 64));
        assert!(region.ring(5), "the first ring of a QP notifies");
        assert!(!region.ring(5), "a QP already queued does not");
        // What another process (or the device) sees in the shared pages.
        let words = base.as_ptr().cast::<u32>();
        // SAFETY: both words lie in the first page of the mapping `ram` keeps.
        let (tail, first) = unsafe { (*words.add(TAIL_WORD), *words.add(RING_WORD)) };
        assert_eq!((tail, first), (1, 6));
    }
}

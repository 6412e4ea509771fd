//! The driver's side of the doorbell area (spec §5.3): memory the device can reach, laid out
//! by [`vrdma_spec::doorbell`], registered once per context with SET_DOORBELL_AREA.

use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use vrdma_spec::doorbell::{self, DoorbellArea};

use super::error::{ProtocolError, Result, VerbsError};
use crate::dma::{DmaBuffer, DmaMemory, PAGE_SIZE};
use crate::transport::Transport;

/// The doorbell area of one context.
pub(crate) struct DoorbellRegion {
    // Declared first: a view into `buffer`, which must outlive it (it has no drop glue, but
    // the order documents the dependency).
    area: DoorbellArea<'static>,
    /// `VRDMA_F_DOORBELL_POLL` was negotiated: skip notifications while the device polls.
    device_may_poll: bool,
    gpa: u64,
    /// The area's memory when this context allocated it.
    _buffer: Option<DmaBuffer>,
    /// The transport that maps an area someone else registered: kept alive (so the area
    /// mapped) for as long as `area` borrows it.
    _mapped_by: Option<Arc<dyn Transport>>,
}

fn bad_slots(slots: u32) -> ProtocolError {
    ProtocolError::ConfigValue {
        field: "doorbell_slots",
        value: slots.into(),
    }
}

/// The configuration's `doorbell_slots` must be a power of two within the spec's bound.
fn check_slots(slots: u32) -> Result<()> {
    if slots == 0 || !slots.is_power_of_two() || slots > doorbell::MAX_SLOTS {
        return Err(bad_slots(slots).into());
    }
    Ok(())
}

impl DoorbellRegion {
    /// Allocates and zeroes an area of `slots` entries in memory the device reaches by DMA.
    /// `device_may_poll`: whether `VRDMA_F_DOORBELL_POLL` was negotiated.
    pub(crate) fn new(dma: &dyn DmaMemory, slots: u32, device_may_poll: bool) -> Result<Self> {
        check_slots(slots)?;
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
        let area = DoorbellArea::new(words, slots).map_err(|_| bad_slots(slots))?;
        Ok(DoorbellRegion {
            area,
            device_may_poll,
            gpa,
            _buffer: Some(buffer),
            _mapped_by: None,
        })
    }

    /// The area someone else registered (the guest agent, for every process it serves), as
    /// `transport` maps it ([`Transport::registered_doorbell_area`]); `None` if it maps none.
    pub(crate) fn registered(
        transport: &Arc<dyn Transport>,
        slots: u32,
        device_may_poll: bool,
    ) -> Result<Option<Self>> {
        let Some((base, len)) = transport.registered_doorbell_area() else {
            return Ok(None);
        };
        check_slots(slots)?;
        let needed = doorbell::area_bytes(slots);
        if len < needed || !(base.as_ptr() as usize).is_multiple_of(PAGE_SIZE) {
            return Err(VerbsError::Unsupported(
                "the doorbell area the transport maps is too small or misaligned",
            ));
        }
        // SAFETY: page aligned, at least `needed` bytes, mapped while the transport lives
        // (its promise), which this value keeps alive; the area is accessed only atomically,
        // here, by the other processes of the agent and by the device.
        let words: &'static [AtomicU32] =
            unsafe { std::slice::from_raw_parts(base.as_ptr().cast::<AtomicU32>(), needed / 4) };
        let area = DoorbellArea::new(words, slots).map_err(|_| bad_slots(slots))?;
        Ok(Some(DoorbellRegion {
            area,
            device_may_poll,
            gpa: 0,
            _buffer: None,
            _mapped_by: Some(transport.clone()),
        }))
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

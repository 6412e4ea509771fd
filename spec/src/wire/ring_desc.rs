//! How a [`RingDesc`] is checked: against the ring format it names and the queue region it
//! lies in, before a driver touches the mapping (spec §6).

use super::{ring_flags, RingDesc};
use crate::rxe_v1::{GeometryError, RingGeometry, FORMAT_ID};
use crate::{Le32, Le64};

impl RingDesc {
    /// With [`ring_flags::HOST_KICK`]: the QP handle a host kick of this send queue names.
    pub fn host_kick_handle(&self) -> Option<u32> {
        if self.flags.get() & ring_flags::HOST_KICK == 0 {
            return None;
        }
        u32::try_from(self.db_offset.get()).ok()
    }

    /// Marks a directly mapped send queue as kickable by the driver, naming `qp_handle`, the
    /// QP's handle in the host verbs context (`VRDMA_F_HOST_KICK`).
    pub fn set_host_kick(&mut self, qp_handle: u32) {
        self.flags = Le32::new(self.flags.get() | ring_flags::HOST_KICK);
        self.db_offset = Le64::new(qp_handle.into());
    }

    /// The geometry the description gives an rxe v1 ring, checked alone (not against a
    /// region: see [`Self::check_rxe_v1`]).
    pub fn rxe_v1_geometry(&self) -> Result<RingGeometry, GeometryError> {
        let format = self.format.get();
        if format != FORMAT_ID {
            return Err(GeometryError::Format(format));
        }
        RingGeometry::new(self.num_slots.get(), self.log2_slot_size.get())
    }

    /// Checks a ring description from a create response against the queue region
    /// (`region_size`, `page_size`) before the driver touches the mapping; returns the ring's
    /// geometry.
    pub fn check_rxe_v1(
        &self,
        region_size: u64,
        page_size: u64,
    ) -> Result<RingGeometry, GeometryError> {
        let geometry = self.rxe_v1_geometry()?;
        let kick = self.flags.get() & ring_flags::HOST_KICK != 0;
        let kick_handle_fits = kick && self.flags.get() & ring_flags::STAGED == 0;
        let db_offset_ok = match self.db_offset.get() {
            0 => true,
            handle => kick_handle_fits && u32::try_from(handle).is_ok(),
        };
        if self.db_len.get() != 0 || !db_offset_ok || (kick && !kick_handle_fits) {
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
        match off.checked_add(len) {
            Some(end) if end <= region_size && geometry.buffer_len() <= len => Ok(geometry),
            _ => Err(GeometryError::Bounds),
        }
    }
}

//! How a [`RingDesc`] is checked: against the ring format it names and the queue region it
//! lies in, before a driver touches the mapping (spec §6).

use super::RingDesc;
use crate::rxe_v1::{GeometryError, RingGeometry, FORMAT_ID};

impl RingDesc {
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
        match off.checked_add(len) {
            Some(end) if end <= region_size && geometry.buffer_len() <= len => Ok(geometry),
            _ => Err(GeometryError::Bounds),
        }
    }
}

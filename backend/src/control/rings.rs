//! Host queue buffers in the guest's queue region (spec §6): placement, SHMEM_MAP, the
//! `RingDesc` that describes them, and their removal.
//!
//! rxe lets a buffer be mapped exactly once. A directly mapped queue's one mapping must be the
//! frontend's, so the backend does not map it, and the geometry the guest needs (slot count and
//! stride) cannot be read from the buffer's header here (a staged queue's buffer is mapped by
//! the backend instead, `staged_rings.rs`, and the guest never sees it); it follows from the capacities the host
//! reported and rxe's allocation rule (spec §9.1: `num_slots = roundup_pow_of_two(depth + 1)`,
//! slots a power of two of at least one cache line, the buffer the page-rounded header plus
//! slots). The mapping length the host returned must agree with that geometry, which catches a
//! kernel whose slot sizes differ from what this file assumes.

use log::{debug, warn};
use vrdma_spec::features::VRDMA_F_RING_RXE_V1;
use vrdma_spec::rxe_v1::{self, RingGeometry, MAX_LOG2_SLOT_SIZE, MIN_LOG2_SLOT_SIZE};
use vrdma_spec::wire::RingDesc;
use vrdma_spec::{Le32, Le64};

use super::error::CommandError;
use super::session::Session;
use crate::host::QueueBuffer;
use crate::memory::queue_region::{MappedRing, ShmAllocator, ShmRange};
use crate::vhost_device::guest_io::GuestIo;
use crate::vhost_device::shmem::{ShmemMapping, SHMEM_PAGE_SIZE};

/// Fails unless a ring format was negotiated that the host device produces (spec §3: without
/// one, CREATE_CQ/QP/SRQ are `UNSUPPORTED`).
pub(crate) fn require_ring_format(s: &Session<'_>) -> Result<(), CommandError> {
    s.require(VRDMA_F_RING_RXE_V1, "a ring format")?;
    if s.guest.device().ring_format() != rxe_v1::FORMAT_ID {
        return Err(CommandError::NotNegotiated("the host's ring format"));
    }
    Ok(())
}

/// log2 of the slot rxe allocates for entries of `entry_bytes`.
pub fn slot_log2(entry_bytes: usize) -> u32 {
    let rounded = entry_bytes.max(1).next_power_of_two();
    rounded.trailing_zeros().max(MIN_LOG2_SLOT_SIZE)
}

/// The page-rounded size of an rxe buffer of `geometry` (at most 2^47 bytes: no overflow).
fn buffer_len(geometry: RingGeometry) -> u64 {
    geometry.buffer_len().next_multiple_of(SHMEM_PAGE_SIZE)
}

/// The queue-region bytes a host buffer of `num_slots` slots of entries of `entry_bytes` takes
/// by rxe's allocation rule (what [`map_ring`] will place, unless the host's slots differ).
pub(crate) fn predicted_len(num_slots: u32, entry_bytes: usize) -> Option<u64> {
    RingGeometry::new(num_slots, slot_log2(entry_bytes))
        .ok()
        .map(buffer_len)
}

/// The geometry of a buffer of `len` bytes holding `num_slots` slots of entries of
/// `entry_bytes`: rxe's slot stride when it matches `len`, else the only stride that does.
pub fn slot_geometry(
    len: u64,
    num_slots: u32,
    entry_bytes: usize,
) -> Result<RingGeometry, CommandError> {
    let predicted = slot_log2(entry_bytes);
    let geometry = RingGeometry::new(num_slots, predicted)?;
    if buffer_len(geometry) == len {
        return Ok(geometry);
    }
    let mut fitting = (predicted..=MAX_LOG2_SLOT_SIZE)
        .filter_map(|log2| RingGeometry::new(num_slots, log2).ok())
        .filter(|&geometry| buffer_len(geometry) == len);
    match (fitting.next(), fitting.next()) {
        (Some(geometry), None) => {
            warn!(
                "host queue of {num_slots} slots and {len:#x} bytes uses 2^{}-byte slots, \
                 not the 2^{predicted} this backend expects for {entry_bytes}-byte entries",
                geometry.log2_slot_size()
            );
            Ok(geometry)
        }
        _ => Err(CommandError::HostAnswer(format!(
            "{len:#x} bytes do not hold {num_slots} slots of at least {entry_bytes} bytes"
        ))),
    }
}

/// Places `buffer` (holding `num_slots` slots of entries of `entry_bytes`) in the queue region
/// and has the frontend map it there. On error nothing stays allocated or mapped; the caller
/// still owns (and must destroy) the host object.
pub(crate) fn map_ring(
    s: &mut Session<'_>,
    buffer: QueueBuffer,
    num_slots: u32,
    entry_bytes: usize,
) -> Result<MappedRing, CommandError> {
    let placed = place_ring(s, buffer, num_slots, entry_bytes)?;
    map_placed(s, &[placed])?;
    Ok(placed.ring)
}

/// A host queue buffer placed in the queue region and described, not mapped yet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlacedRing {
    pub(crate) ring: MappedRing,
    /// Where the buffer is in the host's queue fd.
    fd_offset: u64,
}

/// Places `buffer` in the queue region and describes it; on error nothing stays allocated.
pub(crate) fn place_ring(
    s: &mut Session<'_>,
    buffer: QueueBuffer,
    num_slots: u32,
    entry_bytes: usize,
) -> Result<PlacedRing, CommandError> {
    let len = u64::try_from(buffer.len)
        .ok()
        .filter(|len| *len != 0 && len.is_multiple_of(SHMEM_PAGE_SIZE))
        .ok_or_else(|| CommandError::HostAnswer(format!("length {:#x}", buffer.len)))?;
    let geometry = slot_geometry(len, num_slots, entry_bytes)?;
    let range = s.state.shm.alloc(len)?;
    let desc = match describe(range, geometry) {
        Ok(desc) => desc,
        Err(e) => {
            free_extent(&mut s.state.shm, range);
            return Err(e);
        }
    };
    // What the driver will check (spec §6) must hold before anything is mapped.
    if let Err(e) = desc.check_rxe_v1(s.state.shm.size(), SHMEM_PAGE_SIZE) {
        free_extent(&mut s.state.shm, range);
        return Err(e.into());
    }
    Ok(PlacedRing {
        ring: MappedRing { range, desc },
        fd_offset: buffer.offset,
    })
}

/// Has the frontend map every placed ring, with one wait for all of its answers (a QP's send
/// and receive queues together). On error none is mapped and every extent is freed.
pub(crate) fn map_placed(s: &mut Session<'_>, placed: &[PlacedRing]) -> Result<(), CommandError> {
    let mappings: Vec<ShmemMapping> = placed
        .iter()
        .map(|p| ShmemMapping {
            fd_offset: p.fd_offset,
            shm_offset: p.ring.range.offset,
            len: p.ring.range.len,
            writable: true,
        })
        .collect();
    if let Err(e) = s
        .guest_io
        .shmem()
        .map_all(s.guest.host().queue_fd(), &mappings)
    {
        for p in placed {
            free_extent(&mut s.state.shm, p.ring.range);
        }
        return Err(e.into());
    }
    for p in placed {
        let desc = &p.ring.desc;
        debug!(
            "mapped host queue {:#x}+{:#x} at region offset {:#x} ({} slots of 2^{})",
            p.fd_offset,
            p.ring.range.len,
            p.ring.range.offset,
            desc.num_slots.get(),
            desc.log2_slot_size.get()
        );
    }
    Ok(())
}

/// The `RingDesc` of an rxe v1 ring of `geometry` filling `range`.
pub(crate) fn describe(range: ShmRange, geometry: RingGeometry) -> Result<RingDesc, CommandError> {
    let map_len = u32::try_from(range.len).map_err(|_| {
        CommandError::HostAnswer(format!("length {:#x} exceeds 32 bits", range.len))
    })?;
    Ok(RingDesc {
        shm_offset: Le64::new(range.offset),
        map_len: Le32::new(map_len),
        num_slots: Le32::new(geometry.num_slots()),
        log2_slot_size: Le32::new(geometry.log2_slot_size()),
        format: Le32::new(rxe_v1::FORMAT_ID),
        db_offset: Le64::ZERO,
        db_len: Le32::ZERO,
        flags: Le32::ZERO,
    })
}

/// Removes a ring from the queue region: unmaps its extent, or for a staging ring in a pooled
/// extent gives its place back and unmaps the chunk once nothing is left in it. `guest_io` is
/// `None` when the frontend already dropped every mapping (device reset, disconnect). An
/// extent whose unmap fails stays allocated, so that no other buffer is ever placed over a
/// mapping that may still exist.
pub(crate) fn unmap_ring(guest_io: Option<&GuestIo>, shm: &mut ShmAllocator, ring: &MappedRing) {
    unmap_rings(guest_io, shm, &[ring]);
}

/// [`unmap_rings`] of a ring and, if there is one, a second (a QP's send and receive queues).
pub(crate) fn unmap_queue_rings(
    guest_io: Option<&GuestIo>,
    shm: &mut ShmAllocator,
    first: &MappedRing,
    second: Option<&MappedRing>,
) {
    match second {
        Some(second) => unmap_rings(guest_io, shm, &[first, second]),
        None => unmap_ring(guest_io, shm, first),
    }
}

/// [`unmap_ring`] for several rings (a QP's send and receive queues), with one wait for the
/// frontend's answers to all of their unmaps.
pub(crate) fn unmap_rings(
    guest_io: Option<&GuestIo>,
    shm: &mut ShmAllocator,
    rings: &[&MappedRing],
) {
    let mut extents = Vec::with_capacity(rings.len());
    for ring in rings {
        if shm.chunk_of(ring.range).is_none() {
            extents.push(ring.range);
            continue;
        }
        match shm.free_pooled(ring.range) {
            Ok(Some(emptied)) => extents.push(emptied),
            Ok(None) => {}
            Err(e) => warn!("queue region bookkeeping: {e}"),
        }
    }
    let Some(guest_io) = guest_io else {
        for range in extents {
            free_extent(shm, range);
        }
        return;
    };
    let ranges: Vec<(u64, u64)> = extents.iter().map(|r| (r.offset, r.len)).collect();
    for (range, result) in extents.into_iter().zip(guest_io.shmem().unmap_all(&ranges)) {
        match result {
            Ok(()) => free_extent(shm, range),
            Err(e) => warn!(
                "cannot unmap region extent {:#x}+{:#x}; it stays reserved: {e}",
                range.offset, range.len
            ),
        }
    }
}

/// What a failure to map a host queue's new buffer means once the host has resized the queue:
/// the old buffer is dead, so never a status that promises "no effect" (`NO_MEMORY`).
pub(crate) fn after_host_resize(e: CommandError) -> CommandError {
    match e {
        CommandError::Placement(e) => {
            CommandError::HostAnswer(format!("no room for the resized buffer: {e}"))
        }
        e => e,
    }
}

/// Fails with `NO_MEMORY` unless the queue region has an extent of `len` bytes free now: checked
/// before a host resize, whose new buffer must then find room (nothing else allocates meanwhile:
/// the session holds the guest's state).
pub(crate) fn require_room(shm: &mut ShmAllocator, len: u64) -> Result<(), CommandError> {
    let reservation = shm.alloc(len)?;
    free_extent(shm, reservation);
    Ok(())
}

pub(crate) fn free_extent(shm: &mut ShmAllocator, range: ShmRange) {
    if let Err(e) = shm.free(range) {
        // Only a bookkeeping bug can get here; the extent is then simply not reused.
        warn!("queue region bookkeeping: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_sizes_follow_rxe() {
        assert_eq!(slot_log2(1), 6);
        assert_eq!(slot_log2(64), 6);
        assert_eq!(slot_log2(65), 7);
        assert_eq!(slot_log2(rxe_v1::CQE_SIZE), 7);
        assert_eq!(slot_log2(rxe_v1::send_wqe_size(1, 0)), 8);
        assert_eq!(slot_log2(rxe_v1::recv_wqe_size(1)), 6);
    }

    fn geometry(num_slots: u32, log2: u32) -> RingGeometry {
        RingGeometry::new(num_slots, log2).unwrap()
    }

    #[test]
    fn geometry_is_cross_checked_with_the_length() {
        // 256 CQ slots of 128 bytes: 384 + 32 KiB -> 9 pages.
        assert_eq!(
            slot_geometry(9 * 4096, 256, rxe_v1::CQE_SIZE).unwrap(),
            geometry(256, 7)
        );
        // A kernel with 256-byte CQEs is recognised when the length leaves no doubt.
        assert_eq!(
            slot_geometry(17 * 4096, 256, rxe_v1::CQE_SIZE).unwrap(),
            geometry(256, 8)
        );
        // Nothing fits.
        assert!(slot_geometry(5 * 4096, 256, rxe_v1::CQE_SIZE).is_err());
        // Ambiguous: 2 slots of 64..=1024 bytes all fit one page; the rule decides.
        assert_eq!(slot_geometry(4096, 2, 64).unwrap(), geometry(2, 6));
        assert!(slot_geometry(4096, 3, 64).is_err());
        assert!(slot_geometry(4096, 1, 64).is_err());
        assert!(slot_geometry(u64::MAX, 1 << 31, 1 << 16).is_err());
    }
}

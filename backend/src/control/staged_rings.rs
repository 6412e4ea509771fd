//! Staging rings of CREATE_QP (spec §9.6, §9.7): which queues of a new QP are staged, and the
//! placement of a staging ring in a pooled extent of the queue region with the device's own
//! mapping of the host queue behind it.
//!
//! UD send queues are staged whenever the driver negotiated `VRDMA_F_UD_STAGED_SQ` (their
//! WQEs are checked). RC and UC queues are staged when the driver negotiated
//! `VRDMA_F_STAGED_RINGS` and the guest's policy says so: by default once the QP's own
//! mappings would leave less than half of the front-end's slots ([`staging_reserve`]) for
//! CQs, SRQs and staging chunks. Staging rings share mappings ([`STAGING_CHUNK_LEN`] bytes of the staging
//! file per SHMEM_MAP), so such QPs cost the front-end no memory slot.

use log::debug;
use vrdma_spec::features::{VRDMA_F_STAGED_CQS, VRDMA_F_STAGED_RINGS, VRDMA_F_UD_STAGED_SQ};
use vrdma_spec::rxe_v1::{self, GeometryError, RingGeometry};
use vrdma_spec::verbs::QpType;
use vrdma_spec::wire::ring_flags;
use vrdma_spec::Le32;

use super::error::CommandError;
use super::rings;
use super::session::Session;
use crate::datapath::staging::cq_copy::{StagedCq, StagedCqInit};
use crate::datapath::staging::file::{SharedMapping, StagingFile};
use crate::datapath::staging::{StagedKind, StagedRing, StagedRingInit};
use crate::guest::options::StagedRings;
use crate::host::{self, DeviceError, QueueBuffer};
use crate::memory::queue_region::{MappedRing, ShmRange};
use crate::resources::table::Handle;
use crate::vhost_device::shmem::SHMEM_PAGE_SIZE;
use std::sync::Arc;

/// Bytes of the staging file one SHMEM_MAP covers (at most an eighth of the region): staging
/// rings are placed inside such chunks, 2 MiB holding about 170 send queues of 16 WQEs and
/// their receive queues.
pub const STAGING_CHUNK_LEN: u64 = 2 << 20;

/// Front-end slots [`StagedRings::Auto`] leaves to CQs, SRQs and staging chunks when the
/// front-end holds at most `max_extents` mappings: once fewer than this (plus the QP's own
/// queues) are left, new RC and UC QPs are staged. Half: the device cannot know whether a
/// guest will want more QPs or more CQs, and staged QPs need no slot of their own, CQs do.
pub fn staging_reserve(max_extents: usize) -> usize {
    max_extents / 2
}

/// Front-end slots [`StagedRings::Auto`] keeps for SRQs and staging chunks when the front-end
/// holds at most `max_extents` mappings: once fewer than this (plus the CQ's own) are left,
/// new CQs are staged (spec §9.8). Smaller than [`staging_reserve`]: QPs are staged first,
/// since a staged CQ costs a wake-up of the device per completion event and a staged QP
/// only a copy per doorbell; what is left must still hold the chunks of every staged ring
/// (a 2 MiB chunk holds 512 CQs of up to 15 completions, 256 of up to 31, or the rings of
/// 256 QPs of depth 1).
pub fn cq_staging_reserve(max_extents: usize) -> usize {
    max_extents / 16
}

/// Whether a new CQ gets a staging ring (spec §9.8).
pub(crate) fn stage_cq(s: &Session<'_>) -> bool {
    if s.features & VRDMA_F_STAGED_CQS == 0 || s.guest.staging().is_none() {
        return false;
    }
    match s.guest.options().staged_cqs {
        StagedRings::Always => true,
        StagedRings::Never => false,
        StagedRings::Auto => {
            let shm = &s.state.shm;
            shm.extents_left() < 1 + cq_staging_reserve(shm.max_extents())
        }
    }
}

/// Maps the buffer of the host CQ `cq` for the device, and places and initialises a staging
/// ring of its geometry in a pooled extent of the queue region. On error nothing stays
/// allocated or mapped; the caller still owns (and must destroy) the host CQ.
pub(crate) fn map_staged_cq(
    s: &mut Session<'_>,
    cq: &host::Cq,
) -> Result<(MappedRing, StagedCq), CommandError> {
    let num_slots = cq
        .cqe
        .checked_add(1)
        .ok_or_else(|| CommandError::HostAnswer(format!("cqe {}", cq.cqe)))?;
    let place = place_staging_ring(s, cq.buffer, num_slots, rxe_v1::CQE_SIZE)?;
    let ring = place.ring;
    let staged = StagedCq::new(
        StagedCqInit {
            host_cq: cq.handle,
            staging_range: ring.range,
            geometry: place.geometry,
        },
        place.staging,
        place.host_queue,
    );
    let staged = kept_or_released(s, ring, staged)?;
    debug!(
        "staged CQ of host CQ {} at region offset {:#x} ({num_slots} slots)",
        cq.handle, ring.range.offset
    );
    Ok((ring, staged))
}

/// How the queues of a new QP are exposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueueModes {
    /// The send queue's staging kind, or `None` for the host buffer itself.
    pub sq: Option<StagedKind>,
    /// Whether the receive queue (if the QP has one) is staged.
    pub rq_staged: bool,
}

/// The queue modes of a CREATE_QP of `qp_type`: UD send queues are staged when the driver
/// negotiated `VRDMA_F_UD_STAGED_SQ`, and otherwise only exist with `allow_unenforced_ud`;
/// RC and UC queues as [`stage_connected`] decides.
pub(crate) fn queue_modes(
    s: &Session<'_>,
    qp_type: QpType,
    with_srq: bool,
) -> Result<QueueModes, CommandError> {
    if qp_type != QpType::Ud {
        let staged = stage_connected(s, with_srq);
        return Ok(QueueModes {
            sq: staged.then_some(StagedKind::ConnectedSend),
            rq_staged: staged && !with_srq,
        });
    }
    let direct = QueueModes {
        sq: None,
        rq_staged: false,
    };
    if s.features & VRDMA_F_UD_STAGED_SQ != 0 && s.guest.staging().is_some() {
        return Ok(QueueModes {
            sq: Some(StagedKind::UdSend),
            ..direct
        });
    }
    if s.guest.options().allow_unenforced_ud {
        return Ok(direct);
    }
    Err(CommandError::NotNegotiated("VRDMA_F_UD_STAGED_SQ"))
}

/// Whether an RC or UC QP's queues are staged.
fn stage_connected(s: &Session<'_>, with_srq: bool) -> bool {
    if s.features & VRDMA_F_STAGED_RINGS == 0 || s.guest.staging().is_none() {
        return false;
    }
    match s.guest.options().staged_rings {
        StagedRings::Always => true,
        StagedRings::Never => false,
        StagedRings::Auto => {
            let own = if with_srq { 1 } else { 2 };
            let shm = &s.state.shm;
            shm.extents_left() < own + staging_reserve(shm.max_extents())
        }
    }
}

/// Maps the host queue `buffer` of `qp` for the device, and places and initialises a staging
/// ring of its geometry in a pooled extent of the queue region. On error nothing stays
/// allocated or mapped; the caller still owns (and must destroy) the host QP.
pub(crate) fn map_staged(
    s: &mut Session<'_>,
    qp: &host::Qp,
    buffer: QueueBuffer,
    kind: StagedKind,
    pd: Handle,
) -> Result<(MappedRing, StagedRing), CommandError> {
    let caps = qp.caps;
    let (depth, max_sge, entry) = match kind {
        StagedKind::Recv => (
            caps.max_recv_wr,
            caps.max_recv_sge,
            rxe_v1::recv_wqe_size(caps.max_recv_sge),
        ),
        StagedKind::UdSend | StagedKind::ConnectedSend => (
            caps.max_send_wr,
            caps.max_send_sge,
            rxe_v1::send_wqe_size(caps.max_send_sge, caps.max_inline_data),
        ),
    };
    let num_slots = depth
        .checked_add(1)
        .ok_or_else(|| CommandError::HostAnswer(format!("depth {depth}")))?;
    let place = place_staging_ring(s, buffer, num_slots, entry)?;
    let ring = place.ring;
    let staged = StagedRing::new(
        StagedRingInit {
            kind,
            host_qp: qp.handle,
            pd,
            staging_range: ring.range,
            geometry: place.geometry,
            max_sge,
            max_inline: caps.max_inline_data,
        },
        place.staging,
        place.host_queue,
    );
    let staged = kept_or_released(s, ring, staged)?;
    debug!(
        "{kind:?} staging ring of host QP {} at region offset {:#x} ({num_slots} slots of 2^{})",
        qp.handle,
        ring.range.offset,
        place.geometry.log2_slot_size()
    );
    Ok((ring, staged))
}

/// The device's side of a staging ring just placed at `ring`, or, if it could not be made,
/// the place given back and the reason.
fn kept_or_released<T>(
    s: &mut Session<'_>,
    ring: MappedRing,
    made: Result<T, GeometryError>,
) -> Result<T, CommandError> {
    made.map_err(|e| {
        rings::unmap_ring(Some(s.guest_io), &mut s.state.shm, &placeholder(ring.range));
        e.into()
    })
}

/// A staging ring placed and initialised in the queue region, and the device's own mapping
/// of the host buffer it stands for.
pub(crate) struct StagingPlace {
    /// The guest's staging file.
    pub staging: Arc<StagingFile>,
    /// The device's mapping of the host buffer (rxe maps a buffer once: the guest never sees
    /// it).
    pub host_queue: SharedMapping,
    /// The ring's extent and its description, flagged `STAGED`.
    pub ring: MappedRing,
    /// Its geometry (the host buffer's).
    pub geometry: RingGeometry,
}

/// Maps the host queue `buffer` (`num_slots` slots holding `entry` bytes each) for the device
/// and places a staging ring of its geometry, its header initialised, in a pooled extent of
/// the queue region. On error nothing stays placed or mapped.
pub(crate) fn place_staging_ring(
    s: &mut Session<'_>,
    buffer: QueueBuffer,
    num_slots: u32,
    entry: usize,
) -> Result<StagingPlace, CommandError> {
    let staging = s
        .guest
        .staging()
        .cloned()
        .ok_or(CommandError::Unsupported("staging rings"))?;
    let len = u64::try_from(buffer.len)
        .ok()
        .filter(|len| *len != 0 && len.is_multiple_of(SHMEM_PAGE_SIZE))
        .ok_or_else(|| CommandError::HostAnswer(format!("length {:#x}", buffer.len)))?;
    let geometry = rings::slot_geometry(len, num_slots, entry)?;
    // The device's mapping of the host queue is one more mapping of the daemon's: charged
    // like an MR window's, so that no guest can use up the daemon's vm.max_map_count.
    let charge = s.state.memory.charge_mappings(1)?;
    let host_queue = SharedMapping::charged(s.host().queue_fd(), buffer.offset, buffer.len, charge)
        .map_err(|source| CommandError::Host {
            op: "mmap of a host queue",
            source: DeviceError::Io {
                what: "mmap of a host queue",
                source,
            },
        })?;
    let range = place(s, &staging, len)?;
    let described = (|| {
        let mut desc = rings::describe(range, geometry)?;
        desc.flags = Le32::new(ring_flags::STAGED);
        desc.check_rxe_v1(s.state.shm.size(), SHMEM_PAGE_SIZE)?;
        staging
            .init_ring(range, geometry)
            .map_err(|e| CommandError::HostAnswer(format!("staging ring: {e}")))?;
        Ok(desc)
    })();
    match described {
        Ok(desc) => Ok(StagingPlace {
            staging,
            host_queue,
            ring: MappedRing { range, desc },
            geometry,
        }),
        Err(e) => {
            rings::unmap_ring(Some(s.guest_io), &mut s.state.shm, &placeholder(range));
            Err(e)
        }
    }
}

/// Whether a staging ring of `len` bytes could be placed now (without placing it): so that a
/// command that must not fail after its host work (RESIZE_CQ) fails before it for want of
/// region space.
pub(crate) fn check_room(s: &mut Session<'_>, len: u64) -> Result<(), CommandError> {
    let chunk_len = staging_chunk_len(s);
    let shm = &mut s.state.shm;
    let (range, _opened) = shm.alloc_pooled(len, chunk_len)?;
    // Never mapped: the place and any chunk opened for it go straight back.
    match shm.free_pooled(range) {
        Ok(Some(emptied)) => rings::free_extent(shm, emptied),
        Ok(None) => {}
        Err(e) => log::warn!("queue region bookkeeping: {e}"),
    }
    Ok(())
}

fn staging_chunk_len(s: &Session<'_>) -> u64 {
    // A small region gets smaller chunks, so that one chunk never takes much of it.
    STAGING_CHUNK_LEN.min(s.state.shm.size() / 8)
}

/// Places `len` bytes of staging ring in a pooled extent, mapping the staging file over a new
/// chunk when one is opened (the staging file's offsets are the region's, so chunks never
/// collide).
fn place(s: &mut Session<'_>, staging: &StagingFile, len: u64) -> Result<ShmRange, CommandError> {
    let chunk_len = staging_chunk_len(s);
    let (range, opened) = s.state.shm.alloc_pooled(len, chunk_len)?;
    if let Some(chunk) = opened {
        let mapped =
            s.guest_io
                .shmem()
                .map(staging.fd(), chunk.offset, chunk.offset, chunk.len, true);
        if let Err(e) = mapped {
            // Never mapped: give the buffer and the chunk back without an unmap.
            rings::unmap_ring(None, &mut s.state.shm, &placeholder(range));
            return Err(e.into());
        }
        debug!(
            "staging chunk mapped at region offset {:#x}+{:#x}",
            chunk.offset, chunk.len
        );
    }
    Ok(range)
}

/// A ring description that only carries `range` (to give an extent back).
fn placeholder(range: ShmRange) -> MappedRing {
    use zerocopy::FromZeros;
    MappedRing {
        range,
        desc: vrdma_spec::wire::RingDesc::new_zeroed(),
    }
}

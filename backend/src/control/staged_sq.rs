//! The send queue of a UD QP with `VRDMA_F_UD_STAGED_SQ` (spec §9.6): the device maps the host
//! buffer for itself and places a staging ring of the same geometry in the queue region, which
//! CREATE_QP's `sq` describes.

use log::debug;
use vrdma_spec::features::VRDMA_F_UD_STAGED_SQ;
use vrdma_spec::rxe_v1;
use vrdma_spec::verbs::QpType;

use super::error::CommandError;
use super::rings;
use super::session::Session;
use crate::datapath::ud_staging::{StagedSq, StagedSqInit};
use crate::host::{self, DeviceError};
use crate::memory::queue_region::MappedRing;
use crate::memory::staging::SharedMapping;
use crate::resources::table::Handle;
use crate::vhost_device::shmem::SHMEM_PAGE_SIZE;

/// How the send queue of a new QP is exposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendQueueMode {
    /// The host buffer itself is mapped into the queue region (RC, UC, unenforced UD).
    Direct,
    /// A staging ring that the device checks and copies (UD with `VRDMA_F_UD_STAGED_SQ`).
    Staged,
}

/// The send-queue mode of a CREATE_QP of `qp_type`: UD QPs are staged when the driver
/// negotiated `VRDMA_F_UD_STAGED_SQ`, and otherwise only exist with `allow_unenforced_ud`.
pub(crate) fn send_queue_mode(
    s: &Session<'_>,
    qp_type: QpType,
) -> Result<SendQueueMode, CommandError> {
    if qp_type != QpType::Ud {
        return Ok(SendQueueMode::Direct);
    }
    if s.features & VRDMA_F_UD_STAGED_SQ != 0 && s.guest.staging().is_some() {
        return Ok(SendQueueMode::Staged);
    }
    if s.guest.options().allow_unenforced_ud {
        return Ok(SendQueueMode::Direct);
    }
    Err(CommandError::NotNegotiated("VRDMA_F_UD_STAGED_SQ"))
}

/// Maps `qp`'s host send queue for the device, and places and maps its staging ring in the
/// queue region. On error nothing stays allocated or mapped; the caller still owns (and must
/// destroy) the host QP.
pub(crate) fn map_staged_sq(
    s: &mut Session<'_>,
    qp: &host::Qp,
    pd: Handle,
) -> Result<(MappedRing, StagedSq), CommandError> {
    let staging = s
        .guest
        .staging()
        .cloned()
        .ok_or(CommandError::Unsupported("UD staging"))?;
    let caps = qp.caps;
    let len = u64::try_from(qp.sq.len)
        .ok()
        .filter(|len| *len != 0 && len.is_multiple_of(SHMEM_PAGE_SIZE))
        .ok_or_else(|| CommandError::Geometry(format!("length {:#x}", qp.sq.len)))?;
    let num_slots = caps
        .max_send_wr
        .checked_add(1)
        .ok_or_else(|| CommandError::Geometry(format!("depth {}", caps.max_send_wr)))?;
    let log2 = rings::slot_geometry(
        len,
        num_slots,
        rxe_v1::send_wqe_size(caps.max_send_sge, caps.max_inline_data),
    )?;
    // rxe maps a queue buffer once: this mapping is the only one, and the guest never sees it.
    let host_sq =
        SharedMapping::new(s.host().queue_fd(), qp.sq.offset, qp.sq.len).map_err(|source| {
            CommandError::Host {
                op: "mmap of the send queue",
                source: DeviceError::Io {
                    what: "mmap of the send queue",
                    source,
                },
            }
        })?;
    let range = s.state.shm.alloc(len)?;
    let placed = (|| {
        let desc = rings::describe(range, num_slots, log2)?;
        desc.check_rxe_v1(s.state.shm.size(), SHMEM_PAGE_SIZE)
            .map_err(|e| CommandError::Geometry(e.to_string()))?;
        staging
            .init_ring(range, log2, num_slots - 1)
            .map_err(|e| CommandError::Geometry(format!("staging ring: {e}")))?;
        let staged = StagedSq::new(
            StagedSqInit {
                host_qp: qp.handle,
                pd,
                staging_range: range,
                index_mask: num_slots - 1,
                log2_slot_size: log2,
                max_sge: caps.max_send_sge,
                max_inline: caps.max_inline_data,
            },
            staging.clone(),
            host_sq,
        )
        .map_err(CommandError::Geometry)?;
        // The staging file's offsets are the region's: extents never collide.
        s.ctx
            .shmem()
            .map(staging.fd(), range.offset, range.offset, len, true)?;
        Ok((MappedRing { range, desc }, staged))
    })();
    match placed {
        Ok(placed) => {
            debug!(
                "staged send queue of host QP {} at region offset {:#x} ({num_slots} slots of \
                 2^{log2})",
                qp.handle, range.offset
            );
            Ok(placed)
        }
        Err(e) => {
            rings::free_extent(&mut s.state.shm, range);
            Err(e)
        }
    }
}

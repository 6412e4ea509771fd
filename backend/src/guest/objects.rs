//! The objects a guest holds, as its handle tables keep them: the host object behind each and
//! what it references.

use vrdma_spec::event::Subject;
use vrdma_spec::verbs::{AccessFlags, QpType};
use vrdma_spec::Event;

use crate::datapath::staging::cq_copy::StagedCq;
use crate::host::{AhHandle, CqHandle, Mr, Mw, PdHandle, QpHandle, SrqHandle};
use crate::identity::endpoints::QpnClaim;
use crate::memory::mr_window::MrWindow;
use crate::memory::queue_region::MappedRing;
use crate::resources::table::Handle;
use crate::vhost_device::guest_io::GuestIo;

/// A guest's protection domain.
#[derive(Debug)]
pub struct PdEntry {
    /// The host PD.
    pub host: PdHandle,
}

/// A registered MR and the window it covers.
#[derive(Debug)]
pub struct LiveMr {
    /// The host MR.
    pub host: Mr,
    /// The guest pages, mapped contiguously.
    pub window: MrWindow,
}

/// A guest's memory region.
#[derive(Debug)]
pub struct MrEntry {
    /// Its PD (holds a reference while the MR is live).
    pub pd: Handle,
    /// Bytes accounted against the MR byte quota: `npages · page size`.
    pub bytes: u64,
    /// The access flags the host MR has (REREG_MR keeps them for a new translation).
    pub access: AccessFlags,
    /// `None` once revoked by a memory-table change; the handle stays until DEREG_MR.
    pub live: Option<LiveMr>,
}

/// A guest's memory window. Which MR it is bound to is the host kernel's business: binds
/// and invalidations are work requests the device never sees.
#[derive(Debug)]
pub struct MwEntry {
    /// Its PD (holds a reference).
    pub pd: Handle,
    /// The host MW.
    pub host: Mw,
}

/// A guest's completion queue.
#[derive(Debug)]
pub struct CqEntry {
    /// The host CQ.
    pub host: CqHandle,
    /// Its `user_handle` on the host (names it in events).
    pub user_handle: u64,
    /// Its buffer in the queue region.
    pub ring: MappedRing,
    /// With a staging ring (spec §9.8), the device's copy of the host's completions into it.
    pub staged: Option<StagedCq>,
}

/// A guest's queue pair.
#[derive(Debug)]
pub struct QpEntry {
    /// The host QP.
    pub host: QpHandle,
    /// Host QP number.
    pub qpn: u32,
    /// RC or UD.
    pub qp_type: QpType,
    /// Objects it references (each holds a reference count).
    pub deps: QpDeps,
    /// Its `user_handle` on the host (names it in events).
    pub user_handle: u64,
    /// Its slot in the doorbell area.
    pub doorbell_index: u32,
    /// Send queue buffer.
    pub sq: MappedRing,
    /// Receive queue buffer; `None` with an SRQ.
    pub rq: Option<MappedRing>,
    /// Its QP number, claimed for the guest's tenant while it lives (`None` without one).
    pub qpn_claim: Option<QpnClaim>,
    /// The guest gave it an alternate path since it was created or last reset: the host's
    /// alternate path is the guest's current one (rxe keeps the old one across RESET).
    pub alt_path_set: bool,
}

/// The objects a QP uses.
#[derive(Debug, Clone, Copy)]
pub struct QpDeps {
    /// Its PD.
    pub pd: Handle,
    /// Send CQ.
    pub send_cq: Handle,
    /// Receive CQ (may equal the send CQ; referenced twice then).
    pub recv_cq: Handle,
    /// Its SRQ, if any.
    pub srq: Option<Handle>,
}

/// A guest's shared receive queue.
#[derive(Debug)]
pub struct SrqEntry {
    /// The host SRQ.
    pub host: SrqHandle,
    /// Its PD (holds a reference).
    pub pd: Handle,
    /// Its `user_handle` on the host (names it in events).
    pub user_handle: u64,
    /// Actual capacity.
    pub max_wr: u32,
    /// Actual SGEs per WR.
    pub max_sge: u32,
    /// Armed limit; 0 once SRQ_LIMIT_REACHED fired (the host disarms it then).
    pub srq_limit: u32,
    /// Its buffer in the queue region.
    pub ring: MappedRing,
}

/// A guest's address handle.
#[derive(Debug)]
pub struct AhEntry {
    /// The host AH.
    pub host: AhHandle,
    /// Its PD (holds a reference).
    pub pd: Handle,
}

/// The guest object a host `user_handle` stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventOwner {
    /// A completion queue.
    Cq(Handle),
    /// A queue pair.
    Qp(Handle),
    /// A shared receive queue.
    Srq(Handle),
    /// A connection-manager id.
    CmId(Handle),
}

/// Drops the queued events about the `subject` object `handle`, whose DESTROY is being
/// answered: nothing about it may reach the guest after the answer (spec §8). The caller holds
/// the guest's state lock, which the event pumps take to queue an event, and has already
/// forgotten the object, so no new event about it can be queued either.
pub(crate) fn discard_events_of(guest_io: &GuestIo, subject: Subject, handle: Handle) -> usize {
    guest_io.events().discard_where(|bytes| {
        Event::decode(bytes)
            .is_ok_and(|e| e.event_type.subject() == subject && e.handle == handle.raw())
    })
}

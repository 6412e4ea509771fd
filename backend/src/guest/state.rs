//! Every object and placement of one guest: its handle tables, its queue-region extents and
//! the bookkeeping events and discards need. Guarded by the guest's state lock.

use std::collections::HashMap;
use std::sync::Arc;

use super::cm_ids::CmIds;
use super::objects::{
    AhEntry, CqEntry, EventOwner, LiveMr, MrEntry, MwEntry, PdEntry, QpEntry, SrqEntry,
};
use super::options::{DeviceOptions, GuestError};
use crate::datapath::staging::cq_copy::StagedCq;
use crate::host::PdHandle;
use crate::memory::budget::{HostBudget, MemoryAccount};
use crate::memory::mr_window::MrWindow;
use crate::memory::populated::PopulatedRam;
use crate::memory::queue_region::ShmAllocator;
use crate::resources::kind::ResourceKind;
use crate::resources::table::{Handle, HandleTable};
use crate::vhost_device::shmem::SHMEM_PAGE_SIZE;

/// Every object and placement of one guest.
pub(crate) struct GuestState {
    pub(crate) pds: HandleTable<PdEntry>,
    pub(crate) mrs: HandleTable<MrEntry>,
    /// Bytes of live (not revoked) MRs, against `Quotas::mr_bytes`.
    pub(crate) mr_bytes: u64,
    /// Mappings and pinned guest memory of live (not revoked) MRs, in the daemon's budget.
    pub(crate) memory: MemoryAccount,
    /// What of guest RAM's mapping MR registrations have populated already.
    pub(crate) populated: PopulatedRam,
    pub(crate) cqs: HandleTable<CqEntry>,
    pub(crate) qps: HandleTable<QpEntry>,
    pub(crate) srqs: HandleTable<SrqEntry>,
    pub(crate) ahs: HandleTable<AhEntry>,
    pub(crate) mws: HandleTable<MwEntry>,
    /// Connection-manager ids and their undelivered events.
    pub(crate) cm: CmIds,
    /// Extents of the queue region in use.
    pub(crate) shm: ShmAllocator,
    /// Source of the `user_handle`s given to the host: events name objects by them.
    pub(crate) next_user_handle: u64,
    /// The object behind each `user_handle` in use.
    pub(crate) owners: HashMap<u64, EventOwner>,
    /// State was discarded; tell the guest with DEVICE_FATAL at the next opportunity.
    pub(crate) announce_discard: bool,
    /// Host MRs whose deregistration failed after their handle was gone (spec §11.1): still
    /// registered, so their windows stay mapped and charged, and every discard tries again.
    /// Closing the host context at disconnect releases whatever is left.
    pub(crate) lingering_mrs: Vec<(Handle, LiveMr)>,
    /// Host PDs kept while MRs linger (one of them may be in any of these PDs): deallocated
    /// by the first discard that finds no MR lingering.
    pub(crate) lingering_pds: Vec<PdHandle>,
}

impl GuestState {
    /// Unmaps a window that was never registered (or whose MR is deregistered) and gives back
    /// what it took from the budgets.
    pub(crate) fn unmap_window(&mut self, window: MrWindow) {
        self.memory.release(&window);
        drop(window);
    }

    /// The staged CQ the host names by `user_handle` in its events, if that is one.
    pub(crate) fn staged_cq(&mut self, user_handle: u64) -> Option<&mut StagedCq> {
        let Some(EventOwner::Cq(cq)) = self.owners.get(&user_handle).copied() else {
            return None;
        };
        self.cqs.get_mut(cq).ok()?.staged.as_mut()
    }

    pub(crate) fn new(
        options: &DeviceOptions,
        budget: Arc<HostBudget>,
    ) -> Result<Self, GuestError> {
        let q = &options.quotas;
        Ok(GuestState {
            pds: HandleTable::new(ResourceKind::Pd, q.pds)?,
            // MR bytes are counted here rather than by the table: a revoked MR (spec §11.3)
            // releases its bytes while its handle stays allocated.
            mrs: HandleTable::new(ResourceKind::Mr, q.mrs)?,
            mr_bytes: 0,
            memory: MemoryAccount::new(budget, q.mappings.into()),
            populated: PopulatedRam::default(),
            cqs: HandleTable::new(ResourceKind::Cq, q.cqs)?,
            qps: HandleTable::new(ResourceKind::Qp, q.qps)?,
            srqs: HandleTable::new(ResourceKind::Srq, q.srqs)?,
            ahs: HandleTable::new(ResourceKind::Ah, q.ahs)?,
            mws: HandleTable::new(ResourceKind::Mw, q.mws)?,
            cm: CmIds::new(q.cm_ids)?,
            shm: ShmAllocator::new(options.shm_size, SHMEM_PAGE_SIZE)?,
            next_user_handle: 1,
            owners: HashMap::new(),
            announce_discard: false,
            lingering_mrs: Vec::new(),
            lingering_pds: Vec::new(),
        })
    }

    /// A `user_handle` never given out before on this connection.
    pub(crate) fn new_user_handle(&mut self) -> u64 {
        let handle = self.next_user_handle;
        self.next_user_handle = self.next_user_handle.wrapping_add(1).max(1);
        handle
    }

    /// Counts of live objects, for logs and tests.
    pub(crate) fn counts(&self) -> ObjectCounts {
        ObjectCounts {
            pds: self.pds.len(),
            mrs: self.mrs.len(),
            cqs: self.cqs.len(),
            qps: self.qps.len(),
            srqs: self.srqs.len(),
            ahs: self.ahs.len(),
            mws: self.mws.len(),
            cm_ids: self.cm.len(),
            shm_extents: self.shm.used_extents(),
        }
    }
}

/// How many objects a guest holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObjectCounts {
    /// Protection domains.
    pub pds: usize,
    /// Memory regions (revoked ones included until deregistered).
    pub mrs: usize,
    /// Completion queues.
    pub cqs: usize,
    /// Queue pairs.
    pub qps: usize,
    /// Shared receive queues.
    pub srqs: usize,
    /// Address handles.
    pub ahs: usize,
    /// Memory windows.
    pub mws: usize,
    /// Connection-manager ids.
    pub cm_ids: usize,
    /// Extents of the queue region in use.
    pub shm_extents: usize,
}

impl ObjectCounts {
    /// Whether the guest holds nothing.
    pub fn is_empty(&self) -> bool {
        *self == ObjectCounts::default()
    }
}

impl std::fmt::Display for ObjectCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} PDs, {} MRs, {} MWs, {} CQs, {} QPs, {} SRQs, {} AHs, {} CM ids, {} queue-region \
             extents",
            self.pds,
            self.mrs,
            self.mws,
            self.cqs,
            self.qps,
            self.srqs,
            self.ahs,
            self.cm_ids,
            self.shm_extents
        )
    }
}

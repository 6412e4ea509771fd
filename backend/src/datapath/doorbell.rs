//! Doorbell draining (spec §5.3): the doorbell table and the pump that kicks host QPs.
//!
//! The driver's doorbell area lives in guest RAM. The device keeps a pointer into its own
//! mapping of that RAM, and a table from doorbell index to host QP, so a notification costs
//! one pass over the entries the driver queued and one kick per entry, with no allocation and
//! no lookup beyond an array index.
//!
//! With a poll window (`--doorbell-poll-us`) and `VRDMA_F_DOORBELL_POLL` negotiated, the device
//! keeps draining the area for that long after each doorbell it finds, with the area's
//! `polling` flag set so drivers skip their notifications (spec §5.3): a ping-pong then rings
//! without a notification, a wake-up of this worker or, in a VM, an exit. The phase is bounded
//! (at most [`POLL_BUDGET_WINDOWS`] windows per notification) because the same worker delivers
//! events. The poller spins rather than yielding between passes: a yield can hand the CPU away
//! for a whole scheduler slice while drivers, told not to notify, wait for the next pass
//! (measured under TCG: ping-pong averages went from 0.15 ms to 1.8 ms). Polling costs a
//! host CPU for the window after every doorbell; with no core to spare (2 vCPUs, two
//! busy-polling processes) it lengthens latency instead of shortening it, hence off by default.

use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{debug, warn};
use parking_lot::Mutex;
use vm_memory::{GuestAddress, GuestMemoryBackend};
use vrdma_spec::doorbell::{area_bytes, DoorbellArea};

use super::staging::{Reach, Staging};
use crate::fault_log::FaultLog;
use crate::host::{HostContext, QpHandle};
use crate::memory::error::MemError;
use crate::memory::guest_ram::MappedGuestRam;

/// A doorbell area in guest RAM, mapped in this process.
pub(crate) struct MappedArea {
    /// Keeps the memory snapshot, and with it the mapping `addr` points into, alive.
    _memory: Arc<MappedGuestRam>,
    gpa: u64,
    /// Address of the first word; kept as an integer so the area is `Send` and `Sync`.
    addr: usize,
    words: usize,
    slots: u32,
}

/// Why a doorbell area cannot be placed where the guest asked.
#[derive(Debug, thiserror::Error)]
pub enum AreaError {
    /// The range is not inside one region of guest RAM.
    #[error(transparent)]
    Memory(#[from] MemError),
    /// The daemon's mapping of the range is not aligned for atomic words.
    #[error("doorbell area at host address {0:#x} is not 4-byte aligned")]
    Misaligned(u64),
}

impl MappedArea {
    /// Locates `[gpa, gpa + area_bytes(slots))` in one region of `memory`.
    pub(crate) fn map(
        memory: Arc<MappedGuestRam>,
        gpa: u64,
        slots: u32,
    ) -> Result<Self, AreaError> {
        let len = area_bytes(slots);
        let outside = MemError::NotInGuestRam {
            gpa,
            len: len as u64,
        };
        // `get_slice` refuses a range that leaves its region.
        let addr = memory
            .get_slice(GuestAddress(gpa), len)
            .map_err(|_| outside)?
            .ptr_guard_mut()
            .as_ptr() as usize;
        if !addr.is_multiple_of(align_of::<AtomicU32>()) {
            return Err(AreaError::Misaligned(addr as u64));
        }
        Ok(MappedArea {
            _memory: memory,
            gpa,
            addr,
            words: len / size_of::<AtomicU32>(),
            slots,
        })
    }

    fn words(&self) -> &[AtomicU32] {
        // SAFETY: `addr..addr + words * 4` lies inside one region of the guest-memory snapshot
        // held in `_memory` (checked by `get_slice` in `map`), and vm-memory keeps a region
        // mapped read/write until its last `Arc` goes, so the memory is valid for as long as
        // `self` is. The address is 4-byte aligned (checked in `map`), `AtomicU32` has the size
        // and alignment of `u32`, and every bit pattern is valid. The guest writes the area
        // concurrently, which is why it is only ever accessed through atomics.
        unsafe { std::slice::from_raw_parts(self.addr as *const AtomicU32, self.words) }
    }
}

/// Longest polling phase per notification, in poll windows: the worker that polls also delivers
/// events, which wait while it polls.
pub const POLL_BUDGET_WINDOWS: u32 = 8;

/// The doorbell area and the QP behind each doorbell index.
pub struct Doorbells {
    slots: u32,
    area: Option<MappedArea>,
    /// The driver accepted `VRDMA_F_DOORBELL_POLL`: the device may set the area's `polling`.
    polling_allowed: bool,
    /// Entries consumed so far (the device's `head`).
    head: u32,
    /// Host QP per doorbell index; `None` while the index is free or being created/destroyed.
    owners: Vec<Option<QpHandle>>,
    /// Free indices, lowest on top.
    free: Vec<u32>,
    /// Which indices are handed out (reserved or attached).
    taken: Vec<bool>,
    /// Staging rings and the address handles staged UD sends may name (spec §9.6, §9.7).
    staging: Staging,
}

impl Doorbells {
    /// Bookkeeping for `slots` doorbell indices (the configuration's `doorbell_slots`).
    pub fn new(slots: u32) -> Self {
        Self::with_reach(slots, Reach::nowhere_local(), Arc::default())
    }

    /// Bookkeeping for `slots` doorbell indices whose staged UD sends reach local QPs as
    /// `reach` allows, the guest's faults logged to `faults`.
    pub fn with_reach(slots: u32, reach: Reach, faults: Arc<FaultLog>) -> Self {
        Doorbells {
            slots,
            area: None,
            polling_allowed: false,
            head: 0,
            owners: vec![None; slots as usize],
            free: (0..slots).rev().collect(),
            taken: vec![false; slots as usize],
            staging: Staging::new(slots, reach, faults),
        }
    }

    /// The staging rings and address handles (spec §9.6, §9.7).
    pub fn staging(&mut self) -> &mut Staging {
        &mut self.staging
    }

    /// Registers the driver's area (SET_DOORBELL_AREA), consumed from its start; the device
    /// may set its `polling` flag if `polling_allowed`.
    pub(crate) fn install_area(&mut self, area: MappedArea, polling_allowed: bool) {
        self.area = Some(area);
        self.head = 0;
        self.polling_allowed = polling_allowed;
        if let Some(area) = self.view() {
            // The word is the device's: whatever the driver left there, nobody polls yet.
            area.reset_polling();
        }
    }

    /// Whether SET_DOORBELL_AREA has registered an area.
    pub fn has_area(&self) -> bool {
        self.area.is_some()
    }

    /// Guest-physical address of the registered area.
    pub fn area_gpa(&self) -> Option<u64> {
        self.area.as_ref().map(|area| area.gpa)
    }

    /// Hands out a free doorbell index for a QP being created.
    pub fn reserve(&mut self) -> Option<u32> {
        let index = self.free.pop()?;
        if let Some(taken) = self.taken.get_mut(index as usize) {
            *taken = true;
        }
        Some(index)
    }

    /// Lets doorbells on `index` kick `qp`.
    pub fn attach(&mut self, index: u32, qp: QpHandle) {
        if let Some(owner) = self.owners.get_mut(index as usize) {
            *owner = Some(qp);
        }
    }

    /// Stops doorbells on `index` from kicking anything (the index stays reserved).
    pub fn detach(&mut self, index: u32) {
        if let Some(owner) = self.owners.get_mut(index as usize) {
            *owner = None;
        }
    }

    /// Gives a reserved index back.
    pub fn release(&mut self, index: u32) {
        self.detach(index);
        self.staging.release(index);
        if let Some(taken) = self.taken.get_mut(index as usize) {
            if std::mem::take(taken) {
                self.free.push(index);
            }
        }
    }

    /// Forgets the area and every index; returns whether anything was set.
    pub fn clear(&mut self) -> bool {
        // A polling phase may be under way on the doorbell worker: leave no `polling` flag
        // behind in memory the driver may register again (it would silence its doorbells).
        if let Some(area) = self.view() {
            area.reset_polling();
        }
        let had_something = self.area.is_some() || self.taken.iter().any(|&t| t);
        // The fault log stays: a guest that resets in a loop must not start its rate limit over.
        *self = Doorbells::with_reach(
            self.slots,
            self.staging.reach().clone(),
            Arc::clone(self.staging.faults()),
        );
        had_something
    }

    /// The registered area, if any.
    fn view(&self) -> Option<DoorbellArea<'_>> {
        let mapped = self.area.as_ref()?;
        match DoorbellArea::new(mapped.words(), mapped.slots) {
            Ok(area) => Some(area),
            Err(e) => {
                // Cannot happen: the mapping was sized for these slots.
                warn!("doorbell area: {e}");
                None
            }
        }
    }

    /// Kicks the QP of every doorbell queued in the area (at most one lap of the ring).
    pub fn drain(&mut self, host: &dyn HostContext) -> usize {
        self.pass(host, Pass::Drain).unwrap_or_else(|| {
            debug!("doorbell without a doorbell area");
            0
        })
    }

    /// One pass over the area; `None` without an area (or, for [`Pass::Poll`], when the driver
    /// did not accept polling).
    fn pass(&mut self, host: &dyn HostContext, pass: Pass) -> Option<usize> {
        if pass != Pass::Drain && !self.polling_allowed {
            return None;
        }
        let mapped = self.area.as_ref()?;
        let area = DoorbellArea::new(mapped.words(), mapped.slots).ok()?;
        let owners = &self.owners;
        let staging = &mut self.staging;
        let kick = |index: u32| {
            // Indices of no live QP are dropped; kick errors (QP not in RTS) are the guest's.
            // Staging rings are copied to their host queues first (a staged send queue kicks
            // itself).
            if let Some(Some(qp)) = owners.get(index as usize) {
                if !staging.ring(index, host) {
                    let _ = host.kick_send(*qp);
                }
            }
        };
        Some(match pass {
            Pass::Drain => area.drain(&mut self.head, kick),
            Pass::Poll => {
                area.start_polling();
                area.drain(&mut self.head, kick)
            }
            Pass::StopPolling => area.stop_polling(&mut self.head, kick),
        })
    }

    /// Re-locates the area in a new memory table, or drops it if the guest no longer has
    /// that memory.
    pub fn memory_changed(&mut self, memory: Arc<MappedGuestRam>) {
        let Some(old) = self.area.take() else {
            return;
        };
        match MappedArea::map(memory, old.gpa, old.slots) {
            Ok(area) => self.area = Some(area),
            Err(e) => warn!(
                "doorbell area at {:#x} is gone with the memory change ({e}); doorbells stop",
                old.gpa
            ),
        }
    }
}

/// What one pass over the doorbell area does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Drain only.
    Drain,
    /// Set `polling` (if not set) and drain.
    Poll,
    /// Clear `polling`, fence, drain (spec §5.3: the drain that no skipped notification can
    /// escape).
    StopPolling,
}

/// Kicks every QP whose doorbell is queued in the area, once, without polling: what a control
/// command does before it runs (spec §5.3, ordering with commands).
/// Without an area (no QP yet) there is nothing to kick.
///
/// Returns when staged rings the pass could not forward whole are due to be pumped again
/// (`None` if none waits), read under the same lock.
pub fn drain(doorbells: &Mutex<Doorbells>, host: &dyn HostContext) -> Option<Duration> {
    let mut doorbells = doorbells.lock();
    let _ = doorbells.pass(host, Pass::Drain);
    doorbells.staging().next_retry()
}

/// Serves one doorbell notification: drains the area, then, if `window` is non-zero and the
/// driver accepted `VRDMA_F_DOORBELL_POLL`, keeps polling it until `window` passes without a
/// doorbell (or [`POLL_BUDGET_WINDOWS`] windows in all), and ends the phase with the
/// clear-fence-drain that catches every driver that skipped its notification.
///
/// The lock is taken per pass, never across the phase: the control worker creates and
/// destroys QPs (and a reset clears the area) meanwhile, and the next pass sees the change.
/// Returns what [`drain`] returns, read at the end of the phase.
pub fn serve(
    doorbells: &Mutex<Doorbells>,
    host: &dyn HostContext,
    window: Duration,
) -> Option<Duration> {
    if window.is_zero() {
        return drain(doorbells, host);
    }
    doorbells.lock().drain(host);
    let start = Instant::now();
    let budget_end = start + window * POLL_BUDGET_WINDOWS;
    let mut idle_end = start + window;
    loop {
        match doorbells.lock().pass(host, Pass::Poll) {
            None => return doorbells.lock().staging().next_retry(),
            Some(0) => {}
            Some(_) => idle_end = Instant::now() + window,
        }
        let now = Instant::now();
        if now >= idle_end || now >= budget_end {
            // A doorbell found by the last drain was kicked; any later one notifies again.
            let mut doorbells = doorbells.lock();
            doorbells.pass(host, Pass::StopPolling);
            return doorbells.staging().next_retry();
        }
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::endpoints::LocalEndpoints;

    #[test]
    fn a_reset_keeps_the_guests_fault_log_and_tenant_table() {
        let faults = Arc::new(FaultLog::for_guest(3));
        let endpoints = LocalEndpoints::new();
        let reach = Reach::new(Arc::clone(&endpoints), Arc::new(|_| false));
        let mut doorbells = Doorbells::with_reach(8, reach, faults.clone());
        doorbells.clear();
        // The same log: its rate limit goes on counting across resets.
        assert!(Arc::ptr_eq(doorbells.staging().faults(), &faults));
        assert!(Arc::ptr_eq(
            doorbells.staging().reach().endpoints(),
            &endpoints
        ));
    }
}

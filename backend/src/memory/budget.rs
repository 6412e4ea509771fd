// Copyright 2026 The vrdma Authors
// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause

//! Budgets of the host resources a guest makes the daemon hold: memory mappings and pinned
//! guest memory.
//!
//! Every guest of a daemon maps its MRs and its staged queues' host buffers into the one daemon
//! process, so they share its `vm.max_map_count` (once it is reached every mmap of the daemon
//! fails: other guests' MR windows and staged queues, new guests' memory tables, thread
//! stacks) and the host memory their MRs pin. A [`HostBudget`], created once per daemon and
//! shared by all its guests, bounds them; a [`MemoryAccount`] per guest holds what that guest's
//! live MRs and staged queues use and gives it back when they go. Mappings are counted per MR
//! window and per staged queue ([`MappingCharge`]). Pinned memory is counted twice over: in
//! distinct guest-physical bytes (what the host's RAM loses: MRs over the same pages pin them
//! once), and as the kernel charges it to the daemon's `RLIMIT_MEMLOCK` (every MR's pages
//! again, overlaps included), so that a guest cannot use up the limit every guest's
//! registrations are checked against.

use std::fs;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::mr_window::{MrPlan, MrWindow};
#[cfg(test)]
use super::pinned_extents::locked_bytes;
use super::pinned_extents::{Extent, PinnedExtents};

/// `vm.max_map_count` when it cannot be read: the kernel's default.
pub const DEFAULT_MAX_MAP_COUNT: u64 = 65530;
/// Fewest mappings kept out of the window budget for everything else the daemon maps.
pub const MIN_MAPPING_RESERVE: u64 = 4096;

/// Daemon-wide limits of [`HostBudget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostBudgetLimits {
    /// Memory mappings all MR windows of all guests may hold together.
    pub mappings: u64,
    /// Distinct guest bytes all guests' MRs may pin together.
    pub pinned_bytes: u64,
    /// Bytes all guests' MRs may make the kernel charge to the daemon's locked memory, each MR
    /// its own pages (`u64::MAX`: the kernel enforces no limit).
    pub locked_bytes: u64,
}

impl HostBudgetLimits {
    /// Limits derived from this host: see [`default_mapping_budget`] and
    /// [`default_pinned_budget`].
    pub fn for_this_host() -> Self {
        HostBudgetLimits {
            mappings: default_mapping_budget(read_max_map_count()),
            pinned_bytes: default_pinned_budget(),
            locked_bytes: default_locked_budget(),
        }
    }
}

/// The daemon's `vm.max_map_count`, or the kernel default if it cannot be read.
pub fn read_max_map_count() -> u64 {
    fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(DEFAULT_MAX_MAP_COUNT)
}

/// The mappings MR windows may use: `max_map_count` minus a reserve of a quarter of it (at
/// least [`MIN_MAPPING_RESERVE`]) for everything else the daemon maps. That is per guest its
/// memory table (one mapping per RAM region: a few, at most 509 with vhost-user's slot limit)
/// and its threads' stacks and guard pages, and once its libraries and allocator arenas (a few
/// hundred): with the default `max_map_count` of 65530 the reserve of 16382 holds dozens of
/// guests with the largest memory tables, hundreds of ordinary ones, and MR windows get 49148.
pub fn default_mapping_budget(max_map_count: u64) -> u64 {
    let reserve = (max_map_count / 4).max(MIN_MAPPING_RESERVE);
    max_map_count.saturating_sub(reserve)
}

/// The distinct guest bytes MRs may pin: three quarters of the host's RAM, leaving the rest to
/// the host kernel and to what it must be able to reclaim.
pub fn default_pinned_budget() -> u64 {
    physical_ram().unwrap_or(u64::MAX) / 4 * 3
}

/// The bytes MRs may make the kernel charge to the daemon's locked memory: `RLIMIT_MEMLOCK`
/// when the daemon cannot pin beyond it (no `CAP_IPC_LOCK`), else no limit. The kernel
/// (`ib_umem_get`) charges every MR the pages its range spans, an MR over pages another one
/// pinned included, and refuses a registration past the limit: charged here first, a guest
/// past it gets `QUOTA` and cannot make another guest's registration fail in the kernel.
pub fn default_locked_budget() -> u64 {
    match memlock_limit() {
        Some(limit) if !has_cap_ipc_lock() => limit,
        _ => u64::MAX,
    }
}

fn physical_ram() -> Option<u64> {
    // SAFETY: sysconf only reads configuration values.
    let (pages, page_size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let pages = u64::try_from(pages).ok()?;
    let page_size = u64::try_from(page_size).ok()?;
    pages.checked_mul(page_size)
}

/// The soft `RLIMIT_MEMLOCK`, `None` when unlimited.
fn memlock_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the rlimit it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 {
        return None;
    }
    (limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// Whether the process may pin memory beyond `RLIMIT_MEMLOCK` (`CAP_IPC_LOCK` effective).
fn has_cap_ipc_lock() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let caps = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(caps.trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// Why an MR window or a staged queue's mapping does not fit a budget (status `QUOTA`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    /// The guest's own mapping quota.
    #[error("the guest's MR windows and staged queues would hold {requested} more mappings beside {used} (guest limit {limit})")]
    GuestMappings {
        /// The guest's limit.
        limit: u64,
        /// Held by the guest's live MRs and staged queues.
        used: u64,
        /// Needed by the new window or queue.
        requested: u64,
    },
    /// The daemon's mapping budget, shared by all guests.
    #[error("the daemon's MR windows and staged queues would hold {requested} more mappings beside {used} (daemon budget {limit})")]
    DaemonMappings {
        /// The daemon's budget.
        limit: u64,
        /// Held by all guests' live MRs and staged queues.
        used: u64,
        /// Needed by the new window or queue.
        requested: u64,
    },
    /// The daemon's pinned-memory budget, shared by all guests.
    #[error(
        "the MR would pin {requested:#x} more bytes beside {used:#x} (daemon budget {limit:#x})"
    )]
    DaemonPinned {
        /// The daemon's budget.
        limit: u64,
        /// Pinned by all guests' live MRs.
        used: u64,
        /// Guest bytes the new MR pins that none of the guest's MRs pinned yet.
        requested: u64,
    },
    /// The daemon's locked-memory limit, as the kernel charges it, shared by all guests.
    #[error(
        "the MR would lock {requested:#x} more bytes beside {used:#x} (the daemon's locked-memory limit {limit:#x})"
    )]
    DaemonLocked {
        /// The limit (`RLIMIT_MEMLOCK`).
        limit: u64,
        /// Charged for all guests' live MRs.
        used: u64,
        /// Charged for the new MR: every page its range spans.
        requested: u64,
    },
}

/// One charge to a [`HostBudget`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Charge {
    mappings: u64,
    pinned_bytes: u64,
    locked_bytes: u64,
}

/// What all guests of a daemon hold: mappings of their MR windows and staged queues, distinct
/// guest bytes their MRs pin, and bytes the kernel charges for those MRs to the daemon's
/// locked memory. Shared (`Arc`) by every guest's [`MemoryAccount`].
#[derive(Debug)]
pub struct HostBudget {
    limits: HostBudgetLimits,
    mappings: AtomicU64,
    pinned_bytes: AtomicU64,
    locked_bytes: AtomicU64,
}

impl HostBudget {
    /// An empty budget with `limits`.
    pub fn new(limits: HostBudgetLimits) -> Self {
        HostBudget {
            limits,
            mappings: AtomicU64::new(0),
            pinned_bytes: AtomicU64::new(0),
            locked_bytes: AtomicU64::new(0),
        }
    }

    /// The limits.
    pub fn limits(&self) -> HostBudgetLimits {
        self.limits
    }

    /// Mappings held by all guests' MR windows and staged queues.
    pub fn mappings(&self) -> u64 {
        self.mappings.load(Ordering::Relaxed)
    }

    /// Distinct guest bytes pinned by all guests' MRs.
    pub fn pinned_bytes(&self) -> u64 {
        self.pinned_bytes.load(Ordering::Relaxed)
    }

    /// Bytes the kernel charges for all guests' MRs to the daemon's locked memory.
    pub fn locked_bytes(&self) -> u64 {
        self.locked_bytes.load(Ordering::Relaxed)
    }

    /// Takes all of `charge` if it fits; takes nothing otherwise.
    fn charge(&self, charge: Charge) -> Result<(), BudgetError> {
        let limits = self.limits;
        take(&self.mappings, charge.mappings, limits.mappings).map_err(|used| {
            BudgetError::DaemonMappings {
                limit: limits.mappings,
                used,
                requested: charge.mappings,
            }
        })?;
        if let Err(used) = take(&self.pinned_bytes, charge.pinned_bytes, limits.pinned_bytes) {
            self.release(Charge {
                mappings: charge.mappings,
                ..Charge::default()
            });
            return Err(BudgetError::DaemonPinned {
                limit: limits.pinned_bytes,
                used,
                requested: charge.pinned_bytes,
            });
        }
        if let Err(used) = take(&self.locked_bytes, charge.locked_bytes, limits.locked_bytes) {
            self.release(Charge {
                locked_bytes: 0,
                ..charge
            });
            return Err(BudgetError::DaemonLocked {
                limit: limits.locked_bytes,
                used,
                requested: charge.locked_bytes,
            });
        }
        Ok(())
    }

    fn release(&self, charge: Charge) {
        give_back(&self.mappings, charge.mappings);
        give_back(&self.pinned_bytes, charge.pinned_bytes);
        give_back(&self.locked_bytes, charge.locked_bytes);
    }
}

/// Adds `amount` to `counter` unless that goes over `limit`; returns the current use if not.
fn take(counter: &AtomicU64, amount: u64, limit: u64) -> Result<(), u64> {
    // Relaxed: the counter guards no other memory; every update is atomic.
    counter
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
            used.checked_add(amount).filter(|total| *total <= limit)
        })
        .map(drop)
}

fn give_back(counter: &AtomicU64, amount: u64) {
    let result = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
        Some(used.saturating_sub(amount))
    });
    if result.is_ok_and(|used| used < amount) {
        log::error!("host budget bookkeeping: {amount} given back, only {result:?} held");
    }
}

/// Mappings of a guest's staged queue held in the daemon (the device's mapping of a host queue
/// buffer), charged to the guest's mapping quota and the daemon's budget, and given back to
/// both when dropped (with the mapping). Made by [`MemoryAccount::charge_mappings`].
#[derive(Debug)]
pub struct MappingCharge {
    budget: Arc<HostBudget>,
    guest: Arc<AtomicU64>,
    mappings: u64,
}

impl Drop for MappingCharge {
    fn drop(&mut self) {
        give_back(&self.guest, self.mappings);
        self.budget.release(Charge {
            mappings: self.mappings,
            ..Charge::default()
        });
    }
}

/// One guest's share of the [`HostBudget`]: the mappings of its live MR windows and staged
/// queues (its mapping quota bounds both), the guest bytes its MRs pin (reference-counted, so
/// overlapping MRs pin once) and the bytes the kernel charges for them. Guarded by the guest's
/// state lock, but for the staged queues' [`MappingCharge`]s, which give theirs back wherever
/// the queue is dropped. Everything its MRs hold goes back to the daemon's budget at
/// [`clear`](Self::clear) and on drop.
#[derive(Debug)]
pub struct MemoryAccount {
    budget: Arc<HostBudget>,
    mapping_limit: u64,
    /// Mappings of the guest's MR windows and staged queues together.
    mappings: Arc<AtomicU64>,
    /// Of those, the MR windows'.
    window_mappings: u64,
    pinned: PinnedExtents,
    locked_bytes: u64,
}

impl MemoryAccount {
    /// An empty account in `budget` whose guest may hold `mapping_limit` mappings.
    pub fn new(budget: Arc<HostBudget>, mapping_limit: u64) -> Self {
        MemoryAccount {
            budget,
            mapping_limit,
            mappings: Arc::default(),
            window_mappings: 0,
            pinned: PinnedExtents::default(),
            locked_bytes: 0,
        }
    }

    /// Mappings held by the guest's live MR windows and staged queues.
    pub fn mappings(&self) -> u64 {
        self.mappings.load(Ordering::Relaxed)
    }

    /// Distinct guest bytes the guest's live MRs pin.
    pub fn pinned_bytes(&self) -> u64 {
        self.pinned.bytes()
    }

    /// Bytes the kernel charges for the guest's live MRs to the daemon's locked memory.
    pub fn locked_bytes(&self) -> u64 {
        self.locked_bytes
    }

    /// Takes `mappings` from the guest's quota, or nothing: the current use if they do not fit.
    fn take_mappings(&self, mappings: u64) -> Result<(), BudgetError> {
        take(&self.mappings, mappings, self.mapping_limit).map_err(|used| {
            BudgetError::GuestMappings {
                limit: self.mapping_limit,
                used,
                requested: mappings,
            }
        })
    }

    /// Takes what `plan`'s window will hold, beside everything held already (a re-registration
    /// holds its old window until the new one is registered), if it fits the guest's quota and
    /// the daemon's budget; takes nothing otherwise. Give it back with [`release`](Self::release)
    /// of the window made from `plan`.
    pub fn charge(&mut self, plan: &MrPlan<'_>) -> Result<(), BudgetError> {
        let mappings = plan.mappings();
        self.take_mappings(mappings)?;
        let new_bytes = self.pinned.unpinned_bytes(plan.pinned_extents());
        let charge = Charge {
            mappings,
            pinned_bytes: new_bytes,
            locked_bytes: plan.locked_bytes(),
        };
        if let Err(e) = self.budget.charge(charge) {
            give_back(&self.mappings, mappings);
            return Err(e);
        }
        let pinned = self.pinned.pin(plan.pinned_extents());
        debug_assert_eq!(pinned, new_bytes);
        self.window_mappings += mappings;
        self.locked_bytes += charge.locked_bytes;
        Ok(())
    }

    /// Charges `mappings` of a staged queue to the guest's quota and the daemon's budget; they
    /// go back when the returned charge is dropped.
    pub fn charge_mappings(&self, mappings: u64) -> Result<MappingCharge, BudgetError> {
        self.take_mappings(mappings)?;
        if let Err(e) = self.budget.charge(Charge {
            mappings,
            ..Charge::default()
        }) {
            give_back(&self.mappings, mappings);
            return Err(e);
        }
        Ok(MappingCharge {
            budget: Arc::clone(&self.budget),
            guest: Arc::clone(&self.mappings),
            mappings,
        })
    }

    /// Gives back what `window` held (its MR is deregistered or about to be dropped).
    pub fn release(&mut self, window: &MrWindow) {
        self.give_back(
            window.mappings(),
            window.pinned_extents(),
            window.locked_bytes(),
        );
    }

    /// Gives back what was charged for `plan`, whose window could not be mapped.
    pub fn release_plan(&mut self, plan: &MrPlan<'_>) {
        self.give_back(plan.mappings(), plan.pinned_extents(), plan.locked_bytes());
    }

    fn give_back(&mut self, mappings: u64, extents: &[Extent], locked_bytes: u64) {
        let unpinned = self.pinned.unpin(extents);
        let mappings = mappings.min(self.window_mappings);
        self.window_mappings -= mappings;
        give_back(&self.mappings, mappings);
        let locked_bytes = locked_bytes.min(self.locked_bytes);
        self.locked_bytes -= locked_bytes;
        self.budget.release(Charge {
            mappings,
            pinned_bytes: unpinned,
            locked_bytes,
        });
    }

    /// Gives back everything the guest's MRs hold (they are all gone); staged queues give
    /// theirs back as they go.
    pub fn clear(&mut self) {
        self.budget.release(Charge {
            mappings: self.window_mappings,
            pinned_bytes: self.pinned.bytes(),
            locked_bytes: self.locked_bytes,
        });
        give_back(&self.mappings, self.window_mappings);
        self.window_mappings = 0;
        self.locked_bytes = 0;
        self.pinned.clear();
    }
}

impl Drop for MemoryAccount {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::guest_ram::GuestRamFiles;
    use crate::memory::mr_window::MrPages;
    use crate::memory::pinned_extents::Extent;
    use crate::memory::populated::PopulatedRam;
    use crate::memory::test_files::*;

    fn pages_request(pages: &[u64]) -> MrPages<'_> {
        MrPages {
            iova: 0,
            length: pages.len() as u64 * PAGE,
            page_shift: 12,
            pages,
        }
    }

    fn budget(mappings: u64, pinned_bytes: u64) -> Arc<HostBudget> {
        Arc::new(HostBudget::new(HostBudgetLimits {
            mappings,
            pinned_bytes,
            locked_bytes: u64::MAX,
        }))
    }

    #[test]
    fn guest_quota_then_daemon_budget_shared_by_accounts() {
        let (_file, mem) = one_file_two_regions();
        let ram = GuestRamFiles::new(&mem).unwrap();
        let scattered: Vec<u64> = (0..6).map(|i| LOW + 2 * i * PAGE).collect();
        let plan = MrWindow::plan(&ram, &pages_request(&scattered), GIB).unwrap();
        assert_eq!(plan.mappings(), 6);

        let daemon = budget(16, GIB);
        let mut first = MemoryAccount::new(Arc::clone(&daemon), 10);
        let mut second = MemoryAccount::new(Arc::clone(&daemon), 10);
        first.charge(&plan).unwrap();
        // The guest's own quota: 6 + 6 > 10.
        assert_eq!(
            first.charge(&plan),
            Err(BudgetError::GuestMappings {
                limit: 10,
                used: 6,
                requested: 6
            })
        );
        second.charge(&plan).unwrap();
        // Both within their quota, but the daemon's 16 are shared: 12 + 6 > 16.
        let mut third = MemoryAccount::new(Arc::clone(&daemon), 10);
        assert_eq!(
            third.charge(&plan),
            Err(BudgetError::DaemonMappings {
                limit: 16,
                used: 12,
                requested: 6
            })
        );
        assert_eq!((daemon.mappings(), third.mappings()), (12, 0));
        // A failed charge took nothing; a release and a dropped account give back.
        first.release_plan(&plan);
        third.charge(&plan).unwrap();
        drop(second);
        third.clear();
        assert_eq!((daemon.mappings(), daemon.pinned_bytes()), (0, 0));
    }

    #[test]
    fn overlapping_mrs_pin_distinct_bytes_once() {
        let (_file, mem) = one_file_two_regions();
        let ram = GuestRamFiles::new(&mem).unwrap();
        let four: Vec<u64> = (0..4).map(|i| LOW + i * PAGE).collect();
        let overlapping: Vec<u64> = (2..8).map(|i| LOW + i * PAGE).collect();
        let daemon = budget(100, 8 * PAGE);
        let mut account = MemoryAccount::new(Arc::clone(&daemon), 100);

        let mut plan = MrWindow::plan(&ram, &pages_request(&four), GIB).unwrap();
        account.charge(&plan).unwrap();
        let window = plan.map(&mut PopulatedRam::default()).unwrap();
        // The same pages again pin nothing more.
        let mut again = MrWindow::plan(&ram, &pages_request(&four), GIB).unwrap();
        account.charge(&again).unwrap();
        let window_again = again.map(&mut PopulatedRam::default()).unwrap();
        assert_eq!(
            (account.pinned_bytes(), daemon.pinned_bytes()),
            (4 * PAGE, 4 * PAGE)
        );
        // Six pages, two of them pinned already.
        let plan = MrWindow::plan(&ram, &pages_request(&overlapping), GIB).unwrap();
        account.charge(&plan).unwrap();
        assert_eq!(daemon.pinned_bytes(), 8 * PAGE);
        // A ninth distinct page is over the daemon's budget.
        let ninth = [LOW + 8 * PAGE];
        let over = MrWindow::plan(&ram, &pages_request(&ninth), GIB).unwrap();
        assert_eq!(
            account.charge(&over),
            Err(BudgetError::DaemonPinned {
                limit: 8 * PAGE,
                used: 8 * PAGE,
                requested: PAGE
            })
        );
        // Releasing one of the two identical MRs unpins nothing; the other frees pages 0 and 1.
        account.release(&window);
        assert_eq!(daemon.pinned_bytes(), 8 * PAGE);
        account.release(&window_again);
        assert_eq!(daemon.pinned_bytes(), 6 * PAGE);
        account.release_plan(&plan);
        assert_eq!((daemon.pinned_bytes(), daemon.mappings()), (0, 0));
    }

    #[test]
    fn the_same_pages_registered_again_are_locked_again() {
        // The kernel charges every MR its pages: sixteen MRs over the same four pages lock
        // sixteen times four, whatever they pin.
        let (_file, mem) = one_file_two_regions();
        let ram = GuestRamFiles::new(&mem).unwrap();
        let four: Vec<u64> = (0..4).map(|i| LOW + i * PAGE).collect();
        let daemon = Arc::new(HostBudget::new(HostBudgetLimits {
            mappings: 100,
            pinned_bytes: GIB,
            locked_bytes: 12 * PAGE,
        }));
        let mut account = MemoryAccount::new(Arc::clone(&daemon), 100);
        let plan = MrWindow::plan(&ram, &pages_request(&four), GIB).unwrap();
        assert_eq!(plan.locked_bytes(), 4 * PAGE);
        for _ in 0..3 {
            account.charge(&plan).unwrap();
        }
        assert_eq!(
            (daemon.pinned_bytes(), daemon.locked_bytes()),
            (4 * PAGE, 12 * PAGE)
        );
        assert_eq!(
            account.charge(&plan),
            Err(BudgetError::DaemonLocked {
                limit: 12 * PAGE,
                used: 12 * PAGE,
                requested: 4 * PAGE
            })
        );
        // The refused charge took nothing, the mappings of the guest's quota included.
        assert_eq!(account.mappings(), 3 * plan.mappings());
        account.release_plan(&plan);
        assert_eq!(daemon.locked_bytes(), 8 * PAGE);
        account.charge(&plan).unwrap();
        drop(account);
        assert_eq!(
            (
                daemon.pinned_bytes(),
                daemon.locked_bytes(),
                daemon.mappings()
            ),
            (0, 0, 0)
        );
    }

    #[test]
    fn locked_bytes_are_the_base_pages_a_range_spans() {
        assert_eq!(locked_bytes(0, 1), 4096);
        assert_eq!(locked_bytes(4095, 2), 8192);
        assert_eq!(locked_bytes(4096 + 10, 4096), 8192);
        assert_eq!(locked_bytes(0, 2 << 20), 2 << 20);
        assert_eq!(locked_bytes(0, 0), 0);
    }

    #[test]
    fn staged_queue_mappings_share_the_guest_quota_and_the_daemon_budget() {
        let (_file, mem) = one_file_two_regions();
        let ram = GuestRamFiles::new(&mem).unwrap();
        let scattered: Vec<u64> = (0..6).map(|i| LOW + 2 * i * PAGE).collect();
        let plan = MrWindow::plan(&ram, &pages_request(&scattered), GIB).unwrap();
        let daemon = budget(12, GIB);
        let mut first = MemoryAccount::new(Arc::clone(&daemon), 8);
        let queues: Vec<MappingCharge> =
            (0..3).map(|_| first.charge_mappings(1).unwrap()).collect();
        // 3 queues + 6 window mappings > 8: the guest's quota counts both.
        assert_eq!(
            first.charge(&plan),
            Err(BudgetError::GuestMappings {
                limit: 8,
                used: 3,
                requested: 6
            })
        );
        let second = MemoryAccount::new(Arc::clone(&daemon), 100);
        let more: Vec<MappingCharge> = (0..9).map(|_| second.charge_mappings(1).unwrap()).collect();
        // The daemon's 12 are shared: 3 + 9 held.
        assert_eq!(
            second.charge_mappings(1).unwrap_err(),
            BudgetError::DaemonMappings {
                limit: 12,
                used: 12,
                requested: 1
            }
        );
        assert_eq!((first.mappings(), second.mappings()), (3, 9));
        // A queue's charge goes back with it, even after its account cleared its MRs.
        first.clear();
        drop(queues);
        assert_eq!((first.mappings(), daemon.mappings()), (0, 9));
        drop(more);
        assert_eq!(daemon.mappings(), 0);
    }

    #[test]
    fn repeated_pages_cost_mappings_not_pinned_bytes() {
        let (_file, mem) = one_file_two_regions();
        let ram = GuestRamFiles::new(&mem).unwrap();
        // One page four times: four places in the window, one page pinned.
        let repeated = [LOW; 4];
        let mut plan = MrWindow::plan(&ram, &pages_request(&repeated), GIB).unwrap();
        assert_eq!(plan.mappings(), 4);
        assert_eq!(
            plan.pinned_extents(),
            &[Extent {
                start: LOW,
                end: LOW + PAGE
            }]
        );
        let window = plan.map(&mut PopulatedRam::default()).unwrap();
        assert_eq!(window.mappings(), 4);
        // A buffer mapped twice in a row (a "mirrored" ring): two runs, its pages pinned once.
        let ring: Vec<u64> = (0..2)
            .flat_map(|_| (0..8).map(|i| HIGH + i * PAGE))
            .collect();
        let plan = MrWindow::plan(&ram, &pages_request(&ring), GIB).unwrap();
        assert_eq!(plan.mappings(), 2);
        assert_eq!(
            plan.pinned_extents().iter().map(Extent::len).sum::<u64>(),
            8 * PAGE
        );
    }

    #[test]
    fn mapping_budget_keeps_a_reserve() {
        assert_eq!(default_mapping_budget(65530), 65530 - 16382);
        assert_eq!(default_mapping_budget(1 << 20), 3 << 18);
        // Small max_map_count: the floor of the reserve holds.
        assert_eq!(default_mapping_budget(8192), 4096);
        assert_eq!(default_mapping_budget(1000), 0);
        assert!(read_max_map_count() > 0);
        assert!(default_pinned_budget() > 0);
    }

    #[test]
    fn host_budget_charges_both_or_nothing() {
        let budget = HostBudget::new(HostBudgetLimits {
            mappings: 10,
            pinned_bytes: 100,
            locked_bytes: 200,
        });
        let charge = |mappings, pinned_bytes, locked_bytes| Charge {
            mappings,
            pinned_bytes,
            locked_bytes,
        };
        budget.charge(charge(4, 60, 60)).unwrap();
        assert_eq!(
            budget.charge(charge(7, 0, 0)),
            Err(BudgetError::DaemonMappings {
                limit: 10,
                used: 4,
                requested: 7
            })
        );
        assert_eq!(
            budget.charge(charge(1, 41, 41)),
            Err(BudgetError::DaemonPinned {
                limit: 100,
                used: 60,
                requested: 41
            })
        );
        // The failed pinned charge gave its mappings back.
        assert_eq!((budget.mappings(), budget.pinned_bytes()), (4, 60));
        // Locked bytes count every charge whole: 60 + 141 > 200 although the pinned fit.
        assert_eq!(
            budget.charge(charge(1, 10, 141)),
            Err(BudgetError::DaemonLocked {
                limit: 200,
                used: 60,
                requested: 141
            })
        );
        let held = (
            budget.mappings(),
            budget.pinned_bytes(),
            budget.locked_bytes(),
        );
        assert_eq!(held, (4, 60, 60));
        budget.charge(charge(6, 40, 140)).unwrap();
        budget.release(charge(10, 100, 200));
        let held = (
            budget.mappings(),
            budget.pinned_bytes(),
            budget.locked_bytes(),
        );
        assert_eq!(held, (0, 0, 0));
    }
}

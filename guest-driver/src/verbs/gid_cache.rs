//! The per-context cache of each port's GID table, behind
//! [`Context::gid_table`](super::Context::gid_table).
//!
//! Why: rdma-core's `ibv_devinfo -v` asks for every index of a port's GID table (1024 on rxe)
//! twice, once with `ibv_query_gid` and once with `ibv_query_gid_type`. One control command per
//! call is 2048 round trips through the device per port, minutes through a VM. A port's table
//! is read whole instead (QUERY_PORT for `gid_tbl_len`, then QUERY_GID_TABLE: one command per
//! [`GID_TABLE_BATCH`](vrdma_spec::wire::GID_TABLE_BATCH) populated entries) and kept.
//!
//! When a kept table is dropped:
//! - **On events, before anyone sees them.** Every event read from the device passes through
//!   [`GidCache::observe`] at the moment it leaves the transport, before it is returned or
//!   stashed for another waiter (see [`super::event`]). `GID_CHANGE`, `PORT_ACTIVE` and
//!   `PORT_ERR` drop the table of their port; `DEVICE_FATAL`, `EVENTS_LOST` (a dropped event
//!   may have been a `GID_CHANGE`) and a failed event queue drop every table. So a program that
//!   receives `IBV_EVENT_GID_CHANGE` and then queries reads the device's table as it is after
//!   the change (the host raises the event once its table changed). A table read concurrently
//!   with such an event is returned to its reader but not kept: each port has a generation,
//!   bumped by every invalidation, and a read made under an older generation is not stored.
//! - **After [`DEFAULT_GID_CACHE_LIFETIME`]** (or the context's own lifetime): a kept table
//!   older than that is read again. This covers what events cannot: a program of the verbs
//!   API that never reads events (then nothing reads the event queue and the first rule never
//!   fires), the time between the host's change and the event being read, and an event lost
//!   on the way. It bounds staleness, it does not promise freshness: a GID that changed on the
//!   host is seen at most one lifetime late (the lifetime counts from before the read). The host's own table already
//!   lags its network interfaces (the kernel updates it from netdev events in a work queue).
//!
//! Revalidating each query with a cheap command (a generation in QUERY_PORT) was not chosen:
//! the device offers no such generation, and one command per query is exactly the cost this
//! cache removes. Errors are never kept: a failed read is retried by the next query.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use vrdma_spec::wire::GidEntry;

use super::event::DeviceEvent;

/// How long a kept GID table answers queries when no event dropped it before: the staleness
/// bound for programs that never read events. Long enough that one `ibv_devinfo` pass over
/// 1024 indices (microseconds each from the cache) needs one read of the table, short enough
/// to be below what a person or a connection manager retrying notices.
pub const DEFAULT_GID_CACHE_LIFETIME: Duration = Duration::from_millis(100);

/// A port's GID table as the device reported it at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GidTable {
    len: u32,
    populated: Vec<(u32, GidEntry)>,
}

impl GidTable {
    /// A table of `len` indices (the port's `gid_tbl_len`) of which `populated` (valid entries
    /// by increasing index, every index below `len`) are in use.
    pub fn new(len: u32, populated: Vec<(u32, GidEntry)>) -> GidTable {
        debug_assert!(populated.windows(2).all(|w| w[0].0 < w[1].0));
        debug_assert!(populated.iter().all(|(index, _)| *index < len));
        GidTable { len, populated }
    }

    /// The port's `gid_tbl_len`: indices below it exist, populated or empty.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether the port has no GID index at all.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The populated entries with their indices, by increasing index.
    pub fn populated(&self) -> &[(u32, GidEntry)] {
        &self.populated
    }

    /// Entry `index`: `None` if it is empty or beyond [`Self::len`] (tell them apart with
    /// `index < len()`). A returned entry is valid and its `gid_type()` is `Ok`.
    pub fn entry(&self, index: u32) -> Option<&GidEntry> {
        let at = self
            .populated
            .binary_search_by_key(&index, |(i, _)| *i)
            .ok()?;
        Some(&self.populated[at].1)
    }
}

/// A kept table and when it was read.
struct Kept {
    table: Arc<GidTable>,
    read_at: Instant,
}

/// What the cache holds for one port.
#[derive(Default)]
struct PortState {
    kept: Option<Kept>,
    /// Bumped by every invalidation of the port: a read begun under an older value may predate
    /// the change and is not kept.
    generation: u64,
}

/// The GID tables of a context's ports.
#[derive(Default)]
pub(crate) struct GidCache {
    state: Mutex<CacheState>,
}

struct CacheState {
    lifetime: Duration,
    ports: HashMap<u8, PortState>,
    /// Bumped by every invalidation of all ports, which covers ports not in `ports` yet.
    all_generation: u64,
}

impl Default for CacheState {
    fn default() -> Self {
        CacheState {
            lifetime: DEFAULT_GID_CACHE_LIFETIME,
            ports: HashMap::new(),
            all_generation: 0,
        }
    }
}

impl CacheState {
    /// What a read of `port`'s table begun now must still see when it ends to be kept.
    fn generation(&self, port: u8) -> (u64, u64) {
        let port = self.ports.get(&port).map_or(0, |s| s.generation);
        (port, self.all_generation)
    }
}

impl GidCache {
    /// Sets how long a kept table answers (zero: every query reads the device).
    pub(crate) fn set_lifetime(&self, lifetime: Duration) {
        self.state.lock().lifetime = lifetime;
        if lifetime.is_zero() {
            self.invalidate_all();
        }
    }

    /// The table of `port`: the kept one if it is younger than the lifetime, else the one
    /// `read` returns (kept unless an invalidation of the port happened meanwhile).
    pub(crate) fn table<E>(
        &self,
        port: u8,
        read: impl FnOnce() -> Result<GidTable, E>,
    ) -> Result<Arc<GidTable>, E> {
        self.table_at(port, Instant::now, read)
    }

    /// [`Self::table`] with the clock as a parameter, for tests.
    fn table_at<E>(
        &self,
        port: u8,
        now: impl Fn() -> Instant,
        read: impl FnOnce() -> Result<GidTable, E>,
    ) -> Result<Arc<GidTable>, E> {
        let (lifetime, generation) = {
            let state = self.state.lock();
            let kept = state.ports.get(&port).and_then(|s| s.kept.as_ref());
            if let Some(kept) = kept {
                if now().saturating_duration_since(kept.read_at) < state.lifetime {
                    return Ok(kept.table.clone());
                }
            }
            (state.lifetime, state.generation(port))
        };
        // The lock is not held while the device answers: the event thread must be able to
        // invalidate meanwhile, and no query waits for another's command.
        let read_at = now();
        let table = Arc::new(read()?);
        if !lifetime.is_zero() {
            let mut state = self.state.lock();
            if state.generation(port) == generation {
                state.ports.entry(port).or_default().kept = Some(Kept {
                    table: table.clone(),
                    read_at,
                });
            }
        }
        Ok(table)
    }

    /// Drops the table of `port`.
    pub(crate) fn invalidate(&self, port: u8) {
        let mut state = self.state.lock();
        let port = state.ports.entry(port).or_default();
        port.kept = None;
        port.generation += 1;
    }

    /// Drops every table.
    pub(crate) fn invalidate_all(&self) {
        let mut state = self.state.lock();
        for port in state.ports.values_mut() {
            port.kept = None;
        }
        state.all_generation += 1;
    }

    /// Drops what `event`, just read from the device, makes out of date.
    pub(crate) fn observe(&self, event: &DeviceEvent) {
        match *event {
            DeviceEvent::GidChange { port }
            | DeviceEvent::PortActive { port }
            | DeviceEvent::PortError { port } => match u8::try_from(port) {
                Ok(port) => self.invalidate(port),
                // No such port: nothing kept for it, but the event is suspicious enough.
                Err(_) => self.invalidate_all(),
            },
            DeviceEvent::DeviceFatal { .. } | DeviceEvent::EventsLost { .. } => {
                self.invalidate_all()
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use vrdma_spec::verbs::GidType;

    fn table(first: u8) -> GidTable {
        GidTable::new(
            16,
            vec![
                (0, GidEntry::valid([first; 16], GidType::RoceV2)),
                (3, GidEntry::valid([first + 1; 16], GidType::RoceV1)),
            ],
        )
    }

    #[test]
    fn entries_are_found_by_index_and_empty_ones_are_none() {
        let t = table(1);
        assert_eq!(t.len(), 16);
        assert_eq!(t.entry(3).unwrap().gid, [2; 16]);
        assert_eq!(t.entry(1), None);
        assert_eq!(t.entry(99), None);
        assert_eq!(t.populated().len(), 2);
    }

    #[test]
    fn a_kept_table_answers_within_its_lifetime_and_is_read_again_after() {
        let cache = GidCache::default();
        let start = Instant::now();
        let clock = Cell::new(start);
        let reads = Cell::new(0);
        let read = |n| {
            reads.set(reads.get() + 1);
            Ok::<_, ()>(table(n))
        };
        let t = cache.table_at(1, || clock.get(), || read(1)).unwrap();
        assert_eq!(t.entry(0).unwrap().gid, [1; 16]);
        clock.set(start + DEFAULT_GID_CACHE_LIFETIME - Duration::from_millis(1));
        let t = cache.table_at(1, || clock.get(), || read(5)).unwrap();
        assert_eq!((t.entry(0).unwrap().gid, reads.get()), ([1; 16], 1));
        clock.set(start + DEFAULT_GID_CACHE_LIFETIME);
        let t = cache.table_at(1, || clock.get(), || read(5)).unwrap();
        assert_eq!((t.entry(0).unwrap().gid, reads.get()), ([5; 16], 2));
        // Ports are kept apart.
        let t = cache.table_at(2, || clock.get(), || read(9)).unwrap();
        assert_eq!((t.entry(0).unwrap().gid, reads.get()), ([9; 16], 3));
    }

    #[test]
    fn port_events_drop_their_port_and_device_events_every_port() {
        let cache = GidCache::default();
        let get = |port, n| cache.table(port, || Ok::<_, ()>(table(n))).unwrap();
        get(1, 1);
        get(2, 1);
        cache.observe(&DeviceEvent::GidChange { port: 1 });
        assert_eq!(get(1, 7).entry(0).unwrap().gid, [7; 16]);
        assert_eq!(get(2, 7).entry(0).unwrap().gid, [1; 16], "other port kept");
        cache.observe(&DeviceEvent::PortError { port: 2 });
        assert_eq!(get(2, 8).entry(0).unwrap().gid, [8; 16]);
        cache.observe(&DeviceEvent::PortActive { port: 2 });
        assert_eq!(get(2, 9).entry(0).unwrap().gid, [9; 16]);
        cache.observe(&DeviceEvent::QpFatal { qp: 1 });
        assert_eq!(get(2, 10).entry(0).unwrap().gid, [9; 16], "not a GID event");
        for event in [
            DeviceEvent::EventsLost { count: 1 },
            DeviceEvent::DeviceFatal { epoch: 2 },
        ] {
            get(1, 11);
            get(2, 11);
            cache.observe(&event);
            assert_eq!(get(1, 12).entry(0).unwrap().gid, [12; 16], "{event:?}");
            assert_eq!(get(2, 12).entry(0).unwrap().gid, [12; 16], "{event:?}");
        }
    }

    #[test]
    fn a_read_racing_an_invalidation_is_returned_but_not_kept() {
        let cache = GidCache::default();
        // The event arrives while the device answers the read.
        let t = cache
            .table(1, || {
                cache.observe(&DeviceEvent::GidChange { port: 1 });
                Ok::<_, ()>(table(1))
            })
            .unwrap();
        assert_eq!(t.entry(0).unwrap().gid, [1; 16]);
        let t = cache.table(1, || Ok::<_, ()>(table(2))).unwrap();
        assert_eq!(
            t.entry(0).unwrap().gid,
            [2; 16],
            "the racing read was not kept"
        );
        // Same for an invalidation of every port, for a port never read before.
        let t = cache
            .table(3, || {
                cache.invalidate_all();
                Ok::<_, ()>(table(1))
            })
            .unwrap();
        assert_eq!(t.entry(0).unwrap().gid, [1; 16]);
        let t = cache.table(3, || Ok::<_, ()>(table(2))).unwrap();
        assert_eq!(t.entry(0).unwrap().gid, [2; 16]);
    }

    #[test]
    fn errors_are_not_kept_and_a_zero_lifetime_reads_every_time() {
        let cache = GidCache::default();
        assert_eq!(cache.table(1, || Err::<GidTable, _>(7)), Err(7));
        assert_eq!(cache.table(1, || Ok::<_, ()>(table(1))).unwrap().len(), 16);
        cache.set_lifetime(Duration::ZERO);
        let t = cache.table(1, || Ok::<_, ()>(table(4))).unwrap();
        assert_eq!(t.entry(0).unwrap().gid, [4; 16]);
        let t = cache.table(1, || Ok::<_, ()>(table(5))).unwrap();
        assert_eq!(t.entry(0).unwrap().gid, [5; 16]);
    }
}

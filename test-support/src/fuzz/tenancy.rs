//! The daemon a handler sequence runs against, and the tenancy invariants checked after every
//! step (spec §10, §12.1).
//!
//! Each of the two guests is, as the input's first byte says, a tenant with an address of its
//! own or a guest that shares the host's identity; the daemon's host budget is roomy or tight
//! (a few dozen mappings and pages, so that QUOTA answers are common). After every step:
//! - every address vector a guest gave the host device names a source of its own: a tenant's
//!   GID index leads to its address, a host guest's to no tenant's;
//! - every connection set up and every staged UD send the device forwarded aims at a QP
//!   reachable at its destination: through a tenant's address only that tenant's live QPs,
//!   through another address of the host only QPs of no tenant, elsewhere anything;
//! - the daemon's QP-number claims are exactly the tenants' live QPs;
//! - the daemon's budget is the sum of the guests' accounts and within its limits.

use std::collections::BTreeMap;
use std::sync::Arc;

use vrdma_backend::guest::options::{DeviceOptions, StagedRings};
use vrdma_backend::guest_device::GuestDeviceFactory;
use vrdma_backend::identity::endpoints::{Destination, LocalEndpoints, TenantId};
use vrdma_backend::identity::{GuestAddress, GuestIdentity};
use vrdma_backend::memory::budget::{HostBudget, HostBudgetLimits};
use vrdma_backend::resources::kind::ResourceKind;

use super::guest_slot::Slot;
use crate::fake_host::device::{FakeDevice, World, GID0, PAGE};

/// The address of each guest when it is a tenant.
const ADDRESSES: [&str; 2] = ["fd00::a:1", "fd00::b:1"];
/// An address of another machine.
const REMOTE: &str = "fd00::99:1";

fn gid(address: &str) -> [u8; 16] {
    address
        .parse::<GuestAddress>()
        .expect("a valid address")
        .gid()
}

/// Destination GIDs that requests aim at: the host's own, each guest's address (whether or
/// not that guest is a tenant in this run), another machine's.
pub fn destinations() -> [[u8; 16]; 4] {
    [GID0, gid(ADDRESSES[0]), gid(ADDRESSES[1]), gid(REMOTE)]
}

/// One daemon: a factory per guest over one host budget and one table of tenant endpoints.
pub(super) struct Daemon {
    /// The factory of each guest slot (a reconnecting guest comes from the same one).
    pub(super) factories: [GuestDeviceFactory; 2],
    /// Each guest's tenant and address GID, when it is a tenant.
    tenants: [Option<(TenantId, [u8; 16])>; 2],
    budget: Arc<HostBudget>,
    endpoints: Arc<LocalEndpoints>,
}

impl Daemon {
    /// The daemon `shape` asks for: bit 0 and 1 make guest 0 and 1 tenants, bits 2 and 3
    /// both set make the budget tight.
    pub(super) fn new(fake: &Arc<FakeDevice>, base: &DeviceOptions, shape: u8) -> Daemon {
        let limits = if shape & 0b1100 == 0b1100 {
            HostBudgetLimits {
                mappings: 32,
                pinned_bytes: 256 * PAGE,
                locked_bytes: 512 * PAGE,
            }
        } else {
            HostBudgetLimits {
                mappings: 1 << 20,
                pinned_bytes: 1 << 40,
                locked_bytes: u64::MAX,
            }
        };
        let budget = Arc::new(HostBudget::new(limits));
        let endpoints = LocalEndpoints::new();
        let mut tenants = [None; 2];
        let factories = [0, 1].map(|g| {
            let mut identity = GuestIdentity {
                name: format!("guest{g}"),
                ..base.identity.clone()
            };
            if shape & (1 << g) != 0 {
                let address: GuestAddress = ADDRESSES[g].parse().expect("a valid address");
                fake.world().add_address_gids(&address);
                identity.addresses = vec![address];
            }
            // The second guest's RC and UC QPs and its CQs go through staging rings (spec
            // §9.7, §9.8).
            let (staged_rings, staged_cqs) = if g == 1 {
                (StagedRings::Always, StagedRings::Always)
            } else {
                (base.staged_rings, base.staged_cqs)
            };
            let options = DeviceOptions {
                identity,
                staged_rings,
                staged_cqs,
                ..base.clone()
            };
            let factory = GuestDeviceFactory::with_daemon(
                fake.clone(),
                options,
                Arc::clone(&budget),
                Arc::clone(&endpoints),
            )
            .expect("options");
            if shape & (1 << g) != 0 {
                let address = gid(ADDRESSES[g]);
                match endpoints.classify(&address, true) {
                    Destination::Tenant(tenant) => tenants[g] = Some((tenant, address)),
                    other => panic!("guest {g}'s address leads to {other:?}"),
                }
            }
            factory
        });
        Daemon {
            factories,
            tenants,
            budget,
            endpoints,
        }
    }

    /// Guest `g`'s address GID when it is a tenant.
    pub(super) fn tenant_gid(&self, g: usize) -> Option<[u8; 16]> {
        self.tenants[g].map(|(_, gid)| gid)
    }

    /// Whether `gid` is the address of one of the run's tenants.
    pub(super) fn is_tenant_gid(&self, gid: &[u8; 16]) -> bool {
        self.tenants.iter().flatten().any(|(_, a)| a == gid)
    }

    /// Whether the daemon serves any tenant.
    pub(super) fn has_tenants(&self) -> bool {
        self.tenants.iter().any(Option::is_some)
    }

    /// The address guest `g` may bind its CM ids to: its own when it is a tenant, else the
    /// host's (the fake port's first GID, `fe80::1`).
    pub(super) fn cm_address(&self, g: usize) -> std::net::IpAddr {
        std::net::Ipv6Addr::from(self.tenant_gid(g).unwrap_or(GID0)).to_canonical()
    }

    /// Checks the daemon's QP-number claims and budget against its guests.
    pub(super) fn check(&self, fake: &FakeDevice, slots: &[Slot; 2]) {
        self.check_budget(slots);
        assert_eq!(
            self.endpoints.qpn_owners(),
            self.live_tenant_qpns(fake, slots),
            "QP-number claims (left) and the tenants' live QPs (right) differ"
        );
    }

    /// Checks the paths and connections the host device was given since the last call (the
    /// rule holds when a command sets them up: a QP number created later may land behind an
    /// address a connection already aims at) and returns how many connections it checked.
    pub(super) fn check_given(&self, fake: &FakeDevice, slots: &[Slot; 2]) -> usize {
        let qpn_owners = self.live_tenant_qpns(fake, slots);
        let mut w = fake.world();
        let given = std::mem::take(&mut w.paths_given);
        let connections = std::mem::take(&mut w.connections);
        let table = host_gids(&w);
        drop(w);
        for (context, path) in given {
            let g = slot_of(slots, context);
            let source = table
                .get(&u32::from(path.sgid_index))
                .unwrap_or_else(|| panic!("guest {g} sends from GID index {}", path.sgid_index));
            match self.tenants[g] {
                Some((_, own)) => assert_eq!(
                    *source, own,
                    "tenant guest {g} gave the host a path from another source"
                ),
                None => assert!(
                    !self.tenants.iter().flatten().any(|(_, a)| a == source),
                    "host guest {g} gave the host a path from a tenant's address"
                ),
            }
        }
        for c in &connections {
            for dgid in c.dgids {
                assert!(
                    self.reachable(&table, &qpn_owners, &dgid, c.dest_qpn),
                    "guest {}'s QP {} was aimed at QP number {:#x} behind {}",
                    slot_of(slots, c.context),
                    c.qp,
                    c.dest_qpn,
                    std::net::Ipv6Addr::from(dgid)
                );
            }
        }
        connections.len()
    }

    /// Whether QP number `qpn` may be aimed at through `dgid`, as spec §12.1 says, given the
    /// host's GID table and which tenant owns each live QP number.
    pub(super) fn reachable(
        &self,
        table: &BTreeMap<u32, [u8; 16]>,
        qpn_owners: &BTreeMap<u32, TenantId>,
        dgid: &[u8; 16],
        qpn: u32,
    ) -> bool {
        if !table.values().any(|gid| gid == dgid) {
            return true;
        }
        let behind = self
            .tenants
            .iter()
            .flatten()
            .find(|(_, address)| address == dgid)
            .map(|&(tenant, _)| tenant);
        qpn_owners.get(&qpn).copied() == behind
    }

    /// The QP numbers of the tenants' live QPs, with their tenant.
    pub(super) fn live_tenant_qpns(
        &self,
        fake: &FakeDevice,
        slots: &[Slot; 2],
    ) -> BTreeMap<u32, TenantId> {
        let w = fake.world();
        let mut owners = BTreeMap::new();
        for (slot, tenant) in slots.iter().zip(&self.tenants) {
            let Some((tenant, _)) = tenant else { continue };
            for qp in slot.guest.dev().inventory().of(ResourceKind::Qp) {
                if let Some(&(qpn, _)) = qp.host.and_then(|h| w.qps.get(&h)) {
                    owners.insert(qpn, *tenant);
                }
            }
        }
        owners
    }

    fn check_budget(&self, slots: &[Slot; 2]) {
        let (mut mappings, mut pinned, mut locked) = (0, 0, 0);
        for slot in slots {
            let usage = slot.guest.dev().memory_usage();
            // Every mapping the guest's objects hold in the daemon is charged: its MR windows
            // and its staged queues' host buffers.
            let held = slot.guest.dev().inventory().daemon_mappings;
            assert_eq!(
                usage.mappings, held,
                "the guest's objects hold {held} daemon mappings, its account charges {}",
                usage.mappings
            );
            mappings += usage.mappings;
            pinned += usage.pinned_bytes;
            locked += usage.locked_bytes;
        }
        let budget = &self.budget;
        assert_eq!(
            (budget.mappings(), budget.pinned_bytes(), budget.locked_bytes()),
            (mappings, pinned, locked),
            "the daemon's budget (mappings, pinned and locked bytes) and its guests' accounts differ"
        );
        let limits = self.budget.limits();
        assert!(
            mappings <= limits.mappings
                && pinned <= limits.pinned_bytes
                && locked <= limits.locked_bytes,
            "{mappings} mappings, {pinned} pinned and {locked} locked bytes over the daemon's \
             {limits:?}"
        );
    }
}

/// Port 1's GID table of the fake host: index to GID.
pub(super) fn host_gids(w: &World) -> BTreeMap<u32, [u8; 16]> {
    std::iter::once((0, GID0))
        .chain(w.extra_gids.iter().map(|(i, entry)| (*i, entry.gid)))
        .collect()
}

/// Which slot's guest holds host context `context`.
fn slot_of(slots: &[Slot; 2], context: u64) -> usize {
    slots
        .iter()
        .position(|s| s.context == context)
        .unwrap_or_else(|| panic!("context {context} belongs to no guest of the run"))
}

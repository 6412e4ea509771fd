//! Which tenant owns which local addresses and QP numbers, across every guest of the daemon:
//! the check that a QP or UD send aimed at this host reaches only the QPs of the tenant whose
//! address it names.
//!
//! rxe delivers a packet whose destination is one of the host's own addresses by QP number
//! alone (for UD it does not compare the destination address with anything; for RC/UC it
//! compares it with the receiving QP's path). Without this check a guest could aim a UD send
//! at its *own* address and another guest's QP number, and that guest's QP would take it.
//! Tenants are the guests with addresses; guests without addresses share the host's identity
//! and are not tenants: their QPs count as the host's.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A tenant: one configured identity with addresses (every connection to its socket).
pub type TenantId = u32;

/// Where an address vector leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// Not an address of this host device: another machine's QPs, not ours to check.
    Remote,
    /// One of the host's own addresses that no tenant owns.
    Host,
    /// An address of this tenant.
    Tenant(TenantId),
}

/// QP numbers 0 (SMI) and 1 (GSI): the host device's management QPs.
const MANAGEMENT_QPN_LAST: u32 = 1;

/// The daemon-wide table of tenant addresses and QP numbers.
#[derive(Debug, Default)]
pub struct LocalEndpoints {
    table: RwLock<Table>,
}

#[derive(Debug, Default)]
struct Table {
    next_tenant: TenantId,
    addresses: HashMap<[u8; 16], TenantId>,
    qpns: HashMap<u32, Holder>,
    next_claim: u64,
}

/// Who holds a QP number: the tenant, and which claim (a number the host freed and gave to
/// another QP is claimed anew; only the newest claim may give it back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Holder {
    tenant: TenantId,
    claim: u64,
}

impl LocalEndpoints {
    /// An empty table.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    fn read(&self) -> RwLockReadGuard<'_, Table> {
        self.table.read()
    }

    fn write(&self) -> RwLockWriteGuard<'_, Table> {
        self.table.write()
    }

    /// Registers a tenant owning `gids` (its addresses as GIDs).
    pub fn add_tenant(&self, gids: impl IntoIterator<Item = [u8; 16]>) -> TenantId {
        let mut table = self.write();
        let tenant = table.next_tenant;
        table.next_tenant += 1;
        for gid in gids {
            table.addresses.insert(gid, tenant);
        }
        tenant
    }

    /// Whether `gid` is an address of a tenant (a guest without addresses must not send from
    /// it, nor see it in its GID table).
    pub fn is_tenant_address(&self, gid: &[u8; 16]) -> bool {
        self.read().addresses.contains_key(gid)
    }

    /// Whether any tenant has addresses.
    pub fn has_tenants(&self) -> bool {
        !self.read().addresses.is_empty()
    }

    /// Where `dgid` leads, given whether it is an address of the host device (`local`).
    pub fn classify(&self, dgid: &[u8; 16], local: bool) -> Destination {
        if !local {
            return Destination::Remote;
        }
        match self.read().addresses.get(dgid) {
            Some(tenant) => Destination::Tenant(*tenant),
            None => Destination::Host,
        }
    }

    /// Whether a QP or UD send may aim at QP number `qpn` through `destination`: through a
    /// tenant's address only that tenant's QPs, through the host's own addresses only QPs
    /// that are no tenant's, and through neither QP 0 or 1 (the host's management QPs: its
    /// one ib_cm and MAD agents serve every tenant, and a guest's connection manager runs
    /// through the device's CM commands, never by MADs of its own); remote destinations are
    /// another host's business.
    pub fn allows(&self, destination: Destination, qpn: u32) -> bool {
        if destination != Destination::Remote && qpn <= MANAGEMENT_QPN_LAST {
            return false;
        }
        let owner = match destination {
            Destination::Remote => return true,
            Destination::Host => None,
            Destination::Tenant(tenant) => Some(tenant),
        };
        self.read().qpns.get(&qpn).map(|holder| holder.tenant) == owner
    }

    /// Every claimed QP number and its tenant, in order (for audits: the claims must be
    /// exactly the tenants' live QPs).
    pub fn qpn_owners(&self) -> std::collections::BTreeMap<u32, TenantId> {
        self.read()
            .qpns
            .iter()
            .map(|(&qpn, holder)| (qpn, holder.tenant))
            .collect()
    }

    /// Records that `tenant` owns QP number `qpn` until the returned claim is dropped. The
    /// host gives a number out again once the QP holding it is destroyed, which may be before
    /// that QP's claim is dropped: the new claim then takes the number over, and the old one,
    /// when dropped, leaves it to the new.
    pub fn claim_qpn(self: &Arc<Self>, tenant: TenantId, qpn: u32) -> QpnClaim {
        let mut table = self.write();
        let claim = table.next_claim;
        table.next_claim += 1;
        table.qpns.insert(qpn, Holder { tenant, claim });
        QpnClaim {
            endpoints: Arc::clone(self),
            qpn,
            claim,
        }
    }
}

/// What one guest needs of the table: the table, and its tenant if it has addresses.
#[derive(Debug, Clone)]
pub struct TenantLink {
    /// The daemon's table.
    pub endpoints: Arc<LocalEndpoints>,
    /// The guest's tenant; `None` for a guest without addresses (it is the host's).
    pub tenant: Option<TenantId>,
}

impl TenantLink {
    /// Where `dgid` leads, given whether it is an address of the host device.
    pub fn classify(&self, dgid: &[u8; 16], local: bool) -> Destination {
        self.endpoints.classify(dgid, local)
    }

    /// See [`LocalEndpoints::allows`].
    pub fn allows(&self, destination: Destination, qpn: u32) -> bool {
        self.endpoints.allows(destination, qpn)
    }

    /// Claims QP number `qpn` for the guest's tenant; `None` for a guest without one.
    pub fn claim_qpn(&self, qpn: u32) -> Option<QpnClaim> {
        self.tenant
            .map(|tenant| self.endpoints.claim_qpn(tenant, qpn))
    }
}

/// A tenant's ownership of a QP number, given back when dropped (the QP is destroyed).
#[derive(Debug)]
pub struct QpnClaim {
    endpoints: Arc<LocalEndpoints>,
    qpn: u32,
    claim: u64,
}

impl Drop for QpnClaim {
    fn drop(&mut self) {
        let mut table = self.endpoints.write();
        // Only this claim's own hold: a newer claim of the number (the host reused it for
        // another QP, perhaps another tenant's) stays.
        if table.qpns.get(&self.qpn).map(|holder| holder.claim) == Some(self.claim) {
            table.qpns.remove(&self.qpn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xa, 0, 1];
    const B: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xb, 0, 1];
    const HOST: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9];

    #[test]
    fn a_tenant_address_reaches_only_that_tenants_qps() {
        let endpoints = LocalEndpoints::new();
        let (a, b) = (endpoints.add_tenant([A]), endpoints.add_tenant([B]));
        let _qa = endpoints.claim_qpn(a, 0x11);
        let _qb = endpoints.claim_qpn(b, 0x12);
        let to_a = endpoints.classify(&A, true);
        assert_eq!(to_a, Destination::Tenant(a));
        assert!(endpoints.allows(to_a, 0x11));
        // B's QP through A's address (A aiming at B through its own address): refused.
        assert!(!endpoints.allows(to_a, 0x12));
        // A host QP (no tenant's) through A's address: refused too.
        assert!(!endpoints.allows(to_a, 0x99));
        let to_b = endpoints.classify(&B, true);
        assert!(endpoints.allows(to_b, 0x12) && !endpoints.allows(to_b, 0x11));
    }

    #[test]
    fn host_addresses_reach_only_host_qps_and_remote_ones_anything() {
        let endpoints = LocalEndpoints::new();
        let a = endpoints.add_tenant([A]);
        let _qa = endpoints.claim_qpn(a, 0x11);
        let host = endpoints.classify(&HOST, true);
        assert_eq!(host, Destination::Host);
        assert!(endpoints.allows(host, 0x99));
        assert!(!endpoints.allows(host, 0x11));
        // The same address bytes on another machine: its QP numbers are not ours.
        let remote = endpoints.classify(&A, false);
        assert_eq!(remote, Destination::Remote);
        assert!(endpoints.allows(remote, 0x11) && endpoints.allows(remote, 0x99));
    }

    #[test]
    fn a_claim_dropped_after_its_number_was_reused_leaves_the_new_claim() {
        // The host destroyed A's QP 0x11 and gave the number to B's new QP before A's claim
        // went (the claim is dropped after the host destroy and the unmap round trip).
        let endpoints = LocalEndpoints::new();
        let (a, b) = (endpoints.add_tenant([A]), endpoints.add_tenant([B]));
        let old = endpoints.claim_qpn(a, 0x11);
        let new = endpoints.claim_qpn(b, 0x11);
        drop(old);
        let host = endpoints.classify(&HOST, true);
        assert!(
            !endpoints.allows(host, 0x11),
            "B's QP must not become reachable through the host's addresses"
        );
        assert!(!endpoints.allows(endpoints.classify(&A, true), 0x11));
        assert!(endpoints.allows(endpoints.classify(&B, true), 0x11));
        assert_eq!(endpoints.qpn_owners().get(&0x11), Some(&b));
        drop(new);
        assert!(endpoints.allows(host, 0x11));
        assert!(endpoints.qpn_owners().is_empty());
    }

    #[test]
    fn management_qps_are_reachable_through_no_local_address() {
        let endpoints = LocalEndpoints::new();
        endpoints.add_tenant([A]);
        for destination in [
            endpoints.classify(&HOST, true),
            endpoints.classify(&A, true),
        ] {
            for qpn in [0, 1] {
                assert!(!endpoints.allows(destination, qpn), "{destination:?} {qpn}");
            }
            assert_eq!(
                destination == Destination::Host,
                endpoints.allows(destination, 2)
            );
        }
        // Another machine's GSI is that machine's business.
        assert!(endpoints.allows(endpoints.classify(&A, false), 1));
    }

    #[test]
    fn a_dropped_claim_gives_the_qpn_back() {
        let endpoints = LocalEndpoints::new();
        let a = endpoints.add_tenant([A]);
        let claim = endpoints.claim_qpn(a, 0x11);
        let host = endpoints.classify(&HOST, true);
        assert!(!endpoints.allows(host, 0x11));
        drop(claim);
        assert!(endpoints.allows(host, 0x11));
        assert!(!endpoints.allows(endpoints.classify(&A, true), 0x11));
    }
}

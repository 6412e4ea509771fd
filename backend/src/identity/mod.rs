//! A guest's network identity: its name, the RDMA addresses the operator gave it and the
//! traffic policy its address vectors must follow (spec §12).
//!
//! - [`address`]: addresses and names.
//! - [`policy`]: allowed traffic classes, service levels and destination prefixes.
//! - [`endpoints`]: which tenant owns which local addresses and QP numbers, daemon-wide.
//! - [`gid_view`]: the guest's virtual GID table and its translation to the host's.
//! - [`cm_addresses`]: which addresses its connection-manager ids may bind and send from.
//! - [`provision`]: putting the addresses on the host netdev and waiting for their GIDs, over
//!   the [`provision::NetdevAddresses`] trait; [`netlink`] is its rtnetlink implementation.

pub mod address;
pub mod cm_addresses;
pub mod endpoints;
pub mod gid_view;
pub mod netlink;
pub mod policy;
pub mod provision;

pub use address::{address_gid, check_name, GuestAddress, IdentityError, MAX_NAME_LEN};
pub use policy::{IpPrefix, TrafficPolicy};

/// Who a guest is on the network: its name, its addresses and its traffic policy.
///
/// A guest without addresses has no identity of its own: it sees the host port's GID table
/// without the tenants' entries and the host's GUIDs (its policy still applies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestIdentity {
    /// The operator's name for the guest (logs, GUID derivation).
    pub name: String,
    /// The guest's RDMA addresses, in the order of its virtual GID table.
    pub addresses: Vec<GuestAddress>,
    /// What its address vectors may contain.
    pub policy: TrafficPolicy,
}

impl Default for GuestIdentity {
    fn default() -> Self {
        GuestIdentity {
            name: "guest".into(),
            addresses: Vec::new(),
            policy: TrafficPolicy::default(),
        }
    }
}

impl GuestIdentity {
    /// Whether the guest has addresses of its own (a virtual GID table, its own GUID).
    pub fn has_addresses(&self) -> bool {
        !self.addresses.is_empty()
    }

    /// Checks the name and that no address is given twice.
    pub fn validate(&self) -> Result<(), IdentityError> {
        check_name(&self.name)?;
        for (i, a) in self.addresses.iter().enumerate() {
            if self.addresses[..i].iter().any(|b| b.ip == a.ip) {
                return Err(IdentityError::Duplicate(a.ip));
            }
        }
        Ok(())
    }

    /// The guest's node GUID (and system image GUID), in network byte order: an EUI-64 made
    /// from a hash of its name, with the locally administered bit set and the group bit
    /// clear, so it cannot collide with a vendor-assigned GUID. Stable across restarts and
    /// builds (FNV-1a, not the standard library's unspecified hasher).
    pub fn guid(&self) -> [u8; 8] {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in b"vrdma-guest:".iter().chain(self.name.as_bytes()) {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        let mut guid = hash.to_be_bytes();
        guid[0] = (guid[0] | 0x02) & !0x01;
        guid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guids_are_stable_local_and_differ_by_name() {
        let named = |name: &str| GuestIdentity {
            name: name.into(),
            ..GuestIdentity::default()
        };
        let a = named("tenant-a").guid();
        assert_eq!(a, named("tenant-a").guid());
        assert_ne!(a, named("tenant-b").guid());
        assert_eq!(a[0] & 0x03, 0x02, "locally administered, unicast");
        // A fixed value: the GUID must not change between builds.
        assert_eq!(named("tenant-a").guid(), GUID_OF_TENANT_A);
    }

    const GUID_OF_TENANT_A: [u8; 8] = [0xe2, 0x7d, 0x63, 0xf0, 0xb9, 0x98, 0x6e, 0xa0];
}

//! The fake port's netdev: [`FakeDevice`] implements the backend's `NetdevAddresses`, and an
//! address added to it gets GID entries in port 1's table the way the kernel fills an rxe
//! port's (RoCE v2 only, or v1 and v2 with [`World::both_roce_types`]).

use std::io;

use vrdma_backend::identity::provision::{NetdevAddresses, ProvisionError};
use vrdma_backend::identity::GuestAddress;
use vrdma_spec::verbs::GidType;
use vrdma_spec::wire::GidEntry;

use super::device::{FakeDevice, World};

impl World {
    /// Puts the RoCE v2 entry (and with [`World::both_roce_types`] first the v1 entry) of
    /// `address` into port 1's GID table at the lowest free indices (above [`GID0`]'s), as the
    /// kernel does when the netdev gets an address.
    pub fn add_address_gids(&mut self, address: &GuestAddress) {
        let types: &[GidType] = if self.both_roce_types {
            &[GidType::RoceV1, GidType::RoceV2]
        } else {
            &[GidType::RoceV2]
        };
        for &gid_type in types {
            let index = (1..)
                .find(|i| !self.extra_gids.iter().any(|(used, _)| used == i))
                .expect("a free index");
            self.extra_gids
                .push((index, GidEntry::valid(address.gid(), gid_type)));
        }
    }

    /// Takes the GID entries of `address` out of port 1's table.
    pub fn remove_address_gids(&mut self, address: &GuestAddress) {
        self.extra_gids
            .retain(|(_, entry)| entry.gid != address.gid());
    }
}

/// The fake port's netdev: adding an address fills the GID table as the kernel would.
impl NetdevAddresses for FakeDevice {
    fn netdev(&self) -> String {
        "fakeeth0".into()
    }

    fn add(&self, address: &GuestAddress) -> Result<bool, ProvisionError> {
        let mut w = self.world();
        if w.refuse_address == Some(address.ip) {
            return Err(ProvisionError::Netlink {
                op: "RTM_NEWADDR",
                address: address.to_string(),
                netdev: self.netdev(),
                source: io::Error::from_raw_os_error(libc::EPERM),
            });
        }
        if w.netdev_addresses.iter().any(|a| a.ip == address.ip) {
            return Ok(false);
        }
        w.netdev_addresses.push(*address);
        if !w.no_gids_for_new_addresses {
            w.add_address_gids(address);
        }
        Ok(true)
    }

    fn remove(&self, address: &GuestAddress) -> Result<(), ProvisionError> {
        let mut w = self.world();
        w.netdev_addresses.retain(|a| a.ip != address.ip);
        w.remove_address_gids(address);
        Ok(())
    }
}

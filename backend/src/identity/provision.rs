//! Making a guest's addresses usable: each goes onto the netdev behind the host port, and the
//! daemon waits until the kernel has put the address's RoCE GID entries into the port's GID
//! table: one of each RoCE type the table held before (rxe: RoCE v2 only; a port with v1 and
//! v2 gets both), at least one. Addresses the daemon added are removed again at shutdown; ones that were
//! there before are left alone.
//!
//! The netdev side is the [`NetdevAddresses`] trait: [`super::netlink::NetlinkAddresses`] on a
//! real host, the fake host device in tests (it fills its GID table as the kernel would).

use std::fmt;
use std::time::{Duration, Instant};

use log::{info, warn};

use super::address::GuestAddress;
use super::gid_view::port_gid_types;
use crate::host::{DeviceError, HostDevice};
use vrdma_spec::verbs::GidType;
use vrdma_spec::wire::GidEntry;

/// Default bound on the wait for an address's GID entries.
pub const DEFAULT_GID_WAIT: Duration = Duration::from_secs(5);
/// How often the GID table is read while waiting.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// The addresses of the netdev behind an RDMA port.
pub trait NetdevAddresses: Send + Sync {
    /// The netdev's name, for messages.
    fn netdev(&self) -> String;

    /// Adds `address`; `Ok(false)` when the netdev already had it (then it is not the
    /// daemon's to remove).
    fn add(&self, address: &GuestAddress) -> Result<bool, ProvisionError>;

    /// Removes `address`.
    fn remove(&self, address: &GuestAddress) -> Result<(), ProvisionError>;
}

/// Why an address could not be made usable.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// The netdev behind the port could not be found.
    #[error("cannot find the netdev of {device} port {port}: {reason}")]
    NoNetdev {
        /// RDMA device.
        device: String,
        /// Its port.
        port: u8,
        /// What was missing.
        reason: String,
    },
    /// The kernel refused a netlink request.
    #[error("netlink {op} of {address} on {netdev}: {source}")]
    Netlink {
        /// RTM_NEWADDR or RTM_DELADDR.
        op: &'static str,
        /// The address.
        address: String,
        /// The netdev.
        netdev: String,
        /// The kernel's answer.
        #[source]
        source: std::io::Error,
    },
    /// The GID entries did not appear in time.
    #[error(
        "{address} is on {netdev} but the GID table of port {port} has no {missing} entry for \
         it after {waited:?} (is the netdev the RDMA device's, and up?)"
    )]
    GidTimeout {
        /// The address.
        address: GuestAddress,
        /// The netdev.
        netdev: String,
        /// The RDMA port.
        port: u8,
        /// The GID type still missing.
        missing: &'static str,
        /// How long the daemon waited.
        waited: Duration,
    },
    /// The GID table could not be read.
    #[error("reading the GID table: {0}")]
    Gids(#[from] DeviceError),
}

/// Addresses the daemon put on a netdev: [`ProvisionedAddresses::release`] removes them.
#[must_use = "release() removes the addresses the daemon added"]
pub struct ProvisionedAddresses {
    added: Vec<GuestAddress>,
}

impl fmt::Debug for ProvisionedAddresses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.added).finish()
    }
}

impl ProvisionedAddresses {
    /// Nothing added.
    pub fn none() -> ProvisionedAddresses {
        ProvisionedAddresses { added: Vec::new() }
    }

    /// The addresses the daemon added (not those that were there before).
    pub fn added(&self) -> &[GuestAddress] {
        &self.added
    }

    /// Takes over the addresses `other` added.
    pub fn extend(&mut self, mut other: ProvisionedAddresses) {
        self.added.append(&mut other.added);
    }

    /// Removes every address the daemon added, in reverse order; failures are logged.
    pub fn release(mut self, netdev: &dyn NetdevAddresses) {
        while let Some(address) = self.added.pop() {
            match netdev.remove(&address) {
                Ok(()) => info!("removed {address} from {}", netdev.netdev()),
                Err(e) => warn!("cannot remove {address}: {e}"),
            }
        }
    }
}

/// Puts `addresses` on the netdev and waits (at most `wait` for each) until the port's GID
/// table holds their entries of every RoCE type it holds now (at least one entry each). On error, the addresses added so far are
/// removed again.
pub fn provision(
    netdev: &dyn NetdevAddresses,
    device: &dyn HostDevice,
    port: u8,
    addresses: &[GuestAddress],
    wait: Duration,
) -> Result<ProvisionedAddresses, ProvisionError> {
    let types = port_gid_types(&device.gid_table(port)?);
    let mut done = ProvisionedAddresses::none();
    for address in addresses {
        let added = match netdev.add(address) {
            Ok(added) => added,
            Err(e) => {
                done.release(netdev);
                return Err(e);
            }
        };
        if added {
            info!("added {address} to {}", netdev.netdev());
            done.added.push(*address);
        } else {
            info!("{address} was already on {}: it stays", netdev.netdev());
        }
        if let Err(e) = wait_for_gids(netdev, device, port, address, &types, wait) {
            done.release(netdev);
            return Err(e);
        }
    }
    Ok(done)
}

/// Waits until the port's GID table holds an entry of `address` of each of `types`, and at
/// least one.
fn wait_for_gids(
    netdev: &dyn NetdevAddresses,
    device: &dyn HostDevice,
    port: u8,
    address: &GuestAddress,
    types: &[GidType],
    wait: Duration,
) -> Result<(), ProvisionError> {
    let start = Instant::now();
    loop {
        let table = device.gid_table(port)?;
        let has = |t: GidType| {
            let wanted = GidEntry::valid(address.gid(), t);
            table.iter().any(|(_, entry)| *entry == wanted)
        };
        let missing = match types.iter().find(|t| !has(**t)) {
            Some(GidType::RoceV1) => "RoCE v1",
            Some(_) => "RoCE v2",
            None if types.is_empty() && !has(GidType::RoceV1) && !has(GidType::RoceV2) => "RoCE",
            None => return Ok(()),
        };
        let waited = start.elapsed();
        if waited >= wait {
            return Err(ProvisionError::GidTimeout {
                address: *address,
                netdev: netdev.netdev(),
                port,
                missing,
                waited,
            });
        }
        std::thread::sleep(POLL_INTERVAL.min(wait - waited));
    }
}

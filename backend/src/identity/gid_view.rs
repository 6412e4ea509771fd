//! The GID table a guest sees, and its translation to the host port's.
//!
//! A guest without addresses sees the host port's table at the host's indices, without the
//! entries of the daemon's tenants: those read as empty, so that a guest sharing the host's
//! identity can neither see nor send from a tenant's address ([`GidView::Host`]). A guest
//! with addresses sees a virtual table of its own ([`VirtualGids`]): one slot per address and
//! RoCE GID type of the port, in the order the operator gave the addresses, the types in the
//! kernel's order (RoCE v1 before v2). rxe ports have RoCE v2 entries only, so there slot `k`
//! is address `k`; a port with both types has address `k`'s v1 entry at `2k` and its v2 entry
//! at `2k + 1`. A slot whose host entry does not exist (yet) reads as empty. Fixed slots keep a
//! guest's indices stable while the host table changes under it (other guests' addresses
//! coming and going move host indices, never the guest's).
//!
//! Host indices are looked up by (GID, type) when a command needs them: the index found last
//! time is checked with one entry read, and the whole table is searched again only when that
//! entry holds something else.

use std::sync::Arc;

use parking_lot::Mutex;
use vrdma_spec::verbs::GidType;
use vrdma_spec::wire::GidEntry;

use super::address::GuestAddress;
use super::endpoints::LocalEndpoints;
use crate::host::{GidSource, Result};

/// RoCE GID types in the order the kernel adds an address's entries.
const ROCE_TYPES: [GidType; 2] = [GidType::RoceV1, GidType::RoceV2];

/// The RoCE GID types a port's table holds (RoCE v1 before v2); empty when it holds no
/// RoCE entry at all.
pub fn port_gid_types(table: &[(u32, GidEntry)]) -> Vec<GidType> {
    ROCE_TYPES
        .into_iter()
        .filter(|t| table.iter().any(|(_, e)| e.gid_type() == Ok(*t)))
        .collect()
}

/// One guest's view of the GID table of its port.
pub enum GidView {
    /// The host port's table without the tenants' entries (a guest without addresses).
    Host(Arc<LocalEndpoints>),
    /// A table of the guest's own entries.
    Virtual(VirtualGids),
}

/// The virtual GID table of a guest with addresses.
pub struct VirtualGids {
    /// The (GID, type) of each slot.
    slots: Vec<GidEntry>,
    /// The host index each slot was found at last, if it was.
    host_index: Mutex<Vec<Option<u32>>>,
}

impl VirtualGids {
    /// The table of `addresses`: one slot per address and type of `types`.
    pub fn new(addresses: &[GuestAddress], types: &[GidType]) -> VirtualGids {
        let slots: Vec<GidEntry> = addresses
            .iter()
            .flat_map(|a| types.iter().map(|t| GidEntry::valid(a.gid(), *t)))
            .collect();
        VirtualGids {
            host_index: Mutex::new(vec![None; slots.len()]),
            slots,
        }
    }

    /// Number of slots (the guest's `gid_tbl_len`).
    pub fn len(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Whether the table has no slot.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The host index of slot `slot`, if the host table holds its entry now.
    fn host_index(&self, device: &dyn GidSource, port: u8, slot: usize) -> Result<Option<u32>> {
        let Some(wanted) = self.slots.get(slot) else {
            return Ok(None);
        };
        let cached = self.host_index.lock()[slot];
        if let Some(index) = cached {
            if device.gid_entry(port, index)?.as_ref() == Some(wanted) {
                return Ok(Some(index));
            }
        }
        Ok(self.refresh(device, port)?[slot])
    }

    /// Searches the host table for every slot's entry.
    fn refresh(&self, device: &dyn GidSource, port: u8) -> Result<Vec<Option<u32>>> {
        let table = device.gid_table(port)?;
        let found: Vec<Option<u32>> = self
            .slots
            .iter()
            .map(|wanted| {
                table
                    .iter()
                    .find_map(|(index, entry)| (entry == wanted).then_some(*index))
            })
            .collect();
        self.host_index.lock().clone_from(&found);
        Ok(found)
    }

    /// The slot holding host entry `host_index`, if that entry is one of the guest's.
    fn slot_of(&self, device: &dyn GidSource, port: u8, host_index: u32) -> Result<Option<u32>> {
        let Some(entry) = device.gid_entry(port, host_index)? else {
            return Ok(None);
        };
        Ok(self
            .slots
            .iter()
            .position(|slot| *slot == entry)
            .map(|slot| slot as u32))
    }
}

impl GidView {
    /// The view of a guest with `addresses` on `port` (the host's table without the tenants'
    /// entries of `endpoints` when there are none), with a slot per address for each RoCE type
    /// the port's table holds now (RoCE v2 if it holds none: rxe's only type).
    pub fn for_port(
        device: &dyn GidSource,
        port: u8,
        addresses: &[GuestAddress],
        endpoints: &Arc<LocalEndpoints>,
    ) -> Result<GidView> {
        if addresses.is_empty() {
            return Ok(GidView::Host(Arc::clone(endpoints)));
        }
        let mut types = port_gid_types(&device.gid_table(port)?);
        if types.is_empty() {
            types.push(GidType::RoceV2);
        }
        Ok(GidView::Virtual(VirtualGids::new(addresses, &types)))
    }

    /// The guest's `gid_tbl_len`, given the host port's.
    pub fn table_len(&self, host_len: u32) -> u32 {
        match self {
            GidView::Host(_) => host_len,
            GidView::Virtual(v) => v.len().min(host_len),
        }
    }

    /// Guest entry `index`: its host index and the entry, or `None` when the slot is empty
    /// (or beyond the table).
    pub fn entry(
        &self,
        device: &dyn GidSource,
        port: u8,
        index: u32,
    ) -> Result<Option<(u32, GidEntry)>> {
        match self {
            GidView::Host(endpoints) => Ok(device
                .gid_entry(port, index)?
                .filter(|e| !endpoints.is_tenant_address(&e.gid))
                .map(|e| (index, e))),
            GidView::Virtual(v) => {
                let Ok(slot) = usize::try_from(index) else {
                    return Ok(None);
                };
                Ok(v.host_index(device, port, slot)?
                    .map(|host| (host, v.slots[slot])))
            }
        }
    }

    /// The guest's index of host entry `host_index`, `None` if that entry is not the guest's.
    pub fn guest_index(
        &self,
        device: &dyn GidSource,
        port: u8,
        host_index: u32,
    ) -> Result<Option<u32>> {
        match self {
            GidView::Host(endpoints) => Ok(device
                .gid_entry(port, host_index)?
                .is_none_or(|e| !endpoints.is_tenant_address(&e.gid))
                .then_some(host_index)),
            GidView::Virtual(v) => v.slot_of(device, port, host_index),
        }
    }

    /// The populated entries of the guest's table with the guest's indices, by index.
    pub fn table(&self, device: &dyn GidSource, port: u8) -> Result<Vec<(u32, GidEntry)>> {
        match self {
            GidView::Host(endpoints) => {
                let mut table = device.gid_table(port)?;
                table.retain(|(_, entry)| {
                    entry.is_valid() && !endpoints.is_tenant_address(&entry.gid)
                });
                table.sort_unstable_by_key(|(index, _)| *index);
                Ok(table)
            }
            GidView::Virtual(v) => Ok(v
                .refresh(device, port)?
                .iter()
                .zip(&v.slots)
                .enumerate()
                .filter_map(|(slot, (host, entry))| host.map(|_| (slot as u32, *entry)))
                .collect()),
        }
    }
}

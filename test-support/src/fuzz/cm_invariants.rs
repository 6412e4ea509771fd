//! The connection manager's invariants, checked after every step of a handler sequence (spec
//! §7.5, §12.1). The fake host CM keeps every id of every guest in one place with the file
//! (guest context) it belongs to, which is what the backend must keep apart:
//! - a guest's CM ids and the fake's ids of the guest's file are the same ids, but for connect
//!   requests whose CONNECT_REQUEST still waits in the file's queue (the fake made them for
//!   the guest's listener; the device learns of them when its pump reads the event);
//! - no file ever named an id of another (`CmNet::foreign_ids`);
//! - every address an id of a guest was ever bound to is one the guest may use: a tenant's own
//!   address, for a guest sharing the host's identity no tenant's, and no wildcard while the
//!   daemon has tenants (checked on the fake's log of binds, and on the source of every live
//!   id, connect requests included);
//! - no id outlives its guest's discard, reset or disconnect (`check_cm_released` and
//!   `check_cm_closed` in [`invariants`](super::invariants), which the guest slot calls too).
//!
//! Each check panics with what disagreed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use vrdma_backend::identity::address_gid;
use vrdma_backend::resources::kind::ResourceKind;

use super::guest_slot::Slot;
use super::tenancy::Daemon;
use crate::fake_host::device::FakeDevice;

/// Checks the CM invariants of both guests. `files` maps every fake CM file the run's guests
/// opened (past ones included) to the guest slot that opened it.
pub(super) fn check_cm(
    fake: &FakeDevice,
    daemon: &Daemon,
    slots: &[Slot; 2],
    files: &BTreeMap<u64, usize>,
) {
    // Copied out first: a panic under the world's lock would poison it for the teardown.
    let mut w = fake.world();
    let binds = std::mem::take(&mut w.cm.binds);
    let foreign = w.cm.foreign_ids.clone();
    let ids: Vec<(u32, u64, Option<SocketAddr>)> =
        w.cm.ids
            .iter()
            .map(|(&id, e)| (id, e.file, e.src))
            .collect();
    let queued = [0, 1].map(|g| w.cm.queued_requests(slots[g].cm_file));
    drop(w);
    assert!(
        foreign.is_empty(),
        "CM ids named by a file they do not belong to (file, id): {foreign:?}"
    );
    let slot_of = |file: u64| {
        *files
            .get(&file)
            .unwrap_or_else(|| panic!("CM file {file} belongs to no guest of the run"))
    };
    for (file, addr) in binds {
        check_source(daemon, slot_of(file), &addr, "was bound to");
    }
    for &(id, file, src) in &ids {
        let g = slot_of(file);
        assert_eq!(
            slots[g].cm_file, file,
            "CM id {id} of guest {g}'s closed file {file} outlived its device"
        );
        if let Some(src) = src {
            check_source(daemon, g, &src, "has the source");
        }
    }
    for (g, slot) in slots.iter().enumerate() {
        if slot.cm_file == 0 {
            continue;
        }
        let mut held = BTreeSet::new();
        for object in slot.guest.dev().inventory().of(ResourceKind::CmId) {
            let host = object.host.expect("a CM id has a host id");
            assert!(
                held.insert(host),
                "two CM ids of guest {g} share host id {host}"
            );
        }
        let on_host: BTreeSet<u32> = ids
            .iter()
            .filter(|&&(_, file, _)| file == slot.cm_file)
            .map(|&(id, _, _)| id)
            .collect();
        let unknown: Vec<&u32> = held.difference(&on_host).collect();
        assert!(
            unknown.is_empty(),
            "guest {g}'s CM ids {unknown:?} are no ids of its file {} on the host",
            slot.cm_file
        );
        let unheld: Vec<&u32> = on_host
            .difference(&held)
            .filter(|id| !queued[g].contains(id))
            .collect();
        assert!(
            unheld.is_empty(),
            "host CM ids {unheld:?} of guest {g}'s file {} are not the guest's (and no \
             connect request waits for them)",
            slot.cm_file
        );
    }
}

/// `addr`, an address an id of guest `g` has or had, is one the guest may use (spec §7.5).
fn check_source(daemon: &Daemon, g: usize, addr: &SocketAddr, what: &str) {
    let ip = addr.ip().to_canonical();
    let gid = address_gid(ip);
    match daemon.tenant_gid(g) {
        Some(own) => assert_eq!(
            gid, own,
            "a CM id of tenant guest {g} {what} {addr}, not its own address"
        ),
        None => {
            assert!(
                !daemon.is_tenant_gid(&gid),
                "a CM id of host guest {g} {what} a tenant's address, {addr}"
            );
            assert!(
                !(ip.is_unspecified() && daemon.has_tenants()),
                "a CM id of host guest {g} {what} the wildcard {addr} while tenants exist"
            );
        }
    }
}

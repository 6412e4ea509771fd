//! The invariants checked after every step of a handler sequence: a guest's handle tables, its
//! quota counters, its reference counts and event bookkeeping agree with each other and with the
//! objects the fake host device holds for the guest's context; a released guest holds nothing
//! on the host (CM ids included: no id of its CM file is left); no context ever named an
//! object that is not its own. Each check panics with what disagreed.

use std::collections::{BTreeMap, BTreeSet};

use vrdma_backend::guest::inventory::Inventory;
use vrdma_backend::resources::kind::ResourceKind;

use crate::fake_host::device::{FakeDevice, World};
use crate::fake_host::harness::TestGuest;

/// Every kind of guest object.
pub const KINDS: [ResourceKind; 7] = [
    ResourceKind::Pd,
    ResourceKind::Mr,
    ResourceKind::Mw,
    ResourceKind::Cq,
    ResourceKind::Qp,
    ResourceKind::Srq,
    ResourceKind::Ah,
];

/// Position of `kind` in [`KINDS`].
pub fn kind_index(kind: ResourceKind) -> usize {
    KINDS.iter().position(|&k| k == kind).unwrap_or(0)
}

/// The fake host's live objects of `kind`, by handle.
fn host_handles(w: &World, kind: ResourceKind) -> Vec<u32> {
    match kind {
        ResourceKind::Pd => w.pds.keys().copied().collect(),
        ResourceKind::Mr => w.mrs.keys().copied().collect(),
        ResourceKind::Mw => w.mws.keys().copied().collect(),
        ResourceKind::Cq => w.cqs.keys().copied().collect(),
        ResourceKind::Qp => w.qps.keys().copied().collect(),
        ResourceKind::Srq => w.srqs.keys().copied().collect(),
        ResourceKind::Ah => w.ahs.keys().copied().collect(),
        ResourceKind::CmId => w.cm.ids.keys().copied().collect(),
    }
}

/// The fake host's live objects owned by `context`, by kind.
pub fn owned_by(w: &World, context: u64) -> BTreeMap<usize, BTreeSet<u32>> {
    KINDS
        .iter()
        .map(|&kind| {
            let owned = host_handles(w, kind)
                .into_iter()
                .filter(|&h| w.ownership.owner(h) == Some(context))
                .collect();
            (kind_index(kind), owned)
        })
        .collect()
}

/// No context of `fake` ever named an object it does not own.
pub fn check_isolation(fake: &FakeDevice) {
    // Not asserted under the world's lock: a panic would poison it for the guests' teardown.
    let violations = fake.world().ownership.violations.clone();
    assert!(
        violations.is_empty(),
        "host objects named by a context that does not own them (command, handle, context): {violations:?}"
    );
}

/// `context` holds nothing on the fake host (after a discard, reset or disconnect).
pub fn check_released(fake: &FakeDevice, context: u64) {
    let left: Vec<_> = owned_by(&fake.world(), context)
        .into_iter()
        .filter(|(_, handles)| !handles.is_empty())
        .map(|(kind, handles)| (KINDS[kind], handles))
        .collect();
    assert!(left.is_empty(), "context {context} still holds {left:?}");
}

/// The fake holds no CM id of `file` (0: no CM) and nothing waits in its queue (after a
/// discard, a reset or a device failure).
pub fn check_cm_released(fake: &FakeDevice, file: u64) {
    if file == 0 {
        return;
    }
    let w = fake.world();
    let left: Vec<u32> =
        w.cm.ids
            .iter()
            .filter(|(_, e)| e.file == file)
            .map(|(&id, _)| id)
            .collect();
    drop(w);
    assert!(left.is_empty(), "CM file {file} still holds ids {left:?}");
}

/// The fake holds nothing of `file` after its guest disconnected: no id, and the file is
/// closed.
pub fn check_cm_closed(fake: &FakeDevice, file: u64) {
    check_cm_released(fake, file);
    let open = file != 0 && fake.world().cm.is_open(file);
    assert!(!open, "CM file {file} is still open after its guest left");
}

/// The guest's bookkeeping agrees with itself and with the fake host objects of `context`.
pub fn check_guest(fake: &FakeDevice, guest: &TestGuest, context: u64) {
    let inventory = guest.dev().inventory();
    check_bookkeeping(guest, &inventory);
    let owned = owned_by(&fake.world(), context);
    for kind in KINDS {
        let mut held = BTreeSet::new();
        for object in inventory.of(kind) {
            if let Some(host) = object.host {
                assert!(
                    held.insert(host),
                    "two {kind}s of the guest share host object {host}"
                );
            }
        }
        if kind == ResourceKind::Ah {
            // Destroyed AHs the host keeps while the guest's forwarded UD sends may name them.
            for &host in &inventory.lingering_ahs {
                assert!(held.insert(host), "lingering AH {host} is also a live one");
            }
        }
        assert_eq!(
            held,
            owned[&kind_index(kind)],
            "the guest's {kind}s (left) and the host's {kind}s of its context (right) differ"
        );
    }
    let counts = guest.dev().object_counts();
    assert_eq!(
        counts.shm_extents,
        guest.frontend.mapped().len(),
        "queue-region extents in use and mapped differ"
    );
}

/// Quotas, reference counts and event owners of one guest agree with its objects.
fn check_bookkeeping(guest: &TestGuest, inventory: &Inventory) {
    let quotas = guest.dev().options().quotas;
    for kind in KINDS {
        let count = inventory.of(kind).count();
        assert!(
            count <= quotas.count_limit(kind) as usize,
            "{count} {kind}s over the quota of {}",
            quotas.count_limit(kind)
        );
    }
    let charged: u64 = inventory.of(ResourceKind::Mr).map(|o| o.bytes).sum();
    assert_eq!(inventory.mr_bytes, charged, "MR bytes counted vs charged");
    assert!(
        inventory.mr_bytes <= quotas.mr_bytes,
        "{} MR bytes over the quota of {}",
        inventory.mr_bytes,
        quotas.mr_bytes
    );
    let live: BTreeSet<(usize, u32)> = inventory
        .objects
        .iter()
        .map(|o| (kind_index(o.kind), o.handle))
        .collect();
    let mut references: BTreeMap<(usize, u32), u32> = BTreeMap::new();
    for object in &inventory.objects {
        for &(kind, handle) in &object.holds {
            let target = (kind_index(kind), handle);
            assert!(
                live.contains(&target),
                "{} {:#x} references {kind} {handle:#x}, which is gone",
                object.kind,
                object.handle
            );
            *references.entry(target).or_default() += 1;
        }
    }
    for object in &inventory.objects {
        let expected = references
            .get(&(kind_index(object.kind), object.handle))
            .copied()
            .unwrap_or(0);
        if matches!(
            object.kind,
            ResourceKind::Pd | ResourceKind::Cq | ResourceKind::Srq
        ) {
            assert_eq!(
                object.refs, expected,
                "reference count of {} {:#x}",
                object.kind, object.handle
            );
        }
    }
    let owners: BTreeSet<(u64, usize, u32)> = inventory
        .event_owners
        .iter()
        .map(|&(uh, kind, h)| (uh, kind_index(kind), h))
        .collect();
    let expected: BTreeSet<(u64, usize, u32)> = inventory
        .objects
        .iter()
        .filter_map(|o| o.user_handle.map(|uh| (uh, kind_index(o.kind), o.handle)))
        .collect();
    assert_eq!(
        owners, expected,
        "event owners vs objects with user handles"
    );
}

//! REG_MR, DEREG_MR and MR revocation on memory-table changes (spec §7.4, §11.3).
//!
//! A registration maps the guest's pages contiguously into an [`MrWindow`] of this process (or,
//! for one contiguous run of guest RAM, uses the daemon's mapping of it) and registers the
//! window with the guest's iova. The window lives exactly as long as the host
//! MR: it is unmapped only after the MR is deregistered, so the NIC never holds a registration
//! over address space this process reuses.

use log::{debug, warn};
use vrdma_spec::control::{PageList, RegMrExtents};
use vrdma_spec::verbs::AccessFlags;
use vrdma_spec::wire::{HandleReq, RegMrReq, RegMrResp};
use vrdma_spec::{Event, EventType, Le32, RegMr, ResponseBody};

use super::error::CommandError;
use super::session::{at_most, host_err, CommandResult, Session};
use super::unwind::{Undo, Unwind};
use crate::guest::objects::{LiveMr, MrEntry};
use crate::guest::shared::GuestShared;
use crate::guest::state::GuestState;
use crate::host::{HostContext, MrInit};
use crate::memory::guest_ram::GuestRamFiles;
use crate::memory::mr_window::{MrExtents, MrPages, MrWindow};
use crate::memory::pinned_extents::Extent;
use crate::resources::kind::{ResourceError, ResourceKind};
use crate::resources::table::Handle;
use crate::vhost_device::event_queue::EventClass;
use crate::vhost_device::guest_io::GuestIo;

/// REG_MR, validated in the spec's order: structure (decoder), limits, PD, quotas, addresses,
/// window mappings, budgets (spec §7.4).
pub(crate) fn reg_mr(s: &mut Session<'_>, m: &RegMr<'_>) -> CommandResult {
    at_most(m.req.npages.get(), s.guest.options().max_mr_pages, "npages")?;
    let r = &m.req;
    let (iova, length, page_shift) = (r.iova.get(), r.length.get(), r.page_shift.get());
    let extents = page_list_extents(iova, length, page_shift, m.pages)?;
    let request = MrExtents {
        iova,
        length,
        page_shift,
        extents: &extents,
    };
    register(s, r, &request)
}

/// The pages of a page list (REG_MR, REREG_MR) as extents, consecutive pages merged.
pub(super) fn page_list_extents(
    iova: u64,
    length: u64,
    page_shift: u32,
    pages: PageList<'_>,
) -> Result<Vec<Extent>, CommandError> {
    let pages = pages.iter().collect::<Vec<u64>>();
    Ok(MrPages {
        iova,
        length,
        page_shift,
        pages: &pages,
    }
    .to_extents()?)
}

/// REG_MR_EXTENTS: REG_MR with the pages given as extents; `max_mr_pages` bounds the number
/// of extents (spec §7.4).
pub(crate) fn reg_mr_extents(s: &mut Session<'_>, m: &RegMrExtents<'_>) -> CommandResult {
    at_most(
        m.req.npages.get(),
        s.guest.options().max_mr_pages,
        "nextents",
    )?;
    // The decoder checked that no extent wraps.
    let extents: Vec<Extent> = m
        .extents
        .iter()
        .map(|(gpa, len)| Extent {
            start: gpa,
            end: gpa + len,
        })
        .collect();
    let request = MrExtents {
        iova: m.req.iova.get(),
        length: m.req.length.get(),
        page_shift: m.req.page_shift.get(),
        extents: &extents,
    };
    register(s, &m.req, &request)
}

/// Registers the MR of a validated REG_MR or REG_MR_EXTENTS request, from its limits on.
fn register(s: &mut Session<'_>, r: &RegMrReq, request: &MrExtents<'_>) -> CommandResult {
    let length = r.length.get();
    let max_mr_size = max_mr_size(s.guest);
    if length > max_mr_size {
        return Err(CommandError::Invalid {
            what: "length",
            value: length,
        });
    }

    let pd = Handle::from_raw(r.pd.get());
    let pd_host = s.state.pds.get(pd)?.host;

    s.state.mrs.check_room(0)?;
    let page_size = 1u64 << r.page_shift.get();
    let bytes = mr_bytes(request.pages(), page_size)?;
    check_mr_bytes(s, bytes, 0)?;
    let mut c = Unwind::new(s);
    c.take_ref(|s| s.state.pds.acquire(pd), Undo::PdRef(pd))?;
    let window = map_window(&mut c, request)?;
    let start = window.addr() as u64;
    c.did(Undo::Window(window));
    let access = host_access(r.access.get());
    let host = c
        .host()
        .reg_mr(&MrInit {
            pd: pd_host,
            start,
            length,
            iova: r.iova.get(),
            access,
        })
        .map_err(host_err("REG_MR"))?;
    c.did(Undo::HostMr(host.handle));
    let window = c
        .keep_window()
        .ok_or(CommandError::BadState("MR window lost"))?;
    let entry = MrEntry {
        pd,
        bytes,
        access,
        live: Some(LiveMr { host, window }),
    };
    // Cannot fail after `check_room` and the lookup above, under the same lock. If it did,
    // the table dropped the window, whose budget then stays charged (the safe side) until the
    // guest's next discard; the host MR is deregistered and the PD reference dropped.
    let handle = c.state.mrs.insert(entry)?;
    c.commit();
    s.state.mr_bytes += bytes;
    Ok(ResponseBody::RegMr(RegMrResp {
        mr: Le32::new(handle.raw()),
        lkey: Le32::new(host.lkey),
        rkey: Le32::new(host.rkey),
        reserved: Le32::ZERO,
    }))
}

/// Bytes an MR of `npages` pages of `page_size` bytes counts against the MR byte quota.
pub(super) fn mr_bytes(npages: u64, page_size: u64) -> Result<u64, CommandError> {
    npages.checked_mul(page_size).ok_or(CommandError::Invalid {
        what: "npages",
        value: npages,
    })
}

/// Fails with `QUOTA` unless the guest's MR bytes, with `replaced` bytes of an MR that is
/// being re-registered given back, have room for `bytes` more.
pub(super) fn check_mr_bytes(
    s: &Session<'_>,
    bytes: u64,
    replaced: u64,
) -> Result<(), CommandError> {
    let limit = s.guest.options().quotas.mr_bytes;
    let used = s.state.mr_bytes.saturating_sub(replaced);
    if used.checked_add(bytes).is_none_or(|total| total > limit) {
        return Err(ResourceError::ByteQuota {
            kind: ResourceKind::Mr,
            limit,
            used,
            requested: bytes,
        }
        .into());
    }
    Ok(())
}

/// Maps guest pages into a new window, validated in the spec's order: every page is this
/// guest's RAM (`BAD_ADDRESS`), the window's mappings are within `max_mr_mappings` (`INVALID`),
/// and its mappings and the guest bytes it pins newly fit the guest's quota and the daemon's
/// budget (`QUOTA`). Nothing is mapped before the checks pass; what the window takes from the
/// budgets goes back with [`GuestState::unmap_window`] (or [`forget_live`]).
pub(super) fn map_window(
    s: &mut Session<'_>,
    request: &MrExtents<'_>,
) -> Result<MrWindow, CommandError> {
    let ram = GuestRamFiles::mapped(s.guest_io.memory().into_inner())?;
    let mut plan = MrWindow::plan_extents(&ram, request, max_mr_size(s.guest))?;
    let max_mappings = s.guest.options().max_mr_mappings;
    if plan.mappings() > u64::from(max_mappings) {
        return Err(CommandError::Invalid {
            what: "page list: mappings needed (runs of contiguous guest pages)",
            value: plan.mappings(),
        });
    }
    s.state.memory.charge(&plan)?;
    plan.map(&mut s.state.populated).map_err(|e| {
        s.state.memory.release_plan(&plan);
        e.into()
    })
}

/// The access flags to register with the host: relaxed ordering is a hint the spec lets the
/// device ignore.
pub(super) fn host_access(access: u32) -> AccessFlags {
    AccessFlags::from_bits_retain(access & !AccessFlags::RELAXED_ORDERING.bits())
}

/// DEREG_MR: deregisters the host MR, then unmaps its window. A revoked MR has neither left,
/// and its deregistration just frees the handle.
pub(crate) fn dereg_mr(s: &mut Session<'_>, r: &HandleReq) -> CommandResult {
    let handle = Handle::from_raw(r.handle.get());
    let entry = s.state.mrs.get(handle)?;
    if let Some(live) = &entry.live {
        s.host()
            .dereg_mr(live.host.handle)
            .map_err(host_err("DEREG_MR"))?;
    }
    let entry = s.state.mrs.remove(handle)?;
    if let Some(live) = entry.live {
        forget_live(s.state, entry.pd, entry.bytes);
        // Unmaps the window, now that the host no longer uses it.
        s.state.unmap_window(live.window);
    }
    Ok(ResponseBody::Empty)
}

/// Gives back the byte quota and PD reference of an MR that was live (its window's budget goes
/// back with [`GuestState::unmap_window`]).
pub(super) fn forget_live(state: &mut GuestState, pd: Handle, bytes: u64) {
    state.mr_bytes = state.mr_bytes.saturating_sub(bytes);
    if let Err(e) = state.pds.release(pd) {
        warn!("MR bookkeeping: {e}");
    }
}

/// Deregisters the MR of a table entry that is already gone (teardown).
pub(crate) fn release(
    host: &dyn HostContext,
    state: &mut GuestState,
    handle: Handle,
    entry: MrEntry,
) {
    if let Some(live) = entry.live {
        deregister(host, state, handle, live);
    }
}

/// Deregisters a host MR, then unmaps its window and gives back what the window took from the
/// budgets.
pub(super) fn deregister(
    host: &dyn HostContext,
    state: &mut GuestState,
    handle: Handle,
    live: LiveMr,
) {
    if let Err(e) = host.dereg_mr(live.host.handle) {
        // The host MR still pins the pages and accepts its rkey: keep its window mapped and
        // charged, and try again at the next discard (closing the host context at disconnect
        // releases it in any case).
        warn!(
            "dereg of MR {handle} (host {}) failed: {e}; kept until a later discard",
            live.host.handle
        );
        state.lingering_mrs.push((handle, live));
        return;
    }
    state.unmap_window(live.window);
}

/// Tries again to deregister the host MRs whose deregistration failed; those that fail again
/// stay. Returns how many are left.
pub(crate) fn retry_lingering(host: &dyn HostContext, state: &mut GuestState) -> usize {
    for (handle, live) in std::mem::take(&mut state.lingering_mrs) {
        deregister(host, state, handle, live);
    }
    state.lingering_mrs.len()
}

/// Largest MR length: the host's limit, within the guest's MR byte quota.
pub(crate) fn max_mr_size(guest: &GuestShared) -> u64 {
    guest
        .limits()
        .attr
        .max_mr_size
        .min(guest.options().quotas.mr_bytes)
}

/// Revokes every MR that maps guest pages the new memory table no longer backs the same way
/// (spec §11.3): deregisters it, unmaps its window, releases its quota and PD reference, and
/// sends MR_REVOKED. Its handle stays allocated until DEREG_MR.
pub(crate) fn revoke_unbacked(guest: &GuestShared, guest_io: &GuestIo, state: &mut GuestState) {
    let ram = match GuestRamFiles::new(&*guest_io.memory()) {
        Ok(ram) => ram,
        Err(e) => {
            // Unknown memory cannot back anything.
            warn!(
                "guest {}: cannot inspect the new memory table: {e}",
                guest.id()
            );
            GuestRamFiles::default()
        }
    };
    let stale: Vec<Handle> = state
        .mrs
        .iter()
        .filter(|(_, entry)| {
            entry
                .live
                .as_ref()
                .is_some_and(|live| !live.window.still_backed_by(&ram))
        })
        .map(|(handle, _)| handle)
        .collect();
    for handle in stale {
        let Ok(entry) = state.mrs.get_mut(handle) else {
            continue;
        };
        let Some(live) = entry.live.take() else {
            continue;
        };
        let (pd, bytes) = (entry.pd, entry.bytes);
        deregister(guest.host(), state, handle, live);
        forget_live(state, pd, bytes);
        debug!(
            "guest {}: MR {handle} revoked by a memory change",
            guest.id()
        );
        let event = Event {
            event_type: EventType::MrRevoked,
            handle: handle.raw(),
            detail: 0,
        };
        if let Err(e) = guest_io.events().push(&event.to_bytes(), EventClass::Async) {
            warn!("guest {}: cannot queue MR_REVOKED: {e}", guest.id());
        }
    }
}

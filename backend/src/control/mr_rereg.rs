//! REREG_MR (spec §7.4): a new host MR registered before the old one is deregistered, so that
//! a failure leaves the old MR registered and usable: over a new window for a new translation,
//! over the MR's own window for a new PD or access flags. The guest's MR handle stays the same.

use log::{debug, warn};
use vrdma_spec::control::ReregMr;
use vrdma_spec::wire::ReregMrResp;
use vrdma_spec::{Le32, ResponseBody};

use super::error::CommandError;
use super::mr::{
    check_mr_bytes, deregister, host_access, map_window, max_mr_size, mr_bytes, page_list_extents,
};
use super::session::{at_most, host_err, CommandResult, Session};
use crate::guest::objects::LiveMr;
use crate::host::MrInit;
use crate::memory::mr_window::MrExtents;
use crate::resources::table::Handle;

/// REREG_MR, validated in the spec's order: structure (decoder), limits, MR, PD, quota,
/// addresses.
pub(crate) fn rereg_mr(s: &mut Session<'_>, m: &ReregMr<'_>) -> CommandResult {
    let r = &m.req;
    if m.changes_translation() {
        at_most(r.npages.get(), s.guest.options().max_mr_pages, "npages")?;
        let length = r.length.get();
        if length > max_mr_size(s.guest) {
            return Err(CommandError::Invalid {
                what: "length",
                value: length,
            });
        }
    }

    let handle = Handle::from_raw(r.mr.get());
    let entry = s.state.mrs.get(handle)?;
    let Some(live) = &entry.live else {
        return Err(CommandError::BadState(
            "the MR was revoked by a memory change; only DEREG_MR applies",
        ));
    };
    let (old_pd, old_bytes, old_access, old_host) =
        (entry.pd, entry.bytes, entry.access, live.host);
    let new_pd = match m.new_pd() {
        Some(raw) => Handle::from_raw(raw),
        None => old_pd,
    };
    let new_pd_host = s.state.pds.get(new_pd)?.host;
    let new_access = m.new_access().map(host_access).unwrap_or(old_access);

    let (host, new_live, new_bytes) = if m.changes_translation() {
        let bytes = mr_bytes(r.npages.get().into(), m.page_size())?;
        check_mr_bytes(s, bytes, old_bytes)?;
        let (iova, length, page_shift) = (r.iova.get(), r.length.get(), r.page_shift.get());
        let extents = page_list_extents(iova, length, page_shift, m.pages)?;
        let window = map_window(
            s,
            &MrExtents {
                iova,
                length,
                page_shift,
                extents: &extents,
            },
        )?;
        let init = MrInit {
            pd: new_pd_host,
            start: window.addr() as u64,
            length: r.length.get(),
            iova: r.iova.get(),
            access: new_access,
        };
        let host = match s.host().reg_mr(&init) {
            Ok(host) => host,
            Err(e) => {
                s.state.unmap_window(window);
                return Err(host_err("REREG_MR (new translation)")(e));
            }
        };
        // Only now the old registration goes; if it cannot, the new one goes instead and the
        // MR stays as it was.
        if let Err(e) = s.host().dereg_mr(old_host.handle) {
            deregister(s.guest.host(), s.state, handle, LiveMr { host, window });
            return Err(host_err("REREG_MR (old translation)")(e));
        }
        (host, Some(LiveMr { host, window }), bytes)
    } else {
        // A new registration over the same window, not rxe's in-place REREG_MR: Linux 6.12's
        // changes an MR's access without giving a local-only MR an rkey, so a peer's RDMA WRITE
        // with the returned rkey failed with REM_ACCESS_ERR (seen in the rxe VM; rdma-core's
        // own rxe provider offers no rereg at all). Keys change, which ibv_rereg_mr allows.
        let (start, length, iova) = (
            live.window.addr() as u64,
            live.window.len(),
            live.window.iova(),
        );
        let host = s
            .host()
            .reg_mr(&MrInit {
                pd: new_pd_host,
                start,
                length,
                iova,
                access: new_access,
            })
            .map_err(host_err("REREG_MR (new registration)"))?;
        if let Err(e) = s.host().dereg_mr(old_host.handle) {
            if let Err(undo) = s.host().dereg_mr(host.handle) {
                warn!("MR {handle}: the new registration outlives a failed REREG_MR: {undo}");
            }
            return Err(host_err("REREG_MR (old registration)")(e));
        }
        (host, None, old_bytes)
    };

    // The host holds the new state; the bookkeeping follows it and cannot fail: both PD
    // handles were looked up above under the same lock.
    if new_pd != old_pd {
        if let Err(e) = s.state.pds.acquire(new_pd) {
            warn!("MR {handle} bookkeeping: {e}");
        }
        if let Err(e) = s.state.pds.release(old_pd) {
            warn!("MR {handle} bookkeeping: {e}");
        }
    }
    s.state.mr_bytes = s.state.mr_bytes.saturating_sub(old_bytes) + new_bytes;
    let entry = s.state.mrs.get_mut(handle)?;
    entry.pd = new_pd;
    entry.access = new_access;
    entry.bytes = new_bytes;
    let old_window = match (new_live, entry.live.as_mut()) {
        // The old host MR is deregistered: its window can go.
        (Some(new_live), _) => entry.live.replace(new_live).map(|old| old.window),
        // Same window, new host MR.
        (None, Some(live)) => {
            live.host = host;
            None
        }
        (None, None) => None,
    };
    if let Some(old_window) = old_window {
        s.state.unmap_window(old_window);
    }
    debug!(
        "MR {handle} re-registered (flags {:#x}): lkey {:#x}, rkey {:#x}",
        r.flags.get(),
        host.lkey,
        host.rkey
    );
    Ok(ResponseBody::ReregMr(ReregMrResp {
        lkey: Le32::new(host.lkey),
        rkey: Le32::new(host.rkey),
    }))
}

//! ALLOC_MW and DEALLOC_MW (spec §7.4), with `VRDMA_F_MW`.
//!
//! Only allocation and freeing are control commands. Binding a window to an MR and
//! invalidating it are work requests the guest writes into its send queue with the host's
//! keys; the host kernel checks them (spec §9.2, and §12 for what rxe does not check).

use log::warn;
use vrdma_spec::verbs::MwType;
use vrdma_spec::wire::{AllocMwReq, AllocMwResp, HandleReq};
use vrdma_spec::{Le32, ResponseBody};

use super::error::CommandError;
use super::session::{host_err, CommandResult, Session};
use crate::guest::objects::MwEntry;
use crate::host::HostContext;
use crate::resources::table::Handle;

/// ALLOC_MW: type (decoder), PD, quota, then the host window.
pub(crate) fn alloc_mw(s: &mut Session<'_>, r: &AllocMwReq) -> CommandResult {
    let mw_type = MwType::try_from(r.mw_type.get()).map_err(|v| CommandError::Invalid {
        what: "mw_type",
        value: v.into(),
    })?;
    let pd = Handle::from_raw(r.pd.get());
    let pd_host = s.state.pds.get(pd)?.host;
    s.state.mws.check_room(0)?;
    let host = s
        .host()
        .alloc_mw(pd_host, mw_type)
        .map_err(host_err("ALLOC_MW"))?;
    let entry = MwEntry { pd, host };
    // Cannot fail after `check_room` and the lookup above; undone completely if it does.
    let handle = match s.state.mws.insert(entry) {
        Ok(handle) => handle,
        Err(e) => {
            release(s.host(), Handle::from_raw(0), MwEntry { pd, host });
            return Err(e.into());
        }
    };
    if let Err(e) = s.state.pds.acquire(pd) {
        if let Ok(entry) = s.state.mws.remove(handle) {
            release(s.host(), handle, entry);
        }
        return Err(e.into());
    }
    Ok(ResponseBody::AllocMw(AllocMwResp {
        mw: Le32::new(handle.raw()),
        rkey: Le32::new(host.rkey),
    }))
}

/// DEALLOC_MW: frees the window whether or not it is bound (the host drops its MR and QP
/// references), and gives back its PD reference.
pub(crate) fn dealloc_mw(s: &mut Session<'_>, r: &HandleReq) -> CommandResult {
    let handle = Handle::from_raw(r.handle.get());
    let host = s.state.mws.get(handle)?.host;
    s.host()
        .dealloc_mw(host.handle)
        .map_err(host_err("DEALLOC_MW"))?;
    let entry = s.state.mws.remove(handle)?;
    if let Err(e) = s.state.pds.release(entry.pd) {
        warn!("MW bookkeeping: {e}");
    }
    Ok(ResponseBody::Empty)
}

/// Frees the host window of a table entry that is already gone (teardown).
pub(crate) fn release(host: &dyn HostContext, handle: Handle, entry: MwEntry) {
    if let Err(e) = host.dealloc_mw(entry.host.handle) {
        // Closing the host context releases it all the same.
        warn!(
            "dealloc of MW {handle} (host {}) failed: {e}",
            entry.host.handle
        );
    }
}

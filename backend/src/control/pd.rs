//! ALLOC_PD and DEALLOC_PD (spec §7.4).

use log::warn;
use vrdma_spec::wire::{HandleReq, HandleResp};
use vrdma_spec::{Le32, ResponseBody};

use super::session::{host_err, CommandResult, Session};
use crate::guest::objects::PdEntry;
use crate::host::{HostContext, PdHandle};
use crate::resources::kind::{ResourceError, ResourceKind};
use crate::resources::table::Handle;

/// ALLOC_PD: quota, then the host PD.
pub(crate) fn alloc_pd(s: &mut Session<'_>) -> CommandResult {
    s.state.pds.check_room(0)?;
    let host = s.host().alloc_pd().map_err(host_err("ALLOC_PD"))?;
    let handle = match s.state.pds.insert(PdEntry { host }) {
        Ok(handle) => handle,
        Err(e) => {
            release(s.host(), Handle::from_raw(0), PdEntry { host });
            return Err(e.into());
        }
    };
    Ok(ResponseBody::AllocPd(HandleResp {
        handle: Le32::new(handle.raw()),
        reserved: Le32::ZERO,
    }))
}

/// DEALLOC_PD: `BUSY` while an MR, QP, SRQ or AH uses the PD (they hold references).
pub(crate) fn dealloc_pd(s: &mut Session<'_>, r: &HandleReq) -> CommandResult {
    let handle = Handle::from_raw(r.handle.get());
    // Checks existence and references before the host is asked.
    let refs = s.state.pds.refs(handle)?;
    if refs != 0 {
        return Err(ResourceError::Busy {
            kind: ResourceKind::Pd,
            handle: handle.raw(),
            refs,
        }
        .into());
    }
    let host = s.state.pds.get(handle)?.host;
    s.host().dealloc_pd(host).map_err(host_err("DEALLOC_PD"))?;
    s.state.pds.remove(handle)?;
    Ok(ResponseBody::Empty)
}

/// Frees a PD whose table entry is gone (teardown).
pub(crate) fn release(host: &dyn HostContext, handle: Handle, entry: PdEntry) {
    if let Err(e) = host.dealloc_pd(entry.host) {
        warn!("dealloc of PD {handle} (host {}) failed: {e}", entry.host);
    }
}

/// Deallocates a host PD whose guest handle is gone.
pub(crate) fn release_host(host: &dyn HostContext, pd: PdHandle) {
    if let Err(e) = host.dealloc_pd(pd) {
        warn!("dealloc of host PD {pd} failed: {e}");
    }
}

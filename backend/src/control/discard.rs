//! Discarding a guest's state (spec §11.1): the DISCARD_STATE command, and the discard of every
//! object that a reset, a disconnect or a host device failure also performs.

use log::info;
use vrdma_spec::control::ResponseBody;

use super::session::{CommandResult, Session};
use super::{ah, cq, mr, mw, pd, qp, srq};
use crate::guest::shared::GuestShared;
use crate::guest::state::GuestState;
use crate::vhost_device::guest_context::GuestContext;

/// DISCARD_STATE: the driver asks for everything to be dropped before it resets the device.
/// Discards every object of the guest the way their destroy commands would, removing the
/// device's shared-memory mappings itself. The driver asked, so no DEVICE_FATAL is owed for it.
pub(crate) fn discard_state(s: &mut Session<'_>) -> CommandResult {
    discard_all(s.guest, s.state, Some(s.ctx));
    s.state.announce_discard = false;
    Ok(ResponseBody::Empty)
}

/// Discards every object of the guest (spec §11.1), in dependency order. `ctx` is `None`
/// when the frontend already removed every queue-region mapping (reset, disconnect).
/// Returns whether there was anything to discard.
pub(crate) fn discard_all(
    guest: &GuestShared,
    state: &mut GuestState,
    ctx: Option<&GuestContext>,
) -> bool {
    let counts = state.counts();
    let had_area = guest.doorbells().lock().clear();
    if counts.is_empty() && !had_area {
        return false;
    }
    let host = guest.host();
    // Windows first: a bound one holds its MR and (type 2) its QP in the kernel.
    for (handle, entry) in state.mws.drain() {
        mw::release(host, handle, entry);
    }
    for (handle, entry) in state.qps.drain() {
        qp::release(host, ctx, &mut state.shm, handle, entry);
    }
    for (handle, entry) in state.srqs.drain() {
        srq::release(host, ctx, &mut state.shm, handle, entry);
    }
    for (handle, entry) in state.cqs.drain() {
        cq::release(host, ctx, &mut state.shm, handle, entry);
    }
    for (handle, entry) in state.ahs.drain() {
        ah::release(host, handle, entry);
    }
    let mrs = state.mrs.drain();
    for (handle, entry) in mrs {
        mr::release(host, state, handle, entry);
    }
    for (handle, entry) in state.pds.drain() {
        pd::release(host, handle, entry);
    }
    state.mr_bytes = 0;
    // Every window was given back above; this also drops what a lost window left charged.
    state.memory.clear();
    state.owners.clear();
    state.shm.clear();
    state.announce_discard = true;
    let epoch = guest.advance_epoch();
    info!(
        "guest {}: discarded {counts}; epoch is now {epoch}",
        guest.id()
    );
    true
}

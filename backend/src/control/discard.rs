//! Discarding a guest's state (spec §11.1): the DISCARD_STATE command, and the discard of every
//! object that a reset, a disconnect or a host device failure also performs.

use log::warn;
use vrdma_spec::control::ResponseBody;

use super::session::{CommandResult, Session};
use super::{ah, cm, cq, mr, mw, pd, qp, srq};
use crate::guest::shared::GuestShared;
use crate::guest::state::GuestState;
use crate::vhost_device::guest_io::GuestIo;

/// DISCARD_STATE: the driver asks for everything to be dropped before it resets the device.
/// Discards every object of the guest the way their destroy commands would, removing the
/// device's shared-memory mappings itself. The driver asked, so no DEVICE_FATAL is owed for it.
pub(crate) fn discard_state(s: &mut Session<'_>) -> CommandResult {
    discard_all(
        s.guest,
        s.state,
        Some(s.guest_io),
        Epoch::AdvancedFrom(s.epoch),
    );
    s.state.announce_discard = false;
    Ok(ResponseBody::Empty)
}

/// What a discard does to the configuration epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Epoch {
    /// Advanced when there is anything to discard (host failure).
    Advanced,
    /// Advanced when there is anything to discard, unless it moved on from this one since
    /// (DISCARD_STATE, whose driver's reset was requested while it ran: that reset started
    /// the next driver's epoch, which this discard must not move again).
    AdvancedFrom(u32),
    /// Left alone: a reset advanced it when it was requested; a disconnect has no driver.
    Kept,
}

/// Discards every object of the guest (spec §11.1), in dependency order. `guest_io` is `None`
/// when the frontend already removed every queue-region mapping (reset, disconnect).
/// Returns whether there was anything to discard.
pub(crate) fn discard_all(
    guest: &GuestShared,
    state: &mut GuestState,
    guest_io: Option<&GuestIo>,
    epoch: Epoch,
) -> bool {
    let counts = state.counts();
    let (lingering_ahs, had_area) = {
        let mut doorbells = guest.doorbells().lock();
        (doorbells.staging().take_lingering_ahs(), doorbells.clear())
    };
    let host = guest.host();
    // Host MRs an earlier discard could not deregister go first: nothing of the guest may
    // outlive a discard that can be helped.
    let had_lingering = !state.lingering_mrs.is_empty() || !state.lingering_pds.is_empty();
    let lingering = mr::retry_lingering(host, state);
    if lingering == 0 {
        for pd in std::mem::take(&mut state.lingering_pds) {
            pd::release_host(host, pd);
        }
    }
    if counts.is_empty() && !had_area && !had_lingering && lingering_ahs.is_empty() {
        return false;
    }
    // Connection-manager ids first: their connections name the QPs.
    cm::discard(guest, &mut state.cm);
    // Windows next: a bound one holds its MR and (type 2) its QP in the kernel.
    for (handle, entry) in state.mws.drain() {
        mw::release(host, handle, entry);
    }
    for (handle, entry) in state.qps.drain() {
        qp::release(host, guest_io, &mut state.shm, handle, entry);
    }
    for (handle, entry) in state.srqs.drain() {
        srq::release(host, guest_io, &mut state.shm, handle, entry);
    }
    for (handle, entry) in state.cqs.drain() {
        cq::release(host, guest_io, &mut state.shm, handle, entry);
    }
    for (handle, entry) in state.ahs.drain() {
        ah::release(host, handle, entry);
    }
    // AHs the guest destroyed while its UD sends might still name them: the QPs are gone.
    for host_ah in lingering_ahs {
        if let Err(e) = host.destroy_ah(host_ah) {
            warn!(
                "guest {}: destroying host AH {host_ah} failed: {e}",
                guest.id()
            );
        }
    }
    let mrs = state.mrs.drain();
    for (handle, entry) in mrs {
        mr::release(host, state, handle, entry);
    }
    for (handle, entry) in state.pds.drain() {
        if state.lingering_mrs.is_empty() {
            pd::release(host, handle, entry);
        } else {
            // A host MR still registered may be in it: the host would refuse (and the PD
            // would be forgotten); deallocate it after the MR.
            state.lingering_pds.push(entry.host);
        }
    }
    state.mr_bytes = 0;
    // Every window was given back above, but for those of MRs still registered on the host.
    if state.lingering_mrs.is_empty() {
        // This also drops what a lost window left charged.
        state.memory.clear();
    } else {
        warn!(
            "guest {}: {} host MRs could not be deregistered; they stay mapped until the next \
             discard or the disconnect",
            guest.id(),
            state.lingering_mrs.len()
        );
    }
    state.owners.clear();
    state.shm.clear();
    state.announce_discard = true;
    let epoch = match epoch {
        Epoch::Advanced => guest.advance_epoch(),
        Epoch::AdvancedFrom(seen) => guest.advance_epoch_from(seen),
        Epoch::Kept => guest.epoch(),
    };
    let (n, shown) = guest.count_discard();
    let level = if shown {
        log::Level::Info
    } else {
        log::Level::Debug
    };
    log::log!(
        level,
        "guest {}: discard #{n}: discarded {counts}; epoch is now {epoch}{}",
        guest.id(),
        if lingering > 0 {
            " (MRs still registered on the host)"
        } else {
            ""
        }
    );
    true
}

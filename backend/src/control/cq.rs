//! CREATE_CQ, DESTROY_CQ, ARM_CQ and RESIZE_CQ (spec §7.4).

use log::{debug, warn};
use vrdma_spec::event::Subject;
use vrdma_spec::rxe_v1;
use vrdma_spec::verbs::arm_flags;
use vrdma_spec::wire::{ArmCqReq, CreateCqReq, CreateCqResp, HandleReq, ResizeCqReq, ResizeCqResp};
use vrdma_spec::{Le32, ResponseBody};

use super::error::CommandError;
use super::rings;
use super::session::{at_most, host_err, CommandResult, Session};
use super::staged_rings;
use super::unwind::{Undo, Unwind};
use crate::datapath::staging::cq_copy::StagedCq;
use crate::guest::objects::discard_events_of;
use crate::guest::objects::CqEntry;
use crate::guest::objects::EventOwner;
use crate::host::{CqInit, HostContext};
use crate::memory::queue_region::ShmAllocator;
use crate::resources::kind::{ResourceError, ResourceKind};
use crate::resources::table::Handle;
use crate::vhost_device::guest_io::GuestIo;

/// CREATE_CQ: depth limit, quota, host CQ on the context's completion channel, mapping.
pub(crate) fn create_cq(s: &mut Session<'_>, r: &CreateCqReq) -> CommandResult {
    rings::require_ring_format(s)?;
    at_most(r.cqe.get(), s.guest.limits().attr.max_cqe, "cqe")?;
    s.state.cqs.check_room(0)?;
    let user_handle = s.state.new_user_handle();
    let cq = s
        .host()
        .create_cq(&CqInit {
            cqe: r.cqe.get(),
            comp_vector: 0,
            use_comp_channel: true,
            user_handle,
        })
        .map_err(host_err("CREATE_CQ"))?;
    let mut c = Unwind::new(s);
    c.did(Undo::HostCq(cq.handle));
    let num_slots = cq
        .cqe
        .checked_add(1)
        .ok_or_else(|| CommandError::HostAnswer(format!("cqe {}", cq.cqe)))?;
    let (ring, staged) = if staged_rings::stage_cq(&c) {
        let (ring, staged) = staged_rings::map_staged_cq(&mut c, &cq)?;
        c.did(Undo::Rings(ring, None));
        // The device watches the host CQ from now on: every completion raises an event.
        staged
            .arm_host(c.host())
            .map_err(host_err("REQ_NOTIFY_CQ"))?;
        (ring, Some(staged))
    } else {
        let ring = rings::map_ring(&mut c, cq.buffer, num_slots, rxe_v1::CQE_SIZE)?;
        c.did(Undo::Rings(ring, None));
        (ring, None)
    };
    let entry = CqEntry {
        host: cq.handle,
        user_handle,
        ring,
        staged,
    };
    let handle = c.state.cqs.insert(entry)?;
    c.commit();
    s.state.owners.insert(user_handle, EventOwner::Cq(handle));
    Ok(ResponseBody::CreateCq(CreateCqResp {
        cq: Le32::new(handle.raw()),
        cqe: Le32::new(cq.cqe),
        ring: ring.desc,
    }))
}

/// DESTROY_CQ: `BUSY` while a QP uses it; destroys the host CQ, then unmaps its buffer.
pub(crate) fn destroy_cq(s: &mut Session<'_>, r: &HandleReq) -> CommandResult {
    let handle = Handle::from_raw(r.handle.get());
    let refs = s.state.cqs.refs(handle)?;
    if refs != 0 {
        return Err(ResourceError::Busy {
            kind: ResourceKind::Cq,
            handle: handle.raw(),
            refs,
        }
        .into());
    }
    let host = s.state.cqs.get(handle)?.host;
    s.host().destroy_cq(host).map_err(host_err("DESTROY_CQ"))?;
    let entry = s.state.cqs.remove(handle)?;
    s.state.owners.remove(&entry.user_handle);
    discard_events_of(s.guest_io, Subject::Cq, handle);
    rings::unmap_ring(Some(s.guest_io), &mut s.state.shm, &entry.ring);
    Ok(ResponseBody::Empty)
}

/// ARM_CQ: requests one completion event: from the host for a CQ whose ring is the host's,
/// from the device's copy for a staged one (spec §9.8).
pub(crate) fn arm_cq(s: &mut Session<'_>, r: &ArmCqReq) -> CommandResult {
    let entry = s.state.cqs.get_mut(Handle::from_raw(r.cq.get()))?;
    if let Some(staged) = entry.staged.as_mut() {
        staged.arm_guest();
        return Ok(ResponseBody::Empty);
    }
    let host = entry.host;
    let solicited_only = r.flags.get() & arm_flags::SOLICITED_ONLY != 0;
    s.host()
        .req_notify_cq(host, solicited_only)
        .map_err(host_err("REQ_NOTIFY_CQ"))?;
    Ok(ResponseBody::Empty)
}

/// RESIZE_CQ: the host CQ gets a new buffer (carrying its completions over), which replaces
/// the old one in the queue region. A staged CQ (spec §9.8) gets a new staging ring of the new
/// geometry, which takes the completions the guest had not consumed first.
///
/// Region space for the new buffer is checked before the host is asked, so that a full region
/// fails the command without effect; once the host has resized, the old buffer is dead, so a
/// failure to map the new one leaves the CQ without a live ring (spec: the driver destroys it).
pub(crate) fn resize_cq(s: &mut Session<'_>, r: &ResizeCqReq) -> CommandResult {
    rings::require_ring_format(s)?;
    let handle = Handle::from_raw(r.cq.get());
    let entry = s.state.cqs.get(handle)?;
    let host = entry.host;
    let staged_pending = entry.staged.as_ref().map(StagedCq::pending);
    let cqe = r.cqe.get();
    at_most(cqe, s.guest.limits().attr.max_cqe, "cqe")?;
    let below_held = CommandError::Invalid {
        what: "cqe (below the completions the CQ holds)",
        value: cqe.into(),
    };
    // rxe checks only what its own buffer holds; a staged CQ's ring holds the rest.
    if staged_pending.is_some_and(|(unconsumed, uncopied)| cqe < unconsumed + uncopied) {
        return Err(below_held);
    }
    let predicted = rxe_v1::num_slots_for(cqe)
        .and_then(|slots| rings::predicted_len(slots, rxe_v1::CQE_SIZE))
        .ok_or(CommandError::Invalid {
            what: "cqe",
            value: cqe.into(),
        })?;
    if staged_pending.is_some() {
        staged_rings::check_room(s, predicted)?;
    } else {
        rings::require_room(&mut s.state.shm, predicted)?;
    }
    let resized = s
        .host()
        .resize_cq(host, cqe)
        .map_err(|source| match source.errno() {
            // rxe's only EINVAL left after the checks above: fewer entries than completions held.
            libc::EINVAL => below_held,
            _ => host_err("RESIZE_CQ")(source),
        })?;
    let resized_cq = crate::host::Cq {
        handle: host,
        cqe: resized.cqe,
        buffer: resized.buffer,
    };
    let mapped = if staged_pending.is_some() {
        staged_rings::map_staged_cq(s, &resized_cq).map(|(ring, staged)| (ring, Some(staged)))
    } else {
        resized
            .cqe
            .checked_add(1)
            .ok_or_else(|| CommandError::HostAnswer(format!("cqe {}", resized.cqe)))
            .and_then(|num_slots| rings::map_ring(s, resized.buffer, num_slots, rxe_v1::CQE_SIZE))
            .map(|ring| (ring, None))
    };
    let (ring, staged) = mapped.map_err(|e| {
        warn!("CQ {handle} was resized on the host but its new buffer is not mapped: {e}");
        rings::after_host_resize(e)
    })?;
    let entry = s.state.cqs.get_mut(handle)?;
    if let Some(mut staged) = staged {
        let old = entry.staged.take().expect("a staged CQ stays staged");
        staged.take_over(&old);
        entry.staged = Some(staged);
    }
    let old = std::mem::replace(&mut entry.ring, ring);
    rings::unmap_ring(Some(s.guest_io), &mut s.state.shm, &old);
    debug!(
        "CQ {handle} resized to {} entries: region {:#x} -> {:#x}",
        resized.cqe, old.range.offset, ring.range.offset
    );
    Ok(ResponseBody::ResizeCq(ResizeCqResp {
        cqe: Le32::new(resized.cqe),
        reserved: Le32::ZERO,
        ring: ring.desc,
    }))
}

/// Destroys a CQ whose table entry is gone (teardown).
pub(crate) fn release(
    host: &dyn HostContext,
    guest_io: Option<&GuestIo>,
    shm: &mut ShmAllocator,
    handle: Handle,
    entry: CqEntry,
) {
    if let Err(e) = host.destroy_cq(entry.host) {
        warn!("destroying CQ {handle} (host {}) failed: {e}", entry.host);
    }
    rings::unmap_ring(guest_io, shm, &entry.ring);
}

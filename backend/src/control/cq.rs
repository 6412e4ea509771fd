//! CREATE_CQ, DESTROY_CQ and ARM_CQ (spec §7.4).

use log::warn;
use vrdma_spec::rxe_v1;
use vrdma_spec::verbs::arm_flags;
use vrdma_spec::wire::{ArmCqReq, CreateCqReq, CreateCqResp, HandleReq};
use vrdma_spec::{Le32, ResponseBody};

use super::error::CommandError;
use super::rings;
use super::session::{at_most, host_err, CommandResult, Session};
use crate::guest::objects::CqEntry;
use crate::guest::objects::EventOwner;
use crate::host::{CqHandle, CqInit, HostContext};
use crate::memory::queue_region::ShmAllocator;
use crate::resources::kind::{ResourceError, ResourceKind};
use crate::resources::table::Handle;
use crate::vhost_device::guest_context::GuestContext;

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
    let mapped = cq
        .cqe
        .checked_add(1)
        .ok_or_else(|| CommandError::Geometry(format!("cqe {}", cq.cqe)))
        .and_then(|num_slots| rings::map_ring(s, cq.buffer, num_slots, rxe_v1::CQE_SIZE));
    let ring = match mapped {
        Ok(ring) => ring,
        Err(e) => {
            destroy_host(s.host(), cq.handle);
            return Err(e);
        }
    };
    let entry = CqEntry {
        host: cq.handle,
        user_handle,
        ring,
    };
    let handle = match s.state.cqs.insert(entry) {
        Ok(handle) => handle,
        Err(e) => {
            destroy_host(s.host(), cq.handle);
            rings::unmap_ring(Some(s.ctx), &mut s.state.shm, &ring);
            return Err(e.into());
        }
    };
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
    rings::unmap_ring(Some(s.ctx), &mut s.state.shm, &entry.ring);
    Ok(ResponseBody::Empty)
}

/// ARM_CQ: requests one completion event.
pub(crate) fn arm_cq(s: &mut Session<'_>, r: &ArmCqReq) -> CommandResult {
    let host = s.state.cqs.get(Handle::from_raw(r.cq.get()))?.host;
    let solicited_only = r.flags.get() & arm_flags::SOLICITED_ONLY != 0;
    s.host()
        .req_notify_cq(host, solicited_only)
        .map_err(host_err("REQ_NOTIFY_CQ"))?;
    Ok(ResponseBody::Empty)
}

fn destroy_host(host: &dyn HostContext, cq: CqHandle) {
    if let Err(e) = host.destroy_cq(cq) {
        warn!("destroying host CQ {cq} failed: {e}");
    }
}

/// Destroys a CQ whose table entry is gone (teardown).
pub(crate) fn release(
    host: &dyn HostContext,
    ctx: Option<&GuestContext>,
    shm: &mut ShmAllocator,
    handle: Handle,
    entry: CqEntry,
) {
    if let Err(e) = host.destroy_cq(entry.host) {
        warn!("destroying CQ {handle} (host {}) failed: {e}", entry.host);
    }
    rings::unmap_ring(ctx, shm, &entry.ring);
}

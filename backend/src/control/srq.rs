//! CREATE_SRQ, MODIFY_SRQ, RESIZE_SRQ, QUERY_SRQ and DESTROY_SRQ (spec §7.4).

use log::warn;
use vrdma_spec::event::Subject;
use vrdma_spec::rxe_v1;
use vrdma_spec::verbs::srq_attr;
use vrdma_spec::wire::{
    CreateSrqReq, CreateSrqResp, HandleReq, ModifySrqReq, QuerySrqResp, ResizeSrqReq, ResizeSrqResp,
};
use vrdma_spec::{Le32, ResponseBody};

use super::error::CommandError;
use super::query::SRQ_RESIZE_CAP;
use super::rings;
use super::session::{at_most, host_err, CommandResult, Session};
use super::unwind::{Undo, Unwind};
use crate::guest::objects::discard_events_of;
use crate::guest::objects::EventOwner;
use crate::guest::objects::SrqEntry;
use crate::host::{HostContext, SrqInit, SrqModify};
use crate::memory::queue_region::ShmAllocator;
use crate::resources::kind::{ResourceError, ResourceKind};
use crate::resources::table::Handle;
use crate::vhost_device::guest_io::GuestIo;

/// The capacity the host gives an SRQ asked for `max_wr` WRs (spec §9.1).
fn actual_depth(max_wr: u32) -> Option<u32> {
    rxe_v1::num_slots_for(max_wr).map(|slots| slots - 1)
}

/// CREATE_SRQ: ring format, limits, PD, quota, host SRQ, mapping.
pub(crate) fn create_srq(s: &mut Session<'_>, r: &CreateSrqReq) -> CommandResult {
    rings::require_ring_format(s)?;
    let attr = &s.guest.limits().attr;
    at_most(r.max_wr.get(), attr.max_srq_wr, "max_wr")?;
    at_most(r.max_sge.get(), attr.max_srq_sge, "max_sge")?;
    let limit = r.srq_limit.get();
    if actual_depth(r.max_wr.get()).is_none_or(|depth| limit >= depth) {
        return Err(CommandError::Invalid {
            what: "srq_limit",
            value: limit.into(),
        });
    }
    let pd = Handle::from_raw(r.pd.get());
    let pd_host = s.state.pds.get(pd)?.host;
    s.state.srqs.check_room(0)?;
    let user_handle = s.state.new_user_handle();
    let mut c = Unwind::new(s);
    c.take_ref(|s| s.state.pds.acquire(pd), Undo::PdRef(pd))?;
    let srq = c
        .host()
        .create_srq(&SrqInit {
            pd: pd_host,
            max_wr: r.max_wr.get(),
            max_sge: r.max_sge.get(),
            srq_limit: limit,
            user_handle,
        })
        .map_err(host_err("CREATE_SRQ"))?;
    c.did(Undo::HostSrq(srq.handle));
    let slots = srq
        .max_wr
        .checked_add(1)
        .ok_or_else(|| CommandError::HostAnswer(format!("depth {}", srq.max_wr)))?;
    let ring = rings::map_ring(
        &mut c,
        srq.buffer,
        slots,
        rxe_v1::recv_wqe_size(srq.max_sge),
    )?;
    c.did(Undo::Rings(ring, None));
    let entry = SrqEntry {
        host: srq.handle,
        pd,
        user_handle,
        max_wr: srq.max_wr,
        max_sge: srq.max_sge,
        srq_limit: limit,
        ring,
    };
    let handle = c.state.srqs.insert(entry)?;
    c.commit();
    s.state.owners.insert(user_handle, EventOwner::Srq(handle));
    Ok(ResponseBody::CreateSrq(CreateSrqResp {
        srq: Le32::new(handle.raw()),
        srq_num: Le32::new(srq.srq_num),
        max_wr: Le32::new(srq.max_wr),
        max_sge: Le32::new(srq.max_sge),
        ring: ring.desc,
    }))
}

/// MODIFY_SRQ: arming the limit; resizing is RESIZE_SRQ (`MAX_WR` here is `UNSUPPORTED`).
pub(crate) fn modify_srq(s: &mut Session<'_>, r: &ModifySrqReq) -> CommandResult {
    let handle = Handle::from_raw(r.srq.get());
    let entry = s.state.srqs.get(handle)?;
    if r.attr_mask.get() & srq_attr::MAX_WR != 0 {
        return Err(CommandError::Unsupported("SRQ resize"));
    }
    let limit = r.srq_limit.get();
    if limit >= entry.max_wr {
        return Err(CommandError::Invalid {
            what: "srq_limit",
            value: limit.into(),
        });
    }
    let host = entry.host;
    s.host()
        .modify_srq(
            host,
            &SrqModify {
                max_wr: None,
                srq_limit: Some(limit),
            },
        )
        .map_err(host_err("MODIFY_SRQ"))?;
    if let Ok(entry) = s.state.srqs.get_mut(handle) {
        entry.srq_limit = limit;
    }
    Ok(ResponseBody::Empty)
}

/// RESIZE_SRQ: the host SRQ gets a new buffer that carries the posted receives over (rxe's
/// `rxe_queue_resize`), which replaces the old one in the queue region.
///
/// Region space for the new buffer is checked before the host is asked, so that a full region
/// fails the command without effect; once the host has resized, the old buffer is dead, so a
/// failure to map the new one leaves the SRQ without a live ring (spec: the driver destroys it).
pub(crate) fn resize_srq(s: &mut Session<'_>, r: &ResizeSrqReq) -> CommandResult {
    rings::require_ring_format(s)?;
    if s.guest.limits().attr.device_cap_flags & SRQ_RESIZE_CAP == 0 {
        return Err(CommandError::Unsupported(
            "SRQ resize (the host device has none)",
        ));
    }
    let handle = Handle::from_raw(r.srq.get());
    let entry = s.state.srqs.get(handle)?;
    let (host, max_sge, limit) = (entry.host, entry.max_sge, entry.srq_limit);
    let max_wr = r.max_wr.get();
    at_most(max_wr, s.guest.limits().attr.max_srq_wr, "max_wr")?;
    // rxe's rule (`rxe_srq_chk_attr`): an armed limit above the new size is EINVAL.
    if limit != 0 && max_wr < limit {
        return Err(CommandError::Invalid {
            what: "max_wr (below the armed srq_limit)",
            value: max_wr.into(),
        });
    }
    let invalid = || CommandError::Invalid {
        what: "max_wr",
        value: max_wr.into(),
    };
    let depth = actual_depth(max_wr).ok_or_else(invalid)?;
    let entry_bytes = rxe_v1::recv_wqe_size(max_sge);
    let predicted = rings::predicted_len(depth + 1, entry_bytes).ok_or_else(invalid)?;
    rings::require_room(&mut s.state.shm, predicted)?;
    let buffer = s
        .host()
        .modify_srq(
            host,
            &SrqModify {
                max_wr: Some(max_wr),
                srq_limit: None,
            },
        )
        .map_err(|source| match source.errno() {
            // rxe's only EINVAL left after the checks above: fewer entries than receives held.
            libc::EINVAL => CommandError::Invalid {
                what: "max_wr (below the receives the SRQ holds)",
                value: max_wr.into(),
            },
            _ => host_err("RESIZE_SRQ")(source),
        })?
        .ok_or_else(|| CommandError::HostAnswer("the host resized without a new buffer".into()))?;
    let ring = rings::map_ring(s, buffer, depth + 1, entry_bytes).map_err(|e| {
        warn!("SRQ {handle} was resized on the host but its new buffer is not mapped: {e}");
        rings::after_host_resize(e)
    })?;
    let entry = s.state.srqs.get_mut(handle)?;
    entry.max_wr = depth;
    let old = std::mem::replace(&mut entry.ring, ring);
    rings::unmap_ring(Some(s.guest_io), &mut s.state.shm, &old);
    Ok(ResponseBody::ResizeSrq(ResizeSrqResp {
        max_wr: Le32::new(depth),
        reserved: Le32::ZERO,
        ring: ring.desc,
    }))
}

/// QUERY_SRQ, from what the device knows (the host layer has no query).
pub(crate) fn query_srq(s: &mut Session<'_>, r: &HandleReq) -> CommandResult {
    let entry = s.state.srqs.get(Handle::from_raw(r.handle.get()))?;
    Ok(ResponseBody::QuerySrq(QuerySrqResp {
        max_wr: Le32::new(entry.max_wr),
        max_sge: Le32::new(entry.max_sge),
        srq_limit: Le32::new(entry.srq_limit),
        reserved: Le32::ZERO,
    }))
}

/// DESTROY_SRQ: `BUSY` while a QP uses it; destroys the host SRQ, then unmaps its buffer.
pub(crate) fn destroy_srq(s: &mut Session<'_>, r: &HandleReq) -> CommandResult {
    let handle = Handle::from_raw(r.handle.get());
    let refs = s.state.srqs.refs(handle)?;
    if refs != 0 {
        return Err(ResourceError::Busy {
            kind: ResourceKind::Srq,
            handle: handle.raw(),
            refs,
        }
        .into());
    }
    let host = s.state.srqs.get(handle)?.host;
    s.host()
        .destroy_srq(host)
        .map_err(host_err("DESTROY_SRQ"))?;
    let entry = s.state.srqs.remove(handle)?;
    s.state.owners.remove(&entry.user_handle);
    discard_events_of(s.guest_io, Subject::Srq, handle);
    rings::unmap_ring(Some(s.guest_io), &mut s.state.shm, &entry.ring);
    if let Err(e) = s.state.pds.release(entry.pd) {
        warn!("SRQ bookkeeping: {e}");
    }
    Ok(ResponseBody::Empty)
}

/// Destroys an SRQ whose table entry is gone (teardown).
pub(crate) fn release(
    host: &dyn HostContext,
    guest_io: Option<&GuestIo>,
    shm: &mut ShmAllocator,
    handle: Handle,
    entry: SrqEntry,
) {
    if let Err(e) = host.destroy_srq(entry.host) {
        warn!("destroying SRQ {handle} (host {}) failed: {e}", entry.host);
    }
    rings::unmap_ring(guest_io, shm, &entry.ring);
}

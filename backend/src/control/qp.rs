//! CREATE_QP, MODIFY_QP, QUERY_QP and DESTROY_QP (spec §7.4).

use log::warn;
use vrdma_spec::attr::qp::QpCaps;
use vrdma_spec::event::Subject;
use vrdma_spec::features::VRDMA_F_HOST_KICK;
use vrdma_spec::rxe_v1;
use vrdma_spec::verbs::{self, QpAttrMask, QpState, QpType};
use vrdma_spec::wire::{AhAttr, CreateQpReq, CreateQpResp, HandleReq, ModifyQpReq, QueryQpReq};
use vrdma_spec::wire::{QpAttr, QueryQpResp, RingDesc};
use vrdma_spec::{Le32, ResponseBody};
use zerocopy::FromZeros;

use super::ah::{ah_attr_to_guest, ah_attr_to_host, check_reach, check_source_unchanged};
use super::error::CommandError;
use super::rings;
use super::session::{at_most, host_err, CommandResult, Session};
use super::staged_rings::{self, QueueModes};
use super::unwind::{Undo, Unwind};
use crate::datapath::staging::{StagedKind, StagedRing};
use crate::guest::objects::discard_events_of;
use crate::guest::objects::EventOwner;
use crate::guest::objects::{QpDeps, QpEntry};
use crate::guest::state::GuestState;
use crate::host::{self, DeviceError, HostContext, QpHandle, QpInit, QueueBuffer};
use crate::memory::queue_region::{MappedRing, ShmAllocator};
use crate::resources::table::Handle;
use crate::vhost_device::guest_io::GuestIo;

impl QpDeps {
    /// Takes a reference on every dependency, each recorded on the create's guard.
    fn acquire(&self, c: &mut Unwind<'_, '_>) -> Result<(), CommandError> {
        c.take_ref(|s| s.state.pds.acquire(self.pd), Undo::PdRef(self.pd))?;
        c.take_ref(
            |s| s.state.cqs.acquire(self.send_cq),
            Undo::CqRef(self.send_cq),
        )?;
        c.take_ref(
            |s| s.state.cqs.acquire(self.recv_cq),
            Undo::CqRef(self.recv_cq),
        )?;
        if let Some(srq) = self.srq {
            c.take_ref(|s| s.state.srqs.acquire(srq), Undo::SrqRef(srq))?;
        }
        Ok(())
    }

    /// Drops the references [`QpDeps::acquire`] took (the QP is destroyed).
    fn release(&self, state: &mut GuestState) {
        let results = [
            state.pds.release(self.pd),
            state.cqs.release(self.send_cq),
            state.cqs.release(self.recv_cq),
            self.srq.map_or(Ok(()), |srq| state.srqs.release(srq)),
        ];
        for e in results.into_iter().filter_map(Result::err) {
            warn!("QP bookkeeping: {e}");
        }
    }
}

/// CREATE_QP: ring format, caps, handles, quota, doorbell area, then the host QP and its maps.
pub(crate) fn create_qp(s: &mut Session<'_>, r: &CreateQpReq) -> CommandResult {
    rings::require_ring_format(s)?;
    let qp_type = QpType::try_from(r.qp_type).map_err(|v| CommandError::Invalid {
        what: "qp_type",
        value: v.into(),
    })?;
    let attr = &s.guest.limits().attr;
    at_most(r.max_send_wr.get(), attr.max_qp_wr, "max_send_wr")?;
    at_most(r.max_recv_wr.get(), attr.max_qp_wr, "max_recv_wr")?;
    at_most(r.max_send_sge.get(), attr.max_sge, "max_send_sge")?;
    at_most(r.max_recv_sge.get(), attr.max_sge, "max_recv_sge")?;
    at_most(
        r.max_inline_data.get(),
        super::query::max_inline_data(attr),
        "max_inline_data",
    )?;

    let deps = QpDeps {
        pd: Handle::from_raw(r.pd.get()),
        send_cq: Handle::from_raw(r.send_cq.get()),
        recv_cq: Handle::from_raw(r.recv_cq.get()),
        srq: (r.srq.get() != 0).then(|| Handle::from_raw(r.srq.get())),
    };
    let pd = s.state.pds.get(deps.pd)?.host;
    let send_cq = s.state.cqs.get(deps.send_cq)?.host;
    let recv_cq = s.state.cqs.get(deps.recv_cq)?.host;
    let srq = match deps.srq {
        Some(srq) => Some(s.state.srqs.get(srq)?.host),
        None => None,
    };
    s.state.qps.check_room(0)?;
    let modes = staged_rings::queue_modes(s, qp_type, srq.is_some())?;

    let doorbell_index = {
        let mut doorbells = s.guest.doorbells().lock();
        if !doorbells.has_area() {
            return Err(CommandError::BadState("SET_DOORBELL_AREA must come first"));
        }
        // `doorbell_slots` >= the QP quota, checked above: a slot is always free.
        doorbells
            .reserve()
            .ok_or(CommandError::BadState("no free doorbell slot"))?
    };
    let mut c = Unwind::new(s);
    c.did(Undo::DoorbellSlot(doorbell_index));
    deps.acquire(&mut c)?;
    let user_handle = c.state.new_user_handle();
    // rxe needs room for at least one WR per queue; the response reports the actual depth.
    let caps = QpCaps {
        max_send_wr: r.max_send_wr.get().max(1),
        max_recv_wr: if srq.is_some() {
            0
        } else {
            r.max_recv_wr.get().max(1)
        },
        max_send_sge: r.max_send_sge.get(),
        max_recv_sge: r.max_recv_sge.get(),
        max_inline_data: r.max_inline_data.get(),
    };
    let qp = c
        .host()
        .create_qp(&QpInit {
            qp_type,
            pd,
            send_cq,
            recv_cq,
            srq,
            caps,
            sq_sig_all: r.sq_sig_all != 0,
            user_handle,
        })
        .map_err(host_err("CREATE_QP"))?;
    c.did(Undo::HostQp(qp.handle));
    let sq_direct = modes.sq.is_none();
    let (sq, rq, staged) = map_rings(&mut c, &qp, srq.is_some(), modes, deps.pd)?;
    c.did(Undo::Rings(sq, rq));
    let entry = QpEntry {
        host: qp.handle,
        qpn: qp.qpn,
        qp_type,
        deps,
        user_handle,
        doorbell_index,
        sq,
        rq,
        qpn_claim: c.guest.tenant().claim_qpn(qp.qpn),
        alt_path_set: false,
    };
    let handle = c.state.qps.insert(entry)?;
    // The QP is the guest's now: its entry owns what the creation held.
    c.commit();
    s.state.owners.insert(user_handle, EventOwner::Qp(handle));
    {
        let mut doorbells = s.guest.doorbells().lock();
        for ring in staged.into_iter().flatten() {
            doorbells.staging().attach(doorbell_index, ring);
        }
        doorbells.attach(doorbell_index, qp.handle);
    }
    let mut sq_desc = sq.desc;
    if sq_direct && s.features & VRDMA_F_HOST_KICK != 0 {
        // What the doorbell would make the device do, the driver may do itself (spec §5.3).
        sq_desc.set_host_kick(qp.handle.0);
    }
    Ok(ResponseBody::CreateQp(CreateQpResp {
        qp: Le32::new(handle.raw()),
        qpn: Le32::new(qp.qpn),
        max_send_wr: Le32::new(qp.caps.max_send_wr),
        max_recv_wr: Le32::new(qp.caps.max_recv_wr),
        max_send_sge: Le32::new(qp.caps.max_send_sge),
        max_recv_sge: Le32::new(qp.caps.max_recv_sge),
        max_inline_data: Le32::new(qp.caps.max_inline_data),
        doorbell_index: Le32::new(doorbell_index),
        sq: sq_desc,
        rq: rq.map_or_else(RingDesc::new_zeroed, |rq| rq.desc),
    }))
}

/// The staging rings of a new QP: of its send queue, of its receive queue.
type StagedRings = [Option<StagedRing>; 2];

/// One queue of a new QP on its way into the queue region.
enum QueueRing {
    /// The host buffer itself, placed; mapped together with the QP's other direct queue.
    Direct(rings::PlacedRing),
    /// A staging ring (already in a mapped chunk) with the device's copy state.
    Staged(MappedRing, StagedRing),
}

impl QueueRing {
    /// Places (direct: a ring of `depth + 1` slots of `entry` bytes) or stages the queue in
    /// `buffer` as `staged` says; on error nothing stays allocated.
    fn prepare(
        s: &mut Session<'_>,
        qp: &host::Qp,
        buffer: QueueBuffer,
        (depth, entry): (u32, usize),
        staged: Option<StagedKind>,
        pd: Handle,
    ) -> Result<QueueRing, CommandError> {
        if let Some(kind) = staged {
            let (ring, staged) = staged_rings::map_staged(s, qp, buffer, kind, pd)?;
            return Ok(QueueRing::Staged(ring, staged));
        }
        let slots = depth
            .checked_add(1)
            .ok_or_else(|| CommandError::HostAnswer(format!("depth {depth}")))?;
        rings::place_ring(s, buffer, slots, entry).map(QueueRing::Direct)
    }

    fn placed(&self) -> Option<rings::PlacedRing> {
        match self {
            QueueRing::Direct(placed) => Some(*placed),
            QueueRing::Staged(..) => None,
        }
    }

    /// Takes back what [`prepare`](Self::prepare) did (the queue is not in use yet).
    fn release(self, s: &mut Session<'_>) {
        match self {
            QueueRing::Direct(placed) => rings::free_extent(&mut s.state.shm, placed.ring.range),
            // The staging ring's memory is emptied when `_staged` drops.
            QueueRing::Staged(ring, _staged) => {
                rings::unmap_ring(Some(s.guest_io), &mut s.state.shm, &ring)
            }
        }
    }

    fn into_parts(self) -> (MappedRing, Option<StagedRing>) {
        match self {
            QueueRing::Direct(placed) => (placed.ring, None),
            QueueRing::Staged(ring, staged) => (ring, Some(staged)),
        }
    }
}

/// Maps the SQ and, without an SRQ, the RQ, each as the host buffer or as a staging ring (with
/// the device's copy state), the host buffers with one exchange with the frontend for both;
/// on error nothing stays mapped.
fn map_rings(
    s: &mut Session<'_>,
    qp: &host::Qp,
    with_srq: bool,
    modes: QueueModes,
    pd: Handle,
) -> Result<(MappedRing, Option<MappedRing>, StagedRings), CommandError> {
    let caps = qp.caps;
    let send = (
        caps.max_send_wr,
        rxe_v1::send_wqe_size(caps.max_send_sge, caps.max_inline_data),
    );
    let recv = (caps.max_recv_wr, rxe_v1::recv_wqe_size(caps.max_recv_sge));
    let sq = QueueRing::prepare(s, qp, qp.sq, send, modes.sq, pd)?;
    let rq = match (qp.rq, with_srq) {
        (_, true) => None,
        (Some(buffer), false) => {
            let staged = modes.rq_staged.then_some(StagedKind::Recv);
            match QueueRing::prepare(s, qp, buffer, recv, staged, pd) {
                Ok(rq) => Some(rq),
                Err(e) => {
                    sq.release(s);
                    return Err(e);
                }
            }
        }
        (None, false) => {
            sq.release(s);
            return Err(CommandError::HostAnswer("the host QP has no RQ".into()));
        }
    };
    let direct: Vec<rings::PlacedRing> = std::iter::once(&sq)
        .chain(rq.as_ref())
        .filter_map(QueueRing::placed)
        .collect();
    if !direct.is_empty() {
        // On error the direct queues' extents are freed; the staged ones are left to release.
        if let Err(e) = rings::map_placed(s, &direct) {
            for queue in std::iter::once(sq).chain(rq) {
                if let QueueRing::Staged(..) = queue {
                    queue.release(s);
                }
            }
            return Err(e);
        }
    }
    let (sq, staged_sq) = sq.into_parts();
    let (rq, staged_rq) = match rq.map(QueueRing::into_parts) {
        Some((rq, staged)) => (Some(rq), staged),
        None => (None, None),
    };
    Ok((sq, rq, [staged_sq, staged_rq]))
}

/// What MODIFY_QP needs of the host QP as it is now, in one QUERY_QP: its state (it moves to
/// SQE/ERR on its own) and, for the reach check of a connected QP, its paths and destination.
fn current_attr(s: &Session<'_>, host: QpHandle) -> Result<(QpState, QpAttr), CommandError> {
    let info = s
        .host()
        .query_qp(host, QpAttrMask::STATE | REACH_ATTRS)
        .map_err(host_err("QUERY_QP"))?;
    let state = info.attr.qp_state().map_err(|e| {
        host_err("QUERY_QP")(DeviceError::InvalidReply {
            command: "QUERY_QP",
            reason: e.to_string(),
        })
    })?;
    Ok((state, info.attr))
}

/// The attributes that decide where a connected QP sends.
const REACH_ATTRS: QpAttrMask = QpAttrMask::from_bits_retain(
    QpAttrMask::AV.bits() | QpAttrMask::DEST_QPN.bits() | QpAttrMask::ALT_PATH.bits(),
);

fn state_field(value: u32, what: &'static str) -> Result<QpState, CommandError> {
    QpState::try_from(value).map_err(|v| CommandError::Invalid {
        what,
        value: v.into(),
    })
}

/// MODIFY_QP: the spec's state machine against the host's current state, then the values of
/// the selected attributes against the port and device, then the host.
pub(crate) fn modify_qp(s: &mut Session<'_>, r: &ModifyQpReq) -> CommandResult {
    let handle = Handle::from_raw(r.qp.get());
    let entry = s.state.qps.get(handle)?;
    let (host, qp_type, alt_path_set) = (entry.host, entry.qp_type, entry.alt_path_set);
    // The decoder refused undefined bits.
    let mask = QpAttrMask::from_bits_retain(r.attr_mask.get());
    if mask.intersects(QpAttrMask::CAP | QpAttrMask::RATE_LIMIT) {
        return Err(CommandError::Unsupported("QP resize or rate limit"));
    }
    let a = r.attr;
    let has = |bits: QpAttrMask| mask.contains(bits);
    let (cur, current) = current_attr(s, host)?;
    let next = if has(QpAttrMask::STATE) {
        state_field(a.qp_state.get(), "qp_state")?
    } else {
        cur
    };
    let claimed = if has(QpAttrMask::CUR_STATE) {
        Some(state_field(a.cur_qp_state.get(), "cur_qp_state")?)
    } else {
        None
    };
    verbs::check_modify_qp(qp_type, cur, mask, next, claimed).map_err(|status| {
        CommandError::Rule {
            what: "QP state transition",
            status,
        }
    })?;

    let guest = s.guest;
    let limits = &guest.limits().attr;
    let port = if has(QpAttrMask::PORT) {
        guest
            .host_port(a.port_num.into())
            .ok_or(CommandError::Invalid {
                what: "port_num",
                value: a.port_num.into(),
            })?
    } else {
        guest.options().host_port
    };
    if mask.intersects(QpAttrMask::PKEY_INDEX | QpAttrMask::PATH_MTU) {
        let port_attr = guest.port_limits();
        if has(QpAttrMask::PKEY_INDEX) && a.pkey_index.get() >= port_attr.pkey_tbl_len {
            return Err(CommandError::Invalid {
                what: "pkey_index",
                value: a.pkey_index.get().into(),
            });
        }
        if has(QpAttrMask::PATH_MTU) && a.path_mtu.get() > u32::from(port_attr.max_mtu) {
            return Err(CommandError::Invalid {
                what: "path_mtu",
                value: a.path_mtu.get().into(),
            });
        }
    }
    if has(QpAttrMask::MAX_QP_RD_ATOMIC) {
        at_most(
            a.max_rd_atomic.into(),
            limits.max_qp_init_rd_atom,
            "max_rd_atomic",
        )?;
    }
    if has(QpAttrMask::MAX_DEST_RD_ATOMIC) {
        at_most(
            a.max_dest_rd_atomic.into(),
            limits.max_qp_rd_atom,
            "max_dest_rd_atomic",
        )?;
    }
    // The guest's attributes, with what the host sees differently rewritten: the states
    // as checked, and port numbers (unselected paths and ports cleared).
    let mut attr = a
        .with_qp_state(next)
        .with_cur_qp_state(claimed.unwrap_or(cur));
    let primary = if has(QpAttrMask::AV) {
        Some(ah_attr_to_host(guest, &a.ah_attr, "ah_attr.port_num")?)
    } else {
        None
    };
    attr.ah_attr = primary.as_ref().map_or_else(AhAttr::default, |av| av.attr);
    let mut alternate_av = None;
    (attr.alt_ah_attr, attr.alt_port_num) = if has(QpAttrMask::ALT_PATH) {
        let alt_port = guest
            .host_port(a.alt_port_num.into())
            .ok_or(CommandError::Invalid {
                what: "alt_port_num",
                value: a.alt_port_num.into(),
            })?;
        let alternate = ah_attr_to_host(guest, &a.alt_ah_attr, "alt_ah_attr.port_num")?;
        let host_attr = alternate.attr;
        alternate_av = Some(alternate);
        (host_attr, alt_port)
    } else {
        (AhAttr::default(), 0)
    };
    attr.port_num = if has(QpAttrMask::PORT) { port } else { 0 };
    if matches!(qp_type, QpType::Rc | QpType::Uc) && mask.intersects(REACH_ATTRS) {
        check_connection_reach(s, &current, &a, mask, alt_path_set)?;
    }
    let guest = s.guest;
    guest
        .host()
        .modify_qp(host, &attr, mask)
        .map_err(host_err("MODIFY_QP"))?;
    // The host resolved the source GID indices when it ran the command: if its table changed
    // since they were checked, the QP may send from an address not the guest's. It goes to
    // ERR and the command fails (the guest may reset the QP and try again).
    let unchanged = [
        (primary, &a.ah_attr, "ah_attr.port_num"),
        (alternate_av, &a.alt_ah_attr, "alt_ah_attr.port_num"),
    ]
    .into_iter()
    .filter_map(|(av, requested, what)| Some((av?, requested, what)))
    .try_for_each(|(av, requested, what)| check_source_unchanged(guest, requested, &av, what));
    if let Err(e) = unchanged {
        let error = QpAttr::default().with_qp_state(QpState::Err);
        if let Err(m) = guest.host().modify_qp(host, &error, QpAttrMask::STATE) {
            warn!("host QP {host}: moving it to ERR failed: {m}");
        }
        return Err(e);
    }
    let entry = s.state.qps.get_mut(handle)?;
    if has(QpAttrMask::ALT_PATH) {
        entry.alt_path_set = true;
    } else if next == QpState::Reset {
        entry.alt_path_set = false;
    }
    if has(QpAttrMask::STATE) {
        // A staged UD send queue forwards only while its QP sends (see `set_sending`).
        let sending = matches!(next, QpState::Rts | QpState::Err);
        let index = entry.doorbell_index;
        s.guest
            .doorbells()
            .lock()
            .staging()
            .set_sending(index, sending, s.guest.host());
    }
    Ok(ResponseBody::Empty)
}

/// Checks that the QP number a connected QP is aimed at lives behind the destination address
/// of each of its paths (spec §12.1), taking what the command does not set from the host QP's
/// `current` attributes. The alternate path counts as well: a device that migrates to it
/// would send there. The host's alternate path counts only if the guest set it since the QP's
/// last RESET (`alt_path_set`): rxe keeps the alternate path of an earlier connection, which
/// the guest's next connection does not use until it sets one (and rxe never migrates).
fn check_connection_reach(
    s: &Session<'_>,
    current: &QpAttr,
    a: &QpAttr,
    mask: QpAttrMask,
    alt_path_set: bool,
) -> Result<(), CommandError> {
    let pick = |bit: QpAttrMask| if mask.contains(bit) { a } else { current };
    let qpn = pick(QpAttrMask::DEST_QPN).dest_qp_num.get();
    check_reach(s.guest, &pick(QpAttrMask::AV).ah_attr.dgid, qpn)?;
    let alternate = if mask.contains(QpAttrMask::ALT_PATH) {
        Some(a.alt_ah_attr.dgid)
    } else {
        alt_path_set.then_some(current.alt_ah_attr.dgid)
    };
    if let Some(alternate) = alternate.filter(|dgid| *dgid != [0; 16]) {
        check_reach(s.guest, &alternate, qpn)?;
    }
    Ok(())
}

/// Attribute bits QUERY_QP answers with: every legacy attribute (the spec lets the device
/// return more than asked).
const QUERY_QP_MASK: QpAttrMask =
    QpAttrMask::from_bits_retain(QpAttrMask::ALL.bits() & !QpAttrMask::RATE_LIMIT.bits());

/// QUERY_QP: the host's attributes, with port numbers and source GID indices in the guest's
/// terms.
pub(crate) fn query_qp(s: &mut Session<'_>, r: &QueryQpReq) -> CommandResult {
    let host = s.state.qps.get(Handle::from_raw(r.qp.get()))?.host;
    let info = s
        .host()
        .query_qp(host, QUERY_QP_MASK)
        .map_err(host_err("QUERY_QP"))?;
    let guest = s.guest;
    // What the guest sees differently: its port numbers, and the current state as the
    // expected one.
    let mut attr = info.attr;
    attr.cur_qp_state = attr.qp_state;
    attr.ah_attr = ah_attr_to_guest(guest, &attr.ah_attr)?;
    attr.alt_ah_attr = ah_attr_to_guest(guest, &attr.alt_ah_attr)?;
    attr.port_num = guest.guest_port(attr.port_num);
    attr.alt_port_num = guest.guest_port(attr.alt_port_num);
    Ok(ResponseBody::QueryQp(QueryQpResp {
        attr_mask: Le32::new(QUERY_QP_MASK.bits()),
        reserved: Le32::ZERO,
        attr,
    }))
}

/// DESTROY_QP: stops its doorbell, destroys the host QP, then unmaps its queues.
pub(crate) fn destroy_qp(s: &mut Session<'_>, r: &HandleReq) -> CommandResult {
    let handle = Handle::from_raw(r.handle.get());
    let entry = s.state.qps.get(handle)?;
    let (host, index) = (entry.host, entry.doorbell_index);
    // No kick of the device's may reach the host handle once it is destroyed (the kernel
    // reuses handles). A host kick from the front-end's process (spec §5.3) may: a stale one
    // is an empty POST_SEND on another QP of the same guest's context, which changes
    // nothing; one in flight makes the host refuse the destroy for its length, which the
    // host layer waits out.
    s.guest.doorbells().lock().detach(index);
    if let Err(e) = s.host().destroy_qp(host) {
        s.guest.doorbells().lock().attach(index, host);
        return Err(host_err("DESTROY_QP")(e));
    }
    let entry = s.state.qps.remove(handle)?;
    s.guest.doorbells().lock().release(index);
    // A CM id that named the QP no longer does: another CM_CONNECT/CM_ACCEPT through it
    // could otherwise send a host QP number the host may give to another QP.
    s.state.cm.forget_qp(handle);
    s.state.owners.remove(&entry.user_handle);
    discard_events_of(s.guest_io, Subject::Qp, handle);
    rings::unmap_queue_rings(
        Some(s.guest_io),
        &mut s.state.shm,
        &entry.sq,
        entry.rq.as_ref(),
    );
    entry.deps.release(s.state);
    Ok(ResponseBody::Empty)
}

/// Destroys a QP whose table entry is gone (teardown; references are dropped with the
/// tables).
pub(crate) fn release(
    host: &dyn HostContext,
    guest_io: Option<&GuestIo>,
    shm: &mut ShmAllocator,
    handle: Handle,
    entry: QpEntry,
) {
    if let Err(e) = host.destroy_qp(entry.host) {
        warn!("destroying QP {handle} (host {}) failed: {e}", entry.host);
    }
    rings::unmap_queue_rings(guest_io, shm, &entry.sq, entry.rq.as_ref());
}

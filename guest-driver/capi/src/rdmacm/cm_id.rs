//! The id object (`struct rdma_cm_id` and what librdmacm keeps beside it, [`CmIdPriv`]) and
//! the work on it that the commands and the events share: making an id, its addresses, and
//! moving its QP with the attributes the device computes.
//!
//! As in librdmacm, an id made without a channel is *synchronous*: it gets a channel of its
//! own and each operation that produces an event waits for it (`event::complete`), leaving it
//! in `id->event`. Applications read `rdma_cm_id` fields directly and, by rdma_cm's rules, do
//! not call into one id from several threads at once; the fields are written through the id's
//! pointer like librdmacm writes them.

use std::ffi::{c_int, c_void};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use vrdma::verbs::cm::{CmId, PortSpace};
use vrdma::verbs::{QpAttrMask, QpState};
use vrdma::VerbsError;

use super::device::cm_device;
use super::sockaddr as c_addr;
use crate::cm_events::channel::CmChannel;
use crate::cm_events::router::CmRouter;
use crate::context::VrdmaContext;
use crate::ffi::errno_of;
use crate::qp::VrdmaQp;
use crate::sys::rdma_port_space_RDMA_PS_TCP as PS_TCP;
use crate::sys::rdma_port_space_RDMA_PS_UDP as PS_UDP;
use crate::sys::*;

/// What librdmacm keeps of an id besides the `rdma_cm_id`.
#[repr(C)]
pub(crate) struct CmIdPriv {
    pub(crate) id: rdma_cm_id,
    /// The device's context. `id.verbs` shows it only once the id is bound to the device (an
    /// address of it bound or resolved, or a connect request's id), as librdmacm's does:
    /// programs tell an id that is still unbound by its NULL `verbs` (libfabric creates an
    /// active endpoint's QP only after its address resolution).
    pub(crate) ctx: *mut ibv_context,
    /// The device's id; `None` once destroyed.
    pub(crate) cm: Mutex<Option<CmId>>,
    pub(crate) handle: u32,
    pub(crate) router: Arc<CmRouter>,
    /// The channel its events go to (its own for a synchronous id).
    pub(crate) channel: Mutex<Arc<CmChannel>>,
    /// Made without a channel: operations wait for their event.
    pub(crate) sync: AtomicBool,
    pub(crate) state: Mutex<IdState>,
    /// Signalled when an event of the id is acknowledged.
    pub(crate) acked: Condvar,
}

/// The mutable part of an id's bookkeeping.
#[derive(Default)]
pub(crate) struct IdState {
    /// Events of the id handed to the application, and how many it acknowledged.
    pub(crate) given: u64,
    pub(crate) acknowledged: u64,
    /// RDMA reads/atomics the peer may have outstanding here (`max_dest_rd_atomic` at RTR).
    pub(crate) responder_resources: u8,
    /// RDMA reads/atomics this side may have outstanding (`max_rd_atomic` at RTS).
    pub(crate) initiator_depth: u8,
    /// The QP attributes of a passive endpoint (`rdma_create_ep`), for `rdma_get_request`.
    pub(crate) qp_init_attr: Option<ibv_qp_init_attr>,
    /// The CQs and channels `rdma_create_qp` made for the id (destroyed with its QP).
    pub(crate) own_cqs: bool,
    /// Made for a connect request: its addresses stay unscoped, as the kernel reports a
    /// request's (`cma_save_ip6_info`); libfabric's rxm compares them byte for byte with the
    /// names in its address vector, so a scope would make two peers' connections collide.
    pub(crate) from_request: bool,
}

// SAFETY: the raw pointers in `id` name objects of this library that are thread-safe, and the
// application serializes its use of one id (rdma_cm rules); the rest is behind locks.
unsafe impl Send for CmIdPriv {}
// SAFETY: as above.
unsafe impl Sync for CmIdPriv {}

impl CmIdPriv {
    /// Whether the id is synchronous now (made, or migrated, without a channel).
    pub(crate) fn is_sync(&self) -> bool {
        self.sync.load(Ordering::Acquire)
    }

    /// Makes the id synchronous or not (`rdma_migrate_id`).
    pub(crate) fn set_sync(&self, sync: bool) {
        self.sync.store(sync, Ordering::Release);
    }

    /// The id behind `id`.
    ///
    /// # Safety
    /// `id` is NULL or a live id of this library.
    pub(crate) unsafe fn of<'a>(id: *mut rdma_cm_id) -> Option<&'a CmIdPriv> {
        // SAFETY: caller contract; `id` is the first field of a repr(C) CmIdPriv.
        unsafe { id.cast::<CmIdPriv>().as_ref() }
    }

    /// Whether the device moves an accept's QP itself (`VRDMA_F_CM_MOVES_QP`).
    pub(crate) fn device_moves_qp(&self) -> bool {
        self.cm.lock().as_ref().is_some_and(CmId::device_moves_qp)
    }

    /// Runs `f` on the device's id; `EINVAL` once it is destroyed.
    pub(crate) fn with_cm<T>(
        &self,
        f: impl FnOnce(&CmId) -> Result<T, VerbsError>,
    ) -> Result<T, c_int> {
        let cm = self.cm.lock();
        let cm = cm.as_ref().ok_or(libc::EINVAL)?;
        f(cm).map_err(|e| errno_of(&e))
    }
}

/// The device's port space and QP type of an rdma_cm port space.
pub(crate) fn port_space(ps: rdma_port_space) -> Option<(PortSpace, ibv_qp_type)> {
    match ps {
        PS_TCP => Some((PortSpace::Tcp, ibv_qp_type_IBV_QPT_RC)),
        PS_UDP => Some((PortSpace::Udp, ibv_qp_type_IBV_QPT_UD)),
        _ => None,
    }
}

/// A new id of the device's id `cm`, routed to `channel` (`None`: a channel of its own);
/// `bound`: already bound to the device (a connect request's), so `verbs` shows it.
pub(crate) fn new_id(
    cm: CmId,
    channel: Option<Arc<CmChannel>>,
    context: *mut c_void,
    ps: rdma_port_space,
    bound: bool,
) -> Result<*mut rdma_cm_id, c_int> {
    let device = cm_device()?;
    let (_, qp_type) = port_space(ps).ok_or(libc::EINVAL)?;
    let sync = channel.is_none();
    let channel = match channel {
        Some(channel) => channel,
        None => CmChannel::new().map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))?,
    };
    // SAFETY: a live context of this library.
    let router = Arc::clone(&unsafe { VrdmaContext::of(device.ibv) }.cm);
    // SAFETY: all-zero is a valid rdma_cm_id (NULL pointers, empty addresses).
    let mut id: rdma_cm_id = unsafe { std::mem::zeroed() };
    id.verbs = if bound {
        device.ibv
    } else {
        std::ptr::null_mut()
    };
    id.channel = std::ptr::from_ref(&channel.c).cast_mut();
    id.context = context;
    id.ps = ps;
    id.qp_type = qp_type;
    id.port_num = 1;
    id.pd = device.pd;
    let handle = cm.handle();
    let (responder_resources, initiator_depth) = device_rd_atomic(device.ibv);
    let boxed = Box::new(CmIdPriv {
        id,
        ctx: device.ibv,
        cm: Mutex::new(Some(cm)),
        handle,
        router: Arc::clone(&router),
        channel: Mutex::new(Arc::clone(&channel)),
        sync: AtomicBool::new(sync),
        state: Mutex::new(IdState {
            responder_resources,
            initiator_depth,
            ..IdState::default()
        }),
        acked: Condvar::new(),
    });
    let raw: *mut rdma_cm_id = Box::into_raw(boxed).cast();
    router.add(handle, channel, raw);
    Ok(raw)
}

/// The device's most RDMA reads/atomics as responder and as initiator (librdmacm's defaults).
pub(crate) fn device_rd_atomic(ibv: *mut ibv_context) -> (u8, u8) {
    // SAFETY: a live context of this library.
    let attr = unsafe { VrdmaContext::of(ibv) }.ctx.query_device();
    let cap = |v: u32| u8::try_from(v).unwrap_or(u8::MAX);
    (
        cap(attr.max_qp_rd_atom.get()),
        cap(attr.max_qp_init_rd_atom.get()),
    )
}

/// Refreshes `id->route.addr` from the device (CM_QUERY_ADDR).
///
/// # Safety
/// `id` is a live id of this library.
pub(crate) unsafe fn refresh_addresses(id: *mut rdma_cm_id) {
    // SAFETY: caller contract.
    let Some(p) = (unsafe { CmIdPriv::of(id) }) else {
        return;
    };
    if let Ok(addresses) = p.with_cm(CmId::query_addr) {
        // SAFETY: caller contract.
        unsafe { set_addresses(id, addresses.src, addresses.dst) };
    }
}

/// Shows a bind to a loopback address as the kernel does: the kernel's rdma_cm takes a
/// loopback bind for the wildcard (`cma_any_addr`), so the id has no device yet (`verbs`
/// stays NULL) and its source is the loopback address with its port. The device bound the
/// guest's own address (spec §7.5); only its port is shown. libfabric's verbs provider binds
/// "localhost" and, seeing no device, takes each netdev's own address and family; given the
/// device's IPv6 address beside its AF_INET hint it would advertise the wrong format.
///
/// # Safety
/// `id` is a live id of this library.
pub(crate) unsafe fn show_loopback_binding(id: *mut rdma_cm_id, addr: SocketAddr) {
    // SAFETY: caller contract.
    let Some(p) = (unsafe { CmIdPriv::of(id) }) else {
        return;
    };
    let port = match addr.port() {
        0 => p
            .with_cm(CmId::query_addr)
            .ok()
            .and_then(|a| a.src)
            .map_or(0, |src| src.port()),
        port => port,
    };
    // SAFETY: caller contract: the id's route is this library's to write; the storage member
    // of the union.
    let src = unsafe { &mut (*id).route.addr.__bindgen_anon_1.src_storage };
    c_addr::write(Some(SocketAddr::new(addr.ip(), port)), src);
}

/// Writes the id's addresses (and the GIDs of `route.addr.addr.ibaddr`).
///
/// # Safety
/// `id` is a live id of this library.
pub(crate) unsafe fn set_addresses(
    id: *mut rdma_cm_id,
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
) {
    // SAFETY: caller contract.
    let from_request = unsafe { CmIdPriv::of(id) }.is_some_and(|p| p.state.lock().from_request);
    let (src, dst) = if from_request {
        (src.map(c_addr::unscoped), dst.map(c_addr::unscoped))
    } else {
        let src = src.map(c_addr::with_local_scope);
        let dst = dst.map(|dst| c_addr::with_local_scope(c_addr::scoped_like(dst, src)));
        (src, dst)
    };
    // An address of the device is bound: the id is the device's from here on.
    if src.is_some_and(|src| !src.ip().is_unspecified()) {
        // SAFETY: caller contract: a live id of this library, whose fields it writes.
        if let Some(p) = unsafe { CmIdPriv::of(id) } {
            // SAFETY: as above.
            unsafe { (*id).verbs = p.ctx };
        }
    }
    // SAFETY: caller contract: the id's route is this library's to write.
    let addr = unsafe { &mut (*id).route.addr };
    if src.is_some() {
        // SAFETY: writing the storage member of the union.
        c_addr::write(src, unsafe { &mut addr.__bindgen_anon_1.src_storage });
    }
    if dst.is_some() {
        // SAFETY: as above.
        c_addr::write(dst, unsafe { &mut addr.__bindgen_anon_2.dst_storage });
    }
    let gid = |a: Option<SocketAddr>| {
        a.map(|a| match a.ip() {
            std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            std::net::IpAddr::V6(v6) => v6.octets(),
        })
    };
    // SAFETY: the only member of the union.
    let ib = unsafe { &mut addr.addr.ibaddr };
    if let Some(g) = gid(src) {
        ib.sgid.raw = g;
    }
    if let Some(g) = gid(dst) {
        ib.dgid.raw = g;
    }
    ib.pkey = 0xffff_u16.to_be();
}

/// The QP of the id, as this library's QP; `EINVAL` if the id has none.
///
/// # Safety
/// `id` is a live id of this library.
pub(crate) unsafe fn id_qp<'a>(id: *mut rdma_cm_id) -> Option<&'a VrdmaQp> {
    // SAFETY: caller contract; the QP is this library's and lives while the id has it.
    unsafe { VrdmaQp::from_ptr((*id).qp) }
}

/// The QP an application names by number for an id without a QP of its own (librdmacm's
/// "external QP": `conn_param->qp_num` goes to the peer and the application moves the QP
/// itself, with `rdma_init_qp_attr`, then `rdma_establish` on the active side): the live QP
/// of the id's device with that number.
///
/// # Safety
/// `p` is a live id of this library; the QP is not destroyed meanwhile (application contract).
pub(crate) unsafe fn external_qp<'a>(p: &CmIdPriv, qp_num: u32) -> Option<&'a VrdmaQp> {
    if qp_num == 0 {
        return None;
    }
    // SAFETY: caller contract: the id's context is live while the id is.
    let ctx = unsafe { VrdmaContext::from_ptr(p.ctx) }?;
    ctx.async_events
        .live(crate::async_events::ObjectKind::Qp)
        .into_iter()
        // SAFETY: registered by ibv_create_qp, retired by ibv_destroy_qp before it is freed.
        .filter_map(|addr| unsafe { VrdmaQp::from_ptr(addr as *mut ibv_qp) })
        .find(|vqp| vqp.ibv.qp_base.qp_num == qp_num)
}

pub(crate) use vrdma::spec::cm::CM_HOST_DEPTH as HOST_DEPTH;

/// Moves the id's QP to `state` with the attributes the device computes; RTR and RTS take
/// `depths` (responder resources, initiator depth; [`HOST_DEPTH`]: the host's), by default
/// the id's (librdmacm's `ucma_modify_qp_rtr/rts`).
///
/// # Safety
/// `id` is a live id of this library.
pub(crate) unsafe fn modify_qp(
    id: *mut rdma_cm_id,
    state: QpState,
    depths: Option<(u8, u8)>,
) -> Result<(), c_int> {
    // SAFETY: caller contract.
    let (Some(p), Some(qp)) = (unsafe { (CmIdPriv::of(id), id_qp(id)) }) else {
        return Err(libc::EINVAL);
    };
    let (responder, initiator) = depths.unwrap_or_else(|| {
        let ids = p.state.lock();
        (ids.responder_resources, ids.initiator_depth)
    });
    if p.device_moves_qp() {
        // One command for the pair below.
        p.with_cm(|cm| cm.move_qp(&qp.qp, state, responder, initiator))?;
        // SAFETY: caller contract (the QP is live); applications read this field.
        unsafe { (*(*id).qp).state = state as u32 };
        return Ok(());
    }
    let (mut attr, mask) = p.with_cm(|cm| cm.init_qp_attr(state))?;
    if state == QpState::Rtr && responder != HOST_DEPTH {
        attr.max_dest_rd_atomic = responder;
    }
    if state == QpState::Rts && initiator != HOST_DEPTH {
        attr.max_rd_atomic = initiator;
    }
    qp.qp.modify(&attr, mask).map_err(|e| errno_of(&e))?;
    // SAFETY: caller contract (the QP is live); applications read this field.
    unsafe { (*(*id).qp).state = state as u32 };
    Ok(())
}

/// Moves the id's QP to the error state (after a reject, before a disconnect).
///
/// # Safety
/// `id` is a live id of this library.
pub(crate) unsafe fn qp_to_error(id: *mut rdma_cm_id) {
    // SAFETY: caller contract.
    let Some(qp) = (unsafe { id_qp(id) }) else {
        return;
    };
    let mut attr: vrdma::verbs::QpAttr = zerocopy::FromZeros::new_zeroed();
    attr.qp_state = vrdma::spec::Le32::new(QpState::Err as u32);
    if let Err(e) = qp.qp.modify(&attr, QpAttrMask::STATE) {
        log::debug!("vrdma: moving a QP to ERR: {e}");
        return;
    }
    // SAFETY: as above.
    unsafe { (*(*id).qp).state = QpState::Err as u32 };
}

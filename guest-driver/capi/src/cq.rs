//! Completion channels and completion queues.

use std::cell::{Cell, UnsafeCell};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use vrdma::provider::WorkCompletion;
use vrdma::verbs::CqPollBatch;
use vrdma::Cq;

use crate::async_events::{AsyncEvents, ObjectKind};
use crate::context::VrdmaContext;
use crate::events::{ChannelState, CompletionRoutes};
use crate::ffi::{guard, minus_one, null_with, report};
use crate::sys::{ibv_comp_channel, ibv_context, ibv_cq, ibv_cq_ex};

/// A completion channel: `ibv_comp_channel` first.
#[repr(C)]
struct VrdmaChannel {
    ibv: ibv_comp_channel,
    state: Arc<ChannelState>,
}

/// `ibv_create_comp_channel`.
///
/// # Safety
/// `context` is a context of this library.
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    guard("ibv_create_comp_channel", std::ptr::null_mut(), || {
        // SAFETY: caller contract.
        if unsafe { VrdmaContext::from_ptr(context) }.is_none() {
            return null_with("ibv_create_comp_channel", libc::EINVAL);
        }
        let state = match ChannelState::new() {
            Ok(state) => Arc::new(state),
            Err(e) => {
                return null_with(
                    "ibv_create_comp_channel",
                    e.raw_os_error().unwrap_or(libc::EIO),
                )
            }
        };
        let ibv = ibv_comp_channel {
            context,
            fd: state.raw_fd(),
            refcnt: 0,
        };
        Box::into_raw(Box::new(VrdmaChannel { ibv, state })).cast()
    })
}

/// `ibv_destroy_comp_channel`: 0, EBUSY while CQs use it, or another errno value.
///
/// # Safety
/// `channel` is a channel of this library, not used afterwards on success.
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    guard("ibv_destroy_comp_channel", libc::EIO, || {
        // SAFETY: caller contract; `ibv` is the first field.
        let Some(ch) = (unsafe { channel.cast::<VrdmaChannel>().as_ref() }) else {
            return libc::EINVAL;
        };
        if ch.ibv.refcnt != 0 {
            return libc::EBUSY;
        }
        // SAFETY: made by Box::into_raw; the caller gives it up.
        drop(unsafe { Box::from_raw(channel.cast::<VrdmaChannel>()) });
        0
    })
}

/// Completion events handed out by `ibv_get_cq_event` and acknowledged.
#[derive(Default)]
struct EventCounts {
    reported: u32,
    acked: u32,
}

/// The batch poll state of an extended CQ ([`crate::cq_ex`]). Only the caller that holds the batch (whose `start_poll`
/// returned 0, until its `end_poll`) touches it, as the `ibv_cq_ex` contract requires; the
/// batch holds the CQ's lock meanwhile, which orders one batch's accesses before the next's.
#[derive(Default)]
pub(crate) struct PollState {
    /// The open batch. Its lifetime is the CQ's own (`VrdmaCq::cq`, declared after this
    /// field, so a batch left open is dropped before the CQ it borrows).
    pub(crate) batch: UnsafeCell<Option<CqPollBatch<'static>>>,
    /// The completion the accessors read: the batch's current one.
    pub(crate) current: Cell<Option<WorkCompletion>>,
}

/// A completion queue: `ibv_cq_ex` first, which starts with the fields of `ibv_cq` (so that
/// `ibv_cq_ex_to_cq` is a cast, as in rdma-core); a CQ made by `ibv_create_cq` leaves the
/// extended part zero, one made by `ibv_create_cq_ex` ([`crate::cq_ex`]) has its poll
/// operations set. Both work with every classic CQ verb.
#[repr(C)]
pub(crate) struct VrdmaCq {
    pub(crate) ibv: ibv_cq_ex,
    /// The open batch poll of an extended CQ; declared before `cq`, which it borrows.
    pub(crate) poll: PollState,
    pub(crate) cq: Cq,
    channel: Option<Arc<ChannelState>>,
    events: Mutex<EventCounts>,
    all_acked: Condvar,
    /// QPs using the CQ.
    pub(crate) users: AtomicU32,
    /// The context's event sinks, held by the CQ: `ibv_destroy_cq` must not reach them
    /// through `ibv.context`, which `ibv_close_device` may have freed already (rdma-core lets
    /// a context be closed before its objects; pyverbs' garbage collector does so).
    async_events: Arc<AsyncEvents>,
    routes: Arc<CompletionRoutes>,
}

// `ibv_cq_ex` begins with the layout of `ibv_cq`.
const _: () = {
    use std::mem::offset_of;
    assert!(offset_of!(ibv_cq, context) == offset_of!(ibv_cq_ex, context));
    assert!(offset_of!(ibv_cq, channel) == offset_of!(ibv_cq_ex, channel));
    assert!(offset_of!(ibv_cq, cq_context) == offset_of!(ibv_cq_ex, cq_context));
    assert!(offset_of!(ibv_cq, handle) == offset_of!(ibv_cq_ex, handle));
    assert!(offset_of!(ibv_cq, cqe) == offset_of!(ibv_cq_ex, cqe));
    assert!(offset_of!(ibv_cq, mutex) == offset_of!(ibv_cq_ex, mutex));
    assert!(offset_of!(ibv_cq, cond) == offset_of!(ibv_cq_ex, cond));
    assert!(
        offset_of!(ibv_cq, comp_events_completed) == offset_of!(ibv_cq_ex, comp_events_completed)
    );
    assert!(
        offset_of!(ibv_cq, async_events_completed) == offset_of!(ibv_cq_ex, async_events_completed)
    );
    assert!(std::mem::size_of::<ibv_cq>() <= offset_of!(ibv_cq_ex, comp_mask));
};

impl VrdmaCq {
    /// # Safety
    /// `ptr` is NULL or a live CQ of this library.
    pub(crate) unsafe fn from_ptr<'a>(ptr: *mut ibv_cq) -> Option<&'a VrdmaCq> {
        // SAFETY: caller contract; `ibv` is the first field of a repr(C) struct.
        unsafe { ptr.cast::<VrdmaCq>().as_ref() }
    }
}

/// The completion vectors a context reports: one (a CQ's events come through its channel;
/// there are no interrupts to spread).
pub(crate) const COMP_VECTORS: c_int = 1;

/// `ibv_create_cq`. `comp_vector` must name one of the context's [`COMP_VECTORS`], as the
/// kernel requires (EINVAL otherwise).
///
/// # Safety
/// `context` is a context of this library; `channel` is NULL or one of its channels.
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard("ibv_create_cq", std::ptr::null_mut(), || {
        let (Ok(cqe), Ok(comp_vector)) = (u32::try_from(cqe), u32::try_from(comp_vector)) else {
            return null_with("ibv_create_cq", libc::EINVAL);
        };
        // SAFETY: caller contract.
        match unsafe { create(context, cqe, comp_vector, cq_context, channel) } {
            Ok(raw) => raw.cast(),
            Err(errno) => null_with("ibv_create_cq", errno),
        }
    })
}

/// Creates a CQ of at least `cqe` entries in `context` on completion vector `comp_vector`,
/// with the extended part of its `ibv_cq_ex` zero; the CQ, or an errno value (the failure is
/// logged).
///
/// # Safety
/// `context` is NULL or a context of this library; `channel` is NULL or one of its channels.
pub(crate) unsafe fn create(
    context: *mut ibv_context,
    cqe: u32,
    comp_vector: u32,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
) -> Result<*mut VrdmaCq, c_int> {
    if comp_vector >= COMP_VECTORS.unsigned_abs() {
        return Err(libc::EINVAL);
    }
    // SAFETY: caller contract.
    let Some(ctx) = (unsafe { VrdmaContext::from_ptr(context) }) else {
        return Err(libc::EINVAL);
    };
    let cq = Cq::new(&ctx.ctx, cqe).map_err(|e| report("ibv_create_cq", &e))?;
    // SAFETY: caller contract.
    Ok(unsafe { wrap(context, ctx, cq, cq_context, channel) })
}

/// A CQ to make with [`create_many`]: its size, `cq_context` and completion channel.
pub(crate) struct CqSpec {
    pub(crate) cqe: u32,
    pub(crate) cq_context: *mut c_void,
    pub(crate) channel: *mut ibv_comp_channel,
}

/// Creates a CQ for each of `specs` on completion vector 0 in one batch of commands (one
/// round trip); each result is that CQ's, as [`create`] gives it.
///
/// # Safety
/// As [`create`]'s, for every spec.
pub(crate) unsafe fn create_many(
    context: *mut ibv_context,
    specs: &[CqSpec],
) -> Vec<Result<*mut VrdmaCq, c_int>> {
    // SAFETY: caller contract.
    let Some(ctx) = (unsafe { VrdmaContext::from_ptr(context) }) else {
        return specs.iter().map(|_| Err(libc::EINVAL)).collect();
    };
    let cqes: Vec<u32> = specs.iter().map(|spec| spec.cqe).collect();
    let made = match Cq::new_many(&ctx.ctx, &cqes) {
        Ok(made) => made,
        Err(e) => {
            let errno = report("ibv_create_cq", &e);
            return specs.iter().map(|_| Err(errno)).collect();
        }
    };
    made.into_iter()
        .zip(specs)
        .map(|(cq, spec)| {
            let cq = cq.map_err(|e| report("ibv_create_cq", &e))?;
            // SAFETY: caller contract.
            Ok(unsafe { wrap(context, ctx, cq, spec.cq_context, spec.channel) })
        })
        .collect()
}

/// The application's CQ around a CQ just made: routed to `channel`, known to async events.
///
/// # Safety
/// `ctx` is `context`'s; `channel` is NULL or one of its channels.
unsafe fn wrap(
    context: *mut ibv_context,
    ctx: &VrdmaContext,
    cq: Cq,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
) -> *mut VrdmaCq {
    // SAFETY: caller contract.
    let ch = unsafe { channel.cast::<VrdmaChannel>().as_mut() };
    // SAFETY: all-zero is a valid ibv_cq_ex (glibc's initializers are zero, the extended
    // operations NULL); set below.
    let mut ibv: ibv_cq_ex = unsafe { std::mem::zeroed() };
    ibv.context = context;
    ibv.channel = channel;
    ibv.cq_context = cq_context;
    ibv.handle = cq.handle();
    ibv.cqe = c_int::try_from(cq.capacity()).unwrap_or(c_int::MAX);
    let handle = cq.handle();
    let state = ch.as_ref().map(|ch| ch.state.clone());
    let raw = Box::into_raw(Box::new(VrdmaCq {
        ibv,
        poll: PollState::default(),
        cq,
        channel: state.clone(),
        events: Mutex::new(EventCounts::default()),
        all_acked: Condvar::new(),
        users: AtomicU32::new(0),
        async_events: ctx.async_events.clone(),
        routes: ctx.routes.clone(),
    }));
    if let (Some(ch), Some(state)) = (ch, state) {
        ch.ibv.refcnt += 1;
        ctx.routes.add(handle, state, raw as usize);
    }
    ctx.async_events
        .register(ObjectKind::Cq, handle, raw as usize);
    raw
}

/// `ibv_destroy_cq`: waits until every event handed out for the CQ by `ibv_get_cq_event` and
/// `ibv_get_async_event` was acknowledged, as rdma-core does; 0, EBUSY while QPs use the CQ,
/// or another errno value.
///
/// # Safety
/// `cq` is a CQ of this library, not used afterwards on success.
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard("ibv_destroy_cq", libc::EIO, || {
        // SAFETY: caller contract.
        let Some(vcq) = (unsafe { VrdmaCq::from_ptr(cq) }) else {
            return libc::EINVAL;
        };
        if vcq.users.load(Ordering::Acquire) != 0 {
            return libc::EBUSY;
        }
        let mut counts = vcq.events.lock();
        while counts.acked < counts.reported {
            vcq.all_acked.wait(&mut counts);
        }
        drop(counts);
        // Not through `vcq.ibv.context`: the context may be closed (and freed) already.
        vcq.async_events
            .retire(ObjectKind::Cq, vcq.ibv.handle, cq as usize);
        if vcq.channel.is_some() {
            vcq.routes.remove(vcq.ibv.handle);
            // SAFETY: the channel outlives its CQs (destroy refuses while refcnt != 0).
            if let Some(ch) = unsafe { vcq.ibv.channel.as_mut() } {
                ch.refcnt -= 1;
            }
        }
        // SAFETY: made by Box::into_raw in ibv_create_cq; the caller gives it up.
        drop(unsafe { Box::from_raw(cq.cast::<VrdmaCq>()) });
        0
    })
}

/// `ibv_resize_cq`: 0 with `cq->cqe` set to the new capacity (at least `cqe`), or an errno
/// value, as rdma-core: `EINVAL` for a `cqe` below the completions the CQ holds (they are kept
/// either way, as rxe's resize does). Polls of the CQ on other threads wait for it.
///
/// # Safety
/// `cq` is a CQ of this library.
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    guard("ibv_resize_cq", libc::EIO, || {
        // SAFETY: caller contract.
        let Some(vcq) = (unsafe { VrdmaCq::from_ptr(cq) }) else {
            return libc::EINVAL;
        };
        let Ok(cqe) = u32::try_from(cqe) else {
            return libc::EINVAL;
        };
        match vcq.cq.resize(cqe) {
            Ok(capacity) => {
                let capacity = c_int::try_from(capacity).unwrap_or(c_int::MAX);
                // SAFETY: `cq` is live (caller contract); `cqe` is the application's to read
                // and, as in rdma-core, written here, without other writers.
                unsafe { std::ptr::addr_of_mut!((*cq).cqe).write(capacity) };
                0
            }
            Err(e) => report("ibv_resize_cq", &e),
        }
    })
}

/// `ibv_get_cq_event`: waits for the next completion event of the channel (blocking unless
/// the application made the channel's fd non-blocking). 0, or -1 and errno.
///
/// # Safety
/// `channel` is a channel of this library; `cq` and `cq_context` are valid for writes.
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    guard("ibv_get_cq_event", -1, || {
        // SAFETY: caller contract.
        let Some(ch) = (unsafe { channel.cast::<VrdmaChannel>().as_ref() }) else {
            return minus_one(libc::EINVAL);
        };
        if cq.is_null() || cq_context.is_null() {
            return minus_one(libc::EINVAL);
        }
        let raw = match ch.state.next() {
            Ok(raw) => raw as *mut ibv_cq,
            Err(e) => return minus_one(e.raw_os_error().unwrap_or(libc::EIO)),
        };
        // SAFETY: the channel only queues live CQs (destroy purges their events).
        let Some(vcq) = (unsafe { VrdmaCq::from_ptr(raw) }) else {
            return minus_one(libc::EIO);
        };
        vcq.events.lock().reported += 1;
        // SAFETY: caller contract.
        unsafe {
            *cq = raw;
            *cq_context = vcq.ibv.cq_context;
        }
        0
    })
}

/// `ibv_ack_cq_events`.
///
/// # Safety
/// `cq` is a CQ of this library.
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    guard("ibv_ack_cq_events", (), || {
        // SAFETY: caller contract.
        if let Some(vcq) = unsafe { VrdmaCq::from_ptr(cq) } {
            let mut counts = vcq.events.lock();
            counts.acked = counts.acked.wrapping_add(nevents);
            vcq.all_acked.notify_all();
        }
    })
}

//! The device context every id uses, its shared PD, and `rdma_get_devices`.
//!
//! rdma-core's librdmacm opens each RDMA device once per process, with one PD per device, and
//! sets `id->verbs` and `id->pd` to them: applications then create their PDs, CQs and QPs on
//! `id->verbs`. Here there is one device, opened on first use with `ibv_open_device` and
//! kept for the life of the process, like librdmacm's. QPs of other contexts of this library
//! (another `ibv_open_device`) are another device session's and cannot be connected through
//! an id (`EINVAL`).

use std::ffi::{c_char, c_int};

use log::error;
use parking_lot::Mutex;
use vrdma::spec::cm::CM_EVENT_LAST;
use vrdma::spec::features::VRDMA_F_CM;

use crate::context::VrdmaContext;
use crate::ffi::{guard, null_with, set_errno};
use crate::sys::{ibv_context, ibv_pd};

/// The device context of the connection manager and its PD.
#[derive(Clone, Copy)]
pub(crate) struct CmDevice {
    pub(crate) ibv: *mut ibv_context,
    pub(crate) pd: *mut ibv_pd,
}

// SAFETY: the pointers name a context and a PD that live for the rest of the process and
// whose operations are thread-safe (ibverbs rules).
unsafe impl Send for CmDevice {}

static CM_DEVICE: Mutex<Option<CmDevice>> = Mutex::new(None);

/// The device context ids use, opened on first use; an errno value if there is no device or
/// it has no connection manager.
pub(crate) fn cm_device() -> Result<CmDevice, c_int> {
    let mut slot = CM_DEVICE.lock();
    if let Some(device) = *slot {
        return Ok(device);
    }
    crate::device::init_logging();
    // SAFETY: this library's own device.
    let ibv = unsafe { crate::device::ibv_open_device(crate::device::device()) };
    if ibv.is_null() {
        // SAFETY: reading errno of this thread.
        return Err(unsafe { *libc::__errno_location() });
    }
    // SAFETY: a context just opened by this library.
    let features = unsafe { VrdmaContext::of(ibv) }.ctx.features();
    if features & VRDMA_F_CM == 0 {
        error!("vrdma: the device has no connection manager (VRDMA_F_CM not offered)");
        // SAFETY: the context opened above, not used afterwards.
        unsafe { crate::device::ibv_close_device(ibv) };
        return Err(libc::ENODEV);
    }
    // SAFETY: a live context of this library.
    let pd = unsafe { crate::objects::ibv_alloc_pd(ibv) };
    if pd.is_null() {
        // SAFETY: reading errno of this thread.
        let errno = unsafe { *libc::__errno_location() };
        // SAFETY: the context opened above, not used afterwards.
        unsafe { crate::device::ibv_close_device(ibv) };
        return Err(errno);
    }
    let device = CmDevice { ibv, pd };
    *slot = Some(device);
    Ok(device)
}

/// `rdma_get_devices`: a NULL-terminated array of the device contexts (one), or NULL with
/// errno.
///
/// # Safety
/// `num_devices` is NULL or valid for a write.
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    guard("rdma_get_devices", std::ptr::null_mut(), || {
        let device = match cm_device() {
            Ok(device) => device,
            Err(errno) => return null_with("rdma_get_devices", errno),
        };
        // SAFETY: calloc of two pointers; checked below.
        let list: *mut *mut ibv_context =
            unsafe { libc::calloc(2, size_of::<*mut ibv_context>()) }.cast();
        if list.is_null() {
            return null_with("rdma_get_devices", libc::ENOMEM);
        }
        // SAFETY: `list` holds two pointers; the second stays NULL.
        unsafe { list.write(device.ibv) };
        if !num_devices.is_null() {
            // SAFETY: caller contract.
            unsafe { num_devices.write(1) };
        }
        list
    })
}

/// `rdma_free_devices`.
///
/// # Safety
/// `list` was returned by [`rdma_get_devices`] and is not used afterwards.
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    guard("rdma_free_devices", (), || {
        // SAFETY: caller contract: calloc'd by rdma_get_devices (free(NULL) is fine).
        unsafe { libc::free(list.cast()) };
    })
}

const EVENT_NAMES: [&std::ffi::CStr; CM_EVENT_LAST as usize + 1] = [
    c"RDMA_CM_EVENT_ADDR_RESOLVED",
    c"RDMA_CM_EVENT_ADDR_ERROR",
    c"RDMA_CM_EVENT_ROUTE_RESOLVED",
    c"RDMA_CM_EVENT_ROUTE_ERROR",
    c"RDMA_CM_EVENT_CONNECT_REQUEST",
    c"RDMA_CM_EVENT_CONNECT_RESPONSE",
    c"RDMA_CM_EVENT_CONNECT_ERROR",
    c"RDMA_CM_EVENT_UNREACHABLE",
    c"RDMA_CM_EVENT_REJECTED",
    c"RDMA_CM_EVENT_ESTABLISHED",
    c"RDMA_CM_EVENT_DISCONNECTED",
    c"RDMA_CM_EVENT_DEVICE_REMOVAL",
    c"RDMA_CM_EVENT_MULTICAST_JOIN",
    c"RDMA_CM_EVENT_MULTICAST_ERROR",
    c"RDMA_CM_EVENT_ADDR_CHANGE",
    c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
];

/// `rdma_event_str`: the event's name, as rdma-core spells it.
pub extern "C" fn rdma_event_str(event: c_int) -> *const c_char {
    usize::try_from(event)
        .ok()
        .and_then(|i| EVENT_NAMES.get(i))
        .map_or(c"UNKNOWN EVENT".as_ptr(), |name| name.as_ptr())
}

/// Reports `errno` the rdma_cm way: -1 with errno set.
pub(crate) fn fail(errno: c_int) -> c_int {
    set_errno(errno);
    -1
}

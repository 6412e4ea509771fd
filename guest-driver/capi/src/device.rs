//! Devices and contexts: `ibv_get_device_list`, `ibv_open_device`, `ibv_close_device`.
//!
//! The environment names at most one device, `vrdma0` (see [`crate::config`]). Listing it does
//! not contact the backend (for the PCI transport it checks that a vrdma function exists);
//! opening it connects the process transport or initialises the PCI device, and opens a
//! [`vrdma::Context`] over it.

use std::ffi::{c_char, c_int, c_void};
use std::path::Path;
use std::sync::{Arc, Once, OnceLock};

use log::{error, warn};
use vrdma::transport::pci::sysfs::{find_candidates, SYSFS_PCI};
use vrdma::transport::Transport;
use vrdma::Context;

use crate::async_events::AsyncEvents;
use crate::cm_events::router::CmRouter;
use crate::config::{self, TransportChoice};
use crate::context::VrdmaContext;
use crate::events::{CompletionRoutes, EventPump, EventSinks};
use crate::ffi::{guard, null_with, set_errno};
use crate::sys::{
    ibv_context, ibv_context_ops, ibv_device, ibv_node_type_IBV_NODE_CA,
    ibv_transport_type_IBV_TRANSPORT_IB, verbs_context,
};
use crate::transport::{AppTransport, PciOpenError};
use crate::{cq_ex, datapath, qp_ex, query_ex, srq, windows};

pub(crate) use vrdma::DEVICE_NAME;

/// The `ibv_device` handed out by `ibv_get_device_list`; lives as long as the process, as
/// devices of rdma-core do while a context refers to them. Laid out as rdma-core allocates
/// every device, inside a `struct verbs_device` (libibverbs/driver.h, rdma-core 34 to 56):
/// providers compare its `ops` with their own to tell their devices (`mlx5dv_is_supported`,
/// `efadv_query_device`), and this one is no provider's (null).
#[repr(C)]
struct Device {
    device: ibv_device,
    ops: *const c_void,
    refcount: c_int,
    entry: [*mut c_void; 2],
    sysfs: *mut c_void,
    core_support: u64,
}

// SAFETY: the device is written once, before it is shared, and only read afterwards.
unsafe impl Send for Device {}
// SAFETY: see Send.
unsafe impl Sync for Device {}

static DEVICE: OnceLock<Box<Device>> = OnceLock::new();
/// Node GUID as read by the first context (network byte order, as `ibv_get_device_guid`).
static NODE_GUID: OnceLock<u64> = OnceLock::new();

fn c_string<const N: usize>(text: &str) -> [c_char; N] {
    let mut out = [0; N];
    for (o, b) in out.iter_mut().zip(text.bytes().take(N - 1)) {
        *o = b as c_char;
    }
    out
}

pub(crate) fn device() -> *mut ibv_device {
    let device = DEVICE.get_or_init(|| {
        // SAFETY: an all-zero ibv_device (null ops, empty strings) is a valid value.
        let mut d: ibv_device = unsafe { std::mem::zeroed() };
        d.node_type = ibv_node_type_IBV_NODE_CA;
        d.transport_type = ibv_transport_type_IBV_TRANSPORT_IB;
        d.name = c_string(DEVICE_NAME);
        d.dev_name = c_string(DEVICE_NAME);
        d.ibdev_path = c_string(&format!("/sys/class/infiniband/{DEVICE_NAME}"));
        Box::new(Device {
            device: d,
            ops: std::ptr::null(),
            refcount: 1,
            entry: [std::ptr::null_mut(); 2],
            sysfs: std::ptr::null_mut(),
            core_support: 0,
        })
    });
    std::ptr::from_ref(&device.device).cast_mut()
}

pub(crate) fn init_logging() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let env = env_logger::Env::new().filter_or("VRDMA_LOG", "warn");
        let _ = env_logger::Builder::from_env(env).try_init();
    });
}

/// Whether the device `choice` names can be there, without opening it: a process-mode
/// backend is only contacted when opened; a PCI function must exist.
fn device_present(choice: &TransportChoice) -> Result<(), String> {
    match choice {
        TransportChoice::Process { .. } | TransportChoice::Agent { .. } => Ok(()),
        TransportChoice::Pci { address, .. } => {
            find_candidates(Path::new(SYSFS_PCI), address.as_deref())
                .map(drop)
                .map_err(|e| {
                    format!(
                        "{e} (set {}=/path/to/backend.sock for the process transport)",
                        config::SOCKET_VAR
                    )
                })
        }
    }
}

/// `ibv_get_device_list`: the vrdma device if the environment selects a transport whose
/// device can be there, else NULL with errno ENODEV and a line on stderr saying why.
///
/// # Safety
/// `num_devices` is NULL or valid for a write.
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    guard("ibv_get_device_list", std::ptr::null_mut(), || {
        init_logging();
        crate::fork::init_from_env();
        let listed = config::from_env()
            .map_err(|e| e.to_string())
            .and_then(|choice| device_present(&choice));
        if let Err(e) = listed {
            error!("vrdma: {e}");
            return null_with("ibv_get_device_list", libc::ENODEV);
        }
        // SAFETY: calloc of two pointers; checked for NULL below.
        let list: *mut *mut ibv_device =
            unsafe { libc::calloc(2, std::mem::size_of::<*mut ibv_device>()) }.cast();
        if list.is_null() {
            return null_with("ibv_get_device_list", libc::ENOMEM);
        }
        // SAFETY: `list` holds two pointers; the second stays NULL (terminator).
        unsafe { *list = device() };
        if !num_devices.is_null() {
            // SAFETY: caller contract.
            unsafe { *num_devices = 1 };
        }
        list
    })
}

/// `ibv_free_device_list`: frees the array (devices live on).
///
/// # Safety
/// `list` comes from [`ibv_get_device_list`] and is not used afterwards.
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    guard("ibv_free_device_list", (), || {
        // SAFETY: allocated with calloc by ibv_get_device_list (or NULL).
        unsafe { libc::free(list.cast()) }
    })
}

/// `ibv_get_device_name`.
///
/// # Safety
/// `device` is NULL or a device of this library.
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    guard("ibv_get_device_name", std::ptr::null(), || {
        if device.is_null() {
            return null_with::<c_char>("ibv_get_device_name", libc::EINVAL).cast_const();
        }
        // SAFETY: caller contract; the name is NUL terminated and lives with the device.
        unsafe { (*device).name.as_ptr() }
    })
}

/// `ibv_get_device_index` (IBVERBS_1.9): the kernel's index of the device, which `vrdma0` does
/// not have (it is not a kernel RDMA device): -1, as rdma-core returns for devices without one.
///
/// # Safety
/// Nothing is dereferenced.
pub unsafe extern "C" fn ibv_get_device_index(_device: *mut ibv_device) -> c_int {
    -1
}

/// `ibv_get_device_guid`: the node GUID (network byte order). Known from the first opened
/// context; before that, a short-lived context is opened to read it. 0 on failure.
///
/// # Safety
/// `device` is a device of this library.
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    guard("ibv_get_device_guid", 0, || {
        if device.is_null() {
            set_errno(libc::EINVAL);
            return 0;
        }
        if let Some(&guid) = NODE_GUID.get() {
            return guid;
        }
        match open_context() {
            Ok((ctx, _)) => node_guid(&ctx),
            Err(errno) => {
                set_errno(errno);
                0
            }
        }
    })
}

fn node_guid(ctx: &Context) -> u64 {
    *NODE_GUID.get_or_init(|| u64::from_ne_bytes(ctx.query_device().node_guid))
}

fn open_context() -> Result<(Context, Arc<AppTransport>), i32> {
    let unusable = |e: config::ConfigError| {
        error!("vrdma: {e}");
        libc::ENODEV
    };
    let transport = match config::from_env().map_err(unusable)? {
        TransportChoice::Process { socket, settings } => AppTransport::connect(&socket, settings)
            .map_err(|e| {
            error!(
                "vrdma: cannot connect to the vrdma backend at {}: {e}",
                socket.display()
            );
            libc::ENODEV
        })?,
        TransportChoice::Agent { socket } => AppTransport::connect_agent(&socket).map_err(|e| {
            error!(
                "vrdma: cannot reach the vrdma guest agent at {}: {e}",
                socket.display()
            );
            libc::ENODEV
        })?,
        TransportChoice::Pci {
            address,
            command_spin,
        } => AppTransport::open_pci(address.as_deref(), command_spin).map_err(|e| {
            error!(
                "vrdma: cannot open the vrdma PCI device (set {} to use a backend \
                     socket instead): {e}",
                config::SOCKET_VAR
            );
            match e {
                // Another driver has it (the agent, or another program): busy, not absent.
                PciOpenError::Function(vrdma::transport::pci::PciError::Busy(_)) => libc::EBUSY,
                _ => libc::ENODEV,
            }
        })?,
    };
    let transport = Arc::new(transport);
    let ctx = Context::open(transport.clone()).map_err(|e| {
        error!("vrdma: cannot open the device: {e}");
        crate::ffi::errno_of(&e)
    })?;
    Ok((ctx, transport))
}

/// The operations the static inline functions of `<infiniband/verbs.h>` call.
fn context_ops() -> ibv_context_ops {
    // SAFETY: all-None function pointers are a valid ibv_context_ops.
    let mut ops: ibv_context_ops = unsafe { std::mem::zeroed() };
    ops.poll_cq = Some(datapath::poll_cq);
    ops.req_notify_cq = Some(datapath::req_notify_cq);
    ops.post_send = Some(datapath::post_send);
    ops.post_recv = Some(datapath::post_recv);
    ops.post_srq_recv = Some(datapath::post_srq_recv);
    ops.alloc_mw = Some(windows::alloc_mw);
    ops.dealloc_mw = Some(windows::dealloc_mw);
    ops.bind_mw = Some(windows::bind_mw);
    ops
}

/// The extended operations of the context's `verbs_context`, which the static inline
/// `ibv_query_device_ex`, `ibv_query_port` and `ibv_create_cq_ex` of `<infiniband/verbs.h>`
/// call; the others stay NULL.
pub(crate) fn extended_ops() -> verbs_context {
    // SAFETY: all-None function pointers (and zero sizes) are a valid verbs_context.
    let mut verbs: verbs_context = unsafe { std::mem::zeroed() };
    verbs.query_device_ex = Some(query_ex::query_device_ex);
    verbs.query_port = Some(query_ex::query_port_ex);
    verbs.create_cq_ex = Some(cq_ex::create_cq_ex);
    verbs.create_qp_ex = Some(qp_ex::create_qp_ex);
    verbs.create_srq_ex = Some(srq::create_srq_ex);
    verbs
}

/// `ibv_open_device`.
///
/// # Safety
/// `device` is NULL or a device of this library.
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    guard("ibv_open_device", std::ptr::null_mut(), || {
        init_logging();
        if device.is_null() || device != self::device() {
            return null_with("ibv_open_device", libc::EINVAL);
        }
        let (ctx, transport) = match open_context() {
            Ok(opened) => opened,
            Err(errno) => return null_with("ibv_open_device", errno),
        };
        node_guid(&ctx);
        match context_over(device, ctx, transport) {
            Ok(context) => context,
            Err(errno) => null_with("ibv_open_device", errno),
        }
    })
}

/// A new `ibv_context` of `device` over the opened `ctx`, with its event thread running; an
/// errno value if the thread or the async event fd cannot be made. `device` is this library's
/// device.
pub(crate) fn context_over(
    device: *mut ibv_device,
    ctx: Context,
    transport: Arc<AppTransport>,
) -> Result<*mut ibv_context, c_int> {
    let errno = |e: std::io::Error| e.raw_os_error().unwrap_or(libc::EIO);
    match config::gid_cache_lifetime(|name| std::env::var_os(name)) {
        Ok(Some(lifetime)) => ctx.set_gid_cache_lifetime(lifetime),
        Ok(None) => {}
        Err(e) => warn!("vrdma: {e}; the default GID cache lifetime is used"),
    }
    let routes = Arc::new(CompletionRoutes::default());
    let async_events = Arc::new(AsyncEvents::new().map_err(|e| {
        error!("vrdma: cannot make the async event fd: {e}");
        errno(e)
    })?);
    let sinks = EventSinks {
        routes,
        async_events: async_events.clone(),
        cm: Arc::new(CmRouter::new(ctx.clone())),
    };
    let pump = EventPump::start(
        ctx.clone(),
        transport.clone() as Arc<dyn Transport>,
        sinks.clone(),
    )
    .map_err(|e| {
        error!("vrdma: cannot start the event thread: {e}");
        errno(e)
    })?;
    // SAFETY: all-zero is a valid ibv_context (its pthread mutex is then
    // PTHREAD_MUTEX_INITIALIZER on glibc); the fields that matter are set below.
    let mut ibv: ibv_context = unsafe { std::mem::zeroed() };
    ibv.device = device;
    ibv.ops = context_ops();
    ibv.async_fd = async_events.raw_fd();
    ibv.num_comp_vectors = crate::cq::COMP_VECTORS;
    // An extended context (`abi_compat`, the `verbs_context` in front): the inline `_ex`
    // helpers of `verbs.h` reach the extended verbs through it.
    Ok(VrdmaContext::into_raw(
        ibv,
        extended_ops(),
        ctx,
        transport,
        sinks,
        Some(pump),
    ))
}

/// `ibv_close_device`. Objects still open in the context are leaked. In a `fork()` child of the
/// process that opened it, only forgets the context: the device stays the parent's.
///
/// # Safety
/// `context` was returned by [`ibv_open_device`] and is not used afterwards.
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    guard("ibv_close_device", -1, || {
        // SAFETY: caller contract: a live context made by VrdmaContext::into_raw.
        let Some(mut context) = (unsafe { VrdmaContext::from_raw(context) }) else {
            return crate::ffi::minus_one(libc::EINVAL);
        };
        if context.in_forked_child() {
            // The event thread to stop and join exists only in the parent, and the device is
            // the parent's: this process only forgets the context.
            std::mem::forget(context);
            return 0;
        }
        context.pump.take();
        drop(context);
        0
    })
}

//! rdma-core's provider ABI (`IBVERBS_PRIVATE_34`): what provider libraries import from
//! libibverbs. Debian links them into programs directly (`libmlx5.so.1`, `libefa.so.1`: UCX's
//! modules, libfabric, pyverbs, perftest) and loads the `libibverbs/*-rdmav34.so` plugins, all
//! bound at load (`BIND_NOW`), so each of these names must exist for them to load over the
//! drop-in at all.
//!
//! What a provider gets here: its constructor registers its driver
//! ([`verbs_register_driver_34`]), which matches nothing, since the drop-in's one device is
//! not a kernel device a provider could drive; so no provider ever makes a context, and the
//! command helpers a provider calls from its contexts (`ibv_cmd_*`, `execute_ioctl`, the
//! context set-up) are never reached: they fail with `EOPNOTSUPP` should anything call them
//! anyway. The device is a `struct verbs_device` whose `ops` is no provider's, so probes such
//! as `mlx5dv_is_supported` answer "not this device" ([`crate::device`]).
//!
//! The `ibv_cmd_*` helpers are declared without their parameters (none is read; a caller's
//! arguments in registers are simply ignored, as the SysV x86-64 convention allows); each
//! returns what rdma-core's returns on failure: the errno value, or -1 with `errno` for
//! `ibv_cmd_poll_cq`.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use log::debug;

use crate::ffi::set_errno;
use crate::sys::{ibv_context, ibv_device};

// `bool verbs_allow_disassociate_destroy`: whether destroys may succeed on a disassociated
// device (rdma-core sets it for its own tests). False: the drop-in has no disassociation.
std::arch::global_asm!(
    ".pushsection .data.verbs_allow_disassociate_destroy,\"aw\",@progbits",
    ".globl verbs_allow_disassociate_destroy",
    ".type verbs_allow_disassociate_destroy, @object",
    ".size verbs_allow_disassociate_destroy, 1",
    "verbs_allow_disassociate_destroy:",
    ".byte 0",
    ".popsection",
);

/// The data symbols defined above (the functions are in `crate::export`).
#[cfg(test)]
pub(crate) const EXPORTED_DATA: &[&str] = &["verbs_allow_disassociate_destroy"];

/// The start of `struct verbs_device_ops`: its name comes first.
#[repr(C)]
struct VerbsDeviceOps {
    name: *const c_char,
}

/// `verbs_register_driver_34`: a provider's constructor registers its driver. Nothing here
/// matches a provider (the one device is vrdma's), so it is only noted.
///
/// # Safety
/// `ops` is null or a provider's `struct verbs_device_ops`, whose name is a C string.
pub unsafe extern "C" fn verbs_register_driver_34(ops: *const c_void) {
    let ops = ops.cast::<VerbsDeviceOps>();
    // SAFETY: the caller's contract.
    let name = unsafe { ops.as_ref() }
        .filter(|ops| !ops.name.is_null())
        .map(|ops| {
            // SAFETY: a provider's name is a static C string.
            unsafe { CStr::from_ptr(ops.name) }
                .to_string_lossy()
                .into_owned()
        });
    debug!(
        "provider {} registered; it drives no vrdma device",
        name.as_deref().unwrap_or("(unnamed)")
    );
}

/// `verbs_open_device(device, private_data)`: what `ibv_open_device` is made of in rdma-core;
/// a provider's own open call (`mlx5dv_open_device`) reaches it only for its devices. For the
/// drop-in's device it is `ibv_open_device` (private data is a provider's, and none serves it).
///
/// # Safety
/// As `ibv_open_device`.
pub unsafe extern "C" fn verbs_open_device(
    device: *mut ibv_device,
    _private_data: *mut c_void,
) -> *mut ibv_context {
    // SAFETY: the caller's contract.
    unsafe { crate::device::ibv_open_device(device) }
}

/// `_verbs_init_and_alloc_context`: a provider making a context. None is made here: NULL,
/// errno EOPNOTSUPP.
///
/// # Safety
/// Nothing is dereferenced.
pub unsafe extern "C" fn _verbs_init_and_alloc_context() -> *mut c_void {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `verbs_uninit_context`, `verbs_set_ops`: a provider's context set-up; nothing to undo or
/// set, as no provider context exists.
///
/// # Safety
/// Nothing is dereferenced.
pub unsafe extern "C" fn verbs_uninit_context() {}

/// See [`verbs_uninit_context`].
///
/// # Safety
/// Nothing is dereferenced.
pub unsafe extern "C" fn verbs_set_ops() {}

/// `__verbs_log(ctx, fmt, ...)`: a provider's debug log, which only its contexts write.
///
/// # Safety
/// Nothing is dereferenced.
pub unsafe extern "C" fn __verbs_log() {}

/// `__ioctl_final_num_attrs(num_attrs, link)`: sizing a provider's ioctl command buffer, which
/// no provider builds here; the attributes it was given.
///
/// # Safety
/// Nothing is dereferenced.
pub unsafe extern "C" fn __ioctl_final_num_attrs(num_attrs: c_uint, _link: *mut c_void) -> c_uint {
    num_attrs
}

/// `ibv_read_ibdev_sysfs_file(buf, size, device, fmt, ...)`: the drop-in's device has no
/// kernel device, so no sysfs file: -1, errno ENOENT.
///
/// # Safety
/// Nothing is dereferenced.
pub unsafe extern "C" fn ibv_read_ibdev_sysfs_file() -> c_int {
    set_errno(libc::ENOENT);
    -1
}

/// `ibv_cmd_poll_cq`: -1, errno EOPNOTSUPP.
///
/// # Safety
/// Nothing is dereferenced.
pub unsafe extern "C" fn ibv_cmd_poll_cq() -> c_int {
    set_errno(libc::EOPNOTSUPP);
    -1
}

/// Defines each command helper a provider's context calls: EOPNOTSUPP (the errno value).
macro_rules! refused_commands {
    ($($name:ident),* $(,)?) => {
        $(
            #[doc = concat!("`", stringify!($name), "`: EOPNOTSUPP (no provider context exists).")]
            ///
            /// # Safety
            /// Nothing is dereferenced.
            pub unsafe extern "C" fn $name() -> c_int {
                libc::EOPNOTSUPP
            }
        )*
    };
}

refused_commands!(
    execute_ioctl,
    verbs_init_cq,
    ibv_cmd_advise_mr,
    ibv_cmd_alloc_dm,
    ibv_cmd_alloc_mw,
    ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast,
    ibv_cmd_close_xrcd,
    ibv_cmd_create_ah,
    ibv_cmd_create_counters,
    ibv_cmd_create_cq,
    ibv_cmd_create_cq_ex,
    ibv_cmd_create_cq_ex2,
    ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp,
    ibv_cmd_create_qp,
    ibv_cmd_create_qp_ex,
    ibv_cmd_create_qp_ex2,
    ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex,
    ibv_cmd_create_wq,
    ibv_cmd_dealloc_mw,
    ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr,
    ibv_cmd_destroy_ah,
    ibv_cmd_destroy_counters,
    ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow,
    ibv_cmd_destroy_flow_action,
    ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table,
    ibv_cmd_destroy_srq,
    ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast,
    ibv_cmd_free_dm,
    ibv_cmd_get_context,
    ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp,
    ibv_cmd_modify_qp,
    ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq,
    ibv_cmd_modify_wq,
    ibv_cmd_open_qp,
    ibv_cmd_open_xrcd,
    ibv_cmd_post_recv,
    ibv_cmd_post_send,
    ibv_cmd_post_srq_recv,
    ibv_cmd_query_context,
    ibv_cmd_query_device_any,
    ibv_cmd_query_mr,
    ibv_cmd_query_port,
    ibv_cmd_query_qp,
    ibv_cmd_query_srq,
    ibv_cmd_read_counters,
    ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr,
    ibv_cmd_reg_mr,
    ibv_cmd_req_notify_cq,
    ibv_cmd_rereg_mr,
    ibv_cmd_resize_cq,
);

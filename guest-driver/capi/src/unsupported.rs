//! Entry points applications import that vrdma does not provide yet. Each returns what its
//! manual page documents for a failure, with EOPNOTSUPP, so applications can fall back or
//! report it.

use std::ffi::{c_int, c_void};

use crate::ffi::{guard, null_with};
use crate::sys::{ibv_context, ibv_gid, ibv_mr, ibv_pd, ibv_qp};

/// `ibv_attach_mcast`: EOPNOTSUPP (returns the errno value).
///
/// # Safety
/// Nothing is dereferenced.
pub unsafe extern "C" fn ibv_attach_mcast(
    _qp: *mut ibv_qp,
    _gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    libc::EOPNOTSUPP
}

/// `ibv_detach_mcast`: EOPNOTSUPP (returns the errno value).
///
/// # Safety
/// Nothing is dereferenced.
pub unsafe extern "C" fn ibv_detach_mcast(
    _qp: *mut ibv_qp,
    _gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    libc::EOPNOTSUPP
}

/// `ibv_reg_dmabuf_mr`: NULL, errno EOPNOTSUPP.
///
/// # Safety
/// Nothing is dereferenced.
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    _pd: *mut ibv_pd,
    _offset: u64,
    _length: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut ibv_mr {
    guard("ibv_reg_dmabuf_mr", std::ptr::null_mut(), || {
        null_with("ibv_reg_dmabuf_mr", libc::EOPNOTSUPP)
    })
}

/// `ibv_query_ece` (IBVERBS_1.10): EOPNOTSUPP (returns the errno value), as rdma-core does
/// for devices without Enhanced Connection Establishment.
///
/// # Safety
/// Nothing is dereferenced.
pub unsafe extern "C" fn ibv_query_ece(_qp: *mut ibv_qp, _ece: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

/// `ibv_set_ece` (IBVERBS_1.10): EOPNOTSUPP (returns the errno value), see `ibv_query_ece`.
///
/// # Safety
/// Nothing is dereferenced.
pub unsafe extern "C" fn ibv_set_ece(_qp: *mut ibv_qp, _ece: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

/// `ibv_import_device` (IBVERBS_1.10): NULL, errno EOPNOTSUPP. A vrdma context lives in the
/// process that opened it (its rings are mapped there); there is no command fd to share.
///
/// # Safety
/// Nothing is dereferenced.
pub unsafe extern "C" fn ibv_import_device(_cmd_fd: c_int) -> *mut ibv_context {
    guard("ibv_import_device", std::ptr::null_mut(), || {
        null_with("ibv_import_device", libc::EOPNOTSUPP)
    })
}

/// `ibv_import_pd` (IBVERBS_1.10): NULL, errno EOPNOTSUPP (no context is ever imported).
///
/// # Safety
/// Nothing is dereferenced.
pub unsafe extern "C" fn ibv_import_pd(_context: *mut ibv_context, _handle: u32) -> *mut ibv_pd {
    guard("ibv_import_pd", std::ptr::null_mut(), || {
        null_with("ibv_import_pd", libc::EOPNOTSUPP)
    })
}

/// `ibv_import_mr` (IBVERBS_1.10): NULL, errno EOPNOTSUPP.
///
/// # Safety
/// Nothing is dereferenced.
pub unsafe extern "C" fn ibv_import_mr(_pd: *mut ibv_pd, _handle: u32) -> *mut ibv_mr {
    guard("ibv_import_mr", std::ptr::null_mut(), || {
        null_with("ibv_import_mr", libc::EOPNOTSUPP)
    })
}

/// `ibv_import_dm` (IBVERBS_1.13): NULL, errno EOPNOTSUPP (vrdma has no device memory).
///
/// # Safety
/// Nothing is dereferenced.
pub unsafe extern "C" fn ibv_import_dm(_context: *mut ibv_context, _handle: u32) -> *mut c_void {
    guard("ibv_import_dm", std::ptr::null_mut(), || {
        null_with("ibv_import_dm", libc::EOPNOTSUPP)
    })
}

/// `ibv_unimport_pd` (IBVERBS_1.10): nothing to release, since no PD is ever imported (as
/// rdma-core's default for providers without import).
///
/// # Safety
/// Nothing is dereferenced.
pub unsafe extern "C" fn ibv_unimport_pd(_pd: *mut ibv_pd) {}

/// `ibv_unimport_mr` (IBVERBS_1.10): nothing to release, see `ibv_unimport_pd`.
///
/// # Safety
/// Nothing is dereferenced.
pub unsafe extern "C" fn ibv_unimport_mr(_mr: *mut ibv_mr) {}

/// `ibv_unimport_dm` (IBVERBS_1.13): nothing to release, see `ibv_unimport_pd`.
///
/// # Safety
/// Nothing is dereferenced.
pub unsafe extern "C" fn ibv_unimport_dm(_dm: *mut c_void) {}

/// `ibv_query_qp_data_in_order` (IBVERBS_1.14): 0, "no in-order guarantee", which is what
/// rdma-core answers for a provider that does not report one (rxe does not).
///
/// # Safety
/// Nothing is dereferenced.
pub unsafe extern "C" fn ibv_query_qp_data_in_order(
    _qp: *mut ibv_qp,
    _op: u32,
    _flags: u32,
) -> c_int {
    0
}

//! Entry points applications import that vrdma does not provide yet. Each returns what its
//! manual page documents for a failure, with EOPNOTSUPP, so applications can fall back or
//! report it.

use std::ffi::{c_int, c_void};

use crate::ffi::{guard, null_with};
use crate::sys::{ibv_gid, ibv_mr, ibv_pd, ibv_qp};

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

/// `ibv_qp_to_qp_ex`: NULL, errno EOPNOTSUPP: no QP is created through `ibv_create_qp_ex`
/// (the context is not an extended one), which is when rdma-core returns NULL too.
///
/// # Safety
/// Nothing is dereferenced.
pub unsafe extern "C" fn ibv_qp_to_qp_ex(_qp: *mut ibv_qp) -> *mut c_void {
    guard("ibv_qp_to_qp_ex", std::ptr::null_mut(), || {
        null_with("ibv_qp_to_qp_ex", libc::EOPNOTSUPP)
    })
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

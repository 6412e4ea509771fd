//! What this library does not provide, failing the way a caller can handle:
//! - multicast joins (`EOPNOTSUPP`): spec §7.5 has no join command (rxe joins IPv4 groups
//!   only, and a group would be shared by every QP attached on the host device);
//! - ECE (`EOPNOTSUPP`, as the drop-in libibverbs' `ibv_query_ece`), with `rdma_reject_ece`
//!   a plain reject.
//!
//! rsockets are in `crate::rsocket`.

use std::ffi::{c_int, c_void};

use super::device::fail;
use crate::sys::rdma_cm_id;

/// `rdma_join_multicast`: `EOPNOTSUPP`.
pub extern "C" fn rdma_join_multicast(
    _id: *mut rdma_cm_id,
    _addr: *mut c_void,
    _context: *mut c_void,
) -> c_int {
    fail(libc::EOPNOTSUPP)
}

/// `rdma_join_multicast_ex`: `EOPNOTSUPP`.
pub extern "C" fn rdma_join_multicast_ex(
    _id: *mut rdma_cm_id,
    _attr: *mut c_void,
    _context: *mut c_void,
) -> c_int {
    fail(libc::EOPNOTSUPP)
}

/// `rdma_leave_multicast`: `EOPNOTSUPP` (nothing was joined).
pub extern "C" fn rdma_leave_multicast(_id: *mut rdma_cm_id, _addr: *mut c_void) -> c_int {
    fail(libc::EOPNOTSUPP)
}

/// `rdma_set_local_ece`: `EOPNOTSUPP`.
pub extern "C" fn rdma_set_local_ece(_id: *mut rdma_cm_id, _ece: *mut c_void) -> c_int {
    fail(libc::EOPNOTSUPP)
}

/// `rdma_get_remote_ece`: `EOPNOTSUPP`.
pub extern "C" fn rdma_get_remote_ece(_id: *mut rdma_cm_id, _ece: *mut c_void) -> c_int {
    fail(libc::EOPNOTSUPP)
}

/// `rdma_reject_ece`: a reject (the ECE reason is not on the wire).
///
/// # Safety
/// As `rdma_reject`.
pub unsafe extern "C" fn rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    len: u8,
) -> c_int {
    // SAFETY: caller contract.
    unsafe { super::id::rdma_reject(id, private_data, len) }
}

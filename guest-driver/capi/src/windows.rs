//! Memory windows behind `ibv_context_ops`: what the static inline `ibv_alloc_mw`,
//! `ibv_dealloc_mw` and `ibv_bind_mw` of `<infiniband/verbs.h>` call. Type-2 binds and
//! invalidations are `ibv_post_send` requests (`datapath.rs`).
//!
//! As rdma-core's rxe provider: `ibv_bind_mw` posts a BIND_MW request under
//! `ibv_inc_rkey(mw->rkey)` and stores that key in `mw->rkey` only once the request is posted;
//! for a type-2 bind posted with `ibv_post_send` the application keeps `mw->rkey` itself.

use std::ffi::c_int;
use std::sync::atomic::Ordering;

use vrdma::provider::{inc_rkey, MwBind, SendFlags};
use vrdma::spec::features::VRDMA_F_MW;
use vrdma::verbs::{AccessFlags, MwType, PostError, PostSendError};
use vrdma::Mw;

use crate::ffi::{guard, null_with, report};
use crate::objects::VrdmaPd;
use crate::qp::VrdmaQp;
use crate::sys::{ibv_mw, ibv_mw_bind, ibv_mw_bind_info, ibv_mw_type, ibv_pd, ibv_qp};

/// A memory window: `ibv_mw` first.
#[repr(C)]
struct VrdmaMw {
    ibv: ibv_mw,
    mw: Mw,
}

/// The provider's bind for `info` on the window whose current key is `mw_rkey`, moving it
/// to `rkey`; an errno value if the bind cannot be expressed.
///
/// # Safety
/// `info.mr` is NULL or a live `ibv_mr`.
pub(crate) unsafe fn bind_of(
    info: &ibv_mw_bind_info,
    mw_rkey: u32,
    rkey: u32,
) -> Result<MwBind, c_int> {
    // SAFETY: caller contract.
    let mr_lkey = match unsafe { info.mr.cast_const().as_ref() } {
        Some(mr) => mr.lkey,
        None if info.length == 0 && info.addr == 0 => 0,
        None => return Err(libc::EINVAL),
    };
    let access = AccessFlags::from_bits_retain(info.mw_access_flags);
    if access.bits() & !AccessFlags::MW_ALLOWED.bits() != 0 {
        return Err(libc::EINVAL);
    }
    Ok(MwBind {
        mw_rkey,
        rkey,
        mr_lkey,
        addr: info.addr,
        length: info.length,
        access,
    })
}

/// `ops.alloc_mw`: a window of `mw_type` (1 or 2), or NULL with errno set.
///
/// # Safety
/// `pd` is a PD of this library.
pub(crate) unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, mw_type: ibv_mw_type) -> *mut ibv_mw {
    guard("ibv_alloc_mw", std::ptr::null_mut(), || {
        // SAFETY: caller contract.
        let Some(vpd) = (unsafe { VrdmaPd::from_ptr(pd) }) else {
            return null_with("ibv_alloc_mw", libc::EINVAL);
        };
        let Ok(kind) = MwType::try_from(mw_type) else {
            return null_with("ibv_alloc_mw", libc::EINVAL);
        };
        // As `ibv_alloc_mw` of a provider without windows.
        if vpd.context().ctx.features() & VRDMA_F_MW == 0 {
            return null_with("ibv_alloc_mw", libc::EOPNOTSUPP);
        }
        match vpd.pd.alloc_mw(kind) {
            Ok(mw) => {
                let ibv = ibv_mw {
                    context: vpd.ibv.context,
                    pd,
                    rkey: mw.rkey(),
                    handle: mw.handle(),
                    type_: mw_type,
                };
                vpd.users.fetch_add(1, Ordering::AcqRel);
                Box::into_raw(Box::new(VrdmaMw { ibv, mw })).cast()
            }
            Err(e) => null_with("ibv_alloc_mw", report("ibv_alloc_mw", &e)),
        }
    })
}

/// `ops.dealloc_mw`: 0 (the window is freed whether or not it is bound).
///
/// # Safety
/// `mw` is a window of this library, not used afterwards.
pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    guard("ibv_dealloc_mw", libc::EIO, || {
        if mw.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: made by Box::into_raw in alloc_mw; the caller gives it up.
        let vmw = unsafe { Box::from_raw(mw.cast::<VrdmaMw>()) };
        let pd = vmw.ibv.pd;
        // DEALLOC_MW (a failure is logged: the device frees it with the context at the latest).
        drop(vmw);
        // SAFETY: the window's PD outlives it (ibv_dealloc_pd is EBUSY until now).
        if let Some(vpd) = unsafe { VrdmaPd::from_ptr(pd) } {
            vpd.users.fetch_sub(1, Ordering::AcqRel);
        }
        0
    })
}

/// `ops.bind_mw`: binds a type-1 window (the inline `ibv_bind_mw` checked the type and the
/// MR's PD); 0 or an errno value.
///
/// # Safety
/// `qp` is a QP and `mw` a window of this library; `mw_bind` is valid and its MR NULL or live.
pub(crate) unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    mw_bind: *mut ibv_mw_bind,
) -> c_int {
    guard("ibv_bind_mw", libc::EIO, || {
        // SAFETY: caller contract.
        let (Some(vqp), Some(vmw), Some(request)) = (unsafe {
            (
                VrdmaQp::from_ptr(qp),
                mw.cast::<VrdmaMw>().as_mut(),
                mw_bind.cast_const().as_ref(),
            )
        }) else {
            return libc::EINVAL;
        };
        let Some(flags) = SendFlags::from_bits(request.send_flags) else {
            return libc::EINVAL;
        };
        // The application's view of the key is the one the window is bound under.
        let current = vmw.ibv.rkey;
        vmw.mw.set_rkey(current);
        // SAFETY: caller contract: the MR is NULL or live.
        let bind = match unsafe { bind_of(&request.bind_info, current, inc_rkey(current)) } {
            Ok(bind) => bind,
            Err(errno) => return errno,
        };
        match vqp.qp.bind_mw(&vmw.mw, request.wr_id, flags, bind) {
            Ok(rkey) => {
                vmw.ibv.rkey = rkey;
                0
            }
            Err(PostSendError::Refused {
                error: PostError::QueueFull,
                ..
            }) => libc::ENOMEM,
            Err(PostSendError::Refused { .. }) => libc::EINVAL,
            Err(e @ PostSendError::Doorbell { .. }) => {
                log::warn!("vrdma: ibv_bind_mw: {e}");
                libc::EIO
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::ibv_mr;

    /// The `ibv_mr` of a bind.
    fn mr_with_lkey(lkey: u32) -> ibv_mr {
        // SAFETY: an all-zero ibv_mr (NULL pointers, zero numbers) is a valid value.
        let mut mr: ibv_mr = unsafe { std::mem::zeroed() };
        mr.lkey = lkey;
        mr
    }

    #[test]
    fn binds_translate_and_unbinds_need_no_mr() {
        let mut mr = mr_with_lkey(0x3300);
        let info = ibv_mw_bind_info {
            mr: &mut mr,
            addr: 0x7000,
            length: 64,
            mw_access_flags: (AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE).bits(),
        };
        // SAFETY: `info.mr` is live.
        let bind = unsafe { bind_of(&info, 0x4200, 0x4201) }.unwrap();
        assert_eq!((bind.mr_lkey, bind.addr, bind.length), (0x3300, 0x7000, 64));
        assert_eq!(
            (bind.mw_rkey, bind.rkey, bind.access.bits()),
            (0x4200, 0x4201, 0x6)
        );
        let unbind = ibv_mw_bind_info {
            mr: std::ptr::null_mut(),
            addr: 0,
            length: 0,
            mw_access_flags: 0,
        };
        // SAFETY: no MR.
        assert_eq!(unsafe { bind_of(&unbind, 1, 2) }.unwrap().mr_lkey, 0);
        let no_mr = ibv_mw_bind_info {
            length: 8,
            ..unbind
        };
        // SAFETY: no MR.
        assert_eq!(unsafe { bind_of(&no_mr, 1, 2) }, Err(libc::EINVAL));
        let mw_bind_access = ibv_mw_bind_info {
            mw_access_flags: AccessFlags::MW_BIND.bits(),
            ..info
        };
        // SAFETY: `info.mr` is live.
        assert_eq!(unsafe { bind_of(&mw_bind_access, 1, 2) }, Err(libc::EINVAL));
    }
}

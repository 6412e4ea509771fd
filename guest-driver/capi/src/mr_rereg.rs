//! `ibv_rereg_mr`: rdma-core's input checks and return codes over `Mr::rereg` and
//! `Mr::rereg_translation`, with the `ibv_mr` fields (pd, addr, length, lkey, rkey) updated on
//! success.

use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;

use vrdma::verbs::{AccessFlags, MrChange};

use crate::ffi::{guard, report, set_errno};
use crate::fork;
use crate::objects::{mr_access, VrdmaMr, VrdmaPd};
use crate::sys::{ibv_mr, ibv_pd};

/// `IBV_REREG_MR_CHANGE_TRANSLATION`.
const CHANGE_TRANSLATION: c_int = 1 << 0;
/// `IBV_REREG_MR_CHANGE_PD`.
const CHANGE_PD: c_int = 1 << 1;
/// `IBV_REREG_MR_CHANGE_ACCESS`.
const CHANGE_ACCESS: c_int = 1 << 2;
/// `IBV_REREG_MR_FLAGS_SUPPORTED`.
const FLAGS_SUPPORTED: c_int = CHANGE_TRANSLATION | CHANGE_PD | CHANGE_ACCESS;

/// `enum ibv_rereg_mr_err_code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
enum ReregError {
    /// The old MR is valid; invalid input.
    Input = -1,
    /// The old MR is valid; the new range could not be prepared (rdma-core: its
    /// `ibv_dontfork_range`; vrdma: making it registrable).
    DontForkNew = -2,
    /// The command failed. rdma-core says the MR should not be used; with vrdma the old MR is
    /// in fact unchanged (a failed REREG_MR has no effect), but callers follow rdma-core.
    Cmd = -4,
}

/// What a call asks for, checked as rdma-core checks it before calling the provider.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    pd: bool,
    access: Option<AccessFlags>,
    translation: Option<(usize, usize)>,
}

fn check_request(
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> Result<Request, ReregError> {
    if flags & !FLAGS_SUPPORTED != 0 || flags == 0 {
        // rdma-core hands flags 0 to the kernel, which refuses it; nothing would change.
        return Err(ReregError::Input);
    }
    if flags & CHANGE_TRANSLATION != 0 && (length == 0 || addr.is_null()) {
        return Err(ReregError::Input);
    }
    if access != 0 && flags & CHANGE_ACCESS == 0 {
        return Err(ReregError::Input);
    }
    if flags & CHANGE_PD != 0 && pd.is_null() {
        return Err(ReregError::Input);
    }
    let access = if flags & CHANGE_ACCESS != 0 {
        // The flags are a bit set: C's int-to-unsigned conversion keeps every bit.
        Some(mr_access(access as u32).ok_or(ReregError::Input)?)
    } else {
        None
    };
    Ok(Request {
        pd: flags & CHANGE_PD != 0,
        access,
        translation: (flags & CHANGE_TRANSLATION != 0).then_some((addr as usize, length)),
    })
}

/// `ibv_rereg_mr` (IBVERBS_1.1): 0, or an `enum ibv_rereg_mr_err_code` value with errno set.
/// The MR keeps its `ibv_mr` (and handle); with a new translation its `addr` is also its
/// iova, as for `ibv_reg_mr`.
///
/// # Safety
/// `mr` is a region of this library; `pd`, with `IBV_REREG_MR_CHANGE_PD`, a PD of its
/// context; with `IBV_REREG_MR_CHANGE_TRANSLATION`, `[addr, addr + length)` is memory of
/// this process that stays mapped while the region is registered.
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    guard("ibv_rereg_mr", ReregError::Cmd as c_int, || {
        let fail = |code: ReregError, errno: i32| {
            set_errno(errno);
            code as c_int
        };
        // SAFETY: caller contract; `ibv` is the first field of the repr(C) VrdmaMr.
        let Some(vmr) = (unsafe { mr.cast::<VrdmaMr>().as_mut() }) else {
            return fail(ReregError::Input, libc::EINVAL);
        };
        let request = match check_request(flags, pd, addr, length, access) {
            Ok(request) => request,
            Err(code) => return fail(code, libc::EINVAL),
        };
        let new_pd = if request.pd {
            // SAFETY: caller contract.
            let Some(new_pd) = (unsafe { VrdmaPd::from_ptr(pd) }) else {
                return fail(ReregError::Input, libc::EINVAL);
            };
            if new_pd.ibv.context != vmr.ibv.context {
                return fail(ReregError::Input, libc::EINVAL);
            }
            Some(new_pd)
        } else {
            None
        };
        let change = MrChange {
            pd: new_pd.map(|p| &p.pd),
            access: request.access,
        };
        let result = match request.translation {
            Some((start, len)) => {
                // SAFETY: the old PD outlives its regions (ibv_dealloc_pd refuses while they
                // exist), and its context outlives it.
                let Some(old_pd) = (unsafe { VrdmaPd::from_ptr(vmr.ibv.pd) }) else {
                    return fail(ReregError::Input, libc::EINVAL);
                };
                if let Err(e) = old_pd
                    .context()
                    .transport
                    .memory()
                    .make_registrable(start, len)
                {
                    log::warn!("vrdma: ibv_rereg_mr of {len:#x} bytes at {start:#x}: {e}");
                    return fail(ReregError::DontForkNew, e.errno());
                }
                // As rdma-core: the new range is fork-protected before the command (after the
                // re-backing, whose new mappings would not carry earlier advice).
                if let Err(e) = fork::dont_fork(start, len) {
                    log::warn!("vrdma: ibv_rereg_mr: MADV_DONTFORK of {len:#x} bytes: {e}");
                    return fail(
                        ReregError::DontForkNew,
                        e.raw_os_error().unwrap_or(libc::EINVAL),
                    );
                }
                // SAFETY: the caller keeps the memory mapped while the region lives; it is
                // guest RAM now (checked again by the translation inside).
                unsafe { vmr.mr.rereg_translation(change, start as *const u8, len) }
            }
            None => vmr.mr.rereg(change),
        };
        if let Err(e) = result {
            let errno = report("ibv_rereg_mr", &e);
            if let Some((start, len)) = request.translation {
                fork::do_fork(start, len);
            }
            return fail(ReregError::Cmd, errno);
        }
        if request.translation.is_some() {
            // The old range is no longer registered through this MR.
            fork::do_fork(vmr.ibv.addr as usize, vmr.ibv.length as usize);
        }
        if let Some(new_pd) = new_pd {
            new_pd.users.fetch_add(1, Ordering::AcqRel);
            // SAFETY: as above, the old PD is live while the region is.
            if let Some(old_pd) = unsafe { VrdmaPd::from_ptr(vmr.ibv.pd) } {
                old_pd.users.fetch_sub(1, Ordering::AcqRel);
            }
            vmr.ibv.pd = pd;
        }
        if let Some((start, len)) = request.translation {
            vmr.ibv.addr = start as *mut c_void;
            vmr.ibv.length = len as crate::sys::size_t;
        }
        vmr.ibv.lkey = vmr.mr.lkey();
        vmr.ibv.rkey = vmr.mr.rkey();
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(
        flags: c_int,
        pd: bool,
        addr: usize,
        length: usize,
        access: c_int,
    ) -> Result<Request, ReregError> {
        let pd = if pd {
            std::ptr::dangling_mut::<ibv_pd>()
        } else {
            std::ptr::null_mut()
        };
        check_request(flags, pd, addr as *mut c_void, length, access)
    }

    #[test]
    fn inputs_are_checked_as_rdma_core_checks_them() {
        assert_eq!(check(0, false, 0, 0, 0), Err(ReregError::Input));
        assert_eq!(check(1 << 3, false, 0, 0, 0), Err(ReregError::Input));
        // A translation needs an address and a length.
        assert_eq!(
            check(CHANGE_TRANSLATION, false, 0, 64, 0),
            Err(ReregError::Input)
        );
        assert_eq!(
            check(CHANGE_TRANSLATION, false, 0x1000, 0, 0),
            Err(ReregError::Input)
        );
        // Access flags only with CHANGE_ACCESS, and valid ones.
        assert_eq!(check(CHANGE_PD, true, 0, 0, 1), Err(ReregError::Input));
        // IBV_ACCESS_ZERO_BASED: not an MR's access.
        assert_eq!(
            check(CHANGE_ACCESS, false, 0, 0, 0x20),
            Err(ReregError::Input)
        );
        assert_eq!(check(CHANGE_PD, false, 0, 0, 0), Err(ReregError::Input));
        assert_eq!(
            check(FLAGS_SUPPORTED, true, 0x1000, 64, 0x7),
            Ok(Request {
                pd: true,
                access: Some(
                    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
                ),
                translation: Some((0x1000, 64)),
            })
        );
        // Optional access bits vrdma does not carry are dropped, as in ibv_reg_mr.
        assert_eq!(
            check(CHANGE_ACCESS, false, 0, 0, 1 | (1 << 21))
                .unwrap()
                .access,
            Some(AccessFlags::LOCAL_WRITE)
        );
        assert_eq!(
            check(CHANGE_PD, true, 0, 0, 0),
            Ok(Request {
                pd: true,
                access: None,
                translation: None,
            })
        );
    }

    #[test]
    fn error_codes_are_rdma_cores() {
        assert_eq!(ReregError::Input as i32, -1);
        assert_eq!(ReregError::DontForkNew as i32, -2);
        assert_eq!(ReregError::Cmd as i32, -4);
    }
}

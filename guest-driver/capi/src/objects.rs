//! Protection domains, memory regions and address handles.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};

use vrdma::verbs::{AccessFlags, AhAttr, Gid, GlobalRoute};
use vrdma::{Ah, Mr, Pd};

use crate::context::VrdmaContext;
use crate::ffi::{guard, null_with, report};
use crate::fork;
use crate::sys::{ibv_ah, ibv_ah_attr, ibv_context, ibv_mr, ibv_pd};

/// `IBV_ACCESS_OPTIONAL_RANGE`: flags a library may ignore when it does not support them.
const ACCESS_OPTIONAL_RANGE: u32 = 0x3ff0_0000;

/// A protection domain: `ibv_pd` first.
#[repr(C)]
pub(crate) struct VrdmaPd {
    pub(crate) ibv: ibv_pd,
    pub(crate) pd: Pd,
    /// MRs, QPs, SRQs and AHs created in the PD and not destroyed yet.
    pub(crate) users: AtomicU32,
}

impl VrdmaPd {
    /// # Safety
    /// `ptr` is NULL or a live PD of this library.
    pub(crate) unsafe fn from_ptr<'a>(ptr: *mut ibv_pd) -> Option<&'a VrdmaPd> {
        // SAFETY: caller contract; `ibv` is the first field of a repr(C) struct.
        unsafe { ptr.cast::<VrdmaPd>().as_ref() }
    }

    /// The context the PD belongs to.
    pub(crate) fn context(&self) -> &VrdmaContext {
        // SAFETY: set at allocation to the live context, which outlives its PDs.
        unsafe { VrdmaContext::of(self.ibv.context) }
    }
}

/// `ibv_alloc_pd`.
///
/// # Safety
/// `context` is a context of this library.
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    guard("ibv_alloc_pd", std::ptr::null_mut(), || {
        // SAFETY: caller contract.
        let Some(ctx) = (unsafe { VrdmaContext::from_ptr(context) }) else {
            return null_with("ibv_alloc_pd", libc::EINVAL);
        };
        match ctx.ctx.alloc_pd() {
            Ok(pd) => {
                let ibv = ibv_pd {
                    context,
                    handle: pd.handle(),
                };
                let pd = Box::new(VrdmaPd {
                    ibv,
                    pd,
                    users: AtomicU32::new(0),
                });
                Box::into_raw(pd).cast()
            }
            Err(e) => null_with("ibv_alloc_pd", report("ibv_alloc_pd", &e)),
        }
    })
}

/// `ibv_dealloc_pd`: 0, EBUSY while objects use the PD, or another errno value.
///
/// # Safety
/// `pd` is a PD of this library, not used afterwards on success.
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard("ibv_dealloc_pd", libc::EIO, || {
        // SAFETY: caller contract.
        let Some(vpd) = (unsafe { VrdmaPd::from_ptr(pd) }) else {
            return libc::EINVAL;
        };
        if vpd.users.load(Ordering::Acquire) != 0 {
            return libc::EBUSY;
        }
        // SAFETY: made by Box::into_raw in ibv_alloc_pd; the caller gives it up.
        drop(unsafe { Box::from_raw(pd.cast::<VrdmaPd>()) });
        0
    })
}

/// A memory region: `ibv_mr` first.
#[repr(C)]
pub(crate) struct VrdmaMr {
    pub(crate) ibv: ibv_mr,
    pub(crate) mr: Mr<'static>,
}

/// The access flags of a registration, with optional flags vrdma does not carry dropped.
pub(crate) fn mr_access(bits: u32) -> Option<AccessFlags> {
    let optional_unsupported = ACCESS_OPTIONAL_RANGE & !AccessFlags::MR_ALLOWED.bits();
    AccessFlags::from_bits(bits & !optional_unsupported)
}

/// `ibv_reg_mr`.
///
/// # Safety
/// As `ibv_reg_mr_iova2` with `iova = addr`.
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded contract.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, addr as u64, access as u32) }
}

/// `ibv_reg_mr_iova` (IBVERBS_1.7): `ibv_reg_mr_iova2` with the access flags as an `int`.
///
/// # Safety
/// As `ibv_reg_mr_iova2`.
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // The flags are a bit set: C's int-to-unsigned conversion keeps every bit.
    // SAFETY: caller contract, the same as ibv_reg_mr_iova2's.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, iova, access as u32) }
}

/// `ibv_reg_mr_iova2`: registers `length` bytes at `addr`, addressed by work requests and peers
/// as `[iova, iova + length)`. Memory outside the transport's guest RAM is re-backed by guest RAM
/// first (see [`crate::memory`]). rxe translates an iova page by page, keeping its offset in the
/// page, so an `iova` whose offset within a 4 KiB page differs from `addr`'s fails with EINVAL
/// (rxe itself would place the data at the wrong offset).
///
/// # Safety
/// `pd` is a PD of this library; `[addr, addr + length)` is memory of this process that stays
/// mapped while the region is registered.
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    guard("ibv_reg_mr", std::ptr::null_mut(), || {
        // SAFETY: caller contract.
        let Some(vpd) = (unsafe { VrdmaPd::from_ptr(pd) }) else {
            return null_with("ibv_reg_mr", libc::EINVAL);
        };
        let Some(flags) = mr_access(access) else {
            return null_with("ibv_reg_mr (access flags)", libc::EINVAL);
        };
        if addr.is_null() || length == 0 {
            return null_with("ibv_reg_mr", libc::EINVAL);
        }
        let ctx = vpd.context();
        if let Err(e) = ctx
            .transport
            .memory()
            .make_registrable(addr as usize, length)
        {
            log::warn!("vrdma: ibv_reg_mr of {length:#x} bytes at {addr:p}: {e}");
            return null_with("ibv_reg_mr", e.errno());
        }
        // As rdma-core's ibv_reg_mr, but after the re-backing, whose new mappings would not
        // carry advice given before.
        if let Err(e) = fork::dont_fork(addr as usize, length) {
            log::warn!("vrdma: ibv_reg_mr: MADV_DONTFORK of {length:#x} bytes at {addr:p}: {e}");
            return null_with("ibv_reg_mr", e.raw_os_error().unwrap_or(libc::EINVAL));
        }
        // SAFETY: the caller keeps the memory mapped while the region lives; it is guest
        // RAM now (checked again by the translation inside).
        let registered = unsafe { vpd.pd.register_raw_at(addr.cast(), length, iova, flags) };
        if registered.is_err() {
            fork::do_fork(addr as usize, length);
        }
        match registered {
            Ok(mr) => {
                let ibv = ibv_mr {
                    context: vpd.ibv.context,
                    pd,
                    addr,
                    length: length as crate::sys::size_t,
                    handle: mr.handle(),
                    lkey: mr.lkey(),
                    rkey: mr.rkey(),
                };
                vpd.users.fetch_add(1, Ordering::AcqRel);
                Box::into_raw(Box::new(VrdmaMr { ibv, mr })).cast()
            }
            Err(e) => null_with("ibv_reg_mr", report("ibv_reg_mr", &e)),
        }
    })
}

/// `ibv_dereg_mr`: 0, or an errno value. The re-backed pages stay mapped (valid memory).
///
/// # Safety
/// `mr` is a region of this library, not used afterwards on success.
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard("ibv_dereg_mr", libc::EIO, || {
        if mr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: made by Box::into_raw in ibv_reg_mr_iova2; the caller gives it up.
        let mr = unsafe { Box::from_raw(mr.cast::<VrdmaMr>()) };
        // SAFETY: the PD outlives its regions (ibv_dealloc_pd refuses while they exist).
        let pd = unsafe { VrdmaPd::from_ptr(mr.ibv.pd) };
        let (addr, length) = (mr.ibv.addr as usize, mr.ibv.length as usize);
        drop(mr);
        fork::do_fork(addr, length);
        if let Some(pd) = pd {
            pd.users.fetch_sub(1, Ordering::AcqRel);
        }
        0
    })
}

/// An address handle: `ibv_ah` first.
#[repr(C)]
pub(crate) struct VrdmaAh {
    pub(crate) ibv: ibv_ah,
    pub(crate) ah: Ah,
}

/// The wire form of an `ibv_ah_attr`; the GRH fields count only with `is_global`.
pub(crate) fn ah_attr_from(a: &ibv_ah_attr) -> AhAttr {
    let mut attr = AhAttr::default()
        .with_dlid(a.dlid)
        .with_sl(a.sl)
        .with_src_path_bits(a.src_path_bits)
        .with_static_rate(a.static_rate)
        .with_port_num(a.port_num);
    attr.set_grh((a.is_global != 0).then_some(GlobalRoute {
        // SAFETY: every bit pattern of the 16-byte union is a valid `raw`.
        dgid: Gid(unsafe { a.grh.dgid.raw }),
        flow_label: a.grh.flow_label,
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
    }));
    attr
}

/// The `ibv_ah_attr` of an address vector in wire form.
pub(crate) fn ah_attr_to(a: &AhAttr) -> ibv_ah_attr {
    // SAFETY: all-zero is a valid ibv_ah_attr.
    let mut out: ibv_ah_attr = unsafe { std::mem::zeroed() };
    if let Some(grh) = a.grh() {
        out.is_global = 1;
        out.grh.dgid.raw = grh.dgid.0;
        out.grh.flow_label = grh.flow_label;
        out.grh.sgid_index = grh.sgid_index;
        out.grh.hop_limit = grh.hop_limit;
        out.grh.traffic_class = grh.traffic_class;
    }
    out.dlid = a.dlid.get();
    out.sl = a.sl;
    out.src_path_bits = a.src_path_bits;
    out.static_rate = a.static_rate;
    out.port_num = a.port_num;
    out
}

/// `ibv_create_ah`.
///
/// # Safety
/// `pd` is a PD of this library; `attr` is valid for a read.
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard("ibv_create_ah", std::ptr::null_mut(), || {
        // SAFETY: caller contract.
        let (Some(vpd), Some(attr)) = (unsafe { (VrdmaPd::from_ptr(pd), attr.as_ref()) }) else {
            return null_with("ibv_create_ah", libc::EINVAL);
        };
        match Ah::new(&vpd.pd, &ah_attr_from(attr)) {
            Ok(ah) => {
                let ibv = ibv_ah {
                    context: vpd.ibv.context,
                    pd,
                    handle: ah.handle(),
                };
                vpd.users.fetch_add(1, Ordering::AcqRel);
                Box::into_raw(Box::new(VrdmaAh { ibv, ah })).cast()
            }
            Err(e) => null_with("ibv_create_ah", report("ibv_create_ah", &e)),
        }
    })
}

/// `ibv_destroy_ah`: 0, or an errno value.
///
/// # Safety
/// `ah` is an address handle of this library, not used afterwards.
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    guard("ibv_destroy_ah", libc::EIO, || {
        if ah.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: made by Box::into_raw in ibv_create_ah; the caller gives it up.
        let ah = unsafe { Box::from_raw(ah.cast::<VrdmaAh>()) };
        // SAFETY: the PD outlives its address handles.
        let pd = unsafe { VrdmaPd::from_ptr(ah.ibv.pd) };
        drop(ah);
        if let Some(pd) = pd {
            pd.users.fetch_sub(1, Ordering::AcqRel);
        }
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn optional_access_flags_are_dropped_and_others_checked() {
        let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        assert_eq!(mr_access(0x7), Some(rw));
        // IBV_ACCESS_RELAXED_ORDERING is carried; another optional bit is dropped.
        assert_eq!(
            mr_access(0x7 | (1 << 20)),
            Some(rw | AccessFlags::RELAXED_ORDERING)
        );
        assert_eq!(mr_access(0x7 | (1 << 21)), Some(rw));
        // IBV_ACCESS_ON_DEMAND (0x40) is carried (the device refuses it without VRDMA_F_ODP);
        // IBV_ACCESS_ZERO_BASED (0x20) is not optional and not supported.
        assert_eq!(mr_access(0x40), Some(AccessFlags::ON_DEMAND));
        assert_eq!(mr_access(0x20), None);
    }

    #[test]
    fn ah_attributes_round_trip() {
        let attr = AhAttr::default()
            .with_grh(GlobalRoute {
                dgid: Gid([0xfe; 16]),
                flow_label: 0x12345,
                sgid_index: 1,
                hop_limit: 64,
                traffic_class: 3,
            })
            .with_dlid(0)
            .with_sl(2)
            .with_src_path_bits(0)
            .with_static_rate(0)
            .with_port_num(1);
        assert_eq!(ah_attr_from(&ah_attr_to(&attr)), attr);
        let local = AhAttr::default().with_dlid(5).with_port_num(1);
        assert_eq!(local.grh(), None);
        assert_eq!(ah_attr_from(&ah_attr_to(&local)), local);
    }
}

//! `rdma_getaddrinfo` and `rdma_freeaddrinfo`: the host and service resolved with the C
//! library's `getaddrinfo` (no ibacm route lookup, as librdmacm without ibacm), a passive
//! result as the source address and an active one as the destination.

use std::ffi::{c_char, c_int};

use super::device::fail;
use crate::ffi::guard;
use crate::sys::*;

/// A `malloc`ed copy of the socket address `addr` of `len` bytes.
///
/// # Safety
/// `addr` is readable for `len` bytes.
unsafe fn copy_addr(addr: *const libc::sockaddr, len: libc::socklen_t) -> *mut sockaddr {
    // SAFETY: a plain allocation, checked by the caller.
    let copy = unsafe { libc::malloc(len as usize) };
    if !copy.is_null() {
        // SAFETY: caller contract; `copy` holds `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(addr.cast::<u8>(), copy.cast(), len as usize) };
    }
    copy.cast()
}

/// `rdma_getaddrinfo`: one result. 0, or -1 with errno (`getaddrinfo`'s failures as
/// `EADDRNOTAVAIL`, as librdmacm maps them).
///
/// # Safety
/// `node` and `service` NULL or C strings; `hints` NULL or readable; `res` valid for a write.
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard("rdma_getaddrinfo", -1, || {
        if res.is_null() || (node.is_null() && service.is_null()) {
            return fail(libc::EINVAL);
        }
        // SAFETY: caller contract.
        let hints = unsafe { hints.as_ref() };
        let flags = hints.map_or(0, |h| h.ai_flags as u32);
        let passive = flags & RAI_PASSIVE != 0;
        // SAFETY: all-zero is a valid addrinfo hint.
        let mut want: libc::addrinfo = unsafe { std::mem::zeroed() };
        want.ai_family = hints.map_or(libc::AF_UNSPEC, |h| h.ai_family);
        want.ai_socktype = libc::SOCK_STREAM;
        if passive {
            want.ai_flags |= libc::AI_PASSIVE;
        }
        if flags & RAI_NUMERICHOST != 0 {
            want.ai_flags |= libc::AI_NUMERICHOST;
        }
        let mut found: *mut libc::addrinfo = std::ptr::null_mut();
        // SAFETY: caller contract for the strings; `want` and `found` are locals.
        if unsafe { libc::getaddrinfo(node, service, &want, &mut found) } != 0 || found.is_null() {
            return fail(libc::EADDRNOTAVAIL);
        }
        // SAFETY: a result getaddrinfo made.
        let first = unsafe { &*found };
        // SAFETY: a zeroed allocation, checked below.
        let out: *mut rdma_addrinfo = unsafe { libc::calloc(1, size_of::<rdma_addrinfo>()) }.cast();
        if out.is_null() {
            // SAFETY: getaddrinfo's list.
            unsafe { libc::freeaddrinfo(found) };
            return fail(libc::ENOMEM);
        }
        // SAFETY: the allocation just made; the addresses getaddrinfo returned (and the
        // application's hint) are readable for their lengths.
        unsafe {
            let o = &mut *out;
            o.ai_flags = flags as c_int;
            o.ai_family = first.ai_family;
            o.ai_qp_type = hints
                .map(|h| h.ai_qp_type)
                .filter(|&t| t != 0)
                .unwrap_or(ibv_qp_type_IBV_QPT_RC as c_int);
            o.ai_port_space = hints
                .map(|h| h.ai_port_space)
                .filter(|&ps| ps != 0)
                .unwrap_or(rdma_port_space_RDMA_PS_TCP as c_int);
            if passive {
                o.ai_src_addr = copy_addr(first.ai_addr, first.ai_addrlen);
                o.ai_src_len = first.ai_addrlen;
            } else {
                o.ai_dst_addr = copy_addr(first.ai_addr, first.ai_addrlen);
                o.ai_dst_len = first.ai_addrlen;
                if let Some(h) = hints.filter(|h| !h.ai_src_addr.is_null()) {
                    o.ai_src_addr = copy_addr(h.ai_src_addr.cast(), h.ai_src_len);
                    o.ai_src_len = h.ai_src_len;
                }
            }
            libc::freeaddrinfo(found);
            res.write(out);
        }
        0
    })
}

/// `rdma_freeaddrinfo`.
///
/// # Safety
/// `res` NULL or a list returned by [`rdma_getaddrinfo`], not used afterwards.
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    guard("rdma_freeaddrinfo", (), || {
        let mut next = res;
        while !next.is_null() {
            // SAFETY: caller contract: allocations of rdma_getaddrinfo (free(NULL) is fine).
            unsafe {
                let o = &*next;
                let after = o.ai_next;
                for p in [
                    o.ai_src_addr.cast::<libc::c_void>(),
                    o.ai_dst_addr.cast(),
                    o.ai_src_canonname.cast(),
                    o.ai_dst_canonname.cast(),
                    o.ai_route,
                    o.ai_connect,
                ] {
                    libc::free(p);
                }
                libc::free(next.cast());
                next = after;
            }
        }
    })
}

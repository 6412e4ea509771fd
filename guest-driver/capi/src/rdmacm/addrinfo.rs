//! `rdma_getaddrinfo` and `rdma_freeaddrinfo`: the host and service resolved with the C
//! library's `getaddrinfo` (no ibacm route lookup, as librdmacm without ibacm), a passive
//! result as the source address and an active one as the destination; without either, the
//! hints' addresses.

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

/// `rdma_getaddrinfo`: one result, as librdmacm makes it. With a node or a service, they are
/// looked up (`getaddrinfo`'s failures are `EADDRNOTAVAIL`, as librdmacm maps them): a passive
/// result is the source address, an active one the destination. With neither, the result is
/// the hints' own addresses (libfabric asks so for a peer whose address it already has). A
/// source in the hints fills a result that has none. 0, or -1 with errno.
///
/// # Safety
/// `node` and `service` NULL or C strings; `hints` NULL or readable, its addresses readable
/// for their lengths; `res` valid for a write.
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard("rdma_getaddrinfo", -1, || {
        // SAFETY: caller contract.
        let hints = unsafe { hints.as_ref() };
        if res.is_null() || (node.is_null() && service.is_null() && hints.is_none()) {
            return fail(libc::EINVAL);
        }
        let flags = hints.map_or(0, |h| h.ai_flags as u32);
        // SAFETY: a zeroed allocation, checked below.
        let out: *mut rdma_addrinfo = unsafe { libc::calloc(1, size_of::<rdma_addrinfo>()) }.cast();
        if out.is_null() {
            return fail(libc::ENOMEM);
        }
        // SAFETY: the allocation just made, ours until it is returned or freed.
        let o = unsafe { &mut *out };
        o.ai_flags = flags as c_int;
        o.ai_family = hints.map_or(libc::AF_UNSPEC, |h| h.ai_family);
        o.ai_qp_type = hints
            .map(|h| h.ai_qp_type)
            .filter(|&t| t != 0)
            .unwrap_or(ibv_qp_type_IBV_QPT_RC as c_int);
        o.ai_port_space = hints
            .map(|h| h.ai_port_space)
            .filter(|&ps| ps != 0)
            .unwrap_or(rdma_port_space_RDMA_PS_TCP as c_int);
        if !node.is_null() || !service.is_null() {
            // SAFETY: caller contract for the strings.
            if let Err(errno) = unsafe { look_up(node, service, flags, o) } {
                // SAFETY: our allocation, with what look_up put in it.
                unsafe { rdma_freeaddrinfo(out) };
                return fail(errno);
            }
        } else if let Some(h) = hints.filter(|h| !h.ai_dst_addr.is_null() && h.ai_dst_len > 0) {
            // SAFETY: caller contract: the hint's destination is readable for its length.
            o.ai_dst_addr = unsafe { copy_addr(h.ai_dst_addr.cast(), h.ai_dst_len) };
            o.ai_dst_len = h.ai_dst_len;
        }
        if o.ai_src_addr.is_null() {
            if let Some(h) = hints.filter(|h| !h.ai_src_addr.is_null() && h.ai_src_len > 0) {
                // SAFETY: caller contract: the hint's source is readable for its length.
                o.ai_src_addr = unsafe { copy_addr(h.ai_src_addr.cast(), h.ai_src_len) };
                o.ai_src_len = h.ai_src_len;
            }
        }
        // SAFETY: caller contract.
        unsafe { res.write(out) };
        0
    })
}

/// Looks `node` and `service` up into `o`: its family, and its source address when `flags`
/// say passive, else its destination. The errno on failure.
///
/// # Safety
/// `node` and `service` NULL or C strings.
unsafe fn look_up(
    node: *const c_char,
    service: *const c_char,
    flags: u32,
    o: &mut rdma_addrinfo,
) -> Result<(), c_int> {
    // SAFETY: all-zero is a valid addrinfo hint.
    let mut want: libc::addrinfo = unsafe { std::mem::zeroed() };
    want.ai_family = o.ai_family;
    want.ai_socktype = libc::SOCK_STREAM;
    if flags & RAI_PASSIVE != 0 {
        want.ai_flags |= libc::AI_PASSIVE;
    }
    if flags & RAI_NUMERICHOST != 0 {
        want.ai_flags |= libc::AI_NUMERICHOST;
    }
    let mut found: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: caller contract for the strings; `want` and `found` are locals.
    if unsafe { libc::getaddrinfo(node, service, &want, &mut found) } != 0 || found.is_null() {
        return Err(libc::EADDRNOTAVAIL);
    }
    // SAFETY: a result getaddrinfo made, freed below.
    let first = unsafe { &*found };
    o.ai_family = first.ai_family;
    // SAFETY: getaddrinfo's address is readable for its length.
    let addr = unsafe { copy_addr(first.ai_addr, first.ai_addrlen) };
    if flags & RAI_PASSIVE != 0 {
        (o.ai_src_addr, o.ai_src_len) = (addr, first.ai_addrlen);
    } else {
        (o.ai_dst_addr, o.ai_dst_len) = (addr, first.ai_addrlen);
    }
    // SAFETY: getaddrinfo's list, not used afterwards.
    unsafe { libc::freeaddrinfo(found) };
    if addr.is_null() {
        return Err(libc::ENOMEM);
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use std::ffi::CString;
    use std::net::SocketAddrV6;

    use super::*;

    fn sockaddr_in6(text: &str) -> libc::sockaddr_in6 {
        let addr: SocketAddrV6 = text.parse().unwrap();
        // SAFETY: all-zero is a valid sockaddr_in6.
        let mut raw: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
        raw.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        raw.sin6_port = addr.port().to_be();
        raw.sin6_addr.s6_addr = addr.ip().octets();
        raw.sin6_scope_id = addr.scope_id();
        raw
    }

    /// The IPv6 address and port at `addr`.
    fn read_in6(addr: *mut sockaddr, len: libc::socklen_t) -> (std::net::Ipv6Addr, u16, u32) {
        assert_eq!(len as usize, size_of::<libc::sockaddr_in6>());
        // SAFETY: a sockaddr_in6 this module copied.
        let raw = unsafe { &*addr.cast::<libc::sockaddr_in6>() };
        (
            raw.sin6_addr.s6_addr.into(),
            u16::from_be(raw.sin6_port),
            raw.sin6_scope_id,
        )
    }

    fn hints_with(
        dst: Option<&mut libc::sockaddr_in6>,
        src: Option<&mut libc::sockaddr_in6>,
    ) -> rdma_addrinfo {
        // SAFETY: all-zero is a valid hint.
        let mut hints: rdma_addrinfo = unsafe { std::mem::zeroed() };
        hints.ai_family = libc::AF_INET6;
        let len = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
        if let Some(dst) = dst {
            hints.ai_dst_addr = (dst as *mut libc::sockaddr_in6).cast();
            hints.ai_dst_len = len;
        }
        if let Some(src) = src {
            hints.ai_src_addr = (src as *mut libc::sockaddr_in6).cast();
            hints.ai_src_len = len;
        }
        hints
    }

    #[test]
    fn without_node_or_service_the_result_is_the_hints_addresses() {
        let mut dst = sockaddr_in6("[fe80::1%7]:4711");
        let mut src = sockaddr_in6("[fe80::2%7]:0");
        let hints = hints_with(Some(&mut dst), Some(&mut src));
        let mut res = std::ptr::null_mut();
        // SAFETY: valid hints and result pointer.
        let ret = unsafe { rdma_getaddrinfo(std::ptr::null(), std::ptr::null(), &hints, &mut res) };
        assert_eq!(ret, 0);
        // SAFETY: the result just made.
        let r = unsafe { &*res };
        assert_eq!(r.ai_family, libc::AF_INET6);
        assert_eq!(r.ai_qp_type, ibv_qp_type_IBV_QPT_RC as c_int);
        assert_eq!(
            read_in6(r.ai_dst_addr, r.ai_dst_len),
            ("fe80::1".parse().unwrap(), 4711, 7)
        );
        assert_eq!(
            read_in6(r.ai_src_addr, r.ai_src_len),
            ("fe80::2".parse().unwrap(), 0, 7)
        );
        // SAFETY: the list rdma_getaddrinfo returned.
        unsafe { rdma_freeaddrinfo(res) };
    }

    #[test]
    fn a_looked_up_destination_keeps_the_hints_source_and_nothing_is_einval() {
        let mut src = sockaddr_in6("[fe80::2%7]:0");
        let hints = hints_with(None, Some(&mut src));
        let node = CString::new("fe80::9%1").unwrap();
        let service = CString::new("7000").unwrap();
        let mut hints = hints;
        hints.ai_flags = RAI_NUMERICHOST as c_int;
        let mut res = std::ptr::null_mut();
        // SAFETY: valid strings, hints and result pointer.
        let ret = unsafe { rdma_getaddrinfo(node.as_ptr(), service.as_ptr(), &hints, &mut res) };
        assert_eq!(ret, 0);
        // SAFETY: the result just made.
        let r = unsafe { &*res };
        let (ip, port, _) = read_in6(r.ai_dst_addr, r.ai_dst_len);
        assert_eq!((ip, port), ("fe80::9".parse().unwrap(), 7000));
        assert_eq!(
            read_in6(r.ai_src_addr, r.ai_src_len).0,
            "fe80::2".parse::<std::net::Ipv6Addr>().unwrap()
        );
        // SAFETY: the list rdma_getaddrinfo returned.
        unsafe { rdma_freeaddrinfo(res) };
        // SAFETY: a valid result pointer.
        let none = unsafe {
            rdma_getaddrinfo(
                std::ptr::null(),
                std::ptr::null(),
                std::ptr::null(),
                &mut res,
            )
        };
        assert_eq!(
            (none, std::io::Error::last_os_error().raw_os_error()),
            (-1, Some(libc::EINVAL))
        );
    }
}

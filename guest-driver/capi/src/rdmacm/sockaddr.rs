//! C socket addresses (`struct sockaddr *` from applications, the `sockaddr_storage`s of
//! `rdma_cm_id.route.addr`) to and from socket addresses, through the one conversion in
//! `vrdma_spec::cm::sockaddr`.

use std::net::{IpAddr, SocketAddr};

use vrdma::spec::cm::{cm_family, sockaddr as wire};

use crate::sys::{sockaddr, sockaddr_storage, socklen_t};

/// The IPv4 or IPv6 address at `ptr`; `None` for NULL or another family (AF_IB).
///
/// # Safety
/// `ptr` is NULL or points at a readable `struct sockaddr` of its family's size
/// (`sockaddr_in` or `sockaddr_in6`), as the rdma_cm API requires of callers.
pub(crate) unsafe fn read(ptr: *const sockaddr) -> Option<SocketAddr> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: caller contract: at least the family field is readable.
    let family = unsafe { (*ptr).sa_family };
    let len = match family {
        cm_family::INET => wire::IN_SIZE,
        cm_family::INET6 => wire::IN6_SIZE,
        _ => return None,
    };
    // SAFETY: caller contract: a sockaddr of its family's size, `len` bytes.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
    wire::decode(bytes, len)
}

/// `addr` written into `out` (all zero for `None`); its length.
pub(crate) fn write(addr: Option<SocketAddr>, out: &mut sockaddr_storage) -> socklen_t {
    let (bytes, len) = addr.map_or(([0; wire::STORAGE_SIZE], 0), |a| wire::encode(&a));
    // SAFETY: sockaddr_storage is 128 plain bytes, as many as `bytes`.
    let dst = unsafe {
        std::slice::from_raw_parts_mut(std::ptr::from_mut(out).cast::<u8>(), wire::STORAGE_SIZE)
    };
    dst.copy_from_slice(&bytes);
    len as socklen_t
}

/// A link-local IPv6 address without a scope, given the index of this namespace's interface
/// that holds it (in process mode the device's answers name the host's RDMA netdev address,
/// unscoped when the application bound none): native peers' sockets and rdma_cm need the
/// scope. Any other address as it is.
pub(crate) fn with_local_scope(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(mut v6) if v6.scope_id() == 0 && is_link_local(v6.ip()) => {
            if let Some(interface) = vrdma::interfaces::holding(IpAddr::V6(*v6.ip())) {
                v6.set_scope_id(interface.index);
            }
            SocketAddr::V6(v6)
        }
        other => other,
    }
}

/// `addr` (a link-local IPv6 address without a scope) scoped like `like`, when that is a scoped
/// link-local address.
pub(crate) fn scoped_like(addr: SocketAddr, like: Option<SocketAddr>) -> SocketAddr {
    match (addr, like) {
        (SocketAddr::V6(mut v6), Some(SocketAddr::V6(l)))
            if v6.scope_id() == 0 && is_link_local(v6.ip()) && is_link_local(l.ip()) =>
        {
            v6.set_scope_id(l.scope_id());
            SocketAddr::V6(v6)
        }
        _ => addr,
    }
}

fn is_link_local(ip: &std::net::Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

/// `addr` as the kernel's rdma_cm gives both ends of a connect request
/// (`cma_save_ip6_info`): IPv6 without scope id or flow label; IPv4 as it is.
pub(crate) fn unscoped(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(v6) => std::net::SocketAddrV6::new(*v6.ip(), v6.port(), 0, 0).into(),
        v4 => v4,
    }
}

/// The port of a socket address in `out` (network order in C, here host order); 0 if none.
pub(crate) fn port_of(storage: &sockaddr_storage) -> u16 {
    // SAFETY: sockaddr_storage is 128 plain bytes.
    let bytes = unsafe {
        std::slice::from_raw_parts(std::ptr::from_ref(storage).cast::<u8>(), wire::STORAGE_SIZE)
    };
    wire::decode(bytes, wire::STORAGE_SIZE).map_or(0, |a| a.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_local_addresses_get_a_scope_and_others_stay() {
        let unscoped: SocketAddr = "[fe80::1234:5678:9abc:def0]:9".parse().unwrap();
        // No interface of this namespace holds it: unchanged.
        assert_eq!(with_local_scope(unscoped), unscoped);
        for other in ["192.0.2.1:1", "[2001:db8::1]:1", "[fe80::1%3]:1"] {
            let addr: SocketAddr = other.parse().unwrap();
            assert_eq!(with_local_scope(addr), addr);
            assert_eq!(scoped_like(addr, Some(unscoped)), addr);
        }
        let source: SocketAddr = "[fe80::2%5]:0".parse().unwrap();
        assert_eq!(
            scoped_like(unscoped, Some(source)),
            "[fe80::1234:5678:9abc:def0%5]:9".parse().unwrap()
        );
        assert_eq!(scoped_like(unscoped, None), unscoped);
        // Loopback's interface holds ::1, but ::1 is not link-local: unchanged.
        let loopback: SocketAddr = "[::1]:1".parse().unwrap();
        assert_eq!(with_local_scope(loopback), loopback);
    }

    #[test]
    fn addresses_survive_the_c_layouts() {
        for text in ["192.0.2.1:7471", "[fe80::1%2]:9", "[2001:db8::5]:65535"] {
            let addr: SocketAddr = text.parse().unwrap();
            // SAFETY: all-zero is a valid sockaddr_storage.
            let mut storage: sockaddr_storage = unsafe { std::mem::zeroed() };
            let len = write(Some(addr), &mut storage);
            assert!(len == 16 || len == 28);
            // SAFETY: a storage holding the address just written.
            let back = unsafe { read(std::ptr::from_ref(&storage).cast()) };
            assert_eq!(back, Some(addr));
            assert_eq!(port_of(&storage), addr.port());
        }
        // SAFETY: NULL is allowed.
        assert_eq!(unsafe { read(std::ptr::null()) }, None);
    }
}

//! The network interfaces of this network namespace that hold an address: what ties a GID to
//! the netdev it came from (an IPv6 link-local address's scope; the netdev the kernel would
//! name in `gid_attrs/ndevs` and `device/net`).

use std::ffi::CStr;
use std::net::{IpAddr, Ipv6Addr};

/// An interface holding an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub index: u32,
}

/// The addresses of this network namespace's interfaces, read once (one `getifaddrs`), for
/// callers that look up several addresses.
#[derive(Debug, Clone, Default)]
pub struct Addresses(Vec<(String, IpAddr)>);

impl Addresses {
    /// The namespace's addresses now.
    pub fn current() -> std::io::Result<Self> {
        addresses().map(Addresses)
    }

    /// The interface that has `ip`, if one has (the first, if several).
    pub fn holding(&self, ip: IpAddr) -> Option<Interface> {
        let name = self.0.iter().find(|(_, address)| *address == ip)?.0.clone();
        let c_name = std::ffi::CString::new(name.clone()).ok()?;
        // SAFETY: a NUL-terminated name; the call only reads it.
        let index = unsafe { libc::if_nametoindex(c_name.as_ptr()) };
        (index != 0).then_some(Interface { name, index })
    }
}

/// The interface of this network namespace that has `ip`, if one has (the first, if several).
pub fn holding(ip: IpAddr) -> Option<Interface> {
    Addresses::current().ok()?.holding(ip)
}

/// The address a GID stands for on an Ethernet (RoCE) port: IPv4 when it is IPv4-mapped.
pub fn gid_address(gid: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(gid);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

/// Every `(interface name, address)` of this network namespace (`getifaddrs`).
fn addresses() -> std::io::Result<Vec<(String, IpAddr)>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `list` is an out-pointer the C library fills; freed below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut found = Vec::new();
    let mut next = list;
    while !next.is_null() {
        // SAFETY: a node of the list getifaddrs returned, not yet freed.
        let entry = unsafe { &*next };
        next = entry.ifa_next;
        if entry.ifa_addr.is_null() || entry.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a non-null address of the entry; its family says which sockaddr it is.
        let address = match i32::from(unsafe { (*entry.ifa_addr).sa_family }) {
            libc::AF_INET => {
                // SAFETY: AF_INET addresses are `sockaddr_in`.
                let sin = unsafe { &*entry.ifa_addr.cast::<libc::sockaddr_in>() };
                IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes())
            }
            libc::AF_INET6 => {
                // SAFETY: AF_INET6 addresses are `sockaddr_in6`.
                let sin6 = unsafe { &*entry.ifa_addr.cast::<libc::sockaddr_in6>() };
                IpAddr::from(sin6.sin6_addr.s6_addr)
            }
            _ => continue,
        };
        // SAFETY: the entry's interface name, a C string that lives as long as the list.
        let name = unsafe { CStr::from_ptr(entry.ifa_name) };
        found.push((name.to_string_lossy().into_owned(), address));
    }
    // SAFETY: the list getifaddrs returned, not used afterwards.
    unsafe { libc::freeifaddrs(list) };
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_holds_its_address() {
        let lo = holding(IpAddr::from([127, 0, 0, 1])).expect("lo has 127.0.0.1");
        assert_eq!(lo.name, "lo");
        assert_ne!(lo.index, 0);
    }

    #[test]
    fn an_address_nobody_holds_has_no_interface() {
        // 192.0.2.0/24 is TEST-NET-1: documentation only.
        assert_eq!(holding(IpAddr::from([192, 0, 2, 77])), None);
    }

    #[test]
    fn ipv4_mapped_gids_are_ipv4_addresses() {
        let mapped = std::net::Ipv4Addr::new(127, 0, 0, 1)
            .to_ipv6_mapped()
            .octets();
        assert_eq!(gid_address(mapped), IpAddr::from([127, 0, 0, 1]));
        let link_local: Ipv6Addr = "fe80::1".parse().unwrap();
        assert_eq!(gid_address(link_local.octets()), IpAddr::V6(link_local));
    }
}

//! Whether an address belongs to this host: packets to such a destination never reach a wire,
//! rxe delivers them itself by QP number (its loopback path).

use std::io;
use std::net::{IpAddr, Ipv6Addr};

/// Whether packets to `gid` (an IPv6 address, IPv4 ones mapped) stay on this host: a loopback,
/// unspecified or multicast address, or an address of any of its interfaces. The kernel
/// resolves a local destination to the sending netdev's own MAC, which is rxe's test for
/// delivering a packet locally.
pub fn is_host_address(gid: &[u8; 16]) -> io::Result<bool> {
    let ip = Ipv6Addr::from(*gid);
    let ip = match ip.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(ip),
    };
    if ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() {
        return Ok(true);
    }
    Ok(interface_addresses()?.contains(&ip))
}

/// Every address of every interface of this host (`getifaddrs`).
fn interface_addresses() -> io::Result<Vec<IpAddr>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `list` is a valid out-pointer; on success the kernel's list is freed below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut addresses = Vec::new();
    let mut entry = list;
    while !entry.is_null() {
        // SAFETY: `entry` is a node of the list getifaddrs returned, not yet freed.
        let node = unsafe { &*entry };
        if !node.ifa_addr.is_null() {
            // SAFETY: a non-null `ifa_addr` points to a sockaddr whose family says its type.
            match i32::from(unsafe { (*node.ifa_addr).sa_family }) {
                libc::AF_INET => {
                    // SAFETY: AF_INET addresses are `sockaddr_in`.
                    let sin = unsafe { &*(node.ifa_addr as *const libc::sockaddr_in) };
                    addresses.push(IpAddr::from(
                        u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                    ));
                }
                libc::AF_INET6 => {
                    // SAFETY: AF_INET6 addresses are `sockaddr_in6`.
                    let sin6 = unsafe { &*(node.ifa_addr as *const libc::sockaddr_in6) };
                    addresses.push(IpAddr::from(sin6.sin6_addr.s6_addr));
                }
                _ => {}
            }
        }
        entry = node.ifa_next;
    }
    // SAFETY: `list` came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    Ok(addresses)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid(ip: IpAddr) -> [u8; 16] {
        match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        }
    }

    #[test]
    fn loopback_and_interface_addresses_are_the_hosts() {
        assert!(is_host_address(&gid("::1".parse().unwrap())).unwrap());
        assert!(is_host_address(&gid("127.0.0.1".parse().unwrap())).unwrap());
        assert!(is_host_address(&gid("127.9.8.7".parse().unwrap())).unwrap());
        assert!(is_host_address(&gid("ff02::1".parse().unwrap())).unwrap());
        // Every address an interface of this machine has counts, whatever it is.
        for ip in interface_addresses().unwrap() {
            assert!(is_host_address(&gid(ip)).unwrap(), "{ip}");
        }
        // An address from the documentation range is nobody's here.
        assert!(!is_host_address(&gid("2001:db8::77".parse().unwrap())).unwrap());
    }
}

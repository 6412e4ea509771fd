//! Whether an address belongs to this host: packets to such a destination never reach a wire,
//! rxe delivers them itself by QP number (its loopback path).

use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use parking_lot::Mutex;

/// Whether packets to `gid` (an IPv6 address, IPv4 ones mapped) stay on this host: a loopback,
/// unspecified or multicast address, or an address of any of its interfaces. The kernel
/// resolves a local destination to the sending netdev's own MAC, which is rxe's test for
/// delivering a packet locally.
pub fn is_host_address(gid: &[u8; 16]) -> io::Result<bool> {
    match always_local(gid) {
        Ok(local) => Ok(local),
        Err(ip) => Ok(interface_addresses()?.contains(&ip)),
    }
}

/// `Ok(true)` for addresses that are local whatever the interfaces have (loopback,
/// unspecified, multicast), else the address to look up.
fn always_local(gid: &[u8; 16]) -> Result<bool, IpAddr> {
    let ip = Ipv6Addr::from(*gid);
    let ip = match ip.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(ip),
    };
    if ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() {
        return Ok(true);
    }
    Err(ip)
}

/// [`is_host_address`] with the host's addresses kept between calls and read again only after
/// the kernel announced a change of them: a `NETLINK_ROUTE` socket subscribed to address
/// changes is drained before each use, and anything on it (or a lost announcement) drops the
/// list. Without the socket every call reads the addresses, as [`is_host_address`] does.
/// Checked at every path a guest sets up (MODIFY_QP to RTR, CREATE_AH), where reading the
/// list cost a netlink dump of every link and address each time.
#[derive(Debug)]
pub struct HostAddresses {
    changes: Option<OwnedFd>,
    cached: Mutex<Option<Vec<IpAddr>>>,
}

impl Default for HostAddresses {
    fn default() -> Self {
        Self::new()
    }
}

impl HostAddresses {
    /// Subscribes to the kernel's address announcements (on failure, works uncached).
    pub fn new() -> HostAddresses {
        let changes = subscribe_to_address_changes()
            .inspect_err(|e| log::warn!("host addresses will be read at every check: {e}"))
            .ok();
        HostAddresses {
            changes,
            cached: Mutex::new(None),
        }
    }

    /// Whether packets to `gid` stay on this host (see [`is_host_address`]).
    pub fn contains(&self, gid: &[u8; 16]) -> io::Result<bool> {
        let Some(changes) = &self.changes else {
            return is_host_address(gid);
        };
        let ip = match always_local(gid) {
            Ok(local) => return Ok(local),
            Err(ip) => ip,
        };
        let mut cached = self.cached.lock();
        // Drained before the list is read: a change after the drain stays queued for the
        // next call, so the list is never older than the last announcement seen.
        if drain(changes) {
            *cached = None;
        }
        let addresses = match &mut *cached {
            Some(addresses) => addresses,
            empty => empty.insert(interface_addresses()?),
        };
        Ok(addresses.contains(&ip))
    }
}

/// A non-blocking `NETLINK_ROUTE` socket in the IPv4 and IPv6 address groups.
fn subscribe_to_address_changes() -> io::Result<OwnedFd> {
    // SAFETY: socket() takes no pointers; the result is checked before use.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socket() just returned this fd and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_nl is plain data; all-zero is a valid value.
    let mut local: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    local.nl_family = libc::AF_NETLINK as u16;
    local.nl_groups = (libc::RTMGRP_IPV4_IFADDR | libc::RTMGRP_IPV6_IFADDR) as u32;
    // SAFETY: `local` is a valid sockaddr_nl of the length given.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&local as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Reads every announcement waiting on `socket`; true if there was any, or if some may have
/// been lost (the socket overflowed or failed).
fn drain(socket: &OwnedFd) -> bool {
    let mut changed = false;
    let mut buffer = [0u8; 8192];
    loop {
        // SAFETY: `buffer` is writable for its whole length for the duration of the call.
        let n = unsafe {
            libc::recv(
                socket.as_raw_fd(),
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n > 0 {
            changed = true;
            continue;
        }
        let error = io::Error::last_os_error();
        return match error.raw_os_error() {
            _ if n == 0 => changed,
            Some(libc::EAGAIN) => changed,
            Some(libc::EINTR) => continue,
            // ENOBUFS: announcements were dropped; anything else: assume the worst.
            _ => true,
        };
    }
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
    fn the_kept_list_answers_like_a_fresh_one() {
        let kept = HostAddresses::new();
        for ip in interface_addresses().unwrap() {
            assert!(kept.contains(&gid(ip)).unwrap(), "{ip}");
        }
        assert!(kept.contains(&gid("::1".parse().unwrap())).unwrap());
        assert!(!kept
            .contains(&gid("2001:db8::77".parse().unwrap()))
            .unwrap());
        // Twice: the second answer comes from the kept list.
        assert!(!kept
            .contains(&gid("2001:db8::77".parse().unwrap()))
            .unwrap());
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

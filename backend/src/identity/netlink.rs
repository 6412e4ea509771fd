//! [`NetdevAddresses`] over rtnetlink: `RTM_NEWADDR` / `RTM_DELADDR` on a `NETLINK_ROUTE`
//! socket for the netdev behind an RDMA port, found through sysfs.
//!
//! IPv6 addresses are added with `IFA_F_NODAD`: duplicate address detection would keep a new
//! address tentative (and out of the GID table) for a second or more, and the operator, not
//! the network, decides which guest owns which address.

use std::io;
use std::mem::size_of;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

use super::address::GuestAddress;
use super::provision::{NetdevAddresses, ProvisionError};
use crate::host::sysfs;

/// `struct nlmsghdr`.
const NLMSG_HDR_LEN: usize = 16;
/// `struct ifaddrmsg`.
const IFADDRMSG_LEN: usize = 8;
/// `struct rtattr` header.
const RTA_HDR_LEN: usize = 4;
/// `IFA_ADDRESS`, `IFA_LOCAL`, `IFA_FLAGS` (`linux/if_addr.h`).
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFA_FLAGS: u16 = 8;
/// `IFA_F_NODAD`.
const IFA_F_NODAD: u32 = 0x02;
/// Largest netlink answer read at once (a dump part is at most a page or two).
const RECV_BUFFER: usize = 32 << 10;

/// The netdev of an RDMA port, addressed by its interface index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetlinkAddresses {
    name: String,
    ifindex: u32,
}

impl NetlinkAddresses {
    /// The netdev named `name` (its index from `<sysfs>/class/net/<name>/ifindex`).
    pub fn for_netdev(sysfs_root: &Path, name: &str) -> Result<Self, String> {
        let ifindex =
            sysfs::netdev_ifindex(sysfs_root, name).map_err(|e| format!("{name}: {e}"))?;
        Ok(NetlinkAddresses {
            name: name.to_owned(),
            ifindex,
        })
    }

    /// The netdev behind `port` of RDMA device `device`: the one the port's GID entries name
    /// (`ports/<port>/gid_attrs/ndevs/*`), else the device's `parent` (rxe's netdev).
    pub fn for_port(sysfs_root: &Path, device: &str, port: u8) -> Result<Self, ProvisionError> {
        let no_netdev = |reason: String| ProvisionError::NoNetdev {
            device: device.to_owned(),
            port,
            reason,
        };
        let name = sysfs::port_netdev(sysfs_root, device, port).ok_or_else(|| {
            no_netdev(format!(
                "no GID entry names a netdev and {device} has no parent under {}",
                sysfs_root.display()
            ))
        })?;
        Self::for_netdev(sysfs_root, &name).map_err(no_netdev)
    }

    /// The interface index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The addresses the netdev has now (an `RTM_GETADDR` dump).
    pub fn addresses(&self) -> io::Result<Vec<GuestAddress>> {
        let socket = RouteSocket::open()?;
        let mut message = Message::new(libc::RTM_GETADDR, libc::NLM_F_DUMP as u16);
        message.ifaddrmsg(0, 0, 0, 0);
        let mut found = Vec::new();
        socket.transact(&message, |kind, body| {
            if kind == libc::RTM_NEWADDR {
                if let Some((index, address)) = parse_ifaddr(body) {
                    if index == self.ifindex {
                        found.push(address);
                    }
                }
            }
        })?;
        Ok(found)
    }

    fn change(&self, address: &GuestAddress, kind: u16, flags: u16) -> io::Result<()> {
        let (family, bytes): (u8, Vec<u8>) = match address.ip {
            IpAddr::V4(v4) => (libc::AF_INET as u8, v4.octets().to_vec()),
            IpAddr::V6(v6) => (libc::AF_INET6 as u8, v6.octets().to_vec()),
        };
        let mut message = Message::new(kind, flags | libc::NLM_F_ACK as u16);
        message.ifaddrmsg(family, address.prefix_len, 0, self.ifindex);
        message.attr(IFA_LOCAL, &bytes);
        message.attr(IFA_ADDRESS, &bytes);
        if address.ip.is_ipv6() && kind == libc::RTM_NEWADDR {
            message.attr(IFA_FLAGS, &IFA_F_NODAD.to_ne_bytes());
        }
        RouteSocket::open()?.transact(&message, |_, _| {})
    }
}

impl NetdevAddresses for NetlinkAddresses {
    fn netdev(&self) -> String {
        self.name.clone()
    }

    fn add(&self, address: &GuestAddress) -> Result<bool, ProvisionError> {
        let flags = (libc::NLM_F_CREATE | libc::NLM_F_EXCL) as u16;
        match self.change(address, libc::RTM_NEWADDR, flags) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => Err(ProvisionError::Netlink {
                op: "RTM_NEWADDR",
                address: address.to_string(),
                netdev: self.name.clone(),
                source: io::Error::new(
                    e.kind(),
                    format!("{e} (adding addresses needs CAP_NET_ADMIN)"),
                ),
            }),
            Err(source) => Err(ProvisionError::Netlink {
                op: "RTM_NEWADDR",
                address: address.to_string(),
                netdev: self.name.clone(),
                source,
            }),
        }
    }

    fn remove(&self, address: &GuestAddress) -> Result<(), ProvisionError> {
        match self.change(address, libc::RTM_DELADDR, 0) {
            // Already gone (removed by someone else): nothing left to do.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EADDRNOTAVAIL | libc::ENOENT)) => {
                Ok(())
            }
            Err(source) => Err(ProvisionError::Netlink {
                op: "RTM_DELADDR",
                address: address.to_string(),
                netdev: self.name.clone(),
                source,
            }),
            Ok(()) => Ok(()),
        }
    }
}

/// The interface index and address of an `RTM_NEWADDR` body.
fn parse_ifaddr(body: &[u8]) -> Option<(u32, GuestAddress)> {
    let header = body.get(..IFADDRMSG_LEN)?;
    let (family, prefix_len) = (header[0], header[1]);
    let index = u32::from_ne_bytes(header[4..8].try_into().ok()?);
    let mut local = None;
    let mut address = None;
    let mut rest = &body[IFADDRMSG_LEN..];
    while rest.len() >= RTA_HDR_LEN {
        let len = usize::from(u16::from_ne_bytes([rest[0], rest[1]]));
        let kind = u16::from_ne_bytes([rest[2], rest[3]]);
        if len < RTA_HDR_LEN || len > rest.len() {
            break;
        }
        let data = &rest[RTA_HDR_LEN..len];
        let ip = match (i32::from(family), data.len()) {
            (libc::AF_INET, 4) => Some(IpAddr::from(<[u8; 4]>::try_from(data).ok()?)),
            (libc::AF_INET6, 16) => Some(IpAddr::from(<[u8; 16]>::try_from(data).ok()?)),
            _ => None,
        };
        match kind {
            IFA_LOCAL => local = ip,
            IFA_ADDRESS => address = ip,
            _ => {}
        }
        rest = &rest[len.next_multiple_of(4).min(rest.len())..];
    }
    let ip = local.or(address)?;
    Some((index, GuestAddress { ip, prefix_len }))
}

/// A netlink request being built.
struct Message {
    bytes: Vec<u8>,
}

static SEQUENCE: AtomicU32 = AtomicU32::new(1);

impl Message {
    fn new(kind: u16, flags: u16) -> Message {
        let mut bytes = vec![0u8; NLMSG_HDR_LEN];
        bytes[4..6].copy_from_slice(&kind.to_ne_bytes());
        bytes[6..8].copy_from_slice(&(flags | libc::NLM_F_REQUEST as u16).to_ne_bytes());
        let seq = SEQUENCE.fetch_add(1, Ordering::Relaxed);
        bytes[8..12].copy_from_slice(&seq.to_ne_bytes());
        Message { bytes }
    }

    fn seq(&self) -> u32 {
        u32::from_ne_bytes(self.bytes[8..12].try_into().expect("4 bytes"))
    }

    fn ifaddrmsg(&mut self, family: u8, prefix_len: u8, scope: u8, index: u32) {
        self.bytes
            .extend_from_slice(&[family, prefix_len, 0, scope]);
        self.bytes.extend_from_slice(&index.to_ne_bytes());
    }

    fn attr(&mut self, kind: u16, data: &[u8]) {
        let len = (RTA_HDR_LEN + data.len()) as u16;
        self.bytes.extend_from_slice(&len.to_ne_bytes());
        self.bytes.extend_from_slice(&kind.to_ne_bytes());
        self.bytes.extend_from_slice(data);
        self.bytes.resize(self.bytes.len().next_multiple_of(4), 0);
    }

    fn finish(&mut self) -> &[u8] {
        let len = self.bytes.len() as u32;
        self.bytes[..4].copy_from_slice(&len.to_ne_bytes());
        &self.bytes
    }
}

/// A `NETLINK_ROUTE` socket.
struct RouteSocket {
    fd: OwnedFd,
}

impl RouteSocket {
    fn open() -> io::Result<RouteSocket> {
        // SAFETY: socket() takes no pointers; the result is checked before use.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: socket() just returned this fd and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(RouteSocket { fd })
    }

    /// Sends `message` to the kernel and hands every answer's type and body to `each` until
    /// the acknowledgement (or the end of a dump); an error answer is returned as its errno.
    fn transact(&self, message: &Message, mut each: impl FnMut(u16, &[u8])) -> io::Result<()> {
        let seq = message.seq();
        let mut message = Message {
            bytes: message.bytes.clone(),
        };
        let request = message.finish();
        // SAFETY: sockaddr_nl is plain data; all-zero is a valid value (the kernel, pid 0).
        let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: `request` and `kernel` are valid for the lengths given for the whole call.
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                request.as_ptr().cast(),
                request.len(),
                0,
                (&kernel as *const libc::sockaddr_nl).cast(),
                size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buffer = vec![0u8; RECV_BUFFER];
        loop {
            // SAFETY: `buffer` is valid for writes of its length for the whole call.
            let got = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                    0,
                )
            };
            if got < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let mut rest = &buffer[..got as usize];
            while rest.len() >= NLMSG_HDR_LEN {
                let len = u32::from_ne_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
                let kind = u16::from_ne_bytes([rest[4], rest[5]]);
                let reply_seq = u32::from_ne_bytes(rest[8..12].try_into().expect("4 bytes"));
                if len < NLMSG_HDR_LEN || len > rest.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "truncated netlink message",
                    ));
                }
                let body = &rest[NLMSG_HDR_LEN..len];
                rest = &rest[len.next_multiple_of(4).min(rest.len())..];
                if reply_seq != seq {
                    continue;
                }
                match i32::from(kind) {
                    libc::NLMSG_DONE => return Ok(()),
                    libc::NLMSG_ERROR => {
                        let errno = body
                            .get(..4)
                            .map(|b| i32::from_ne_bytes(b.try_into().expect("4 bytes")))
                            .ok_or_else(|| {
                                io::Error::new(io::ErrorKind::InvalidData, "short netlink error")
                            })?;
                        return if errno == 0 {
                            Ok(())
                        } else {
                            Err(io::Error::from_raw_os_error(-errno))
                        };
                    }
                    _ => each(kind, body),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_netns::in_private_netns;
    use std::fs;

    #[test]
    fn addresses_are_added_once_and_removed_in_a_private_namespace() {
        let outcome = in_private_netns(|| {
            let lo = NetlinkAddresses::for_netdev(Path::new("/sys"), "lo");
            // sysfs shows the namespace it was mounted in; lo is ifindex 1 everywhere.
            let lo = lo.unwrap_or(NetlinkAddresses {
                name: "lo".into(),
                ifindex: 1,
            });
            assert_eq!(lo.ifindex(), 1);
            let v6: GuestAddress = "fd00:76:72::1/64".parse().unwrap();
            let v4: GuestAddress = "10.118.114.1/24".parse().unwrap();
            for address in [v6, v4] {
                assert!(!lo.addresses().unwrap().contains(&address));
                assert!(lo.add(&address).unwrap(), "{address} added");
                assert!(!lo.add(&address).unwrap(), "{address} was there");
                assert!(lo.addresses().unwrap().contains(&address), "{address}");
                lo.remove(&address).unwrap();
                assert!(!lo.addresses().unwrap().contains(&address));
                // Removing what is gone is not an error.
                lo.remove(&address).unwrap();
            }
            let missing = NetlinkAddresses {
                name: "nothing".into(),
                ifindex: 999_999,
            };
            let e = missing.add(&v6).unwrap_err();
            assert!(
                e.to_string()
                    .contains("RTM_NEWADDR of fd00:76:72::1/64 on nothing"),
                "{e}"
            );
        });
        if outcome.is_none() {
            eprintln!("netlink address test skipped on this machine");
        }
    }

    #[test]
    fn ifaddr_bodies_parse() {
        let mut m = Message::new(libc::RTM_NEWADDR, 0);
        m.ifaddrmsg(libc::AF_INET as u8, 24, 0, 7);
        m.attr(IFA_ADDRESS, &[10, 0, 0, 255]);
        m.attr(IFA_LOCAL, &[10, 0, 0, 1]);
        m.attr(IFA_FLAGS, &0u32.to_ne_bytes());
        let body = &m.finish()[NLMSG_HDR_LEN..];
        let (index, address) = parse_ifaddr(body).unwrap();
        assert_eq!(index, 7);
        assert_eq!(address.to_string(), "10.0.0.1/24");
        assert!(parse_ifaddr(&body[..4]).is_none());
    }

    #[test]
    fn netdevs_are_found_through_gid_attrs_or_the_parent() {
        let root = std::env::temp_dir().join(format!("vrdma-netlink-{}", std::process::id()));
        let write = |rel: &str, text: &str| {
            let path = root.join(rel);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        };
        write("class/net/eth7/ifindex", "7\n");
        write("class/net/eth8/ifindex", "8\n");
        write("class/infiniband/rxe0/ports/1/gid_attrs/ndevs/0", "eth7\n");
        write("class/infiniband/rxe0/parent", "eth8\n");
        write("class/infiniband/rxe1/parent", "eth8\n");
        let found = NetlinkAddresses::for_port(&root, "rxe0", 1).unwrap();
        assert_eq!((found.netdev(), found.ifindex()), ("eth7".into(), 7));
        let found = NetlinkAddresses::for_port(&root, "rxe1", 1).unwrap();
        assert_eq!((found.netdev(), found.ifindex()), ("eth8".into(), 8));
        let e = NetlinkAddresses::for_port(&root, "rxe2", 1).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("cannot find the netdev of rxe2 port 1"),
            "{e}"
        );
        fs::remove_dir_all(&root).unwrap();
    }

    /// The host layer's kept list of local addresses (rxe's loopback test) sees the addresses
    /// identity provisioning adds and removes.
    #[test]
    fn the_hosts_kept_address_list_follows_provisioning() {
        let outcome = in_private_netns(|| {
            use crate::host::local_addresses::HostAddresses;
            use crate::identity::provision::NetdevAddresses;
            // sysfs shows the namespace it was mounted in; lo is ifindex 1 in every one.
            let lo = NetlinkAddresses::for_netdev(std::path::Path::new("/sys"), "lo").expect("lo");
            let kept = HostAddresses::new();
            // IPv4 (TEST-NET-1): announced as it is added. An IPv6 address is announced when
            // its duplicate address detection completes, which is also when the kernel
            // installs its local route, i.e. when packets to it start staying on the host.
            let address: crate::identity::GuestAddress = "192.0.2.5/24".parse().unwrap();
            let ip = std::net::Ipv4Addr::new(192, 0, 2, 5)
                .to_ipv6_mapped()
                .octets();
            assert!(!kept.contains(&ip).unwrap());
            assert!(lo.add(&address).unwrap());
            assert!(kept.contains(&ip).unwrap(), "an added address is seen");
            lo.remove(&address).unwrap();
            assert!(!kept.contains(&ip).unwrap(), "a removed one is gone");
        });
        if outcome.is_none() {
            eprintln!("address change test skipped on this machine");
        }
    }
}

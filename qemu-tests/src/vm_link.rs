//! Two rxe VMs joined by an Ethernet link: "hosts" A and B, each with its own rxe device on its
//! own netdev and its own addresses, so that RoCE packets cross a real network device (a
//! virtio-net NIC per VM) instead of rxe's loopback path.
//!
//! The link is a QEMU `dgram` netdev on each side over a pair of unix datagram sockets on the
//! host: each QEMU binds its own socket and sends its frames to the other's. No host network,
//! no IP port to race for, and the link carries exactly what the two NICs send (`tc netem` on a
//! NIC's egress inside a VM shapes one direction).
//!
//! Addressing is IPv6 link-local only: each host's NIC gets a fixed address (`fe80::a`,
//! `fe80::b`, without duplicate address detection, so it is usable at once) next to the one the
//! kernel derives from its MAC. rxe puts both into its GID table.
//!
//! This module describes the link (what QEMU and each VM's init are given); [`crate::vm_pair`]
//! boots the two VMs.

use std::path::PathBuf;

/// The NIC's name inside each VM (the init script renames it so that scenarios need not guess).
pub const LINK_NETDEV: &str = "link0";

/// The NICs' MTU: jumbo frames, so that rxe's port offers an active MTU of 4096 and both
/// path MTUs, 1024 and 4096, can be tested.
pub const LINK_MTU: u32 = 9000;

/// One of the two hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Host {
    A,
    B,
}

impl Host {
    /// Both hosts, A first.
    pub const BOTH: [Host; 2] = [Host::A, Host::B];

    /// The other end of the link.
    pub fn peer(self) -> Host {
        match self {
            Host::A => Host::B,
            Host::B => Host::A,
        }
    }

    /// Lower-case name: the VM's host name suffix and command-line spelling.
    pub fn name(self) -> &'static str {
        match self {
            Host::A => "a",
            Host::B => "b",
        }
    }

    /// The host's fixed link-local address on [`LINK_NETDEV`].
    pub fn address(self) -> &'static str {
        match self {
            Host::A => "fe80::a",
            Host::B => "fe80::b",
        }
    }

    /// The host's address with the link's scope, as tools that resolve names take it.
    pub fn scoped_address(self) -> String {
        format!("{}%{LINK_NETDEV}", self.address())
    }

    /// The MAC of the host's NIC (locally administered, unicast).
    pub fn mac(self) -> &'static str {
        match self {
            Host::A => "52:54:00:76:72:0a",
            Host::B => "52:54:00:76:72:0b",
        }
    }

    /// The link-local address the kernel derives from [`Host::mac`] (modified EUI-64): rxe's
    /// GID 0 on the host's NIC.
    pub fn mac_address(self) -> String {
        let mac: Vec<u8> = self
            .mac()
            .split(':')
            .map(|byte| u8::from_str_radix(byte, 16).expect("a fixed MAC"))
            .collect();
        format!(
            "fe80::{:x}:{:x}:{:x}:{:x}",
            u16::from_be_bytes([mac[0] ^ 2, mac[1]]),
            u16::from_be_bytes([mac[2], 0xff]),
            u16::from_be_bytes([0xfe, mac[3]]),
            u16::from_be_bytes([mac[4], mac[5]])
        )
    }

    /// Parses [`Host::name`].
    pub fn parse(name: &str) -> Option<Host> {
        Host::BOTH.into_iter().find(|h| h.name() == name)
    }
}

/// A VM's end of the link.
#[derive(Debug, Clone)]
pub struct LinkEnd {
    pub host: Host,
    /// The unix datagram socket this VM's QEMU binds.
    pub local_socket: PathBuf,
    /// The peer QEMU's socket, where this VM's frames go.
    pub peer_socket: PathBuf,
}

impl LinkEnd {
    /// The QEMU arguments of the NIC on this end.
    pub fn qemu_args(&self) -> Vec<String> {
        vec![
            "-netdev".into(),
            format!(
                "dgram,id=link,local.type=unix,local.path={},remote.type=unix,remote.path={}",
                self.local_socket.display(),
                self.peer_socket.display()
            ),
            "-device".into(),
            format!("virtio-net-pci,netdev=link,mac={}", self.host.mac()),
        ]
    }

    /// Shell function `link_setup` of the VM's init: loads the NIC's driver, names the NIC
    /// [`LINK_NETDEV`], gives it the host's address and brings it up. Duplicate address
    /// detection is off (the addresses are fixed and distinct), so they are usable at once.
    ///
    /// The peer's addresses get permanent neighbour entries, as with static ARP: the kernel
    /// resolves a RoCE destination's MAC through the neighbour table (at MODIFY_QP to RTR and
    /// when it sends), and neighbour discovery over a link that a test makes lossy would
    /// otherwise fail a connection by chance.
    pub fn init_function(&self) -> String {
        format!(
            r#"link_setup() {{
    echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad &&
    echo 1 > /proc/sys/net/ipv6/conf/default/keep_addr_on_down &&
    modprobe virtio_net || return 1
    nic=""
    for _ in $(seq 100); do
        for dev in /sys/class/net/*; do
            [ -e "$dev/device" ] && nic=$(basename "$dev") && break
        done
        [ -n "$nic" ] && break
        sleep 0.1
    done
    [ -n "$nic" ] || {{ echo "no NIC appeared"; return 1; }}
    ip link set "$nic" name {LINK_NETDEV} &&
    ip link set {LINK_NETDEV} mtu {LINK_MTU} &&
    ip link set {LINK_NETDEV} up &&
    ip -6 addr add {address}/64 dev {LINK_NETDEV} nodad &&
    ip -6 neigh replace {peer} lladdr {peer_mac} dev {LINK_NETDEV} nud permanent &&
    ip -6 neigh replace {peer_eui64} lladdr {peer_mac} dev {LINK_NETDEV} nud permanent
}}
"#,
            address = self.host.address(),
            peer = self.host.peer().address(),
            peer_mac = self.host.peer().mac(),
            peer_eui64 = self.host.peer().mac_address(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_two_ends_point_at_each_other() {
        let end = |host: Host| LinkEnd {
            host,
            local_socket: PathBuf::from(format!("/t/{}.sock", host.name())),
            peer_socket: PathBuf::from(format!("/t/{}.sock", host.peer().name())),
        };
        let a = end(Host::A).qemu_args().join(" ");
        let b = end(Host::B).qemu_args().join(" ");
        assert!(
            a.contains("local.path=/t/a.sock,remote.type=unix,remote.path=/t/b.sock"),
            "{a}"
        );
        assert!(
            b.contains("local.path=/t/b.sock,remote.type=unix,remote.path=/t/a.sock"),
            "{b}"
        );
        assert_ne!(Host::A.mac(), Host::B.mac());
        assert!(end(Host::B)
            .init_function()
            .contains("fe80::b/64 dev link0 nodad"));
        assert_eq!(Host::parse("b"), Some(Host::B));
        assert_eq!(Host::A.scoped_address(), "fe80::a%link0");
        assert_eq!(Host::B.mac_address(), "fe80::5054:ff:fe76:720b");
        let setup = end(Host::A).init_function();
        assert!(
            setup.contains("neigh replace fe80::5054:ff:fe76:720b lladdr 52:54:00:76:72:0b"),
            "{setup}"
        );
    }
}

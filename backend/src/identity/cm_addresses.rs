//! Which addresses a guest's connection-manager ids may bind, resolve from and aim at (spec
//! §7.5 and §12.1): a tenant binds and sends from its own addresses only; a guest sharing the
//! host's identity from the host's addresses that are no tenant's; a wildcard never reaches
//! the host while it could spread over a tenant's address; a loopback address is the guest
//! itself (its own address, [`CmAddressRules::own_address`]), never the host's loopback, which
//! would reach every guest's and the host's listeners; link-local scopes name the RDMA netdev,
//! whatever the guest's interface numbers are.

use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use super::address::GuestAddress;

/// Why an address is not the guest's to use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmAddressError {
    /// A tenant named an address that is not one of its own.
    #[error("{0} is not an address of this guest")]
    NotOwn(IpAddr),
    /// A guest sharing the host's identity named a tenant's address.
    #[error("{0} is a tenant's address")]
    TenantAddress(IpAddr),
    /// A tenant's wildcard with no single address of the family to stand for it.
    #[error("a wildcard needs exactly one address of its family; the guest has {count}")]
    AmbiguousWildcard {
        /// The guest's addresses of that family.
        count: usize,
    },
    /// A host guest's wildcard would also take connections aimed at the tenants' addresses.
    #[error("a wildcard address while the daemon serves tenants")]
    WildcardBesideTenants,
    /// A destination no connection may aim at from a guest.
    #[error("destination {0} is a wildcard, multicast or broadcast address")]
    BadDestination(IpAddr),
    /// No address the guest may send from has the destination's family (and scope).
    #[error("no source address of this guest for {0}")]
    NoSource(IpAddr),
}

/// The address rules of one guest.
pub struct CmAddressRules<'a> {
    /// The guest's addresses; empty when it shares the host's identity.
    pub addresses: &'a [GuestAddress],
    /// For a guest sharing the host's identity: the addresses of the host port (its GID
    /// table) that are no tenant's: the only ones it may bind, and the sources the device
    /// picks for it. (The host's other addresses, on other netdevs or RDMA devices, are not
    /// the port's.)
    pub host_sources: &'a [IpAddr],
    /// Whether an address is one of the daemon's tenants' (given in canonical form: IPv4
    /// as IPv4; compare GIDs, `address_gid`, to be safe).
    pub is_tenant_address: &'a dyn Fn(&IpAddr) -> bool,
    /// Whether the daemon serves any tenant.
    pub tenants_present: bool,
    /// The RDMA netdev's interface index on the host (the scope of link-local addresses).
    pub netdev_ifindex: u32,
}

impl CmAddressRules<'_> {
    /// The host address a bind to `requested` binds (its port kept). IPv4-mapped IPv6
    /// addresses are judged as the IPv4 address they are.
    pub fn bind(&self, requested: SocketAddr) -> Result<SocketAddr, CmAddressError> {
        let ip = requested.ip().to_canonical();
        let chosen = if ip.is_loopback() {
            self.own_address(ip)?
        } else if self.addresses.is_empty() {
            if ip.is_unspecified() {
                if self.tenants_present {
                    return Err(CmAddressError::WildcardBesideTenants);
                }
            } else if ip.is_multicast() {
                // Not an address of the RDMA netdev: the host would pick a device itself.
                return Err(CmAddressError::NotOwn(ip));
            }
            if (self.is_tenant_address)(&ip) {
                return Err(CmAddressError::TenantAddress(ip));
            }
            if !ip.is_unspecified() && !self.host_sources.contains(&ip) {
                return Err(CmAddressError::NotOwn(ip));
            }
            ip
        } else if ip.is_unspecified() {
            let same: Vec<IpAddr> = self
                .addresses
                .iter()
                .map(|a| a.ip)
                .filter(|a| a.is_ipv4() == ip.is_ipv4())
                .collect();
            match same.as_slice() {
                [one] => *one,
                _ => return Err(CmAddressError::AmbiguousWildcard { count: same.len() }),
            }
        } else if self.addresses.iter().any(|a| a.ip == ip) {
            ip
        } else {
            return Err(CmAddressError::NotOwn(ip));
        };
        Ok(self.scoped(chosen, requested.port()))
    }

    /// The source and the destination of an address resolution from `src` (`None`: the
    /// device picks one of the guest's, never the host's route: it could pick an address of
    /// another netdev or a tenant's) to `dst`.
    pub fn resolve(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
    ) -> Result<(SocketAddr, SocketAddr), CmAddressError> {
        let mut to = dst.ip().to_canonical();
        let broadcast = matches!(to, std::net::IpAddr::V4(v4) if v4.is_broadcast());
        if to.is_unspecified() || to.is_multicast() || broadcast {
            return Err(CmAddressError::BadDestination(to));
        }
        let loopback = to.is_loopback();
        if loopback {
            to = self.own_address(to)?;
        }
        let destination = self.scoped(to, dst.port());
        let source = match src {
            Some(src) => self.bind(src)?,
            // The guest talking to itself: from the address it reaches.
            None if loopback => self.scoped(to, 0),
            None => {
                let candidates: Vec<IpAddr> = if self.addresses.is_empty() {
                    self.host_sources.to_vec()
                } else {
                    self.addresses.iter().map(|a| a.ip).collect()
                };
                let ip = pick_source(&candidates, to).ok_or(CmAddressError::NoSource(to))?;
                self.scoped(ip, 0)
            }
        };
        Ok((source, destination))
    }

    /// The guest's own address that a loopback address (`like`) stands for: its first address
    /// (a guest sharing the host's identity: the port's first that is no tenant's) of
    /// `like`'s family, else its first of any family (the kernel, too, binds a loopback id to a
    /// device whatever addresses it has). Binds and resolutions map a loopback address alike,
    /// so the guest's loopback listeners and connections meet.
    pub fn own_address(&self, like: IpAddr) -> Result<IpAddr, CmAddressError> {
        let own: Vec<IpAddr> = if self.addresses.is_empty() {
            self.host_sources
                .iter()
                .copied()
                .filter(|ip| !(self.is_tenant_address)(ip))
                .collect()
        } else {
            self.addresses.iter().map(|a| a.ip).collect()
        };
        own.iter()
            .copied()
            .find(|ip| ip.is_ipv4() == like.is_ipv4())
            .or_else(|| own.first().copied())
            .ok_or(CmAddressError::NoSource(like))
    }

    /// `ip` and `port` as a host socket address: link-local IPv6 scoped to the RDMA netdev.
    fn scoped(&self, ip: IpAddr, port: u16) -> SocketAddr {
        match ip {
            IpAddr::V4(v4) => SocketAddrV4::new(v4, port).into(),
            IpAddr::V6(v6) => {
                let scope = if is_link_local(&v6) {
                    self.netdev_ifindex
                } else {
                    0
                };
                SocketAddrV6::new(v6, port, 0, scope).into()
            }
        }
    }
}

/// A source for `to` among `candidates`: of its family, link-local for a link-local
/// destination and not for another, in the order given.
fn pick_source(candidates: &[IpAddr], to: IpAddr) -> Option<IpAddr> {
    let wants_link_local = matches!(to, IpAddr::V6(v6) if is_link_local(&v6));
    candidates.iter().copied().find(|c| match (c, to) {
        (IpAddr::V4(_), IpAddr::V4(_)) => true,
        (IpAddr::V6(c), IpAddr::V6(_)) => is_link_local(c) == wants_link_local,
        _ => false,
    })
}

fn is_link_local(ip: &Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

#[cfg(test)]
mod tests {
    use super::*;

    const NETDEV: u32 = 7;

    fn addresses(texts: &[&str]) -> Vec<GuestAddress> {
        texts.iter().map(|t| t.parse().unwrap()).collect()
    }

    fn sock(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    fn tenant_b(ip: &IpAddr) -> bool {
        *ip == "fe80::b:1".parse::<IpAddr>().unwrap()
    }

    fn rules<'a>(
        addresses: &'a [GuestAddress],
        host_sources: &'a [IpAddr],
        tenants_present: bool,
    ) -> CmAddressRules<'a> {
        CmAddressRules {
            addresses,
            host_sources,
            is_tenant_address: &tenant_b,
            tenants_present,
            netdev_ifindex: NETDEV,
        }
    }

    #[test]
    fn a_tenant_binds_only_its_own_addresses_with_the_netdevs_scope() {
        let own = addresses(&["fe80::a:1", "192.0.2.10"]);
        let r = rules(&own, &[], true);
        assert_eq!(
            r.bind(sock("[fe80::a:1%3]:18515")),
            Ok(sock("[fe80::a:1%7]:18515"))
        );
        assert_eq!(r.bind(sock("192.0.2.10:1")), Ok(sock("192.0.2.10:1")));
        // Its single address of a family stands for the wildcard.
        assert_eq!(r.bind(sock("[::]:5")), Ok(sock("[fe80::a:1%7]:5")));
        assert_eq!(r.bind(sock("0.0.0.0:0")), Ok(sock("192.0.2.10:0")));
        // Anyone else's address, the host's included.
        for other in ["[fe80::b:1%3]:1", "[fe80::1%3]:1", "192.0.2.11:1"] {
            let ip = sock(other).ip();
            assert_eq!(
                r.bind(sock(other)),
                Err(CmAddressError::NotOwn(ip)),
                "{other}"
            );
        }
        let two = addresses(&["fe80::a:1", "fe80::a:2"]);
        assert_eq!(
            rules(&two, &[], true).bind(sock("[::]:5")),
            Err(CmAddressError::AmbiguousWildcard { count: 2 })
        );
    }

    #[test]
    fn a_host_guest_binds_the_hosts_addresses_but_no_tenants() {
        let port: Vec<IpAddr> = vec!["fe80::1".parse().unwrap(), "192.0.2.1".parse().unwrap()];
        let r = rules(&[], &port, true);
        assert_eq!(r.bind(sock("[fe80::1%2]:9")), Ok(sock("[fe80::1%7]:9")));
        assert_eq!(
            r.bind(sock("[fe80::b:1]:9")),
            Err(CmAddressError::TenantAddress(sock("[fe80::b:1]:9").ip()))
        );
        assert_eq!(
            r.bind(sock("[::]:9")),
            Err(CmAddressError::WildcardBesideTenants)
        );
        // Without tenants the host's wildcard is the guest's.
        assert_eq!(
            rules(&[], &port, false).bind(sock("[::]:9")),
            Ok(sock("[::]:9"))
        );
        // An address of the host that is not the port's (another netdev, another device).
        assert_eq!(
            r.bind(sock("198.51.100.7:9")),
            Err(CmAddressError::NotOwn(sock("198.51.100.7:9").ip()))
        );
        assert_eq!(r.bind(sock("192.0.2.1:9")), Ok(sock("192.0.2.1:9")));
        // Multicast is no address of the RDMA netdev, in either form.
        for other in ["[ff02::1]:1", "[::ffff:224.0.0.1]:1"] {
            assert!(r.bind(sock(other)).is_err(), "{other}");
        }
        // An IPv4-mapped form of a tenant's address is that address.
        let v4_tenant = |ip: &IpAddr| *ip == "192.0.2.10".parse::<IpAddr>().unwrap();
        let r = CmAddressRules {
            is_tenant_address: &v4_tenant,
            ..rules(&[], &port, true)
        };
        assert!(r.bind(sock("[::ffff:192.0.2.10]:1")).is_err());
    }

    #[test]
    fn the_source_of_a_resolution_is_always_the_guests() {
        let own = addresses(&["2001:db8::a", "fe80::a:1", "192.0.2.10"]);
        let r = rules(&own, &[], true);
        let (src, dst) = r.resolve(None, sock("[fe80::c:1%4]:18515")).unwrap();
        assert_eq!(src, sock("[fe80::a:1%7]:0"), "link-local for link-local");
        assert_eq!(dst, sock("[fe80::c:1%7]:18515"), "the netdev's scope");
        let (src, _) = r.resolve(None, sock("[2001:db8::99]:1")).unwrap();
        assert_eq!(src, sock("[2001:db8::a]:0"));
        let (src, _) = r.resolve(None, sock("198.51.100.1:1")).unwrap();
        assert_eq!(src, sock("192.0.2.10:0"));
        // A given source follows the bind rules.
        assert!(r
            .resolve(Some(sock("[fe80::b:1]:0")), sock("[fe80::c:1]:1"))
            .is_err());
        // Wildcard, multicast and broadcast destinations are nobody's to aim at.
        for bad in [
            "[::]:1",
            "0.0.0.0:1",
            "[ff02::1]:1",
            "255.255.255.255:1",
            "[::ffff:255.255.255.255]:1",
        ] {
            assert_eq!(
                r.resolve(None, sock(bad)),
                Err(CmAddressError::BadDestination(
                    sock(bad).ip().to_canonical()
                ))
            );
        }
        // A tenant with no address of the destination's family cannot reach it.
        let v6 = addresses(&["fe80::a:1"]);
        assert_eq!(
            rules(&v6, &[], true).resolve(None, sock("198.51.100.1:1")),
            Err(CmAddressError::NoSource(sock("198.51.100.1:1").ip()))
        );
    }

    #[test]
    fn a_host_guest_gets_a_source_of_the_port_chosen_for_it() {
        let host: Vec<IpAddr> = vec!["fe80::1".parse().unwrap()];
        for tenants in [true, false] {
            let (src, _) = rules(&[], &host, tenants)
                .resolve(None, sock("[fe80::c:1]:1"))
                .unwrap();
            assert_eq!(src, sock("[fe80::1%7]:0"), "never the host's route");
        }
        assert_eq!(
            rules(&[], &host, false).resolve(None, sock("198.51.100.1:1")),
            Err(CmAddressError::NoSource(sock("198.51.100.1:1").ip()))
        );
    }

    #[test]
    fn loopback_is_the_guest_itself_never_the_hosts() {
        // A tenant: its own address of the family, else its first.
        let own = addresses(&["fe80::a:1", "192.0.2.10"]);
        let r = rules(&own, &[], true);
        assert_eq!(r.bind(sock("127.0.0.1:7")), Ok(sock("192.0.2.10:7")));
        assert_eq!(
            r.bind(sock("[::ffff:127.0.0.9]:7")),
            Ok(sock("192.0.2.10:7"))
        );
        assert_eq!(r.bind(sock("[::1]:7")), Ok(sock("[fe80::a:1%7]:7")));
        let v6 = addresses(&["fe80::a:1"]);
        assert_eq!(
            rules(&v6, &[], true).bind(sock("127.0.0.1:0")),
            Ok(sock("[fe80::a:1%7]:0"))
        );
        // A resolution to loopback aims at the address a loopback bind listens on, from it.
        assert_eq!(
            r.resolve(None, sock("127.0.0.1:7")),
            Ok((sock("192.0.2.10:0"), sock("192.0.2.10:7")))
        );
        assert_eq!(
            rules(&v6, &[], true).resolve(None, sock("127.0.0.1:7")),
            Ok((sock("[fe80::a:1%7]:0"), sock("[fe80::a:1%7]:7")))
        );
        // A guest sharing the host's identity: the port's first address that is no tenant's.
        let port: Vec<IpAddr> = vec!["fe80::b:1".parse().unwrap(), "fe80::1".parse().unwrap()];
        let host = rules(&[], &port, true);
        assert_eq!(host.bind(sock("[::1]:9")), Ok(sock("[fe80::1%7]:9")));
        assert_eq!(
            host.resolve(None, sock("127.0.0.1:9")),
            Ok((sock("[fe80::1%7]:0"), sock("[fe80::1%7]:9")))
        );
        // No address at all: nothing stands for loopback.
        assert_eq!(
            rules(&[], &[], false).bind(sock("127.0.0.1:1")),
            Err(CmAddressError::NoSource(sock("127.0.0.1:1").ip()))
        );
    }
}

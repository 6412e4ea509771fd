//! A guest's RDMA addresses and name: parsing, checking, and the RoCE GID of an address.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// Longest guest name (it appears in logs and derives the guest's GUID).
pub const MAX_NAME_LEN: usize = 64;

/// One RDMA address of a guest: an IP address of the host device's netdev, with the prefix
/// length it is added with (`/128` or `/32` when not given).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GuestAddress {
    /// The address; its GID is itself (IPv6) or `::ffff:a.b.c.d` (IPv4).
    pub ip: IpAddr,
    /// Prefix length of the address on the netdev.
    pub prefix_len: u8,
}

/// Why an address, prefix or name is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// Not an IP address (with an optional `/len`).
    #[error("{0:?} is not an IPv6 or IPv4 address (optionally with /prefix-length)")]
    Address(String),
    /// The prefix length is too long for the address family.
    #[error("prefix length {len} of {text:?} is over {max}")]
    PrefixLength {
        /// The text given.
        text: String,
        /// Its prefix length.
        len: u32,
        /// The family's longest.
        max: u8,
    },
    /// An address no guest may own (unspecified, multicast, loopback).
    #[error("{0} cannot be a guest's RDMA address (unspecified, loopback or multicast)")]
    Unusable(IpAddr),
    /// A guest name that is empty, too long or has other characters than `[A-Za-z0-9._-]`.
    #[error("guest name {0:?} must be 1..=64 characters of A-Z a-z 0-9 . _ -")]
    Name(String),
    /// An IPv4-mapped IPv6 address: its GID is the IPv4 address's.
    #[error("{0} is an IPv4-mapped IPv6 address: give the IPv4 address")]
    Mapped(IpAddr),
    /// The same address twice in one guest.
    #[error("address {0} is given twice")]
    Duplicate(IpAddr),
    /// A value outside its range (traffic class, service level).
    #[error("{what} {value} is out of range 0..={max}")]
    OutOfRange {
        /// What the value is.
        what: &'static str,
        /// The value.
        value: u32,
        /// The largest allowed.
        max: u32,
    },
}

/// Splits `text` at `/` into an address and a prefix length no longer than the family's.
pub(crate) fn parse_ip_and_len(text: &str) -> Result<(IpAddr, Option<u8>), IdentityError> {
    let (ip_text, len_text) = match text.split_once('/') {
        Some((ip, len)) => (ip, Some(len)),
        None => (text, None),
    };
    let ip = IpAddr::from_str(ip_text.trim()).map_err(|_| IdentityError::Address(text.into()))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len = match len_text {
        None => None,
        Some(len) => {
            let len: u32 = len
                .trim()
                .parse()
                .map_err(|_| IdentityError::Address(text.into()))?;
            if len > u32::from(max) {
                return Err(IdentityError::PrefixLength {
                    text: text.into(),
                    len,
                    max,
                });
            }
            Some(len as u8)
        }
    };
    Ok((ip, len))
}

impl GuestAddress {
    /// The GID of this address in a RoCE GID table.
    pub fn gid(&self) -> [u8; 16] {
        address_gid(self.ip)
    }
}

impl FromStr for GuestAddress {
    type Err = IdentityError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (ip, len) = parse_ip_and_len(text)?;
        if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() {
            return Err(IdentityError::Unusable(ip));
        }
        if let IpAddr::V6(v6) = ip {
            if v6.to_ipv4_mapped().is_some() {
                return Err(IdentityError::Mapped(ip));
            }
        }
        let prefix_len = len.unwrap_or(if ip.is_ipv4() { 32 } else { 128 });
        Ok(GuestAddress { ip, prefix_len })
    }
}

impl fmt::Display for GuestAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.ip, self.prefix_len)
    }
}

/// The RoCE GID of an IP address: the IPv6 address itself, or the IPv4-mapped IPv6 address
/// (`::ffff:a.b.c.d`), as the kernel fills the GID table from a netdev's addresses.
pub fn address_gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V6(v6) => v6.octets(),
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
    }
}

/// Checks a guest name: 1..=[`MAX_NAME_LEN`] characters of `[A-Za-z0-9._-]`.
pub fn check_name(name: &str) -> Result<(), IdentityError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(IdentityError::Name(name.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_with_default_prefix_lengths() {
        let a: GuestAddress = "fe80::a:1".parse().unwrap();
        assert_eq!(a.prefix_len, 128);
        assert_eq!(a.to_string(), "fe80::a:1/128");
        let b: GuestAddress = "192.0.2.7/24".parse().unwrap();
        assert_eq!(b.prefix_len, 24);
        assert_eq!(
            b.gid(),
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 7]
        );
        assert!(matches!(
            "192.0.2.7/33".parse::<GuestAddress>(),
            Err(IdentityError::PrefixLength { len: 33, .. })
        ));
        for bad in ["", "fe80::g", "10.0.0.1/x", "10.0.0.1/"] {
            assert!(matches!(
                bad.parse::<GuestAddress>(),
                Err(IdentityError::Address(_))
            ));
        }
        assert!(matches!(
            "::ffff:10.0.0.1".parse::<GuestAddress>(),
            Err(IdentityError::Mapped(_))
        ));
        for unusable in ["::", "::1", "ff02::1", "127.0.0.1", "0.0.0.0", "224.0.0.1"] {
            assert!(matches!(
                unusable.parse::<GuestAddress>(),
                Err(IdentityError::Unusable(_))
            ));
        }
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("tenant-a.1_x").is_ok());
        for bad in ["", "a b", "a/b", "é", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}

//! A guest's traffic policy: the traffic classes and service levels its address vectors may
//! carry, and optionally the destination prefixes they may name (spec §12).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use super::address::{address_gid, parse_ip_and_len, IdentityError};

/// A set of small values (traffic classes 0..=255, service levels 0..=15) as a bitmap.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ValueSet {
    bits: [u64; 4],
    max: u8,
}

impl ValueSet {
    /// Every value from 0 to `max`.
    pub const fn all(max: u8) -> ValueSet {
        let mut bits = [0u64; 4];
        let mut i = 0;
        while i <= max as usize {
            bits[i / 64] |= 1 << (i % 64);
            i += 1;
        }
        ValueSet { bits, max }
    }

    /// No value (the range is still `0..=max`).
    pub const fn none(max: u8) -> ValueSet {
        ValueSet { bits: [0; 4], max }
    }

    /// Adds `value`; `what` names the set in the error for a value above `max`.
    pub fn insert(&mut self, value: u32, what: &'static str) -> Result<(), IdentityError> {
        if value > u32::from(self.max) {
            return Err(IdentityError::OutOfRange {
                what,
                value,
                max: self.max.into(),
            });
        }
        self.bits[value as usize / 64] |= 1 << (value % 64);
        Ok(())
    }

    /// The set of `values`, each checked against `0..=max`.
    pub fn of(
        values: impl IntoIterator<Item = u32>,
        max: u8,
        what: &'static str,
    ) -> Result<ValueSet, IdentityError> {
        let mut set = ValueSet::none(max);
        for value in values {
            set.insert(value, what)?;
        }
        Ok(set)
    }

    /// Whether `value` is in the set.
    pub fn contains(&self, value: u8) -> bool {
        self.bits[usize::from(value) / 64] & (1 << (value % 64)) != 0
    }

    /// Whether every value of the range is in the set.
    pub fn is_all(&self) -> bool {
        *self == ValueSet::all(self.max)
    }

    fn iter(&self) -> impl Iterator<Item = u8> + '_ {
        (0..=self.max).filter(|v| self.contains(*v))
    }
}

impl fmt::Debug for ValueSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_all() {
            return write!(f, "0..={}", self.max);
        }
        f.debug_set().entries(self.iter()).finish()
    }
}

/// Parses a list such as `0,32,96-103` into a set of values in `0..=max`.
pub fn parse_value_list(text: &str, max: u8, what: &'static str) -> Result<ValueSet, String> {
    let mut set = ValueSet::none(max);
    for item in text.split(',').map(str::trim) {
        let parse = |t: &str| {
            t.trim()
                .parse::<u32>()
                .map_err(|_| format!("{what}: {item:?} is not a number or a range a-b"))
        };
        let (first, last) = match item.split_once('-') {
            Some((a, b)) => (parse(a)?, parse(b)?),
            None => (parse(item)?, parse(item)?),
        };
        if first > last {
            return Err(format!("{what}: empty range {item:?}"));
        }
        for value in first..=last.min(u32::from(max) + 1) {
            set.insert(value, what).map_err(|e| e.to_string())?;
        }
    }
    Ok(set)
}

/// An IPv6 or IPv4 prefix (`fd00::/64`, `10.1.0.0/16`); a bare address is a host prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpPrefix {
    /// The prefix's address (bits past `len` are ignored).
    pub addr: IpAddr,
    /// Prefix length in bits.
    pub len: u8,
}

impl IpPrefix {
    /// Whether a destination GID lies in this prefix. IPv4 prefixes match IPv4-mapped GIDs
    /// (RoCE v2 over IPv4) only, compared as the mapped IPv6 prefix `::ffff:a.b.c.d/(96+len)`.
    pub fn contains_gid(&self, gid: &[u8; 16]) -> bool {
        let (prefix, bits) = match self.addr {
            IpAddr::V6(_) => (address_gid(self.addr), u32::from(self.len)),
            IpAddr::V4(_) => (address_gid(self.addr), 96 + u32::from(self.len)),
        };
        let whole = (bits / 8) as usize;
        if gid[..whole] != prefix[..whole] {
            return false;
        }
        let rest = bits % 8;
        rest == 0 || {
            let mask = 0xffu8 << (8 - rest);
            gid[whole] & mask == prefix[whole] & mask
        }
    }
}

impl FromStr for IpPrefix {
    type Err = IdentityError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (addr, len) = parse_ip_and_len(text)?;
        let len = len.unwrap_or(if addr.is_ipv4() { 32 } else { 128 });
        Ok(IpPrefix { addr, len })
    }
}

impl fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// Largest traffic class (8 bits).
pub const MAX_TRAFFIC_CLASS: u8 = 255;
/// Largest service level (4 bits).
pub const MAX_SERVICE_LEVEL: u8 = 15;

/// What a guest's address vectors (QP paths and AHs) may contain besides its own source
/// addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrafficPolicy {
    /// Allowed `traffic_class` values (all by default).
    pub traffic_classes: ValueSet,
    /// Allowed `sl` values (all by default).
    pub service_levels: ValueSet,
    /// Destinations the guest may reach; `None` for anywhere.
    pub destinations: Option<Vec<IpPrefix>>,
}

impl Default for TrafficPolicy {
    fn default() -> Self {
        TrafficPolicy {
            traffic_classes: ValueSet::all(MAX_TRAFFIC_CLASS),
            service_levels: ValueSet::all(MAX_SERVICE_LEVEL),
            destinations: None,
        }
    }
}

/// Which rule of a [`TrafficPolicy`] an address vector breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyViolation {
    /// The traffic class is not allowed.
    TrafficClass(u8),
    /// The service level is not allowed.
    ServiceLevel(u8),
    /// The destination is in no allowed prefix.
    Destination([u8; 16]),
}

impl TrafficPolicy {
    /// Whether the policy allows everything.
    pub fn is_open(&self) -> bool {
        *self == TrafficPolicy::default()
    }

    /// Checks an address vector's traffic class, service level and destination GID.
    pub fn check(&self, traffic_class: u8, sl: u8, dgid: &[u8; 16]) -> Result<(), PolicyViolation> {
        if !self.traffic_classes.contains(traffic_class) {
            return Err(PolicyViolation::TrafficClass(traffic_class));
        }
        if sl > MAX_SERVICE_LEVEL || !self.service_levels.contains(sl) {
            return Err(PolicyViolation::ServiceLevel(sl));
        }
        if let Some(prefixes) = &self.destinations {
            if !prefixes.iter().any(|p| p.contains_gid(dgid)) {
                return Err(PolicyViolation::Destination(*dgid));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid(text: &str) -> [u8; 16] {
        address_gid(text.parse().unwrap())
    }

    #[test]
    fn prefixes_match_ipv6_and_mapped_ipv4_gids() {
        let v6: IpPrefix = "fd00:1::/33".parse().unwrap();
        assert!(v6.contains_gid(&gid("fd00:1::5")));
        assert!(v6.contains_gid(&gid("fd00:1:7fff::1")));
        assert!(!v6.contains_gid(&gid("fd00:1:8000::1")));
        let v4: IpPrefix = "10.1.0.0/16".parse().unwrap();
        assert!(v4.contains_gid(&gid("10.1.200.3")));
        assert!(!v4.contains_gid(&gid("10.2.0.1")));
        // An IPv4 prefix never matches an IPv6 GID with the same bytes elsewhere.
        let mut not_mapped = gid("10.1.0.1");
        not_mapped[10] = 0;
        assert!(!v4.contains_gid(&not_mapped));
        let host: IpPrefix = "fe80::1".parse().unwrap();
        assert_eq!(host.len, 128);
        assert!(host.contains_gid(&gid("fe80::1")));
        assert!(!host.contains_gid(&gid("fe80::2")));
        let any: IpPrefix = "::/0".parse().unwrap();
        assert!(any.contains_gid(&gid("10.0.0.1")));
    }

    #[test]
    fn value_lists_parse_ranges_and_refuse_out_of_range() {
        let set = parse_value_list("0, 32,96-98", MAX_TRAFFIC_CLASS, "traffic class").unwrap();
        assert!(set.contains(0) && set.contains(32) && set.contains(97));
        assert!(!set.contains(1) && !set.contains(99));
        assert_eq!(format!("{set:?}"), "{0, 32, 96, 97, 98}");
        assert!(parse_value_list("16", MAX_SERVICE_LEVEL, "SL")
            .unwrap_err()
            .contains("16 is out of range 0..=15"));
        assert!(parse_value_list("3-1", MAX_SERVICE_LEVEL, "SL").is_err());
        assert!(parse_value_list("x", MAX_SERVICE_LEVEL, "SL").is_err());
        assert!(parse_value_list("0-15", MAX_SERVICE_LEVEL, "SL")
            .unwrap()
            .is_all());
    }

    #[test]
    fn policy_checks_each_rule() {
        let policy = TrafficPolicy {
            traffic_classes: ValueSet::of([0, 96], MAX_TRAFFIC_CLASS, "tc").unwrap(),
            service_levels: ValueSet::of([3], MAX_SERVICE_LEVEL, "sl").unwrap(),
            destinations: Some(vec!["fd00::/64".parse().unwrap()]),
        };
        let ok = gid("fd00::9");
        assert_eq!(policy.check(96, 3, &ok), Ok(()));
        assert_eq!(
            policy.check(1, 3, &ok),
            Err(PolicyViolation::TrafficClass(1))
        );
        assert_eq!(
            policy.check(0, 4, &ok),
            Err(PolicyViolation::ServiceLevel(4))
        );
        let far = gid("fd01::9");
        assert_eq!(
            policy.check(0, 3, &far),
            Err(PolicyViolation::Destination(far))
        );
        assert!(TrafficPolicy::default().is_open());
        assert_eq!(TrafficPolicy::default().check(255, 15, &far), Ok(()));
        assert_eq!(
            TrafficPolicy::default().check(0, 16, &far),
            Err(PolicyViolation::ServiceLevel(16))
        );
    }
}

//! Port and addressing values: port states, GIDs and their types, address-vector limits.

use std::fmt;
use std::net::Ipv6Addr;

verbs_enum! {
    /// Port states (`ibv_port_state`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum PortState: u32 {
        /// No state change.
        Nop = 0,
        /// Down.
        Down = 1,
        /// Initializing.
        Init = 2,
        /// Armed.
        Armed = 3,
        /// Active.
        Active = 4,
        /// Active, deferring (`IB_PORT_ACTIVE_DEFER`).
        ActiveDefer = 5,
    }
}

/// A GID, in network byte order as in `union ibv_gid`.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The raw bytes.
    pub const fn raw(&self) -> &[u8; 16] {
        &self.0
    }

    /// True for the all-zero GID (an empty table entry).
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(addr: Ipv6Addr) -> Self {
        Gid(addr.octets())
    }
}

impl From<Gid> for Ipv6Addr {
    fn from(gid: Gid) -> Self {
        Ipv6Addr::from(gid.0)
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Ipv6Addr::from(self.0).fmt(f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

verbs_enum! {
    /// GID types (`ibv_gid_type`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum GidType: u32 {
        /// InfiniBand GID.
        Ib = 0,
        /// RoCE v1.
        RoceV1 = 1,
        /// RoCE v2 (UDP encapsulated); what rxe reports.
        RoceV2 = 2,
    }
}

/// `static_rate` upper bound (`IBV_RATE_1200_GBPS`); 0 means "port rate".
pub const MAX_STATIC_RATE: u8 = 24;
/// Maximum value of a 20-bit IPv6 flow label.
pub const MAX_FLOW_LABEL: u32 = 0x000f_ffff;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_and_port_states_convert_both_ways_and_refuse_others() {
        for t in [GidType::Ib, GidType::RoceV1, GidType::RoceV2] {
            assert_eq!(GidType::try_from(t as u32), Ok(t));
        }
        assert_eq!(GidType::RoceV2 as u32, 2);
        assert_eq!(GidType::try_from(3), Err(3));
        use PortState::*;
        for (raw, state) in [Nop, Down, Init, Armed, Active, ActiveDefer]
            .into_iter()
            .enumerate()
        {
            assert_eq!(state as u32, raw as u32);
            assert_eq!(PortState::try_from(raw as u32), Ok(state));
        }
        assert_eq!(PortState::try_from(6), Err(6));
    }
}

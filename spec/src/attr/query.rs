//! Device, port and GID-table attributes: typed getters on [`crate::wire::DeviceAttr`], [`crate::wire::PortAttr`] and [`crate::wire::GidEntry`].
//!
//! The wire structs are the one Rust form of these attributes: the device fills them, the
//! driver hands them to its users, and the drop-in library converts them to rdma-core's C
//! structs. Raw fields stay public (their values are those of `<infiniband/verbs.h>`); the
//! getters here name the values that have a type.

use std::borrow::Cow;

use crate::verbs::{GidType, Mtu, PortState};
use crate::wire::{DeviceAttr, GidEntry, GidTableEntry, PortAttr, GID_FLAG_VALID};
use crate::Le32;

impl DeviceAttr {
    /// The firmware version: the bytes before the first NUL, invalid UTF-8 replaced.
    pub fn fw_ver(&self) -> Cow<'_, str> {
        let len = self
            .fw_ver
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.fw_ver.len());
        String::from_utf8_lossy(&self.fw_ver[..len])
    }

    /// The `fw_ver` field for `name`: its first 63 bytes, NUL-padded (the terminating NUL is
    /// always kept).
    pub fn encode_fw_ver(name: &str) -> [u8; 64] {
        let mut field = [0u8; 64];
        let len = name.len().min(field.len() - 1);
        field[..len].copy_from_slice(&name.as_bytes()[..len]);
        field
    }
}

impl PortAttr {
    /// The port state, or the raw value if it is not an `ibv_port_state`.
    pub fn state(&self) -> Result<PortState, u32> {
        PortState::try_from(self.state.get())
    }

    /// True if the port is ACTIVE.
    pub fn is_active(&self) -> bool {
        self.state() == Ok(PortState::Active)
    }

    /// The active MTU, if it is a defined value.
    pub fn active_mtu(&self) -> Option<Mtu> {
        Mtu::try_from(self.active_mtu.get()).ok()
    }
}

impl GidTableEntry {
    /// Entry `index` of a table.
    pub fn new(index: u32, entry: &GidEntry) -> GidTableEntry {
        GidTableEntry {
            index: index.into(),
            gid: entry.gid,
            gid_type: entry.gid_type,
            flags: entry.flags,
        }
    }

    /// The QUERY_GID entry this one carries.
    pub fn entry(&self) -> GidEntry {
        GidEntry {
            gid: self.gid,
            gid_type: self.gid_type,
            flags: self.flags,
        }
    }
}

impl GidEntry {
    /// The answer for an empty table slot: no `VALID` flag, every byte zero.
    pub const EMPTY: GidEntry = GidEntry {
        gid: [0; 16],
        gid_type: Le32::ZERO,
        flags: Le32::ZERO,
    };

    /// A populated entry.
    pub fn valid(gid: [u8; 16], gid_type: GidType) -> GidEntry {
        GidEntry {
            gid,
            gid_type: Le32::new(gid_type as u32),
            flags: Le32::new(GID_FLAG_VALID),
        }
    }

    /// True if the entry is populated ([`GID_FLAG_VALID`]).
    pub fn is_valid(&self) -> bool {
        self.flags.get() & GID_FLAG_VALID != 0
    }

    /// The GID type, or the raw value if it is not one.
    pub fn gid_type(&self) -> Result<GidType, u32> {
        GidType::try_from(self.gid_type.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromZeros;

    #[test]
    fn fw_ver_is_nul_terminated_and_truncated_to_63_bytes() {
        let mut attr = DeviceAttr::new_zeroed();
        attr.fw_ver = DeviceAttr::encode_fw_ver("1.2.3");
        assert_eq!(&attr.fw_ver[..6], b"1.2.3\0");
        assert_eq!(attr.fw_ver(), "1.2.3");

        let long = "x".repeat(100);
        attr.fw_ver = DeviceAttr::encode_fw_ver(&long);
        assert_eq!(attr.fw_ver[63], 0, "the NUL is kept");
        assert_eq!(attr.fw_ver(), long[..63]);

        // Without any NUL (a device that filled every byte), all 64 bytes count.
        attr.fw_ver = [b'7'; 64];
        assert_eq!(attr.fw_ver().len(), 64);
        // Invalid UTF-8 is replaced, not refused.
        attr.fw_ver = DeviceAttr::encode_fw_ver("");
        attr.fw_ver[0] = 0xff;
        assert_eq!(attr.fw_ver(), "\u{fffd}");
    }

    #[test]
    fn port_state_and_mtu_are_typed() {
        let mut port = PortAttr::new_zeroed();
        port.state = Le32::new(PortState::Active as u32);
        port.active_mtu = Le32::new(3);
        assert!(port.is_active());
        assert_eq!(port.state(), Ok(PortState::Active));
        assert_eq!(port.active_mtu(), Some(Mtu::Mtu1024));

        port.state = Le32::new(PortState::Down as u32);
        port.active_mtu = Le32::new(9);
        assert!(!port.is_active());
        assert_eq!(port.active_mtu(), None);
        port.state = Le32::new(77);
        assert_eq!(port.state(), Err(77));
        assert!(!port.is_active());
    }

    #[test]
    fn gid_entries_carry_their_type_and_validity() {
        let gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let entry = GidEntry::valid(gid, GidType::RoceV2);
        assert!(entry.is_valid());
        assert_eq!(entry.gid, gid);
        assert_eq!(entry.gid_type(), Ok(GidType::RoceV2));
        assert_eq!(entry.gid_type.get(), 2);
        assert_eq!(entry.flags.get(), GID_FLAG_VALID);

        assert!(!GidEntry::EMPTY.is_valid());
        assert_eq!(GidEntry::EMPTY, GidEntry::new_zeroed());

        let mut odd = entry;
        odd.gid_type = Le32::new(5);
        assert_eq!(odd.gid_type(), Err(5));
    }
}

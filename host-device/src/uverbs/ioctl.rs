//! The uverbs `ioctl()` ABI (`include/uapi/rdma/rdma_user_ioctl_cmds.h`; the header, attribute
//! and send kick are defined once in [`vrdma_spec::rxe_v1::kick`], which drivers use too), for
//! the send kick and for the one method the write ABI has no equivalent of: `UVERBS_METHOD_QUERY_GID_TABLE` (Linux 5.10), which returns
//! every populated GID entry of the device in one call. sysfs has one file per slot (1024 on
//! rxe), and reading them all cost ~80 ms per connection-manager bind under TCG.
//!
//! One call is `struct ib_uverbs_ioctl_hdr` followed by `num_attrs` `struct ib_uverbs_attr`;
//! `length` counts both. An attribute carries an inline value (constants and flags of up to 8
//! bytes) or a pointer to a buffer and its length (outputs); the kernel marks the outputs it
//! wrote with `UVERBS_ATTR_F_VALID_OUTPUT`.

use vrdma_spec::verbs::GidType;
use vrdma_spec::wire::GidEntry;

use super::framing::{abi_layout, abi_struct};

pub use vrdma_spec::rxe_v1::kick::{
    IoctlAttr, IoctlHdr, DRIVER_RXE, OBJECT_DEVICE, RDMA_VERBS_IOCTL,
};

/// `UVERBS_METHOD_QUERY_GID_TABLE`.
pub const METHOD_QUERY_GID_TABLE: u16 = 5;
/// `UVERBS_METHOD_QUERY_GID_ENTRY`.
pub const METHOD_QUERY_GID_ENTRY: u16 = 6;
/// `UVERBS_ATTR_QUERY_GID_TABLE_*`.
pub mod gid_table_attr {
    pub const ENTRY_SIZE: u16 = 0;
    pub const FLAGS: u16 = 1;
    pub const RESP_ENTRIES: u16 = 2;
    pub const RESP_NUM_ENTRIES: u16 = 3;
}
/// `enum uverbs_attrs_query_gid_entry_cmd_attr_ids`.
pub mod gid_entry_attr {
    pub const PORT: u16 = 0;
    pub const GID_INDEX: u16 = 1;
    pub const FLAGS: u16 = 2;
    pub const RESP_ENTRY: u16 = 3;
}

abi_struct! {
    /// `struct ib_uverbs_gid_entry`.
    pub struct GidTableEntry {
        pub gid: [u8; 16],
        pub gid_index: u32,
        pub port_num: u32,
        pub gid_type: u32,
        pub netdev_ifindex: u32,
    }
}
abi_layout!(GidTableEntry, 32, gid @ 0, gid_index @ 16, port_num @ 20, gid_type @ 24,
    netdev_ifindex @ 28);

impl GidTableEntry {
    /// The entry in the device's terms; `None` for a GID type the spec has no name for.
    pub fn to_entry(&self) -> Option<GidEntry> {
        let gid_type = match self.gid_type {
            0 => GidType::Ib,
            1 => GidType::RoceV1,
            2 => GidType::RoceV2,
            _ => return None,
        };
        Some(GidEntry::valid(self.gid, gid_type))
    }
}

/// One call of a method of the device object with four attributes (the header and the
/// attributes, as the kernel reads them): QUERY_GID_TABLE and QUERY_GID_ENTRY.
#[repr(C)]
#[derive(Debug, Clone, Copy, zerocopy::IntoBytes, zerocopy::Immutable)]
pub struct DeviceMethodCall {
    pub hdr: IoctlHdr,
    pub attrs: [IoctlAttr; 4],
}
abi_layout!(DeviceMethodCall, 88, hdr @ 0, attrs @ 24);

impl DeviceMethodCall {
    fn new(method_id: u16, driver_id: u32, attrs: [IoctlAttr; 4]) -> DeviceMethodCall {
        DeviceMethodCall {
            hdr: IoctlHdr {
                length: size_of::<DeviceMethodCall>() as u16,
                object_id: OBJECT_DEVICE,
                method_id,
                num_attrs: 4,
                driver_id,
                ..IoctlHdr::default()
            },
            attrs,
        }
    }

    /// QUERY_GID_TABLE to a device of driver `driver_id`, the entries written to `entries`
    /// (room for `capacity`) and their count to the `u64` at `count`. `None` when the buffer's
    /// length does not fit the ABI's 16-bit length.
    pub fn query_gid_table(
        driver_id: u32,
        entries: u64,
        capacity: usize,
        count: u64,
    ) -> Option<DeviceMethodCall> {
        let len = u16::try_from(capacity.checked_mul(size_of::<GidTableEntry>())?).ok()?;
        Some(DeviceMethodCall::new(
            METHOD_QUERY_GID_TABLE,
            driver_id,
            [
                IoctlAttr::inline(
                    gid_table_attr::ENTRY_SIZE,
                    8,
                    size_of::<GidTableEntry>() as u64,
                ),
                IoctlAttr::inline(gid_table_attr::FLAGS, 4, 0),
                IoctlAttr::buffer(gid_table_attr::RESP_ENTRIES, entries, len),
                IoctlAttr::buffer(gid_table_attr::RESP_NUM_ENTRIES, count, 8),
            ],
        ))
    }

    /// QUERY_GID_ENTRY to a device of driver `driver_id` for entry `index` of `port`,
    /// answered into the [`GidTableEntry`] at `entry`.
    pub fn query_gid_entry(driver_id: u32, port: u8, index: u32, entry: u64) -> DeviceMethodCall {
        DeviceMethodCall::new(
            METHOD_QUERY_GID_ENTRY,
            driver_id,
            // Port and index are "const" attributes, which the kernel takes as 8-byte values
            // whatever their type (UVERBS_ATTR_CONST_IN is a u64 pointer attribute).
            [
                IoctlAttr::inline(gid_entry_attr::PORT, 8, port.into()),
                IoctlAttr::inline(gid_entry_attr::GID_INDEX, 8, index.into()),
                IoctlAttr::inline(gid_entry_attr::FLAGS, 4, 0),
                IoctlAttr::buffer(
                    gid_entry_attr::RESP_ENTRY,
                    entry,
                    size_of::<GidTableEntry>() as u16,
                ),
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    #[test]
    fn a_query_names_its_buffers_and_counts_itself() {
        let call = DeviceMethodCall::query_gid_table(DRIVER_RXE, 0x1000, 64, 0x2000).unwrap();
        let bytes = call.as_bytes();
        assert_eq!(bytes.len(), 88);
        assert_eq!(u16::from_ne_bytes([bytes[0], bytes[1]]), 88, "length");
        assert_eq!((call.hdr.method_id, call.hdr.driver_id), (5, 14));
        assert_eq!(call.attrs[0].data, 32, "entry size");
        assert_eq!(
            (call.attrs[2].data, call.attrs[2].len),
            (0x1000, 64 * 32),
            "entries"
        );
        assert_eq!((call.attrs[3].data, call.attrs[3].len), (0x2000, 8));
        assert!(call
            .attrs
            .iter()
            .all(|a| a.flags == vrdma_spec::rxe_v1::kick::ATTR_F_MANDATORY));
        // 2048 entries of 32 bytes do not fit a 16-bit length.
        assert!(DeviceMethodCall::query_gid_table(DRIVER_RXE, 0x1000, 2048, 0x2000).is_none());
    }
}

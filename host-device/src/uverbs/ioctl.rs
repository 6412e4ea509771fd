//! The uverbs `ioctl()` ABI (`include/uapi/rdma/rdma_user_ioctl_cmds.h`), for the one method the
//! write ABI has no equivalent of: `UVERBS_METHOD_QUERY_GID_TABLE` (Linux 5.10), which returns
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

/// `RDMA_VERBS_IOCTL`: `_IOWR(0x1b, 1, struct ib_uverbs_ioctl_hdr)`.
pub const RDMA_VERBS_IOCTL: u64 = ioc_readwrite(0x1b, 1, size_of::<IoctlHdr>());

const fn ioc_readwrite(kind: u64, nr: u64, size: usize) -> u64 {
    // _IOC(_IOC_READ|_IOC_WRITE, type, nr, size) on x86, arm64, riscv (the generic layout).
    (3 << 30) | ((size as u64) << 16) | (kind << 8) | nr
}

/// `RDMA_DRIVER_RXE` (`enum rdma_driver_id`): the kernel refuses a call whose header names
/// another driver than the device's (EINVAL).
pub const DRIVER_RXE: u32 = 14;

/// `UVERBS_OBJECT_DEVICE`.
pub const OBJECT_DEVICE: u16 = 0;
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
/// `UVERBS_ATTR_F_MANDATORY`.
/// `enum uverbs_attrs_query_gid_entry_cmd_attr_ids`.
pub mod gid_entry_attr {
    pub const PORT: u16 = 0;
    pub const GID_INDEX: u16 = 1;
    pub const FLAGS: u16 = 2;
    pub const RESP_ENTRY: u16 = 3;
}

pub const ATTR_F_MANDATORY: u16 = 1;

abi_struct! {
    /// `struct ib_uverbs_ioctl_hdr` (the attributes follow it).
    pub struct IoctlHdr {
        pub length: u16,
        pub object_id: u16,
        pub method_id: u16,
        pub num_attrs: u16,
        pub reserved1: u64,
        pub driver_id: u32,
        pub reserved2: u32,
    }
}
abi_layout!(IoctlHdr, 24, length @ 0, object_id @ 2, method_id @ 4, num_attrs @ 6,
    reserved1 @ 8, driver_id @ 16, reserved2 @ 20);

abi_struct! {
    /// `struct ib_uverbs_attr`: `data` is the value itself (inline) or a user address.
    pub struct IoctlAttr {
        pub attr_id: u16,
        pub len: u16,
        pub flags: u16,
        pub attr_data: u16,
        pub data: u64,
    }
}
abi_layout!(IoctlAttr, 16, attr_id @ 0, len @ 2, flags @ 4, attr_data @ 6, data @ 8);

impl IoctlAttr {
    /// A mandatory inline input of `len` bytes.
    pub fn inline(attr_id: u16, len: u16, value: u64) -> IoctlAttr {
        IoctlAttr {
            attr_id,
            len,
            flags: ATTR_F_MANDATORY,
            attr_data: 0,
            data: value,
        }
    }

    /// A mandatory output buffer at `address` of `len` bytes.
    pub fn output(attr_id: u16, address: u64, len: u16) -> IoctlAttr {
        IoctlAttr {
            attr_id,
            len,
            flags: ATTR_F_MANDATORY,
            attr_data: 0,
            data: address,
        }
    }
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
                IoctlAttr::output(gid_table_attr::RESP_ENTRIES, entries, len),
                IoctlAttr::output(gid_table_attr::RESP_NUM_ENTRIES, count, 8),
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
                IoctlAttr::output(
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
    fn the_ioctl_number_is_the_kernels() {
        // _IOWR(0x1b, 1, 24 bytes), as the C headers compute it (layout_tests compare too).
        assert_eq!(RDMA_VERBS_IOCTL, 0xc018_1b01);
    }

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
        assert!(call.attrs.iter().all(|a| a.flags == ATTR_F_MANDATORY));
        // 2048 entries of 32 bytes do not fit a 16-bit length.
        assert!(DeviceMethodCall::query_gid_table(DRIVER_RXE, 0x1000, 2048, 0x2000).is_none());
    }
}

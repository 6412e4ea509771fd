//! GID queries: `ibv_query_gid`, `ibv_query_gid_type` (the IBVERBS_PRIVATE_34 symbol
//! `ibv_devinfo` imports), `_ibv_query_gid_ex` and `_ibv_query_gid_table`, all answered from
//! the context's GID table cache ([`vrdma::Context::gid_table`]): a port's table is read whole
//! (QUERY_PORT, then QUERY_GID_TABLE, six populated entries per command) and kept until an
//! event makes it out of date or its lifetime runs out, so that walking rxe's 1024 indices, as
//! `ibv_devinfo -v` does twice per port, costs a few commands instead of 2048.
//!
//! Freshness: the context's event thread ([`crate::events`]) reads every device event through
//! the verbs library, which drops the cached table of the event's port (GID_CHANGE,
//! PORT_ACTIVE, PORT_ERR; every port on DEVICE_FATAL or lost events) as the event leaves the
//! device, before it is queued for `ibv_get_async_event`: a program that receives
//! `IBV_EVENT_GID_CHANGE` and then queries gets the new table. A change whose event has not
//! been read yet is seen at most one cache lifetime late ([`crate::config::GID_CACHE_VAR`]).
//!
//! Empty entries below the port's `gid_tbl_len` answer as rdma-core 44 answers for them:
//! `ibv_query_gid` the zero GID, `ibv_query_gid_type` type 0 (IB/RoCE v1), both with
//! success; `_ibv_query_gid_ex` ENODATA. An index at or beyond `gid_tbl_len` is EINVAL, as
//! the kernel's GID query reports it.

use std::ffi::{c_int, c_uint};
use std::mem::size_of;

use vrdma::spec::verbs::GidType;
use vrdma::verbs::GidEntry;
use vrdma::Context;

use crate::context::VrdmaContext;
use crate::ffi::{guard, minus_one, report};
use crate::sys::{
    ibv_context, ibv_gid, ibv_gid_entry, ibv_gid_type_IBV_GID_TYPE_IB,
    ibv_gid_type_IBV_GID_TYPE_ROCE_V1, ibv_gid_type_IBV_GID_TYPE_ROCE_V2,
};

/// What a port's GID table holds at one index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GidSlot {
    /// A populated entry: valid, with a known GID type.
    Populated(GidEntry),
    /// An index of the table with no GID.
    Empty,
    /// Not an index of the table (at or beyond `gid_tbl_len`).
    OutOfRange,
}

/// GID `index` of `port` from the context's cache; an errno value (reported for `verb`) if
/// the table could not be read.
pub(crate) fn gid_slot(ctx: &Context, port: u8, index: u32, verb: &str) -> Result<GidSlot, c_int> {
    let table = ctx.gid_table(port).map_err(|e| report(verb, &e))?;
    Ok(match table.entry(index) {
        Some(entry) => GidSlot::Populated(*entry),
        None if index < table.len() => GidSlot::Empty,
        None => GidSlot::OutOfRange,
    })
}

/// `ibv_gid_type` of a populated entry (whose type the verbs library checked, so the raw
/// value is only a fallback that cannot occur).
pub(crate) fn gid_type_value(entry: &GidEntry) -> u32 {
    match entry.gid_type() {
        Ok(GidType::Ib) => ibv_gid_type_IBV_GID_TYPE_IB,
        Ok(GidType::RoceV1) => ibv_gid_type_IBV_GID_TYPE_ROCE_V1,
        Ok(GidType::RoceV2) => ibv_gid_type_IBV_GID_TYPE_ROCE_V2,
        Err(raw) => raw,
    }
}

/// `ibv_query_gid`: 0 (an empty entry reads as the zero GID, as in rdma-core), or -1 and
/// errno.
///
/// # Safety
/// `context` is a context of this library; `gid` is valid for a write.
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    guard("ibv_query_gid", -1, || {
        // SAFETY: caller contract.
        let Some(ctx) = (unsafe { VrdmaContext::from_ptr(context) }) else {
            return minus_one(libc::EINVAL);
        };
        let Ok(index) = u32::try_from(index) else {
            return minus_one(libc::EINVAL);
        };
        if gid.is_null() {
            return minus_one(libc::EINVAL);
        }
        let raw = match gid_slot(&ctx.ctx, port_num, index, "ibv_query_gid") {
            Ok(GidSlot::Populated(entry)) => entry.gid,
            Ok(GidSlot::Empty) => [0; 16],
            Ok(GidSlot::OutOfRange) => return minus_one(libc::EINVAL),
            Err(errno) => return minus_one(errno),
        };
        // SAFETY: caller contract; ibv_gid is a 16-byte union.
        unsafe { gid.write(ibv_gid { raw }) };
        0
    })
}

/// `_ibv_query_gid_ex` (behind the inline `ibv_query_gid_ex`): 0, ENODATA for an empty entry,
/// or another errno value.
///
/// # Safety
/// `context` is a context of this library; `entry` is valid for `entry_size` bytes.
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    guard("_ibv_query_gid_ex", libc::EIO, || {
        // SAFETY: caller contract.
        let Some(ctx) = (unsafe { VrdmaContext::from_ptr(context) }) else {
            return libc::EINVAL;
        };
        let Ok(port) = u8::try_from(port_num) else {
            return libc::EINVAL;
        };
        if flags != 0 || entry.is_null() || entry_size < size_of::<ibv_gid_entry>() {
            return libc::EINVAL;
        }
        match gid_slot(&ctx.ctx, port, gid_index, "_ibv_query_gid_ex") {
            Ok(GidSlot::Populated(found)) => {
                // SAFETY: caller contract.
                unsafe { entry.write(gid_entry(port, gid_index, &found)) };
                0
            }
            Ok(GidSlot::Empty) => libc::ENODATA,
            Ok(GidSlot::OutOfRange) => libc::EINVAL,
            Err(errno) => errno,
        }
    })
}

/// `ibv_query_gid_type` (IBVERBS_PRIVATE_34, used by `ibv_devinfo`): the sysfs GID type,
/// 0 for IB/RoCE v1 (and, as rdma-core answers, for an empty entry), 1 for RoCE v2. 0, or -1
/// and errno.
///
/// # Safety
/// `context` is a context of this library; `gid_type` is valid for a write.
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port_num: u8,
    index: c_uint,
    gid_type: *mut c_uint,
) -> c_int {
    guard("ibv_query_gid_type", -1, || {
        // SAFETY: caller contract.
        let Some(ctx) = (unsafe { VrdmaContext::from_ptr(context) }) else {
            return minus_one(libc::EINVAL);
        };
        if gid_type.is_null() {
            return minus_one(libc::EINVAL);
        }
        let sysfs = match gid_slot(&ctx.ctx, port_num, index, "ibv_query_gid_type") {
            Ok(GidSlot::Populated(found)) => u32::from(found.gid_type() == Ok(GidType::RoceV2)),
            Ok(GidSlot::Empty) => 0,
            Ok(GidSlot::OutOfRange) => return minus_one(libc::EINVAL),
            Err(errno) => return minus_one(errno),
        };
        // SAFETY: caller contract.
        unsafe { gid_type.write(sysfs) };
        0
    })
}

/// The `ibv_gid_entry` of a populated entry.
fn gid_entry(port: u8, index: u32, entry: &GidEntry) -> ibv_gid_entry {
    ibv_gid_entry {
        gid: ibv_gid { raw: entry.gid },
        gid_index: index,
        port_num: port.into(),
        gid_type: gid_type_value(entry),
        // No netdev in this process's view of the device.
        ndev_ifindex: 0,
    }
}

/// Where the entries of every port go: `max_entries` slots of `entry_size` bytes; more
/// populated entries than slots is `EINVAL`, as in rdma-core.
fn collect<T: AsRef<[(u32, GidEntry)]>>(
    ports: impl IntoIterator<Item = (u8, T)>,
    max_entries: usize,
    mut write: impl FnMut(usize, ibv_gid_entry),
) -> Result<usize, i32> {
    let mut count = 0;
    for (port, table) in ports {
        for (index, entry) in table.as_ref() {
            if count == max_entries {
                return Err(libc::EINVAL);
            }
            write(count, gid_entry(port, *index, entry));
            count += 1;
        }
    }
    Ok(count)
}

/// `_ibv_query_gid_table` (IBVERBS_1.11, behind the inline `ibv_query_gid_table`): the number
/// of entries written, or a negative errno value (`-EINVAL` for flags, a short `entry_size`,
/// or more populated entries than `max_entries`).
///
/// # Safety
/// `context` is a context of this library; `entries` is valid for `max_entries` entries of
/// `entry_size` bytes each.
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    let minus = |errno: i32| -(errno as isize);
    guard("_ibv_query_gid_table", minus(libc::EIO), || {
        // SAFETY: caller contract.
        let Some(ctx) = (unsafe { VrdmaContext::from_ptr(context) }) else {
            return minus(libc::EINVAL);
        };
        if flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
            return minus(libc::EINVAL);
        }
        if max_entries != 0 && entries.is_null() {
            return minus(libc::EINVAL);
        }
        let num_ports = u8::try_from(ctx.ctx.config().num_ports.get()).unwrap_or(u8::MAX);
        let mut tables = Vec::with_capacity(num_ports.into());
        for port in 1..=num_ports {
            match ctx.ctx.gid_table(port) {
                Ok(table) => tables.push((port, table)),
                Err(e) => return minus(report("_ibv_query_gid_table", &e)),
            }
        }
        let populated = tables
            .iter()
            .map(|(port, table)| (*port, table.populated()));
        let written = collect(populated, max_entries, |slot, entry| {
            // SAFETY: slot < max_entries; the caller's array has that many entries of
            // `entry_size` bytes, each at least an ibv_gid_entry (checked), maybe unaligned
            // for a larger, odd entry size.
            unsafe {
                entries
                    .cast::<u8>()
                    .add(slot * entry_size)
                    .cast::<ibv_gid_entry>()
                    .write_unaligned(entry)
            }
        });
        match written {
            Ok(n) => n as isize,
            Err(errno) => minus(errno),
        }
    })
}

#[cfg(test)]
mod cache_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_types_convert_to_ibv_gid_type() {
        let gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        for (t, c) in [
            (GidType::Ib, ibv_gid_type_IBV_GID_TYPE_IB),
            (GidType::RoceV1, ibv_gid_type_IBV_GID_TYPE_ROCE_V1),
            (GidType::RoceV2, ibv_gid_type_IBV_GID_TYPE_ROCE_V2),
        ] {
            assert_eq!(gid_type_value(&GidEntry::valid(gid, t)), c);
        }
    }

    #[test]
    fn entries_of_every_port_fill_the_slots_in_order() {
        let table = |n: u8| {
            vec![
                (0, GidEntry::valid([n; 16], GidType::RoceV2)),
                (3, GidEntry::valid([n + 1; 16], GidType::RoceV1)),
            ]
        };
        let mut out = Vec::new();
        let n = collect([(1, table(1)), (2, table(5))], 4, |slot, e| {
            out.push((slot, e.port_num, e.gid_index, e.gid_type))
        })
        .unwrap();
        assert_eq!(n, 4);
        assert_eq!(
            out,
            [(0, 1, 0, 2), (1, 1, 3, 1), (2, 2, 0, 2), (3, 2, 3, 1)],
            "IBV_GID_TYPE_ROCE_V2 is 2, _ROCE_V1 1"
        );
        assert_eq!(collect([(1, table(1))], 1, |_, _| {}), Err(libc::EINVAL));
        assert_eq!(collect([(1, Vec::new())], 0, |_, _| {}), Ok(0));
    }
}

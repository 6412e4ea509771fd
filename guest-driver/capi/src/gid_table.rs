//! `_ibv_query_gid_table`: the populated GID entries of every port, read with
//! QUERY_GID_TABLE (a few commands per port instead of one per index).

use std::mem::size_of;

use vrdma::verbs::GidEntry;

use crate::context::VrdmaContext;
use crate::ffi::{guard, report};
use crate::query::gid_type_value;
use crate::sys::{ibv_context, ibv_gid, ibv_gid_entry};

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
fn collect(
    ports: impl IntoIterator<Item = (u8, Vec<(u32, GidEntry)>)>,
    max_entries: usize,
    mut write: impl FnMut(usize, ibv_gid_entry),
) -> Result<usize, i32> {
    let mut count = 0;
    for (port, table) in ports {
        for (index, entry) in &table {
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
            match ctx.ctx.query_gid_table(port) {
                Ok(table) => tables.push((port, table)),
                Err(e) => return minus(report("_ibv_query_gid_table", &e)),
            }
        }
        let written = collect(tables, max_entries, |slot, entry| {
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
mod tests {
    use super::*;
    use vrdma::verbs::GidType;

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

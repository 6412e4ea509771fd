//! QUERY_DEVICE, QUERY_PORT, QUERY_GID, QUERY_GID_TABLE and QUERY_PKEY (spec §7.4): the host's
//! kernel answers turned into the guest's wire answers, with the guest's quotas applied and
//! only what belongs to the guest shown: its own GID table and GUIDs when it has an identity,
//! never host-wide counters.

use vrdma_spec::features::{VRDMA_F_MW, VRDMA_F_SRQ, VRDMA_F_UD};
use vrdma_spec::rxe_v1::{recv_wqe_size, send_wqe_size, SGE_SIZE};
use vrdma_spec::wire::{
    DeviceAttr, GidEntry, GidTableEntry, GidTableResp, PkeyEntry, PortAttr, QueryPortReq,
    QueryTableReq, GID_TABLE_BATCH, GID_TABLE_END,
};
use vrdma_spec::{Le16, Le32, Le64, ResponseBody};
use zerocopy::FromZeros;

use super::error::CommandError;
use super::rings::predicted_len;
use super::session::{host_err, CommandResult, Session};
use crate::guest::shared::{GuestShared, GUEST_PORT};
use crate::host::uverbs::{QueryDeviceResp, QueryPortResp};

/// `IB_LINK_LAYER_ETHERNET`.
const LINK_LAYER_ETHERNET: u8 = 2;
/// The P_Key of a RoCE port: the default, full-membership key (IBTA Annex A16/A17).
const DEFAULT_PKEY: u16 = 0xffff;

/// `device_cap_flags` (`IB_DEVICE_*`) the device may pass on: none of memory windows, XRC,
/// QP resize, ODP, memory-management extensions or alternate paths (spec §7.4).
const PASSED_CAP_FLAGS: u32 = (1 << 1) // BAD_PKEY_CNTR
    | (1 << 2) // BAD_QKEY_CNTR
    | (1 << 7) // CURR_QP_STATE_MOD
    | (1 << 10) // PORT_ACTIVE_EVENT
    | (1 << 11) // SYS_IMAGE_GUID
    | (1 << 12) // RC_RNR_NAK_GEN
    | SRQ_RESIZE_CAP // RESIZE_SRQ
    | (1 << 14); // N_NOTIFY_CQ

/// `IB_DEVICE_SRQ_RESIZE`: without it on the host, RESIZE_SRQ is `UNSUPPORTED` (spec §7.4).
pub(crate) const SRQ_RESIZE_CAP: u32 = 1 << 13;

/// `device_cap_flags` passed on only with `VRDMA_F_MW`: `IB_DEVICE_MEM_WINDOW` and
/// `IB_DEVICE_MEM_WINDOW_TYPE_2B`, as rxe reports them.
const MW_CAP_FLAGS: u32 = (1 << 17) | (1 << 24);

/// Largest inline send: rxe's `RXE_MAX_INLINE_DATA` is its largest WQE minus the WQE header,
/// i.e. the room of `max_sge` SGEs.
pub(crate) fn max_inline_data(attr: &QueryDeviceResp) -> u32 {
    attr.max_sge.saturating_mul(SGE_SIZE as u32)
}

/// The deepest queue offered to a guest: at most `host_max_wr`, and at most the largest
/// `2^k - 1` work requests whose rxe buffer (slots for entries of `entry_bytes`) takes no more
/// than a quarter of the guest's queue region of `region_bytes`. Every host queue buffer is
/// one extent of that region (spec §9): a QP at the advertised limits then fits in half of it,
/// where rxe's own limits (2^20 WRs) could not be placed in any region.
pub(crate) fn region_max_wr(region_bytes: u64, host_max_wr: u32, entry_bytes: usize) -> u32 {
    let budget = region_bytes / 4;
    let mut slots: u32 = 2;
    while let Some(next) = slots.checked_mul(2) {
        match predicted_len(next, entry_bytes) {
            Some(len) if len <= budget => slots = next,
            _ => break,
        }
    }
    host_max_wr.min(slots - 1)
}

/// The guest's node and system-image GUIDs, given the host device's attributes: a guest with
/// addresses is a node of its own; without, it is the host's node. The kernel's `__be64`
/// GUIDs: their bytes in memory are the wire's network order.
pub(crate) fn node_guids(guest: &GuestShared, host: &QueryDeviceResp) -> ([u8; 8], [u8; 8]) {
    let identity = &guest.options().identity;
    if identity.has_addresses() {
        (identity.guid(), identity.guid())
    } else {
        (
            host.node_guid.to_ne_bytes(),
            host.sys_image_guid.to_ne_bytes(),
        )
    }
}

/// QUERY_DEVICE: host attributes, every count capped by this guest's quota.
pub(crate) fn query_device(s: &mut Session<'_>) -> CommandResult {
    let host = s.host().query_device().map_err(host_err("QUERY_DEVICE"))?;
    let q = &s.guest.options().quotas;
    let srq = s.features & VRDMA_F_SRQ != 0;
    let ud = s.features & VRDMA_F_UD != 0;
    let mw = s.features & VRDMA_F_MW != 0;
    let only_if = |on: bool, v: u32| if on { v } else { 0 };
    let (node_guid, sys_image_guid) = node_guids(s.guest, &host);
    let region = s.guest.options().shm_size;
    let qp_entry =
        send_wqe_size(host.max_sge, max_inline_data(&host)).max(recv_wqe_size(host.max_sge));
    let srq_entry = recv_wqe_size(host.max_srq_sge);
    let attr = DeviceAttr {
        fw_ver: DeviceAttr::encode_fw_ver(&s.guest.device().info().fw_ver),
        node_guid,
        sys_image_guid,
        max_mr_size: Le64::new(super::mr::max_mr_size(s.guest)),
        page_size_cap: Le64::new(host.page_size_cap),
        max_mr_bytes: Le64::new(q.mr_bytes),
        vendor_id: Le32::new(host.vendor_id),
        vendor_part_id: Le32::new(host.vendor_part_id),
        hw_ver: Le32::new(host.hw_ver),
        device_cap_flags: Le32::new(
            host.device_cap_flags & (PASSED_CAP_FLAGS | if mw { MW_CAP_FLAGS } else { 0 }),
        ),
        max_qp: Le32::new(host.max_qp.min(q.qps)),
        max_qp_wr: Le32::new(region_max_wr(region, host.max_qp_wr, qp_entry)),
        max_sge: Le32::new(host.max_sge),
        max_sge_rd: Le32::new(host.max_sge_rd),
        max_cq: Le32::new(host.max_cq.min(q.cqs)),
        max_cqe: Le32::new(host.max_cqe),
        max_mr: Le32::new(host.max_mr.min(q.mrs)),
        max_pd: Le32::new(host.max_pd.min(q.pds)),
        max_qp_rd_atom: Le32::new(host.max_qp_rd_atom),
        max_qp_init_rd_atom: Le32::new(host.max_qp_init_rd_atom),
        max_res_rd_atom: Le32::new(host.max_res_rd_atom),
        atomic_cap: Le32::new(host.atomic_cap),
        max_ah: Le32::new(only_if(ud, host.max_ah.min(q.ahs))),
        max_srq: Le32::new(only_if(srq, host.max_srq.min(q.srqs))),
        max_srq_wr: Le32::new(only_if(
            srq,
            region_max_wr(region, host.max_srq_wr, srq_entry),
        )),
        max_srq_sge: Le32::new(only_if(srq, host.max_srq_sge)),
        max_inline_data: Le32::new(max_inline_data(&host)),
        max_pkeys: Le16::new(host.max_pkeys),
        local_ca_ack_delay: host.local_ca_ack_delay,
        phys_port_cnt: GUEST_PORT,
    };
    Ok(ResponseBody::QueryDevice(attr))
}

/// The host port behind a guest port number, `INVALID` if there is none.
fn port(s: &Session<'_>, port_num: u32) -> Result<u8, CommandError> {
    s.guest.host_port(port_num).ok_or(CommandError::Invalid {
        what: "port_num",
        value: port_num.into(),
    })
}

fn host_port_attr(s: &Session<'_>, port: u8) -> Result<QueryPortResp, CommandError> {
    s.host().query_port(port).map_err(host_err("QUERY_PORT"))
}

/// QUERY_PORT: the host port's attributes, with the guest's GID table length and without the
/// port's violation counters (they count every guest's and host process's packets).
pub(crate) fn query_port(s: &mut Session<'_>, r: &QueryPortReq) -> CommandResult {
    let p = host_port_attr(s, port(s, r.port_num.get())?)?;
    Ok(ResponseBody::QueryPort(PortAttr {
        state: Le32::new(p.state.into()),
        max_mtu: Le32::new(p.max_mtu.into()),
        active_mtu: Le32::new(p.active_mtu.into()),
        gid_tbl_len: Le32::new(s.guest.gids().table_len(p.gid_tbl_len)),
        port_cap_flags: Le32::new(p.port_cap_flags),
        max_msg_sz: Le32::new(p.max_msg_sz),
        bad_pkey_cntr: Le32::ZERO,
        qkey_viol_cntr: Le32::ZERO,
        pkey_tbl_len: Le16::new(p.pkey_tbl_len),
        lid: Le16::new(p.lid),
        sm_lid: Le16::new(p.sm_lid),
        lmc: p.lmc,
        max_vl_num: p.max_vl_num,
        sm_sl: p.sm_sl,
        subnet_timeout: p.subnet_timeout,
        init_type_reply: p.init_type_reply,
        active_width: p.active_width,
        active_speed: p.active_speed,
        phys_state: p.phys_state,
        link_layer: p.link_layer,
        flags: p.flags,
        port_cap_flags2: Le16::ZERO,
        reserved: Le16::ZERO,
        active_speed_ex: Le32::ZERO,
    }))
}

/// QUERY_GID: an index below the guest's `gid_tbl_len`; an empty entry is returned without
/// `VALID`.
pub(crate) fn query_gid(s: &mut Session<'_>, r: &QueryTableReq) -> CommandResult {
    let host_port = port(s, r.port_num.get())?;
    let p = host_port_attr(s, host_port)?;
    let index = r.index.get();
    if index >= s.guest.gids().table_len(p.gid_tbl_len) {
        return Err(CommandError::Invalid {
            what: "index",
            value: index.into(),
        });
    }
    let found = s
        .guest
        .gids()
        .entry(&s.guest.gid_source(), host_port, index)
        .map_err(host_err("GID table"))?;
    Ok(ResponseBody::QueryGid(
        found.map_or(GidEntry::EMPTY, |(_, entry)| entry),
    ))
}

/// QUERY_GID_TABLE: the populated entries of the guest's table at or after `index` (below
/// `gid_tbl_len`, as QUERY_GID's), up to [`GID_TABLE_BATCH`] of them by increasing index, from
/// the host's table in one read.
pub(crate) fn query_gid_table(s: &mut Session<'_>, r: &QueryTableReq) -> CommandResult {
    let host_port = port(s, r.port_num.get())?;
    let table_len = s
        .guest
        .gids()
        .table_len(host_port_attr(s, host_port)?.gid_tbl_len);
    let first = r.index.get();
    if first >= table_len {
        return Err(CommandError::Invalid {
            what: "index",
            value: first.into(),
        });
    }
    let mut table = s
        .guest
        .gids()
        .table(&s.guest.gid_source(), host_port)
        .map_err(host_err("GID table"))?;
    table.retain(|(index, _)| (first..table_len).contains(index));
    let mut resp = GidTableResp::new_zeroed();
    for (slot, (index, entry)) in resp.entries.iter_mut().zip(&table) {
        *slot = GidTableEntry::new(*index, entry);
    }
    let count = table.len().min(GID_TABLE_BATCH);
    resp.count = Le32::new(count as u32);
    // More populated entries follow: continue after the last one returned.
    let next = match table.get(GID_TABLE_BATCH) {
        Some(_) => table[GID_TABLE_BATCH - 1].0 + 1,
        None => GID_TABLE_END,
    };
    resp.next_index = Le32::new(next);
    Ok(ResponseBody::QueryGidTable(resp))
}

/// QUERY_PKEY: an index below `pkey_tbl_len`. RoCE ports have only the default P_Key; the
/// host layer offers no P_Key query for InfiniBand ports.
pub(crate) fn query_pkey(s: &mut Session<'_>, r: &QueryTableReq) -> CommandResult {
    let p = host_port_attr(s, port(s, r.port_num.get())?)?;
    let index = r.index.get();
    if index >= u32::from(p.pkey_tbl_len) {
        return Err(CommandError::Invalid {
            what: "index",
            value: index.into(),
        });
    }
    if p.link_layer != LINK_LAYER_ETHERNET {
        return Err(CommandError::Unsupported(
            "P_Key tables of InfiniBand ports",
        ));
    }
    let pkey = if index == 0 { DEFAULT_PKEY } else { 0 };
    Ok(ResponseBody::QueryPkey(PkeyEntry {
        pkey: Le16::new(pkey),
        reserved: [0; 6],
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_unsupported_capability_is_passed() {
        // RESIZE_MAX_WR, MEM_WINDOW, XRC, MEM_MGT_EXTENSIONS, MEM_WINDOW_TYPE_2B, ...
        for bit in [0, 17, 20, 21, 23, 24, 4] {
            assert_eq!(PASSED_CAP_FLAGS & (1 << bit), 0, "bit {bit}");
        }
        assert_ne!(
            PASSED_CAP_FLAGS & (1 << 13),
            0,
            "SRQ_RESIZE: RESIZE_SRQ carries it"
        );
    }

    #[test]
    fn the_advertised_depth_fits_a_quarter_of_the_region() {
        // rxe: 2^20 WRs, 32 SGEs (its send slots round up to 1 KiB), 27 SRQ SGEs.
        let entry = send_wqe_size(32, 32 * SGE_SIZE as u32);
        let region = 64 << 20;
        let max_wr = region_max_wr(region, 1 << 20, entry);
        assert_eq!(max_wr, 8191);
        assert!(predicted_len(max_wr + 1, entry).unwrap() <= region / 4);
        assert!(predicted_len((max_wr + 1) * 2, entry).unwrap() > region / 4);
        assert_eq!(region_max_wr(region, 1 << 20, recv_wqe_size(27)), 16383);
        // Never more than the host offers.
        assert_eq!(region_max_wr(1 << 40, 100, entry), 100);
    }
}

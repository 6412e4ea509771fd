//! Device, port and P_Key queries (GID queries: [`crate::gid_table`]).

use std::ffi::{c_char, c_int, CStr, OsStr};
use std::os::unix::ffi::OsStrExt;

use vrdma::spec::{Le32, PCI_DEVICE_ID, PCI_VENDOR_ID};
use vrdma::verbs::{DeviceAttr, PortAttr};

use crate::context::VrdmaContext;
use crate::ffi::{guard, minus_one, report};
use crate::sys::{ibv_device_attr, ibv_port_attr};

/// `IBV_DEVICE_MEM_WINDOW`: the device has memory windows (with `VRDMA_F_MW`).
const DEVICE_MEM_WINDOW: u32 = 1 << 17;

/// `ibv_device_attr` of the device. The vendor and part IDs are vrdma's own (its PCI IDs),
/// so that applications with vendor-specific paths (perftest) take their generic one.
pub(crate) fn device_attr(attr: &DeviceAttr) -> ibv_device_attr {
    // SAFETY: all-zero is a valid ibv_device_attr.
    let mut out: ibv_device_attr = unsafe { std::mem::zeroed() };
    for (o, b) in out.fw_ver.iter_mut().zip(attr.fw_ver().bytes().take(63)) {
        *o = b as c_char;
    }
    out.node_guid = u64::from_ne_bytes(attr.node_guid);
    out.sys_image_guid = u64::from_ne_bytes(attr.sys_image_guid);
    out.max_mr_size = attr.max_mr_size.get();
    out.page_size_cap = attr.page_size_cap.get();
    out.vendor_id = PCI_VENDOR_ID.into();
    out.vendor_part_id = PCI_DEVICE_ID.into();
    out.hw_ver = attr.hw_ver.get();
    let int = |v: Le32| c_int::try_from(v.get()).unwrap_or(c_int::MAX);
    out.max_qp = int(attr.max_qp);
    out.max_qp_wr = int(attr.max_qp_wr);
    out.device_cap_flags = attr.device_cap_flags.get();
    out.max_sge = int(attr.max_sge);
    out.max_sge_rd = int(attr.max_sge_rd);
    out.max_cq = int(attr.max_cq);
    out.max_cqe = int(attr.max_cqe);
    out.max_mr = int(attr.max_mr);
    // QUERY_DEVICE 1.0 has no max_mw: with memory windows (IB_DEVICE_MEM_WINDOW) a guest may
    // hold as many windows as MRs by default (spec §7.4 ALLOC_MW).
    if attr.device_cap_flags.get() & DEVICE_MEM_WINDOW != 0 {
        out.max_mw = out.max_mr;
    }
    out.max_pd = int(attr.max_pd);
    out.max_qp_rd_atom = int(attr.max_qp_rd_atom);
    out.max_res_rd_atom = int(attr.max_res_rd_atom);
    out.max_qp_init_rd_atom = int(attr.max_qp_init_rd_atom);
    out.atomic_cap = attr.atomic_cap.get();
    out.max_ah = int(attr.max_ah);
    out.max_srq = int(attr.max_srq);
    out.max_srq_wr = int(attr.max_srq_wr);
    out.max_srq_sge = int(attr.max_srq_sge);
    out.max_pkeys = attr.max_pkeys.get();
    out.local_ca_ack_delay = attr.local_ca_ack_delay;
    out.phys_port_cnt = attr.phys_port_cnt;
    out
}

pub(crate) fn port_attr(p: &PortAttr) -> ibv_port_attr {
    ibv_port_attr {
        state: p.state.get(),
        max_mtu: p.max_mtu.get(),
        active_mtu: p.active_mtu.get(),
        gid_tbl_len: c_int::try_from(p.gid_tbl_len.get()).unwrap_or(c_int::MAX),
        port_cap_flags: p.port_cap_flags.get(),
        max_msg_sz: p.max_msg_sz.get(),
        bad_pkey_cntr: p.bad_pkey_cntr.get(),
        qkey_viol_cntr: p.qkey_viol_cntr.get(),
        pkey_tbl_len: p.pkey_tbl_len.get(),
        lid: p.lid.get(),
        sm_lid: p.sm_lid.get(),
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
        port_cap_flags2: p.port_cap_flags2.get(),
    }
}

/// `ibv_query_device`: 0, or an errno value.
///
/// # Safety
/// `context` is a context of this library; `attr` is valid for a write.
pub unsafe extern "C" fn ibv_query_device(
    context: *mut crate::sys::ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    guard("ibv_query_device", libc::EIO, || {
        // SAFETY: caller contract.
        let Some(ctx) = (unsafe { VrdmaContext::from_ptr(context) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: caller contract.
        unsafe { attr.write(device_attr(ctx.ctx.query_device())) };
        0
    })
}

/// `ibv_query_port` (IBVERBS_1.1). Callers built against current headers pass a full
/// `ibv_port_attr` (the inline `___ibv_query_port` clears it first), which is what rdma-core
/// writes too. 0, or an errno value.
///
/// # Safety
/// `context` is a context of this library; `attr` is valid for a write of `ibv_port_attr`.
pub unsafe extern "C" fn ibv_query_port(
    context: *mut crate::sys::ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    guard("ibv_query_port", libc::EIO, || {
        // SAFETY: caller contract.
        let Some(ctx) = (unsafe { VrdmaContext::from_ptr(context) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        match ctx.ctx.query_port(port_num) {
            Ok(p) => {
                // SAFETY: caller contract.
                unsafe { attr.write(port_attr(&p)) };
                0
            }
            Err(e) => report("ibv_query_port", &e),
        }
    })
}

/// `ibv_query_pkey`: the P_Key in network byte order; 0, or -1 and errno.
///
/// # Safety
/// `context` is a context of this library; `pkey` is valid for a write.
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut crate::sys::ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    guard("ibv_query_pkey", -1, || {
        // SAFETY: caller contract.
        let Some(ctx) = (unsafe { VrdmaContext::from_ptr(context) }) else {
            return minus_one(libc::EINVAL);
        };
        let Ok(index) = u32::try_from(index) else {
            return minus_one(libc::EINVAL);
        };
        if pkey.is_null() {
            return minus_one(libc::EINVAL);
        }
        match ctx.ctx.query_pkey(port_num, index) {
            Ok(value) => {
                // SAFETY: caller contract.
                unsafe { pkey.write(value.to_be()) };
                0
            }
            Err(e) => minus_one(report("ibv_query_pkey", &e)),
        }
    })
}

/// `ibv_read_sysfs_file` (IBVERBS_1.0): reads `dir/file` into `buf` as rdma-core does (NUL
/// terminated, trailing newline removed); the length, or -1.
///
/// # Safety
/// `dir` and `file` are NUL-terminated strings; `buf` is valid for `size` bytes.
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    guard("ibv_read_sysfs_file", -1, || {
        if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
            return minus_one(libc::EINVAL);
        }
        // SAFETY: caller contract.
        let (dir, file) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
        let path = std::path::Path::new(OsStr::from_bytes(dir.to_bytes()))
            .join(OsStr::from_bytes(file.to_bytes()));
        let Ok(mut bytes) = std::fs::read(&path) else {
            return -1;
        };
        bytes.truncate(size - 1);
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
        }
        // SAFETY: `bytes.len() < size`: the copy and the NUL fit the caller's buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast(), bytes.len());
            *buf.add(bytes.len()) = 0;
        }
        c_int::try_from(bytes.len()).unwrap_or(c_int::MAX)
    })
}

/// `ibv_get_sysfs_path` (IBVERBS_1.0): where sysfs is mounted, as rdma-core reports it
/// (`$SYSFS_PATH` without trailing slashes, else `/sys`).
///
/// # Safety
/// Safe to call; the string lives as long as the process.
pub unsafe extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    static PATH: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();
    guard("ibv_get_sysfs_path", std::ptr::null(), || {
        PATH.get_or_init(|| sysfs_path(std::env::var_os("SYSFS_PATH").as_deref()))
            .as_ptr()
    })
}

fn sysfs_path(env: Option<&OsStr>) -> std::ffi::CString {
    let trimmed = env
        .map(|v| {
            let bytes = v.as_bytes();
            let end = bytes.iter().rposition(|&b| b != b'/').map_or(0, |i| i + 1);
            &bytes[..end]
        })
        .filter(|b| !b.is_empty() && !b.contains(&0));
    std::ffi::CString::new(trimmed.unwrap_or(b"/sys")).unwrap_or_default()
}

/// `ibv_get_pkey_index` (IBVERBS_1.5): the index of `pkey` (network byte order) in the port's
/// P_Key table, found by querying entries in turn as rdma-core does; -1 and errno when the
/// table has no such entry.
///
/// # Safety
/// `context` is a context of this library.
pub unsafe extern "C" fn ibv_get_pkey_index(
    context: *mut crate::sys::ibv_context,
    port_num: u8,
    pkey: u16,
) -> c_int {
    guard("ibv_get_pkey_index", -1, || {
        // SAFETY: caller contract.
        let Some(ctx) = (unsafe { VrdmaContext::from_ptr(context) }) else {
            return minus_one(libc::EINVAL);
        };
        let table_len = match ctx.ctx.query_port(port_num) {
            Ok(port) => port.pkey_tbl_len.get(),
            Err(e) => return minus_one(report("ibv_get_pkey_index", &e)),
        };
        for index in 0..u32::from(table_len) {
            match ctx.ctx.query_pkey(port_num, index) {
                Ok(value) if value.to_be() == pkey => {
                    return c_int::try_from(index).unwrap_or(c_int::MAX)
                }
                Ok(_) => {}
                Err(e) => return minus_one(report("ibv_get_pkey_index", &e)),
            }
        }
        minus_one(libc::ENOENT)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vrdma::spec::Le16;
    use vrdma::spec::Le64;

    fn wire_device_attr() -> DeviceAttr {
        let n = Le32::new;
        DeviceAttr {
            fw_ver: DeviceAttr::encode_fw_ver("2.0.1"),
            node_guid: [1, 2, 3, 4, 5, 6, 7, 8],
            sys_image_guid: [9, 10, 11, 12, 13, 14, 15, 16],
            max_mr_size: Le64::new(1 << 40),
            page_size_cap: Le64::new(0xffff_f000),
            max_mr_bytes: Le64::new(1 << 30),
            vendor_id: n(0xff_ffff),
            vendor_part_id: n(7),
            hw_ver: n(3),
            device_cap_flags: n(0x5c86),
            // Beyond a C int: reported as INT_MAX.
            max_qp: n(u32::MAX),
            max_qp_wr: n(101),
            max_sge: n(102),
            max_sge_rd: n(103),
            max_cq: n(104),
            max_cqe: n(105),
            max_mr: n(106),
            max_pd: n(107),
            max_qp_rd_atom: n(108),
            max_qp_init_rd_atom: n(109),
            max_res_rd_atom: n(110),
            atomic_cap: n(1),
            max_ah: n(111),
            max_srq: n(112),
            max_srq_wr: n(113),
            max_srq_sge: n(114),
            max_inline_data: n(115),
            max_pkeys: Le16::new(64),
            local_ca_ack_delay: 15,
            phys_port_cnt: 1,
        }
    }

    #[test]
    fn device_attributes_convert_to_ibv_device_attr() {
        let c = device_attr(&wire_device_attr());
        let fw: Vec<u8> = c.fw_ver.iter().map(|&b| b as u8).collect();
        assert_eq!(&fw[..6], b"2.0.1\0");
        assert!(fw[6..].iter().all(|&b| b == 0));
        assert_eq!(c.node_guid, u64::from_ne_bytes([1, 2, 3, 4, 5, 6, 7, 8]));
        assert_eq!(
            c.sys_image_guid,
            u64::from_ne_bytes([9, 10, 11, 12, 13, 14, 15, 16])
        );
        assert_eq!((c.max_mr_size, c.page_size_cap), (1 << 40, 0xffff_f000));
        // vrdma's own PCI IDs, not the host's.
        assert_eq!(c.vendor_id, u32::from(PCI_VENDOR_ID));
        assert_eq!(c.vendor_part_id, u32::from(PCI_DEVICE_ID));
        assert_eq!((c.hw_ver, c.device_cap_flags), (3, 0x5c86));
        assert_eq!(c.max_qp, c_int::MAX);
        assert_eq!(
            [
                c.max_qp_wr,
                c.max_sge,
                c.max_sge_rd,
                c.max_cq,
                c.max_cqe,
                c.max_mr,
                c.max_pd,
                c.max_qp_rd_atom,
                c.max_res_rd_atom,
                c.max_qp_init_rd_atom,
                c.max_ah,
                c.max_srq,
                c.max_srq_wr,
                c.max_srq_sge,
            ],
            [101, 102, 103, 104, 105, 106, 107, 108, 110, 109, 111, 112, 113, 114]
        );
        assert_eq!(c.atomic_cap, 1);
        assert_eq!(
            (c.max_pkeys, c.local_ca_ack_delay, c.phys_port_cnt),
            (64, 15, 1)
        );
        // What ibv_device_attr has and vrdma does not offer stays zero.
        assert_eq!((c.max_mw, c.max_ee, c.max_mcast_grp), (0, 0, 0));
        // Memory windows, when the device reports them, as many as MRs.
        let mut mw = wire_device_attr();
        mw.device_cap_flags = Le32::new(0x5c86 | DEVICE_MEM_WINDOW | (1 << 24));
        assert_eq!(device_attr(&mw).max_mw, 106);

        // A firmware version filling the field keeps C's terminating NUL.
        let mut long = wire_device_attr();
        long.fw_ver = [b'9'; 64];
        let c = device_attr(&long);
        assert!(c.fw_ver[..63].iter().all(|&b| b as u8 == b'9'));
        assert_eq!(c.fw_ver[63], 0);
    }

    #[test]
    fn port_attributes_convert_to_ibv_port_attr() {
        let n = Le32::new;
        let wire = PortAttr {
            state: n(4),
            max_mtu: n(5),
            active_mtu: n(3),
            gid_tbl_len: n(u32::MAX),
            port_cap_flags: n(0x1_0000),
            max_msg_sz: n(1 << 31),
            bad_pkey_cntr: n(2),
            qkey_viol_cntr: n(3),
            pkey_tbl_len: Le16::new(1),
            lid: Le16::new(4),
            sm_lid: Le16::new(5),
            lmc: 6,
            max_vl_num: 7,
            sm_sl: 8,
            subnet_timeout: 9,
            init_type_reply: 10,
            active_width: 11,
            active_speed: 12,
            phys_state: 13,
            link_layer: 2,
            flags: 14,
            port_cap_flags2: Le16::new(15),
            reserved: Le16::ZERO,
            active_speed_ex: n(16),
        };
        let c = port_attr(&wire);
        assert_eq!((c.state, c.max_mtu, c.active_mtu), (4, 5, 3));
        assert_eq!(c.gid_tbl_len, c_int::MAX, "beyond a C int");
        assert_eq!(
            (
                c.port_cap_flags,
                c.max_msg_sz,
                c.bad_pkey_cntr,
                c.qkey_viol_cntr
            ),
            (0x1_0000, 1 << 31, 2, 3)
        );
        assert_eq!((c.pkey_tbl_len, c.lid, c.sm_lid), (1, 4, 5));
        assert_eq!(
            [
                c.lmc,
                c.max_vl_num,
                c.sm_sl,
                c.subnet_timeout,
                c.init_type_reply,
                c.active_width,
                c.active_speed,
                c.phys_state,
                c.link_layer,
                c.flags
            ],
            [6, 7, 8, 9, 10, 11, 12, 13, 2, 14]
        );
        assert_eq!(c.port_cap_flags2, 15);
    }

    #[test]
    fn sysfs_path_defaults_to_sys_and_drops_trailing_slashes() {
        assert_eq!(sysfs_path(None).as_bytes(), b"/sys");
        assert_eq!(
            sysfs_path(Some(OsStr::new("/mnt/sys//"))).as_bytes(),
            b"/mnt/sys"
        );
        assert_eq!(sysfs_path(Some(OsStr::new("/"))).as_bytes(), b"/sys");
    }
}

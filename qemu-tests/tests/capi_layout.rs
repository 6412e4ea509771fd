//! The drop-in's generated bindings (`guest-driver/capi/src/sys.rs`) against the system's
//! `<infiniband/verbs.h>`: a C
//! program compiled with the system `cc` prints the size and field offsets of every structure
//! this library touches, and they must equal the Rust ones.
//!
//! The test installs the headers (package libibverbs-dev) with the harness's apt-get helper
//! when it runs as root; without them it is skipped with a message, unless `CI` is set. It
//! lives here, beside the harness that installs what it needs, so that the drop-in library's
//! own dependency tree (dev-dependencies included) stays free of the harness's CLI crates.

use std::mem::{offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

use vrdma_ibverbs::sys;

/// `kind name { rust_field [= c_field], … }` for each structure.
macro_rules! layouts {
    ($($kind:ident $ty:ident { $($field:ident $(= $cfield:ident)?),* $(,)? })*) => {
        /// (what, value) pairs as Rust sees them.
        fn rust_layouts() -> Vec<(String, usize)> {
            let mut out = Vec::new();
            $(
                out.push((format!("sizeof {}", stringify!($ty)), size_of::<sys::$ty>()));
                $(
                    out.push((
                        format!("{}.{}", stringify!($ty), layouts!(@c $field $($cfield)?)),
                        offset_of!(sys::$ty, $field),
                    ));
                )*
            )*
            out
        }

        /// A C program printing the same pairs.
        fn c_program() -> String {
            let mut body = String::new();
            $(
                body += &format!(
                    "\tprintf(\"sizeof {0} %zu\\n\", sizeof({1} {0}));\n",
                    stringify!($ty),
                    stringify!($kind)
                );
                $(
                    body += &format!(
                        "\tprintf(\"{0}.{2} %zu\\n\", offsetof({1} {0}, {2}));\n",
                        stringify!($ty),
                        stringify!($kind),
                        layouts!(@c $field $($cfield)?)
                    );
                )*
            )*
            format!(
                "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\n\
                 #include <rdma/rdma_cma.h>\n\
                 int main(void)\n{{\n{body}\treturn 0;\n}}\n"
            )
        }
    };
    (@c $field:ident) => { stringify!($field) };
    (@c $field:ident $cfield:ident) => { stringify!($cfield) };
}

layouts! {
    struct ibv_device { _ops, node_type, transport_type, name, dev_name, dev_path, ibdev_path }
    struct ibv_context { device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat }
    struct ibv_context_ops { poll_cq, req_notify_cq, post_srq_recv, post_send, post_recv }
    struct ibv_pd { context, handle }
    struct ibv_mr { context, pd, addr, length, handle, lkey, rkey }
    struct ibv_comp_channel { context, fd, refcnt }
    struct ibv_cq {
        context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
        async_events_completed
    }
    struct ibv_qp {
        context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type, mutex,
        cond, events_completed
    }
    struct ibv_ah { context, pd, handle }
    struct ibv_srq { context, srq_context, pd, handle, mutex, cond, events_completed }
    struct ibv_srq_attr { max_wr, max_sge, srq_limit }
    struct ibv_async_event { element, event_type }
    struct ibv_srq_init_attr { srq_context, attr }
    struct ibv_grh { version_tclass_flow, paylen, next_hdr, hop_limit, sgid, dgid }
    struct ibv_sge { addr, length, lkey }
    struct ibv_wc {
        wr_id, status, opcode, vendor_err, byte_len, __bindgen_anon_1 = imm_data, qp_num,
        src_qp, wc_flags, pkey_index, slid, sl, dlid_path_bits
    }
    struct ibv_send_wr {
        wr_id, next, sg_list, num_sge, opcode, send_flags, __bindgen_anon_1 = imm_data, wr,
        qp_type, __bindgen_anon_2 = bind_mw
    }
    struct ibv_recv_wr { wr_id, next, sg_list, num_sge }
    struct ibv_qp_cap { max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data }
    struct ibv_qp_init_attr { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all }
    struct ibv_qp_attr {
        qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn, dest_qp_num,
        qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index, alt_pkey_index,
        en_sqd_async_notify, sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer,
        port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout, rate_limit
    }
    struct ibv_global_route { dgid, flow_label, sgid_index, hop_limit, traffic_class }
    struct ibv_ah_attr {
        grh, dlid, sl, src_path_bits, static_rate, is_global, port_num
    }
    struct ibv_port_attr {
        state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz, bad_pkey_cntr,
        qkey_viol_cntr, pkey_tbl_len, lid, sm_lid, lmc, max_vl_num, sm_sl, subnet_timeout,
        init_type_reply, active_width, active_speed, phys_state, link_layer, flags,
        port_cap_flags2
    }
    struct ibv_device_attr {
        fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id,
        vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd,
        max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom,
        max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd, max_mw,
        max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach,
        max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr,
        max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt
    }
    struct verbs_context {
        query_port, create_cq_ex, query_device_ex, create_qp_ex, create_srq_ex, open_xrcd,
        close_xrcd, sz, context
    }
    struct ibv_cq_ex {
        context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
        async_events_completed, comp_mask, status, wr_id, start_poll, next_poll, end_poll,
        read_opcode, read_vendor_err, read_byte_len, read_imm_data, read_qp_num, read_src_qp,
        read_wc_flags, read_slid, read_sl, read_dlid_path_bits, read_completion_ts,
        read_cvlan, read_flow_tag, read_tm_info, read_completion_wallclock_ns
    }
    struct ibv_cq_init_attr_ex {
        cqe, cq_context, channel, comp_vector, wc_flags, comp_mask, flags, parent_domain
    }
    struct ibv_poll_cq_attr { comp_mask }
    struct ibv_qp_init_attr_ex {
        qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all, comp_mask, pd, xrcd,
        create_flags, max_tso_header, rwq_ind_tbl, rx_hash_conf, source_qpn, send_ops_flags
    }
    struct ibv_qp_ex {
        qp_base, comp_mask, wr_id, wr_flags, wr_atomic_cmp_swp, wr_atomic_fetch_add, wr_bind_mw,
        wr_local_inv, wr_rdma_read, wr_rdma_write, wr_rdma_write_imm, wr_send, wr_send_imm,
        wr_send_inv, wr_send_tso, wr_set_ud_addr, wr_set_xrc_srqn, wr_set_inline_data,
        wr_set_inline_data_list, wr_set_sge, wr_set_sge_list, wr_start, wr_complete, wr_abort,
        wr_atomic_write
    }
    struct ibv_data_buf { addr, length }
    struct ibv_srq_init_attr_ex {
        srq_context, attr, comp_mask, srq_type, pd, xrcd, cq, tm_cap
    }
    struct ibv_query_device_ex_input { comp_mask }
    struct ibv_device_attr_ex {
        orig_attr, comp_mask, odp_caps, completion_timestamp_mask, hca_core_clock,
        device_cap_flags_ex, tso_caps, rss_caps, max_wq_type_rq, packet_pacing_caps,
        raw_packet_caps, tm_caps, cq_mod_caps, max_dm_size, pci_atomic_caps, xrc_odp_caps,
        phys_port_cnt_ex
    }
    union ibv_gid { raw, global }
    struct ibv_gid_entry { gid, gid_index, port_num, gid_type, ndev_ifindex }
    struct rdma_event_channel { fd }
    struct rdma_ib_addr { sgid, dgid, pkey }
    struct rdma_addr { addr }
    struct rdma_route { addr, path_rec, num_paths }
    struct rdma_cm_id {
        verbs, channel, context, qp, route, ps, port_num, event, send_cq_channel, send_cq,
        recv_cq_channel, recv_cq, srq, pd, qp_type
    }
    struct rdma_conn_param {
        private_data, private_data_len, responder_resources, initiator_depth, flow_control,
        retry_count, rnr_retry_count, srq, qp_num
    }
    struct rdma_ud_param { private_data, private_data_len, ah_attr, qp_num, qkey }
    struct rdma_cm_event { id, listen_id, event, status, param }
    struct rdma_addrinfo {
        ai_flags, ai_family, ai_qp_type, ai_port_space, ai_src_len, ai_dst_len, ai_src_addr,
        ai_dst_addr, ai_src_canonname, ai_dst_canonname, ai_route_len, ai_route,
        ai_connect_len, ai_connect, ai_next
    }
}

/// Builds and runs the C program; `None` (skip) when the headers or compiler are missing.
fn c_layouts() -> Option<Vec<(String, usize)>> {
    // The project installs its own prerequisites (gcc, libibverbs-dev) where it can (root);
    // where it cannot, the check below skips outside CI and fails under CI.
    if let Err(e) = vrdma_qemu_tests::native::ensure_prerequisites() {
        eprintln!("cannot install the C prerequisites: {e}");
    }
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("layout.c");
    let binary = dir.join("layout");
    std::fs::write(&source, c_program()).unwrap();
    let compiled = Command::new("cc")
        .args(["-std=gnu11", "-Wall", "-Werror", "-o"])
        .arg(&binary)
        .arg(&source)
        .output();
    let missing = match &compiled {
        Err(e) => Some(format!("cannot run cc: {e}")),
        Ok(out) if !out.status.success() => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            if stderr.contains("infiniband/verbs.h") {
                Some("<infiniband/verbs.h> not found (install libibverbs-dev)".to_owned())
            } else {
                panic!("the layout program does not compile:\n{stderr}");
            }
        }
        Ok(_) => None,
    };
    if let Some(reason) = missing {
        if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
            panic!("CI is set but {reason}");
        }
        eprintln!("SKIPPED layout comparison: {reason}");
        return None;
    }
    let out = Command::new(&binary).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    Some(
        text.lines()
            .map(|line| {
                let (what, value) = line.rsplit_once(' ').unwrap();
                (what.to_owned(), value.parse().unwrap())
            })
            .collect(),
    )
}

#[test]
fn bindings_match_the_system_headers() {
    let rust = rust_layouts();
    let Some(c) = c_layouts() else { return };
    assert_eq!(rust.len(), c.len());
    let mismatches: Vec<String> = rust
        .iter()
        .zip(&c)
        .filter(|(r, c)| r != c)
        .map(|(r, c)| format!("{}: Rust {} / C {} {}", r.0, r.1, c.0, c.1))
        .collect();
    assert!(
        mismatches.is_empty(),
        "layout mismatches:\n{}",
        mismatches.join("\n")
    );
    // The values the ABI note relies on, as a cross-check of the comparison itself.
    let get = |what: &str| c.iter().find(|(w, _)| w == what).map(|(_, v)| *v);
    assert_eq!(get("sizeof ibv_context"), Some(328));
    assert_eq!(get("ibv_context.abi_compat"), Some(320));
    assert_eq!(get("ibv_context_ops.post_send"), Some(200));
    assert_eq!(get("sizeof ibv_wc"), Some(48));
    assert_eq!(get("sizeof rdma_cm_id"), Some(416));
    assert_eq!(get("rdma_cm_id.qp_type"), Some(408));
    assert_eq!(get("sizeof rdma_cm_event"), Some(80));
}

//! The built `libibverbs.so.1` (also installed as `librdmacm.so.1`) exports rdma-core's names
//! with rdma-core's symbol versions and soname, and nothing else (checked with `readelf` when it is installed).

use std::path::PathBuf;
use std::process::Command;

/// The cdylib next to this test's target directory.
fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [
        deps.join("libvrdma_ibverbs.so"),
        deps.parent().unwrap().join("libvrdma_ibverbs.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .expect("cargo builds the cdylib before the integration tests")
}

fn readelf(args: &[&str]) -> Option<String> {
    let out = Command::new("readelf").args(args).arg(library()).output();
    match out {
        Ok(out) if out.status.success() => Some(String::from_utf8(out.stdout).unwrap()),
        Ok(out) => panic!("readelf failed: {}", String::from_utf8_lossy(&out.stderr)),
        Err(e) => {
            eprintln!("SKIPPED: cannot run readelf: {e}");
            None
        }
    }
}

/// What perftest's tools and ibv_devinfo import (and a few more), with the versions they import
/// them at.
const REQUIRED: &[(&str, &str)] = &[
    ("ibv_create_comp_channel", "IBVERBS_1.0"),
    ("ibv_destroy_comp_channel", "IBVERBS_1.0"),
    ("ibv_read_sysfs_file", "IBVERBS_1.0"),
    ("ibv_ack_async_event", "IBVERBS_1.1"),
    ("ibv_ack_cq_events", "IBVERBS_1.1"),
    ("ibv_alloc_pd", "IBVERBS_1.1"),
    ("ibv_attach_mcast", "IBVERBS_1.1"),
    ("ibv_close_device", "IBVERBS_1.1"),
    ("ibv_create_ah", "IBVERBS_1.1"),
    ("ibv_create_ah_from_wc", "IBVERBS_1.1"),
    ("ibv_create_cq", "IBVERBS_1.1"),
    ("ibv_create_qp", "IBVERBS_1.1"),
    ("ibv_create_srq", "IBVERBS_1.1"),
    ("ibv_dealloc_pd", "IBVERBS_1.1"),
    ("ibv_dereg_mr", "IBVERBS_1.1"),
    ("ibv_destroy_ah", "IBVERBS_1.1"),
    ("ibv_destroy_cq", "IBVERBS_1.1"),
    ("ibv_destroy_qp", "IBVERBS_1.1"),
    ("ibv_destroy_srq", "IBVERBS_1.1"),
    ("ibv_detach_mcast", "IBVERBS_1.1"),
    ("ibv_free_device_list", "IBVERBS_1.1"),
    ("ibv_get_async_event", "IBVERBS_1.1"),
    ("ibv_get_cq_event", "IBVERBS_1.1"),
    ("ibv_get_device_guid", "IBVERBS_1.1"),
    ("ibv_get_device_list", "IBVERBS_1.1"),
    ("ibv_get_device_name", "IBVERBS_1.1"),
    ("ibv_modify_qp", "IBVERBS_1.1"),
    ("ibv_open_device", "IBVERBS_1.1"),
    ("ibv_query_device", "IBVERBS_1.1"),
    ("ibv_query_gid", "IBVERBS_1.1"),
    ("ibv_query_pkey", "IBVERBS_1.1"),
    ("ibv_query_port", "IBVERBS_1.1"),
    ("ibv_query_qp", "IBVERBS_1.1"),
    ("ibv_reg_mr", "IBVERBS_1.1"),
    ("ibv_resize_cq", "IBVERBS_1.1"),
    ("ibv_rereg_mr", "IBVERBS_1.1"),
    ("ibv_qp_to_qp_ex", "IBVERBS_1.6"),
    ("ibv_reg_mr_iova2", "IBVERBS_1.8"),
    ("_ibv_query_gid_ex", "IBVERBS_1.11"),
    ("_ibv_query_gid_table", "IBVERBS_1.11"),
    ("ibv_reg_dmabuf_mr", "IBVERBS_1.12"),
    ("ibv_query_gid_type", "IBVERBS_PRIVATE_34"),
    // librdmacm (linked by perftest, bound at load).
    ("ibv_copy_path_rec_from_kern", "IBVERBS_1.0"),
    ("ibv_copy_qp_attr_from_kern", "IBVERBS_1.0"),
    ("ibv_get_sysfs_path", "IBVERBS_1.0"),
    ("ibv_copy_ah_attr_from_kern", "IBVERBS_1.1"),
    ("ibv_get_pkey_index", "IBVERBS_1.5"),
    ("ibv_get_device_index", "IBVERBS_1.9"),
    ("ibv_query_ece", "IBVERBS_1.10"),
    ("ibv_set_ece", "IBVERBS_1.10"),
    // SRQs and replies to UD messages, for applications beyond perftest.
    ("ibv_init_ah_from_wc", "IBVERBS_1.1"),
    ("ibv_modify_srq", "IBVERBS_1.1"),
    ("ibv_query_srq", "IBVERBS_1.1"),
    // The helpers every program calls to print and convert values.
    ("ibv_event_type_str", "IBVERBS_1.1"),
    ("ibv_node_type_str", "IBVERBS_1.1"),
    ("ibv_port_state_str", "IBVERBS_1.1"),
    ("ibv_wc_status_str", "IBVERBS_1.1"),
    ("ibv_rate_to_mbps", "IBVERBS_1.1"),
    ("mbps_to_ibv_rate", "IBVERBS_1.1"),
    ("ibv_rate_to_mult", "IBVERBS_1.0"),
    ("mult_to_ibv_rate", "IBVERBS_1.0"),
    ("ibv_copy_path_rec_to_kern", "IBVERBS_1.0"),
    ("ibv_reg_mr_iova", "IBVERBS_1.7"),
    ("ibv_query_qp_data_in_order", "IBVERBS_1.14"),
    // Context and object import: refused with EOPNOTSUPP.
    ("ibv_import_device", "IBVERBS_1.10"),
    ("ibv_import_pd", "IBVERBS_1.10"),
    ("ibv_import_mr", "IBVERBS_1.10"),
    ("ibv_unimport_pd", "IBVERBS_1.10"),
    ("ibv_unimport_mr", "IBVERBS_1.10"),
    ("ibv_import_dm", "IBVERBS_1.13"),
    ("ibv_unimport_dm", "IBVERBS_1.13"),
    // fork() support and L2 address resolution.
    ("ibv_fork_init", "IBVERBS_1.1"),
    ("ibv_dontfork_range", "IBVERBS_1.1"),
    ("ibv_dofork_range", "IBVERBS_1.1"),
    ("ibv_is_fork_initialized", "IBVERBS_1.13"),
    ("ibv_resolve_eth_l2_from_gid", "IBVERBS_1.1"),
    // librdmacm.so.1 (a second name of this file): rdma-core's 68 names and versions.
    ("raccept", "RDMACM_1.0"),
    ("rbind", "RDMACM_1.0"),
    ("rclose", "RDMACM_1.0"),
    ("rconnect", "RDMACM_1.0"),
    ("rdma_accept", "RDMACM_1.0"),
    ("rdma_ack_cm_event", "RDMACM_1.0"),
    ("rdma_bind_addr", "RDMACM_1.0"),
    ("rdma_connect", "RDMACM_1.0"),
    ("rdma_create_ep", "RDMACM_1.0"),
    ("rdma_create_event_channel", "RDMACM_1.0"),
    ("rdma_create_id", "RDMACM_1.0"),
    ("rdma_create_qp", "RDMACM_1.0"),
    ("rdma_create_qp_ex", "RDMACM_1.0"),
    ("rdma_create_srq", "RDMACM_1.0"),
    ("rdma_create_srq_ex", "RDMACM_1.0"),
    ("rdma_destroy_ep", "RDMACM_1.0"),
    ("rdma_destroy_event_channel", "RDMACM_1.0"),
    ("rdma_destroy_id", "RDMACM_1.0"),
    ("rdma_destroy_qp", "RDMACM_1.0"),
    ("rdma_destroy_srq", "RDMACM_1.0"),
    ("rdma_disconnect", "RDMACM_1.0"),
    ("rdma_event_str", "RDMACM_1.0"),
    ("rdma_free_devices", "RDMACM_1.0"),
    ("rdma_freeaddrinfo", "RDMACM_1.0"),
    ("rdma_get_cm_event", "RDMACM_1.0"),
    ("rdma_get_devices", "RDMACM_1.0"),
    ("rdma_get_dst_port", "RDMACM_1.0"),
    ("rdma_get_request", "RDMACM_1.0"),
    ("rdma_get_src_port", "RDMACM_1.0"),
    ("rdma_getaddrinfo", "RDMACM_1.0"),
    ("rdma_join_multicast", "RDMACM_1.0"),
    ("rdma_leave_multicast", "RDMACM_1.0"),
    ("rdma_listen", "RDMACM_1.0"),
    ("rdma_migrate_id", "RDMACM_1.0"),
    ("rdma_notify", "RDMACM_1.0"),
    ("rdma_reject", "RDMACM_1.0"),
    ("rdma_resolve_addr", "RDMACM_1.0"),
    ("rdma_resolve_route", "RDMACM_1.0"),
    ("rdma_set_option", "RDMACM_1.0"),
    ("rfcntl", "RDMACM_1.0"),
    ("rgetpeername", "RDMACM_1.0"),
    ("rgetsockname", "RDMACM_1.0"),
    ("rgetsockopt", "RDMACM_1.0"),
    ("riomap", "RDMACM_1.0"),
    ("riounmap", "RDMACM_1.0"),
    ("riowrite", "RDMACM_1.0"),
    ("rlisten", "RDMACM_1.0"),
    ("rpoll", "RDMACM_1.0"),
    ("rread", "RDMACM_1.0"),
    ("rreadv", "RDMACM_1.0"),
    ("rrecv", "RDMACM_1.0"),
    ("rrecvfrom", "RDMACM_1.0"),
    ("rrecvmsg", "RDMACM_1.0"),
    ("rselect", "RDMACM_1.0"),
    ("rsend", "RDMACM_1.0"),
    ("rsendmsg", "RDMACM_1.0"),
    ("rsendto", "RDMACM_1.0"),
    ("rsetsockopt", "RDMACM_1.0"),
    ("rshutdown", "RDMACM_1.0"),
    ("rsocket", "RDMACM_1.0"),
    ("rwrite", "RDMACM_1.0"),
    ("rwritev", "RDMACM_1.0"),
    ("rdma_join_multicast_ex", "RDMACM_1.1"),
    ("rdma_establish", "RDMACM_1.2"),
    ("rdma_init_qp_attr", "RDMACM_1.2"),
    ("rdma_get_remote_ece", "RDMACM_1.3"),
    ("rdma_reject_ece", "RDMACM_1.3"),
    ("rdma_set_local_ece", "RDMACM_1.3"),
    // rdma-core's provider ABI (src/provider_abi.rs), as rdma-core 56 exports it.
    ("__ioctl_final_num_attrs", "IBVERBS_PRIVATE_34"),
    ("__verbs_log", "IBVERBS_PRIVATE_34"),
    ("_verbs_init_and_alloc_context", "IBVERBS_PRIVATE_34"),
    ("execute_ioctl", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_advise_mr", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_alloc_dm", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_alloc_mw", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_alloc_pd", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_attach_mcast", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_close_xrcd", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_ah", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_counters", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_cq", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_cq_ex2", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_cq_ex", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_flow", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_flow_action_esp", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_qp", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_qp_ex2", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_qp_ex", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_rwq_ind_table", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_srq", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_srq_ex", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_create_wq", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_dealloc_mw", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_dealloc_pd", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_dereg_mr", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_destroy_ah", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_destroy_counters", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_destroy_cq", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_destroy_flow", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_destroy_flow_action", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_destroy_qp", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_destroy_rwq_ind_table", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_destroy_srq", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_destroy_wq", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_detach_mcast", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_free_dm", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_get_context", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_modify_cq", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_modify_flow_action_esp", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_modify_qp", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_modify_qp_ex", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_modify_srq", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_modify_wq", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_open_qp", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_open_xrcd", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_poll_cq", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_post_recv", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_post_send", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_post_srq_recv", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_query_context", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_query_device_any", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_query_mr", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_query_port", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_query_qp", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_query_srq", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_read_counters", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_reg_dm_mr", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_reg_dmabuf_mr", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_reg_mr", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_req_notify_cq", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_rereg_mr", "IBVERBS_PRIVATE_34"),
    ("ibv_cmd_resize_cq", "IBVERBS_PRIVATE_34"),
    ("ibv_read_ibdev_sysfs_file", "IBVERBS_PRIVATE_34"),
    ("ibv_wr_opcode_str", "IBVERBS_PRIVATE_34"),
    ("verbs_allow_disassociate_destroy", "IBVERBS_PRIVATE_34"),
    ("verbs_init_cq", "IBVERBS_PRIVATE_34"),
    ("verbs_open_device", "IBVERBS_PRIVATE_34"),
    ("verbs_register_driver_34", "IBVERBS_PRIVATE_34"),
    ("verbs_set_ops", "IBVERBS_PRIVATE_34"),
    ("verbs_uninit_context", "IBVERBS_PRIVATE_34"),
];

#[test]
fn exports_carry_rdma_core_versions_and_nothing_else_is_exported() {
    let Some(syms) = readelf(&["--dyn-syms", "-W"]) else {
        return;
    };
    let mut exported: Vec<(String, String)> = syms
        .lines()
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // Num: Value Size Type Bind Vis Ndx Name
            (cols.len() >= 8 && cols[4] == "GLOBAL" && cols[6] != "UND").then(|| cols[7])
        })
        .map(|name| {
            let (n, v) = name.split_once("@@").unwrap_or((name, ""));
            (n.to_owned(), v.to_owned())
        })
        .filter(|(n, v)| n != v) // version definition symbols
        .collect();
    exported.sort();
    let mut required: Vec<(String, String)> = REQUIRED
        .iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect();
    required.sort();
    assert_eq!(exported, required);
}

#[test]
fn the_soname_is_libibverbs_so_1() {
    let Some(dynamic) = readelf(&["-d"]) else {
        return;
    };
    assert!(
        dynamic.contains("Library soname: [libibverbs.so.1]"),
        "{dynamic}"
    );
}

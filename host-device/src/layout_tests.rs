//! Checks every ABI struct of this layer against the C compiler's view of the system's uapi
//! headers (`<rdma/ib_user_verbs.h>`, `<rdma/rdma_user_rxe.h>`, the ioctl ABI's). The queue-buffer structs
//! (header, WQEs, SGEs, CQEs) are defined in `vrdma_spec::rxe_v1`, whose own test checks them.

use std::fmt::Write as _;
use std::process::Command;

use super::rxe_abi::*;
use super::ucma::abi as ucma;
use super::uverbs::*;

struct Layout {
    c_type: &'static str,
    size: usize,
    fields: Vec<(&'static str, usize)>,
}

macro_rules! layouts {
    ($($c:literal => $ty:ty { $($f:ident),* $(,)? }),* $(,)?) => {
        vec![$(Layout {
            c_type: $c,
            size: size_of::<$ty>(),
            fields: vec![$((stringify!($f), ::core::mem::offset_of!($ty, $f))),*],
        }),*]
    };
}

fn all_layouts() -> Vec<Layout> {
    layouts! {
        "struct ib_uverbs_cmd_hdr" => CmdHdr { command, in_words, out_words },
        "struct ib_uverbs_ioctl_hdr" => IoctlHdr {
            length, object_id, method_id, num_attrs, reserved1, driver_id, reserved2,
        },
        "struct ib_uverbs_attr" => IoctlAttr { attr_id, len, flags, attr_data, data },
        "struct ib_uverbs_gid_entry" => GidTableEntry {
            gid, gid_index, port_num, gid_type, netdev_ifindex,
        },
        "struct ib_uverbs_async_event_desc" => AsyncEventDesc { element, event_type, reserved },
        "struct ib_uverbs_comp_event_desc" => CompEventDesc { cq_handle },
        "struct ib_uverbs_get_context" => GetContext { response },
        "struct ib_uverbs_get_context_resp" => GetContextResp { async_fd, num_comp_vectors },
        "struct ib_uverbs_query_device" => QueryDevice { response },
        "struct ib_uverbs_query_device_resp" => QueryDeviceResp {
            fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id,
            vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd,
            max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom,
            max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd, max_mw,
            max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach,
            max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr,
            max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt, reserved,
        },
        "struct ib_uverbs_ex_cmd_hdr" => ExCmdHdr {
            response, provider_in_words, provider_out_words, cmd_hdr_reserved,
        },
        "struct ib_uverbs_ex_query_device" => ExQueryDevice { comp_mask, reserved },
        "struct ib_uverbs_odp_caps" => OdpCapsAbi { general_caps, reserved },
        "struct ib_uverbs_ex_query_device_resp" => ExQueryDeviceResp {
            base, comp_mask, response_length, odp_caps, timestamp_mask, hca_core_clock,
            device_cap_flags_ex, rss_caps, max_wq_type_rq, raw_packet_caps, tm_caps,
            cq_moderation_caps, max_dm_size, xrc_odp_caps, reserved,
        },
        "struct ib_uverbs_query_port" => QueryPort { response, port_num, reserved },
        "struct ib_uverbs_query_port_resp" => QueryPortResp {
            port_cap_flags, max_msg_sz, bad_pkey_cntr, qkey_viol_cntr, gid_tbl_len,
            pkey_tbl_len, lid, sm_lid, state, max_mtu, active_mtu, lmc, max_vl_num, sm_sl,
            subnet_timeout, init_type_reply, active_width, active_speed, phys_state,
            link_layer, flags, reserved,
        },
        "struct ib_uverbs_alloc_pd" => AllocPd { response },
        "struct ib_uverbs_alloc_pd_resp" => AllocPdResp { pd_handle },
        "struct ib_uverbs_dealloc_pd" => DeallocPd { pd_handle },
        "struct ib_uverbs_reg_mr" => RegMr {
            response, start, length, hca_va, pd_handle, access_flags,
        },
        "struct ib_uverbs_reg_mr_resp" => RegMrResp { mr_handle, lkey, rkey },
        "struct ib_uverbs_dereg_mr" => DeregMr { mr_handle },
        "struct ib_uverbs_alloc_mw" => AllocMw { response, pd_handle, mw_type, reserved },
        "struct ib_uverbs_alloc_mw_resp" => AllocMwResp { mw_handle, rkey },
        "struct ib_uverbs_dealloc_mw" => DeallocMw { mw_handle },
        "struct ib_uverbs_create_comp_channel" => CreateCompChannel { response },
        "struct ib_uverbs_create_comp_channel_resp" => CreateCompChannelResp { fd },
        "struct ib_uverbs_create_cq" => CreateCq {
            response, user_handle, cqe, comp_vector, comp_channel, reserved,
        },
        "struct ib_uverbs_create_cq_resp" => CreateCqResp { cq_handle, cqe },
        "struct ib_uverbs_resize_cq" => ResizeCq { response, cq_handle, cqe },
        "struct ib_uverbs_resize_cq_resp" => ResizeCqResp { cqe, reserved },
        "struct ib_uverbs_req_notify_cq" => ReqNotifyCq { cq_handle, solicited_only },
        "struct ib_uverbs_destroy_cq" => DestroyCq { response, cq_handle, reserved },
        "struct ib_uverbs_destroy_cq_resp" => DestroyCqResp {
            comp_events_reported, async_events_reported,
        },
        "struct ib_uverbs_global_route" => GlobalRoute {
            dgid, flow_label, sgid_index, hop_limit, traffic_class, reserved,
        },
        "struct ib_uverbs_ah_attr" => AhAttr {
            grh, dlid, sl, src_path_bits, static_rate, is_global, port_num, reserved,
        },
        "struct ib_uverbs_qp_dest" => QpDest {
            dgid, flow_label, dlid, reserved, sgid_index, hop_limit, traffic_class, sl,
            src_path_bits, static_rate, is_global, port_num,
        },
        "struct ib_uverbs_create_qp" => CreateQp {
            response, user_handle, pd_handle, send_cq_handle, recv_cq_handle, srq_handle,
            max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data, sq_sig_all,
            qp_type, is_srq, reserved,
        },
        "struct ib_uverbs_create_qp_resp" => CreateQpResp {
            qp_handle, qpn, max_send_wr, max_recv_wr, max_send_sge, max_recv_sge,
            max_inline_data, reserved,
        },
        "struct ib_uverbs_query_qp" => QueryQp { response, qp_handle, attr_mask },
        "struct ib_uverbs_query_qp_resp" => QueryQpResp {
            dest, alt_dest, max_send_wr, max_recv_wr, max_send_sge, max_recv_sge,
            max_inline_data, qkey, rq_psn, sq_psn, dest_qp_num, qp_access_flags, pkey_index,
            alt_pkey_index, qp_state, cur_qp_state, path_mtu, path_mig_state, sq_draining,
            max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt,
            rnr_retry, alt_port_num, alt_timeout, sq_sig_all, reserved,
        },
        "struct ib_uverbs_modify_qp" => ModifyQp {
            dest, alt_dest, qp_handle, attr_mask, qkey, rq_psn, sq_psn, dest_qp_num,
            qp_access_flags, pkey_index, alt_pkey_index, qp_state, cur_qp_state, path_mtu,
            path_mig_state, en_sqd_async_notify, max_rd_atomic, max_dest_rd_atomic,
            min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout,
            reserved,
        },
        "struct ib_uverbs_destroy_qp" => DestroyQp { response, qp_handle, reserved },
        "struct ib_uverbs_destroy_qp_resp" => DestroyQpResp { events_reported },
        "struct ib_uverbs_post_send" => PostSend {
            response, qp_handle, wr_count, sge_count, wqe_size,
        },
        "struct ib_uverbs_post_send_resp" => PostSendResp { bad_wr },
        "struct ib_uverbs_create_srq" => CreateSrq {
            response, user_handle, pd_handle, max_wr, max_sge, srq_limit,
        },
        "struct ib_uverbs_create_srq_resp" => CreateSrqResp {
            srq_handle, max_wr, max_sge, srqn,
        },
        "struct ib_uverbs_modify_srq" => ModifySrq { srq_handle, attr_mask, max_wr, srq_limit },
        "struct ib_uverbs_destroy_srq" => DestroySrq { response, srq_handle, reserved },
        "struct ib_uverbs_destroy_srq_resp" => DestroySrqResp { events_reported },
        "struct ib_uverbs_create_ah" => CreateAh {
            response, user_handle, pd_handle, reserved, attr,
        },
        "struct ib_uverbs_create_ah_resp" => CreateAhResp { ah_handle },
        "struct ib_uverbs_destroy_ah" => DestroyAh { ah_handle },
        "struct mminfo" => MmInfo { offset, size, pad },
        "struct rxe_create_cq_resp" => RxeCreateCqResp { mi },
        "struct rxe_resize_cq_resp" => RxeResizeCqResp { mi },
        "struct rxe_create_qp_resp" => RxeCreateQpResp { rq_mi, sq_mi },
        "struct rxe_create_srq_resp" => RxeCreateSrqResp { mi, srq_num, reserved },
        "struct rxe_modify_srq_cmd" => RxeModifySrqCmd { mmap_info_addr },
        "struct rxe_create_ah_resp" => RxeCreateAhResp { ah_num, reserved },
        // The connection manager's (`<rdma/rdma_user_cm.h>`); the header's `in`/`out` fields
        // are Rust keywords, its size is asserted where it is declared.
        "struct rdma_ucm_create_id" => ucma::CreateId { uid, response, ps, qp_type, reserved },
        "struct rdma_ucm_create_id_resp" => ucma::CreateIdResp { id },
        "struct rdma_ucm_destroy_id" => ucma::DestroyId { response, id, reserved },
        "struct rdma_ucm_destroy_id_resp" => ucma::DestroyIdResp { events_reported },
        "struct rdma_ucm_bind" => ucma::Bind { id, addr_size, reserved, addr },
        "struct rdma_ucm_resolve_addr" => ucma::ResolveAddr {
            id, timeout_ms, src_size, dst_size, reserved, src_addr, dst_addr,
        },
        "struct rdma_ucm_resolve_route" => ucma::ResolveRoute { id, timeout_ms },
        "struct rdma_ucm_query" => ucma::Query { response, id, option },
        "struct rdma_ucm_query_addr_resp" => ucma::QueryAddrResp {
            node_guid, port_num, reserved, pkey, src_size, dst_size, src_addr, dst_addr,
            ibdev_index, reserved1,
        },
        "struct rdma_ucm_conn_param" => ucma::ConnParam {
            qp_num, qkey, private_data, private_data_len, srq, responder_resources,
            initiator_depth, flow_control, retry_count, rnr_retry_count, valid,
        },
        "struct rdma_ucm_ud_param" => ucma::UdParam {
            qp_num, qkey, ah_attr, private_data, private_data_len, reserved,
        },
        "struct rdma_ucm_ece" => ucma::Ece { vendor_id, attr_mod },
        "struct rdma_ucm_connect" => ucma::Connect { conn_param, id, reserved, ece },
        "struct rdma_ucm_listen" => ucma::Listen { id, backlog },
        "struct rdma_ucm_accept" => ucma::Accept { uid, conn_param, id, reserved, ece },
        "struct rdma_ucm_reject" => ucma::Reject {
            id, private_data_len, reason, reserved, private_data,
        },
        "struct rdma_ucm_disconnect" => ucma::Disconnect { id },
        "struct rdma_ucm_init_qp_attr" => ucma::InitQpAttr { response, id, qp_state },
        "struct ib_uverbs_qp_attr" => ucma::QpAttrResp {
            qp_attr_mask, qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn,
            sq_psn, dest_qp_num, qp_access_flags, ah_attr, alt_ah_attr, max_send_wr,
            max_recv_wr, max_send_sge, max_recv_sge, max_inline_data, pkey_index,
            alt_pkey_index, en_sqd_async_notify, sq_draining, max_rd_atomic,
            max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry,
            alt_port_num, alt_timeout, reserved,
        },
        "struct rdma_ucm_get_event" => ucma::GetEvent { response },
        "struct rdma_ucm_event_resp" => ucma::EventResp {
            uid, id, event, status, param, reserved, ece,
        },
        "struct rdma_ucm_set_option" => ucma::SetOption { optval, id, level, optname, optlen },
        "struct rdma_ucm_notify" => ucma::Notify { id, event },
    }
}

fn c_program(layouts: &[Layout]) -> String {
    let mut src = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <rdma/ib_user_verbs.h>\n\
         #include <rdma/rdma_user_rxe.h>\n#include <rdma/rdma_user_cm.h>\n\
         #include <rdma/rdma_user_ioctl_cmds.h>\n#include <rdma/ib_user_ioctl_verbs.h>\n\
         int main(void) {\n",
    );
    for l in layouts {
        writeln!(
            src,
            "printf(\"{t} size %zu\\n\", sizeof({t}));",
            t = l.c_type
        )
        .unwrap();
        for (field, _) in &l.fields {
            writeln!(
                src,
                "printf(\"{t}.{field} %zu\\n\", offsetof({t}, {field}));",
                t = l.c_type
            )
            .unwrap();
        }
    }
    src.push_str("return 0;\n}\n");
    src
}

fn rust_lines(layouts: &[Layout]) -> Vec<String> {
    let mut lines = Vec::new();
    for l in layouts {
        lines.push(format!("{} size {}", l.c_type, l.size));
        for (field, off) in &l.fields {
            lines.push(format!("{}.{} {}", l.c_type, field, off));
        }
    }
    lines
}

/// Compiles and runs `program` against the system headers; its standard output, or `None`
/// (skipped, with a message) on a machine without a C compiler.
fn run_c(name: &str, program: &str) -> Option<String> {
    let dir = std::env::temp_dir().join(format!("vrdma-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{name}.c"));
    let bin = dir.join(name);
    std::fs::write(&src, program).unwrap();
    let compiled = match Command::new("cc").arg(&src).arg("-o").arg(&bin).output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("skipping the ABI check {name}: no C compiler `cc` on this machine");
            let _ = std::fs::remove_dir_all(&dir);
            return None;
        }
        Err(e) => panic!("running cc: {e}"),
    };
    assert!(
        compiled.status.success(),
        "cc failed (are the linux uapi headers installed?):\n{}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    let run = Command::new(&bin).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(run.status.success());
    Some(String::from_utf8(run.stdout).unwrap())
}

/// Every command code this layer sends, against `enum ib_uverbs_write_cmds` (ALLOC_MW and
/// DEALLOC_MW were once sent as ATTACH_MCAST/DETACH_MCAST, which only the kernel noticed).
#[test]
fn command_codes_match_the_c_headers() {
    let codes = [
        ("GET_CONTEXT", cmd::GET_CONTEXT),
        ("QUERY_DEVICE", cmd::QUERY_DEVICE),
        ("QUERY_PORT", cmd::QUERY_PORT),
        ("ALLOC_PD", cmd::ALLOC_PD),
        ("DEALLOC_PD", cmd::DEALLOC_PD),
        ("CREATE_AH", cmd::CREATE_AH),
        ("DESTROY_AH", cmd::DESTROY_AH),
        ("REG_MR", cmd::REG_MR),
        ("REREG_MR", cmd::REREG_MR),
        ("DEREG_MR", cmd::DEREG_MR),
        ("ALLOC_MW", cmd::ALLOC_MW),
        ("DEALLOC_MW", cmd::DEALLOC_MW),
        ("CREATE_COMP_CHANNEL", cmd::CREATE_COMP_CHANNEL),
        ("CREATE_CQ", cmd::CREATE_CQ),
        ("RESIZE_CQ", cmd::RESIZE_CQ),
        ("DESTROY_CQ", cmd::DESTROY_CQ),
        ("REQ_NOTIFY_CQ", cmd::REQ_NOTIFY_CQ),
        ("CREATE_QP", cmd::CREATE_QP),
        ("QUERY_QP", cmd::QUERY_QP),
        ("MODIFY_QP", cmd::MODIFY_QP),
        ("DESTROY_QP", cmd::DESTROY_QP),
        ("POST_SEND", cmd::POST_SEND),
        ("CREATE_SRQ", cmd::CREATE_SRQ),
        ("MODIFY_SRQ", cmd::MODIFY_SRQ),
        ("DESTROY_SRQ", cmd::DESTROY_SRQ),
    ];
    let mut program =
        String::from("#include <stdio.h>\n#include <rdma/ib_user_verbs.h>\nint main(void) {\n");
    for (name, _) in &codes {
        let _ = writeln!(
            program,
            "printf(\"{name} %d\\n\", IB_USER_VERBS_CMD_{name});"
        );
    }
    program.push_str("return 0;\n}\n");
    let Some(c_out) = run_c("command-codes", &program) else {
        return;
    };
    let expected: String = codes.iter().map(|(n, v)| format!("{n} {v}\n")).collect();
    assert_eq!(c_out, expected);
}

/// The extended command this layer sends (EX_QUERY_DEVICE) and the flag that marks it.
#[test]
fn extended_command_constants_match_the_c_headers() {
    let constants: [(&str, u64); 2] = [
        (
            "IB_USER_VERBS_EX_CMD_QUERY_DEVICE",
            cmd::QUERY_DEVICE.into(),
        ),
        ("IB_USER_VERBS_CMD_FLAG_EXTENDED", CMD_FLAG_EXTENDED.into()),
    ];
    constants_match("extended-commands", &["rdma/ib_user_verbs.h"], &constants);
}

/// Checks each of `constants` (a C expression, the value this layer uses) against what the C
/// compiler makes of it with `headers` included.
fn constants_match(name: &str, headers: &[&str], constants: &[(&str, u64)]) {
    let mut program = String::from("#include <stdio.h>\n");
    for header in headers {
        let _ = writeln!(program, "#include <{header}>");
    }
    program.push_str("int main(void) {\n");
    for (name, _) in constants {
        let _ = writeln!(
            program,
            "printf(\"{name} %llu\\n\", (unsigned long long)({name}));"
        );
    }
    program.push_str("return 0;\n}\n");
    let Some(c_out) = run_c(name, &program) else {
        return;
    };
    let expected: String = constants
        .iter()
        .map(|(n, v)| format!("{n} {v}\n"))
        .collect();
    assert_eq!(c_out, expected);
}

/// The ioctl constants of the send kick and the device's other ioctls
/// (`vrdma_spec::rxe_v1::kick`), against the uapi headers' enums and macros.
#[test]
fn ioctl_constants_match_the_c_headers() {
    use vrdma_spec::rxe_v1::kick::{self, invoke_write_attr};
    let constants: [(&str, u64); 8] = [
        ("RDMA_VERBS_IOCTL", kick::RDMA_VERBS_IOCTL),
        ("RDMA_DRIVER_RXE", kick::DRIVER_RXE.into()),
        ("UVERBS_OBJECT_DEVICE", kick::OBJECT_DEVICE.into()),
        (
            "UVERBS_METHOD_INVOKE_WRITE",
            kick::METHOD_INVOKE_WRITE.into(),
        ),
        ("UVERBS_ATTR_CORE_IN", invoke_write_attr::CORE_IN.into()),
        ("UVERBS_ATTR_CORE_OUT", invoke_write_attr::CORE_OUT.into()),
        ("UVERBS_ATTR_WRITE_CMD", invoke_write_attr::WRITE_CMD.into()),
        ("UVERBS_ATTR_F_MANDATORY", kick::ATTR_F_MANDATORY.into()),
    ];
    constants_match(
        "ioctl-constants",
        &[
            "rdma/rdma_user_ioctl_cmds.h",
            "rdma/ib_user_ioctl_cmds.h",
            "rdma/ib_user_ioctl_verbs.h",
            "rdma/rdma_user_ioctl.h",
        ],
        &constants,
    );
}

#[test]
fn abi_structs_match_the_c_headers() {
    let layouts = all_layouts();
    let Some(c_out) = run_c("layout", &c_program(&layouts)) else {
        return;
    };
    let c_lines: Vec<&str> = c_out.lines().collect();
    let expected = rust_lines(&layouts);
    assert_eq!(c_lines.len(), expected.len());
    let mismatches: Vec<String> = expected
        .iter()
        .zip(&c_lines)
        .filter(|(rust, c)| rust.as_str() != **c)
        .map(|(rust, c)| format!("rust: {rust:<60} C: {c}"))
        .collect();
    assert!(
        mismatches.is_empty(),
        "layout mismatches:\n{}",
        mismatches.join("\n")
    );
}

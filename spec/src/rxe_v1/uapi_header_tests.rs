//! Compares every size and offset of the rxe v1 layout, and the opcode values written into
//! send WQEs and read from CQEs ([`WrOpcode`], [`WcOpcode`]), with the C compiler's view of
//! the system's uapi headers (`<rdma/ib_user_verbs.h>`, `<rdma/rdma_user_rxe.h>`).

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::mem::{offset_of, size_of};
use std::process::Command;

use super::*;
use crate::verbs::{WcOpcode, WrOpcode};

/// One fact about the C headers, as a C expression and the value Rust says it has.
struct Fact {
    c_expr: String,
    rust: usize,
}

fn size(c_type: &str, rust: usize) -> Fact {
    Fact {
        c_expr: format!("sizeof(struct {c_type})"),
        rust,
    }
}

fn offset(c_type: &str, c_field: &str, rust: usize) -> Fact {
    Fact {
        c_expr: format!("offsetof(struct {c_type}, {c_field})"),
        rust,
    }
}

/// A C enumerator (or other constant expression) and the value Rust gives it.
fn constant(c_name: &str, rust: u32) -> Fact {
    Fact {
        c_expr: c_name.to_string(),
        rust: rust as usize,
    }
}

fn layout_facts() -> Vec<Fact> {
    let wr = offset_of!(RxeSendWqe, wr) + offset_of!(RxeSendWr, wr);
    vec![
        size("rxe_queue_buf", size_of::<RxeQueueBuf>()),
        offset(
            "rxe_queue_buf",
            "log2_elem_size",
            offset_of!(RxeQueueBuf, log2_elem_size),
        ),
        offset(
            "rxe_queue_buf",
            "index_mask",
            offset_of!(RxeQueueBuf, index_mask),
        ),
        offset(
            "rxe_queue_buf",
            "producer_index",
            offset_of!(RxeQueueBuf, producer_index),
        ),
        offset(
            "rxe_queue_buf",
            "consumer_index",
            offset_of!(RxeQueueBuf, consumer_index),
        ),
        offset("rxe_queue_buf", "data", size_of::<RxeQueueBuf>()),
        size("rxe_sge", size_of::<RxeSge>()),
        offset("rxe_sge", "addr", offset_of!(RxeSge, addr)),
        offset("rxe_sge", "length", offset_of!(RxeSge, length)),
        offset("rxe_sge", "lkey", offset_of!(RxeSge, lkey)),
        size("rxe_dma_info", size_of::<RxeDmaInfo>()),
        offset("rxe_dma_info", "length", offset_of!(RxeDmaInfo, length)),
        offset("rxe_dma_info", "resid", offset_of!(RxeDmaInfo, resid)),
        offset("rxe_dma_info", "cur_sge", offset_of!(RxeDmaInfo, cur_sge)),
        offset("rxe_dma_info", "num_sge", offset_of!(RxeDmaInfo, num_sge)),
        offset(
            "rxe_dma_info",
            "sge_offset",
            offset_of!(RxeDmaInfo, sge_offset),
        ),
        offset("rxe_dma_info", "reserved", offset_of!(RxeDmaInfo, reserved)),
        offset("rxe_dma_info", "sge", size_of::<RxeDmaInfo>()),
        offset("rxe_dma_info", "inline_data", size_of::<RxeDmaInfo>()),
        size("rxe_av", size_of::<RxeAv>()),
        size("rxe_send_wr", size_of::<RxeSendWr>()),
        offset("rxe_send_wr", "wr_id", offset_of!(RxeSendWr, wr_id)),
        offset("rxe_send_wr", "reserved", offset_of!(RxeSendWr, reserved)),
        offset("rxe_send_wr", "opcode", offset_of!(RxeSendWr, opcode)),
        offset(
            "rxe_send_wr",
            "send_flags",
            offset_of!(RxeSendWr, send_flags),
        ),
        offset("rxe_send_wr", "ex.imm_data", offset_of!(RxeSendWr, ex)),
        offset(
            "rxe_send_wr",
            "ex.invalidate_rkey",
            offset_of!(RxeSendWr, ex),
        ),
        offset("rxe_send_wr", "wr", offset_of!(RxeSendWr, wr)),
        size("rxe_send_wqe", size_of::<RxeSendWqe>()),
        offset("rxe_send_wqe", "wr", offset_of!(RxeSendWqe, wr)),
        offset("rxe_send_wqe", "status", offset_of!(RxeSendWqe, status)),
        offset("rxe_send_wqe", "state", offset_of!(RxeSendWqe, state)),
        offset("rxe_send_wqe", "iova", offset_of!(RxeSendWqe, iova)),
        offset("rxe_send_wqe", "mask", offset_of!(RxeSendWqe, mask)),
        offset(
            "rxe_send_wqe",
            "first_psn",
            offset_of!(RxeSendWqe, first_psn),
        ),
        offset("rxe_send_wqe", "last_psn", offset_of!(RxeSendWqe, last_psn)),
        offset(
            "rxe_send_wqe",
            "ack_length",
            offset_of!(RxeSendWqe, ack_length),
        ),
        offset("rxe_send_wqe", "ssn", offset_of!(RxeSendWqe, ssn)),
        offset(
            "rxe_send_wqe",
            "has_rd_atomic",
            offset_of!(RxeSendWqe, has_rd_atomic),
        ),
        offset("rxe_send_wqe", "dma", offset_of!(RxeSendWqe, dma)),
        offset("rxe_send_wqe", "dma.sge", size_of::<RxeSendWqe>()),
        offset("rxe_send_wqe", "dma.inline_data", size_of::<RxeSendWqe>()),
        offset(
            "rxe_send_wqe",
            "wr.wr.rdma.remote_addr",
            wr + offset_of!(RxeRdmaWr, remote_addr),
        ),
        offset(
            "rxe_send_wqe",
            "wr.wr.rdma.rkey",
            wr + offset_of!(RxeRdmaWr, rkey),
        ),
        offset(
            "rxe_send_wqe",
            "wr.wr.atomic.remote_addr",
            wr + offset_of!(RxeAtomicWr, remote_addr),
        ),
        offset(
            "rxe_send_wqe",
            "wr.wr.atomic.compare_add",
            wr + offset_of!(RxeAtomicWr, compare_add),
        ),
        offset(
            "rxe_send_wqe",
            "wr.wr.atomic.swap",
            wr + offset_of!(RxeAtomicWr, swap),
        ),
        offset(
            "rxe_send_wqe",
            "wr.wr.atomic.rkey",
            wr + offset_of!(RxeAtomicWr, rkey),
        ),
        offset(
            "rxe_send_wqe",
            "wr.wr.ud.remote_qpn",
            wr + offset_of!(RxeUdWr, remote_qpn),
        ),
        offset(
            "rxe_send_wqe",
            "wr.wr.ud.remote_qkey",
            wr + offset_of!(RxeUdWr, remote_qkey),
        ),
        offset(
            "rxe_send_wqe",
            "wr.wr.ud.pkey_index",
            wr + offset_of!(RxeUdWr, pkey_index),
        ),
        offset(
            "rxe_send_wqe",
            "wr.wr.ud.ah_num",
            wr + offset_of!(RxeUdWr, ah_num),
        ),
        offset(
            "rxe_send_wqe",
            "wr.wr.ud.pad",
            wr + offset_of!(RxeUdWr, pad),
        ),
        offset("rxe_send_wqe", "wr.wr.ud.av", wr + offset_of!(RxeUdWr, av)),
        offset(
            "rxe_send_wqe",
            "wr.wr.mw.addr",
            wr + offset_of!(RxeMwWr, addr),
        ),
        offset(
            "rxe_send_wqe",
            "wr.wr.mw.length",
            wr + offset_of!(RxeMwWr, length),
        ),
        offset(
            "rxe_send_wqe",
            "wr.wr.mw.mr_lkey",
            wr + offset_of!(RxeMwWr, mr_lkey),
        ),
        offset(
            "rxe_send_wqe",
            "wr.wr.mw.mw_rkey",
            wr + offset_of!(RxeMwWr, mw_rkey),
        ),
        offset(
            "rxe_send_wqe",
            "wr.wr.mw.rkey",
            wr + offset_of!(RxeMwWr, rkey),
        ),
        offset(
            "rxe_send_wqe",
            "wr.wr.mw.access",
            wr + offset_of!(RxeMwWr, access),
        ),
        size("rxe_recv_wqe", size_of::<RxeRecvWqe>()),
        offset("rxe_recv_wqe", "wr_id", offset_of!(RxeRecvWqe, wr_id)),
        offset("rxe_recv_wqe", "reserved", offset_of!(RxeRecvWqe, reserved)),
        offset("rxe_recv_wqe", "padding", offset_of!(RxeRecvWqe, padding)),
        offset("rxe_recv_wqe", "dma", offset_of!(RxeRecvWqe, dma)),
        offset("rxe_recv_wqe", "dma.sge", size_of::<RxeRecvWqe>()),
        size("ib_uverbs_wc", size_of::<IbUverbsWc>()),
        offset("ib_uverbs_wc", "wr_id", offset_of!(IbUverbsWc, wr_id)),
        offset("ib_uverbs_wc", "status", offset_of!(IbUverbsWc, status)),
        offset("ib_uverbs_wc", "opcode", offset_of!(IbUverbsWc, opcode)),
        offset(
            "ib_uverbs_wc",
            "vendor_err",
            offset_of!(IbUverbsWc, vendor_err),
        ),
        offset("ib_uverbs_wc", "byte_len", offset_of!(IbUverbsWc, byte_len)),
        offset("ib_uverbs_wc", "ex.imm_data", offset_of!(IbUverbsWc, ex)),
        offset("ib_uverbs_wc", "qp_num", offset_of!(IbUverbsWc, qp_num)),
        offset("ib_uverbs_wc", "src_qp", offset_of!(IbUverbsWc, src_qp)),
        offset("ib_uverbs_wc", "wc_flags", offset_of!(IbUverbsWc, wc_flags)),
        offset(
            "ib_uverbs_wc",
            "pkey_index",
            offset_of!(IbUverbsWc, pkey_index),
        ),
        offset("ib_uverbs_wc", "slid", offset_of!(IbUverbsWc, slid)),
        offset("ib_uverbs_wc", "sl", offset_of!(IbUverbsWc, sl)),
        offset(
            "ib_uverbs_wc",
            "dlid_path_bits",
            offset_of!(IbUverbsWc, dlid_path_bits),
        ),
        offset("ib_uverbs_wc", "port_num", offset_of!(IbUverbsWc, port_num)),
        offset("ib_uverbs_wc", "reserved", offset_of!(IbUverbsWc, reserved)),
    ]
}

fn opcode_facts() -> Vec<Fact> {
    let wr_opcodes = [
        ("IB_UVERBS_WR_RDMA_WRITE", WrOpcode::RdmaWrite),
        (
            "IB_UVERBS_WR_RDMA_WRITE_WITH_IMM",
            WrOpcode::RdmaWriteWithImm,
        ),
        ("IB_UVERBS_WR_SEND", WrOpcode::Send),
        ("IB_UVERBS_WR_SEND_WITH_IMM", WrOpcode::SendWithImm),
        ("IB_UVERBS_WR_RDMA_READ", WrOpcode::RdmaRead),
        ("IB_UVERBS_WR_ATOMIC_CMP_AND_SWP", WrOpcode::AtomicCmpAndSwp),
        (
            "IB_UVERBS_WR_ATOMIC_FETCH_AND_ADD",
            WrOpcode::AtomicFetchAndAdd,
        ),
        ("IB_UVERBS_WR_LOCAL_INV", WrOpcode::LocalInv),
        ("IB_UVERBS_WR_BIND_MW", WrOpcode::BindMw),
        ("IB_UVERBS_WR_SEND_WITH_INV", WrOpcode::SendWithInv),
    ];
    let mut facts: Vec<Fact> = wr_opcodes
        .iter()
        .map(|(c_name, op)| constant(c_name, *op as u32))
        .collect();
    // The 6.1 uapi names completion opcodes up to TSO; FLUSH (8) and ATOMIC_WRITE (9)
    // arrived in 6.2 and are checked against rdma-core's values in `verbs::completion`'s tests.
    let wc_opcodes = [
        ("IB_UVERBS_WC_SEND", WcOpcode::Send),
        ("IB_UVERBS_WC_RDMA_WRITE", WcOpcode::RdmaWrite),
        ("IB_UVERBS_WC_RDMA_READ", WcOpcode::RdmaRead),
        ("IB_UVERBS_WC_COMP_SWAP", WcOpcode::CompSwap),
        ("IB_UVERBS_WC_FETCH_ADD", WcOpcode::FetchAdd),
        ("IB_UVERBS_WC_BIND_MW", WcOpcode::BindMw),
        ("IB_UVERBS_WC_LOCAL_INV", WcOpcode::LocalInv),
        ("IB_UVERBS_WC_TSO", WcOpcode::Tso),
    ];
    facts.extend(
        wc_opcodes
            .iter()
            .map(|(c_name, op)| constant(c_name, op.raw())),
    );
    facts
}

fn c_program(facts: &[Fact]) -> String {
    let mut src = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <rdma/ib_user_verbs.h>\n\
         #include <rdma/rdma_user_rxe.h>\nint main(void)\n{\n",
    );
    for (i, fact) in facts.iter().enumerate() {
        src.push_str(&format!(
            "\tprintf(\"{i} %lu\\n\", (unsigned long)({}));\n",
            fact.c_expr
        ));
    }
    src.push_str("\treturn 0;\n}\n");
    src
}

/// Compiles a C program against the system's uapi headers and compares every size, offset
/// and constant it prints with the Rust definitions.
#[test]
fn layouts_match_system_uapi_headers() {
    check_against_system_uapi_headers("layout", &layout_facts());
}

/// Compiles a C program against the system's uapi headers and compares every opcode it prints
/// with the Rust definitions.
#[test]
fn opcodes_match_system_uapi_headers() {
    check_against_system_uapi_headers("opcode", &opcode_facts());
}

/// Prints every fact's C expression from a C program built with the system's `cc` and
/// compares each with the Rust value; skips (passes) when there is no `cc` on `PATH`.
/// `what` names the facts in the program's files and in the failure message.
fn check_against_system_uapi_headers(what: &str, facts: &[Fact]) {
    match Command::new("cc").arg("--version").output() {
        Err(e) if e.kind() == ErrorKind::NotFound => {
            eprintln!("skipped: no C compiler `cc` on PATH to check the uapi headers with");
            return;
        }
        Err(e) => panic!("running cc: {e}"),
        Ok(_) => {}
    }
    // One directory per check: the tests of one process run in parallel.
    let dir = std::env::temp_dir().join(format!("vrdma-spec-rxe-v1-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{what}.c"));
    let bin = dir.join(what);
    std::fs::write(&src, c_program(facts)).unwrap();
    let cc = Command::new("cc")
        .arg("-Wall")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .output()
        .unwrap();
    let run = cc
        .status
        .success()
        .then(|| Command::new(&bin).output().unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        cc.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let run = run.unwrap();
    assert!(run.status.success());
    let printed: BTreeMap<usize, usize> = String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let (i, v) = line.split_once(' ').unwrap();
            (i.parse().unwrap(), v.parse().unwrap())
        })
        .collect();
    assert_eq!(printed.len(), facts.len());
    let wrong: Vec<String> = facts
        .iter()
        .enumerate()
        .filter(|(i, fact)| printed[i] != fact.rust)
        .map(|(i, fact)| format!("{}: C {} Rust {}", fact.c_expr, printed[&i], fact.rust))
        .collect();
    assert!(wrong.is_empty(), "{what} mismatches:\n{}", wrong.join("\n"));
}

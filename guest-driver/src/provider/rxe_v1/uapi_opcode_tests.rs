//! Compares the opcode values the provider writes into send WQEs and reads from CQEs with the
//! system's uapi headers (`<rdma/ib_user_verbs.h>`); the layout of the WQEs and CQEs themselves
//! is checked where it is defined, in `vrdma_spec::rxe_v1`.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::process::Command;

use crate::provider::{WcOpcode, WrOpcode};

/// The C enumerator names and the values Rust gives them.
fn facts() -> Vec<(&'static str, u32)> {
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
    ];
    let mut f: Vec<_> = wr_opcodes.iter().map(|(c, op)| (*c, *op as u32)).collect();
    // The 6.1 uapi names completion opcodes up to TSO; FLUSH (8) and ATOMIC_WRITE (9)
    // arrived in 6.2 and are checked against rdma-core's values in `provider` tests.
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
    f.extend(wc_opcodes.iter().map(|(c, op)| (*c, op.raw())));
    f
}

fn c_program(facts: &[(&str, u32)]) -> String {
    let mut src =
        String::from("#include <stdio.h>\n#include <rdma/ib_user_verbs.h>\nint main(void)\n{\n");
    for (i, (c_name, _)) in facts.iter().enumerate() {
        src.push_str(&format!(
            "\tprintf(\"{i} %lu\\n\", (unsigned long)({c_name}));\n"
        ));
    }
    src.push_str("\treturn 0;\n}\n");
    src
}

/// Compiles a C program against the system's uapi headers and compares every opcode it prints
/// with the Rust definitions.
#[test]
fn opcodes_match_system_uapi_headers() {
    match Command::new("cc").arg("--version").output() {
        Err(e) if e.kind() == ErrorKind::NotFound => {
            eprintln!("skipped: no C compiler `cc` on PATH to check the uapi headers with");
            return;
        }
        Err(e) => panic!("running cc: {e}"),
        Ok(_) => {}
    }
    let facts = facts();
    let dir = std::env::temp_dir().join(format!("vrdma-rxe-opcodes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("opcodes.c");
    let bin = dir.join("opcodes");
    std::fs::write(&src, c_program(&facts)).unwrap();
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
    let printed: BTreeMap<usize, u64> = String::from_utf8(run.stdout)
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
        .filter(|(i, (_, rust))| printed[i] != u64::from(*rust))
        .map(|(i, (c_name, rust))| format!("{c_name}: C {} Rust {rust}", printed[&i]))
        .collect();
    assert!(wrong.is_empty(), "opcode mismatches:\n{}", wrong.join("\n"));
}

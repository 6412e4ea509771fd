//! vrdma in process mode on real rxe: the whole process-pingpong scenario in the VM.

mod common;

use vrdma_qemu_tests::scenarios::process_pingpong::Results;

#[test]
fn process_pingpong_verifies_bypasses_isolates_and_cleans_up() {
    let json = common::scratch("process-pingpong.json");
    let json_arg = json.to_string_lossy().into_owned();
    if common::vrdma_vm(&[
        "test",
        "process-pingpong",
        "--no-build",
        "--json",
        &json_arg,
    ])
    .is_none()
    {
        return;
    }
    let results: Results = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).unwrap();

    assert_eq!(results.perftest.len(), 5, "native perftest baseline");
    let ops = ["send", "send_imm", "write", "write_imm", "read"];
    let sizes = [1u32, 64, 4096, 65536, 1048576];
    for label in [
        "native-over-native",
        "vrdma-over-native",
        "native-over-vrdma",
        "vrdma-over-vrdma",
    ] {
        let rows = &results.pingpong[label];
        for op in ops {
            for size in sizes {
                let row = rows
                    .iter()
                    .find(|r| r.op == op && r.size == size && r.latency.is_some())
                    .unwrap_or_else(|| panic!("{label}: no verified row for {op} {size}"));
                assert!(row.iters > 0, "{label}: {row:?}");
                let latency = row.latency.as_ref().unwrap();
                assert!(
                    latency.typical_us > 0.0 && latency.p99_us >= latency.typical_us,
                    "{row:?}"
                );
            }
        }
        for op in ["write", "send"] {
            for size in [4096u32, 65536, 1048576] {
                let row = rows
                    .iter()
                    .find(|r| r.op == op && r.size == size && r.latency.is_none())
                    .unwrap_or_else(|| panic!("{label}: no bandwidth row for {op} {size}"));
                assert!(row.mib_s > 0.0 && row.mmsg_s > 0.0, "{label}: {row:?}");
            }
        }
    }
    let ud = &results.pingpong["ud-vrdma-over-native"];
    assert_eq!(ud.len(), 3, "{ud:?}");
    assert!(results.bypass_messages > 0);
    assert_eq!(results.cleanup_rounds, 50);
    let (fds_first, fds_last) = results.backend_fds;
    assert!(
        fds_first > 0 && fds_last <= fds_first,
        "{:?}",
        results.backend_fds
    );
}

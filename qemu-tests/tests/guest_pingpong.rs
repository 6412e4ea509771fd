//! The full-guest test: a Linux guest with the vrdma device runs vrdma-pingpong over the PCI
//! transport. Without KVM in the rxe VM (this project's CI) it must report itself skipped,
//! with the reason, and not fail.

mod common;

use vrdma_qemu_tests::scenarios::guest_pingpong::Outcome;

#[test]
fn guest_pingpong_runs_or_says_why_it_cannot() {
    let json = common::scratch("guest-pingpong.json");
    let json_arg = json.to_string_lossy().into_owned();
    if common::vrdma_vm(&["test", "guest-pingpong", "--no-build", "--json", &json_arg]).is_none() {
        return;
    }
    let outcome: Outcome = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).unwrap();
    match outcome {
        Outcome::Skipped { reason } => {
            assert!(reason.starts_with("needs KVM for the guest"), "{reason}");
            eprintln!("guest-pingpong skipped: {reason}");
        }
        Outcome::Passed { report, .. } => {
            for op in ["send", "send_imm", "write", "write_imm", "read"] {
                assert!(report.contains(op), "no {op} row in:\n{report}");
            }
        }
    }
}

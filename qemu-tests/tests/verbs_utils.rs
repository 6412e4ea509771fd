//! Debian's unmodified libibverbs example programs over vrdma's drop-in, in the rxe VM.

mod common;

use vrdma_qemu_tests::scenarios::verbs_utils::{Run, PROGRAMS};

#[test]
fn ibverbs_examples_run_unmodified_over_vrdma() {
    let Some(runs) = common::vrdma_vm_json::<Vec<Run>>(&["test", "verbs-utils"]) else {
        return;
    };

    let pairings = [
        ("native", "native"),
        ("vrdma", "native"),
        ("native", "vrdma"),
        ("vrdma", "vrdma"),
    ];
    let expected: Vec<(String, &str, &str)> = PROGRAMS
        .iter()
        .flat_map(|p| {
            let program = format!("{} {}", p.command, p.args.join(" "));
            pairings.map(|(s, c)| (program.clone(), s, c))
        })
        .collect();
    let got: Vec<(String, &str, &str)> = runs
        .iter()
        .map(|r| (r.program.clone(), r.server.as_str(), r.client.as_str()))
        .collect();
    assert_eq!(got, expected);
    for run in &runs {
        // Both sides' own result lines: the guest half checked their iteration counts.
        assert_eq!(run.server_report.len(), 2, "{run:?}");
        assert_eq!(run.client_report.len(), 2, "{run:?}");
        assert!(run.client_report[0].contains("Mbit/sec"), "{run:?}");
    }
}

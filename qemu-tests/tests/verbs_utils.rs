//! Debian's unmodified libibverbs example programs over vrdma's drop-in, in the rxe VM.

mod common;

use vrdma_qemu_tests::scenarios::verbs_utils::{Run, PROGRAMS, STAGED_PAIRINGS, STAGED_PROGRAMS};

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
    let name = |p: &vrdma_qemu_tests::scenarios::verbs_utils::Program| {
        format!("{} {}", p.command, p.args.join(" "))
    };
    // Every program in every pairing, then some again through staging rings (spec §9.7).
    let expected: Vec<(String, &str, &str)> = PROGRAMS
        .iter()
        .flat_map(|p| pairings.map(|(s, c)| (name(p), s, c)))
        .chain(
            STAGED_PROGRAMS
                .iter()
                .flat_map(|p| STAGED_PAIRINGS.map(|(s, c)| (name(p), s, c))),
        )
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

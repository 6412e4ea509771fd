//! Debian's unmodified librdmacm example programs over vrdma's drop-in, in the rxe VM.

mod common;

use vrdma_qemu_tests::scenarios::rdmacm_utils::{Run, PROGRAMS};

#[test]
fn rdmacm_examples_run_unmodified_over_vrdma() {
    let Some(runs) = common::vrdma_vm_json::<Vec<Run>>(&["test", "rdmacm-utils"]) else {
        return;
    };
    let pairings = [("vrdma", "native"), ("native", "vrdma"), ("vrdma", "vrdma")];
    let expected: Vec<(String, &str, &str)> = PROGRAMS
        .iter()
        .flat_map(|p| {
            let program = format!("{} {}", p.server, p.args.join(" "));
            pairings.map(|(s, c)| (program.clone(), s, c))
        })
        .collect();
    let got: Vec<(String, &str, &str)> = runs
        .iter()
        .map(|r| (r.program.clone(), r.server.as_str(), r.client.as_str()))
        .collect();
    assert_eq!(got, expected);
    for run in &runs {
        let vrdma_sides = [&run.server, &run.client]
            .iter()
            .filter(|s| **s == "vrdma")
            .count();
        assert_eq!(run.backend_sessions, vrdma_sides, "{run:?}");
        assert!(
            !run.server_report.is_empty() && !run.client_report.is_empty(),
            "{run:?}"
        );
    }
}

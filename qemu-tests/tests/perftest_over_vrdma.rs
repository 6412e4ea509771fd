//! Unmodified Debian perftest over vrdma's drop-in libibverbs.so.1 in the rxe VM: natively,
//! client over vrdma against a native server, and both sides over vrdma, from one boot.

mod common;

use vrdma_qemu_tests::perftest::{Row, BASELINE};
use vrdma_qemu_tests::scenarios::perftest_over_vrdma::{NATIVE, VRDMA_BOTH, VRDMA_CLIENT};

#[test]
fn perftest_runs_unmodified_over_vrdma() {
    let Some(rows) = common::vrdma_vm_json::<Vec<Row>>(&["test", "perftest-over-vrdma"]) else {
        return;
    };

    let expected: Vec<(&str, _)> = [NATIVE, VRDMA_CLIENT, VRDMA_BOTH]
        .iter()
        .flat_map(|label| BASELINE.iter().map(move |case| (*label, case.tool)))
        .collect();
    let got: Vec<(&str, _)> = rows.iter().map(|r| (r.label.as_str(), r.tool)).collect();
    assert_eq!(got, expected);
    for (row, case) in rows.iter().zip(BASELINE.iter().cycle()) {
        common::assert_sane_row(row, case);
    }
}

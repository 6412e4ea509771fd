//! The native perftest baseline, run for real in the rxe VM.

mod common;

use vrdma_qemu_tests::perftest::{Row, Tool, BASELINE};

#[test]
fn native_perftest_reports_five_sane_rows() {
    let Some(rows) = common::vrdma_vm_json::<Vec<Row>>(&["test", "native-perftest"]) else {
        return;
    };

    let tools: Vec<Tool> = rows.iter().map(|r| r.tool).collect();
    let expected: Vec<Tool> = BASELINE.iter().map(|c| c.tool).collect();
    assert_eq!(tools, expected);
    for (row, case) in rows.iter().zip(BASELINE) {
        assert_eq!(row.label, "native");
        common::assert_sane_row(row, case);
    }
}

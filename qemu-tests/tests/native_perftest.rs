//! The native perftest baseline, run for real in the rxe VM.

mod common;

use vrdma_qemu_tests::perftest::{Measurement, Row, Tool, BASELINE};

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
        assert_eq!(row.size, case.size, "{row:?}");
        assert_eq!(row.iterations, u64::from(case.iterations), "{row:?}");
        match row.measurement {
            Measurement::Latency {
                min_us,
                typical_us,
                avg_us,
                max_us,
                p99_us,
                ..
            } => {
                // Soft-RoCE under TCG: tens of microseconds; natively a few. Either way well
                // inside (0.1 µs, 100 ms), and the order statistics must be ordered.
                assert!(typical_us > 0.1 && typical_us < 100_000.0, "{row:?}");
                assert!(min_us <= typical_us && typical_us <= max_us, "{row:?}");
                assert!(min_us <= avg_us && avg_us <= max_us, "{row:?}");
                assert!(p99_us <= max_us, "{row:?}");
            }
            Measurement::Bandwidth {
                peak_mib_s,
                avg_mib_s,
                msg_rate_mpps,
            } => {
                assert!(avg_mib_s > 1.0 && avg_mib_s < 1_000_000.0, "{row:?}");
                assert!(avg_mib_s <= peak_mib_s * 1.01, "{row:?}");
                // Message rate and bandwidth must agree on the message size.
                let implied = avg_mib_s * 1_048_576.0 / row.size as f64 / 1e6;
                assert!(
                    (msg_rate_mpps - implied).abs() <= implied * 0.05,
                    "{row:?}: {implied} Mpps implied"
                );
            }
            // run_case measures once more after an untimed run; twice untimed is a failure.
            Measurement::Untimed => panic!("perftest could not time {row:?} twice"),
        }
    }
}

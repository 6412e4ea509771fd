//! Unmodified Debian perftest over vrdma's drop-in libibverbs.so.1 in the rxe VM: natively,
//! client over vrdma against a native server, and both sides over vrdma, from one boot.

mod common;

use vrdma_qemu_tests::perftest::{Measurement, Row, BASELINE};
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
                // Soft-RoCE under TCG: tens to hundreds of microseconds; well inside
                // (0.1 µs, 100 ms) either way, with ordered order statistics.
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

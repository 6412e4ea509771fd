//! The perftest matrix: each tool and size natively and over vrdma, alternating, for several
//! rounds; the median of each side and their ratio.
//!
//! "Over vrdma" means both perftest processes (server and client) use vrdma's drop-in
//! `libibverbs.so.1` with the process transport, each its own vhost-user connection to one
//! backend: two applications in VMs talking to each other. Native means both on rxe0 through
//! rdma-core.

use serde::{Deserialize, Serialize};

use super::stats::{ratio, Summary};
use crate::error::{Error, Result};
use crate::perftest::{self, Case, Row, Side, Tool};

/// TCP port of perftest's out-of-band exchange.
const PORT: u16 = 18515;

/// Sizes of the latency tools.
const LATENCY_SIZES: &[u64] = &[2, 64, 4096];
/// Sizes of the bandwidth tools.
const BANDWIDTH_SIZES: &[u64] = &[64, 4096, 65536, 1 << 20];
/// The tools, in table order.
const TOOLS: &[Tool] = &[
    Tool::IbSendLat,
    Tool::IbWriteLat,
    Tool::IbWriteBw,
    Tool::IbSendBw,
    Tool::IbReadBw,
];

/// Iterations (`-n`) of one run: latency runs take 1000 round trips; bandwidth runs move
/// about 32 MiB (a second under TCG, where rxe moves 30–60 MiB/s) but at least 1000 and at
/// most 5000 messages, so that the small sizes measure the message rate and not setup.
fn iterations(tool: Tool, size: u64, quick: bool) -> u32 {
    let n = if tool.is_latency() {
        1000
    } else {
        ((32u64 << 20) / size).clamp(32, 5000) as u32
    };
    if quick {
        (n / 5).max(32)
    } else {
        n
    }
}

/// The cases of the full matrix, or of the short form (one size per tool).
pub fn cases(quick: bool) -> Vec<Case> {
    let mut cases = Vec::new();
    for &tool in TOOLS {
        let sizes: &[u64] = match (tool.is_latency(), quick) {
            (true, false) => LATENCY_SIZES,
            (false, false) => BANDWIDTH_SIZES,
            (true, true) => &[2],
            (false, true) => &[65536],
        };
        cases.extend(sizes.iter().map(|&size| Case {
            tool,
            size,
            iterations: iterations(tool, size, quick),
        }));
    }
    cases
}

/// The cases run with the host kick (spec §5.3, the default in process mode) and with the
/// backend's doorbell instead: small-message latency, where the doorbell's thread hop shows,
/// and one bandwidth size.
pub fn doorbell_cases(quick: bool) -> Vec<Case> {
    let picked: &[(Tool, u64)] = if quick {
        &[(Tool::IbSendLat, 2), (Tool::IbWriteLat, 2)]
    } else {
        &[
            (Tool::IbSendLat, 2),
            (Tool::IbSendLat, 64),
            (Tool::IbWriteLat, 2),
            (Tool::IbWriteLat, 64),
            (Tool::IbWriteBw, 4096),
        ]
    };
    picked_cases(picked, quick)
}

/// The cases run through the guest agent: one latency and one bandwidth size in the short
/// form, a few more in the full one.
pub fn agent_cases(quick: bool) -> Vec<Case> {
    let picked: &[(Tool, u64)] = if quick {
        &[(Tool::IbSendLat, 2), (Tool::IbWriteBw, 65536)]
    } else {
        &[
            (Tool::IbSendLat, 2),
            (Tool::IbWriteLat, 64),
            (Tool::IbWriteBw, 4096),
            (Tool::IbWriteBw, 65536),
        ]
    };
    picked_cases(picked, quick)
}

/// The cases run through staging rings (spec §9.7) and directly: a latency, and in the full
/// form more sizes; SENDs so that receives (which ring the doorbell when staged) are measured
/// too.
pub fn staged_cases(quick: bool) -> Vec<Case> {
    let picked: &[(Tool, u64)] = if quick {
        &[(Tool::IbSendLat, 2), (Tool::IbSendBw, 65536)]
    } else {
        &[
            (Tool::IbSendLat, 2),
            (Tool::IbWriteLat, 64),
            (Tool::IbSendBw, 4096),
            (Tool::IbSendBw, 65536),
            (Tool::IbWriteBw, 65536),
        ]
    };
    picked_cases(picked, quick)
}

/// The cases run with staged CQs (spec §9.8) and with CQs mapped directly: each completion
/// then waits for the backend's wake-up on the host CQ's event, which latency shows.
pub fn staged_cq_cases(quick: bool) -> Vec<Case> {
    let picked: &[(Tool, u64)] = if quick {
        &[(Tool::IbSendLat, 2)]
    } else {
        &[
            (Tool::IbSendLat, 2),
            (Tool::IbWriteLat, 64),
            (Tool::IbSendBw, 65536),
        ]
    };
    picked_cases(picked, quick)
}

/// The cases of `picked` (tool, size) with the iterations of the short or full form.
fn picked_cases(picked: &[(Tool, u64)], quick: bool) -> Vec<Case> {
    picked
        .iter()
        .map(|&(tool, size)| Case {
            tool,
            size,
            iterations: iterations(tool, size, quick),
        })
        .collect()
}

/// One row of the comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MatrixRow {
    pub tool: Tool,
    pub size: u64,
    pub iterations: u32,
    /// What `native` and `vrdma` summarize ([`perftest::Measurement::headline`]).
    pub unit: String,
    /// Over the rounds.
    pub native: Summary,
    pub vrdma: Summary,
    /// Median vrdma / median native (latency: above 1 is slower; bandwidth: below 1 is).
    pub ratio: f64,
    /// Every run, in the order they ran (label `native` or `vrdma`).
    pub runs: Vec<Row>,
}

/// Runs every case `rounds` times on each side, alternating which side goes first from one
/// round to the next so that a drift of the machine's speed hits both alike.
pub fn run(cases: &[Case], rounds: u32, native: &Side, vrdma: &Side) -> Result<Vec<MatrixRow>> {
    let mut runs: Vec<Vec<Row>> = vec![Vec::new(); cases.len()];
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [native, vrdma]
        } else {
            [vrdma, native]
        };
        for (case, case_runs) in cases.iter().zip(&mut runs) {
            for side in order {
                println!(
                    "round {}/{rounds}: {} {} size {} x{} …",
                    round + 1,
                    side.label,
                    case.tool.command(),
                    case.size,
                    case.iterations
                );
                case_runs.push(perftest::run_case(case, side, side, PORT)?);
            }
        }
    }
    cases
        .iter()
        .zip(runs)
        .map(|(case, runs)| summarize(case, &native.label, &vrdma.label, runs))
        .collect()
}

/// The row of `case` from its runs, labelled `native_label` or `vrdma_label`.
pub fn summarize(
    case: &Case,
    native_label: &str,
    vrdma_label: &str,
    runs: Vec<Row>,
) -> Result<MatrixRow> {
    let side = |label: &str| -> Result<Summary> {
        let values: Vec<f64> = runs
            .iter()
            .filter(|r| r.label == label)
            .map(|r| r.measurement.headline())
            // An untimed run (reported in the run list) has no figure to summarize.
            .filter(|v| v.is_finite())
            .collect();
        Summary::of(&values).ok_or_else(|| {
            Error::Scenario(format!(
                "{} size {}: no {label} result",
                case.tool.command(),
                case.size
            ))
        })
    };
    let native = side(native_label)?;
    let vrdma = side(vrdma_label)?;
    let ratio = ratio(vrdma.median, native.median).ok_or_else(|| {
        Error::Scenario(format!(
            "{} size {}: native median {} has no ratio",
            case.tool.command(),
            case.size,
            native.median
        ))
    })?;
    Ok(MatrixRow {
        tool: case.tool,
        size: case.size,
        iterations: case.iterations,
        unit: case.tool.headline_unit().into(),
        native,
        vrdma,
        ratio,
        runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perftest::Measurement;

    #[test]
    fn full_matrix_has_every_tool_at_its_sizes() {
        let cases = cases(false);
        assert_eq!(cases.len(), 2 * 3 + 3 * 4);
        let lat: Vec<u64> = cases
            .iter()
            .filter(|c| c.tool == Tool::IbWriteLat)
            .map(|c| c.size)
            .collect();
        assert_eq!(lat, [2, 64, 4096]);
        let bw: Vec<u64> = cases
            .iter()
            .filter(|c| c.tool == Tool::IbReadBw)
            .map(|c| c.size)
            .collect();
        assert_eq!(bw, [64, 4096, 65536, 1 << 20]);
        assert!(cases.iter().all(|c| c.iterations >= 32));
        let big = cases.iter().find(|c| c.size == 1 << 20).unwrap();
        assert_eq!(big.iterations, 32);
    }

    #[test]
    fn short_form_has_one_size_per_tool() {
        let cases = cases(true);
        assert_eq!(cases.len(), TOOLS.len());
        assert!(cases.iter().all(|c| c.iterations < 1000));
    }

    fn row(label: &str, typical_us: f64) -> Row {
        Row {
            label: label.into(),
            tool: Tool::IbSendLat,
            size: 2,
            iterations: 1000,
            measurement: Measurement::Latency {
                typical_us,
                avg_us: typical_us,
                min_us: Some(1.0),
                max_us: Some(100.0),
                stdev_us: Some(1.0),
                p99_us: Some(90.0),
                p99_9_us: Some(99.0),
            },
        }
    }

    #[test]
    fn summary_takes_medians_per_side_and_their_ratio() {
        let case = Case {
            tool: Tool::IbSendLat,
            size: 2,
            iterations: 1000,
        };
        let runs = vec![
            row("native", 10.0),
            row("vrdma", 30.0),
            row("vrdma", 20.0),
            row("native", 12.0),
            row("native", 11.0),
            row("vrdma", 25.0),
        ];
        let r = summarize(&case, "native", "vrdma", runs).unwrap();
        assert_eq!((r.native.median, r.vrdma.median), (11.0, 25.0));
        assert_eq!(r.ratio, 25.0 / 11.0);
        assert_eq!(r.runs.len(), 6);
        assert_eq!(r.unit, "typical_us");
        let missing = summarize(&case, "native", "vrdma", vec![row("native", 1.0)]);
        assert!(missing.is_err());
    }
}

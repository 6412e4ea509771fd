//! The control path: what creating and destroying CQs and QPs, moving a QP to RTS and
//! registering memory cost through vrdma (a control command over the virtqueue, the backend
//! doing the native verb; for REG_MR also the page-list transfer and the window mapping) and
//! natively.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use vrdma::dma::DEFAULT_GUEST_RAM_SIZE;

use super::ctlbench::{run_to_output, ControlPlan, Output, Programs, Via};
use super::stats::{ratio, Summary};
use crate::error::{Error, Result};

/// Per-object measurements, as the programs name them, in microseconds.
const OBJECT_OPS: &[&str] = &[
    "create_cq",
    "destroy_cq",
    "create_qp",
    "destroy_qp",
    "modify_init",
    "modify_rtr",
    "modify_rts",
];
/// The three transitions that together make "modify to RTS".
const TO_RTS: &[&str] = &["modify_init", "modify_rtr", "modify_rts"];
/// Row name of their sum.
pub const RESET_TO_RTS: &str = "modify_reset_to_rts";
/// One registration row: the programs' measurement, the row's name, the samples it
/// summarizes (registrations after the first, every deregistration).
type MrRow = (&'static str, &'static str, Samples);
/// MR measurements over ordinary pages, scaled to one GiB: the warm rows, then each
/// process's first registration alone ([`FIRST_REG_MR`]).
const MR_OPS: &[MrRow] = &[
    ("reg_mr", "reg_mr_per_gib", Samples::AfterFirst),
    ("dereg_mr", "dereg_mr_per_gib", Samples::All),
    ("reg_mr", FIRST_REG_MR, Samples::First),
];
/// Setup rate: QPs brought from nothing to RTS per second, one command at a time on both
/// sides, then with vrdma's batches (native has no batching: the same native samples).
pub const SETUP_RATE: &str = "setup_qp_to_rts";
/// See [`SETUP_RATE`].
pub const SETUP_RATE_BATCHED: &str = "setup_qp_to_rts_batched";
/// Samples of each setup-rate row (SETUP_REPS of both programs).
pub const SETUP_SAMPLES: usize = 3;

/// Rows measured again through a backend that stages every QP's queues (spec §9.7), against
/// the same native samples: what creating and connecting QPs costs without a SHMEM_MAP per
/// queue.
pub const STAGED_ROWS: &[&str] = &[
    "create_qp_staged",
    "setup_qp_to_rts_staged",
    "setup_qp_to_rts_batched_staged",
];

/// Suffix of the rows measured again with control round trips that poll for their answer
/// (`VRDMA_COMMAND_SPIN_US=500`; off by default): what the adaptive polling saves or costs.
pub const POLLING: &str = "_polling";
/// How the drop-in and `vrdma-ctlbench` are told to poll.
pub const POLLING_ENV: (&str, &str) = ("VRDMA_COMMAND_SPIN_US", "500");

/// Row of the first registration alone: vrdma's first registration of memory also fills the
/// backend's page tables for it, which later ones find done.
pub const FIRST_REG_MR: &str = "reg_mr_first_per_gib";
/// MR measurements over ordinary pages against native over a shared memfd (the memory a
/// vhost-user VM's RAM is, which vrdma always registers), scaled to one GiB.
const MR_OPS_VS_SHARED: &[MrRow] = &[
    ("reg_mr", "reg_mr_per_gib_vs_memfd", Samples::AfterFirst),
    ("dereg_mr", "dereg_mr_per_gib_vs_memfd", Samples::All),
];
/// MR measurements over 2 MiB huge pages, scaled to one GiB.
const HUGE_MR_OPS: &[MrRow] = &[
    ("reg_mr", "reg_mr_huge_per_gib", Samples::AfterFirst),
    ("dereg_mr", "dereg_mr_huge_per_gib", Samples::All),
];
/// MR measurements over 2 MiB huge pages against native over a shared hugetlbfs memfd (what
/// guest RAM on huge pages behind vhost-user is), scaled to one GiB.
const HUGE_MR_OPS_VS_SHARED: &[MrRow] = &[
    (
        "reg_mr",
        "reg_mr_huge_per_gib_vs_memfd",
        Samples::AfterFirst,
    ),
    ("dereg_mr", "dereg_mr_huge_per_gib_vs_memfd", Samples::All),
];
/// Processes of each kind (native, vrdma, native over a memfd) the registration rows take their
/// samples from, run in turn. Under TCG a process's registrations run at one of two speeds
/// for its whole life (over huge pages ~8 or ~14 ms per 256 MiB, natively and through vrdma
/// alike; measured with the backend timing its host REG_MR: 12–14 ms of the slow
/// registrations are the host kernel's), so one process per side compared a coin toss:
/// 1.08× and 1.70× for the same code in two full runs. Eight per side, from the spread of
/// eight processes of each kind (256 MiB): resampling
/// three of them per side put the pooled-median ratio anywhere in 0.97–1.17× (4 KiB pages) and
/// 1.05–1.21× (huge pages; 10th–90th percentile), all eight gave 1.04× and 1.11×. The slow
/// mode hit two of eight vrdma processes over huge pages in that run, none of the native ones.
pub const MR_PROCESSES: usize = 8;
/// Guest RAM `vrdma-ctlbench control` makes beside the buffer (its vrings and command buffers);
/// the huge-page pool must hold all of it.
const CTLBENCH_RAM_HEADROOM: u64 = 64 << 20;

/// One row: an operation's cost natively and through vrdma.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ControlRow {
    pub op: String,
    /// `us` per operation, or `ms_per_gib` for registrations.
    pub unit: String,
    pub native: Summary,
    pub vrdma: Summary,
    /// Median vrdma / median native (above 1: vrdma is slower).
    pub ratio: f64,
}

impl ControlRow {
    /// The row of `op` from its two summaries; an error names what is missing.
    pub fn compare(
        op: &str,
        unit: &str,
        native: Option<Summary>,
        vrdma: Option<Summary>,
    ) -> Result<ControlRow> {
        let (native, vrdma) = native
            .zip(vrdma)
            .ok_or_else(|| Error::Scenario(format!("{op}: no samples")))?;
        let ratio = ratio(vrdma.median, native.median)
            .ok_or_else(|| Error::Scenario(format!("{op}: native took no time")))?;
        Ok(ControlRow {
            op: op.into(),
            unit: unit.into(),
            native,
            vrdma,
            ratio,
        })
    }
}

/// Runs the control measurement natively, then through vrdma (backend at `socket`), and, given
/// a backend that stages every QP (`staged`), the QP rows through it ([`STAGED_ROWS`]).
pub fn run(
    programs: &Programs,
    socket: &Path,
    staged: Option<&Path>,
    plan: &ControlPlan,
) -> Result<Vec<ControlRow>> {
    // Registering a GiB under TCG takes seconds; everything else milliseconds.
    let timeout = Duration::from_secs(600);
    println!(
        "control path: {} repetitions, MR of {} MiB x{} …",
        plan.reps,
        plan.mr_bytes >> 20,
        plan.mr_reps
    );
    // The object rows: the smallest registration the programs take (the registration rows
    // come from processes of their own).
    let objects = ControlPlan {
        mr_bytes: 1 << 20,
        mr_reps: 1,
        ..*plan
    };
    let native = run_to_output(
        "bench-native-control",
        &mut programs.control(Via::Native, None, &objects)?,
        timeout,
    )?;
    let vrdma = run_to_output(
        "bench-vrdma-control",
        &mut programs.control(Via::Vrdma, Some(socket), &objects)?,
        timeout,
    )?;
    let mut rows = rows(&native, &vrdma)?;
    let polling = run_to_output(
        "bench-vrdma-control-polling",
        programs
            .control(Via::Vrdma, Some(socket), &objects)?
            .env(POLLING_ENV.0, POLLING_ENV.1),
        timeout,
    )?;
    rows.extend(rows_polling(&native, &polling)?);
    if let Some(staged) = staged {
        let through_staging = run_to_output(
            "bench-vrdma-control-staged",
            &mut programs.control(Via::Vrdma, Some(staged), &objects)?,
            timeout,
        )?;
        rows.extend(staged_rows(&native, &through_staging)?);
    }
    let ordinary = MrRuns::measure(programs, socket, &plan.registrations_only(), "", timeout)?;
    rows.extend(mr_rows(MR_OPS, &ordinary.native, &ordinary.vrdma)?);
    rows.extend(mr_rows(
        MR_OPS_VS_SHARED,
        &ordinary.native_shared,
        &ordinary.vrdma,
    )?);
    let vrdma_ram = (plan.mr_bytes + CTLBENCH_RAM_HEADROOM).max(DEFAULT_GUEST_RAM_SIZE as u64);
    match HugePagePool::reserve(vrdma_ram) {
        Ok(_pool) => {
            let huge =
                MrRuns::measure(programs, socket, &plan.over_huge_pages(), "-huge", timeout)?;
            rows.extend(mr_rows(HUGE_MR_OPS, &huge.native, &huge.vrdma)?);
            rows.extend(mr_rows(
                HUGE_MR_OPS_VS_SHARED,
                &huge.native_shared,
                &huge.vrdma,
            )?);
        }
        Err(e) => println!("control path: no huge-page rows: {e}"),
    }
    Ok(rows)
}

/// The registrations of one kind of memory, each side in [`MR_PROCESSES`] processes run in
/// turn: native, through vrdma, native over a shared memfd.
struct MrRuns {
    native: Vec<Output>,
    vrdma: Vec<Output>,
    native_shared: Vec<Output>,
}

impl MrRuns {
    /// Runs `plan` ([`ControlPlan::registrations_only`] or [`ControlPlan::over_huge_pages`]);
    /// `kind` tells the runs' logs apart.
    fn measure(
        programs: &Programs,
        socket: &Path,
        plan: &ControlPlan,
        kind: &str,
        timeout: Duration,
    ) -> Result<MrRuns> {
        let shared = ControlPlan {
            shared_memory: true,
            ..*plan
        };
        let mut runs = MrRuns {
            native: Vec::new(),
            vrdma: Vec::new(),
            native_shared: Vec::new(),
        };
        for _ in 0..MR_PROCESSES {
            runs.native.push(run_to_output(
                &format!("bench-native-mr{kind}"),
                &mut programs.control(Via::Native, None, plan)?,
                timeout,
            )?);
            runs.vrdma.push(run_to_output(
                &format!("bench-vrdma-mr{kind}"),
                &mut programs.control(Via::Vrdma, Some(socket), plan)?,
                timeout,
            )?);
            runs.native_shared.push(run_to_output(
                &format!("bench-native-mr{kind}-memfd"),
                &mut programs.control(Via::Native, None, &shared)?,
                timeout,
            )?);
        }
        Ok(runs)
    }
}

/// 2 MiB huge pages reserved in the kernel's pool (`vm.nr_hugepages`) for as long as this
/// lives; the pool goes back to its old size on drop.
struct HugePagePool {
    previous: u64,
}

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

impl HugePagePool {
    fn reserve(bytes: u64) -> Result<HugePagePool> {
        let io = |e: std::io::Error| Error::Scenario(format!("{NR_HUGEPAGES}: {e}"));
        let read = || -> Result<u64> {
            let text = std::fs::read_to_string(NR_HUGEPAGES).map_err(io)?;
            text.trim()
                .parse()
                .map_err(|e| Error::Scenario(format!("{NR_HUGEPAGES}: {e}")))
        };
        let previous = read()?;
        let wanted = previous + bytes.div_ceil(2 << 20);
        std::fs::write(NR_HUGEPAGES, wanted.to_string()).map_err(io)?;
        let pool = HugePagePool { previous };
        let got = read()?;
        if got < wanted {
            return Err(Error::Scenario(format!(
                "the kernel gave {got} of {wanted} huge pages"
            )));
        }
        Ok(pool)
    }
}

impl Drop for HugePagePool {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(NR_HUGEPAGES, self.previous.to_string()) {
            println!("control path: cannot give the huge pages back: {e}");
        }
    }
}

/// The registration rows `ops` from the two programs' outputs.
fn mr_rows(ops: &[MrRow], native: &[Output], vrdma: &[Output]) -> Result<Vec<ControlRow>> {
    ops.iter()
        .map(|&(op, name, samples)| {
            ControlRow::compare(
                name,
                "ms_per_gib",
                per_gib(native, op, samples)?,
                per_gib(vrdma, op, samples)?,
            )
        })
        .collect()
}

/// The object and setup-rate rows from the two programs' outputs.
pub fn rows(native: &Output, vrdma: &Output) -> Result<Vec<ControlRow>> {
    let mut rows = Vec::new();
    let row = ControlRow::compare;
    let micros = |out: &Output, op: &str| -> Result<Option<Summary>> {
        Ok(Summary::of_scaled(out.series(op)?, 1e-3))
    };
    for op in OBJECT_OPS {
        rows.push(row(op, "us", micros(native, op)?, micros(vrdma, op)?)?);
    }
    rows.push(row(
        RESET_TO_RTS,
        "us",
        sum_per_rep(native)?,
        sum_per_rep(vrdma)?,
    )?);
    for (name, vrdma_series) in [
        (SETUP_RATE, "setup_qp"),
        (SETUP_RATE_BATCHED, "setup_qp_batched"),
    ] {
        rows.push(row(
            name,
            "qp_per_s",
            per_second(native, "setup_qp")?,
            per_second(vrdma, vrdma_series)?,
        )?);
    }
    Ok(rows)
}

/// The object and setup rows again, from a run whose round trips poll, each named with
/// [`POLLING`].
pub fn rows_polling(native: &Output, polling: &Output) -> Result<Vec<ControlRow>> {
    let mut rows = rows(native, polling)?;
    for row in &mut rows {
        row.op.push_str(POLLING);
    }
    Ok(rows)
}

/// The [`STAGED_ROWS`] from native's output and that of a run through a staging backend.
pub fn staged_rows(native: &Output, staged: &Output) -> Result<Vec<ControlRow>> {
    let micros = |out: &Output, op: &str| -> Result<Option<Summary>> {
        Ok(Summary::of_scaled(out.series(op)?, 1e-3))
    };
    Ok(vec![
        ControlRow::compare(
            STAGED_ROWS[0],
            "us",
            micros(native, "create_qp")?,
            micros(staged, "create_qp")?,
        )?,
        ControlRow::compare(
            STAGED_ROWS[1],
            "qp_per_s",
            per_second(native, "setup_qp")?,
            per_second(staged, "setup_qp")?,
        )?,
        ControlRow::compare(
            STAGED_ROWS[2],
            "qp_per_s",
            per_second(native, "setup_qp")?,
            per_second(staged, "setup_qp_batched")?,
        )?,
    ])
}

/// Microseconds of the three transitions of each repetition together.
fn sum_per_rep(out: &Output) -> Result<Option<Summary>> {
    let series = TO_RTS
        .iter()
        .map(|op| out.series(op))
        .collect::<Result<Vec<_>>>()?;
    let reps = series.iter().map(|s| s.len()).min().unwrap_or(0);
    let sums: Vec<f64> = (0..reps)
        .map(|i| series.iter().map(|s| s[i] as f64 * 1e-3).sum())
        .collect();
    Ok(Summary::of(&sums))
}

/// Rates (per second) of a series of nanoseconds per item.
fn per_second(out: &Output, op: &str) -> Result<Option<Summary>> {
    let rates: Vec<f64> = out
        .series(op)?
        .iter()
        .map(|&ns| 1e9 / ns.max(1) as f64)
        .collect();
    Ok(Summary::of(&rates))
}

/// Which of a series' samples a row summarizes.
#[derive(Clone, Copy)]
enum Samples {
    All,
    First,
    /// All but the first, unless there is only one. A registration's first sample is its own
    /// row ([`FIRST_REG_MR`]): it also fills vrdma's page tables for the memory, which a
    /// native application did when it first touched its buffer.
    AfterFirst,
}

/// Milliseconds per GiB of `op`'s samples in every run (`which` of each run's), from the
/// registered size.
fn per_gib(runs: &[Output], op: &str, which: Samples) -> Result<Option<Summary>> {
    let mut values = Vec::new();
    for out in runs {
        let bytes = out
            .mr_bytes
            .filter(|&b| b > 0)
            .ok_or_else(|| Error::Scenario("control bench: no mr_bytes".into()))?;
        let factor = 1e-6 * (1u64 << 30) as f64 / bytes as f64;
        let series = out.series(op)?;
        let samples = match which {
            Samples::All => series,
            // `series` is never empty.
            Samples::First => &series[..1],
            Samples::AfterFirst => series
                .get(1..)
                .filter(|later| !later.is_empty())
                .unwrap_or(series),
        };
        values.extend(samples.iter().map(|&ns| ns as f64 * factor));
    }
    Ok(Summary::of(&values))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::ctlbench::parse_output;

    fn output(scale: u64) -> Output {
        let series = |base: u64| {
            format!(
                "[{},{},{}]",
                base * scale,
                2 * base * scale,
                3 * base * scale
            )
        };
        let mut fields: Vec<String> = OBJECT_OPS
            .iter()
            .map(|op| format!("\"{op}\":{}", series(1000)))
            .collect();
        fields.push(format!("\"reg_mr\":{}", series(1_000_000)));
        fields.push(format!("\"setup_qp\":{}", series(1_000)));
        fields.push(format!("\"setup_qp_batched\":{}", series(500)));
        fields.push(format!("\"dereg_mr\":{}", series(500_000)));
        parse_output(&format!(
            "{{\"mr_bytes\":{},\"samples_ns\":{{{}}}}}",
            256u64 << 20,
            fields.join(",")
        ))
        .unwrap()
    }

    #[test]
    fn rows_cover_every_op_with_medians_and_ratios() {
        let rows = rows(&output(1), &output(3)).unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r.op.as_str()).collect();
        assert_eq!(
            names,
            [
                "create_cq",
                "destroy_cq",
                "create_qp",
                "destroy_qp",
                "modify_init",
                "modify_rtr",
                "modify_rts",
                RESET_TO_RTS,
                SETUP_RATE,
                SETUP_RATE_BATCHED
            ]
        );
        let cq = &rows[0];
        assert_eq!((cq.native.median, cq.vrdma.median), (2.0, 6.0));
        assert!((cq.ratio - 3.0).abs() < 1e-12);
        // The sum of the three transitions of each repetition: 3, 6, 9 µs.
        assert_eq!(rows[7].native.median, 6.0);
        // 1, 2, 3 µs per QP natively: a median of 500 000 QPs per second; batched vrdma takes
        // 1.5× that time per QP (500 ns steps, scaled by 3): a ratio of 2/3.
        assert!(
            (rows[8].native.median - 500_000.0).abs() < 1e-6,
            "{:?}",
            rows[8]
        );
        assert!((rows[9].ratio - 2.0 / 3.0).abs() < 1e-9, "{:?}", rows[9]);
    }

    #[test]
    fn registration_rows_scale_to_a_gib() {
        let mr = mr_rows(MR_OPS, &[output(1)], &[output(3)]).unwrap();
        // The registrations after the first: 2 and 3 ms for 256 MiB, 10 ms per GiB.
        let reg = &mr[0];
        assert_eq!(
            (reg.op.as_str(), reg.unit.as_str()),
            ("reg_mr_per_gib", "ms_per_gib")
        );
        assert!((reg.native.median - 10.0).abs() < 1e-9, "{reg:?}");
        assert!((reg.ratio - 3.0).abs() < 1e-9, "{reg:?}");
        // Every deregistration: 0.5, 1, 1.5 ms, a median of 4 ms per GiB.
        assert!((mr[1].native.median - 4.0).abs() < 1e-9, "{:?}", mr[1]);
        // The first of 1, 2, 3 ms, against the first of 3, 6, 9.
        let first = &mr[2];
        assert_eq!(first.op, FIRST_REG_MR);
        assert!((first.native.median - 4.0).abs() < 1e-9, "{first:?}");
        assert!((first.ratio - 3.0).abs() < 1e-9, "{first:?}");
        let huge = mr_rows(HUGE_MR_OPS, &[output(1)], &[output(2)]).unwrap();
        assert_eq!(huge[0].op, "reg_mr_huge_per_gib");
        assert!((huge[0].ratio - 2.0).abs() < 1e-12);
    }

    #[test]
    fn rows_over_several_processes_drop_each_ones_first_registration() {
        // Registrations of 1, 2, 3 ms and of 3, 6, 9 ms (256 MiB): after each process's
        // first, 2, 3, 6, 9 ms, a median of 4.5 ms, 18 ms per GiB; not 2, 3, 3, 6, 9.
        let runs = [output(1), output(3)];
        let reg = per_gib(&runs, "reg_mr", Samples::AfterFirst)
            .unwrap()
            .unwrap();
        assert!((reg.median - 18.0).abs() < 1e-9, "{reg:?}");
        let first = per_gib(&runs, "reg_mr", Samples::First).unwrap().unwrap();
        assert!((first.median - 8.0).abs() < 1e-9, "{first:?}");
        let rows = mr_rows(HUGE_MR_OPS, &runs, &[output(2)]).unwrap();
        assert!((rows[0].ratio - 20.0 / 18.0).abs() < 1e-9, "{:?}", rows[0]);
    }

    #[test]
    fn one_registration_is_both_the_first_and_the_warm_row() {
        let one = parse_output(
            "{\"mr_bytes\":1073741824,\"samples_ns\":{\"reg_mr\":[7000000],\"dereg_mr\":[1]}}",
        )
        .unwrap();
        for which in [Samples::First, Samples::AfterFirst] {
            let summary = per_gib(std::slice::from_ref(&one), "reg_mr", which)
                .unwrap()
                .unwrap();
            assert!((summary.median - 7.0).abs() < 1e-9);
        }
    }

    #[test]
    fn a_missing_series_is_an_error() {
        let partial =
            parse_output("{\"mr_bytes\":4096,\"samples_ns\":{\"create_cq\":[1]}}").unwrap();
        assert!(rows(&partial, &output(1)).is_err());
    }
}

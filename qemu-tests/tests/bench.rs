//! `vrdma-vm bench --quick`: the benchmark's short form in the rxe VM, checked for structure
//! and sanity (every row measured on both sides, positive numbers, ratios that match their
//! medians) — never for timing thresholds, which mean nothing under TCG.

mod common;

use vrdma_qemu_tests::bench::{
    self, cm_setup, control, matrix, rsockets, scale, Results, Settings,
};

/// `vrdma / native` as the bench computes it, to a rounding error.
fn assert_ratio(ratio: f64, vrdma: f64, native: f64, what: &str) {
    assert!(native > 0.0 && vrdma > 0.0, "{what}: {vrdma} / {native}");
    let expected = vrdma / native;
    assert!(
        ratio > 0.0 && (ratio - expected).abs() <= expected * 1e-9,
        "{what}: ratio {ratio}, medians give {expected}"
    );
}

#[test]
fn quick_bench_measures_every_row_on_both_sides() {
    let Some(results) = common::vrdma_vm_json::<Results>(&["bench", "--quick"]) else {
        return;
    };

    let machine = &results.machine;
    assert!(!machine.host.kernel.is_empty() && !machine.guest.kernel.is_empty());
    assert!(machine.host.cpus >= 1 && machine.vcpus >= 1, "{machine:?}");
    assert!(
        ["Kvm", "Tcg"].contains(&machine.accel.as_str()),
        "{machine:?}"
    );
    let settings = Settings {
        rounds: 3,
        quick: true,
    };
    assert_eq!(results.plan, bench::Plan::new(&settings));
    assert!(results.bench_s > 0.0 && results.vm_s >= results.bench_s);

    let cases = matrix::cases(true);
    let got: Vec<_> = results.perftest.iter().map(|r| (r.tool, r.size)).collect();
    let expected: Vec<_> = cases.iter().map(|c| (c.tool, c.size)).collect();
    assert_eq!(got, expected);
    for row in &results.perftest {
        let what = format!("{} {}", row.tool.command(), row.size);
        assert_ratio(row.ratio, row.vrdma.median, row.native.median, &what);
        let labels: Vec<&str> = row.runs.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            ["native", "vrdma"],
            "{what}: one round, native first"
        );
        assert!(row.runs.iter().all(|r| r.measurement.completed()), "{what}");
        assert_eq!(row.unit, row.tool.headline_unit());
    }

    let ops: Vec<&str> = results.control.iter().map(|r| r.op.as_str()).collect();
    for op in [
        "create_cq",
        "destroy_cq",
        "create_qp",
        "destroy_qp",
        "modify_reset_to_rts",
        "reg_mr_per_gib",
        "dereg_mr_per_gib",
        "reg_mr_per_gib_vs_memfd",
        "dereg_mr_per_gib_vs_memfd",
        control::FIRST_REG_MR,
        "reg_mr_huge_per_gib",
        "dereg_mr_huge_per_gib",
        "reg_mr_huge_per_gib_vs_memfd",
        "dereg_mr_huge_per_gib_vs_memfd",
        control::SETUP_RATE,
        control::SETUP_RATE_BATCHED,
    ]
    .iter()
    .chain(control::STAGED_ROWS)
    {
        assert!(ops.contains(op), "no {op} row in {ops:?}");
    }
    // The object and setup rows again with control round trips that poll.
    for op in [
        "create_cq",
        "create_qp",
        "modify_reset_to_rts",
        control::SETUP_RATE_BATCHED,
    ] {
        let polled = format!("{op}{}", control::POLLING);
        assert!(ops.contains(&polled.as_str()), "no {polled} row in {ops:?}");
    }
    for row in &results.control {
        assert_ratio(row.ratio, row.vrdma.median, row.native.median, &row.op);
        // Every registration row has MR_PROCESSES processes per side; over huge pages each
        // registers at least HUGE_MR_REPS times. Every process's first registration is left
        // out of the warm rows and makes the first-registration row.
        let processes = control::MR_PROCESSES as u32;
        let mr_reps = if row.op.contains("_huge_") {
            results.plan.control.over_huge_pages().mr_reps
        } else {
            results.plan.control.mr_reps
        };
        let reps = if row.op == control::FIRST_REG_MR {
            processes
        } else if row.op == "create_qp_staged" {
            results.plan.control.reps
        } else if row.unit == "qp_per_s" {
            control::SETUP_SAMPLES as u32
        } else if row.op.starts_with("reg_mr") {
            // The registrations after the first: the first has its own row.
            mr_reps.saturating_sub(1).max(1) * processes
        } else if row.unit == "ms_per_gib" {
            mr_reps * processes
        } else {
            results.plan.control.reps
        };
        assert_eq!(row.native.n, reps as usize, "{}", row.op);
        assert_eq!(row.vrdma.n, reps as usize, "{}", row.op);
    }

    // Connection setup through rdma_cm: every step of cmtime and the rate, on both sides.
    let steps: Vec<&str> = results.cm_setup.iter().map(|r| r.op.as_str()).collect();
    let mut expected: Vec<&str> = cm_setup::STEPS.to_vec();
    expected.push(cm_setup::RATE);
    let polled_rate = format!("{}{}", cm_setup::RATE, control::POLLING);
    expected.push(&polled_rate);
    // With the drop-in moving each QP itself (a command per step) instead of the device.
    let driver_connect = format!("connect{}", cm_setup::DRIVER_MOVES);
    let driver_rate = format!("{}{}", cm_setup::RATE, cm_setup::DRIVER_MOVES);
    expected.extend([driver_connect.as_str(), driver_rate.as_str()]);
    assert_eq!(steps, expected);
    for row in &results.cm_setup {
        assert_ratio(row.ratio, row.vrdma.median, row.native.median, &row.op);
        let rounds = results.plan.cm_setup.rounds as usize;
        assert_eq!((row.native.n, row.vrdma.n), (rounds, rounds), "{}", row.op);
    }

    // rsockets: rstream's latency and bandwidth, measured on both sides each round.
    let ops: Vec<&str> = results.rsockets.iter().map(|r| r.op.as_str()).collect();
    assert_eq!(ops, [rsockets::LATENCY, rsockets::BANDWIDTH]);
    for row in &results.rsockets {
        assert_ratio(row.ratio, row.vrdma.median, row.native.median, &row.op);
        let rounds = results.plan.rsockets.rounds as usize;
        assert_eq!((row.native.n, row.vrdma.n), (rounds, rounds), "{}", row.op);
    }

    // Through the guest agent, through staging rings, with staged CQs and through the
    // doorbell instead of the host kick: each case once per side, the direct front-end
    // (directly mapped queues, the kick) first.
    check_comparison(&results.agent, &matrix::agent_cases(true), "vrdma-agent");
    check_comparison(
        &results.doorbell,
        &matrix::doorbell_cases(true),
        "vrdma-doorbell",
    );
    check_comparison(&results.staged, &matrix::staged_cases(true), "vrdma-staged");
    check_comparison(
        &results.staged_cqs,
        &matrix::staged_cq_cases(true),
        "vrdma-staged-cqs",
    );

    let points: Vec<_> = results.scale.iter().map(|r| (r.guests, r.qps)).collect();
    let expected: Vec<_> = scale::configs(true)
        .iter()
        .map(|c| (c.guests, c.qps))
        .collect();
    assert_eq!(points, expected);
    for row in &results.scale {
        let what = format!("{} guest(s) x {} QPs", row.guests, row.qps);
        let sends = (row.guests * row.messages_per_guest) as usize;
        for side in [&row.native, &row.vrdma] {
            assert_eq!(side.post_ns.n, sends, "{what}: one sample per send");
            assert!(side.msgs_per_s > 0.0 && side.setup_s > 0.0, "{what}");
        }
        assert_ratio(
            row.post_ratio,
            row.vrdma.post_ns.median,
            row.native.post_ns.median,
            &what,
        );
        assert_ratio(
            row.rate_ratio,
            row.vrdma.msgs_per_s,
            row.native.msgs_per_s,
            &what,
        );
    }
}

/// Rows comparing the plain vrdma side with `label` for exactly `cases`, each run once per
/// side with plausible measurements.
fn check_comparison(
    rows: &[matrix::MatrixRow],
    cases: &[vrdma_qemu_tests::perftest::Case],
    label: &str,
) {
    let got: Vec<_> = rows.iter().map(|r| (r.tool, r.size)).collect();
    let expected: Vec<_> = cases.iter().map(|c| (c.tool, c.size)).collect();
    assert_eq!(got, expected, "{label}");
    for row in rows {
        let what = format!("{label}: {} {}", row.tool.command(), row.size);
        assert_ratio(row.ratio, row.vrdma.median, row.native.median, &what);
        let labels: Vec<&str> = row.runs.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(labels, ["vrdma", label], "{what}");
        assert!(row.runs.iter().all(|r| r.measurement.completed()), "{what}");
    }
}

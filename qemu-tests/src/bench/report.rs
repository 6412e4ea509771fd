//! The bench's tables.

use std::fmt::Write as _;

use super::cm_setup::CmSetupRow;
use super::control::{ControlRow, MR_PROCESSES};
use super::matrix::MatrixRow;
use super::scale::ScaleRow;
use super::{GuestResults, Plan, Results};

/// The full report: machine, then the three tables.
pub fn render(results: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\nvrdma bench — {}", results.machine.summary());
    let _ = writeln!(
        out,
        "measurements {:.0} s, VM run {:.0} s",
        results.bench_s, results.vm_s
    );
    tables(
        &mut out,
        &results.plan,
        &results.perftest,
        &results.control,
        &results.cm_setup,
        &results.scale,
    );
    rsockets_rows(&mut out, &results.plan, &results.rsockets);
    doorbell_rows(&mut out, &results.plan, &results.doorbell);
    agent_rows(&mut out, &results.plan, &results.agent);
    staged_rows(&mut out, &results.plan, &results.staged);
    staged_cq_rows(&mut out, &results.plan, &results.staged_cqs);
    if !results.agent_pci.is_empty() {
        out.push_str(
            "\nthrough the guest agent in a real guest (vrdma-guestd --pci, nested under QEMU \
             11.1): perftest's server as nobody through the agent against a root process on \
             the PCI transport, same boot, native client measuring:\n",
        );
        out.push_str(&crate::scenarios::real_guest::render_columns(
            &results.agent_pci,
            ("root PCI", "agent"),
        ));
    }
    if let Some(error) = &results.agent_pci_error {
        let first = error.lines().next().unwrap_or_default();
        out.push_str(&format!(
            "\nthrough the guest agent in a real guest: not measured, the run failed: {first}\n"
        ));
    }
    if !results.goodput.is_empty() {
        out.push_str(
            "\ngoodput across the two-host link: 4000 RDMA WRITEs of 4 KiB streamed from host A \
             to a native peer on host B (window 16), tc netem on both NICs:\n",
        );
        out.push_str(&super::goodput::table(&results.goodput));
    }
    if let Some(error) = &results.goodput_error {
        let first = error.lines().next().unwrap_or_default();
        out.push_str(&format!(
            "\ngoodput across the two-host link: not measured, the run failed: {first}\n"
        ));
    }
    out
}

/// The tables of a guest run (when `vrdma-vm guest bench` runs by hand).
pub fn render_guest(results: &GuestResults) -> String {
    let mut out = String::new();
    tables(
        &mut out,
        &results.plan,
        &results.perftest,
        &results.control,
        &results.cm_setup,
        &results.scale,
    );
    rsockets_rows(&mut out, &results.plan, &results.rsockets);
    doorbell_rows(&mut out, &results.plan, &results.doorbell);
    agent_rows(&mut out, &results.plan, &results.agent);
    staged_rows(&mut out, &results.plan, &results.staged);
    staged_cq_rows(&mut out, &results.plan, &results.staged_cqs);
    out
}

/// The rsockets rows, if measured.
fn rsockets_rows(out: &mut String, plan: &Plan, rows: &[ControlRow]) {
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "
rsockets: Debian's rstream, blocking calls, both sides native (rdma-core's rsockets)          vs both over vrdma's drop-in; median of {} run(s): a 64-byte ping-pong ({}          iterations, µs per transfer, lower is better) and 64 KiB transfers ({}, Gbit/s,          higher is better).",
        plan.rsockets.rounds, plan.rsockets.latency_iterations, plan.rsockets.bandwidth_transfers
    );
    out.push_str(&ratio_table("rstream", rows));
}

fn tables(
    out: &mut String,
    plan: &Plan,
    perftest: &[MatrixRow],
    control: &[ControlRow],
    cm_setup: &[CmSetupRow],
    scale: &[ScaleRow],
) {
    let _ = writeln!(
        out,
        "\nperftest on rxe0: both processes native vs both over vrdma's drop-in libibverbs \
         (process transport); median of {} round(s), native and vrdma alternating. Latency: \
         typical µs (lower is better); bandwidth: average MiB/s (higher is better).",
        plan.rounds
    );
    out.push_str(&perftest_table(perftest));
    let _ = writeln!(
        out,
        "\ncontrol path: vrdma verbs API (process transport) vs rdma-core on rxe0; median of {} \
         (MR: {} MiB registered {} times in each of {} processes per side, run in turn, median \
         of the registrations after each process's first and of every deregistration, scaled \
         to one GiB; 4 KiB pages: vrdma's guest RAM a memfd, native memory without transparent \
         huge pages; `vs_memfd`: native over a shared memfd's pages too, the memory a \
         vhost-user VM's RAM is; `first`: each process's first registration; `huge`: both over \
         2 MiB hugetlb pages, registered {} times in each process; setup: 32 RC QPs from \
         nothing to RTS, per second, median of 3, vrdma one command at a time and in \
         batches).",
        plan.control.reps,
        plan.control.mr_bytes >> 20,
        plan.control.mr_reps,
        MR_PROCESSES,
        plan.control.over_huge_pages().mr_reps
    );
    out.push_str(&control_table(control));
    let _ = writeln!(
        out,
        "\nconnection setup through rdma_cm: Debian's cmtime, {} RC connections per run, both \
         sides native vs both over vrdma's drop-in librdmacm (process transport); median of {} \
         run(s). Steps in µs per connection; setup rate = connections / (create id … connect). \
         Rows `_polling`: control round trips that poll (VRDMA_COMMAND_SPIN_US=500); \
         `_driver_moves`: the drop-in moves each QP a command per step (VRDMA_CM_MOVES_QP=0) \
         instead of the device inside CM_ACCEPT.",
        plan.cm_setup.connections, plan.cm_setup.rounds
    );
    out.push_str(&cm_setup_table(cm_setup));
    let _ = writeln!(
        out,
        "\nscale: post_send of one 64 B RDMA WRITE (WQE + doorbell), round robin over the QPs, \
         16 in flight; {} messages per guest; each guest one process (vrdma: one vhost-user \
         connection to one backend).",
        plan.scale_messages
    );
    out.push_str(&scale_table(scale));
}

/// The rows through the guest agent, if measured.
fn agent_rows(out: &mut String, plan: &Plan, agent: &[MatrixRow]) {
    if agent.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nthrough the guest agent: both perftest processes as `nobody` through vrdma-guestd \
         vs both as root, each its own front-end (process transport), same backend; median \
         of {} round(s), alternating. The data path is the same; what differs is the agent's \
         hop on every control verb.",
        plan.rounds
    );
    out.push_str(&matrix_table(agent, "direct", "agent"));
}

/// The rows with the backend's doorbell instead of the host kick, if measured.
fn doorbell_rows(out: &mut String, plan: &Plan, rung: &[MatrixRow]) {
    if rung.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nthe host kick (spec §5.3) against the backend's doorbell: both perftest processes \
         over vrdma, process transport, with the kick (the default) and with VRDMA_HOST_KICK=0 \
         (every send rings the doorbell, as in a VM); median of {} round(s), alternating. What \
         differs is the backend thread woken to kick rxe on every send.",
        plan.rounds
    );
    out.push_str(&matrix_table(rung, "kick", "doorbell"));
}

/// The rows through staging rings, if measured.
fn staged_rows(out: &mut String, plan: &Plan, staged: &[MatrixRow]) {
    if staged.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nthrough staging rings (spec §9.7, a backend with --staged-rings always, as QPs past \
         QEMU's memory slots get them): both perftest processes over vrdma, staged vs directly \
         mapped queues; median of {} round(s), alternating. What differs is the daemon's copy \
         of every WQE and a doorbell after every receive post.",
        plan.rounds
    );
    out.push_str(&matrix_table(staged, "direct", "staged"));
}

/// The rows with staged CQs, if measured.
fn staged_cq_rows(out: &mut String, plan: &Plan, staged: &[MatrixRow]) {
    if staged.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nwith staged CQs (spec §9.8, a backend with --staged-cqs always, as CQs past QEMU's \
         memory slots get them): both perftest processes over vrdma, staged vs directly mapped \
         CQs; median of {} round(s), alternating. What differs is the backend's wake-up on the \
         host CQ's completion event and its copy of every completion before the guest sees it.",
        plan.rounds
    );
    out.push_str(&matrix_table(staged, "direct", "staged"));
}

/// The perftest matrix, one row per tool and size.
pub fn perftest_table(rows: &[MatrixRow]) -> String {
    matrix_table(rows, "native", "vrdma")
}

/// A matrix whose sides are headed `base` and `compared`.
fn matrix_table(rows: &[MatrixRow], base: &str, compared: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<13} {:>8} {:>6} {:>11} {:>10} {:>10} {:>8}",
        "tool", "size", "iters", "unit", base, compared, "ratio"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<13} {:>8} {:>6} {:>11} {:>10.2} {:>10.2} {:>8.2}",
            r.tool.command(),
            r.size,
            r.iterations,
            r.unit,
            r.native.median,
            r.vrdma.median,
            r.ratio
        );
    }
    out
}

/// The control path, one row per operation.
pub fn control_table(rows: &[ControlRow]) -> String {
    ratio_table("op", rows)
}

/// Connection setup, one row per step and the rate.
pub fn cm_setup_table(rows: &[CmSetupRow]) -> String {
    ratio_table("step", rows)
}

/// A table of rows each comparing one figure natively and through vrdma.
fn ratio_table(first: &str, rows: &[ControlRow]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<20} {:>11} {:>10} {:>10} {:>8}",
        first, "unit", "native", "vrdma", "ratio"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<20} {:>11} {:>10.1} {:>10.1} {:>8.2}",
            r.op, r.unit, r.native.median, r.vrdma.median, r.ratio
        );
    }
    out
}

/// The scale curve, one row per configuration.
pub fn scale_table(rows: &[ScaleRow]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>6} {:>5} {:>10} {:>10} {:>7} {:>10} {:>10} {:>10} {:>10} {:>7}",
        "guests",
        "qps",
        "native_ns",
        "vrdma_ns",
        "ratio",
        "nat_p99",
        "vrdma_p99",
        "nat_msg/s",
        "vrd_msg/s",
        "ratio"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:>6} {:>5} {:>10.0} {:>10.0} {:>7.2} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>7.2}",
            r.guests,
            r.qps,
            r.native.post_ns.median,
            r.vrdma.post_ns.median,
            r.post_ratio,
            r.native.post_ns.p99,
            r.vrdma.post_ns.p99,
            r.native.msgs_per_s,
            r.vrdma.msgs_per_s,
            r.rate_ratio
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::scale::ScaleSide;
    use crate::bench::stats::Summary;
    use crate::perftest::Tool;

    fn summary(median: f64) -> Summary {
        Summary::of(&[median]).unwrap()
    }

    #[test]
    fn each_table_has_a_header_and_a_line_per_row() {
        let m = MatrixRow {
            tool: Tool::IbWriteBw,
            size: 65536,
            iterations: 512,
            unit: "MiB/s".into(),
            native: summary(40.0),
            vrdma: summary(38.0),
            ratio: 0.95,
            runs: vec![],
        };
        let table = perftest_table(&[m.clone(), m]);
        assert_eq!(table.lines().count(), 3);
        assert!(table.contains("ib_write_bw") && table.contains("38.00") && table.contains("0.95"));

        let c = ControlRow {
            op: "create_cq".into(),
            unit: "us".into(),
            native: summary(100.0),
            vrdma: summary(250.0),
            ratio: 2.5,
        };
        let table = control_table(&[c]);
        assert_eq!(table.lines().count(), 2);
        assert!(table.contains("create_cq") && table.contains("250.0") && table.contains("2.50"));

        let side = ScaleSide {
            post_ns: summary(900.0),
            msgs_per_s: 20000.0,
            setup_s: 1.0,
        };
        let s = ScaleRow {
            guests: 8,
            qps: 64,
            messages_per_guest: 4000,
            native: side.clone(),
            vrdma: side,
            post_ratio: 1.0,
            rate_ratio: 1.0,
        };
        let table = scale_table(&[s]);
        assert_eq!(table.lines().count(), 2);
        assert!(table.contains("20000") && table.contains(" 900"));
    }
}

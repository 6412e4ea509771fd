//! Two rxe hosts joined by an Ethernet link, each with its own vrdma-backend: vrdma and native
//! peers across it, every byte verified, the same message counts at both ends (issue 16).

mod common;

use vrdma_qemu_tests::scenarios::two_hosts::interruption::RECONNECT_ROWS;
use vrdma_qemu_tests::scenarios::two_hosts::perftest_across::{self, PAIRINGS};
use vrdma_qemu_tests::scenarios::two_hosts::rnr::{
    self, RnrRecord, EXHAUSTED_RNR_RETRY, NAKS_BEFORE_RELEASE, PLAN_ROWS,
};
use vrdma_qemu_tests::scenarios::two_hosts::steps::{
    self, Step, DUPLICATION, LOSS_1, LOSS_5, REORDERING,
};
use vrdma_qemu_tests::scenarios::two_hosts::{Results, StepRecord};
use vrdma_qemu_tests::vm_link::Host;

#[test]
fn vrdma_crosses_a_real_link_to_native_and_vrdma_peers_every_byte_verified() {
    let Some(results) = common::vrdma_vm_json::<Results>(&["test", "two-hosts"]) else {
        return;
    };
    check(&results, &steps::plan(false, None));
    check_path_mtu(&results);
    check_perftest(&results, perftest_across::SHORT_CASES);
    check_rnr(&results);
    check_link_failure(&results);
    check_backend_restart(&results);
}

/// The named suite with loss and reordering (`vrdma-vm test two-hosts-faults`): the VM
/// kernel's rxe itself crashed under 5 % loss in some runs (native peers only), so it is not
/// part of every run; see the README.
#[test]
#[ignore = "named suite: rdma_rxe of the VM's Linux 6.12 can crash under loss"]
fn vrdma_survives_loss_and_reordering_like_native() {
    let Some(results) = common::vrdma_vm_json::<Results>(&["test", "two-hosts-faults"]) else {
        return;
    };
    check(&results, &steps::plan(true, None));
}

/// The named suite of Debian's perftest across the link (`vrdma-vm test two-hosts-perftest`):
/// every baseline case in every pairing, with ratios to native printed.
#[test]
#[ignore = "named suite: the short cases run in every run above"]
fn unmodified_perftest_runs_every_baseline_case_across_the_link() {
    let Some(results) = common::vrdma_vm_json::<Results>(&["test", "two-hosts-perftest"]) else {
        return;
    };
    check_perftest(&results, perftest_across::FULL_CASES);
}

fn check(results: &Results, plan: &[Step]) {
    assert_eq!(results.a.host, Host::A);
    assert_eq!(results.b.host, Host::B);
    assert_eq!(results.a.steps.len(), plan.len(), "{results:#?}");
    assert_eq!(results.b.steps.len(), plan.len(), "{results:#?}");
    for step in plan {
        let a = results.record(Host::A, step.label).expect(step.label);
        let b = results.record(Host::B, step.label).expect(step.label);
        let (client, server) = match step.client.0 {
            Host::A => (a, b),
            Host::B => (b, a),
        };
        assert_eq!(client.role, "client", "{client:?}");
        assert_eq!(server.role, "server", "{server:?}");
        assert_eq!(client.implementation, step.client.1.name(), "{client:?}");
        assert_eq!(server.implementation, step.server.1.name(), "{server:?}");
        check_counts(step, client, server);
        check_link(step, a, b);
    }
}

/// Every operation and size ran its iterations, verified by the receiving side, and both
/// ends counted the same messages: nothing lost, nothing duplicated to the application.
fn check_counts(step: &Step, client: &StepRecord, server: &StepRecord) {
    let sizes: Vec<u32> = step.sizes.split(',').map(|s| s.parse().unwrap()).collect();
    let ops: Vec<&str> = step.ops.split(',').collect();
    let expected_rows = ops.len() * sizes.len();
    assert_eq!(
        client.rows.len(),
        expected_rows,
        "{}: {client:?}",
        step.label
    );
    for &op in &ops {
        for &size in &sizes {
            let row = client
                .rows
                .iter()
                .find(|r| r.op == op && r.size == size)
                .unwrap_or_else(|| panic!("{}: no row for {op} {size}", step.label));
            assert_eq!(row.iters, step.iters, "{}: {row:?}", step.label);
            assert!(row.latency.is_some(), "{}: {row:?}", step.label);
        }
    }
    assert_eq!(
        server.server_verified,
        Some((expected_rows as u32, step.iters)),
        "{}: {server:?}",
        step.label
    );
}

/// The traffic crossed the link (both NICs sent and received at least one frame per message),
/// and the fault of the step happened to it.
fn check_link(step: &Step, a: &StepRecord, b: &StepRecord) {
    let rows = step.ops.split(',').count() * step.sizes.split(',').count();
    let messages = u64::from(step.iters) * rows as u64;
    for record in [a, b] {
        assert!(
            record.nic_frames.tx >= messages && record.nic_frames.rx >= messages,
            "{}: {messages} messages, {record:?}",
            step.label
        );
    }
    let counter = |name: &str| {
        [a, b]
            .iter()
            .map(|r| r.rxe_counters.get(name).copied().unwrap_or(0))
            .sum::<u64>()
    };
    match step.netem {
        None => assert!(a.qdisc.is_none() && b.qdisc.is_none(), "{a:?} {b:?}"),
        // Duplicates reach the responder, which recognises them by PSN.
        Some(DUPLICATION) => assert!(counter("duplicate_request") > 0, "{a:?} {b:?}"),
        // Both NICs dropped packets, and rxe recovered the messages by retransmitting.
        Some(LOSS_1) | Some(LOSS_5) => {
            for record in [a, b] {
                assert!(record.qdisc.is_some_and(|q| q.drops > 0), "{record:?}");
            }
            assert!(counter("completer_retry_err") + counter("rcvd_seq_err") > 0);
        }
        Some(REORDERING) => assert!(
            counter("rcvd_seq_err") + counter("out_of_seq_request") > 0,
            "{a:?} {b:?}"
        ),
        Some(other) => panic!("no check for {other}"),
    }
}

/// The same exchanges at path MTU 4096 took fewer frames than at 1024: the QPs used the MTU
/// the guest set (a 64 KiB message is 16 packets instead of 64).
fn check_path_mtu(results: &Results) {
    for (at_1024, at_4096) in [
        (
            "vrdma-a-over-native-b",
            "vrdma-a-over-native-b, path MTU 4096",
        ),
        (
            "vrdma-a-over-vrdma-b",
            "vrdma-a-over-vrdma-b, path MTU 4096",
        ),
    ] {
        for host in Host::BOTH {
            let small = results.record(host, at_1024).unwrap().nic_frames.tx;
            let large = results.record(host, at_4096).unwrap().nic_frames.tx;
            assert!(
                large * 2 < small,
                "{host:?}: {at_4096}: {large} frames, {at_1024}: {small}"
            );
        }
    }
}

/// Debian's unmodified perftest ran every case in every pairing across the link: the client
/// reported every iteration it was asked for, timed plausibly (or untimed: perftest's clock
/// calibration fails at random under TCG; the messages still moved), and the messages crossed
/// the link.
fn check_perftest(results: &Results, cases: &[vrdma_qemu_tests::perftest::Case]) {
    let all: Vec<_> = results
        .a
        .perftest
        .iter()
        .chain(&results.b.perftest)
        .collect();
    assert_eq!(all.len(), 2 * PAIRINGS.len() * cases.len(), "{all:#?}");
    for pairing in PAIRINGS {
        for case in cases {
            let record = |role: &str| {
                all.iter()
                    .find(|r| r.pairing == pairing.label && r.case == *case && r.role == role)
                    .unwrap_or_else(|| panic!("{}: no {role} of {case:?}", pairing.label))
            };
            let (client, server) = (record("client"), record("server"));
            assert_eq!(client.implementation, pairing.client.1.name(), "{client:?}");
            assert_eq!(server.implementation, pairing.server.1.name(), "{server:?}");
            let row = client.row.as_ref().expect("a client row");
            assert_eq!(row.iterations, u64::from(case.iterations), "{client:?}");
            assert_eq!(row.size, case.size, "{client:?}");
            assert!(row.measurement.completed(), "{client:?}");
            assert!(
                client.nic_frames.tx + server.nic_frames.tx >= u64::from(case.iterations)
                    && client.nic_frames.rx > 0
                    && server.nic_frames.rx > 0,
                "{client:?} {server:?}"
            );
        }
    }
}

/// Receivers not ready: the senders retried as their QPs' rnr_retry said, and the data that
/// finally went through was verified.
fn check_rnr(results: &Results) {
    assert_eq!(results.a.rnr.len(), rnr::RUNS.len(), "{:#?}", results.a.rnr);
    assert_eq!(results.b.rnr.len(), rnr::RUNS.len(), "{:#?}", results.b.rnr);
    let counter = |record: &RnrRecord, name: &str| record.rxe_counters.get(name).copied();
    for run in rnr::RUNS {
        let on = |host: Host| {
            let report = if host == Host::A {
                &results.a
            } else {
                &results.b
            };
            report
                .rnr
                .iter()
                .find(|r| r.label == run.label)
                .expect(run.label)
        };
        let (client, server) = (on(run.client.0), on(run.server.0));
        assert_eq!(client.role, "client", "{client:?}");
        assert_eq!(server.role, "server", "{server:?}");
        assert_eq!(client.implementation, run.client.1.name(), "{client:?}");
        assert_eq!(server.implementation, run.server.1.name(), "{server:?}");
        if run.released {
            // The server's host NAKed the first sends until it posted its receives; the
            // client's QP kept retrying (rnr_retry 7) and every message then went through.
            assert!(server.seconds_held.is_some(), "{server:?}");
            assert!(
                counter(server, rnr::SENT_RNR_NAKS) >= Some(NAKS_BEFORE_RELEASE),
                "{server:?}"
            );
            assert!(
                counter(client, rnr::RECEIVED_RNR_NAKS) >= Some(NAKS_BEFORE_RELEASE),
                "{client:?}"
            );
            assert_eq!(client.rows.len(), PLAN_ROWS, "{client:?}");
            assert!(client.rows.iter().all(|r| r.iters == client.rows[0].iters));
            assert_eq!(
                server.server_verified,
                Some((PLAN_ROWS as u32, client.rows[0].iters)),
                "{server:?}"
            );
        } else {
            // The vrdma client gave up as its rnr_retry said: exactly one RNR NAK more than
            // its retries (rxe takes one retry off per NAK, see rnr.rs), then an
            // RNR-retry-exceeded completion; the server learnt it from its peer.
            let error = client.error.as_deref().unwrap_or_default();
            assert!(error.contains("status RnrRetryExcErr"), "{client:?}");
            assert_eq!(
                counter(client, rnr::RECEIVED_RNR_NAKS),
                Some(EXHAUSTED_RNR_RETRY + 1),
                "{client:?}"
            );
            assert_eq!(
                counter(client, rnr::RNR_RETRIES_EXCEEDED),
                Some(1),
                "{client:?}"
            );
            assert!(
                server
                    .error
                    .as_deref()
                    .unwrap_or_default()
                    .contains("peer failed"),
                "{server:?}"
            );
        }
    }
}

/// Host A's NIC went down under traffic, came back, and the wire then failed with both NICs up.
fn check_link_failure(results: &Results) {
    let a = results
        .a
        .link_failure
        .as_ref()
        .expect("host A ran the link failure");
    let b = results
        .b
        .link_failure
        .as_ref()
        .expect("host B ran the link failure");
    // NIC down: the vrdma client's QP ended in error, which it learnt from an error
    // completion, and rdma-core's unmodified ibv_asyncwatch over vrdma saw the port go down
    // and come back, in that order.
    assert!(
        a.interrupted_error.contains("completion with status"),
        "{a:?}"
    );
    let down = a
        .async_events
        .iter()
        .position(|e| e.contains("IBV_EVENT_PORT_ERR"));
    let up = a
        .async_events
        .iter()
        .rposition(|e| e.contains("IBV_EVENT_PORT_ACTIVE"));
    assert!(down.is_some() && up.is_some() && down < up, "{a:?}");
    // The native server on B learnt it too, within its bounded wait.
    assert!(b.interrupted_error.contains("error"), "{b:?}");
    // After the link came back, a new connection passed a verified ping-pong.
    assert_eq!(a.reconnect_rows.len(), RECONNECT_ROWS, "{a:?}");
    assert!(a
        .reconnect_rows
        .iter()
        .all(|r| r.iters > 0 && r.latency.is_some()));
    let iters = a.reconnect_rows[0].iters;
    assert_eq!(
        b.reconnect_server_verified,
        Some((RECONNECT_ROWS as u32, iters)),
        "{b:?}"
    );
    // Wire cut with both NICs up: the QP used up the retry budget it was given (rxe retries
    // for ever only at retry_cnt 7) and failed its send with a retry-exceeded completion.
    assert!(a.wire_cut_error.contains("status RetryExcErr"), "{a:?}");
    assert!(a.wire_cut_seconds_to_error.is_some(), "{a:?}");
    assert!(b.wire_cut_error.contains("error"), "{b:?}");
}

/// Host A's backend was SIGKILLed under traffic and started again on the same socket.
fn check_backend_restart(results: &Results) {
    let a = results
        .a
        .backend_restart
        .as_ref()
        .expect("host A ran the backend restart");
    let b = results
        .b
        .backend_restart
        .as_ref()
        .expect("host B ran the backend restart");
    // Both ends of the interrupted stream ended with an error, none hung: the polling vrdma
    // client learnt that its device failed (Context::check_alive between polls), the
    // unmodified ibv_asyncwatch over the drop-in got IBV_EVENT_DEVICE_FATAL.
    assert!(a.interrupted_error.contains("the device failed"), "{a:?}");
    assert!(b.interrupted_error.contains("error"), "{b:?}");
    assert!(
        a.async_events
            .iter()
            .any(|e| e.contains("IBV_EVENT_DEVICE_FATAL")),
        "{a:?}"
    );
    // The kernel released every host object (the run fails otherwise; the time is recorded).
    assert!(a.seconds_to_release.is_some(), "{a:?}");
    // The new backend served a new client: a verified ping-pong with host B.
    assert_eq!(a.reconnect_rows.len(), RECONNECT_ROWS, "{a:?}");
    let iters = a.reconnect_rows[0].iters;
    assert_eq!(
        b.reconnect_server_verified,
        Some((RECONNECT_ROWS as u32, iters)),
        "{b:?}"
    );
}

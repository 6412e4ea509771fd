//! Debian's unmodified librdmacm example programs over vrdma's drop-in, in the rxe VM.

mod common;

use vrdma_qemu_tests::scenarios::perftest_rdma_cm;
use vrdma_qemu_tests::scenarios::rdmacm_backend_kill::DEVICE_REMOVAL;
use vrdma_qemu_tests::scenarios::rdmacm_suite::SuiteResults;
use vrdma_qemu_tests::scenarios::rdmacm_utils::PROGRAMS;

#[test]
fn rdmacm_examples_run_unmodified_over_vrdma() {
    let Some(results) = common::vrdma_vm_json::<SuiteResults>(&["test", "rdmacm-utils"]) else {
        return;
    };
    let runs = &results.runs;
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
    for run in runs {
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

    // perftest -R: every case in every pairing, measured (perftest moved every message).
    let got: Vec<(&str, &str, &str)> = results
        .perftest
        .iter()
        .map(|r| (r.tool.command(), r.server.as_str(), r.client.as_str()))
        .collect();
    let expected: Vec<(&str, &str, &str)> = perftest_rdma_cm::CASES
        .iter()
        .flat_map(|c| pairings.map(|(s, cl)| (c.tool.command(), s, cl)))
        .collect();
    assert_eq!(got, expected);
    for run in &results.perftest {
        assert!(run.measurement.completed(), "{run:?}");
        assert_eq!(run.iterations, 200, "{run:?}");
        let vrdma_sides = [&run.server, &run.client]
            .iter()
            .filter(|s| **s == "vrdma")
            .count();
        // perftest opens the device itself beside librdmacm: one or two sessions per side.
        assert!(
            (vrdma_sides..=2 * vrdma_sides).contains(&run.backend_sessions),
            "{run:?}"
        );
    }

    // iperf under librspreload.so: every pairing moved every byte over rxe (the scenario
    // checks the packet count and the sessions; here that all four ran).
    let got: Vec<(&str, &str)> = results
        .preload
        .iter()
        .map(|r| (r.server.as_str(), r.client.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("native", "native"),
            ("vrdma", "native"),
            ("native", "vrdma"),
            ("vrdma", "vrdma")
        ]
    );
    for run in &results.preload {
        assert!(run.rxe_packets >= 1024, "{run:?}");
        assert!(run.client_report.contains("4.00 MBytes"), "{run:?}");
    }

    // The backend SIGKILLed with connections up: every rping ended (the scenario bounds the
    // waits), the idle vrdma listener through the device-removal event, the vrdma sides of
    // the connections with an error; the kernel released everything the backend held; a new
    // backend on the same socket served a new connection.
    let kill = &results.backend_kill;
    let who: Vec<&str> = kill.endings.iter().map(|e| e.who.as_str()).collect();
    assert_eq!(
        who,
        [
            "native server",
            "vrdma client",
            "vrdma server",
            "native client",
            "vrdma listener"
        ]
    );
    for ending in &kill.endings {
        if ending.who.starts_with("vrdma") {
            assert_ne!(ending.exit_code, Some(0), "{ending:?}");
        }
    }
    // A second guest sharing the host's address could not take the listener's port.
    assert_ne!(kill.port_taken.exit_code, Some(0), "{kill:?}");
    assert_eq!(
        kill.port_taken.last_line, "rdma_bind_addr: Address already in use",
        "{kill:?}"
    );
    let listener = kill.endings.last().unwrap();
    assert!(
        listener.saw_device_removal,
        "{listener:?}: no {DEVICE_REMOVAL:?}"
    );
    assert!(
        kill.connected.qp >= kill.before.qp + 4 && kill.connected.cm_id >= kill.before.cm_id + 5,
        "{kill:?}: the connections were not up"
    );
    assert_eq!(kill.pings_after_restart, 3, "{kill:?}");
}

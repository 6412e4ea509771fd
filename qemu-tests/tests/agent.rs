//! Many unprivileged processes through one guest agent (vrdma-guestd), in the rxe VM.

mod common;

use vrdma_qemu_tests::scenarios::agent::{AgentOutcome, CONCURRENT};
use vrdma_qemu_tests::scenarios::discovery::{self, StackSide};
use vrdma_qemu_tests::scenarios::rdma_core_suite::{self, Outcome, RdmaCoreRuns, TestOutcome};
use vrdma_qemu_tests::scenarios::{libfabric, mpi};

#[test]
fn unprivileged_processes_share_one_device_through_the_agent() {
    let Some(outcome) = common::vrdma_vm_json::<AgentOutcome>(&["test", "agent"]) else {
        return;
    };
    // Every process's rows were checked inside the VM (both tools verify every byte and
    // exit non-zero otherwise); here: all of them reported.
    assert_eq!(outcome.concurrent.len(), CONCURRENT);
    assert!(outcome.concurrent.iter().all(|rows| rows.len() == 6));
    assert_eq!(outcome.survivors.len(), 2);
    assert!(outcome.survivors.iter().all(|rows| rows.len() == 2));
    // The victim held objects of its own, and they went with it.
    assert!(
        outcome.with_victim.qp > outcome.before_victim.qp,
        "{outcome:?}"
    );
    assert!(
        outcome.with_victim.mr > outcome.before_victim.mr,
        "{outcome:?}"
    );
    // perftest ran every iteration (timed, or untimed when its own clock failed).
    assert!(outcome.perftest.measurement.completed(), "{outcome:?}");
    // rping through the agent as server, then as client, then over loopback with both sides
    // through the agent; both sides' marks were checked.
    let roles: Vec<(&str, &str)> = outcome
        .rping
        .iter()
        .map(|r| (r.server.as_str(), r.client.as_str()))
        .collect();
    assert_eq!(
        roles,
        [
            ("vrdma-agent", "native"),
            ("native", "vrdma-agent"),
            ("vrdma-agent", "vrdma-agent")
        ]
    );
    for refusal in [&outcome.stranger_refusal, &outcome.backend_refusal] {
        assert!(refusal.contains("Permission denied"), "{refusal}");
    }
    // UCX kept rxe0 natively and vrdma0 through the agent's published files, with both
    // verbs transports on port 1 (checked in the VM; here: reported).
    for (pairs, port) in [
        (&outcome.ucx.native, "rxe0:1"),
        (&outcome.ucx.vrdma, "vrdma0:1"),
    ] {
        for transport in discovery::VERBS_TRANSPORTS {
            assert!(
                pairs.iter().any(|(t, d)| t == transport && d == port),
                "{transport} on {port}: {pairs:?}"
            );
        }
    }
    // libfabric listed its verbs MSG and RDM (verbs;ofi_rxm) endpoints on rxe0 natively and
    // on vrdma0 through the agent (checked in the VM; here: reported).
    for (entries, domain) in [
        (&outcome.fabric.native, "rxe0"),
        (&outcome.fabric.vrdma, "vrdma0"),
    ] {
        for (provider, kind) in discovery::FABRIC_ENTRIES {
            assert!(
                entries
                    .iter()
                    .any(|(p, d, t)| p == provider && d == domain && t == kind),
                "{provider} {kind} on {domain}: {entries:?}"
            );
        }
    }
    // ucx_perftest ran every test with each side serving, every iteration.
    let runs: Vec<(&str, StackSide, u64)> = outcome
        .ucx_traffic
        .iter()
        .map(|r| (r.test.as_str(), r.server, r.iterations))
        .collect();
    let expected: Vec<(&str, StackSide, u64)> = discovery::UCX_PERFTESTS
        .iter()
        .flat_map(|test| {
            [StackSide::Native, StackSide::Vrdma]
                .map(|server| (*test, server, discovery::UCX_ITERATIONS))
        })
        .collect();
    assert_eq!(runs, expected);
    // Open MPI ran every pairing; each rank checked every byte and loaded its side's library
    // (checked in the VM; here: reported).
    let pairings: Vec<Vec<StackSide>> = outcome
        .mpi
        .iter()
        .map(|run| run.ranks.iter().map(|rank| rank.side).collect())
        .collect();
    assert_eq!(pairings, mpi::PAIRINGS.map(Vec::from));
    for rank in outcome.mpi.iter().flat_map(|run| &run.ranks) {
        assert_eq!(rank.verified_bytes, mpi::point_to_point_bytes(), "{rank:?}");
        assert!(rank.collectives_verified, "{rank:?}");
    }
    // fi_pingpong ran every pairing with every size done and data-checked on both sides
    // (checked in the VM; here: reported), the vrdma runs with the native run's sizes.
    let fabric: Vec<(&str, StackSide, StackSide)> = outcome
        .fabric_traffic
        .iter()
        .map(|run| (run.endpoint.as_str(), run.server, run.client))
        .collect();
    let expected: Vec<(&str, StackSide, StackSide)> = libfabric::ENDPOINTS
        .iter()
        .flat_map(|(_, endpoint)| {
            libfabric::PAIRINGS.map(|(server, client)| (*endpoint, server, client))
        })
        .collect();
    assert_eq!(fabric, expected);
    for run in &outcome.fabric_traffic {
        let native = outcome
            .fabric_traffic
            .iter()
            .find(|r| r.endpoint == run.endpoint)
            .unwrap();
        assert_eq!(run.sizes, native.sizes, "{run:?}");
    }
    // rdma-core's own test suite: it ran on both sides, and vrdma passed every test native rxe
    // passed but those it does not carry yet and those whose outcome is timing (each listed
    // with its reason).
    let suite = &outcome.rdma_core;
    assert!(
        RdmaCoreRuns::count(&suite.native, Outcome::Ok) >= 50,
        "{}",
        rdma_core_suite::summary(suite)
    );
    let unlisted = |differences: Vec<(&str, &TestOutcome)>, listed: &[(&str, &str)]| {
        differences
            .into_iter()
            .filter(|(id, _)| {
                !listed
                    .iter()
                    .chain(rdma_core_suite::TIMING_DEPENDENT)
                    .any(|(known, _)| known == id)
            })
            .map(|(id, outcome)| (id.to_string(), outcome.clone()))
            .collect::<Vec<_>>()
    };
    let regressions = unlisted(
        suite.passed_only_natively(),
        rdma_core_suite::NOT_YET_OVER_VRDMA,
    );
    assert!(
        regressions.is_empty(),
        "passed natively, not over vrdma: {regressions:?}"
    );
    // What native rxe skips, vrdma skips or passes, but for the listed differences.
    let regressions = unlisted(
        suite.failed_only_over_vrdma(),
        rdma_core_suite::FAILING_WHERE_NATIVE_SKIPS,
    );
    assert!(
        regressions.is_empty(),
        "skipped natively, failing over vrdma: {regressions:?}"
    );
    let down = &outcome.backend_down_refusal;
    assert!(down.contains("the device is not available"), "{down}");
}

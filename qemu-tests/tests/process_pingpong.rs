//! vrdma in process mode on real rxe: the whole process-pingpong scenario in the VM.

mod common;

use vrdma_qemu_tests::scenarios::process_pingpong::results::Results;

#[test]
fn process_pingpong_verifies_bypasses_isolates_and_cleans_up() {
    let Some(results) = common::vrdma_vm_json::<Results>(&["test", "process-pingpong"]) else {
        return;
    };

    let ops = ["send", "send_imm", "write", "write_imm", "read"];
    let sizes = [1u32, 64, 4096, 65536, 1048576];
    for label in [
        "native-over-native",
        "vrdma-over-native",
        "native-over-vrdma",
        "vrdma-over-vrdma",
    ] {
        let rows = &results.pingpong[label];
        for op in ops {
            for size in sizes {
                let row = rows
                    .iter()
                    .find(|r| r.op == op && r.size == size && r.latency.is_some())
                    .unwrap_or_else(|| panic!("{label}: no verified row for {op} {size}"));
                assert!(row.iters > 0, "{label}: {row:?}");
                let latency = row.latency.as_ref().unwrap();
                assert!(
                    latency.typical_us > 0.0 && latency.p99_us >= latency.typical_us,
                    "{row:?}"
                );
            }
        }
        for op in ["write", "send"] {
            for size in [4096u32, 65536, 1048576] {
                let row = rows
                    .iter()
                    .find(|r| r.op == op && r.size == size && r.latency.is_none())
                    .unwrap_or_else(|| panic!("{label}: no bandwidth row for {op} {size}"));
                assert!(row.mib_s > 0.0 && row.mmsg_s > 0.0, "{label}: {row:?}");
            }
        }
    }
    // A vrdma client in process mode holds its host context: every send of its connected QP
    // started rxe itself (a host kick, spec §5.3), none fell back to the doorbell. Its UD
    // sends go through the device's staging ring, which the device kicks.
    for label in ["vrdma-over-native", "vrdma-over-vrdma"] {
        for row in &results.pingpong[label] {
            assert_eq!(row.host_kick, Some(true), "{label}: {row:?}");
            assert_eq!(row.kicks_refused, Some(0), "{label}: {row:?}");
        }
    }
    let ud = &results.pingpong["ud-vrdma-over-native"];
    assert_eq!(ud.len(), 3, "{ud:?}");
    for row in ud.iter().filter(|r| r.op == "ud_send") {
        assert_eq!(row.host_kick, Some(false), "{row:?}");
    }
    for label in ["events-vrdma-over-native", "events-vrdma-over-vrdma"] {
        let rows = &results.pingpong[label];
        for op in ["send", "write", "read"] {
            for size in [64u32, 65536] {
                assert!(
                    rows.iter()
                        .any(|r| r.op == op && r.size == size && r.latency.is_some()),
                    "{label}: no verified row for {op} {size}"
                );
            }
        }
        assert!(
            rows.iter().any(|r| r.latency.is_none()),
            "{label}: no bandwidth row"
        );
        for row in rows {
            assert_eq!(
                row.completion.as_deref(),
                Some("events"),
                "{label}: {row:?}"
            );
        }
        // Whether a later step sleeps depends on timing; the first one takes an event for
        // certain (the tool arms its CQs while they are empty).
        assert!(
            rows[0].completion_events.unwrap_or(0) > 0,
            "{label}: {:?}",
            rows[0]
        );
        // One event per arm at most; an arm of one step may be answered in the next.
        let events: u64 = rows.iter().filter_map(|r| r.completion_events).sum();
        let arms: u64 = rows.iter().filter_map(|r| r.arms).sum();
        assert!(events <= arms, "{label}: {events} events, {arms} arms");
    }
    let async_event = results.async_event.as_ref().expect("async event step ran");
    assert_eq!(
        async_event.requester_status, "RemAccessErr",
        "{async_event:?}"
    );
    assert_eq!(async_event.responder_state, "Err", "{async_event:?}");
    assert!(
        async_event.overflow_receives > async_event.overflow_cq_capacity,
        "{async_event:?}"
    );
    assert!(
        async_event
            .overflow_events
            .contains(&("CQ_ERR".to_string(), "overflow CQ".to_string())),
        "{async_event:?}"
    );
    assert!(results.bypass_messages > 0);
    assert_eq!(results.cleanup_rounds, 50);
    let (fds_first, fds_last) = results.backend_fds;
    assert!(
        fds_first > 0 && fds_last <= fds_first,
        "{:?}",
        results.backend_fds
    );
}

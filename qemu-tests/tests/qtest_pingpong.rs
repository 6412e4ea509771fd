//! QEMU's vrdma device driven through qtest inside the rxe VM: the library over the PCI
//! transport against native peers, a device reset and a QEMU kill in mid-traffic.

mod common;

use vrdma_qemu_tests::cli::qtest_pingpong::QPS;
use vrdma_qemu_tests::scenarios::qtest_pingpong::{Results, QP_QUOTA, VERIFY_OPS, VERIFY_SIZES};
use vrdma_qemu_tests::scenarios::qtest_qp_scale::QPS_PER_CQ;

#[test]
fn qtest_pingpong_verifies_resets_and_survives_a_qemu_kill() {
    let Some(results) = common::vrdma_vm_json::<Results>(&["test", "qtest-pingpong"]) else {
        return;
    };

    assert_eq!(results.device.magic, "vRDM", "{:?}", results.device);
    assert!(results.device.shared_memory_len > 0, "{:?}", results.device);
    for op in VERIFY_OPS.split(',') {
        for size in VERIFY_SIZES.split(',').map(|s| s.parse::<u32>().unwrap()) {
            for (label, rows) in [("native", &results.native), ("qtest", &results.qtest)] {
                let row = rows
                    .iter()
                    .find(|r| r.op == op && r.size == size)
                    .unwrap_or_else(|| panic!("{label}: no verified row for {op} {size}"));
                let latency = row.latency.as_ref().expect("verify mode measures latency");
                assert!(
                    row.iters > 0 && latency.typical_us > 0.0,
                    "{label}: {row:?}"
                );
            }
        }
    }
    assert!(results.qtest_requests > 0);
    // QPs through QEMU: each host queue buffer is a memory slot of QEMU's (it aborted at the
    // 513th), so past the backend's budget QPs get staging rings that share mappings; the QP
    // quota ends the step with QUOTA and QEMU keeps answering.
    let scale = results.qp_scale.as_ref().expect("the QP step ran");
    assert_eq!(scale.requested, QPS);
    assert_eq!(scale.created, QP_QUOTA, "{scale:?}");
    let refused = scale.refused.as_deref().unwrap_or_default();
    assert!(
        refused.starts_with(&format!("QP {}", QP_QUOTA + 1)) && refused.contains("QUOTA"),
        "{scale:?}"
    );
    // The first ones direct (two mappings each, below 480 in all), the rest staged.
    assert!(
        scale.staged > 0 && (scale.created - scale.staged) * 2 < 480,
        "{scale:?}"
    );
    // A CQ for every QP tried, the refused one's included (it is made first); past QEMU's
    // slots they are staged (spec §9.8), the mappings of the direct ones and of the direct QPs
    // within the budget.
    assert_eq!(scale.cqs, (QP_QUOTA + 1).div_ceil(QPS_PER_CQ), "{scale:?}");
    assert!(
        scale.staged_cqs > 0
            && (scale.cqs - scale.staged_cqs) + (scale.created - scale.staged) * 2 < 480,
        "{scale:?}"
    );
    for op in VERIFY_OPS.split(',') {
        assert!(
            results
                .qp_scale_exchange
                .iter()
                .any(|r| r.op == op && r.iters > 0),
            "no verified {op} on the last QP: {:?}",
            results.qp_scale_exchange
        );
    }
    assert!(scale.qemu_alive_after, "{scale:?}");
    // Destroying them gave the mappings back: the next QP and CQ were mapped directly.
    assert!(scale.direct_after_release, "{scale:?}");
    // The reset and the kill interrupted a run meant to last a million iterations.
    assert_ne!(results.reset.interrupted_run, "completed");
    assert_ne!(results.kill.interrupted_run, "completed");
    // The back-end killed under a QEMU behind vrdma-keeper (spec §11.5): QEMU never went
    // down, the host gave everything back with no daemon, the guest learned of the loss, and
    // a new context on the same QEMU ran a verified ping-pong.
    let restart = &results.daemon_restart;
    assert_ne!(restart.interrupted_run, "completed", "{restart:?}");
    // It never took the zeroed memory that replaced its lost CQ for completions.
    assert!(
        !restart.interrupted_run.contains("completed with wr_id"),
        "{restart:?}"
    );
    assert!(restart.qemu_alive_without_daemon, "{restart:?}");
    assert!(restart.qemu_alive_after, "{restart:?}");
    assert_eq!(restart.released_to, restart.idle, "{restart:?}");
    assert_eq!(restart.magic_without_daemon, "vRDM", "{restart:?}");
    assert!(restart.fatal_epoch.is_some(), "{restart:?}");
    for op in VERIFY_OPS.split(',') {
        assert!(
            restart.continued.iter().any(|r| r.op == op),
            "no {op} after the daemon's restart: {restart:?}"
        );
    }
    for op in VERIFY_OPS.split(',') {
        assert!(
            results.reset.continued.iter().any(|r| r.op == op),
            "no {op} after the reset: {:?}",
            results.reset.continued
        );
    }
    // The README's QEMU command line brought the device up as documented.
    let readme = results.readme.expect("the README check ran");
    assert_eq!(readme.id, "1af4:1066");
    assert_eq!(readme.shm_bar_size, results.device.shared_memory_len);
}

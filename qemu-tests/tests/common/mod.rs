//! Running `vrdma-vm` from integration tests.
#![allow(dead_code)] // each test binary uses a different part

use std::path::PathBuf;
use std::process::Command;

use vrdma_qemu_tests::perftest::{Case, Measurement, Row};

/// `vrdma-vm`'s exit status when a host prerequisite is missing and cannot be installed.
pub const EXIT_PREREQUISITE: i32 = 77;

/// Runs `vrdma-vm ARGS…`, streaming its output. Returns `None` (the test is skipped) only when a
/// prerequisite is truly unavailable and this is not CI; under `CI=true` that fails the test.
pub fn vrdma_vm(args: &[&str]) -> Option<()> {
    let status = Command::new(env!("CARGO_BIN_EXE_vrdma-vm"))
        .args(args)
        .status()
        .expect("vrdma-vm starts");
    match status.code() {
        Some(0) => Some(()),
        Some(EXIT_PREREQUISITE) if !is_ci() => {
            eprintln!("skipped: a prerequisite of the rxe VM is unavailable (see above)");
            None
        }
        _ => panic!("vrdma-vm {} failed: {status}", args.join(" ")),
    }
}

pub fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// A scratch file path unique to this test process.
pub fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("vrdma-test-{}-{name}", std::process::id()))
}

/// Runs `vrdma-vm ARGS… --no-build --json FILE` and returns the results it wrote there;
/// `None` when skipped (see [`vrdma_vm`]).
pub fn vrdma_vm_json<T: serde::de::DeserializeOwned>(args: &[&str]) -> Option<T> {
    let json = scratch(&format!("{}.json", args.join("-")));
    let json_arg = json.to_string_lossy().into_owned();
    let mut all = args.to_vec();
    all.extend(["--no-build", "--json", &json_arg]);
    vrdma_vm(&all)?;
    let data = std::fs::read(&json).unwrap();
    std::fs::remove_file(&json).unwrap();
    Some(serde_json::from_slice(&data).unwrap())
}

/// Checks one perftest row against the case it ran: the tool, the message size and the
/// iteration count perftest reported (it exits non-zero when a run fails), and a figure that
/// describes a run that moved data. perftest's statistics are reported, not judged: the test
/// judges vrdma, and a jittery run's deviation or percentiles say nothing about it.
///
/// An untimed row passes: perftest ran every iteration (it exited 0 and printed its result
/// line) but could not give the figure (its own clock calibration failed, or it printed no
/// number there) in each of `run_case`'s attempts. Failing on that would fail the test by timing.
pub fn assert_sane_row(row: &Row, case: &Case) {
    assert_eq!(row.tool, case.tool, "{row:?}");
    assert_eq!(row.size, case.size, "{row:?}");
    assert_eq!(row.iterations, u64::from(case.iterations), "{row:?}");
    assert!(row.measurement.completed(), "{row:?}");
    if let Measurement::Untimed { reason } = &row.measurement {
        eprintln!("untimed ({reason}): {row:?}");
    }
}

/// The VM's prepared root file system (built if missing); `None` (the test is skipped) when it
/// cannot be prepared and this is not CI; under `CI=true` that fails the test.
pub fn vm_root() -> Option<vrdma_qemu_tests::rootfs::PreparedRoot> {
    match vrdma_qemu_tests::cli::host::prepared_root() {
        Ok(root) => Some(root),
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: the VM's root file system is unavailable: {e}");
            None
        }
        Err(e) => panic!("preparing the VM's root file system: {e}"),
    }
}

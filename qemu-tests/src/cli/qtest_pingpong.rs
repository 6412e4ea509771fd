//! `qtest-pingpong`: QEMU's vrdma device driven through qtest against native peers, and the
//! README's QEMU command line.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::guest_suite::{deliver_results, run_guest_suite};
use super::host::{prepared_root, target_dir};
use super::vm_args::VmArgs;
use crate::error::{Error, Result};
use crate::native;
use crate::scenarios::backend::Backend;
use crate::scenarios::{qtest_pingpong, readme_qemu};
use crate::vm;

/// QPs the suite asks for through QEMU: past the scenario backend's QP quota, so that the
/// last ones must be refused cleanly.
pub const QPS: u32 = qtest_pingpong::QP_QUOTA + 100;

/// `vrdma-vm test qtest-pingpong`.
pub fn test(vm_args: &VmArgs, json: Option<PathBuf>) -> Result<()> {
    let root = prepared_root()?;
    let target = target_dir()?;
    let native_peer = native::build(&target)?;
    let config = vm_args.config(&root)?;
    let args = vec![
        "--native".into(),
        native_peer.to_string_lossy().into_owned(),
        "--qps".into(),
        QPS.to_string(),
    ];
    let (outcome, results): (_, qtest_pingpong::Results) =
        run_guest_suite(&root, &config, "qtest-pingpong", args, json.as_deref())?;
    let device = &results.device;
    println!(
        "\nvrdma over QEMU's device under qtest, on rxe0 ({:?}, {} vCPUs; VM run {:.0?})",
        config.accel, config.cpus, outcome.elapsed
    );
    println!(
        "device {} magic {:?}, {}; shared memory {:#x} bytes",
        device.function,
        device.magic,
        device.bars.join(", "),
        device.shared_memory_len
    );
    println!(
        "\nvrdma-pingpong, library over qtest next to the native pair (typical one-way latency):"
    );
    print!("{}", qtest_pingpong::render_comparison(&results));
    println!(
        "\nreset mid-traffic: run ended with \"{}\"; backend released everything in {} ms; \
         {} rows verified on a new context",
        results.reset.interrupted_run,
        results.reset.release_ms,
        results.reset.continued.len()
    );
    println!(
        "QEMU SIGKILLed mid-traffic: run ended with \"{}\"; rxe0 idle after {} ms",
        results.kill.interrupted_run, results.kill.release_ms
    );
    let restart = &results.daemon_restart;
    println!(
        "back-end SIGKILLed mid-traffic behind vrdma-keeper: run ended with \"{}\"; rxe0 idle \
         {} ms later with QEMU up ({}); magic read with no daemon: {}; DEVICE_FATAL (epoch \
         {:?}) {} ms after the next daemon started; {} rows verified on a new context; QEMU up \
         after: {}\nkeeper:\n{}",
        restart.interrupted_run,
        restart.release_ms,
        restart.qemu_alive_without_daemon,
        restart.magic_without_daemon,
        restart.fatal_epoch,
        restart.fatal_after_ms,
        restart.continued.len(),
        restart.qemu_alive_after,
        restart.keeper_log
    );
    if let Some(readme) = &results.readme {
        println!(
            "README's QEMU command line: device {} up, shared-memory BAR of {} MiB",
            readme.id,
            readme.shm_bar_size >> 20
        );
    }
    Ok(())
}

/// `vrdma-vm guest qtest-pingpong`.
pub fn guest(native: PathBuf, iters: u32, qps: u32) -> Result<()> {
    let binaries = qtest_pingpong::Binaries::beside_current_exe(native)?;
    let settings = qtest_pingpong::Settings { iters, qps };
    let mut results = qtest_pingpong::run(&binaries, &settings)?;
    results.readme = Some(readme_qemu_check(&binaries.backend)?);
    deliver_results("qtest-pingpong", &results, || {
        qtest_pingpong::render_comparison(&results)
    })
}

/// Runs the README's QEMU command line (adapted to the VM) against a fresh backend.
fn readme_qemu_check(backend_binary: &Path) -> Result<readme_qemu::DeviceSeen> {
    println!("== the README's QEMU command line");
    let exe = std::env::current_exe().map_err(|e| Error::Usage(format!("current_exe: {e}")))?;
    let workspace = vm::find_workspace_root(&exe)
        .ok_or_else(|| Error::Usage("cannot find the workspace (and its README)".into()))?;
    let readme = std::fs::read_to_string(workspace.join("README.md"))
        .map_err(|e| Error::Scenario(format!("reading README.md: {e}")))?;
    let backend = Backend::start(backend_binary, "vrdma-readme-backend", &[], "info")?;
    let args = readme_qemu::adapt(
        &readme_qemu::readme_command(&readme)?,
        &backend.socket,
        "512M",
    )?;
    let seen = readme_qemu::bring_up("qemu-system-x86_64", &args, Duration::from_secs(120))?;
    println!(
        "  ok: {} with a {} MiB shared-memory BAR",
        seen.id,
        seen.shm_bar_size >> 20
    );
    Ok(seen)
}

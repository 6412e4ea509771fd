//! `process-pingpong`: vrdma in process mode on rxe0 against native peers.

use std::path::PathBuf;

use super::guest_suite::{deliver_results, run_guest_suite};
use super::host::{prepared_root, target_dir};
use super::vm_args::VmArgs;
use crate::error::Result;
use crate::native;
use crate::scenarios::{binaries, process_pingpong};

/// `vrdma-vm test process-pingpong`.
pub fn test(vm_args: &VmArgs, json: Option<PathBuf>) -> Result<()> {
    let root = prepared_root()?;
    let target = target_dir()?;
    let native_peer = native::build(&target)?;
    let config = vm_args.config(&root)?;
    let mut args = vec![
        "--native".into(),
        native_peer.to_string_lossy().into_owned(),
    ];
    if let Ok(rounds) = std::env::var("VRDMA_CLEANUP_ROUNDS") {
        args.extend(["--cleanup-rounds".into(), rounds]);
    }
    let (outcome, results): (_, process_pingpong::results::Results) =
        run_guest_suite(&root, &config, "process-pingpong", args, json.as_deref())?;
    println!(
        "\nvrdma process mode on rxe0 ({:?}, {} vCPUs; VM run {:.0?})",
        config.accel, config.cpus, outcome.elapsed
    );
    println!("\nvrdma-pingpong, vrdma next to native (typical one-way latency; bandwidth):");
    print!("{}", process_pingpong::results::render_comparison(&results));
    println!(
        "\nbypass: {} messages per op/size delivered with the backend stopped; cleanup: {} kills, \
         backend fds {:?}, RSS {:?} KiB (first -> last)",
        results.bypass_messages,
        results.cleanup_rounds,
        results.backend_fds,
        results.backend_rss_kib
    );
    Ok(())
}

/// `vrdma-vm guest process-pingpong`.
pub fn guest(native: PathBuf, cleanup_rounds: u32) -> Result<()> {
    let binaries = binaries::Binaries::beside_current_exe(native)?;
    let settings = process_pingpong::settings::Settings {
        cleanup_rounds,
        ..Default::default()
    };
    let results = process_pingpong::run(&binaries, &settings)?;
    deliver_results("process-pingpong", &results, || {
        process_pingpong::results::render_comparison(&results)
    })
}

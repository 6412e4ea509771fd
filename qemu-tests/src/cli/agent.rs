//! `agent`: many unprivileged processes through one guest agent, in the rxe VM.

use std::path::{Path, PathBuf};

use super::guest_suite::{deliver_results, run_guest_suite};
use super::host::{dropin_library, prepared_root, target_dir};
use super::vm_args::VmArgs;
use crate::error::Result;
use crate::native;
use crate::scenarios::agent::{self, AgentOutcome};
use crate::scenarios::binaries::Binaries;
use crate::scenarios::perftest_over_vrdma::prepare_library_dir;

/// `vrdma-vm test agent`.
pub fn test(vm_args: &VmArgs, json: Option<PathBuf>) -> Result<()> {
    let root = prepared_root()?;
    let target = target_dir()?;
    let native_peer = native::build(&target)?;
    let (_, library) = dropin_library()?;
    let library_dir = prepare_library_dir(&target, &library)?;
    let config = vm_args.config(&root)?;
    let args = vec![
        "--native".into(),
        native_peer.to_string_lossy().into_owned(),
        "--library-dir".into(),
        library_dir.to_string_lossy().into_owned(),
    ];
    let (outcome, results): (_, AgentOutcome) =
        run_guest_suite(&root, &config, "agent", args, json.as_deref())?;
    println!(
        "\nthe guest agent on rxe0 ({:?}, {} vCPUs; VM run {:.0?})",
        config.accel, config.cpus, outcome.elapsed
    );
    print!("{}", render(&results));
    Ok(())
}

/// `vrdma-vm guest agent`.
pub fn guest(native: PathBuf, library_dir: &Path) -> Result<()> {
    let binaries = Binaries::beside_current_exe(native)?;
    let results = agent::run(&binaries, library_dir)?;
    deliver_results("agent", &results, || render(&results))
}

fn render(results: &AgentOutcome) -> String {
    format!(
        "{} concurrent unprivileged processes verified; perftest {:?}; \
         crash: {:?} -> {:?} -> back; survivors {} verified\n",
        results.concurrent.len(),
        results.perftest.measurement,
        results.before_victim,
        results.with_victim,
        results.survivors.len()
    )
}

//! The two halves of a suite meet here: on the host, [`run_guest_suite`] boots the VM running
//! `vrdma-vm guest SUITE` and reads back the results; inside the VM, [`deliver_results`]
//! leaves them for it.

use std::path::{Path, PathBuf};

use super::host::{dropin_library, prepared_root, target_dir};
use super::vm_args::VmArgs;
use crate::error::{Error, Result};
use crate::rootfs::PreparedRoot;
use crate::scenarios::perftest_over_vrdma;
use crate::vm::{self, VmConfig};

/// Runs `vrdma-vm guest SUITE ARGS…` (this executable) in the VM and returns the outcome and
/// the results the suite left as `SUITE.json`, a copy of which goes to `json` when asked.
pub fn run_guest_suite<T: serde::de::DeserializeOwned>(
    root: &PreparedRoot,
    config: &VmConfig,
    suite: &str,
    args: Vec<String>,
    json: Option<&Path>,
) -> Result<(vm::RunOutcome, T)> {
    let exe = std::env::current_exe().map_err(|e| Error::Usage(format!("current_exe: {e}")))?;
    let mut command = vec![
        exe.to_string_lossy().into_owned(),
        "guest".into(),
        suite.into(),
    ];
    command.extend(args);
    let outcome = vm::run(root, config, &command)?;
    if outcome.status != 0 {
        return Err(Error::Scenario(format!(
            "{suite} failed in the VM (status {})",
            outcome.status
        )));
    }
    let file = format!("{suite}.json");
    let data = outcome
        .results
        .iter()
        .find(|(name, _)| *name == file)
        .map(|(_, data)| data)
        .ok_or_else(|| Error::Scenario(format!("the VM left no {file}")))?;
    let results =
        serde_json::from_slice(data).map_err(|e| Error::Scenario(format!("{file}: {e}")))?;
    if let Some(path) = json {
        std::fs::write(path, data)
            .map_err(|e| Error::Usage(format!("writing {}: {e}", path.display())))?;
    }
    Ok((outcome, results))
}

/// Runs a suite whose guest half takes `--library-dir`: the directory (prepared on the host)
/// with vrdma's drop-in as `libibverbs.so.1`. Returns the VM
/// configuration it booted with, the outcome and the results.
pub fn run_dropin_suite<T: serde::de::DeserializeOwned>(
    vm_args: &VmArgs,
    suite: &str,
    json: Option<&Path>,
) -> Result<(VmConfig, vm::RunOutcome, T)> {
    let root = prepared_root()?;
    let target = target_dir()?;
    let (_, library) = dropin_library()?;
    let library_dir = perftest_over_vrdma::prepare_library_dir(&target, &library)?;
    let mut config = vm_args.config(&root)?;
    config.echo = true;
    let args = vec![
        "--library-dir".into(),
        library_dir.to_string_lossy().into_owned(),
    ];
    let (outcome, results) = run_guest_suite(&root, &config, suite, args, json)?;
    Ok((config, outcome, results))
}

/// Inside the VM: hands `results` to the host as `SUITE.json` in `$VRDMA_RESULT_DIR`; run by
/// hand (no result directory), prints `table()` instead.
pub fn deliver_results<T: serde::Serialize>(
    suite: &str,
    results: &T,
    table: impl FnOnce() -> String,
) -> Result<()> {
    match std::env::var_os("VRDMA_RESULT_DIR") {
        Some(dir) => {
            let json =
                serde_json::to_vec_pretty(results).map_err(|e| Error::Scenario(e.to_string()))?;
            std::fs::write(PathBuf::from(dir).join(format!("{suite}.json")), json)
                .map_err(|e| Error::Scenario(format!("writing results: {e}")))?
        }
        None => print!("{}", table()),
    }
    Ok(())
}

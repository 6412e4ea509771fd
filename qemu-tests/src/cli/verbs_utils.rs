//! `verbs-utils`: Debian's unmodified libibverbs example programs natively and over vrdma's
//! drop-in, in one boot.

use std::path::{Path, PathBuf};

use super::guest_suite::{deliver_results, run_dropin_suite};
use super::host::backend_binary;
use super::vm_args::VmArgs;
use crate::error::Result;
use crate::scenarios::verbs_utils;

/// `vrdma-vm test verbs-utils`.
pub fn test(vm_args: &VmArgs, json: Option<PathBuf>) -> Result<()> {
    let (config, outcome, runs): (_, _, Vec<verbs_utils::Run>) =
        run_dropin_suite(vm_args, "verbs-utils", json.as_deref())?;
    println!(
        "\nunmodified ibverbs-utils examples on rxe0, natively and over vrdma ({:?}, {} vCPUs; \
         VM run {:.0?}):",
        config.accel, config.cpus, outcome.elapsed
    );
    print!("{}", verbs_utils::render_table(&runs));
    Ok(())
}

/// `vrdma-vm guest verbs-utils`.
pub fn guest(library_dir: &Path) -> Result<()> {
    let backend = backend_binary()?;
    let runs = verbs_utils::run(&backend, library_dir)?;
    deliver_results("verbs-utils", &runs, || verbs_utils::render_table(&runs))
}

//! `verbs-utils`: Debian's unmodified libibverbs example programs natively and over vrdma's
//! drop-in, in one boot.

use std::path::{Path, PathBuf};

use super::guest_suite::{deliver_results, run_guest_suite};
use super::host::{backend_binary, dropin_library, prepared_root, target_dir};
use super::vm_args::VmArgs;
use crate::error::Result;
use crate::scenarios::{perftest_over_vrdma, verbs_utils};

/// `vrdma-vm test verbs-utils`.
pub fn test(vm_args: &VmArgs, json: Option<PathBuf>) -> Result<()> {
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
    let (outcome, runs): (_, Vec<verbs_utils::Run>) =
        run_guest_suite(&root, &config, "verbs-utils", args, json.as_deref())?;
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

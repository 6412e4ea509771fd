//! `perftest-over-vrdma`: Debian's unmodified perftest natively and over vrdma's drop-in, in one
//! boot.

use std::path::{Path, PathBuf};

use super::guest_suite::{deliver_results, run_guest_suite};
use super::host::{backend_binary, dropin_library, prepared_root, target_dir};
use super::vm_args::VmArgs;
use crate::error::Result;
use crate::perftest::{self, Row};
use crate::scenarios::perftest_over_vrdma;

/// `vrdma-vm test perftest-over-vrdma`.
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
    let (outcome, rows): (_, Vec<Row>) =
        run_guest_suite(&root, &config, "perftest-over-vrdma", args, json.as_deref())?;
    println!(
        "\nunmodified perftest on rxe0: native, client over vrdma (server native), both over \
         vrdma ({:?}, {} vCPUs; VM run {:.0?}):",
        config.accel, config.cpus, outcome.elapsed
    );
    print!("{}", perftest::render_table(&rows));
    Ok(())
}

/// `vrdma-vm guest perftest-over-vrdma`.
pub fn guest(library_dir: &Path) -> Result<()> {
    let backend = backend_binary()?;
    let rows = perftest_over_vrdma::run(&backend, library_dir)?;
    deliver_results("perftest-over-vrdma", &rows, || {
        perftest::render_table(&rows)
    })
}

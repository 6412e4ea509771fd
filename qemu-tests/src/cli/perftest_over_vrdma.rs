//! `perftest-over-vrdma`: Debian's unmodified perftest natively and over vrdma's drop-in, in one
//! boot.

use std::path::{Path, PathBuf};

use super::guest_suite::{deliver_results, run_dropin_suite};
use super::host::backend_binary;
use super::vm_args::VmArgs;
use crate::error::Result;
use crate::perftest::{self, Row};
use crate::scenarios::perftest_over_vrdma;

/// `vrdma-vm test perftest-over-vrdma`.
pub fn test(vm_args: &VmArgs, json: Option<PathBuf>) -> Result<()> {
    let (config, outcome, rows): (_, _, Vec<Row>) =
        run_dropin_suite(vm_args, "perftest-over-vrdma", json.as_deref())?;
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

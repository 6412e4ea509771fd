//! `rdmacm-utils`: Debian's unmodified librdmacm example programs and perftest `-R` over
//! vrdma's drop-in librdmacm.so.1 against native peers and each other, then a backend killed
//! under live connections, in one boot.

use std::path::{Path, PathBuf};

use super::guest_suite::{deliver_results, run_dropin_suite};
use super::host::backend_binary;
use super::vm_args::VmArgs;
use crate::error::Result;
use crate::scenarios::rdmacm_suite::{self, SuiteResults};

/// `vrdma-vm test rdmacm-utils`.
pub fn test(vm_args: &VmArgs, json: Option<PathBuf>) -> Result<()> {
    let (config, outcome, results): (_, _, SuiteResults) =
        run_dropin_suite(vm_args, "rdmacm-utils", json.as_deref())?;
    println!(
        "\nunmodified rdmacm-utils examples on rxe0 over vrdma ({:?}, {} vCPUs; VM run {:.0?}):",
        config.accel, config.cpus, outcome.elapsed
    );
    print!("{}", rdmacm_suite::render(&results));
    Ok(())
}

/// `vrdma-vm guest rdmacm-utils`.
pub fn guest(library_dir: &Path) -> Result<()> {
    let results = rdmacm_suite::run(&backend_binary()?, library_dir)?;
    deliver_results("rdmacm-utils", &results, || rdmacm_suite::render(&results))
}

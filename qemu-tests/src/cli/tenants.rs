//! `tenants`: one vrdma-backend serving three tenants with their own addresses; a hostile one
//! attacks while the others keep talking (issue 13's malicious-guest suite).

use std::path::{Path, PathBuf};

use super::guest_suite::{deliver_results, run_dropin_suite};
use super::host::backend_binary;
use super::vm_args::VmArgs;
use crate::error::Result;
use crate::scenarios::tenants;

/// `vrdma-vm test tenants`.
pub fn test(vm_args: &VmArgs, json: Option<PathBuf>) -> Result<()> {
    let (config, outcome, results): (_, _, tenants::Results) =
        run_dropin_suite(vm_args, "tenants", json.as_deref())?;
    println!(
        "\ntenants with their own addresses on rxe0, one of them hostile ({:?}, {} vCPUs; VM run \
         {:.0?}):",
        config.accel, config.cpus, outcome.elapsed
    );
    print!("{}", tenants::render(&results));
    Ok(())
}

/// `vrdma-vm guest tenants`.
pub fn guest(library_dir: &Path) -> Result<()> {
    let backend = backend_binary()?;
    let results = tenants::run(&backend, library_dir)?;
    deliver_results("tenants", &results, || tenants::render(&results))
}

//! `rdmacm-utils`: Debian's unmodified librdmacm example programs over vrdma's drop-in
//! librdmacm.so.1 against native peers and each other, in one boot.

use std::path::{Path, PathBuf};

use super::guest_suite::{deliver_results, run_dropin_suite};
use super::host::backend_binary;
use super::vm_args::VmArgs;
use crate::error::Result;
use crate::scenarios::{perftest_rdma_cm, rdmacm_backend_kill, rdmacm_utils};

/// `vrdma-vm test rdmacm-utils`.
pub fn test(vm_args: &VmArgs, json: Option<PathBuf>) -> Result<()> {
    let (config, outcome, results): (_, _, rdmacm_utils::SuiteResults) =
        run_dropin_suite(vm_args, "rdmacm-utils", json.as_deref())?;
    println!(
        "\nunmodified rdmacm-utils examples on rxe0 over vrdma ({:?}, {} vCPUs; VM run {:.0?}):",
        config.accel, config.cpus, outcome.elapsed
    );
    print!("{}", render(&results));
    Ok(())
}

/// `vrdma-vm guest rdmacm-utils`.
pub fn guest(library_dir: &Path) -> Result<()> {
    let backend = backend_binary()?;
    let runs = rdmacm_utils::run(&backend, library_dir)?;
    let perftest = perftest_rdma_cm::run(&backend, library_dir)?;
    let backend_kill = rdmacm_backend_kill::run(&backend, library_dir)?;
    let results = rdmacm_utils::SuiteResults {
        runs,
        perftest,
        backend_kill,
    };
    deliver_results("rdmacm-utils", &results, || render(&results))
}

fn render(results: &rdmacm_utils::SuiteResults) -> String {
    format!(
        "{}{}{}",
        rdmacm_utils::render_table(&results.runs),
        perftest_rdma_cm::render_table(&results.perftest),
        rdmacm_backend_kill::render(&results.backend_kill)
    )
}

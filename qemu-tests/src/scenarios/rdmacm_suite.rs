//! The `rdmacm-utils` suite as a whole: Debian's librdmacm examples ([`super::rdmacm_utils`]),
//! perftest with `-R` ([`super::perftest_rdma_cm`]), iperf under `librspreload.so`
//! ([`super::rspreload`]) and the backend kill ([`super::rdmacm_backend_kill`]), in that
//! order, in one boot.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{perftest_rdma_cm, rdmacm_backend_kill, rdmacm_utils, rspreload};
use crate::error::Result;

/// What the suite reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuiteResults {
    pub runs: Vec<rdmacm_utils::Run>,
    pub perftest: Vec<perftest_rdma_cm::CmRun>,
    pub preload: Vec<rspreload::PreloadRun>,
    pub backend_kill: rdmacm_backend_kill::KillReport,
}

/// Runs the three parts with the backend binary and the drop-in in `library_dir`.
pub fn run(backend_binary: &Path, library_dir: &Path) -> Result<SuiteResults> {
    Ok(SuiteResults {
        runs: rdmacm_utils::run(backend_binary, library_dir)?,
        perftest: perftest_rdma_cm::run(backend_binary, library_dir)?,
        preload: rspreload::run(backend_binary, library_dir)?,
        backend_kill: rdmacm_backend_kill::run(backend_binary, library_dir)?,
    })
}

/// The suite's tables.
pub fn render(results: &SuiteResults) -> String {
    format!(
        "{}{}{}{}",
        rdmacm_utils::render_table(&results.runs),
        perftest_rdma_cm::render_table(&results.perftest),
        rspreload::render_table(&results.preload),
        rdmacm_backend_kill::render(&results.backend_kill)
    )
}

//! A ping-pong peer process (vrdma-pingpong or the native C peer) seen from a scenario: the rows
//! of its `--json` report, and waiting until a server listens for its out-of-band exchange.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One row of a pingpong `--json` report.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct PingpongRow {
    pub op: String,
    pub size: u32,
    pub iters: u32,
    pub latency: Option<Latency>,
    pub mib_s: f64,
    pub mmsg_s: f64,
    /// How the reporting side awaited completions ("poll" or "events"; vrdma only).
    pub completion: Option<String>,
    /// Completion events it received during the step (vrdma only).
    pub completion_events: Option<u64>,
    /// ARM_CQ commands it sent during the step (vrdma only).
    pub arms: Option<u64>,
}

/// Latency summary of a row (one-way, µs).
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Latency {
    pub typical_us: f64,
    pub avg_us: f64,
    pub p99_us: f64,
}

/// A pingpong `--json` report.
#[derive(Deserialize)]
pub struct PingpongReport {
    pub rows: Vec<PingpongRow>,
}

/// The rows of the pingpong `--json` report at `json`.
pub fn read_report(json: &Path) -> Result<Vec<PingpongRow>> {
    let text = std::fs::read_to_string(json)
        .map_err(|e| Error::Scenario(format!("reading {}: {e}", json.display())))?;
    let report: PingpongReport = serde_json::from_str(&text)
        .map_err(|e| Error::Scenario(format!("parsing {}: {e}", json.display())))?;
    Ok(report.rows)
}

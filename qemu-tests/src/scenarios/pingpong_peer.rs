//! A ping-pong peer process (vrdma-pingpong or the native C peer) seen from a scenario: the rows
//! of its `--json` report, and waiting until a server listens for its out-of-band exchange.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::inside::Proc;
use crate::perftest;

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

/// Waits until the server listens on `port` (its out-of-band exchange socket).
pub fn wait_listening(port: u16, server: &mut Proc) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let tables = ["/proc/net/tcp", "/proc/net/tcp6"]
            .iter()
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .collect::<Vec<_>>();
        if tables.iter().any(|t| perftest::listens_on(t, port)) {
            return Ok(());
        }
        if let Some(status) = server.try_wait()? {
            return Err(server.failure(&format!("exited ({status}) before listening")));
        }
        if std::time::Instant::now() >= deadline {
            return Err(server.failure(&format!("does not listen on port {port}")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

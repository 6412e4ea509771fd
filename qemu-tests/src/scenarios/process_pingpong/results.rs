//! What the process-pingpong scenario measured, and its table of vrdma next to native.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::async_event::AsyncEventOutcome;
use crate::scenarios::pingpong_peer::PingpongRow;

/// Everything the scenario measured, for the host to print and check.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Results {
    /// Keyed by "client-over-server", e.g. "vrdma-over-native".
    pub pingpong: BTreeMap<String, Vec<PingpongRow>>,
    pub bypass_messages: u32,
    pub cleanup_rounds: u32,
    pub backend_fds: (usize, usize),
    pub backend_rss_kib: (u64, u64),
    /// What the asynchronous-event step observed.
    pub async_event: Option<AsyncEventOutcome>,
}

/// A table of vrdma next to native for every (op, size) both ran.
pub fn render_comparison(results: &Results) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let native = results.pingpong.get("native-over-native");
    let _ = writeln!(
        out,
        "{:<10} {:>8} {:>5} {:>14} {:>14} {:>7} {:>12} {:>12} {:>7}",
        "op",
        "size",
        "mode",
        "native_lat_us",
        "vrdma_lat_us",
        "ratio",
        "native_MiB/s",
        "vrdma_MiB/s",
        "ratio"
    );
    let Some(native) = native else {
        return out;
    };
    for label in ["vrdma-over-native", "vrdma-over-vrdma"] {
        let Some(rows) = results.pingpong.get(label) else {
            continue;
        };
        let _ = writeln!(out, "-- {label} (client vrdma) vs native-over-native");
        for row in rows {
            let mode = if row.latency.is_some() { "pp" } else { "bw" };
            let Some(base) = native.iter().find(|n| {
                n.op == row.op && n.size == row.size && n.latency.is_some() == row.latency.is_some()
            }) else {
                continue;
            };
            let lat = |r: &PingpongRow| r.latency.as_ref().map(|l| l.typical_us);
            let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
                _ => "-".to_string(),
            };
            let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
            let _ = writeln!(
                out,
                "{:<10} {:>8} {:>5} {:>14} {:>14} {:>7} {:>12.2} {:>12.2} {:>7}",
                row.op,
                row.size,
                mode,
                show(lat(base)),
                show(lat(row)),
                ratio(lat(row), lat(base)),
                base.mib_s,
                row.mib_s,
                ratio(Some(row.mib_s), Some(base.mib_s))
            );
        }
    }
    out
}

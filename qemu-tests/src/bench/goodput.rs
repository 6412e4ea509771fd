//! Goodput across a lossy link: a stream of 4 KiB RDMA WRITEs from host A to a native peer on
//! host B of the two-host topology ([`crate::vm_link`]), natively and over vrdma, on a clean
//! link and under 1 % loss on both NICs' egress, in the same pair of boots.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::scenarios::two_hosts::{Results as HostResults, StepRecord};
use crate::vm_link::Host;

/// One link condition: native and vrdma goodput side by side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GoodputRow {
    /// `tc netem` parameters on both NICs, or "none".
    pub link: String,
    pub native_mib_s: f64,
    pub vrdma_mib_s: f64,
    /// Packets the two NICs' qdiscs dropped during the native and the vrdma stream.
    pub native_dropped: u64,
    pub vrdma_dropped: u64,
}

impl GoodputRow {
    /// vrdma's goodput over native's.
    pub fn ratio(&self) -> f64 {
        self.vrdma_mib_s / self.native_mib_s
    }
}

/// The rows of a goodput run (the steps of `steps::goodput`), clean link first.
pub fn rows(results: &HostResults) -> Vec<GoodputRow> {
    let stream = |label: &str| -> Option<(f64, u64)> {
        let client = results.record(Host::A, label)?;
        let server = results.record(Host::B, label)?;
        let mib_s = client.rows.first()?.mib_s;
        Some((mib_s, dropped(client) + dropped(server)))
    };
    let mut rows = Vec::new();
    for (suffix, link) in [("", "none"), (", 1 % loss", "loss 1%")] {
        let native = stream(&format!("native-a-over-native-b, stream{suffix}"));
        let vrdma = stream(&format!("vrdma-a-over-native-b, stream{suffix}"));
        if let (Some(native), Some(vrdma)) = (native, vrdma) {
            rows.push(GoodputRow {
                link: link.into(),
                native_mib_s: native.0,
                vrdma_mib_s: vrdma.0,
                native_dropped: native.1,
                vrdma_dropped: vrdma.1,
            });
        }
    }
    rows
}

fn dropped(record: &StepRecord) -> u64 {
    record.qdisc.map_or(0, |q| q.drops)
}

/// The goodput table.
pub fn table(rows: &[GoodputRow]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<10} {:>12} {:>12} {:>7} {:>16}",
        "link", "native MiB/s", "vrdma MiB/s", "ratio", "dropped (n / v)"
    );
    for row in rows {
        let _ = writeln!(
            out,
            "{:<10} {:>12.2} {:>12.2} {:>7.2} {:>8} / {:<6}",
            row.link,
            row.native_mib_s,
            row.vrdma_mib_s,
            row.ratio(),
            row.native_dropped,
            row.vrdma_dropped
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ratio_is_vrdma_over_native() {
        let row = GoodputRow {
            link: "loss 1%".into(),
            native_mib_s: 40.0,
            vrdma_mib_s: 30.0,
            native_dropped: 10,
            vrdma_dropped: 12,
        };
        assert!((row.ratio() - 0.75).abs() < 1e-9);
        let table = table(&[row]);
        assert!(
            table.contains("loss 1%") && table.contains("0.75"),
            "{table}"
        );
    }
}

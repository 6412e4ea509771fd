//! Results: one row per (operation, size), as a table and as JSON.

use std::fmt::Write as _;

use serde::Serialize;

use super::plan::{Mode, Op};
use super::stats::LatencySummary;
use super::wait::{Completion, EventCounts};

/// Results of one step, measured on the client.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    pub op: Op,
    pub size: u32,
    /// Iterations (verify mode) or messages (bandwidth mode).
    pub iters: u32,
    /// Whether this side sent the payload inline.
    pub inline: bool,
    /// One-way latency (half the round trip); only in verify mode.
    pub latency: Option<LatencySummary>,
    /// Payload bytes moved per second, in MiB.
    pub mib_s: f64,
    /// Messages per second, in millions.
    pub mmsg_s: f64,
    /// How this side waited for its completions during the step.
    pub completion: Completion,
    /// What the event mode did during the step (zero when polling).
    #[serde(flatten)]
    pub events: EventCounts,
    /// Whether this side's sends started the host's processing from the process (a host
    /// kick, spec §5.3) rather than through the device's doorbell.
    pub host_kick: bool,
    /// Host kicks the kernel refused during the step (each followed by a doorbell).
    pub kicks_refused: u64,
}

/// Everything a run reports, as written by `--json`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// Which implementation produced it ("vrdma" or "native").
    pub implementation: String,
    pub mode: Mode,
    pub rows: Vec<Row>,
}

impl Report {
    /// The JSON form.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serializes")
    }

    /// A fixed-width table with a header line and one line per row.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<10} {:>8} {:>7} {:>3} {:>14} {:>10} {:>10} {:>10} {:>9}",
            "op",
            "size",
            "iters",
            "inl",
            "lat_typical_us",
            "lat_avg_us",
            "lat_p99_us",
            "MiB/s",
            "Mmsg/s"
        );
        for row in &self.rows {
            let (typical, avg, p99) = match &row.latency {
                Some(l) => (
                    format!("{:.2}", l.typical_us),
                    format!("{:.2}", l.avg_us),
                    format!("{:.2}", l.p99_us),
                ),
                None => ("-".into(), "-".into(), "-".into()),
            };
            let _ = writeln!(
                out,
                "{:<10} {:>8} {:>7} {:>3} {:>14} {:>10} {:>10} {:>10.2} {:>9.4}",
                row.op.name(),
                row.size,
                row.iters,
                if row.inline { "y" } else { "n" },
                typical,
                avg,
                p99,
                row.mib_s,
                row.mmsg_s
            );
        }
        if self
            .rows
            .iter()
            .any(|row| row.completion == Completion::Events)
        {
            let total = self
                .rows
                .iter()
                .fold(EventCounts::default(), |sum, row| sum + row.events);
            let _ = writeln!(out, "completion: events; {}", total.summary());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        Report {
            implementation: "vrdma".into(),
            mode: Mode::Verify,
            rows: vec![
                Row {
                    op: Op::SendImm,
                    size: 64,
                    iters: 300,
                    inline: true,
                    latency: Some(LatencySummary {
                        min_us: 20.0,
                        max_us: 90.0,
                        typical_us: 29.5,
                        avg_us: 31.25,
                        p99_us: 80.0,
                    }),
                    mib_s: 1.5,
                    mmsg_s: 0.016,
                    completion: Completion::Poll,
                    events: EventCounts::default(),
                    host_kick: true,
                    kicks_refused: 0,
                },
                Row {
                    op: Op::Write,
                    size: 65536,
                    iters: 1000,
                    inline: false,
                    latency: None,
                    mib_s: 33.6,
                    mmsg_s: 0.000538,
                    completion: Completion::Poll,
                    events: EventCounts::default(),
                    host_kick: false,
                    kicks_refused: 2,
                },
            ],
        }
    }

    #[test]
    fn table_has_a_header_and_a_row_per_step() {
        let table = report().to_table();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("op") && lines[0].contains("lat_p99_us"));
        let cells: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            cells,
            ["send_imm", "64", "300", "y", "29.50", "31.25", "80.00", "1.50", "0.0160"]
        );
        let cells: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            cells,
            ["write", "65536", "1000", "n", "-", "-", "-", "33.60", "0.0005"]
        );
    }

    #[test]
    fn json_carries_the_same_data() {
        let json: serde_json::Value = serde_json::from_str(&report().to_json()).unwrap();
        assert_eq!(json["implementation"], "vrdma");
        assert_eq!(json["mode"], "verify");
        assert_eq!(json["rows"][0]["op"], "send_imm");
        assert_eq!(json["rows"][0]["latency"]["p99_us"], 80.0);
        assert_eq!(json["rows"][1]["latency"], serde_json::Value::Null);
        assert_eq!(json["rows"][1]["mib_s"], 33.6);
        assert_eq!(json["rows"][0]["completion"], "poll");
        assert_eq!(json["rows"][0]["host_kick"], true);
        assert_eq!(json["rows"][1]["kicks_refused"], 2);
        assert_eq!(json["rows"][0]["completion_events"], 0);
    }

    #[test]
    fn event_mode_adds_a_summary_line_and_counts_per_row() {
        let mut report = report();
        for (row, events) in report.rows.iter_mut().zip([7, 5]) {
            row.completion = Completion::Events;
            row.events = EventCounts {
                completion_events: events,
                arms: events + 1,
                spurious_wakeups: 1,
            };
        }
        let table = report.to_table();
        assert_eq!(
            table.lines().last(),
            Some("completion: events; 12 completion events, 14 arms, 2 spurious wake-ups")
        );
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["rows"][1]["completion"], "events");
        assert_eq!(json["rows"][1]["completion_events"], 5);
        assert_eq!(json["rows"][1]["arms"], 6);
        assert_eq!(json["rows"][1]["spurious_wakeups"], 1);
    }
}

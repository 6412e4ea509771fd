//! Reading what a perftest client printed.
//!
//! perftest's result table is a header line naming the columns and one line of values under
//! it. Only some values are *needed*: the message size and iteration count say which run this
//! was, and one figure per tool family is what comparisons read (typical and average latency,
//! average bandwidth). The other columns (minimum, maximum, deviation, percentiles, peak
//! bandwidth, message rate) are reported when perftest printed a number there and left out
//! when it did not: perftest prints `-nan` for the standard deviation when its variance comes
//! out slightly negative under heavy jitter, and `inf` everywhere when its clock calibration
//! failed. A needed figure that is missing, not a number or not in the unit read makes the row
//! [`Measurement::Untimed`] with the reason; it never fails the run and is never guessed.
//!
//! Values are found by their column's name in the header, not by position, so a perftest that
//! adds or drops a column still reads right; when the line has a different number of values
//! than the header has columns, no value but the size and iteration count is trusted.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::tool::Tool;
use crate::error::{Error, Result};

/// What perftest reported for one case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Measurement {
    Latency {
        typical_us: f64,
        avg_us: f64,
        min_us: Option<f64>,
        max_us: Option<f64>,
        stdev_us: Option<f64>,
        p99_us: Option<f64>,
        p99_9_us: Option<f64>,
    },
    Bandwidth {
        avg_mib_s: f64,
        peak_mib_s: Option<f64>,
        msg_rate_mpps: Option<f64>,
    },
    /// perftest ran every iteration (it exited 0 and printed its result line) but a figure the
    /// harness needs is not there. Usually its cycle-counter calibration (a fit of the TSC
    /// against gettimeofday that must reach r² ≥ 0.9) failed, which happens at random under TCG
    /// when the process is preempted while it samples: it then uses a clock rate of 0, every
    /// latency comes out `inf`, every bandwidth and message rate exactly 0.
    Untimed {
        #[serde(default)]
        reason: String,
    },
}

/// The reason of an untimed row whose clock calibration failed.
pub const CALIBRATION_FAILED: &str = "perftest's clock calibration failed";

impl Measurement {
    /// Whether the numbers can describe a run that moved data: positive rates and latencies.
    pub fn is_plausible(&self) -> bool {
        match self {
            Measurement::Latency {
                typical_us, avg_us, ..
            } => *typical_us > 0.0 && *avg_us > 0.0,
            Measurement::Bandwidth { avg_mib_s, .. } => *avg_mib_s > 0.0,
            Measurement::Untimed { .. } => false,
        }
    }

    /// Whether the run completed: timed plausibly, or untimed (every iteration ran; only a
    /// figure is missing).
    pub fn completed(&self) -> bool {
        self.is_plausible() || self.is_untimed()
    }

    pub fn is_untimed(&self) -> bool {
        matches!(self, Measurement::Untimed { .. })
    }

    /// The figure comparisons read: the typical latency in µs for the latency tools (lower is
    /// better), the average bandwidth in MiB/s for the bandwidth tools (higher is better).
    pub fn headline(&self) -> f64 {
        match self {
            Measurement::Latency { typical_us, .. } => *typical_us,
            Measurement::Bandwidth { avg_mib_s, .. } => *avg_mib_s,
            Measurement::Untimed { .. } => f64::NAN,
        }
    }

    /// The headline with two decimals, or `untimed`.
    pub fn headline_text(&self) -> String {
        match self {
            Measurement::Untimed { .. } => "untimed".into(),
            _ => format!("{:.2}", self.headline()),
        }
    }

    /// Messages per second in millions: reported by the bandwidth tools; for the latency tools
    /// the one-way rate that their average latency implies.
    pub fn msg_rate_mpps(&self) -> Option<f64> {
        match self {
            Measurement::Latency { avg_us, .. } => (*avg_us > 0.0).then(|| 1.0 / avg_us),
            Measurement::Bandwidth { msg_rate_mpps, .. } => *msg_rate_mpps,
            Measurement::Untimed { .. } => None,
        }
    }
}

/// One row of results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub label: String,
    pub tool: Tool,
    pub size: u64,
    pub iterations: u64,
    pub measurement: Measurement,
}

/// Reads the result table of a perftest client's output: the message size, the iteration
/// count and the measurement. An error only when there is no result table to read (no header,
/// no line of values, a table of the other tool family, no size or iteration count).
pub fn parse(tool: Tool, output: &str) -> Result<(u64, u64, Measurement)> {
    let fail = |what: String| Error::Perftest(format!("{}: {what}", tool.command()));
    let mut lines = output.lines();
    let header = lines
        .by_ref()
        .find(|l| l.trim_start().starts_with("#bytes"))
        .ok_or_else(|| fail("no result header".into()))?;
    let data = lines
        .find(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|t| t.parse::<u64>().is_ok())
        })
        .ok_or_else(|| fail("no result line".into()))?;
    let table = Table::new(header, data);
    let count = |i: usize, name: &str| {
        (table.columns.get(i).map(String::as_str) == Some(name))
            .then(|| table.values.get(i)?.parse::<u64>().ok())
            .flatten()
            .ok_or_else(|| fail(format!("no {name} in {header:?} / {data:?}")))
    };
    let bytes = count(0, "#bytes")?;
    let iterations = count(1, "#iterations")?;
    let family = if tool.is_latency() { "t_" } else { "BW " };
    if !table.columns.iter().any(|c| c.starts_with(family)) {
        return Err(fail(format!("not a {family}… table: {header:?}")));
    }
    let measurement = if tool.is_latency() {
        latency(&table)
    } else {
        bandwidth(&table)
    };
    Ok((bytes, iterations, measurement))
}

fn latency(table: &Table) -> Measurement {
    let optional = |name| table.value(name, &["usec"]).ok();
    // The signature of a failed clock calibration: every latency is `inf`.
    let times = ["t_min", "t_max", "t_typical", "t_avg"];
    if times.iter().all(|name| table.raw(name) == Some("inf")) {
        return untimed(CALIBRATION_FAILED.into());
    }
    match (
        table.value("t_typical", &["usec"]),
        table.value("t_avg", &["usec"]),
    ) {
        (Ok(typical_us), Ok(avg_us)) => Measurement::Latency {
            typical_us,
            avg_us,
            min_us: optional("t_min"),
            max_us: optional("t_max"),
            stdev_us: optional("t_stdev"),
            p99_us: optional("99% percentile"),
            p99_9_us: optional("99.9% percentile"),
        },
        (Err(why), _) | (_, Err(why)) => untimed(why),
    }
}

/// perftest's "MB/sec" is 2^20 bytes per second (newer versions say MiB/sec). A run with
/// `--report_gbits` says Gb/sec, which this harness never asks for and does not convert.
const MIB_PER_SEC: &[&str] = &["MB/sec", "MiB/sec"];

fn bandwidth(table: &Table) -> Measurement {
    let rates = ["BW peak", "BW average", "MsgRate"];
    // The signature of a failed clock calibration: every rate exactly 0.
    if rates
        .iter()
        .all(|name| table.raw(name).and_then(|v| v.parse::<f64>().ok()) == Some(0.0))
    {
        return untimed(CALIBRATION_FAILED.into());
    }
    match table.value("BW average", MIB_PER_SEC) {
        Ok(avg_mib_s) => Measurement::Bandwidth {
            avg_mib_s,
            peak_mib_s: table.value("BW peak", MIB_PER_SEC).ok(),
            msg_rate_mpps: table.value("MsgRate", &["Mpps"]).ok(),
        },
        Err(why) => untimed(why),
    }
}

fn untimed(reason: String) -> Measurement {
    Measurement::Untimed { reason }
}

/// A header's column names (`t_typical[usec]`, `99% percentile[usec]`, `#bytes`) and the
/// values under them.
struct Table<'a> {
    columns: Vec<String>,
    values: Vec<&'a str>,
}

impl<'a> Table<'a> {
    fn new(header: &str, data: &'a str) -> Self {
        Self {
            columns: column_names(header),
            values: data.split_whitespace().collect(),
        }
    }

    /// The text under the column named `name` (with its unit left off), if the line has one
    /// value per column.
    fn raw(&self, name: &str) -> Option<&'a str> {
        if self.values.len() != self.columns.len() {
            return None;
        }
        let i = self.columns.iter().position(|c| split_unit(c).0 == name)?;
        Some(self.values[i])
    }

    /// The finite, non-negative number under `name`, whose unit must be one of `units`; the
    /// error says why there is none.
    fn value(&self, name: &str, units: &[&str]) -> std::result::Result<f64, String> {
        let Some(column) = self.columns.iter().find(|c| split_unit(c).0 == name) else {
            return Err(format!("perftest printed no {name} column"));
        };
        let unit = split_unit(column).1;
        if !units.contains(&unit) {
            return Err(format!("{column} is not in {}", units.join(" or ")));
        }
        if self.values.len() != self.columns.len() {
            return Err(format!(
                "{} values under {} columns",
                self.values.len(),
                self.columns.len()
            ));
        }
        let raw = self.raw(name).unwrap_or_default();
        raw.parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| format!("{column} is {raw:?}"))
    }
}

/// `name[unit]` → (`name`, `unit`); a name without a unit has an empty one.
fn split_unit(column: &str) -> (&str, &str) {
    match column.strip_suffix(']').and_then(|c| c.split_once('[')) {
        Some((name, unit)) => (name, unit),
        None => (column, ""),
    }
}

/// Column names of a perftest header. A name may hold spaces (`BW peak[MiB/sec]`, `99%
/// percentile[usec]`): words join until one ends with its `[unit]`; `#…` words stand alone.
fn column_names(header: &str) -> Vec<String> {
    let mut columns = Vec::new();
    let mut pending: Vec<&str> = Vec::new();
    for word in header.split_whitespace() {
        if word.starts_with('#') {
            if !pending.is_empty() {
                columns.push(pending.join(" "));
                pending.clear();
            }
            columns.push(word.to_string());
            continue;
        }
        pending.push(word);
        if word.ends_with(']') {
            columns.push(pending.join(" "));
            pending.clear();
        }
    }
    if !pending.is_empty() {
        columns.push(pending.join(" "));
    }
    columns
}

/// A fixed-width table of rows, one per line.
pub fn render_table(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<12} {:<13} {:>8} {:>6} {:>12} {:>10} {:>10} {:>10} {:>10}",
        "side", "tool", "size", "iters", "typical_us", "avg_us", "p99_us", "MiB/s", "Mmsg/s"
    );
    let figure = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"));
    for row in rows {
        let (typical, avg, p99, bw) = match &row.measurement {
            Measurement::Latency {
                typical_us,
                avg_us,
                p99_us,
                ..
            } => (
                figure(Some(*typical_us)),
                figure(Some(*avg_us)),
                figure(*p99_us),
                "-".to_string(),
            ),
            Measurement::Bandwidth { avg_mib_s, .. } => (
                "-".to_string(),
                "-".to_string(),
                "-".to_string(),
                figure(Some(*avg_mib_s)),
            ),
            Measurement::Untimed { .. } => (
                "untimed".to_string(),
                "untimed".to_string(),
                "untimed".to_string(),
                "-".to_string(),
            ),
        };
        let rate = row
            .measurement
            .msg_rate_mpps()
            .map_or_else(|| "-".to_string(), |r| format!("{r:.4}"));
        let _ = writeln!(
            out,
            "{:<12} {:<13} {:>8} {:>6} {:>12} {:>10} {:>10} {:>10} {:>10}",
            row.label,
            row.tool.command(),
            row.size,
            row.iterations,
            typical,
            avg,
            p99,
            bw,
            rate
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";

    const LAT: &str = "\
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 2       1000          41.20          212.45       58.61             60.02          9.87             97.13                 201.07  
---------------------------------------------------------------------------------------
";

    const BW: &str = "\
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]
 65536      300              35.12              33.60                0.000538
---------------------------------------------------------------------------------------
";

    /// The line that failed a demo: a standard deviation of `-nan` under heavy jitter.
    const NAN_STDEV: &str = " 2       200          523.29         189060.31      4387.46  \t       11947.46     \t-nan   \t\t149588.80 \t\t189060.31";

    /// perftest's latency output with `line` as its values.
    fn latency_with(line: &str) -> String {
        format!("{LAT_HEADER}\n{line}\n")
    }

    #[test]
    fn parses_latency() {
        let (bytes, iters, m) = parse(Tool::IbSendLat, LAT).unwrap();
        assert_eq!((bytes, iters), (2, 1000));
        assert_eq!(
            m,
            Measurement::Latency {
                typical_us: 58.61,
                avg_us: 60.02,
                min_us: Some(41.20),
                max_us: Some(212.45),
                stdev_us: Some(9.87),
                p99_us: Some(97.13),
                p99_9_us: Some(201.07),
            }
        );
    }

    #[test]
    fn a_nan_deviation_leaves_out_the_deviation_only() {
        let (bytes, iters, m) = parse(Tool::IbSendLat, &latency_with(NAN_STDEV)).unwrap();
        assert_eq!((bytes, iters), (2, 200));
        assert_eq!(
            m,
            Measurement::Latency {
                typical_us: 4387.46,
                avg_us: 11947.46,
                min_us: Some(523.29),
                max_us: Some(189060.31),
                stdev_us: None,
                p99_us: Some(149588.80),
                p99_9_us: Some(189060.31),
            }
        );
        assert!(m.is_plausible());
        for spelling in ["nan", "inf", "-inf", "NaN", "garbage", "-1.0"] {
            let line = NAN_STDEV.replace("-nan", spelling);
            let (_, _, m) = parse(Tool::IbWriteLat, &latency_with(&line)).unwrap();
            assert!(
                matches!(m, Measurement::Latency { stdev_us: None, typical_us, .. } if typical_us == 4387.46),
                "{spelling}: {m:?}"
            );
            // The same in a percentile column.
            let line = LAT.replace("97.13", spelling);
            let (_, _, m) = parse(Tool::IbWriteLat, &line).unwrap();
            assert!(
                matches!(
                    m,
                    Measurement::Latency {
                        p99_us: None,
                        stdev_us: Some(_),
                        ..
                    }
                ),
                "{spelling}: {m:?}"
            );
        }
    }

    #[test]
    fn a_needed_value_that_is_no_number_makes_the_row_untimed_with_the_reason() {
        for (needed, spelling) in [("58.61", "-nan"), ("58.61", "inf"), ("60.02", "nan")] {
            let (size, iters, m) = parse(Tool::IbSendLat, &LAT.replace(needed, spelling)).unwrap();
            assert_eq!((size, iters), (2, 1000));
            let Measurement::Untimed { reason } = &m else {
                panic!("{spelling} in place of {needed}: {m:?}")
            };
            assert!(reason.contains(spelling), "{reason}");
            assert!(m.completed() && !m.is_plausible());
        }
        let (_, _, m) = parse(Tool::IbWriteBw, &BW.replace("33.60", "-nan")).unwrap();
        assert!(
            matches!(&m, Measurement::Untimed { reason } if reason.contains("BW average")),
            "{m:?}"
        );
    }

    #[test]
    fn a_failed_calibration_is_untimed() {
        let line = " 2       200          inf            inf          inf      \t       inf         \t-nan   \t\tinf     \t\tinf    ";
        let (size, iterations, m) = parse(Tool::IbSendLat, &latency_with(line)).unwrap();
        assert_eq!((size, iterations), (2, 200));
        assert_eq!(m, untimed(CALIBRATION_FAILED.into()));
        assert!(!m.is_plausible() && m.completed());
        let zero = BW
            .replace("35.12", "0.00")
            .replace("33.60", "0.00")
            .replace("0.000538", "0.000000");
        let (_, _, m) = parse(Tool::IbWriteBw, &zero).unwrap();
        assert_eq!(m, untimed(CALIBRATION_FAILED.into()));
    }

    #[test]
    fn parses_bandwidth_in_either_unit_spelling() {
        let (bytes, _, m) = parse(Tool::IbWriteBw, BW).unwrap();
        assert_eq!(bytes, 65536);
        assert_eq!(
            m,
            Measurement::Bandwidth {
                peak_mib_s: Some(35.12),
                avg_mib_s: 33.60,
                msg_rate_mpps: Some(0.000538)
            }
        );
        let old = BW.replace("MiB/sec", "MB/sec");
        assert_eq!(parse(Tool::IbReadBw, &old).unwrap().2, m);
        // Gb/sec is another unit: not read as MiB/s, and not an error of the run either.
        let gbits = BW.replace("MiB/sec", "Gb/sec");
        let (_, _, m) = parse(Tool::IbReadBw, &gbits).unwrap();
        assert!(
            matches!(&m, Measurement::Untimed { reason } if reason.contains("Gb/sec")),
            "{m:?}"
        );
    }

    #[test]
    fn bandwidth_statistics_that_are_no_numbers_are_left_out() {
        for spelling in ["-nan", "inf", "nan"] {
            let (_, _, m) = parse(Tool::IbSendBw, &BW.replace("0.000538", spelling)).unwrap();
            assert_eq!(
                m,
                Measurement::Bandwidth {
                    peak_mib_s: Some(35.12),
                    avg_mib_s: 33.60,
                    msg_rate_mpps: None
                },
                "{spelling}"
            );
            let (_, _, m) = parse(Tool::IbSendBw, &BW.replace("35.12", spelling)).unwrap();
            assert!(
                matches!(m, Measurement::Bandwidth { peak_mib_s: None, avg_mib_s, .. } if avg_mib_s == 33.60),
                "{spelling}: {m:?}"
            );
        }
    }

    #[test]
    fn columns_are_found_by_name() {
        // A perftest that adds a column before the ones read, and one that drops one.
        let extra = "\
 #bytes #iterations    t_min[usec]    t_max[usec]  t_median[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]
 2       1000          41.20          212.45       57.00           58.61             60.02          9.87             97.13                 201.07
";
        let (_, _, m) = parse(Tool::IbSendLat, extra).unwrap();
        assert_eq!(m, parse(Tool::IbSendLat, LAT).unwrap().2);
        let fewer = "\
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]
 2       1000          41.20          212.45       58.61             60.02
";
        let (_, _, m) = parse(Tool::IbSendLat, fewer).unwrap();
        assert!(
            matches!(m, Measurement::Latency { typical_us, p99_us: None, stdev_us: None, .. } if typical_us == 58.61),
            "{m:?}"
        );
        let no_msg_rate = "\
 #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]
 65536      300              35.12              33.60
";
        let (_, _, m) = parse(Tool::IbWriteBw, no_msg_rate).unwrap();
        assert!(
            matches!(m, Measurement::Bandwidth { avg_mib_s, msg_rate_mpps: None, .. } if avg_mib_s == 33.60),
            "{m:?}"
        );
    }

    #[test]
    fn a_line_that_does_not_fit_its_header_is_not_read_by_position() {
        // One value missing: which one is unknown, so no figure is trusted; size and
        // iterations (always the first two) still are.
        let short = LAT.replace("9.87 ", "");
        let (size, iters, m) = parse(Tool::IbSendLat, &short).unwrap();
        assert_eq!((size, iters), (2, 1000));
        assert!(
            matches!(&m, Measurement::Untimed { reason } if reason.contains("8 values under 9 columns")),
            "{m:?}"
        );
        let long = BW.replace("0.000538", "0.000538 12.0");
        let (_, _, m) = parse(Tool::IbWriteBw, &long).unwrap();
        assert!(m.is_untimed(), "{m:?}");
    }

    #[test]
    fn no_table_is_an_error() {
        assert!(parse(Tool::IbSendLat, "Couldn't connect to 127.0.0.1:18515\n").is_err());
        assert!(parse(Tool::IbSendLat, " #bytes #iterations t_typical\n").is_err());
        // A latency tool's output read as if it were bandwidth, and the other way round.
        assert!(parse(Tool::IbWriteBw, LAT).is_err());
        assert!(parse(Tool::IbSendLat, BW).is_err());
        // No iteration count.
        let garbled = LAT.replace(" 1000 ", " many ");
        assert!(parse(Tool::IbSendLat, &garbled).is_err());
    }

    #[test]
    fn column_names_keep_their_spaces() {
        assert_eq!(
            column_names(LAT_HEADER),
            [
                "#bytes",
                "#iterations",
                "t_min[usec]",
                "t_max[usec]",
                "t_typical[usec]",
                "t_avg[usec]",
                "t_stdev[usec]",
                "99% percentile[usec]",
                "99.9% percentile[usec]"
            ]
        );
        assert_eq!(split_unit("BW peak[MiB/sec]"), ("BW peak", "MiB/sec"));
        assert_eq!(split_unit("#bytes"), ("#bytes", ""));
    }

    #[test]
    fn plausibility_needs_positive_figures() {
        let (_, _, m) = parse(Tool::IbWriteBw, BW).unwrap();
        assert!(m.is_plausible());
        let slow = BW.replace("35.12", "0.01").replace("33.60", "0.00");
        let (_, _, m) = parse(Tool::IbWriteBw, &slow).unwrap();
        assert!(!m.is_plausible() && !m.completed(), "{m:?}");
        let (_, _, m) = parse(Tool::IbSendLat, LAT).unwrap();
        assert!(m.is_plausible());
    }

    #[test]
    fn table_has_a_row_per_result() {
        let rows: Vec<Row> = [
            (Tool::IbSendLat, LAT.to_string()),
            (Tool::IbWriteBw, BW.to_string()),
            (Tool::IbSendLat, latency_with(NAN_STDEV)),
            (Tool::IbWriteBw, BW.replace("0.000538", "-nan")),
        ]
        .iter()
        .map(|(tool, out)| {
            let (size, iterations, measurement) = parse(*tool, out).unwrap();
            Row {
                label: "native".into(),
                tool: *tool,
                size,
                iterations,
                measurement,
            }
        })
        .collect();
        let table = render_table(&rows);
        assert_eq!(table.lines().count(), 5);
        assert!(table.contains("ib_send_lat") && table.contains("58.61"));
        assert!(table.contains("ib_write_bw") && table.contains("33.60"));
        assert!(table.contains("4387.46"));
    }

    #[test]
    fn headline_is_typical_latency_or_average_bandwidth() {
        let (_, _, lat) = parse(Tool::IbSendLat, LAT).unwrap();
        assert_eq!(lat.headline(), 58.61);
        assert_eq!(lat.headline_text(), "58.61");
        let (_, _, bw) = parse(Tool::IbWriteBw, BW).unwrap();
        assert_eq!(bw.headline(), 33.60);
        assert_eq!(untimed("x".into()).headline_text(), "untimed");
        assert_eq!(Tool::IbWriteLat.headline_unit(), "typical_us");
        assert_eq!(Tool::IbReadBw.headline_unit(), "MiB/s");
    }

    #[test]
    fn rows_read_back_from_json() {
        let (_, _, m) = parse(Tool::IbSendLat, &latency_with(NAN_STDEV)).unwrap();
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<Measurement>(&json).unwrap(), m);
        let json = serde_json::to_string(&untimed("why".into())).unwrap();
        assert_eq!(json, r#"{"kind":"untimed","reason":"why"}"#);
    }
}

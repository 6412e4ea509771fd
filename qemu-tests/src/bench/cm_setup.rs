//! Connection setup through the RDMA connection manager: Debian's unmodified `cmtime`
//! (rdmacm-utils) with both sides native, then with both over vrdma's drop-in
//! `librdmacm.so.1` (two sessions of one backend), alternating for the plan's rounds.
//!
//! The `cmtime` client creates N ids, resolves their addresses and routes, creates their QPs
//! and connects them all (each step started for every id before the next step begins; the
//! kernel CM drives the QPs to RTS), then disconnects and destroys them; it prints each
//! step's total time. The server accepts each request on a QP of its own. The rate row is N
//! divided by the steps from nothing to ESTABLISHED (create id, resolve address, resolve
//! route, create QP, connect).
//!
//! The `cmtime` is Debian 12's (rdmacm-utils 44, the host's package, installed with apt-get
//! and copied under the target directory where the VM sees it): the VM's own (trixie,
//! rdmacm-utils 56) synchronises its two sides over an IPv4-only TCP socket, which the VM's
//! link-local IPv6 network cannot carry.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::control::ControlRow;
use super::stats::Summary;
use crate::error::{Error, IoContext, Result};
use crate::host::{ensure_tools, which, Tool};
use crate::inside::Proc;
use crate::perftest::Side;
use crate::scenarios::rdmacm_utils::{command, link_local_address, wait_cm_listening};

/// The steps that take an id from nothing to an established connection.
pub const SETUP_STEPS: &[&str] = &[
    "create id",
    "resolve addr",
    "resolve route",
    "create qp",
    "connect",
];
/// Every step `cmtime` prints (without a bind address, the client prints no "bind addr").
pub const STEPS: &[&str] = &[
    "create id",
    "resolve addr",
    "resolve route",
    "create qp",
    "connect",
    "disconnect",
    "destroy",
];
/// Name of the rate row.
pub const RATE: &str = "setup rate";

/// What the connection-setup measurement does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmSetupPlan {
    /// Connections each `cmtime` client sets up.
    pub connections: u32,
    /// Runs of each side (native and vrdma alternating).
    pub rounds: u32,
}

/// One row: a step's cost per connection (`us_per_conn`), or the setup rate (`conn_per_s`),
/// natively and through vrdma.
pub type CmSetupRow = ControlRow;

/// What one `cmtime` client printed: each step's total milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct StepTimes {
    pub total_ms: Vec<(String, f64)>,
}

impl StepTimes {
    fn total(&self, step: &str) -> Option<f64> {
        self.total_ms
            .iter()
            .find(|(name, _)| name == step)
            .map(|&(_, ms)| ms)
    }

    /// Connections per second from nothing to established.
    fn setup_rate(&self, connections: u32) -> Option<f64> {
        let ms: f64 = SETUP_STEPS
            .iter()
            .map(|s| self.total(s))
            .sum::<Option<f64>>()?;
        (ms > 0.0).then(|| f64::from(connections) * 1000.0 / ms)
    }
}

/// Parses `cmtime`'s table (`step: total_ms max_ms min_us us_per_conn`), requiring every step
/// of [`STEPS`] and no sign of a failed connection anywhere in `output`. Only each step's total
/// is read (the rows are built from it); the other three columns are cmtime's statistics and
/// may hold anything.
pub fn parse(output: &str) -> std::result::Result<StepTimes, String> {
    for line in output.lines() {
        let lower = line.to_lowercase();
        if ["error", "failure", "failing"]
            .iter()
            .any(|bad| lower.contains(bad))
        {
            return Err(format!("cmtime printed {line:?}"));
        }
    }
    let mut total_ms = Vec::new();
    for line in output.lines() {
        let Some((name, numbers)) = line.split_once(':') else {
            continue;
        };
        let name = name.trim();
        if !STEPS.contains(&name) {
            continue;
        }
        let fields: Vec<&str> = step_fields(numbers).collect();
        if fields.len() != 4 {
            return Err(format!("cmtime line {line:?}: not four columns"));
        }
        let total = fields[0].trim();
        let total = total
            .parse::<f64>()
            .ok()
            .filter(|ms| ms.is_finite() && *ms >= 0.0)
            .ok_or_else(|| format!("cmtime line {line:?}: a total of {total:?} ms"))?;
        total_ms.push((name.to_string(), total));
    }
    if let Some(missing) = STEPS
        .iter()
        .find(|s| !total_ms.iter().any(|(n, _)| n == *s))
    {
        return Err(format!("cmtime printed no {missing:?} step"));
    }
    Ok(StepTimes { total_ms })
}

/// The number fields of a step line after its colon. cmtime prints them as
/// `%11.2f%11.2f%11.2f%11.2f`: fixed widths with no separator, so a value that fills its 11
/// characters (a step of 77 s in µs) touches its neighbour and only the widths split them.
fn step_fields(numbers: &str) -> Box<dyn Iterator<Item = &str> + '_> {
    const WIDTH: usize = 11;
    let fields = numbers.strip_prefix(' ').unwrap_or(numbers);
    if fields.is_ascii() && fields.len() == 4 * WIDTH {
        Box::new((0..4).map(move |i| &fields[i * WIDTH..(i + 1) * WIDTH]))
    } else {
        Box::new(numbers.split_whitespace())
    }
}

/// The host's `cmtime`, installed if missing, copied to `<target>/native/cmtime` (the path the
/// VM runs).
pub fn host_cmtime(target: &Path) -> Result<PathBuf> {
    ensure_tools(&[Tool {
        command: "cmtime",
        package: "rdmacm-utils",
    }])?;
    let source =
        which("cmtime").ok_or_else(|| Error::Prerequisite("cmtime is not on PATH".into()))?;
    let copy = target.join("native").join("cmtime");
    let bytes = std::fs::read(&source).context(|| format!("reading {}", source.display()))?;
    if std::fs::read(&copy).ok().as_deref() != Some(&bytes[..]) {
        std::fs::create_dir_all(target.join("native"))
            .context(|| format!("creating {}", target.join("native").display()))?;
        let partial = copy.with_extension(format!("{}.tmp", std::process::id()));
        std::fs::copy(&source, &partial).context(|| format!("copying {}", source.display()))?;
        std::fs::rename(&partial, &copy).context(|| format!("installing {}", copy.display()))?;
    }
    Ok(copy)
}

/// Suffix of the rows measured with the drop-in moving each connection's QP itself, a
/// command per step, instead of the device inside CM_ACCEPT (`VRDMA_F_CM_MOVES_QP`).
pub const DRIVER_MOVES: &str = "_driver_moves";
/// How the drop-in is told to move the QPs itself.
pub const DRIVER_MOVES_ENV: (&str, &str) = ("VRDMA_CM_MOVES_QP", "0");

/// Variants of the vrdma side, each measured beside it: the suffix of its rows, the variable
/// that makes it, and the steps it reports (the setup rate always).
const VARIANTS: [(&str, (&str, &str), &[&str]); 2] = [
    // Control round trips that poll for their answers: the adaptive polling.
    (super::control::POLLING, super::control::POLLING_ENV, &[]),
    // The steps the device's QP moves shorten.
    (DRIVER_MOVES, DRIVER_MOVES_ENV, &["connect"]),
];

/// Runs the plan: for each round a native pair, a vrdma pair and a vrdma pair of each of
/// [`VARIANTS`], each on a port of its own.
pub fn run(
    cmtime: &Path,
    plan: &CmSetupPlan,
    native: &Side,
    vrdma: &Side,
) -> Result<Vec<CmSetupRow>> {
    let variants: Vec<Side> = VARIANTS
        .iter()
        .map(|(suffix, (var, value), _)| {
            let mut side = vrdma.clone();
            side.label = format!("{}{}", vrdma.label, suffix.replace('_', "-"));
            side.env.push(((*var).into(), (*value).into()));
            side
        })
        .collect();
    let address = link_local_address()?;
    println!(
        "connection setup: cmtime, {} connections x{} …",
        plan.connections, plan.rounds
    );
    let sides: Vec<&Side> = [native, vrdma].into_iter().chain(&variants).collect();
    let mut runs: Vec<Vec<StepTimes>> = vec![Vec::new(); sides.len()];
    let mut port = 7600;
    for _ in 0..plan.rounds {
        for (i, side) in sides.iter().enumerate() {
            runs[i].push(run_pair(cmtime, side, &address, port, plan.connections)?);
            port += 1;
        }
    }
    let mut out = rows(&runs[0], &runs[1], plan.connections)?;
    for ((suffix, _, steps), variant_runs) in VARIANTS.iter().zip(&runs[2..]) {
        let variant = rows(&runs[0], variant_runs, plan.connections)?;
        out.extend(
            variant
                .into_iter()
                .filter(|r| r.op == RATE || steps.contains(&r.op.as_str()))
                .map(|mut r| {
                    r.op.push_str(suffix);
                    r
                }),
        );
    }
    Ok(out)
}

/// One `cmtime` server and client, both on `side`.
fn run_pair(
    cmtime: &Path,
    side: &Side,
    address: &str,
    port: u16,
    connections: u32,
) -> Result<StepTimes> {
    let cmtime = cmtime.to_string_lossy();
    let name = |role: &str| format!("cmtime-{}-{role}", side.label);
    let port_arg = port.to_string();
    let server_args = ["-b", address, "-p", &port_arg].map(String::from);
    let mut server = Proc::spawn(&name("server"), &mut command(&cmtime, side, &server_args))?;
    wait_cm_listening(&mut server, port, Duration::from_secs(60))?;
    let count = connections.to_string();
    let client_args = ["-s", address, "-p", &port_arg, "-c", &count].map(String::from);
    let mut client = Proc::spawn(&name("client"), &mut command(&cmtime, side, &client_args))?;
    // Under TCG a connection takes milliseconds; a stuck one is a failure, not a slow run.
    client.wait_success(Duration::from_secs(300))?;
    // The server serves until it is stopped.
    if let Some(status) = server.try_wait()? {
        return Err(server.failure(&format!("exited during the run ({status})")));
    }
    server.kill();
    parse(&client.output()).map_err(|why| client.failure(&why))
}

/// The rows: each step's microseconds per connection, then the setup rate.
pub fn rows(
    native: &[StepTimes],
    vrdma: &[StepTimes],
    connections: u32,
) -> Result<Vec<CmSetupRow>> {
    let per_conn = 1000.0 / f64::from(connections.max(1));
    let row = |step: &str, unit: &str, n: Vec<f64>, v: Vec<f64>| {
        ControlRow::compare(step, unit, Summary::of(&n), Summary::of(&v))
    };
    let mut out = Vec::new();
    for step in STEPS {
        let us = |runs: &[StepTimes]| -> Vec<f64> {
            runs.iter()
                .filter_map(|r| r.total(step))
                .map(|ms| ms * per_conn)
                .collect()
        };
        out.push(row(step, "us_per_conn", us(native), us(vrdma))?);
    }
    let rate = |runs: &[StepTimes]| -> Vec<f64> {
        runs.iter()
            .filter_map(|r| r.setup_rate(connections))
            .collect()
    };
    out.push(row(RATE, "conn_per_s", rate(native), rate(vrdma))?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What cmtime v44 prints for a client of 10 connections (no bind address).
    fn client_output(scale: f64) -> String {
        let mut out = String::from(
            "creating id\nresolving address\nresolving route\ncreating qp\nconnecting\n\
             disconnecting\ndestroying id\nstep              total ms     max ms     min us  us / conn\n",
        );
        for (i, step) in STEPS.iter().enumerate() {
            let total = (i + 1) as f64 * scale;
            out.push_str(&format!(
                "{step:<13}: {total:11.2}{:11.2}{:11.2}{:11.2}\n",
                total / 2.0,
                total * 10.0,
                total * 100.0
            ));
        }
        out
    }

    #[test]
    fn cmtime_tables_are_read_step_by_step() {
        let times = parse(&client_output(1.0)).unwrap();
        assert_eq!(times.total("create id"), Some(1.0));
        assert_eq!(times.total("destroy"), Some(7.0));
        // 10 connections in 1+2+3+4+5 ms: 666.7 per second.
        let rate = times.setup_rate(10).unwrap();
        assert!((rate - 10_000.0 / 15.0).abs() < 1e-9, "{rate}");
    }

    #[test]
    fn failed_connections_and_short_tables_are_errors() {
        let failed = format!(
            "event: RDMA_CM_EVENT_REJECTED, error: 8\n{}",
            client_output(1.0)
        );
        assert!(parse(&failed).unwrap_err().contains("REJECTED"));
        let short: String = client_output(1.0)
            .lines()
            .filter(|l| !l.starts_with("connect "))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(parse(&short).unwrap_err().contains("\"connect\""));
        assert!(parse("connect      :   1.0 2 3\n").is_err());
        let nan_total = client_output(1.0).replace("       1.00", "       -nan");
        assert!(parse(&nan_total).unwrap_err().contains("-nan"));
    }

    #[test]
    fn statistics_columns_are_not_read() {
        // cmtime's max, min and per-connection columns are not needed: whatever they hold.
        let output = client_output(1.0)
            .lines()
            .map(|l| match l.split_once(':') {
                Some((step, numbers)) if STEPS.contains(&step.trim()) => {
                    let total = &numbers[..12];
                    format!("{step}:{total}       -nan        inf        nan\n")
                }
                _ => format!("{l}\n"),
            })
            .collect::<String>();
        let times = parse(&output).unwrap();
        assert_eq!(times.total("create id"), Some(1.0));
        assert_eq!(times.total("destroy"), Some(7.0));
    }

    #[test]
    fn values_that_fill_their_columns_are_split_by_width() {
        // Seen in a run whose disconnects each waited 77 s: the min-µs column is 11 wide.
        let line = "disconnect   :    77651.30   77626.3077470416.00 3882565.25";
        let output = client_output(1.0)
            .lines()
            .map(|l| {
                if l.starts_with("disconnect ") {
                    line
                } else {
                    l
                }
            })
            .fold(String::new(), |out, l| out + l + "\n");
        let times = parse(&output).unwrap();
        assert_eq!(times.total("disconnect"), Some(77651.30));
    }

    #[test]
    fn rows_compare_each_step_and_the_rate() {
        let native = [parse(&client_output(1.0)).unwrap()];
        let vrdma = [parse(&client_output(4.0)).unwrap()];
        let rows = rows(&native, &vrdma, 10).unwrap();
        assert_eq!(rows.len(), STEPS.len() + 1);
        // create id: 1 ms for 10 connections is 100 µs each.
        assert_eq!(rows[0].native.median, 100.0);
        assert!((rows[0].ratio - 4.0).abs() < 1e-9);
        let rate = rows.last().unwrap();
        assert_eq!((rate.op.as_str(), rate.unit.as_str()), (RATE, "conn_per_s"));
        assert!((rate.ratio - 0.25).abs() < 1e-9, "{rate:?}");
    }
}

//! `two-hosts`: vrdma across a real link between two rxe hosts (issue 16).
//!
//! Host A and host B are two VMs joined by an Ethernet link ([`crate::vm_link`]); each runs
//! its own vrdma-backend on its own rxe0. Both run this scenario with the same step list
//! ([`steps`]) and meet over the link: in each step one host serves a verified ping-pong and
//! the other connects to it, vrdma or native on either side, some steps with loss,
//! reordering or duplication on both NICs' egress ([`link`]). Each host reports what it saw;
//! the host side of the suite puts the two reports together and checks that both ends agree.

pub mod backend_restart;
pub mod interruption;
pub mod link;
pub mod link_failure;
pub mod perftest_across;
pub mod rendezvous;
pub mod rnr;
pub mod steps;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::inside::{resource_counts, wait_for_counts, Proc, DEVICE};
use crate::perftest::Case;
use crate::scenarios::backend::Backend;
use crate::scenarios::binaries::Binaries;
use crate::scenarios::pingpong_peer::{
    pingpong_command, read_report, Impl, PingpongRow, Plan, PEER_TIMEOUT_S,
};
use crate::vm_link::Host;
use link::{NicFrames, QdiscStats};
use steps::Step;

/// First TCP port of the steps' out-of-band exchanges (one port per step).
const FIRST_PORT: u16 = 18700;

/// What one host did in one step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepRecord {
    pub label: String,
    /// "server" or "client".
    pub role: String,
    /// "vrdma" or "native".
    pub implementation: String,
    pub netem: Option<String>,
    /// The client's verified rows (a server reports none).
    pub rows: Vec<PingpongRow>,
    /// A server's count of verified steps and iterations per step, from its last line.
    pub server_verified: Option<(u32, u32)>,
    /// What this host's NIC qdisc did during a faulty step.
    pub qdisc: Option<QdiscStats>,
    /// rxe counters that changed during the step.
    pub rxe_counters: BTreeMap<String, u64>,
    /// Frames this host's NIC sent and received during the step.
    pub nic_frames: NicFrames,
    pub seconds: f64,
}

/// Everything one host reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostReport {
    pub host: Host,
    pub steps: Vec<StepRecord>,
    /// Debian's perftest across the link, when it ran.
    #[serde(default)]
    pub perftest: Vec<perftest_across::PerftestRecord>,
    /// The RNR runs, when they ran.
    #[serde(default)]
    pub rnr: Vec<rnr::RnrRecord>,
    /// The link failure under traffic and the reconnect, when it ran.
    pub link_failure: Option<link_failure::LinkFailureRecord>,
    /// Host A's backend killed under traffic and started again, when it ran.
    pub backend_restart: Option<backend_restart::BackendRestartRecord>,
}

/// What a run does after its steps.
#[derive(Debug, Clone, Copy)]
pub struct Phases<'a> {
    /// The drop-in's directory: perftest and `ibv_asyncwatch` over vrdma.
    pub library_dir: &'a Path,
    /// The perftest cases to run across the link in every pairing (none: no perftest).
    pub perftest: &'a [Case],
    /// The RNR runs.
    pub rnr: bool,
    /// The failures: the link, then host A's backend.
    pub failures: bool,
}

/// Runs `host`'s half of every step, in order, then the `phases`: perftest, RNR, failures.
pub fn run(
    host: Host,
    binaries: &Binaries,
    steps: &[Step],
    phases: &Phases<'_>,
) -> Result<HostReport> {
    let idle = resource_counts(DEVICE)?;
    let backend = Backend::start(&binaries.backend, "vrdma-backend", &["--allow-ud"], "info")?;
    let mut records = Vec::new();
    for (index, step) in steps.iter().enumerate() {
        let port = FIRST_PORT + index as u16;
        println!("== host {}: {} (port {port})", host.name(), step.label);
        records.push(run_step(host, binaries, &backend, step, port)?);
    }
    link::set_fault(None)?;
    let mut port = FIRST_PORT + steps.len() as u16;
    let perftest = perftest_across::run(host, &backend, phases.library_dir, phases.perftest, port)?;
    port += perftest_across::ports(phases.perftest);
    let rnr = if phases.rnr {
        rnr::run(host, binaries, &backend, port)?
    } else {
        Vec::new()
    };
    port += rnr::PORTS;
    let (mut link_failure, mut backend_restart) = (None, None);
    let mut backend = backend;
    if phases.failures {
        let library_dir = phases.library_dir;
        println!("== host {}: link failure (ports {port}..)", host.name());
        link_failure = Some(link_failure::run(
            host,
            binaries,
            &backend,
            library_dir,
            port,
        )?);
        let port = port + link_failure::PORTS;
        println!("== host {}: backend restart (ports {port}..)", host.name());
        let (restarted, record) =
            backend_restart::run(host, binaries, backend, library_dir, port, idle)?;
        backend = restarted;
        backend_restart = Some(record);
    }
    drop(backend);
    if let Err(last) = wait_for_counts(DEVICE, idle, Duration::from_secs(30)) {
        return Err(Error::Scenario(format!(
            "after the backend exited {DEVICE} holds {last:?}, idle was {idle:?}"
        )));
    }
    Ok(HostReport {
        host,
        steps: records,
        perftest,
        rnr,
        link_failure,
        backend_restart,
    })
}

fn run_step(
    host: Host,
    binaries: &Binaries,
    backend: &Backend,
    step: &Step,
    port: u16,
) -> Result<StepRecord> {
    let (role, which) = step
        .role_of(host)
        .ok_or_else(|| Error::Scenario(format!("host {} has no part in {step:?}", host.name())))?;
    link::set_fault(step.netem)?;
    let counters_before = link::rxe_counters()?;
    let frames_before = NicFrames::read()?;
    let started = Instant::now();
    let plan = Plan {
        ops: step.ops,
        sizes: step.sizes,
        iters: step.iters,
        bw: step.bw,
        oneway: false,
        timeout_s: PEER_TIMEOUT_S,
        tool_args: step.tool_args,
    };
    // The tools bound every wait on the peer (connecting, accepting, each completion) by
    // pingpong_command's timeout, which covers a peer VM still booting at the first step.
    let json = std::env::temp_dir().join(format!("two-hosts-{port}.json"));
    let mut cmd = across_link(host, binaries, backend, (role, which), port, &plan, &json);
    let name = format!("two-hosts-{port}-{role}");
    let mut proc = Proc::spawn(&name, &mut cmd)?;
    if let Err(e) = proc.wait_success(Duration::from_secs(900)) {
        // What rxe did and said, for the failure's report.
        let counters = link::counter_deltas(&counters_before, &link::rxe_counters()?);
        let kernel = crate::host::run_checked(std::process::Command::new("dmesg").arg("-t"))
            .map(|out| crate::error::tail(&String::from_utf8_lossy(&out.stdout), 20))
            .unwrap_or_default();
        return Err(Error::Scenario(format!(
            "{e}\nrxe counters during the step: {counters:?}\nkernel log:\n{kernel}"
        )));
    }
    let seconds = started.elapsed().as_secs_f64();
    let qdisc = match step.netem {
        Some(_) => Some(link::qdisc_stats()?),
        None => None,
    };
    let rxe_counters = link::counter_deltas(&counters_before, &link::rxe_counters()?);
    let nic_frames = NicFrames::read()?.since(frames_before);
    let (rows, server_verified) = match role {
        "client" => (read_report(&json)?, None),
        _ => (Vec::new(), Some(server_verified(&proc.output())?)),
    };
    Ok(StepRecord {
        label: step.label.into(),
        role: role.into(),
        implementation: which.name().into(),
        netem: step.netem.map(Into::into),
        rows,
        server_verified,
        qdisc,
        rxe_counters,
        nic_frames,
        seconds,
    })
}

/// `host`'s ping-pong peer `which` in `role` on `port` with `plan`, across the link: a server
/// listens on its own address, a client connects to the peer's and writes its report to
/// `json` (removed first).
pub(crate) fn across_link(
    host: Host,
    binaries: &Binaries,
    backend: &Backend,
    (role, which): (&str, Impl),
    port: u16,
    plan: &Plan<'_>,
    json: &Path,
) -> std::process::Command {
    let address = match role {
        "server" => host.scoped_address(),
        _ => host.peer().scoped_address(),
    };
    let mut cmd = pingpong_command(binaries, backend, which, role, port, plan, Some(&address));
    if role == "client" {
        let _ = std::fs::remove_file(json);
        cmd.arg("--json").arg(json);
    }
    cmd
}

/// The server's "server: N steps of M iterations verified" (vrdma-pingpong and the native
/// peer print the same line).
pub(crate) fn server_verified(output: &str) -> Result<(u32, u32)> {
    output
        .lines()
        .find_map(|line| {
            let rest = line.strip_prefix("server: ")?;
            let (steps, rest) = rest.split_once(" steps of ")?;
            let iters = rest.strip_suffix(" iterations verified")?;
            Some((steps.parse().ok()?, iters.parse().ok()?))
        })
        .ok_or_else(|| Error::Scenario(format!("no verification line from the server:\n{output}")))
}

/// The two hosts' reports of one run, step by step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Results {
    pub a: HostReport,
    pub b: HostReport,
}

impl Results {
    /// Host `host`'s record of step `label`.
    pub fn record(&self, host: Host, label: &str) -> Option<&StepRecord> {
        let report = match host {
            Host::A => &self.a,
            Host::B => &self.b,
        };
        report.steps.iter().find(|s| s.label == label)
    }
}

/// A table of the run: per step, who ran what, what both ends verified, what crossed the
/// link and what the link and rxe did to it.
pub fn render(results: &Results) -> String {
    let mut out = String::new();
    for a in &results.a.steps {
        let Some(b) = results.record(Host::B, &a.label) else {
            continue;
        };
        let (client, server) = if a.role == "client" { (a, b) } else { (b, a) };
        let messages: u64 = client.rows.iter().map(|r| u64::from(r.iters)).sum();
        // A ping-pong (a row with a latency) moves each message both ways, a stream one way.
        let bytes: u64 = client
            .rows
            .iter()
            .map(|r| {
                let ways = if r.latency.is_some() { 2 } else { 1 };
                ways * u64::from(r.iters) * u64::from(r.size)
            })
            .sum();
        let sent = a.nic_frames.tx + b.nic_frames.tx;
        let dropped = [a, b]
            .iter()
            .filter_map(|r| r.qdisc)
            .map(|q| q.drops)
            .sum::<u64>();
        let counter = |name: &str| {
            a.rxe_counters.get(name).copied().unwrap_or(0)
                + b.rxe_counters.get(name).copied().unwrap_or(0)
        };
        out.push_str(&format!(
            "{:<40} {:>6} -> {:<6} {messages:>4} msgs {:>9} B verified (server: {:?}); \
             {sent:>6} frames, {dropped:>5} dropped ({:.1} %); rxe: seq_err {}, dup_req {}, \
             retry {} ({:.1} s)\n",
            a.label,
            client.implementation,
            server.implementation,
            bytes,
            server.server_verified,
            100.0 * dropped as f64 / (sent + dropped).max(1) as f64,
            counter("rcvd_seq_err"),
            counter("duplicate_request"),
            counter("completer_retry_err"),
            a.seconds.max(b.seconds),
        ));
    }
    let perftest: Vec<_> = [&results.a.perftest, &results.b.perftest]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    out.push_str(&perftest_across::render(&perftest));
    for a in &results.a.rnr {
        let Some(b) = results.b.rnr.iter().find(|b| b.label == a.label) else {
            continue;
        };
        let counter = |name: &str| {
            [a, b]
                .iter()
                .map(|r| r.rxe_counters.get(name).copied().unwrap_or(0))
                .sum::<u64>()
        };
        let (client, server) = if a.role == "client" { (a, b) } else { (b, a) };
        out.push_str(&format!(
            "RNR: {:<46} client {} rows, error {:?}; server verified {:?}, error {:?}; RNR NAKs \
             sent {}, received {}, retries exceeded {}; receives held {:.3} s\n",
            a.label,
            client.rows.len(),
            client.error,
            server.server_verified,
            server.error,
            counter(rnr::SENT_RNR_NAKS),
            counter(rnr::RECEIVED_RNR_NAKS),
            counter(rnr::RNR_RETRIES_EXCEEDED),
            server.seconds_held.unwrap_or(0.0),
        ));
    }
    if let (Some(a), Some(b)) = (&results.a.link_failure, &results.b.link_failure) {
        out.push_str(&format!(
            "link failure: host A's NIC down under traffic; vrdma client ended after {:.1} s: \
             {:?}; native server on B: {:?}; async events over vrdma: {:?}; reconnected: {} \
             verified rows (server: {:?}); wire cut: vrdma client ended after {:.1} s: {:?}; \
             native server on B: {:?}\n",
            a.seconds_to_error.unwrap_or(f64::NAN),
            a.interrupted_error,
            b.interrupted_error,
            a.async_events,
            a.reconnect_rows.len(),
            b.reconnect_server_verified,
            a.wire_cut_seconds_to_error.unwrap_or(f64::NAN),
            a.wire_cut_error,
            b.wire_cut_error,
        ));
    }
    if let (Some(a), Some(b)) = (&results.a.backend_restart, &results.b.backend_restart) {
        out.push_str(&format!(
            "backend restart: host A's vrdma-backend SIGKILLed under traffic; vrdma client \
             ended after {:.1} s: {:?}; native server on B: {:?}; async events over vrdma: \
             {:?}; rxe back to its idle counts {:.1} s after the kill; new backend: {} verified \
             rows (server: {:?})\n",
            a.seconds_to_error.unwrap_or(f64::NAN),
            a.interrupted_error,
            b.interrupted_error,
            a.async_events,
            a.seconds_to_release.unwrap_or(f64::NAN),
            a.reconnect_rows.len(),
            b.reconnect_server_verified,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_verification_line_is_read() {
        let output = "listening\nserver: 15 steps of 20 iterations verified\n";
        assert_eq!(server_verified(output).unwrap(), (15, 20));
        assert!(server_verified("server: crashed\n").is_err());
    }
}

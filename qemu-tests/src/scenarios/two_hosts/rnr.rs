//! Receiver not ready across the link: a server that has posted no receive answers its peer's
//! sends with RNR NAKs, and the sender retries as its QP's `rnr_retry` says.
//!
//! Three runs, vrdma on host A each time:
//! - host B's native server holds its receives (the tools' `--receives-after`) until B's rxe
//!   has sent [`NAKS_BEFORE_RELEASE`] RNR NAKs; A's vrdma client, `rnr_retry` 7 (for ever),
//!   keeps retrying and then completes a verified exchange;
//! - the same with the roles turned: A's vrdma server holds its receives, A's rxe NAKs B's
//!   native client; the vrdma QP's receive queue, filled late by the guest, then takes every
//!   message;
//! - A's vrdma client with `rnr_retry` [`EXHAUSTED_RNR_RETRY`] against a server on B that
//!   never posts: the client must fail with an RNR-retry-exceeded completion after exactly
//!   `rnr_retry + 1` NAKs. rxe counts a NAK only while the QP still waits for that send and
//!   takes one retry off for each, whatever made it send again (the RNR timer or its
//!   transport timer), so the number is the QP's count, not a matter of timing.
//!
//! A holding server waits for its own host's rxe counter, never for time, so the runs do not
//! depend on how fast either VM is.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::link;
use super::server_verified;
use crate::error::{Error, Result};
use crate::inside::Proc;
use crate::scenarios::backend::Backend;
use crate::scenarios::binaries::Binaries;
use crate::scenarios::pingpong_peer::{read_report, Impl, PingpongRow, Plan, PEER_TIMEOUT_S};
use crate::vm_link::Host;

/// RNR NAKs a holding server's host sends before the server posts its receives.
pub const NAKS_BEFORE_RELEASE: u64 = 3;

/// The `rnr_retry` of the client that must give up.
pub const EXHAUSTED_RNR_RETRY: u64 = 2;

/// The RNR timer a holding server asks for (14: 1.28 ms).
const MIN_RNR_TIMER: &str = "14";

/// rxe's counters: RNR NAKs sent by the responder, RNR NAKs received by the requester, sends
/// failed for RNR retries exceeded.
pub const SENT_RNR_NAKS: &str = "send_rnr_err";
pub const RECEIVED_RNR_NAKS: &str = "rcvd_rnr_err";
pub const RNR_RETRIES_EXCEEDED: &str = "retry_rnr_exceeded_err";

/// One run.
#[derive(Debug, Clone, Copy)]
pub struct RnrRun {
    pub label: &'static str,
    pub server: (Host, Impl),
    pub client: (Host, Impl),
    /// The client's `--rnr-retry`.
    pub rnr_retry: u64,
    /// Whether the server ever posts its receives (else the client must give up).
    pub released: bool,
}

pub const RUNS: &[RnrRun] = &[
    RnrRun {
        label: "vrdma-a-over-native-b, receives held on b",
        server: (Host::B, Impl::Native),
        client: (Host::A, Impl::Vrdma),
        rnr_retry: 7,
        released: true,
    },
    RnrRun {
        label: "native-b-over-vrdma-a, receives held on a",
        server: (Host::A, Impl::Vrdma),
        client: (Host::B, Impl::Native),
        rnr_retry: 7,
        released: true,
    },
    RnrRun {
        label: "vrdma-a-over-native-b, RNR retries exhausted",
        server: (Host::B, Impl::Native),
        client: (Host::A, Impl::Vrdma),
        rnr_retry: EXHAUSTED_RNR_RETRY,
        released: false,
    },
];

/// The exchange of a released run: every receive-consuming operation, one packet and several.
const PLAN: Plan<'static> = Plan {
    ops: "send,send_imm,write_imm",
    sizes: "1,4096",
    iters: 5,
    bw: false,
    oneway: false,
    timeout_s: PEER_TIMEOUT_S,
    tool_args: &[],
};

/// Rows of a released run's client.
pub const PLAN_ROWS: usize = 6;

/// What one host saw in one run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RnrRecord {
    pub label: String,
    pub role: String,
    pub implementation: String,
    /// A released run's client rows.
    pub rows: Vec<PingpongRow>,
    /// A released run's server: verified steps and iterations.
    pub server_verified: Option<(u32, u32)>,
    /// The run that must fail: this side's last line.
    pub error: Option<String>,
    /// rxe counters that changed during the run.
    pub rxe_counters: BTreeMap<String, u64>,
    /// A holding server: seconds from `RUNNING` to releasing its receives.
    pub seconds_held: Option<f64>,
}

/// Ports the phase takes.
pub const PORTS: u16 = RUNS.len() as u16;

/// Runs `host`'s part of every run, from `port` on.
pub fn run(
    host: Host,
    binaries: &Binaries,
    backend: &Backend,
    port: u16,
) -> Result<Vec<RnrRecord>> {
    RUNS.iter()
        .enumerate()
        .map(|(index, run)| {
            let port = port + index as u16;
            println!("== host {}: RNR: {} (port {port})", host.name(), run.label);
            run_one(host, binaries, backend, run, port)
        })
        .collect()
}

fn run_one(
    host: Host,
    binaries: &Binaries,
    backend: &Backend,
    run: &RnrRun,
    port: u16,
) -> Result<RnrRecord> {
    let (role, which) = super::steps::role_of(host, run.server, run.client).ok_or_else(|| {
        Error::Scenario(format!("host {} has no part in {}", host.name(), run.label))
    })?;
    let release = std::env::temp_dir().join(format!("two-hosts-rnr-{port}-release"));
    let _ = std::fs::remove_file(&release);
    let rnr_retry = run.rnr_retry.to_string();
    let mut args: Vec<&str> = vec!["--rnr-retry", &rnr_retry];
    let release_arg = release.to_string_lossy().into_owned();
    if role == "server" {
        args.extend([
            "--min-rnr-timer",
            MIN_RNR_TIMER,
            "--receives-after",
            &release_arg,
        ]);
    }
    let plan = Plan {
        tool_args: &args,
        ..PLAN
    };
    let json = std::env::temp_dir().join(format!("two-hosts-rnr-{port}.json"));
    let mut cmd = super::across_link(host, binaries, backend, (role, which), port, &plan, &json);
    let before = link::rxe_counters()?;
    let mut proc = Proc::spawn(&format!("two-hosts-rnr-{port}-{role}"), &mut cmd)?;
    let seconds_held = if role == "server" && run.released {
        Some(hold_then_release(&mut proc, &before, release)?)
    } else {
        None
    };
    let timeout = Duration::from_secs(600);
    let mut record = RnrRecord {
        label: run.label.into(),
        role: role.into(),
        implementation: which.name().into(),
        rows: Vec::new(),
        server_verified: None,
        error: None,
        rxe_counters: BTreeMap::new(),
        seconds_held,
    };
    if run.released {
        proc.wait_success(timeout)?;
        match role {
            "client" => record.rows = read_report(&json)?,
            _ => record.server_verified = Some(server_verified(&proc.output())?),
        }
    } else {
        if proc.wait_success(timeout).is_ok() {
            return Err(proc.failure("finished although its peer never posted a receive"));
        }
        record.error = proc.output().lines().last().map(str::to_string);
    }
    record.rxe_counters = link::counter_deltas(&before, &link::rxe_counters()?);
    Ok(record)
}

/// A holding server: once it runs, waits until this host's rxe has sent
/// [`NAKS_BEFORE_RELEASE`] RNR NAKs, then lets it post its receives; returns how long it held.
fn hold_then_release(
    server: &mut Proc,
    before: &BTreeMap<String, u64>,
    release: PathBuf,
) -> Result<f64> {
    let timeout = Duration::from_secs(u64::from(PEER_TIMEOUT_S) * 2);
    server.wait_for_output("RUNNING", timeout)?;
    let held = Instant::now();
    let deadline = held + timeout;
    loop {
        let sent = link::counter_deltas(before, &link::rxe_counters()?)
            .get(SENT_RNR_NAKS)
            .copied()
            .unwrap_or(0);
        if sent >= NAKS_BEFORE_RELEASE {
            break;
        }
        if let Some(status) = server.try_wait()? {
            return Err(server.failure(&format!("exited ({status}) while holding its receives")));
        }
        if Instant::now() >= deadline {
            return Err(Error::Scenario(format!(
                "{sent} RNR NAKs sent within {timeout:?} of holding the receives, waiting for \
                 {NAKS_BEFORE_RELEASE}"
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let seconds = held.elapsed().as_secs_f64();
    std::fs::write(&release, b"")
        .map_err(|e| Error::Scenario(format!("creating {}: {e}", release.display())))?;
    server.wait_for_output("RECEIVES POSTED", timeout)?;
    Ok(seconds)
}

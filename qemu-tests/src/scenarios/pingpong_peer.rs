//! A ping-pong peer process (vrdma-pingpong or the native C peer) seen from a scenario: the rows
//! of its `--json` report, and waiting until a server listens for its out-of-band exchange.

use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::inside::DEVICE;
use crate::scenarios::backend::Backend;
use crate::scenarios::binaries::Binaries;

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
    /// Whether its sends started the host's processing from the process, a host kick
    /// (vrdma only).
    pub host_kick: Option<bool>,
    /// Host kicks the kernel refused during the step (vrdma only).
    pub kicks_refused: Option<u64>,
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

/// The peers' usual bound on every wait for each other, in seconds.
pub const PEER_TIMEOUT_S: u32 = 120;

/// One side of a pingpong run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Impl {
    Vrdma,
    Native,
}

impl Impl {
    /// Lower-case name, as reports spell it.
    pub fn name(self) -> &'static str {
        match self {
            Impl::Vrdma => "vrdma",
            Impl::Native => "native",
        }
    }
}

/// What to run: a plan both sides execute.
#[derive(Debug, Clone)]
pub struct Plan<'a> {
    pub ops: &'a str,
    pub sizes: &'a str,
    pub iters: u32,
    pub bw: bool,
    /// One way (bypass test): the client only sends; the vrdma server prints READY once its
    /// receives are posted and lets the client start only when the start file exists.
    pub oneway: bool,
    /// How long either peer waits for the other (connecting, accepting, each completion), in
    /// seconds; [`PEER_TIMEOUT_S`] unless a step expects its peer to vanish.
    pub timeout_s: u32,
    /// More options both tools take: RC path attributes (`--mtu`, `--qp-timeout`,
    /// `--retry-cnt`), the stream's `--window`.
    pub tool_args: &'a [&'a str],
}

/// How a vrdma-pingpong reaches the device.
#[derive(Debug, Clone, Copy)]
pub enum Access<'a> {
    /// As its own front-end of the backend listening at `socket`, as `user` (uid, gid;
    /// `None`: as the caller).
    Backend {
        socket: &'a Path,
        user: Option<(u32, u32)>,
    },
    /// Through the guest agent listening at `socket`, as the unprivileged `user`.
    Agent { socket: &'a Path, user: (u32, u32) },
}

/// The command line of a `which` peer in `role` (server or client) on `port` with `plan`; a
/// server listens on `host`, a client connects to it (the tools' default: 127.0.0.1).
pub fn pingpong_command(
    binaries: &Binaries,
    backend: &Backend,
    which: Impl,
    role: &str,
    port: u16,
    plan: &Plan<'_>,
    host: Option<&str>,
) -> Command {
    let mut cmd = match which {
        Impl::Vrdma => {
            let access = Access::Backend {
                socket: &backend.socket,
                user: None,
            };
            return vrdma_pingpong_command(binaries, access, role, port, plan, host);
        }
        Impl::Native => {
            let mut cmd = Command::new(&binaries.native_pingpong);
            cmd.arg(role).args(["--device", DEVICE]);
            cmd
        }
    };
    add_plan(&mut cmd, port, plan, host);
    cmd
}

/// The command line of a vrdma-pingpong in `role` that reaches the device by `access`.
pub fn vrdma_pingpong_command(
    binaries: &Binaries,
    access: Access<'_>,
    role: &str,
    port: u16,
    plan: &Plan<'_>,
    host: Option<&str>,
) -> Command {
    let (user, option, socket) = match access {
        Access::Backend { socket, user } => (user, "--socket", socket),
        Access::Agent { socket, user } => (Some(user), "--agent", socket),
    };
    let mut cmd = match user {
        None => Command::new(&binaries.pingpong),
        Some((uid, gid)) => crate::perftest::as_user(uid, gid, &binaries.pingpong),
    };
    cmd.arg(role)
        .arg(option)
        .arg(socket)
        .env_remove("VRDMA_SOCKET")
        .env_remove("VRDMA_AGENT");
    add_plan(&mut cmd, port, plan, host);
    cmd
}

/// The options both tools take for `plan` on `port` (and `host`).
fn add_plan(cmd: &mut Command, port: u16, plan: &Plan<'_>, host: Option<&str>) {
    cmd.args(["--port", &port.to_string()])
        .args(["--ops", plan.ops])
        .args(["--sizes", plan.sizes])
        .args(["--iters", &plan.iters.to_string()])
        .args(["--timeout", &plan.timeout_s.to_string()])
        .args(plan.tool_args);
    if let Some(host) = host {
        cmd.args(["--host", host]);
    }
    if plan.bw {
        cmd.arg("--bw");
    }
    if plan.oneway {
        cmd.arg("--oneway")
            .arg("--start-file")
            .arg(bypass_start_file());
    }
}

/// The file whose creation lets the one-way (bypass) client start.
pub fn bypass_start_file() -> std::path::PathBuf {
    std::env::temp_dir().join("vrdma-bypass-start")
}

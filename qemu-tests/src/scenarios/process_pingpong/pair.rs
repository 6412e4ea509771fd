//! A ping-pong pair for the process-pingpong steps: the command lines of a vrdma and a native
//! peer, a server and its client started in order, and one complete run returning the client's
//! rows.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::error::Result;
use crate::inside::{Proc, DEVICE};
use crate::scenarios::backend::Backend;
use crate::scenarios::binaries::Binaries;
use crate::scenarios::pingpong_peer::{read_report, PingpongRow};

/// One side of a pingpong run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Impl {
    Vrdma,
    Native,
}

/// What to run: a plan both sides execute.
#[derive(Debug, Clone)]
pub(super) struct Plan<'a> {
    pub(super) ops: &'a str,
    pub(super) sizes: &'a str,
    pub(super) iters: u32,
    pub(super) bw: bool,
    /// One way (bypass test): the client only sends; the vrdma server prints READY once its
    /// receives are posted and lets the client start only when the start file exists.
    pub(super) oneway: bool,
}

/// The command line of a `which` peer in `role` (server or client) on `port` with `plan`.
pub(super) fn pingpong_command(
    binaries: &Binaries,
    backend: &Backend,
    which: Impl,
    role: &str,
    port: u16,
    plan: &Plan<'_>,
) -> Command {
    let mut cmd = match which {
        Impl::Vrdma => {
            let mut cmd = Command::new(&binaries.pingpong);
            cmd.arg(role).arg("--socket").arg(&backend.socket);
            cmd
        }
        Impl::Native => {
            let mut cmd = Command::new(&binaries.native_pingpong);
            cmd.arg(role).args(["--device", DEVICE]);
            cmd
        }
    };
    cmd.args(["--port", &port.to_string()])
        .args(["--ops", plan.ops])
        .args(["--sizes", plan.sizes])
        .args(["--iters", &plan.iters.to_string()])
        .args(["--timeout", "120"]);
    if plan.bw {
        cmd.arg("--bw");
    }
    if plan.oneway {
        cmd.arg("--oneway")
            .arg("--start-file")
            .arg(bypass_start_file());
    }
    cmd
}

/// Starts a server of `server` and, once it listens, a client of `client`, both with `plan`;
/// the client gets `client_args` too.
pub(super) fn start_pair(
    binaries: &Binaries,
    backend: &Backend,
    (server, client): (Impl, Impl),
    plan: &Plan<'_>,
    port: u16,
    label: &str,
    client_args: &[&std::ffi::OsStr],
) -> Result<(Proc, Proc)> {
    let mut server_proc = Proc::spawn(
        &format!("{label}-server"),
        &mut pingpong_command(binaries, backend, server, "server", port, plan),
    )?;
    server_proc.wait_listening(port, Duration::from_secs(60))?;
    let mut client_cmd = pingpong_command(binaries, backend, client, "client", port, plan);
    client_cmd.args(client_args);
    let client_proc = Proc::spawn(&format!("{label}-client"), &mut client_cmd)?;
    Ok((server_proc, client_proc))
}

/// Runs a server of `server` and a client of `client` with `plan`; returns the client's rows.
pub(super) fn pingpong(
    binaries: &Binaries,
    backend: &Backend,
    pair: (Impl, Impl),
    plan: &Plan<'_>,
    port: u16,
    label: &str,
) -> Result<Vec<PingpongRow>> {
    let json = std::env::temp_dir().join(format!("pingpong-{label}.json"));
    let _ = std::fs::remove_file(&json);
    let (mut server_proc, mut client_proc) = start_pair(
        binaries,
        backend,
        pair,
        plan,
        port,
        label,
        &["--json".as_ref(), json.as_os_str()],
    )?;
    let timeout = Duration::from_secs(900);
    client_proc.wait_success(timeout)?;
    server_proc.wait_success(Duration::from_secs(60))?;
    read_report(&json)
}

/// The file whose creation lets the one-way (bypass) client start.
pub(super) fn bypass_start_file() -> PathBuf {
    std::env::temp_dir().join("vrdma-bypass-start")
}

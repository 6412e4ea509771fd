//! A ping-pong pair for the process-pingpong steps: the command lines of a vrdma and a native
//! peer, a server and its client started in order, and one complete run returning the client's
//! rows.

use std::time::Duration;

use crate::error::Result;
use crate::inside::Proc;
use crate::scenarios::backend::Backend;
use crate::scenarios::binaries::Binaries;
pub(super) use crate::scenarios::pingpong_peer::{bypass_start_file, Impl, Plan};
use crate::scenarios::pingpong_peer::{pingpong_command, read_report, PingpongRow};

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
        &mut pingpong_command(binaries, backend, server, "server", port, plan, None),
    )?;
    server_proc.wait_listening(port, Duration::from_secs(60))?;
    let mut client_cmd = pingpong_command(binaries, backend, client, "client", port, plan, None);
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

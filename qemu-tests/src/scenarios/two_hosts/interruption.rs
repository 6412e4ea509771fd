//! What the failure phases share: a stream interrupted by a failure on host A's side, its
//! native peer on host B left waiting, the verified exchanges around them, and rdma-core's
//! unmodified `ibv_asyncwatch` over vrdma watching host A's device.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::server_verified;
use super::steps::VERIFY_OPS;
use crate::error::Result;
use crate::inside::Proc;
use crate::scenarios::backend::Backend;
use crate::scenarios::binaries::Binaries;
use crate::scenarios::pingpong_peer::{
    pingpong_command, read_report, Impl, PingpongRow, Plan, PEER_TIMEOUT_S,
};
use crate::vm_link::Host;

/// How long the interrupted peers wait for each other (host A's client longer when its NIC
/// goes down, see `link_failure`): far below [`PEER_TIMEOUT_S`], which
/// bounds how long the reconnecting client tries to reach the new server, so that host B's
/// interrupted server has given up and the new one listens well before that.
const INTERRUPTED_TIMEOUT_S: u32 = 30;

/// The interrupted QPs' transport retries (with `--qp-timeout 14`, about 67 ms each).
pub const RETRY_CNT: &str = "3";

/// A stream with messages always outstanding, so that the client has sends in flight when
/// its side fails, and a retry budget rxe honours (it retries for ever at 7).
pub const INTERRUPTED: Plan<'static> = Plan {
    ops: "write,send",
    sizes: "4096",
    iters: 10_000_000,
    bw: true,
    oneway: false,
    timeout_s: INTERRUPTED_TIMEOUT_S,
    // Two messages in flight are enough to have one outstanding when the failure comes, and
    // keep the load on rxe low (a 16-deep stream of 64 KiB crashed the VM's rxe, see the
    // README).
    tool_args: &[
        "--qp-timeout",
        "14",
        "--retry-cnt",
        RETRY_CNT,
        "--window",
        "2",
    ],
};

/// Rows of [`RECONNECT`]: every RC operation at 1 B and 64 KiB.
pub const RECONNECT_ROWS: usize = 10;

/// The verified exchange before and after a failure.
pub const RECONNECT: Plan<'static> = Plan {
    ops: VERIFY_OPS,
    sizes: "1,65536",
    iters: 10,
    bw: false,
    oneway: false,
    timeout_s: PEER_TIMEOUT_S,
    tool_args: &[],
};

/// Host A: rdma-core's unmodified `ibv_asyncwatch` on vrdma through `backend`, once it
/// listens for events.
pub(super) fn async_watch(backend: &Backend, library_dir: &Path) -> Result<Proc> {
    let mut watch = Proc::spawn(
        "two-hosts-asyncwatch",
        Command::new("stdbuf")
            .args(["-oL", "ibv_asyncwatch", "-d", "vrdma0"])
            .env("VRDMA_SOCKET", &backend.socket)
            .env("LD_LIBRARY_PATH", library_dir),
    )?;
    watch.wait_for_output("async event FD", Duration::from_secs(60))?;
    Ok(watch)
}

/// The events `watch` printed, in order.
pub(super) fn async_events(watch: &Proc) -> Vec<String> {
    watch
        .output()
        .lines()
        .filter(|line| line.contains("event_type"))
        .map(str::to_string)
        .collect()
}

/// Host A: a vrdma client of `long` on `port` against host B, interrupted by `fail` once its
/// traffic runs; returns its error line and the seconds from `fail` to its end.
pub(super) fn interrupted_client(
    binaries: &Binaries,
    backend: &Backend,
    port: u16,
    long: &Plan<'_>,
    fail: impl FnOnce() -> Result<()>,
) -> Result<(String, f64)> {
    let mut client = vrdma_client_a(binaries, backend, port, long, "interrupted", None)?;
    client.wait_for_output("RUNNING", Duration::from_secs(u64::from(PEER_TIMEOUT_S)))?;
    fail()?;
    let failed = Instant::now();
    if wait_exit(&mut client, long.timeout_s)? {
        return Err(client.failure("finished although its link failed"));
    }
    Ok((last_line(&client.output()), failed.elapsed().as_secs_f64()))
}

/// Host B: a native server of `long` on `port` whose peer becomes unreachable; returns its
/// error line. It ends within its timeout (after the accept, which may wait as long again
/// for host A to get there).
pub(super) fn interrupted_server(
    binaries: &Binaries,
    backend: &Backend,
    port: u16,
    long: &Plan<'_>,
) -> Result<String> {
    let mut server = native_server_b(binaries, backend, port, long, "interrupted")?;
    if wait_exit(&mut server, 2 * INTERRUPTED_TIMEOUT_S + PEER_TIMEOUT_S)? {
        return Err(server.failure("finished although its peer became unreachable"));
    }
    Ok(last_line(&server.output()))
}

/// What one end of a verified exchange reports: the client's rows (the server has none), the
/// server's verified counts (the client has none).
type Exchanged = (Vec<PingpongRow>, Option<(u32, u32)>);

/// One verified ping-pong of `plan` between a vrdma client on A and a native server on B;
/// returns the client's rows (on A) or the server's verified counts (on B).
pub(super) fn exchange(
    host: Host,
    binaries: &Binaries,
    backend: &Backend,
    port: u16,
    plan: &Plan<'_>,
    what: &str,
) -> Result<Exchanged> {
    match host {
        Host::A => {
            let json = std::env::temp_dir().join(format!("two-hosts-{what}.json"));
            let _ = std::fs::remove_file(&json);
            let mut client = vrdma_client_a(binaries, backend, port, plan, what, Some(&json))?;
            client.wait_success(Duration::from_secs(600))?;
            Ok((read_report(&json)?, None))
        }
        Host::B => {
            let mut server = native_server_b(binaries, backend, port, plan, what)?;
            server.wait_success(Duration::from_secs(600))?;
            Ok((Vec::new(), Some(server_verified(&server.output())?)))
        }
    }
}

/// Host A: a vrdma client of `plan` on `port` towards host B, named after `what`, with its
/// report going to `json`.
fn vrdma_client_a(
    binaries: &Binaries,
    backend: &Backend,
    port: u16,
    plan: &Plan<'_>,
    what: &str,
    json: Option<&Path>,
) -> Result<Proc> {
    let peer = Host::B.scoped_address();
    let mut cmd = pingpong_command(
        binaries,
        backend,
        Impl::Vrdma,
        "client",
        port,
        plan,
        Some(&peer),
    );
    if let Some(json) = json {
        cmd.arg("--json").arg(json);
    }
    Proc::spawn(&format!("two-hosts-{what}-client-{port}"), &mut cmd)
}

/// Host B: a native server of `plan` on `port`, named after `what`.
fn native_server_b(
    binaries: &Binaries,
    backend: &Backend,
    port: u16,
    plan: &Plan<'_>,
    what: &str,
) -> Result<Proc> {
    let own = Host::B.scoped_address();
    Proc::spawn(
        &format!("two-hosts-{what}-server-{port}"),
        &mut pingpong_command(
            binaries,
            backend,
            Impl::Native,
            "server",
            port,
            plan,
            Some(&own),
        ),
    )
}

/// Waits for `proc` to exit within `timeout_s` seconds plus a margin for its own clean-up;
/// returns whether it succeeded.
fn wait_exit(proc: &mut Proc, timeout_s: u32) -> Result<bool> {
    let deadline = Instant::now() + Duration::from_secs(u64::from(timeout_s) + 60);
    loop {
        if let Some(status) = proc.try_wait()? {
            return Ok(status.success());
        }
        if Instant::now() >= deadline {
            proc.kill();
            return Err(proc.failure("did not end although its peer became unreachable"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn last_line(output: &str) -> String {
    output.lines().last().unwrap_or_default().to_string()
}

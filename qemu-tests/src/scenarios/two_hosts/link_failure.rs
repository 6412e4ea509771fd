//! The link fails under live traffic, longer than the retry budget, and comes back.
//!
//! Host A takes its NIC down while its vrdma client exchanges messages with a native server on
//! host B. Expected, and checked by the suite: the vrdma client ends with an error completion
//! (its QP in error), rdma-core's unmodified `ibv_asyncwatch` over vrdma on host A reports
//! `IBV_EVENT_PORT_ERR`, the native server on B ends with an error too (bounded by its
//! timeout), and once the NIC is back (`IBV_EVENT_PORT_ACTIVE`) a new vrdma client connects
//! to a new server on B and passes a verified ping-pong.
//!
//! Then the wire fails while both NICs stay up: everything host A sends is lost (`tc netem
//! loss 100%` on its egress). The vrdma client's QP exhausts its retry budget (the ping-pong
//! tools set `timeout` 14, about 67 ms, and `retry_cnt` 7) and ends with a retry-exceeded
//! completion: how long that took is the time to detect a dead link.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::steps::VERIFY_OPS;
use super::{link, server_verified};
use crate::error::Result;
use crate::inside::Proc;
use crate::scenarios::backend::Backend;
use crate::scenarios::binaries::Binaries;
use crate::scenarios::pingpong_peer::{
    pingpong_command, read_report, Impl, PingpongRow, Plan, PEER_TIMEOUT_S,
};
use crate::vm_link::Host;

/// How long the interrupted peers wait for each other: far below [`PEER_TIMEOUT_S`], which
/// bounds how long the reconnecting client tries to reach the new server, so that host B's
/// interrupted server has given up and the new one listens well before that.
const INTERRUPTED_TIMEOUT_S: u32 = 30;

/// The interrupted QPs' transport retries (with `--qp-timeout 14`, about 67 ms each).
pub const RETRY_CNT: &str = "3";

/// Rows of the reconnect's verified ping-pong: every RC operation at 1 B and 64 KiB.
pub const RECONNECT_ROWS: usize = 10;

/// What one host saw.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LinkFailureRecord {
    /// The last line of the interrupted peer (its error).
    pub interrupted_error: String,
    /// Host A: seconds from the NIC going down to the vrdma client's error.
    pub seconds_to_error: Option<f64>,
    /// Host A: the async events `ibv_asyncwatch` printed over vrdma, in order.
    pub async_events: Vec<String>,
    /// Host A: the reconnected client's verified rows.
    pub reconnect_rows: Vec<PingpongRow>,
    /// Host B: what the reconnect's server verified.
    pub reconnect_server_verified: Option<(u32, u32)>,
    /// The last line of the peer interrupted by the cut wire.
    pub wire_cut_error: String,
    /// Host A: seconds from the wire failing to the vrdma client's error.
    pub wire_cut_seconds_to_error: Option<f64>,
}

/// Runs `host`'s part with its ping-pongs on `port` to `port + 3`.
pub fn run(
    host: Host,
    binaries: &Binaries,
    backend: &Backend,
    library_dir: &Path,
    port: u16,
) -> Result<LinkFailureRecord> {
    // A stream with messages always outstanding, so that the client has sends in flight
    // when the link fails; a retry budget rxe honours (it retries for ever at 7).
    let long = Plan {
        ops: "write,send",
        sizes: "4096",
        iters: 10_000_000,
        bw: true,
        oneway: false,
        timeout_s: INTERRUPTED_TIMEOUT_S,
        path_args: &["--qp-timeout", "14", "--retry-cnt", RETRY_CNT],
    };
    let reconnect = Plan {
        ops: VERIFY_OPS,
        sizes: "1,65536",
        iters: 10,
        bw: false,
        oneway: false,
        timeout_s: PEER_TIMEOUT_S,
        path_args: &[],
    };
    // A verified exchange first, with the usual patience: both hosts start the failure phase
    // together, whatever came before (a VM that booted late), and the link works.
    exchange(host, binaries, backend, port, &reconnect, "barrier")?;
    let port = port + 1;
    match host {
        Host::A => run_a(binaries, backend, library_dir, port, &long, &reconnect),
        Host::B => run_b(binaries, backend, port, &long, &reconnect),
    }
}

fn run_a(
    binaries: &Binaries,
    backend: &Backend,
    library_dir: &Path,
    port: u16,
    long: &Plan<'_>,
    reconnect: &Plan<'_>,
) -> Result<LinkFailureRecord> {
    let mut watch = Proc::spawn(
        "two-hosts-asyncwatch",
        Command::new("stdbuf")
            .args(["-oL", "ibv_asyncwatch", "-d", "vrdma0"])
            .env("VRDMA_SOCKET", &backend.socket)
            .env("LD_LIBRARY_PATH", library_dir),
    )?;
    watch.wait_for_output("async event FD", Duration::from_secs(60))?;
    let (interrupted_error, seconds_to_error) = interrupt_a(binaries, backend, port, long, || {
        link::set_link(false, Host::A)
    })?;
    watch.wait_for_output("IBV_EVENT_PORT_ERR", Duration::from_secs(60))?;
    link::set_link(true, Host::A)?;
    link::wait_port_active(Duration::from_secs(60))?;
    watch.wait_for_output("IBV_EVENT_PORT_ACTIVE", Duration::from_secs(60))?;
    let (reconnect_rows, _) =
        exchange(Host::A, binaries, backend, port + 1, reconnect, "reconnect")?;

    // The qdisc goes on before the traffic starts; the cut only changes its loss rate.
    link::set_fault(Some("loss 0%"))?;
    let (wire_cut_error, wire_cut_seconds) =
        interrupt_a(binaries, backend, port + 2, long, || {
            link::change_fault("loss 100%")
        })?;
    link::set_fault(None)?;
    let async_events = watch
        .output()
        .lines()
        .filter(|line| line.contains("event_type"))
        .map(str::to_string)
        .collect();
    watch.kill();
    Ok(LinkFailureRecord {
        interrupted_error,
        seconds_to_error: Some(seconds_to_error),
        async_events,
        reconnect_rows,
        reconnect_server_verified: None,
        wire_cut_error,
        wire_cut_seconds_to_error: Some(wire_cut_seconds),
    })
}

fn run_b(
    binaries: &Binaries,
    backend: &Backend,
    port: u16,
    long: &Plan<'_>,
    reconnect: &Plan<'_>,
) -> Result<LinkFailureRecord> {
    let interrupted_error = interrupt_b(binaries, backend, port, long)?;
    let (_, reconnect_server_verified) =
        exchange(Host::B, binaries, backend, port + 1, reconnect, "reconnect")?;
    let wire_cut_error = interrupt_b(binaries, backend, port + 2, long)?;
    Ok(LinkFailureRecord {
        interrupted_error,
        reconnect_server_verified,
        wire_cut_error,
        ..LinkFailureRecord::default()
    })
}

/// Host A: a vrdma client of `long` on `port` against host B, interrupted by `fail` once its
/// traffic runs; returns its error line and the seconds from `fail` to its end.
fn interrupt_a(
    binaries: &Binaries,
    backend: &Backend,
    port: u16,
    long: &Plan<'_>,
    fail: impl FnOnce() -> Result<()>,
) -> Result<(String, f64)> {
    let peer = Host::B.scoped_address();
    let mut client = Proc::spawn(
        &format!("two-hosts-interrupted-client-{port}"),
        &mut pingpong_command(
            binaries,
            backend,
            Impl::Vrdma,
            "client",
            port,
            long,
            Some(&peer),
        ),
    )?;
    client.wait_for_output("RUNNING", Duration::from_secs(u64::from(PEER_TIMEOUT_S)))?;
    fail()?;
    let failed = Instant::now();
    if wait_exit(&mut client, INTERRUPTED_TIMEOUT_S)? {
        return Err(client.failure("finished although its link failed"));
    }
    Ok((last_line(&client.output()), failed.elapsed().as_secs_f64()))
}

/// Host B: a native server of `long` on `port` whose peer becomes unreachable; returns its
/// error line. It ends within its timeout (after the accept, which may wait as long again
/// for host A to get there).
fn interrupt_b(
    binaries: &Binaries,
    backend: &Backend,
    port: u16,
    long: &Plan<'_>,
) -> Result<String> {
    let own = Host::B.scoped_address();
    let mut server = Proc::spawn(
        &format!("two-hosts-interrupted-server-{port}"),
        &mut pingpong_command(
            binaries,
            backend,
            Impl::Native,
            "server",
            port,
            long,
            Some(&own),
        ),
    )?;
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
fn exchange(
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
            let peer = Host::B.scoped_address();
            let mut client = Proc::spawn(
                &format!("two-hosts-{what}-client"),
                pingpong_command(
                    binaries,
                    backend,
                    Impl::Vrdma,
                    "client",
                    port,
                    plan,
                    Some(&peer),
                )
                .arg("--json")
                .arg(&json),
            )?;
            client.wait_success(Duration::from_secs(600))?;
            Ok((read_report(&json)?, None))
        }
        Host::B => {
            let own = Host::B.scoped_address();
            let mut server = Proc::spawn(
                &format!("two-hosts-{what}-server"),
                &mut pingpong_command(
                    binaries,
                    backend,
                    Impl::Native,
                    "server",
                    port,
                    plan,
                    Some(&own),
                ),
            )?;
            server.wait_success(Duration::from_secs(600))?;
            Ok((Vec::new(), Some(server_verified(&server.output())?)))
        }
    }
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

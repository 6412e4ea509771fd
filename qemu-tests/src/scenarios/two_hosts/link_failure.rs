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
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::interruption::{
    async_events, async_watch, exchange, interrupted_client, interrupted_server, INTERRUPTED,
    RECONNECT,
};
use super::link;
use crate::error::Result;
use crate::scenarios::backend::Backend;
use crate::scenarios::binaries::Binaries;
use crate::scenarios::pingpong_peer::{PingpongRow, Plan};
use crate::vm_link::Host;

/// How long the vrdma client whose NIC goes down waits for its completions (see `run_a`).
const NIC_DOWN_TIMEOUT_S: u32 = 90;

/// Ping-pong ports the phase takes, from the one it is given.
pub const PORTS: u16 = 4;

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
    let (long, reconnect) = (&INTERRUPTED, &RECONNECT);
    // A verified exchange first, with the usual patience: both hosts start the failure phase
    // together, whatever came before (a VM that booted late), and the link works.
    exchange(host, binaries, backend, port, reconnect, "barrier")?;
    let port = port + 1;
    match host {
        Host::A => run_a(binaries, backend, library_dir, port, long, reconnect),
        Host::B => run_b(binaries, backend, port, long, reconnect),
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
    let mut watch = async_watch(backend, library_dir)?;
    // rxe failed the QP 0.1 s after the NIC went down in most runs, but once only after 30 s
    // (its send kept being retried; the kernel's IPv6 route garbage collection runs every 30 s
    // and would end a cached route then, an explanation not verified): give the client room
    // to see the error completion rather than its own timeout.
    let nic_down = Plan {
        timeout_s: NIC_DOWN_TIMEOUT_S,
        ..long.clone()
    };
    let (interrupted_error, seconds_to_error) =
        interrupted_client(binaries, backend, port, &nic_down, || {
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
        interrupted_client(binaries, backend, port + 2, long, || {
            link::change_fault("loss 100%")
        })?;
    link::set_fault(None)?;
    let async_events = async_events(&watch);
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
    let interrupted_error = interrupted_server(binaries, backend, port, long)?;
    let (_, reconnect_server_verified) =
        exchange(Host::B, binaries, backend, port + 1, reconnect, "reconnect")?;
    let wire_cut_error = interrupted_server(binaries, backend, port + 2, long)?;
    Ok(LinkFailureRecord {
        interrupted_error,
        reconnect_server_verified,
        wire_cut_error,
        ..LinkFailureRecord::default()
    })
}

//! Host A's vrdma-backend is SIGKILLed under traffic and started again on the same socket.
//!
//! Expected, and checked by the suite: host A's vrdma client ends with a clear error (its
//! device failed), rdma-core's unmodified `ibv_asyncwatch` over vrdma reports
//! `IBV_EVENT_DEVICE_FATAL`, the kernel releases every host object the backend held (rxe's
//! resource counts return to what they were before the backend started), the native server
//! on host B ends with an error within its bounded wait, and a new backend on the same socket
//! serves a new vrdma client that passes a verified ping-pong with host B.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::interruption::{
    async_events, async_watch, exchange, interrupted_client, interrupted_server, INTERRUPTED,
    RECONNECT,
};
use crate::error::{Error, Result};
use crate::inside::{wait_for_counts, ResourceCounts, DEVICE};
use crate::scenarios::backend::Backend;
use crate::scenarios::binaries::Binaries;
use crate::scenarios::pingpong_peer::PingpongRow;
use crate::vm_link::Host;

/// What one host saw.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BackendRestartRecord {
    /// The last line of the interrupted peer (its error).
    pub interrupted_error: String,
    /// Host A: seconds from the SIGKILL to the vrdma client's error.
    pub seconds_to_error: Option<f64>,
    /// Host A: the async events `ibv_asyncwatch` printed over vrdma, in order.
    pub async_events: Vec<String>,
    /// Host A: seconds from the SIGKILL until rxe held no more than before the backend
    /// started.
    pub seconds_to_release: Option<f64>,
    /// Host A: the verified rows of the client served by the new backend.
    pub reconnect_rows: Vec<PingpongRow>,
    /// Host B: what the reconnect's server verified.
    pub reconnect_server_verified: Option<(u32, u32)>,
}

/// Runs `host`'s part with its ping-pongs on `port` to `port + 2`. Host A kills `backend`
/// (started when rxe held `idle`) and returns the one it started in its place.
pub fn run(
    host: Host,
    binaries: &Binaries,
    backend: Backend,
    library_dir: &Path,
    port: u16,
    idle: ResourceCounts,
) -> Result<(Backend, BackendRestartRecord)> {
    exchange(
        host,
        binaries,
        &backend,
        port,
        &RECONNECT,
        "restart-barrier",
    )?;
    let port = port + 1;
    match host {
        Host::A => run_a(binaries, backend, library_dir, port, idle),
        Host::B => {
            let interrupted_error = interrupted_server(binaries, &backend, port, &INTERRUPTED)?;
            let (_, reconnect_server_verified) =
                exchange(host, binaries, &backend, port + 1, &RECONNECT, "restarted")?;
            let record = BackendRestartRecord {
                interrupted_error,
                reconnect_server_verified,
                ..BackendRestartRecord::default()
            };
            Ok((backend, record))
        }
    }
}

fn run_a(
    binaries: &Binaries,
    backend: Backend,
    library_dir: &Path,
    port: u16,
    idle: ResourceCounts,
) -> Result<(Backend, BackendRestartRecord)> {
    let watch = async_watch(&backend, library_dir)?;
    let (interrupted_error, seconds_to_error) =
        interrupted_client(binaries, &backend, port, &INTERRUPTED, || {
            backend.proc.signal("KILL")
        })?;
    let killed = Instant::now() - Duration::from_secs_f64(seconds_to_error);
    let mut watch = watch;
    watch.wait_for_output("IBV_EVENT_DEVICE_FATAL", Duration::from_secs(60))?;
    if let Err(held) = wait_for_counts(DEVICE, idle, Duration::from_secs(60)) {
        return Err(Error::Scenario(format!(
            "after the backend was killed {DEVICE} holds {held:?}, {idle:?} before it started"
        )));
    }
    let seconds_to_release = killed.elapsed().as_secs_f64();
    let async_events = async_events(&watch);
    watch.kill();
    drop(backend);
    let backend = Backend::start(&binaries.backend, "vrdma-backend", &["--allow-ud"], "info")?;
    let (reconnect_rows, _) = exchange(
        Host::A,
        binaries,
        &backend,
        port + 1,
        &RECONNECT,
        "restarted",
    )?;
    let record = BackendRestartRecord {
        interrupted_error,
        seconds_to_error: Some(seconds_to_error),
        async_events,
        seconds_to_release: Some(seconds_to_release),
        reconnect_rows,
        reconnect_server_verified: None,
    };
    Ok((backend, record))
}

//! Debian's unmodified perftest with `-R` (connections through rdma_cm, its out-of-band
//! exchange over the first connection's QP) on rxe0's IPv6 link-local address
//! (`--ipv6-addr`), in three pairings: a native client against a vrdma server, a vrdma client
//! against a native server, and both over vrdma (two sessions of one backend).
//!
//! perftest's `-R` setup has a race of its own: after the control connection, the server
//! answers the client's handshake and only then creates, binds and listens a new id for the
//! data connections, while the client connects at once. A native server wins it by
//! microseconds; a server whose listen takes a few control round trips lost it in up to half
//! the runs here (a vrdma server, debug build, TCG: ib_write_lat 3 of 6, ib_send_lat 4 of 6,
//! ib_read_bw 1 of 6, ib_send_bw 0 of 6), and the client then gets `RDMA_CM_EVENT_REJECTED`
//! with status 8 and perftest 25.01 crashes in its own retry (fixed upstream in 26.04). So
//! every client runs with [`CONNECT_AFTER_LISTEN`] preloaded, whose `rdma_connect` waits until
//! an id listens on the destination port (`rdma resource show cm_id`; both sides run on this
//! host) before it connects: perftest itself is unmodified, and the race is decided before
//! the connection, never by timing.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::backend::Backend;
use super::perftest_over_vrdma::CONNECT_AFTER_LISTEN;
use super::rdmacm_utils::{link_local_address, sessions_opened, wait_cm_listening};
use crate::error::{Error, Result};
use crate::inside::{Proc, DEVICE};
use crate::perftest::{read_row, Case, Measurement, Side, Tool};

/// The cases: sends, RDMA reads (the connection's responder resources at work) and a latency
/// tool.
pub const CASES: &[Case] = &[
    Case {
        tool: Tool::IbSendBw,
        size: 65536,
        iterations: 200,
    },
    Case {
        tool: Tool::IbReadBw,
        size: 65536,
        iterations: 200,
    },
    Case {
        tool: Tool::IbWriteLat,
        size: 64,
        iterations: 200,
    },
];

/// One case in one pairing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CmRun {
    pub tool: Tool,
    pub size: u64,
    pub iterations: u64,
    /// `native` or `vrdma`.
    pub server: String,
    pub client: String,
    pub measurement: Measurement,
    /// Sessions the backend opened during the last run (perftest opens the device itself
    /// beside librdmacm: up to two per vrdma side).
    pub backend_sessions: usize,
}

/// Runs every case in every pairing through a backend of its own.
pub fn run(backend_binary: &Path, library_dir: &Path) -> Result<Vec<CmRun>> {
    let address = link_local_address()?;
    let backend = Backend::start(backend_binary, "vrdma-perftest-rdma-cm", &[], "info")?;
    let native = Side::native(DEVICE);
    let vrdma = Side::over_dropin(&backend.socket, library_dir);
    let mut port = 18600;
    let mut runs = Vec::new();
    for case in CASES {
        for (server, client) in [(&vrdma, &native), (&native, &vrdma), (&vrdma, &vrdma)] {
            println!(
                "== {} -R -s {}: server {}, client {}",
                case.tool.command(),
                case.size,
                server.label,
                client.label
            );
            let before = sessions_opened(&backend.proc.output());
            port += 1;
            let measurement = run_once(case, server, client, &address, port, library_dir)?;
            if !measurement.completed() {
                return Err(Error::Scenario(format!(
                    "{} -R: implausible {measurement:?}",
                    case.tool.command()
                )));
            }
            runs.push(CmRun {
                tool: case.tool,
                size: case.size,
                iterations: u64::from(case.iterations),
                server: server.label.clone(),
                client: client.label.clone(),
                measurement,
                backend_sessions: sessions_opened(&backend.proc.output()) - before,
            });
        }
    }
    Ok(runs)
}

fn command(case: &Case, side: &Side, port: u16, server: Option<&str>) -> Command {
    let mut cmd = Command::new(case.tool.command());
    cmd.args(["-R", "--ipv6-addr", "-F"])
        .args(["-s", &case.size.to_string()])
        .args(["-n", &case.iterations.to_string()])
        .args(["-p", &port.to_string()])
        .env_remove("VRDMA_SOCKET")
        .envs(side.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    if let Some(server) = server {
        cmd.arg(server);
    }
    cmd
}

/// One run: the client's measurement.
fn run_once(
    case: &Case,
    server: &Side,
    client: &Side,
    address: &str,
    port: u16,
    library_dir: &Path,
) -> Result<Measurement> {
    let name = |role: &str| {
        format!(
            "{}-R-{}-{}-{role}",
            case.tool.command(),
            server.label,
            client.label
        )
    };
    let timeout = Duration::from_secs(180);
    let mut server_proc = Proc::spawn(&name("server"), &mut command(case, server, port, None))?;
    wait_cm_listening(&mut server_proc, port, Duration::from_secs(60))?;
    let mut client_cmd = command(case, client, port, Some(address));
    client_cmd.env("LD_PRELOAD", library_dir.join(CONNECT_AFTER_LISTEN));
    let mut client_proc = Proc::spawn(&name("client"), &mut client_cmd)?;
    client_proc.wait_success(timeout)?;
    server_proc.wait_success(timeout)?;
    Ok(read_row(case, &client.label, &client_proc.output())?.measurement)
}

/// A fixed-width table of the runs.
pub fn render_table(runs: &[CmRun]) -> String {
    super::pairing_table(
        34,
        runs.iter().map(|r| {
            (
                r.tool.command(),
                r.server.as_str(),
                r.client.as_str(),
                format!(
                    "{} {}",
                    r.measurement.headline_text(),
                    r.tool.headline_unit()
                ),
            )
        }),
    )
}

//! Debian's unmodified perftest with `-R` (connections through rdma_cm, its out-of-band
//! exchange over the first connection's QP) on rxe0's IPv6 link-local address
//! (`--ipv6-addr`), in three pairings: a native client against a vrdma server, a vrdma client
//! against a native server, and both over vrdma (two sessions of one backend).
//!
//! perftest's `-R` setup has a race of its own: after the control connection, the server
//! answers the client's handshake and only then creates, binds and listens a new id for the
//! data connections, while the client connects at once. A native server wins it by
//! microseconds; a server whose listen takes a few control round trips can lose it, and the
//! client then gets `RDMA_CM_EVENT_REJECTED` with status 8 (no listener on the port) — and
//! perftest 25.01's own retry of that connection crashes (fixed upstream in 26.04, which
//! retries 10 times 100 ms apart). The harness does what the fixed perftest does: a run that
//! failed with exactly that signature is run again, up to [`RACE_ATTEMPTS`] times, and the
//! number of runs is reported. Any other failure fails at once.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::backend::Backend;
use super::rdmacm_utils::{link_local_address, sessions_opened, wait_cm_listening};
use crate::error::{Error, Result};
use crate::inside::{Proc, DEVICE};
use crate::perftest::{parse, Case, Measurement, Side, Tool};

/// What perftest's client prints when its data connection found no listener.
pub const RACE_SIGNATURE: &str = "RDMA_CM_EVENT_REJECTED; error: 8";
/// Runs of one pairing when the client lost perftest's listen race.
pub const RACE_ATTEMPTS: u32 = 5;

/// The cases: sends, and RDMA reads (the connection's responder resources at work).
///
/// Not the latency tools: their clients set up so fast that a vrdma server (three control
/// round trips from handshake to listen, ~30 ms in this debug build under TCG) lost the race
/// half the time (ib_write_lat 3 of 6, ib_send_lat 4 of 6 runs; ib_send_bw 0 of 6, ib_read_bw
/// 1 of 6), which no bounded number of runs makes certain.
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
    /// Runs it took (more than one: the client lost perftest's listen race before).
    pub attempts: u32,
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
            let mut attempts = 0;
            let (measurement, before) = loop {
                attempts += 1;
                port += 1;
                let before = sessions_opened(&backend.proc.output());
                match run_once(case, server, client, &address, port)? {
                    Ok(measurement) => break (measurement, before),
                    Err(output) if attempts < RACE_ATTEMPTS => {
                        println!("   the client lost perftest's listen race, again: {output}");
                    }
                    Err(output) => {
                        return Err(Error::Scenario(format!(
                            "{} lost perftest's listen race {attempts} times: {output}",
                            client.label
                        )))
                    }
                }
            };
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
                attempts,
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

/// One run: `Ok(Ok(measurement))`, or `Ok(Err(client output))` when the client lost the
/// listen race ([`RACE_SIGNATURE`]); any other failure is an error.
fn run_once(
    case: &Case,
    server: &Side,
    client: &Side,
    address: &str,
    port: u16,
) -> Result<std::result::Result<Measurement, String>> {
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
    let mut client_proc = Proc::spawn(
        &name("client"),
        &mut command(case, client, port, Some(address)),
    )?;
    if let Err(e) = client_proc.wait_success(timeout) {
        let output = client_proc.output();
        if output.contains(RACE_SIGNATURE) {
            server_proc.kill();
            return Ok(Err(crate::error::tail(&output, 3)));
        }
        return Err(e);
    }
    server_proc.wait_success(timeout)?;
    let (_, _, measurement) = parse(case.tool, &client_proc.output())?;
    Ok(Ok(measurement))
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
                    "{:.2} {} ({} run{})",
                    r.measurement.headline(),
                    r.tool.headline_unit(),
                    r.attempts,
                    if r.attempts == 1 { "" } else { "s" }
                ),
            )
        }),
    )
}

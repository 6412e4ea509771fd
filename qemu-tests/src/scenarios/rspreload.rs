//! Unmodified TCP programs over rsockets: Debian's `librspreload.so` (package librdmacm1)
//! turns iperf's (2.x) TCP sockets into rsockets, natively (rdma-core's librdmacm) and over
//! vrdma's drop-in `librdmacm.so.1`, in four pairings on rxe0's IPv6 link-local address.
//!
//! `librspreload.so` falls back to plain TCP, silently, whenever an rsocket call fails, so a
//! run passes only when both sides report every byte (`-n 4M`: "4.00 MBytes") *and* rxe sent
//! at least a packet per MTU of it meanwhile (plain TCP over rxe's netdev never shows in
//! rxe's counters), and the backend opened one session per vrdma side. iperf does not check
//! the bytes' content; rstream `-T v` in [`super::rdmacm_utils`] does, over the same rsockets.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::backend::Backend;
use super::rdmacm_utils::{command, link_local_address, sessions_opened, wait_cm_listening};
use crate::error::{Error, Result};
use crate::inside::{rxe_counters, Proc, DEVICE};
use crate::perftest::Side;

/// rdma-core's preload library as Debian installs it.
pub const PRELOAD: &str = "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so";
/// What the client sends, as iperf's `-n` takes it and as both sides report it.
const AMOUNT: &str = "4M";
const REPORTED: &str = "4.00 MBytes";
/// Packets rxe sends at least for 4 MiB of RDMA writes (one per 4096-byte MTU, the largest).
const MIN_RXE_PACKETS: u64 = 4 * 1024 * 1024 / 4096;
const FIRST_PORT: u16 = 7950;

/// One iperf run in one pairing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreloadRun {
    /// `native` or `vrdma`.
    pub server: String,
    pub client: String,
    /// Each side's report line.
    pub server_report: String,
    pub client_report: String,
    /// Packets rxe sent during the run.
    pub rxe_packets: u64,
    /// Sessions the backend opened during the run (one per vrdma side).
    pub backend_sessions: usize,
}

fn preloaded(mut side: Side) -> Side {
    side.env.push(("LD_PRELOAD".into(), PRELOAD.into()));
    side
}

fn sent_packets() -> Result<u64> {
    rxe_counters()?
        .get("sent_pkts")
        .copied()
        .ok_or_else(|| Error::Scenario(format!("{DEVICE} has no sent_pkts counter")))
}

/// The line of `output` with iperf's transfer report.
fn report(output: &str) -> Option<String> {
    output
        .lines()
        .find(|l| l.contains(REPORTED))
        .map(|l| l.trim().to_string())
}

/// Runs iperf under `librspreload.so` in every pairing.
pub fn run(backend_binary: &Path, library_dir: &Path) -> Result<Vec<PreloadRun>> {
    if !Path::new(PRELOAD).exists() {
        return Err(Error::Scenario(format!("{PRELOAD} is missing")));
    }
    let address = link_local_address()?;
    let mut backend = Backend::start(backend_binary, "vrdma-rspreload-backend", &[], "info")?;
    let native = preloaded(Side::native(DEVICE));
    let vrdma = preloaded(Side::over_dropin(&backend.socket, library_dir));
    let pairings = [
        (&native, &native),
        (&vrdma, &native),
        (&native, &vrdma),
        (&vrdma, &vrdma),
    ];
    let mut runs = Vec::new();
    for (i, (server, client)) in pairings.into_iter().enumerate() {
        let port = FIRST_PORT + i as u16;
        println!(
            "== iperf under librspreload: server {}, client {}",
            server.label, client.label
        );
        let sessions_before = sessions_opened(&backend.proc.output());
        let packets_before = sent_packets()?;
        let name = |role: &str| format!("iperf-{}-{}-{role}", server.label, client.label);
        let port_arg = port.to_string();
        let server_args = ["-s", "-V", "-p", &port_arg].map(String::from);
        let mut server_proc =
            Proc::spawn(&name("server"), &mut command("iperf", server, &server_args))?;
        wait_cm_listening(&mut server_proc, port, Duration::from_secs(60))?;
        let client_args = ["-V", "-c", &address, "-p", &port_arg, "-n", AMOUNT].map(String::from);
        let mut client_proc =
            Proc::spawn(&name("client"), &mut command("iperf", client, &client_args))?;
        client_proc.wait_success(Duration::from_secs(120))?;
        // The server runs until stopped; its report follows the client's end.
        server_proc.wait_for_output(REPORTED, Duration::from_secs(60))?;
        server_proc.kill();
        let run = PreloadRun {
            server: server.label.clone(),
            client: client.label.clone(),
            server_report: report(&server_proc.output())
                .ok_or_else(|| server_proc.failure("no transfer report"))?,
            client_report: report(&client_proc.output())
                .ok_or_else(|| client_proc.failure(&format!("did not report {REPORTED}")))?,
            rxe_packets: sent_packets()? - packets_before,
            backend_sessions: sessions_opened(&backend.proc.output()) - sessions_before,
        };
        let vrdma_sides = [server, client]
            .iter()
            .filter(|s| s.label == "vrdma")
            .count();
        if run.rxe_packets < MIN_RXE_PACKETS || run.backend_sessions != vrdma_sides {
            return Err(Error::Scenario(format!(
                "{run:?}: fewer than {MIN_RXE_PACKETS} rxe packets (librspreload fell back to \
                 TCP) or not {vrdma_sides} backend sessions"
            )));
        }
        runs.push(run);
    }
    backend.check_alive("the preload runs")?;
    Ok(runs)
}

/// A fixed-width table of the runs.
pub fn render_table(runs: &[PreloadRun]) -> String {
    let mut out = String::from(
        "\niperf under librspreload.so (server, client, rxe packets, client report)\n",
    );
    for r in runs {
        out.push_str(&format!(
            "{:<7} {:<7} {:>7}  {}\n",
            r.server, r.client, r.rxe_packets, r.client_report
        ));
    }
    out
}

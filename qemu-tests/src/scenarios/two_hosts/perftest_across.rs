//! Debian's unmodified perftest across the link: a server on one host, its client on the
//! other, native or over vrdma's drop-in on either side, the same cases natively in the same
//! run as the baseline.
//!
//! perftest exchanges its QP parameters over TCP, by default IPv4 only; `--ipv6-addr` makes
//! both sides use IPv6, and the client names the server by its scoped link-local address
//! (`fe80::b%link0`). The RoCE traffic uses GID index 0, the address rxe derived from the
//! NIC's MAC, for which each host has a permanent neighbour entry (see `vm_link`). perftest
//! checks no data: what it shows is that unmodified programs set up QPs across the link
//! through vrdma and move every message (the iteration count it reports, frames on both
//! NICs); the bytes themselves are verified by the ping-pong steps.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::link::NicFrames;
use super::rendezvous;
use crate::error::{Error, Result};
use crate::inside::{Proc, DEVICE};
use crate::perftest::{self, Case, Measurement, Side, Tool};
use crate::scenarios::backend::Backend;
use crate::scenarios::pingpong_peer::Impl;
use crate::vm_link::Host;

/// Who serves and who connects.
#[derive(Debug, Clone, Copy)]
pub struct Pairing {
    pub label: &'static str,
    pub server: (Host, Impl),
    pub client: (Host, Impl),
}

/// The pairings: native on both hosts first (the baseline of the same run), then vrdma as the
/// client, as the server, and on both ends (two backends).
pub const PAIRINGS: &[Pairing] = &[
    Pairing {
        label: "native-a-over-native-b",
        server: (Host::B, Impl::Native),
        client: (Host::A, Impl::Native),
    },
    Pairing {
        label: "vrdma-a-over-native-b",
        server: (Host::B, Impl::Native),
        client: (Host::A, Impl::Vrdma),
    },
    Pairing {
        label: "native-b-over-vrdma-a",
        server: (Host::A, Impl::Vrdma),
        client: (Host::B, Impl::Native),
    },
    Pairing {
        label: "vrdma-a-over-vrdma-b",
        server: (Host::B, Impl::Vrdma),
        client: (Host::A, Impl::Vrdma),
    },
];

/// The short form (part of `cargo test`): a latency, a write and a read stream, each with few
/// iterations.
pub const SHORT_CASES: &[Case] = &[
    Case {
        tool: Tool::IbSendLat,
        size: 2,
        iterations: 200,
    },
    Case {
        tool: Tool::IbWriteBw,
        size: 65536,
        iterations: 100,
    },
    Case {
        tool: Tool::IbReadBw,
        size: 65536,
        iterations: 100,
    },
];

/// The named suite (`two-hosts-perftest`): the one-VM baseline, then 1 MiB messages (256
/// packets each at path MTU 4096) written and read across the link.
pub const FULL_CASES: &[Case] = &[
    perftest::BASELINE[0],
    perftest::BASELINE[1],
    perftest::BASELINE[2],
    perftest::BASELINE[3],
    perftest::BASELINE[4],
    Case {
        tool: Tool::IbWriteBw,
        size: 1 << 20,
        iterations: 32,
    },
    Case {
        tool: Tool::IbReadBw,
        size: 1 << 20,
        iterations: 32,
    },
];

/// What one host did in one run of one case.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PerftestRecord {
    pub pairing: String,
    /// "server" or "client".
    pub role: String,
    /// "vrdma" or "native".
    pub implementation: String,
    pub case: Case,
    /// The client's result (a server reports none).
    pub row: Option<perftest::Row>,
    /// Frames this host's NIC sent and received during the run.
    pub nic_frames: NicFrames,
    pub seconds: f64,
}

/// How long one run may take, the peer's boot or previous step included.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

/// Ports each run takes from the one it is given: perftest's and the rendezvous'.
pub const PORTS_PER_RUN: u16 = 2;

/// Runs `host`'s part of every case of `cases` in every pairing, from `port` on; vrdma sides
/// through `backend` and the drop-in in `library_dir`.
pub fn run(
    host: Host,
    backend: &Backend,
    library_dir: &Path,
    cases: &[Case],
    port: u16,
) -> Result<Vec<PerftestRecord>> {
    let mut records = Vec::new();
    let runs = PAIRINGS
        .iter()
        .flat_map(|pairing| cases.iter().map(move |case| (pairing, case)));
    for (index, (pairing, case)) in runs.enumerate() {
        let port = port + PORTS_PER_RUN * index as u16;
        println!(
            "== host {}: perftest {} {} B, {} (port {port})",
            host.name(),
            case.tool.command(),
            case.size,
            pairing.label
        );
        records.push(run_one(host, backend, library_dir, pairing, case, port)?);
    }
    Ok(records)
}

/// How many ports [`run`] takes.
pub fn ports(cases: &[Case]) -> u16 {
    PORTS_PER_RUN * (PAIRINGS.len() * cases.len()) as u16
}

fn run_one(
    host: Host,
    backend: &Backend,
    library_dir: &Path,
    pairing: &Pairing,
    case: &Case,
    port: u16,
) -> Result<PerftestRecord> {
    let (role, which) =
        super::steps::role_of(host, pairing.server, pairing.client).ok_or_else(|| {
            Error::Scenario(format!(
                "host {} has no part in {}",
                host.name(),
                pairing.label
            ))
        })?;
    let side = match which {
        Impl::Native => Side::native(DEVICE),
        Impl::Vrdma => Side::over_dropin(&backend.socket, library_dir),
    }
    .with_args(&["--ipv6-addr"]);
    let frames_before = NicFrames::read()?;
    let started = Instant::now();
    let name = format!("two-hosts-perftest-{port}-{role}");
    let row = match role {
        "server" => {
            let mut server = Proc::spawn(&name, &mut side.server_command(case, port))?;
            server.wait_listening(port, RUN_TIMEOUT)?;
            rendezvous::announce(host, port + 1, RUN_TIMEOUT)?;
            server.wait_success(RUN_TIMEOUT)?;
            None
        }
        _ => {
            rendezvous::await_peer(host, port + 1, RUN_TIMEOUT)?;
            let server = host.peer().scoped_address();
            let mut client = Proc::spawn(&name, &mut side.client_command(case, port, &server))?;
            client.wait_success(RUN_TIMEOUT)?;
            let row = perftest::read_row(case, which.name(), &client.output())?;
            if !row.measurement.completed() {
                return Err(Error::Perftest(format!(
                    "{} across the link reported {:?}:\n{}",
                    case.tool.command(),
                    row.measurement,
                    client.output()
                )));
            }
            Some(row)
        }
    };
    Ok(PerftestRecord {
        pairing: pairing.label.into(),
        role: role.into(),
        implementation: which.name().into(),
        case: *case,
        row,
        nic_frames: NicFrames::read()?.since(frames_before),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// A table of the client rows, each with its ratio to the native pairing's row of the same
/// case (latency: vrdma/native, lower is better; bandwidth: vrdma/native, higher is better).
pub fn render(records: &[PerftestRecord]) -> String {
    let clients: Vec<&PerftestRecord> = records.iter().filter(|r| r.row.is_some()).collect();
    let native = |case: &Case| {
        clients
            .iter()
            .find(|r| r.pairing == PAIRINGS[0].label && r.case == *case)
            .and_then(|r| r.row.as_ref())
            .map(|row| row.measurement.headline())
    };
    let mut out = String::new();
    for record in &clients {
        let Some(row) = &record.row else { continue };
        let headline = row.measurement.headline();
        let figure = match row.measurement {
            Measurement::Untimed { .. } => "untimed".to_string(),
            _ => format!("{headline:.2} {}", record.case.tool.headline_unit()),
        };
        let ratio = native(&record.case)
            .filter(|n| n.is_finite() && *n > 0.0 && headline.is_finite())
            .map(|n| format!("{:.2}x", headline / n))
            .unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "perftest {:<12} {:>6} B x {:<5} {:<24} {figure:>18}  vs native {ratio:>6}  \
             ({} frames out)\n",
            record.case.tool.command(),
            row.size,
            row.iterations,
            record.pairing,
            record.nic_frames.tx,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_full_suite_is_the_baseline_and_more() {
        assert_eq!(&FULL_CASES[..perftest::BASELINE.len()], perftest::BASELINE);
        assert!(FULL_CASES.len() > perftest::BASELINE.len());
    }

    #[test]
    fn every_pairing_crosses_the_link() {
        for pairing in PAIRINGS {
            assert_ne!(pairing.server.0, pairing.client.0, "{pairing:?}");
        }
        assert_eq!(PAIRINGS[0].server.1, Impl::Native);
        assert_eq!(PAIRINGS[0].client.1, Impl::Native);
    }
}

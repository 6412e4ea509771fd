//! Cleanup: vrdma processes killed in the middle of traffic, round after round, leave nothing
//! behind on the device or in the backend.

use crate::scenarios::pingpong_peer::PEER_TIMEOUT_S;
use std::time::{Duration, Instant};

use super::pair::{start_pair, Impl, Plan};
use crate::error::{Error, Result};
use crate::inside::{wait_for_counts, ResourceCounts, DEVICE};
use crate::scenarios::backend::Backend;
use crate::scenarios::binaries::Binaries;

/// Kills vrdma clients mid-traffic `rounds` times; every time the device returns to the
/// backend's idle counts. Returns the backend's fd count and RSS after the first and the last
/// round.
pub(super) fn run(
    binaries: &Binaries,
    backend: &Backend,
    idle: ResourceCounts,
    rounds: u32,
    next_port: &mut dyn FnMut() -> u16,
) -> Result<((usize, usize), (u64, u64))> {
    let plan = Plan {
        ops: "send,write",
        sizes: "4096",
        iters: 1_000_000,
        bw: false,
        oneway: false,
        timeout_s: PEER_TIMEOUT_S,
        tool_args: &[],
    };
    let mut first = (0, 0);
    for round in 1..=rounds {
        let port = next_port();
        let (mut server, mut client) = start_pair(
            binaries,
            backend,
            (Impl::Native, Impl::Vrdma),
            &plan,
            port,
            "cleanup",
            &[],
        )?;
        // Traffic is flowing once the client's QP reached RTS and the first step started.
        client.wait_for_output("RUNNING", Duration::from_secs(60))?;
        std::thread::sleep(Duration::from_millis(50 + u64::from(round % 7) * 30));
        client.signal("KILL")?;
        client.kill();
        server.kill();
        // With no guest connected the backend holds no host object: back to idle.
        if let Err(last) = wait_for_counts(DEVICE, idle, Duration::from_secs(30)) {
            return Err(Error::Scenario(format!(
                "round {round}: {DEVICE} holds {last:?} after the guest died (idle {idle:?})\n{}",
                crate::error::tail(&backend.proc.output(), 20)
            )));
        }
        let mut fds = backend.proc.fd_count().unwrap_or(0);
        let rss = backend.proc.rss_kib().unwrap_or(0);
        if round == 1 {
            first = (fds, rss);
        }
        // The device is idle once the guest's objects are gone, but the connection's thread
        // may still be closing its descriptors (guest RAM, event fds, the filter's sockets).
        let deadline = Instant::now() + Duration::from_secs(30);
        while round == rounds && fds > first.0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            fds = backend.proc.fd_count().unwrap_or(0);
        }
        if round == rounds {
            println!(
                "  ok: {rounds} rounds; backend fds {} -> {fds}, RSS {} -> {rss} KiB",
                first.0, first.1
            );
            if fds > first.0 {
                return Err(Error::Scenario(format!(
                    "backend fds grew from {} to {fds} over {rounds} rounds",
                    first.0
                )));
            }
            // Allocator noise aside, nothing per guest may stay behind.
            if rss > first.1 + 8 * 1024 {
                return Err(Error::Scenario(format!(
                    "backend RSS grew from {} to {rss} KiB over {rounds} rounds",
                    first.1
                )));
            }
            return Ok(((first.0, fds), (first.1, rss)));
        }
    }
    Ok(((first.0, first.0), (first.1, first.1)))
}

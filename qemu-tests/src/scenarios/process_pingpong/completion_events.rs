//! Completion events instead of polling: every vrdma side of a pair waits by events
//! (`--events`), and the rows and the server's summary must show the events came.

use crate::scenarios::pingpong_peer::PEER_TIMEOUT_S;
use std::time::Duration;

use super::pair::{Impl, Plan};
use super::settings::Settings;
use crate::error::Result;
use crate::inside::Proc;
use crate::scenarios::backend::Backend;
use crate::scenarios::binaries::Binaries;
use crate::scenarios::pingpong_peer::pingpong_command;
use crate::scenarios::pingpong_peer::{read_report, PingpongRow};

/// Runs verified ping-pongs (send, write, read) and a bandwidth stream between `pair`, with
/// every vrdma side waiting for completions by events (`--events`). Checks that the vrdma
/// client's rows, and a vrdma server's summary, say events were used and that they came
/// (in the first step for certain, never more than ARM_CQ commands); returns the client's
/// rows.
pub(super) fn run(
    binaries: &Binaries,
    backend: &Backend,
    pair: (Impl, Impl),
    settings: &Settings,
    label: &str,
    next_port: &mut dyn FnMut() -> u16,
) -> Result<Vec<PingpongRow>> {
    let plans = [
        Plan {
            ops: "send,write,read",
            sizes: "64,65536",
            iters: settings.small_iters.min(100),
            bw: false,
            oneway: false,
            timeout_s: PEER_TIMEOUT_S,
            tool_args: &[],
        },
        Plan {
            ops: "write,send",
            sizes: "4096,65536",
            iters: settings.large_iters * 10,
            bw: true,
            oneway: false,
            timeout_s: PEER_TIMEOUT_S,
            tool_args: &[],
        },
    ];
    let mut rows = Vec::new();
    for plan in &plans {
        let port = next_port();
        let json = std::env::temp_dir().join(format!("pingpong-{label}.json"));
        let _ = std::fs::remove_file(&json);
        let with_events = |which: Impl, role: &str| {
            let mut cmd = pingpong_command(binaries, backend, which, role, port, plan, None);
            if which == Impl::Vrdma {
                cmd.arg("--events");
            }
            cmd
        };
        let mut server = Proc::spawn(
            &format!("{label}-server"),
            &mut with_events(pair.0, "server"),
        )?;
        server.wait_listening(port, Duration::from_secs(60))?;
        let mut client_cmd = with_events(pair.1, "client");
        client_cmd.arg("--json").arg(&json);
        let mut client = Proc::spawn(&format!("{label}-client"), &mut client_cmd)?;
        client.wait_success(Duration::from_secs(900))?;
        server.wait_success(Duration::from_secs(60))?;
        let plan_rows = read_report(&json)?;
        // Which steps sleep depends on timing; that the first one took an event does not:
        // the tool arms its CQs while they are still empty and waits for every event its
        // completions made certain (vrdma-pingpong's `wait` module).
        if let Some(row) = plan_rows
            .iter()
            .find(|row| row.completion.as_deref() != Some("events"))
        {
            return Err(client.failure(&format!(
                "{label}: {} {} did not wait by events: {row:?}",
                row.op, row.size
            )));
        }
        if plan_rows.first().and_then(|r| r.completion_events) < Some(1) {
            return Err(client.failure(&format!(
                "{label}: the first step took no completion event: {:?}",
                plan_rows.first()
            )));
        }
        // An arm of one step may be answered in the next, so only the whole run compares.
        let total: u64 = plan_rows.iter().filter_map(|r| r.completion_events).sum();
        let arms: u64 = plan_rows.iter().filter_map(|r| r.arms).sum();
        if total > arms {
            return Err(client.failure(&format!(
                "{label}: {total} completion events for only {arms} arms"
            )));
        }
        let mode = if plan.bw { "bandwidth" } else { "ping-pong" };
        println!(
            "  ok: {label} {mode}: {} rows verified, client {total} completion events for {arms} arms",
            plan_rows.len()
        );
        if pair.0 == Impl::Vrdma {
            let output = server.output();
            let Some(line) = output
                .lines()
                .find(|l| l.starts_with("server: completion: events;"))
            else {
                return Err(server.failure("no completion-event summary"));
            };
            let events = line
                .split_once("; ")
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
            if events == 0 {
                return Err(server.failure("the server received no completion event"));
            }
            println!("  ok: {label} {mode}: {line}");
        }
        rows.extend(plan_rows);
    }
    Ok(rows)
}

//! `verbs-utils`: Debian's unmodified libibverbs example programs (package ibverbs-utils) over
//! vrdma's drop-in `libibverbs.so.1`, inside the VM.
//!
//! Each program runs as a server and a client in four pairings: both native on rxe0, a vrdma
//! server against a native client, a native server against a vrdma client, and both over vrdma
//! through one vrdma-backend (process transport). A run passes when both sides exit 0 after
//! printing their own result lines (`N bytes in T seconds = R Mbit/sec`, `I iters in …`, printed
//! only after every exchange completed) with the iteration count asked for, and neither printed
//! the examples' data-check complaint (`-c`). The vrdma side names its device `vrdma0`, which
//! only the drop-in has: a program that silently loaded the system library fails with "IB device
//! vrdma0 not found" instead of passing natively.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::backend::Backend;
use crate::error::{Error, Result};
use crate::inside::{Proc, DEVICE};
use crate::perftest::Side;

/// One example program and how it is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Program {
    pub command: &'static str,
    /// Options besides device, GID index and port; always with `-c` (check received data).
    pub args: &'static [&'static str],
    /// The iteration count both sides must report.
    pub iters: u32,
}

/// The programs and their options. Sizes stay within one 1024-byte path MTU for UD (the
/// examples refuse larger UD messages); `-e` runs the RC example on completion events instead
/// of polling, `-N` posts through the extended QP API (`ibv_create_qp_ex`, `ibv_wr_send`).
pub const PROGRAMS: &[Program] = &[
    Program {
        command: "ibv_rc_pingpong",
        args: &["-s", "4096", "-n", "200", "-c"],
        iters: 200,
    },
    Program {
        command: "ibv_rc_pingpong",
        args: &["-e", "-s", "65536", "-n", "50", "-c"],
        iters: 50,
    },
    Program {
        command: "ibv_rc_pingpong",
        args: &["-N", "-s", "4096", "-n", "200", "-c"],
        iters: 200,
    },
    Program {
        command: "ibv_uc_pingpong",
        args: &["-s", "4096", "-n", "200", "-c"],
        iters: 200,
    },
    Program {
        command: "ibv_ud_pingpong",
        args: &["-s", "512", "-n", "200", "-c"],
        iters: 200,
    },
    Program {
        command: "ibv_srq_pingpong",
        args: &["-q", "4", "-s", "4096", "-n", "50", "-c"],
        iters: 50,
    },
];

/// The programs run again with a back-end that gives every RC and UC QP staging rings and
/// every CQ a staging ring the daemon copies completions into (spec §9.7, §9.8,
/// `--staged-rings always --staged-cqs always`), against native peers both ways: what a
/// guest's QPs and CQs past QEMU's memory slots go through, polled and (`-e`) on completion
/// events. The SRQ example stages only its send queues.
pub const STAGED_PROGRAMS: &[Program] = &[PROGRAMS[0], PROGRAMS[1], PROGRAMS[3], PROGRAMS[5]];

/// Label of the drop-in over the staging back-end.
pub const STAGED_LABEL: &str = "vrdma-staged";

/// The pairings of [`STAGED_PROGRAMS`]: (server, client).
pub const STAGED_PAIRINGS: [(&str, &str); 2] = [(STAGED_LABEL, "native"), ("native", STAGED_LABEL)];

/// The out-of-band exchange port of the examples.
const PORT: u16 = 18515;

/// One program run in one pairing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    /// The command line's program and options (without device, GID and port).
    pub program: String,
    /// `native` or `vrdma`.
    pub server: String,
    pub client: String,
    /// The result lines each side printed.
    pub server_report: Vec<String>,
    pub client_report: Vec<String>,
    /// The GID each side printed as its own (`local address: … GID …`).
    #[serde(default)]
    pub server_gid: String,
    #[serde(default)]
    pub client_gid: String,
}

/// The GID a run of one of the examples printed as its own.
pub fn announced_gid(output: &str) -> String {
    output
        .lines()
        .find(|l| l.contains("local address:"))
        .and_then(|l| l.split("GID ").nth(1))
        .map(|gid| gid.trim().to_string())
        .unwrap_or_default()
}

/// Runs every program in every pairing; the first failure ends the scenario with both sides'
/// output.
pub fn run(backend_binary: &Path, library_dir: &Path) -> Result<Vec<Run>> {
    if !library_dir.join("libibverbs.so.1").exists() {
        return Err(Error::Scenario(format!(
            "{} has no libibverbs.so.1",
            library_dir.display()
        )));
    }
    // UD needs the backend's permission to create address handles.
    let mut backend = Backend::start(
        backend_binary,
        "vrdma-verbs-utils-backend",
        &["--allow-ud"],
        "warn",
    )?;
    let native = Side::native(DEVICE);
    let vrdma = Side::over_dropin(&backend.socket, library_dir);
    let pairings = [
        (&native, &native),
        (&vrdma, &native),
        (&native, &vrdma),
        (&vrdma, &vrdma),
    ];
    let mut runs = run_all(PROGRAMS, &pairings, "")?;
    backend.check_alive("the run")?;
    let mut staging = Backend::start(
        backend_binary,
        "vrdma-verbs-utils-staged-backend",
        &["--staged-rings", "always", "--staged-cqs", "always"],
        "warn",
    )?;
    let staged = Side {
        label: STAGED_LABEL.into(),
        ..Side::over_dropin(&staging.socket, library_dir)
    };
    let staged_pairings = [(&staged, &native), (&native, &staged)];
    runs.extend(run_all(
        STAGED_PROGRAMS,
        &staged_pairings,
        " through staging rings",
    )?);
    staging.check_alive("the run")?;
    Ok(runs)
}

/// Runs every program of `programs` in every pairing of `pairings` (server, client).
fn run_all(programs: &[Program], pairings: &[(&Side, &Side)], how: &str) -> Result<Vec<Run>> {
    let mut runs = Vec::new();
    for program in programs {
        for (server, client) in pairings {
            println!(
                "== {} {}{how}: server {}, client {}",
                program.command,
                program.args.join(" "),
                server.label,
                client.label
            );
            runs.push(run_pair(program, server, client)?);
        }
    }
    Ok(runs)
}

/// Runs `program` between `server` and `client` (the client connects over loopback TCP); both must
/// exit 0 with their result lines.
pub fn run_pair(program: &Program, server: &Side, client: &Side) -> Result<Run> {
    let timeout = Duration::from_secs(300);
    let name = |role: &str| format!("{}-{}-{role}", program.command, side_name(server, client));
    let mut server_proc = Proc::spawn(&name("server"), &mut command(program, server, None))?;
    server_proc.wait_listening(PORT, Duration::from_secs(60))?;
    let mut client_proc = Proc::spawn(
        &name("client"),
        &mut command(program, client, Some("127.0.0.1")),
    )?;
    client_proc.wait_success(timeout)?;
    server_proc.wait_success(timeout)?;
    let server_report = checked_report(program, &server_proc)?;
    let client_report = checked_report(program, &client_proc)?;
    Ok(Run {
        program: format!("{} {}", program.command, program.args.join(" ")),
        server: server.label.clone(),
        client: client.label.clone(),
        server_report,
        client_report,
        server_gid: announced_gid(&server_proc.output()),
        client_gid: announced_gid(&client_proc.output()),
    })
}

fn side_name(server: &Side, client: &Side) -> String {
    format!("{}-{}", server.label, client.label)
}

fn command(program: &Program, side: &Side, server: Option<&str>) -> std::process::Command {
    let mut cmd = std::process::Command::new(program.command);
    cmd.args(["-d", &side.device])
        .args(["-g", &side.gid_index.to_string()])
        .args(["-p", &PORT.to_string()])
        .args(program.args)
        .env_remove("VRDMA_SOCKET")
        .envs(side.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    if let Some(server) = server {
        cmd.arg(server);
    }
    cmd
}

/// The result lines of a side that exited 0, or why they do not prove a complete run.
fn checked_report(program: &Program, proc: &Proc) -> Result<Vec<String>> {
    report(program, &proc.output()).map_err(|why| proc.failure(&why))
}

/// Checks one side's output: no data-check complaint, a throughput line and an iteration line
/// with `program.iters`; returns those two lines.
pub fn report(program: &Program, output: &str) -> std::result::Result<Vec<String>, String> {
    if let Some(line) = output.lines().find(|l| l.contains("invalid data")) {
        return Err(format!("reported corrupt data: {line:?}"));
    }
    let bytes = output
        .lines()
        .find(|l| l.contains(" bytes in ") && l.contains("Mbit/sec"))
        .ok_or("printed no throughput line")?;
    let iters = output
        .lines()
        .find(|l| l.contains(" iters in ") && l.contains("usec/iter"))
        .ok_or("printed no iteration line")?;
    let count: u32 = iters
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("unreadable iteration line {iters:?}"))?;
    if count != program.iters {
        return Err(format!("ran {count} iterations, not {}", program.iters));
    }
    Ok(vec![bytes.trim().to_string(), iters.trim().to_string()])
}

/// A fixed-width table of the runs.
pub fn render_table(runs: &[Run]) -> String {
    super::pairing_table(
        44,
        runs.iter().map(|r| {
            (
                r.program.as_str(),
                r.server.as_str(),
                r.client.as_str(),
                r.client_report.join("; "),
            )
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const RC: Program = PROGRAMS[0];

    #[test]
    fn a_complete_run_reports_its_two_lines() {
        let output = "  local address:  LID 0x0000, QPN 0x000011, PSN 0x1, GID fe80::1\n\
                      \x20 remote address: LID 0x0000, QPN 0x000012, PSN 0x2, GID fe80::1\n\
                      819200 bytes in 0.05 seconds = 131.07 Mbit/sec\n\
                      200 iters in 0.05 seconds = 250.00 usec/iter\n";
        assert_eq!(
            report(&RC, output).unwrap(),
            [
                "819200 bytes in 0.05 seconds = 131.07 Mbit/sec",
                "200 iters in 0.05 seconds = 250.00 usec/iter"
            ]
        );
    }

    #[test]
    fn corrupt_data_short_runs_and_missing_lines_fail() {
        let good = "819200 bytes in 0.05 seconds = 131.07 Mbit/sec\n\
                    200 iters in 0.05 seconds = 250.00 usec/iter\n";
        let corrupt = format!("invalid data in page 3\n{good}");
        assert!(report(&RC, &corrupt).unwrap_err().contains("corrupt"));
        let short = good.replace("200 iters", "199 iters");
        assert!(report(&RC, &short).unwrap_err().contains("199"));
        assert!(report(&RC, "819200 bytes in 0.05 seconds = 131.07 Mbit/sec\n").is_err());
        assert!(report(&RC, "").is_err());
    }

    #[test]
    fn every_program_checks_its_data_and_runs_what_it_reports() {
        for program in PROGRAMS {
            assert!(program.args.contains(&"-c"), "{program:?}");
            let n = program.args.iter().position(|a| *a == "-n").unwrap();
            assert_eq!(program.args[n + 1], program.iters.to_string());
        }
    }
}

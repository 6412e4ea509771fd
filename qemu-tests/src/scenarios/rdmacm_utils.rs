//! `rdmacm-utils`: Debian's unmodified librdmacm example programs (package rdmacm-utils) over
//! vrdma's drop-in `librdmacm.so.1`, inside the VM, on rxe0's IPv6 link-local address.
//!
//! Each program runs as a server and a client in three pairings: a vrdma server against a
//! native client, a native server against a vrdma client, and both over vrdma (two sessions of
//! one vrdma-backend, process transport); every connection goes through the kernel's rdma_cm,
//! the vrdma side's through the device's CM commands. A run passes when both sides exit 0
//! after printing what the program prints only once every exchange completed (`rping -V` also
//! checks every byte of every ping), and the backend opened one session per vrdma side (so
//! a program that silently loaded the system librdmacm cannot pass).
//! The client starts once the server's listener shows in `rdma resource show cm_id`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::backend::Backend;
use crate::error::{Error, Result};
use crate::inside::{Proc, DEVICE};
use crate::perftest::Side;

/// One example program: its server and client options (the address and port are added),
/// and the lines each side must print.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Program {
    pub server: &'static str,
    pub client: &'static str,
    pub args: &'static [&'static str],
    /// The lines each side prints only after a complete run, with how many times each.
    pub server_marks: &'static [(&'static str, usize)],
    pub client_marks: &'static [(&'static str, usize)],
}

/// The port udaddy always uses (its `-p` names a port space, not a port).
const UDADDY_PORT: u16 = 7174;

/// How the address and port are given to a program; the port it will listen on.
pub fn address_args(program: &str, address: &str, port: u16, server: bool) -> (Vec<String>, u16) {
    let with_port = |flag: &str| {
        vec![
            flag.to_string(),
            address.to_string(),
            "-p".into(),
            port.to_string(),
        ]
    };
    match program {
        // rping: -a for both sides.
        "rping" => (with_port("-a"), port),
        // ucmatose: -b binds the server, -s names the server.
        "ucmatose" if server => (with_port("-b"), port),
        "ucmatose" => (with_port("-s"), port),
        "udaddy" if server => (vec!["-b".into(), address.into()], UDADDY_PORT),
        "udaddy" => (vec!["-s".into(), address.into()], UDADDY_PORT),
        // rstream: -b binds the server, -s names the server.
        "rstream" if server => (with_port("-b"), port),
        // rdma_server/rdma_client: -s address.
        _ => (with_port("-s"), port),
    }
}

/// RC sends over two connections, each side checking it received every message.
pub const UCMATOSE: Program = Program {
    server: "ucmatose",
    client: "ucmatose",
    args: &["-c", "2", "-C", "10", "-S", "1024"],
    server_marks: &[("data transfers complete", 1), ("return status 0", 1)],
    client_marks: &[("data transfers complete", 1), ("return status 0", 1)],
};

/// The programs: RC with RDMA reads and writes and data validation (rping), RC sends over two
/// connections (ucmatose), UD datagrams after SIDR (udaddy), synchronous endpoints
/// (rdma_server/rdma_client: `rdma_create_ep`, `rdma_get_request`, the `rdma_verbs.h`
/// helpers), and rsockets (rstream, each side checking every byte of the running counter it
/// receives, `-T v`): non-blocking calls retried (its default) with 64 KiB transfers, and
/// blocking ones (`MSG_WAITALL`, `-T b`) with 3000-byte ones. Each prints its "custom" result
/// line only after the whole exchange. (Its `-T a`, an `rpoll` before each call, is not used:
/// a client whose last `rpoll` comes after the server's close sees `POLLHUP` beside the data
/// and exits 16, natively too.)
pub const PROGRAMS: &[Program] = &[
    Program {
        server: "rping -s",
        client: "rping -c",
        args: &["-C", "20", "-S", "200", "-V", "-v"],
        server_marks: &[("server ping data: rdma-ping-", 20)],
        // Not "DISCONNECT EVENT": which side disconnects first is up to the scheduler.
        client_marks: &[("ping data: rdma-ping-", 20)],
    },
    UCMATOSE,
    Program {
        server: "udaddy",
        client: "udaddy",
        args: &["-c", "2", "-C", "10", "-S", "512"],
        server_marks: &[("data transfers complete", 1), ("return status 0", 1)],
        client_marks: &[("data transfers complete", 1), ("return status 0", 1)],
    },
    Program {
        server: "rdma_server",
        client: "rdma_client",
        args: &[],
        server_marks: &[("rdma_server: end 0", 1)],
        client_marks: &[("rdma_client: end 0", 1)],
    },
    RSTREAM_NONBLOCKING,
    RSTREAM_BLOCKING,
];

/// rsockets: 64 KiB transfers, non-blocking calls retried, every byte checked.
pub const RSTREAM_NONBLOCKING: Program = Program {
    server: "rstream",
    client: "rstream",
    args: &["-S", "65536", "-C", "20", "-I", "2", "-T", "v"],
    server_marks: &[("custom ", 1)],
    client_marks: &[("custom ", 1)],
};

/// rsockets: 3000-byte transfers, blocking calls (`MSG_WAITALL`), every byte checked.
pub const RSTREAM_BLOCKING: Program = Program {
    args: &["-S", "3000", "-C", "30", "-I", "2", "-T", "v", "-T", "b"],
    ..RSTREAM_NONBLOCKING
};

/// The first port the runs use (each run the next one).
const FIRST_PORT: u16 = 7471;

/// One program run in one pairing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    /// The server's command line without address and port.
    pub program: String,
    /// `native` or `vrdma`.
    pub server: String,
    pub client: String,
    /// The lines each side printed that prove a complete run.
    pub server_report: Vec<String>,
    pub client_report: Vec<String>,
    /// Sessions the backend opened during the run (one per vrdma side).
    pub backend_sessions: usize,
}

/// rxe0's IPv6 link-local address with its netdev as scope, as the programs take it.
pub fn link_local_address() -> Result<String> {
    let ndevs = format!("/sys/class/infiniband/{DEVICE}/ports/1/gid_attrs/ndevs/0");
    let netdev = std::fs::read_to_string(&ndevs)
        .map_err(|e| Error::Scenario(format!("{ndevs}: {e}")))?
        .trim()
        .to_string();
    let gid_path = format!("/sys/class/infiniband/{DEVICE}/ports/1/gids/0");
    let gid = std::fs::read_to_string(&gid_path)
        .map_err(|e| Error::Scenario(format!("{gid_path}: {e}")))?;
    let ip: std::net::Ipv6Addr = gid
        .trim()
        .parse()
        .map_err(|e| Error::Scenario(format!("GID 0 {gid:?}: {e}")))?;
    if !ip.is_unicast_link_local() {
        return Err(Error::Scenario(format!(
            "GID 0 of {DEVICE} is {ip}, not link-local"
        )));
    }
    Ok(format!("{ip}%{netdev}"))
}

/// Sessions the backend logged opening so far.
pub(crate) fn sessions_opened(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("host context on"))
        .count()
}

/// Runs every program in every pairing; the first failure ends the scenario with both sides'
/// output.
pub fn run(backend_binary: &Path, library_dir: &Path) -> Result<Vec<Run>> {
    for name in ["libibverbs.so.1", "librdmacm.so.1"] {
        if !library_dir.join(name).exists() {
            return Err(Error::Scenario(format!(
                "{} has no {name}",
                library_dir.display()
            )));
        }
    }
    let address = link_local_address()?;
    // UD for udaddy; info logging for the session count.
    let mut backend = Backend::start(
        backend_binary,
        "vrdma-rdmacm-utils-backend",
        &["--allow-ud"],
        "info",
    )?;
    let native = Side::native(DEVICE);
    let vrdma = Side::over_dropin(&backend.socket, library_dir);
    let pairings = [(&vrdma, &native), (&native, &vrdma), (&vrdma, &vrdma)];
    let mut runs = Vec::new();
    let mut port = FIRST_PORT;
    for program in PROGRAMS {
        for (server, client) in pairings {
            println!(
                "== {} {}: server {}, client {}",
                program.server,
                program.args.join(" "),
                server.label,
                client.label
            );
            let before = sessions_opened(&backend.proc.output());
            let mut run = run_pair(program, server, client, &address, port)?;
            port += 1;
            run.backend_sessions = sessions_opened(&backend.proc.output()) - before;
            let expected = [server, client]
                .iter()
                .filter(|s| s.label == "vrdma")
                .count();
            if run.backend_sessions != expected {
                return Err(Error::Scenario(format!(
                    "{run:?}: the backend opened {} sessions, not {expected}: a vrdma side did not \
                     use the drop-in",
                    run.backend_sessions
                )));
            }
            runs.push(run);
        }
    }
    backend.check_alive("the run")?;
    Ok(runs)
}

/// `line` (a program and its first options) with `args`, in `side`'s environment (and as
/// its user).
pub fn command(line: &str, side: &Side, args: &[String]) -> Command {
    let mut words = line.split_whitespace();
    let mut cmd = side.program(words.next().expect("a program"));
    cmd.args(words)
        .args(args)
        .env_remove("VRDMA_SOCKET")
        .envs(side.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    cmd
}

/// Runs `program` between `server` and `client` on `port`, the server listening on `address`
/// (an address with its scope, as the programs take it).
pub fn run_pair(
    program: &Program,
    server: &Side,
    client: &Side,
    address: &str,
    port: u16,
) -> Result<Run> {
    let timeout = Duration::from_secs(180);
    let tool = program.server.split_whitespace().next().unwrap_or_default();
    let name = |role: &str| format!("{tool}-{}-{}-{role}", server.label, client.label);
    let with = |is_server: bool| {
        let mut args: Vec<String> = program.args.iter().map(|a| a.to_string()).collect();
        let (address_args, listening) = address_args(tool, address, port, is_server);
        args.extend(address_args);
        (args, listening)
    };
    let (server_args, listening) = with(true);
    let mut server_proc = Proc::spawn(
        &name("server"),
        &mut command(program.server, server, &server_args),
    )?;
    wait_cm_listening(&mut server_proc, listening, Duration::from_secs(60))?;
    let mut client_proc = Proc::spawn(
        &name("client"),
        &mut command(program.client, client, &with(false).0),
    )?;
    client_proc.wait_success(timeout)?;
    server_proc.wait_success(timeout)?;
    let server_report = marks(&server_proc.output(), program.server_marks)
        .map_err(|why| server_proc.failure(&why))?;
    let client_report = marks(&client_proc.output(), program.client_marks)
        .map_err(|why| client_proc.failure(&why))?;
    Ok(Run {
        program: format!("{} {}", program.server, program.args.join(" ")),
        server: server.label.clone(),
        client: client.label.clone(),
        server_report,
        client_report,
        backend_sessions: 0,
    })
}

/// Waits until an rdma_cm id listens on `port` (the server may be vrdma's: its id is the
/// backend's), failing if the server exits first or `timeout` passes.
pub fn wait_cm_listening(server: &mut Proc, port: u16, timeout: Duration) -> Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let out = Command::new("rdma")
            .args(["-j", "resource", "show", "cm_id"])
            .output()
            .map_err(|e| Error::Scenario(format!("rdma resource show cm_id: {e}")))?;
        if cm_listens(&String::from_utf8_lossy(&out.stdout), port) {
            return Ok(());
        }
        if let Some(status) = server.try_wait()? {
            return Err(server.failure(&format!("exited before listening ({status})")));
        }
        if std::time::Instant::now() > deadline {
            return Err(server.failure(&format!("no rdma_cm listener on port {port}")));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether `rdma -j resource show cm_id` output shows a listener on `port`.
pub fn cm_listens(json: &str, port: u16) -> bool {
    let Ok(ids) = serde_json::from_str::<Vec<serde_json::Value>>(json) else {
        return false;
    };
    let suffix = format!(":{port}");
    ids.iter().any(|id| {
        id["state"] == "LISTEN"
            && id["src-addr"]
                .as_str()
                .is_some_and(|a| a.ends_with(&suffix))
    })
}

/// The lines of `output` holding each mark, checking each appears exactly as often as asked.
pub fn marks(output: &str, wanted: &[(&str, usize)]) -> std::result::Result<Vec<String>, String> {
    for bad in ["data mismatch", "error", "failed"] {
        if let Some(line) = output.lines().find(|l| l.to_lowercase().contains(bad)) {
            return Err(format!("printed {line:?}"));
        }
    }
    let mut found = Vec::new();
    for (mark, count) in wanted {
        let lines: Vec<&str> = output.lines().filter(|l| l.contains(mark)).collect();
        if lines.len() != *count {
            return Err(format!(
                "printed {mark:?} {} times, not {count}",
                lines.len()
            ));
        }
        found.push(
            lines
                .last()
                .map(|l| l.trim().to_string())
                .unwrap_or_default(),
        );
    }
    Ok(found)
}

/// A fixed-width table of the runs.
pub fn render_table(runs: &[Run]) -> String {
    super::pairing_table(
        34,
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

    #[test]
    fn listeners_are_found_by_port() {
        let json = r#"[{"ifname":"rxe0","state":"LISTEN","ps":"TCP","comm":"vrdma-backend",
            "src-addr":"fe80::ec18:b8ff:fe4e:fc45:7471","dst-addr":":::0"},
            {"state":"CONNECT","src-addr":"fe80::1:7472"}]"#;
        assert!(cm_listens(json, 7471));
        assert!(!cm_listens(json, 7472), "not listening");
        assert!(!cm_listens(json, 471), "a port is matched whole");
        assert!(!cm_listens("not json", 7471));
    }

    #[test]
    fn complete_runs_print_each_mark_as_often_as_asked() {
        let rping = &PROGRAMS[0];
        let pings: String = (0..20)
            .map(|i| format!("ping data: rdma-ping-{i}: ABC\n"))
            .collect();
        let ok = format!("{pings}client DISCONNECT EVENT...\n");
        assert_eq!(marks(&ok, rping.client_marks).unwrap().len(), 1);
        let short: String = pings.lines().skip(1).map(|l| format!("{l}\n")).collect();
        assert!(marks(&short, rping.client_marks).is_err());
        let bad = format!("{ok}data mismatch!\n");
        assert!(marks(&bad, rping.client_marks).is_err());
    }
}

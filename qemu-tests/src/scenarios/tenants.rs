//! `tenants`: one vrdma-backend serving three tenants, each with its own link-local RDMA
//! address on rxe0's netdev, inside the VM (issue 13's malicious-guest suite).
//!
//! - The daemon puts the addresses on the netdev and the guests see only their own GIDs.
//! - Two tenants exchange traffic with unmodified `ibv_rc_pingpong`/`ibv_ud_pingpong` over the
//!   drop-in, and a tenant with a native peer on the host's own address (RC and UD). rxe drops
//!   RC packets whose source is not the address the receiving QP was connected to, so a passing
//!   RC run between two tenants shows each sending from the address it announced (its GID 0);
//!   for UD, the well-behaved tenants' `vrdma-pingpong` rounds check the source address in the
//!   IP header (GRH) of every message received against the address the peer announced.
//! - A hostile tenant runs every attack of `vrdma-hostile` (foreign source GIDs, forged UD
//!   address vectors, foreign AH and QP numbers, forbidden peers and traffic classes, page
//!   lists of one mapping per page, pinning past its quota, UD QPs whose staged send queues
//!   (each a mapping of the daemon's) exceed its mapping quota, a flood of malformed commands),
//!   then exits abruptly in the middle of registrations, while a well-behaved tenant keeps
//!   running verified ping-pongs with a third one.
//! - After the daemon stops, rxe holds no object and the addresses it added are gone.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::rdmacm_utils;
use super::verbs_utils::{self, Run, PROGRAMS};
use crate::error::{Error, Result};
use crate::inside::{resource_counts, wait_for_counts, wait_for_path, Proc, DEVICE};
use crate::perftest::Side;
use vrdma_tools::hostile::Outcome;

/// One tenant of the daemon.
#[derive(Debug, Clone, Copy)]
pub struct Tenant {
    pub name: &'static str,
    pub address: &'static str,
}

pub const ATTACKER: Tenant = Tenant {
    name: "attacker",
    address: "fe80::a:1",
};
pub const VICTIM: Tenant = Tenant {
    name: "victim",
    address: "fe80::b:1",
};
pub const PEER: Tenant = Tenant {
    name: "peer",
    address: "fe80::c:1",
};
/// The attacker's MR byte quota and the bytes of each MR of its pinning attack.
pub const ATTACKER_MR_BYTES: u64 = 64 << 20;
const PIN_CHUNK: u64 = 8 << 20;
/// The attacker's largest MR window, in mappings, and the pages of its page-list attacks.
pub const ATTACKER_MR_MAPPINGS: u32 = 1024;
const ATTACK_PAGES: u32 = 2048;
/// Malformed commands of the log flood.
pub const FLOOD: u32 = 20_000;
/// The attacker's mapping quota (MR windows and staged queues): its staged-queue attack must
/// be refused by it, long before its QP quota.
pub const ATTACKER_MAPPINGS: u32 = 256;

/// What the suite saw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    /// rxe0's netdev addresses while the daemon ran.
    pub netdev_addresses: Vec<String>,
    /// The GID each tenant's side of the unmodified example programs printed as its own.
    pub announced_gids: Vec<(String, String)>,
    /// Unmodified example programs between tenants and with a native peer.
    pub identity_runs: Vec<Run>,
    /// Unmodified rping -V between two tenants through the device's connection manager, the
    /// server on the victim's address.
    #[serde(default)]
    pub cm_runs: Vec<rdmacm_utils::Run>,
    /// The attacker's rping server binding the victim's address was refused, and what it
    /// printed.
    #[serde(default)]
    pub cm_foreign_bind: String,
    /// Every attack, as `vrdma-hostile` reported it.
    pub attacks: Vec<Outcome>,
    /// Verified ping-pongs of the well-behaved tenants, all passed; and how many of them
    /// started while the attacks ran.
    pub victim_rounds: u32,
    pub victim_rounds_during_attacks: u32,
    /// Whether the daemon discarded the guest of the attacker that exited in the middle of
    /// its registrations.
    pub abrupt_exit_discarded: bool,
    /// Log lines the daemon wrote about the attacker.
    pub attacker_log_lines: usize,
    /// rxe0's netdev addresses after the daemon stopped.
    pub addresses_after_stop: Vec<String>,
    /// rxe0 held exactly what it held before the daemon started, once it stopped.
    pub rxe_idle_after_stop: bool,
}

/// The daemon's configuration file.
fn config(dir: &Path) -> String {
    let socket = |t: &Tenant| dir.join(format!("{}.sock", t.name)).display().to_string();
    format!(
        r#"device = "{DEVICE}"
gid_wait_ms = 60000

[[guest]]
name = "{a}"
socket = "{a_sock}"
addresses = ["{a_addr}/64"]
allow_ud = true
max_mr_mappings = {ATTACKER_MR_MAPPINGS}
[guest.quotas]
mr_bytes = {ATTACKER_MR_BYTES}
mappings = {ATTACKER_MAPPINGS}
[guest.policy]
traffic_classes = [0]
destinations = ["{a_addr}/128"]

[[guest]]
name = "{v}"
socket = "{v_sock}"
addresses = ["{v_addr}/64"]
allow_ud = true

[[guest]]
name = "{p}"
socket = "{p_sock}"
addresses = ["{p_addr}/64"]
allow_ud = true
"#,
        a = ATTACKER.name,
        a_sock = socket(&ATTACKER),
        a_addr = ATTACKER.address,
        v = VICTIM.name,
        v_sock = socket(&VICTIM),
        v_addr = VICTIM.address,
        p = PEER.name,
        p_sock = socket(&PEER),
        p_addr = PEER.address,
    )
}

/// The IPv6 addresses of rxe0's netdev (`d0`).
fn netdev_addresses() -> Result<Vec<String>> {
    let out = crate::host::run_checked(
        Command::new("ip").args(["-6", "-o", "addr", "show", "dev", "d0"]),
    )?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "inet6")?;
            Some(words.next()?.split('/').next()?.to_string())
        })
        .collect())
}

/// Runs the suite with the binaries beside this executable and the drop-in in `library_dir`.
pub fn run(backend_binary: &Path, library_dir: &Path) -> Result<Results> {
    let bin_dir = backend_binary.parent().unwrap_or(Path::new("."));
    let hostile = bin_dir.join("vrdma-hostile");
    let pingpong = bin_dir.join("vrdma-pingpong");
    let dir = std::env::temp_dir().join("vrdma-tenants");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::Scenario(format!("{}: {e}", dir.display())))?;
    let socket = |t: &Tenant| dir.join(format!("{}.sock", t.name));
    let config_path = dir.join("tenants.toml");
    std::fs::write(&config_path, config(&dir))
        .map_err(|e| Error::Scenario(format!("writing the configuration: {e}")))?;

    let idle = resource_counts(DEVICE)?;
    let mut backend = Proc::spawn(
        "vrdma-tenants-backend",
        Command::new(backend_binary)
            .arg("--config")
            .arg(&config_path)
            .args(["--max-pinned-bytes", "512M"])
            .env("RUST_LOG", "info"),
    )?;
    for tenant in [ATTACKER, VICTIM, PEER] {
        if let Err(e) = wait_for_path(&socket(&tenant), Duration::from_secs(120)) {
            let _ = backend.try_wait();
            return Err(backend.failure(&e.to_string()));
        }
    }
    let netdev_list = netdev_addresses()?;
    println!("== rxe0's netdev: {netdev_list:?}");

    // Traffic between identities, with unmodified programs.
    let side = |t: &Tenant| Side {
        label: t.name.into(),
        ..Side::over_dropin(&socket(t), library_dir)
    };
    let native = Side::native(DEVICE);
    let rc = &PROGRAMS[0];
    let ud = PROGRAMS
        .iter()
        .find(|p| p.command == "ibv_ud_pingpong")
        .ok_or_else(|| Error::Scenario("no UD example".into()))?;
    let mut identity_runs = Vec::new();
    for (program, server, client) in [
        (rc, side(&VICTIM), side(&PEER)),
        (ud, side(&PEER), side(&VICTIM)),
        (rc, native.clone(), side(&VICTIM)),
        (ud, native.clone(), side(&VICTIM)),
    ] {
        println!(
            "== {}: server {}, client {}",
            program.command, server.label, client.label
        );
        identity_runs.push(verbs_utils::run_pair(program, &server, &client)?);
    }
    // The connection manager between tenants: the victim listens on its own address, the
    // peer connects; the attacker may not bind the victim's address.
    let netdev = rdmacm_utils::link_local_address()?
        .split('%')
        .nth(1)
        .unwrap_or_default()
        .to_string();
    let victim_address = format!("{}%{netdev}", VICTIM.address);
    let rping = &rdmacm_utils::PROGRAMS[0];
    println!("== rping between tenants: server victim, client peer");
    let cm_runs = vec![rdmacm_utils::run_pair(
        rping,
        &side(&VICTIM),
        &side(&PEER),
        &victim_address,
        7700,
    )?];
    let cm_foreign_bind = foreign_bind(&side(&ATTACKER), &victim_address)?;
    let announced_gids = identity_runs
        .iter()
        .flat_map(|run| {
            [
                (run.server.clone(), run.server_gid.clone()),
                (run.client.clone(), run.client_gid.clone()),
            ]
        })
        .collect();

    // A well-behaved tenant keeps running verified ping-pongs with another one.
    let stop = Arc::new(AtomicBool::new(false));
    let attacks_running = Arc::new(AtomicBool::new(false));
    let victim = {
        let (stop, attacks_running) = (Arc::clone(&stop), Arc::clone(&attacks_running));
        let (victim_socket, peer_socket) = (socket(&VICTIM), socket(&PEER));
        std::thread::spawn(move || {
            victim_rounds(
                &pingpong,
                &victim_socket,
                &peer_socket,
                &stop,
                &attacks_running,
            )
        })
    };

    attacks_running.store(true, Ordering::SeqCst);
    let attack_result =
        attack(&hostile, &dir, &socket(&ATTACKER), &socket(&VICTIM)).and_then(|attacks| {
            Ok((
                attacks,
                abrupt_exit(&hostile, &socket(&ATTACKER), &backend)?,
            ))
        });
    attacks_running.store(false, Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    let rounds = victim
        .join()
        .map_err(|_| Error::Scenario("the victim's thread panicked".into()))?;
    let (attacks, abrupt_exit_discarded) = attack_result?;
    let (victim_rounds, victim_rounds_during_attacks) = rounds?;

    if let Some(status) = backend.try_wait()? {
        return Err(backend.failure(&format!(
            "vrdma-backend exited during the attacks ({status})"
        )));
    }
    let attacker_log_lines = attacker_lines(&backend.output());
    backend.signal("TERM")?;
    backend.wait_success(Duration::from_secs(60))?;
    let addresses_after_stop = netdev_addresses()?;
    let rxe_idle_after_stop = wait_for_counts(DEVICE, idle, Duration::from_secs(60)).is_ok();
    Ok(Results {
        netdev_addresses: netdev_list,
        announced_gids,
        identity_runs,
        cm_runs,
        cm_foreign_bind,
        attacks,
        victim_rounds,
        victim_rounds_during_attacks,
        abrupt_exit_discarded,
        attacker_log_lines,
        addresses_after_stop,
        rxe_idle_after_stop,
    })
}

/// An rping server of `side` on `address` (another tenant's): it must fail to bind, without
/// listening; returns what it printed.
fn foreign_bind(side: &Side, address: &str) -> Result<String> {
    let mut server = Proc::spawn(
        "rping-foreign-bind",
        Command::new("rping")
            .args(["-s", "-a", address, "-p", "7701", "-C", "1"])
            .env_remove("VRDMA_SOCKET")
            .envs(side.env.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
    )?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = server.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            return Err(server.failure("still running: it may be listening on another's address"));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = server.output();
    if status.success() || !output.contains("rdma_bind_addr") {
        return Err(server.failure(&format!("was not refused its bind ({status})")));
    }
    Ok(output.trim().to_string())
}

/// Verified ping-pongs between the victim (client) and the peer (server) until `stop`, then
/// one more; returns how many ran and how many started while the attacks ran.
fn victim_rounds(
    pingpong: &Path,
    victim: &Path,
    peer: &Path,
    stop: &AtomicBool,
    attacks_running: &AtomicBool,
) -> Result<(u32, u32)> {
    let (mut rounds, mut during) = (0, 0);
    loop {
        let last = stop.load(Ordering::SeqCst);
        during += u32::from(attacks_running.load(Ordering::SeqCst));
        let port = 19100 + (rounds % 100) as u16;
        let plan = |role: &str, socket: &Path| {
            let mut cmd = Command::new(pingpong);
            cmd.arg(role)
                .arg("--socket")
                .arg(socket)
                .args(["--port", &port.to_string()])
                .args(["--ops", "send,write,read,ud_send"])
                .args(["--sizes", "64,4096"])
                .args(["--iters", "20"])
                .args(["--timeout", "120"]);
            cmd
        };
        let mut server = Proc::spawn(&format!("peer-{rounds}"), &mut plan("server", peer))?;
        server.wait_listening(port, Duration::from_secs(60))?;
        let mut client = Proc::spawn(&format!("victim-{rounds}"), &mut plan("client", victim))?;
        client.wait_success(Duration::from_secs(300))?;
        server.wait_success(Duration::from_secs(60))?;
        rounds += 1;
        if last {
            return Ok((rounds, during));
        }
    }
}

/// Every attack of `vrdma-hostile`; returns the outcomes.
fn attack(hostile: &Path, dir: &Path, attacker: &Path, victim: &Path) -> Result<Vec<Outcome>> {
    let report = dir.join("attacks.json");
    let mut proc = Proc::spawn(
        "vrdma-hostile",
        Command::new(hostile)
            .arg("--socket")
            .arg(attacker)
            .arg("--victim-socket")
            .arg(victim)
            .args(["--attack", ALL_ATTACKS])
            .args(["--pages", &ATTACK_PAGES.to_string()])
            .args(["--flood", &FLOOD.to_string()])
            .args(["--pin-chunk", &PIN_CHUNK.to_string()])
            .args(["--queue-bound", &(4 * ATTACKER_MAPPINGS).to_string()])
            .args(["--forbidden-peer", VICTIM.address])
            .arg("--report")
            .arg(&report),
    )?;
    // Exit status 1 means an attack got through: the report says which.
    let deadline = Instant::now() + Duration::from_secs(900);
    while proc.try_wait()?.is_none() {
        if Instant::now() > deadline {
            proc.kill();
            return Err(proc.failure("did not finish within 15 min"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    print!("{}", proc.output());
    let text =
        std::fs::read_to_string(&report).map_err(|e| proc.failure(&format!("no report: {e}")))?;
    serde_json::from_str(&text).map_err(|e| Error::Scenario(format!("attacks.json: {e}")))
}

/// The attacker exits abruptly in the middle of registrations; returns whether the daemon
/// then discarded that connection's guest (within a minute).
fn abrupt_exit(hostile: &Path, attacker: &Path, backend: &Proc) -> Result<bool> {
    let mut abrupt = Proc::spawn(
        "vrdma-hostile-abrupt",
        Command::new(hostile)
            .arg("--socket")
            .arg(attacker)
            .args(["--die-during-commands-ms", "3000"]),
    )?;
    abrupt.wait_success(Duration::from_secs(120))?;
    let Some(id) = attacker_ids(&backend.output()).pop() else {
        return Err(Error::Scenario(
            "the daemon logged no attacker connection".into(),
        ));
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if backend
            .output()
            .lines()
            .any(|l| l.contains(&id) && l.contains("discarded"))
        {
            return Ok(true);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(false)
}

/// `vrdma-hostile --attack` value with every attack.
const ALL_ATTACKS: &str = "sgid-av,sgid-alt-path,sgid-ah,forged-ud-av,foreign-ah-num,\
foreign-qpn-rc,foreign-qpn-ud,forbidden-peer,traffic-class,scattered-pages,repeated-pages,\
pin-budget,staged-queues,log-flood";

/// The `guest N:` prefixes of the attacker's connections in the daemon's log, in order.
fn attacker_ids(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains(&format!("({})", ATTACKER.name)) && l.contains("host context"))
        .filter_map(|l| {
            let at = l.find("guest ")? + 6;
            let id: String = l[at..].chars().take_while(char::is_ascii_digit).collect();
            Some(format!("guest {id}:"))
        })
        .collect()
}

/// Lines of the daemon's log about the attacker's connections.
fn attacker_lines(log: &str) -> usize {
    let ids = attacker_ids(log);
    log.lines()
        .filter(|l| ids.iter().any(|id| l.contains(id.as_str())))
        .count()
}

/// The suite's table.
pub fn render(results: &Results) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "netdev addresses: {:?}\n",
        results.netdev_addresses
    ));
    for (side, gid) in &results.announced_gids {
        out.push_str(&format!("{side:<10} announced GID {gid}\n"));
    }
    for a in &results.attacks {
        out.push_str(&format!(
            "{:<16} attempts {:>5} refused {:>5} {:?} accepted {:?} controls passed {} failed {:?}\n",
            a.attack.map_or_else(|| "?".to_string(), |x| format!("{x:?}")),
            a.attempts, a.refused, a.refusals, a.accepted, a.controls_passed, a.controls_failed
        ));
    }
    out.push_str(&format!(
        "victim ping-pongs: {} ({} started during the attacks); attacker log lines: {}; \
         addresses after stop: {:?}; rxe idle after stop: {}\n",
        results.victim_rounds,
        results.victim_rounds_during_attacks,
        results.attacker_log_lines,
        results.addresses_after_stop,
        results.rxe_idle_after_stop
    ));
    out
}

//! `process-pingpong`: vrdma in process mode on real rxe, inside the VM.
//!
//! One backend serves every vrdma process of the run. Against it:
//! - vrdma ↔ native (C over rdma-core's librxe): every operation and size, every byte verified,
//!   latency and bandwidth measured next to native ↔ native with the same tool and perftest;
//! - vrdma ↔ vrdma through the one backend; a UD exchange;
//! - the data path bypasses the backend: with the backend stopped (SIGSTOP), a native peer
//!   RDMA-WRITEs into and SENDs to a vrdma process that posted its receives beforehand;
//! - isolation between two guests;
//! - cleanup: vrdma processes killed mid-traffic, 50 times, leave nothing behind.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::inside::{resource_counts, wait_for_counts, wait_for_path, Proc, ResourceCounts};
use crate::perftest::{self, Side};

/// The RDMA device inside the VM.
pub const DEVICE: &str = "rxe0";

/// Where the binaries of this run are.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub backend: PathBuf,
    pub pingpong: PathBuf,
    pub native_pingpong: PathBuf,
}

impl Binaries {
    /// The workspace binaries next to this executable and the native peer at `native`.
    pub fn beside_current_exe(native: PathBuf) -> Result<Self> {
        let exe = std::env::current_exe()
            .map_err(|e| Error::Scenario(format!("locating this executable: {e}")))?;
        let dir = exe.parent().unwrap_or(Path::new("."));
        let binaries = Self {
            backend: dir.join("vrdma-backend"),
            pingpong: dir.join("vrdma-pingpong"),
            native_pingpong: native,
        };
        for path in [
            &binaries.backend,
            &binaries.pingpong,
            &binaries.native_pingpong,
        ] {
            if !path.is_file() {
                return Err(Error::Scenario(format!(
                    "{} is missing: build the workspace first (cargo build --workspace --bins)",
                    path.display()
                )));
            }
        }
        Ok(binaries)
    }
}

/// A running vrdma-backend.
struct Backend {
    proc: Proc,
    socket: PathBuf,
}

impl Backend {
    fn start(binaries: &Binaries) -> Result<Self> {
        let socket = std::env::temp_dir().join("vrdma-backend.sock");
        let _ = std::fs::remove_file(&socket);
        let mut cmd = Command::new(&binaries.backend);
        cmd.arg("--socket")
            .arg(&socket)
            .args(["--device", DEVICE, "--allow-ud"])
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or("info".into()),
            );
        let mut proc = Proc::spawn("vrdma-backend", &mut cmd)?;
        if let Err(e) = wait_for_path(&socket, Duration::from_secs(30)) {
            let _ = proc.try_wait();
            return Err(proc.failure(&e.to_string()));
        }
        Ok(Self { proc, socket })
    }
}

/// One side of a pingpong run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Impl {
    Vrdma,
    Native,
}

/// What to run: a plan both sides execute.
#[derive(Debug, Clone)]
struct Plan<'a> {
    ops: &'a str,
    sizes: &'a str,
    iters: u32,
    bw: bool,
    /// One way (bypass test): the client only sends; the vrdma server prints READY once its
    /// receives are posted and lets the client start only when the start file exists.
    oneway: bool,
}

fn pingpong_command(
    binaries: &Binaries,
    backend: &Backend,
    which: Impl,
    role: &str,
    port: u16,
    plan: &Plan<'_>,
) -> Command {
    let mut cmd = match which {
        Impl::Vrdma => {
            let mut cmd = Command::new(&binaries.pingpong);
            cmd.arg(role).arg("--socket").arg(&backend.socket);
            cmd
        }
        Impl::Native => {
            let mut cmd = Command::new(&binaries.native_pingpong);
            cmd.arg(role).args(["--device", DEVICE]);
            cmd
        }
    };
    cmd.args(["--port", &port.to_string()])
        .args(["--ops", plan.ops])
        .args(["--sizes", plan.sizes])
        .args(["--iters", &plan.iters.to_string()])
        .args(["--timeout", "120"]);
    if plan.bw {
        cmd.arg("--bw");
    }
    if plan.oneway {
        cmd.arg("--oneway")
            .arg("--start-file")
            .arg(bypass_start_file());
    }
    cmd
}

/// One row of a pingpong `--json` report.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct PingpongRow {
    pub op: String,
    pub size: u32,
    pub iters: u32,
    pub latency: Option<Latency>,
    pub mib_s: f64,
    pub mmsg_s: f64,
}

/// Latency summary of a row (one-way, µs).
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Latency {
    pub typical_us: f64,
    pub avg_us: f64,
    pub p99_us: f64,
}

#[derive(Deserialize)]
struct PingpongReport {
    rows: Vec<PingpongRow>,
}

/// Starts a server of `server` and, once it listens, a client of `client`, both with `plan`;
/// the client gets `client_args` too.
fn start_pair(
    binaries: &Binaries,
    backend: &Backend,
    (server, client): (Impl, Impl),
    plan: &Plan<'_>,
    port: u16,
    label: &str,
    client_args: &[&std::ffi::OsStr],
) -> Result<(Proc, Proc)> {
    let mut server_proc = Proc::spawn(
        &format!("{label}-server"),
        &mut pingpong_command(binaries, backend, server, "server", port, plan),
    )?;
    wait_listening(port, &mut server_proc)?;
    let mut client_cmd = pingpong_command(binaries, backend, client, "client", port, plan);
    client_cmd.args(client_args);
    let client_proc = Proc::spawn(&format!("{label}-client"), &mut client_cmd)?;
    Ok((server_proc, client_proc))
}

/// Runs a server of `server` and a client of `client` with `plan`; returns the client's rows.
fn pingpong(
    binaries: &Binaries,
    backend: &Backend,
    pair: (Impl, Impl),
    plan: &Plan<'_>,
    port: u16,
    label: &str,
) -> Result<Vec<PingpongRow>> {
    let json = std::env::temp_dir().join(format!("pingpong-{label}.json"));
    let _ = std::fs::remove_file(&json);
    let (mut server_proc, mut client_proc) = start_pair(
        binaries,
        backend,
        pair,
        plan,
        port,
        label,
        &["--json".as_ref(), json.as_os_str()],
    )?;
    let timeout = Duration::from_secs(900);
    client_proc.wait_success(timeout)?;
    server_proc.wait_success(Duration::from_secs(60))?;
    read_report(&json)
}

fn read_report(json: &Path) -> Result<Vec<PingpongRow>> {
    let text = std::fs::read_to_string(json)
        .map_err(|e| Error::Scenario(format!("reading {}: {e}", json.display())))?;
    let report: PingpongReport = serde_json::from_str(&text)
        .map_err(|e| Error::Scenario(format!("parsing {}: {e}", json.display())))?;
    Ok(report.rows)
}

/// Waits until the server listens on `port` (its out-of-band exchange socket).
fn wait_listening(port: u16, server: &mut Proc) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let tables = ["/proc/net/tcp", "/proc/net/tcp6"]
            .iter()
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .collect::<Vec<_>>();
        if tables.iter().any(|t| perftest::listens_on(t, port)) {
            return Ok(());
        }
        if let Some(status) = server.try_wait()? {
            return Err(server.failure(&format!("exited ({status}) before listening")));
        }
        if std::time::Instant::now() >= deadline {
            return Err(server.failure(&format!("does not listen on port {port}")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Everything the scenario measured, for the host to print and check.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Results {
    pub perftest: Vec<perftest::Row>,
    /// Keyed by "client-over-server", e.g. "vrdma-over-native".
    pub pingpong: BTreeMap<String, Vec<PingpongRow>>,
    pub bypass_messages: u32,
    pub cleanup_rounds: u32,
    pub backend_fds: (usize, usize),
    pub backend_rss_kib: (u64, u64),
}

/// Settings of a run (kept small under TCG; the same code runs bigger on real hosts).
#[derive(Debug, Clone)]
pub struct Settings {
    pub small_iters: u32,
    pub large_iters: u32,
    pub cleanup_rounds: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            small_iters: 200,
            large_iters: 20,
            cleanup_rounds: 50,
        }
    }
}

const VERIFY_OPS: &str = "send,send_imm,write,write_imm,read";
const SMALL_SIZES: &str = "1,64,4096";
const LARGE_SIZES: &str = "65536,1048576";

/// Runs the whole scenario.
pub fn run(binaries: &Binaries, settings: &Settings) -> Result<Results> {
    let idle = resource_counts(DEVICE)?;
    println!("idle {DEVICE} resources: {idle:?}");
    let mut results = Results::default();

    println!("== native perftest baseline");
    let native = Side::native(DEVICE);
    for case in perftest::BASELINE {
        results
            .perftest
            .push(perftest::run_case(case, &native, &native, 18515)?);
    }

    let backend = Backend::start(binaries)?;
    let mut port = 18600;
    let mut next_port = || {
        port += 1;
        port
    };
    let pairs = [
        ("native-over-native", (Impl::Native, Impl::Native)),
        ("vrdma-over-native", (Impl::Native, Impl::Vrdma)),
        ("native-over-vrdma", (Impl::Vrdma, Impl::Native)),
        ("vrdma-over-vrdma", (Impl::Vrdma, Impl::Vrdma)),
    ];
    for (label, pair) in pairs {
        println!("== {label}: verified ping-pong");
        let mut rows = Vec::new();
        for (sizes, iters) in [
            (SMALL_SIZES, settings.small_iters),
            (LARGE_SIZES, settings.large_iters),
        ] {
            let plan = Plan {
                ops: VERIFY_OPS,
                sizes,
                iters,
                bw: false,
                oneway: false,
            };
            rows.extend(pingpong(
                binaries,
                &backend,
                pair,
                &plan,
                next_port(),
                label,
            )?);
        }
        let plan = Plan {
            ops: "write,send",
            sizes: "4096,65536,1048576",
            iters: settings.large_iters * 10,
            bw: true,
            oneway: false,
        };
        println!("== {label}: bandwidth");
        rows.extend(pingpong(
            binaries,
            &backend,
            pair,
            &plan,
            next_port(),
            label,
        )?);
        results.pingpong.insert(label.to_string(), rows);
    }

    println!("== UD: vrdma client, native server");
    let plan = Plan {
        ops: "ud_send",
        sizes: "1,64,512",
        iters: settings.small_iters,
        bw: false,
        oneway: false,
    };
    let rows = pingpong(
        binaries,
        &backend,
        (Impl::Native, Impl::Vrdma),
        &plan,
        next_port(),
        "ud",
    )?;
    results.pingpong.insert("ud-vrdma-over-native".into(), rows);

    println!("== data path without the backend");
    results.bypass_messages = bypass(binaries, &backend, next_port())?;

    println!("== isolation between guests");
    super::isolation::run(&backend.socket)?;

    println!(
        "== cleanup: {} vrdma processes killed mid-traffic",
        settings.cleanup_rounds
    );
    let (fds, rss) = cleanup(
        binaries,
        &backend,
        idle,
        settings.cleanup_rounds,
        &mut next_port,
    )?;
    results.cleanup_rounds = settings.cleanup_rounds;
    results.backend_fds = fds;
    results.backend_rss_kib = rss;

    drop(backend);
    if let Err(last) = wait_for_counts(DEVICE, idle, Duration::from_secs(30)) {
        return Err(Error::Scenario(format!(
            "after the backend exited {DEVICE} holds {last:?}, idle was {idle:?}"
        )));
    }
    Ok(results)
}

/// The vrdma server posts its receives and reports READY; the backend is then stopped and the
/// native client RDMA-WRITEs and SENDs one way. The vrdma server verifies every message with
/// the backend stopped; then the backend resumes and a normal exchange (vrdma sends) works.
fn bypass(binaries: &Binaries, backend: &Backend, port: u16) -> Result<u32> {
    const MESSAGES: u32 = 50;
    let plan = Plan {
        ops: "write,send,write_imm,send_imm",
        sizes: "64,4096,65536",
        iters: MESSAGES,
        bw: false,
        oneway: true,
    };
    let (mut server, mut client) = start_pair(
        binaries,
        backend,
        (Impl::Vrdma, Impl::Native),
        &plan,
        port,
        "bypass",
        &[],
    )?;
    // The vrdma side prints READY once its QP is connected and every receive is posted; only
    // then is the backend stopped, and only then does it let the client send.
    server.wait_for_output("READY", Duration::from_secs(120))?;
    backend.proc.signal("STOP")?;
    if backend.proc.state() != Some('T') {
        std::thread::sleep(Duration::from_millis(100));
    }
    let stopped = backend.proc.state() == Some('T');
    let go = bypass_start_file();
    std::fs::write(&go, b"go")
        .map_err(|e| Error::Scenario(format!("writing {}: {e}", go.display())))?;
    let outcome = client
        .wait_success(Duration::from_secs(300))
        .and_then(|()| server.wait_success(Duration::from_secs(60)));
    let still_stopped = backend.proc.state() == Some('T');
    backend.proc.signal("CONT")?;
    let _ = std::fs::remove_file(&go);
    outcome?;
    if !stopped || !still_stopped {
        return Err(Error::Scenario(
            "the backend was not stopped for the whole one-way run".into(),
        ));
    }
    println!("  ok: {MESSAGES} messages per op/size landed and completed with the backend stopped");
    // Resumed: the next send from vrdma works.
    let plan = Plan {
        ops: "send",
        sizes: "64",
        iters: 10,
        bw: false,
        oneway: false,
    };
    pingpong(
        binaries,
        backend,
        (Impl::Native, Impl::Vrdma),
        &plan,
        port + 1000,
        "after-bypass",
    )?;
    println!("  ok: after SIGCONT the next vrdma send works");
    Ok(MESSAGES)
}

fn bypass_start_file() -> PathBuf {
    std::env::temp_dir().join("vrdma-bypass-start")
}

/// Kills vrdma clients mid-traffic `rounds` times; every time the device returns to the
/// backend's idle counts. Returns the backend's fd count and RSS after the first and the last
/// round.
fn cleanup(
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
        let fds = backend.proc.fd_count().unwrap_or(0);
        let rss = backend.proc.rss_kib().unwrap_or(0);
        if round == 1 {
            first = (fds, rss);
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

/// A table of vrdma next to native for every (op, size) both ran.
pub fn render_comparison(results: &Results) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let native = results.pingpong.get("native-over-native");
    let _ = writeln!(
        out,
        "{:<10} {:>8} {:>5} {:>14} {:>14} {:>7} {:>12} {:>12} {:>7}",
        "op",
        "size",
        "mode",
        "native_lat_us",
        "vrdma_lat_us",
        "ratio",
        "native_MiB/s",
        "vrdma_MiB/s",
        "ratio"
    );
    let Some(native) = native else {
        return out;
    };
    for label in ["vrdma-over-native", "vrdma-over-vrdma"] {
        let Some(rows) = results.pingpong.get(label) else {
            continue;
        };
        let _ = writeln!(out, "-- {label} (client vrdma) vs native-over-native");
        for row in rows {
            let mode = if row.latency.is_some() { "pp" } else { "bw" };
            let Some(base) = native.iter().find(|n| {
                n.op == row.op && n.size == row.size && n.latency.is_some() == row.latency.is_some()
            }) else {
                continue;
            };
            let lat = |r: &PingpongRow| r.latency.as_ref().map(|l| l.typical_us);
            let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
                _ => "-".to_string(),
            };
            let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
            let _ = writeln!(
                out,
                "{:<10} {:>8} {:>5} {:>14} {:>14} {:>7} {:>12.2} {:>12.2} {:>7}",
                row.op,
                row.size,
                mode,
                show(lat(base)),
                show(lat(row)),
                ratio(lat(row), lat(base)),
                base.mib_s,
                row.mib_s,
                ratio(Some(row.mib_s), Some(base.mib_s))
            );
        }
    }
    out
}

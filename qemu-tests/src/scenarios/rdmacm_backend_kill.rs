//! A vrdma-backend SIGKILLed while rdma_cm connections are up, with Debian's unmodified `rping`
//! on both sides of each connection:
//! - a vrdma client pinging a native server, and a native client pinging a vrdma server, both
//!   through a backend of their own, plus a vrdma server that only listens;
//! - once both clients have pinged, the backend is killed (SIGKILL: nothing of it runs after).
//!
//! What must follow, within bounds: every rping ends. The idle vrdma listener, which nothing
//! but a connection-manager event can wake, prints rping's "cma detected device removal" (the
//! drop-in's `RDMA_CM_EVENT_DEVICE_REMOVAL` for every id when its transport fails); the vrdma
//! sides of the connections end with an error; the native peers see their connections end
//! (the kernel closes the dead backend's rdma_cm file, which destroys its ids and disconnects
//! them). `rdma resource show` returns to its counts from before, connection-manager ids
//! included. Then a new backend on the same socket serves a new vrdma rping as before.
//!
//! Before the kill, a second vrdma guest (another session of the backend, sharing the host's
//! address) tries to listen on the idle listener's port: its bind is refused as the kernel
//! refuses it (`EADDRINUSE`) and the first listener keeps its port.

use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::backend::Backend;
use super::rdmacm_utils::{command, link_local_address, marks, wait_cm_listening};
use crate::error::{Error, Result};
use crate::inside::{resource_counts, wait_for_counts, Proc, ResourceCounts, DEVICE};
use crate::perftest::Side;

/// Name (socket and log) of the backend that is killed, and of its successor.
const BACKEND: &str = "vrdma-rdmacm-kill";
/// Ports of the two connections, the idle listener and the run after the restart.
const PORTS: [u16; 4] = [7561, 7562, 7563, 7564];
/// What rping prints when its connection manager reports the device removed.
pub const DEVICE_REMOVAL: &str = "cma detected device removal";
/// Pings each client makes before the kill.
const PINGS_BEFORE: u32 = 5;
/// Bounds on every wait; none is reached when the code works.
const BOUND: Duration = Duration::from_secs(60);

/// How one rping process ended after the kill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ending {
    /// e.g. `vrdma client` (the role and which library it used).
    pub who: String,
    /// Its exit code (`None`: killed by a signal).
    pub exit_code: Option<i32>,
    /// The last line it printed.
    pub last_line: String,
    /// Whether it printed rping's device-removal line.
    pub saw_device_removal: bool,
}

/// What the scenario saw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KillReport {
    /// The device's objects before the backend started.
    pub before: ResourceCounts,
    /// Its objects with both connections up.
    pub connected: ResourceCounts,
    pub endings: Vec<Ending>,
    /// The second guest's rping on the listener's port: how it ended, and what it printed.
    pub port_taken: Ending,
    /// Milliseconds from the kill until the device's objects were back to `before`.
    pub release_ms: u64,
    /// The pings of the rping run through the new backend on the same socket.
    pub pings_after_restart: usize,
}

/// Runs the scenario with the drop-in in `library_dir`.
pub fn run(backend_binary: &Path, library_dir: &Path) -> Result<KillReport> {
    let address = link_local_address()?;
    let before = resource_counts(DEVICE)?;
    let mut backend = Backend::start(backend_binary, BACKEND, &[], "info")?;
    let native = Side::native(DEVICE);
    let vrdma = Side::over_dropin(&backend.socket, library_dir);
    let rping = |who: &str, side: &Side, server: bool, port: u16, count: Option<u32>| {
        let mut args: Vec<String> = vec![if server { "-s" } else { "-c" }.into(), "-v".into()];
        if let Some(count) = count {
            args.extend(["-C".into(), count.to_string()]);
        }
        args.extend(["-a".into(), address.clone(), "-p".into(), port.to_string()]);
        // Line-buffered: what the scenario waits for must not wait for a 4 KiB pipe buffer.
        Proc::spawn(
            &format!("kill-{who}"),
            &mut command("stdbuf -oL rping", side, &args),
        )
    };

    println!("== rping pairs through a backend that will be SIGKILLed");
    let mut procs = Vec::new();
    for (port, server_side, client_side, names) in [
        (PORTS[0], &native, &vrdma, ["native server", "vrdma client"]),
        (PORTS[1], &vrdma, &native, ["vrdma server", "native client"]),
    ] {
        let mut server = rping(&names[0].replace(' ', "-"), server_side, true, port, None)?;
        wait_cm_listening(&mut server, port, BOUND)?;
        let client = rping(&names[1].replace(' ', "-"), client_side, false, port, None)?;
        procs.push((names[0], server));
        procs.push((names[1], client));
    }
    let mut listener = rping("vrdma-listener", &vrdma, true, PORTS[2], None)?;
    wait_cm_listening(&mut listener, PORTS[2], BOUND)?;
    procs.push(("vrdma listener", listener));
    let mut second = rping("second-listener", &vrdma, true, PORTS[2], None)?;
    let status = wait_exit(&mut second, BOUND)?;
    let output = second.output();
    let port_taken = Ending {
        who: "second vrdma listener".into(),
        exit_code: status.code(),
        last_line: output
            .lines()
            .find(|l| l.contains("rdma_bind_addr"))
            .unwrap_or_else(|| output.lines().last().unwrap_or_default())
            .trim()
            .to_string(),
        saw_device_removal: output.contains(DEVICE_REMOVAL),
    };
    wait_cm_listening(
        &mut procs.last_mut().expect("the listener").1,
        PORTS[2],
        BOUND,
    )?;
    for (who, proc) in procs.iter_mut().filter(|(who, _)| who.ends_with("client")) {
        proc.wait_for_output(&format!("rdma-ping-{PINGS_BEFORE}:"), BOUND)
            .map_err(|e| Error::Scenario(format!("{who}: {e}")))?;
    }
    let connected = resource_counts(DEVICE)?;

    println!("== SIGKILL to the backend");
    backend.proc.kill();
    let killed = Instant::now();
    let mut endings = Vec::new();
    for (who, proc) in &mut procs {
        let status = wait_exit(proc, BOUND)?;
        let output = proc.output();
        endings.push(Ending {
            who: who.to_string(),
            exit_code: status.code(),
            last_line: output.lines().last().unwrap_or_default().trim().to_string(),
            saw_device_removal: output.contains(DEVICE_REMOVAL),
        });
    }
    wait_for_counts(DEVICE, before, BOUND).map_err(|last| {
        Error::Scenario(format!(
            "{DEVICE} holds {last:?} after the backend was killed, not {before:?}"
        ))
    })?;
    let release_ms = killed.elapsed().as_millis() as u64;

    println!("== a new backend on the same socket");
    let backend = Backend::start(backend_binary, BACKEND, &[], "info")?;
    let vrdma = Side::over_dropin(&backend.socket, library_dir);
    let mut server = rping("after-server", &native, true, PORTS[3], Some(3))?;
    wait_cm_listening(&mut server, PORTS[3], BOUND)?;
    let mut client = rping("after-client", &vrdma, false, PORTS[3], Some(3))?;
    client.wait_success(BOUND)?;
    server.wait_success(BOUND)?;
    let output = client.output();
    marks(&output, &[("ping data: rdma-ping-", 3)]).map_err(|why| client.failure(&why))?;
    let pings_after_restart = output
        .lines()
        .filter(|l| l.contains("ping data: rdma-ping-"))
        .count();
    Ok(KillReport {
        before,
        connected,
        endings,
        port_taken,
        release_ms,
        pings_after_restart,
    })
}

/// Waits for `proc` to exit, however it ends.
fn wait_exit(proc: &mut Proc, timeout: Duration) -> Result<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = proc.try_wait()? {
            return Ok(status);
        }
        if Instant::now() > deadline {
            return Err(proc.failure(&format!("still running {timeout:?} after the kill")));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The report as lines for the suite's output.
pub fn render(report: &KillReport) -> String {
    let mut out = format!(
        "backend SIGKILL with rdma_cm connections up: objects {:?} -> {:?}, back to before in \
         {} ms\n",
        report.before, report.connected, report.release_ms
    );
    for e in report.endings.iter().chain([&report.port_taken]) {
        out.push_str(&format!(
            "  {:<21} exit {:<5} {}\n",
            e.who,
            e.exit_code.map_or("sig".into(), |c| c.to_string()),
            e.last_line
        ));
    }
    out.push_str(&format!(
        "  after a restart on the same socket: {} pings verified\n",
        report.pings_after_restart
    ));
    out
}

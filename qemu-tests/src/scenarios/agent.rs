//! `agent`: many unprivileged processes through one guest agent (`vrdma-guestd`), process
//! mode, inside the rxe VM.
//!
//! One backend, whose socket only root can reach, and one agent in front of it, whose socket
//! belongs to group `nogroup` (mode 0660). Then, every application process running as user
//! `nobody` with no supplementary groups:
//! - access: a process of another user and group is refused by the socket's permissions, and
//!   `nobody` cannot reach the backend's socket directly;
//! - [`CONCURRENT`] vrdma-pingpong clients at once against as many native servers, every byte
//!   verified by both tools;
//! - Debian's unmodified perftest, server and client both over the drop-in through the agent;
//! - UCX, Open MPI over UCX and libfabric between native rxe0 and `nobody` over the agent
//!   (`discovery`, `mpi`, `libfabric`), in a container's mount namespace;
//! - rdmacm-utils' unmodified `rping -V` through the agent, as server and as client, against
//!   native rping on rxe0's link-local address;
//! - crash isolation: two processes hold a send each in RNR retry (their native peers post
//!   no receive until told to), a third is SIGKILLed in mid-traffic; the device returns to
//!   the counts it had before the third started, then the two are released and finish with
//!   every byte verified;
//! - handles: a process naming another process's objects gets BAD_HANDLE, and registering
//!   memory outside its own guest RAM BAD_ADDRESS;
//! - the backend SIGKILLed: the agent stays, tells a process that comes meanwhile that the
//!   device is not available, and serves the next one from a new backend on the same socket.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::inside::{
    resource_counts, rxe_counters, wait_for_counts, wait_for_path, Proc, ResourceCounts, DEVICE,
    NOBODY,
};
use crate::perftest::{self, Case, Side, Tool};
use crate::scenarios::backend::Backend;
use crate::scenarios::binaries::Binaries;
use crate::scenarios::pingpong_peer::{
    pingpong_command, read_report, vrdma_pingpong_command, Access, Impl, PingpongRow, Plan,
    PEER_TIMEOUT_S,
};
use crate::scenarios::rdmacm_utils;
use crate::scenarios::{discovery, isolation, libfabric, mpi, rdma_core_suite};

/// The loopback address rping meets itself on.
pub const LOOPBACK: &str = "127.0.0.1";

/// Application processes running ping-pongs through the agent at once.
pub const CONCURRENT: usize = 8;

/// A user in neither the agent's group nor any other.
const STRANGER: (u32, u32) = (4242, 4242);

/// What the ping-pongs run: every RC operation, small and page-sized messages, verified.
const PLAN: Plan<'static> = Plan {
    ops: "send,write,read",
    sizes: "64,4096",
    iters: 20,
    bw: false,
    oneway: false,
    timeout_s: PEER_TIMEOUT_S,
    tool_args: &[],
};

/// perftest through the agent: both sides are application processes of the agent.
const PERFTEST: Case = Case {
    tool: Tool::IbWriteBw,
    size: 65536,
    iterations: 200,
};

/// What the scenario saw.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentOutcome {
    /// Rows of each concurrent client's report.
    pub concurrent: Vec<Vec<PingpongRow>>,
    /// perftest's row.
    pub perftest: perftest::Row,
    /// rping through the agent as server, then as client, against native rping; then over
    /// [`LOOPBACK`] with both sides through the agent.
    pub rping: Vec<rdmacm_utils::Run>,
    /// Device counts with the two survivors running, with the victim too, and after its death.
    pub before_victim: ResourceCounts,
    pub with_victim: ResourceCounts,
    /// Rows of the two survivors, released after the victim's death.
    pub survivors: Vec<Vec<PingpongRow>>,
    /// What a stranger and `nobody` (at the backend's socket) were told.
    pub stranger_refusal: String,
    pub backend_refusal: String,
    /// What a process was told while the backend was down.
    pub backend_down_refusal: String,
    /// `ucx_info -d` natively and as `nobody` over the agent's published files.
    #[serde(default)]
    pub ucx: discovery::UcxListing,
    /// `ucx_perftest` between a native side and `nobody` over the agent, each side serving.
    #[serde(default)]
    pub ucx_traffic: Vec<discovery::UcxRun>,
    /// `fi_info -p verbs` natively and as `nobody` over the agent's published files.
    #[serde(default)]
    pub fabric: discovery::FabricListing,
    /// Open MPI jobs over UCX, a rank native or `nobody` over the agent, every byte checked.
    #[serde(default)]
    pub mpi: Vec<mpi::MpiRun>,
    /// fi_pingpong over libfabric's verbs MSG and `verbs;ofi_rxm` RDM endpoints, native and
    /// `nobody` over the agent.
    #[serde(default)]
    pub fabric_traffic: Vec<libfabric::FabricRun>,
    /// rdma-core's own test suite natively and as `nobody` over the agent.
    #[serde(default)]
    pub rdma_core: rdma_core_suite::RdmaCoreRuns,
}

/// Runs the scenario with the workspace's binaries and the drop-in in `library_dir`.
pub fn run(binaries: &Binaries, library_dir: &Path) -> Result<AgentOutcome> {
    let idle = resource_counts(DEVICE)?;
    let backend = start_backend(binaries)?;
    let agent_socket = std::env::temp_dir().join("vrdma-agent").join("agent.sock");
    let mut agent = start_agent(&binaries.agent, &backend.socket, &agent_socket)?;
    let mut port = 19000;
    let mut next_port = || {
        port += 1;
        port
    };

    println!("== access: the socket's permissions decide");
    let as_stranger = Access::Agent {
        socket: &agent_socket,
        user: STRANGER,
    };
    let stranger_refusal = refused(binaries, as_stranger, "Permission denied", next_port())?;
    let nobody_at_backend = Access::Backend {
        socket: &backend.socket,
        user: Some(NOBODY),
    };
    let backend_refusal = refused(
        binaries,
        nobody_at_backend,
        "Permission denied",
        next_port(),
    )?;

    println!("== {CONCURRENT} unprivileged processes at once through the agent");
    let concurrent = concurrent_pingpongs(binaries, &backend, &agent_socket, &mut next_port)?;

    println!("== perftest: server and client through the agent");
    let side = Side::through_agent(&agent_socket, library_dir, NOBODY.0, NOBODY.1);
    let perftest = perftest::run_case(&PERFTEST, &side, &side, next_port())?;
    if !perftest.measurement.completed() {
        return Err(Error::Scenario(format!(
            "perftest through the agent measured {:?}",
            perftest.measurement
        )));
    }

    println!("== discovery: UCX finds the device through what the agent published");
    wait_for_path(
        &discovery::published_node(&publish_dir(&agent_socket)),
        Duration::from_secs(30),
    )
    .map_err(|e| agent.failure(&e.to_string()))?;
    let ucx = discovery::ucx_listing(&publish_dir(&agent_socket), &agent_socket, library_dir)?;
    println!(
        "  ok: ucx_info -d lists {} natively and {} over vrdma",
        listed(&ucx.native, DEVICE),
        listed(&ucx.vrdma, crate::perftest::DROPIN_DEVICE)
    );
    let fabric =
        discovery::fabric_listing(&publish_dir(&agent_socket), &agent_socket, library_dir)?;
    println!(
        "  ok: fi_info -p verbs lists {} natively and {} over vrdma",
        fabric.native.len(),
        fabric.vrdma.len()
    );
    println!("== UCX traffic: ucx_perftest between native and nobody over the agent");
    let ucx_traffic = discovery::ucx_traffic(
        &publish_dir(&agent_socket),
        &agent_socket,
        library_dir,
        &mut next_port,
    )?;
    println!("== Open MPI over UCX: two ranks, native and nobody over the agent, data checked");
    let mpi = mpi::mpi_traffic(&publish_dir(&agent_socket), &agent_socket, library_dir)?;

    println!("== libfabric: fi_pingpong between native and nobody over the agent, data checked");
    let fabric_traffic = libfabric::fabric_traffic(
        &rdmacm_utils::link_local_address()?,
        &publish_dir(&agent_socket),
        &agent_socket,
        library_dir,
        &mut next_port,
    )?;

    println!("== rdma-core's own test suite: natively, then as nobody over the agent");
    let rdma_core = rdma_core_suite::run(&publish_dir(&agent_socket), &agent_socket, library_dir)?;
    println!("  {}", rdma_core_suite::summary(&rdma_core));

    println!("== rdma_cm: rping through the agent, both roles, against native rping");
    let address = rdmacm_utils::link_local_address()?;
    let rping = &rdmacm_utils::PROGRAMS[0];
    let native = Side::native(DEVICE);
    let mut rping_runs = Vec::new();
    for (server, client) in [(&side, &native), (&native, &side)] {
        rping_runs.push(rdmacm_utils::run_pair(
            rping,
            server,
            client,
            &address,
            next_port(),
        )?);
    }
    // Over loopback, both sides through the agent: loopback is the device's own address (spec
    // §7.5). (Natively rxe0 has no loopback: the kernel refuses to bind 127.0.0.1 on a RoCE
    // device, EADDRNOTAVAIL, as no GID holds it.)
    rping_runs.push(rdmacm_utils::run_pair(
        rping,
        &side,
        &side,
        LOOPBACK,
        next_port(),
    )?);

    println!("== crash isolation");
    let crash = crash_isolation(binaries, &backend, &agent_socket, &mut next_port)?;

    println!("== handles and memory of another process");
    isolation::run_through_agent(&agent_socket)?;

    println!("== the backend dies and a new one starts: the agent stays and serves again");
    let (backend, backend_down_refusal) =
        backend_restart(binaries, backend, &mut agent, &agent_socket, &mut next_port)?;

    drop(agent);
    drop(backend);
    if let Err(last) = wait_for_counts(DEVICE, idle, Duration::from_secs(30)) {
        return Err(Error::Scenario(format!(
            "after the agent and the backend exited {DEVICE} holds {last:?}, idle was {idle:?}"
        )));
    }
    Ok(AgentOutcome {
        concurrent,
        perftest,
        rping: rping_runs,
        before_victim: crash.before_victim,
        with_victim: crash.with_victim,
        survivors: crash.survivors,
        stranger_refusal,
        backend_refusal,
        backend_down_refusal,
        ucx,
        ucx_traffic,
        fabric,
        mpi,
        fabric_traffic,
        rdma_core,
    })
}

/// Where the agent started by [`start_agent`] publishes the device: beside its socket.
pub fn publish_dir(socket: &Path) -> PathBuf {
    socket.with_file_name("published")
}

/// The transports of `pairs` on `device`'s port 1, for a line of output.
fn listed(pairs: &[(String, String)], device: &str) -> String {
    let port = format!("{device}:1");
    let transports: Vec<&str> = pairs
        .iter()
        .filter(|(_, d)| *d == port)
        .map(|(t, _)| t.as_str())
        .collect();
    format!("{} on {port}", transports.join(", "))
}

/// Kills `backend`; a process that comes meanwhile is told the device is not available;
/// a new backend on the same socket serves the next process a verified ping-pong. Returns the
/// new backend and what the refused process printed.
fn backend_restart(
    binaries: &Binaries,
    mut backend: Backend,
    agent: &mut Proc,
    agent_socket: &Path,
    next_port: &mut dyn FnMut() -> u16,
) -> Result<(Backend, String)> {
    backend.proc.signal("KILL")?;
    backend.proc.kill();
    let access = Access::Agent {
        socket: agent_socket,
        user: NOBODY,
    };
    let refusal = refused(binaries, access, "the device is not available", next_port())?;
    if let Some(status) = agent.try_wait()? {
        return Err(agent.failure(&format!("the agent exited with its backend ({status})")));
    }
    let backend = start_backend(binaries)?;
    let (server, client, json) =
        start_agent_pair(binaries, &backend, agent_socket, &PLAN, &[], next_port())?;
    finish_pair(server, client, &json, &PLAN)?;
    println!("  ok: refused while the backend was down, served by the new one");
    Ok((backend, refusal))
}

/// Starts the scenario's backend, offering UD (UCX's wire-up runs over ud_verbs) and memory
/// windows (rdma-core's tests bind them; its one guest trusts itself, spec §12).
fn start_backend(binaries: &Binaries) -> Result<Backend> {
    Backend::start(
        &binaries.backend,
        "vrdma-agent-backend",
        &["--allow-ud", "--allow-memory-windows"],
        "info",
    )
}

/// Starts the agent `binary` for the backend at `backend` on `socket` (group `nogroup`, mode
/// 0660, 256 MiB of guest RAM per process (room for MPI's registered 4 MiB messages beside
/// UCX's own pools), publishing the device in [`publish_dir`]) and waits
/// until it listens.
pub fn start_agent(binary: &Path, backend: &Path, socket: &Path) -> Result<Proc> {
    let _ = std::fs::remove_file(socket);
    let mut cmd = Command::new(binary);
    cmd.arg("--backend")
        .arg(backend)
        .arg("--socket")
        .arg(socket)
        .args([
            "--group",
            "nogroup",
            "--mode",
            "660",
            "--guest-ram-mib",
            "256",
        ])
        .arg("--publish")
        .arg(publish_dir(socket))
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or("info".into()),
        );
    let mut agent = Proc::spawn("vrdma-guestd", &mut cmd)?;
    if let Err(e) = wait_for_path(socket, Duration::from_secs(30)) {
        let _ = agent.try_wait();
        return Err(agent.failure(&e.to_string()));
    }
    // The directory must let `nobody` reach the socket.
    let dir = socket.parent().unwrap_or(Path::new("/"));
    crate::host::run_checked(Command::new("chmod").arg("755").arg(dir))?;
    Ok(agent)
}

/// Runs a vrdma-pingpong client reaching the device by `access`; it must fail to open the
/// device and say `why`. Returns its last line.
fn refused(binaries: &Binaries, access: Access<'_>, why: &str, port: u16) -> Result<String> {
    let mut cmd = vrdma_pingpong_command(binaries, access, "client", port, &PLAN, None);
    let mut proc = Proc::spawn(&format!("agent-refused-{port}"), &mut cmd)?;
    let status = proc.wait_exit(Duration::from_secs(60))?;
    let output = proc.output();
    if status.success() || !output.contains(why) {
        return Err(proc.failure(&format!(
            "{access:?} was not refused with {why:?} ({status})"
        )));
    }
    println!("  ok: {access:?}: {why}");
    Ok(output.lines().last().unwrap_or_default().to_string())
}

/// A native server on `port` and an agent client (as `nobody`) with `plan`, started in order;
/// the client writes its report to the returned path.
fn start_agent_pair(
    binaries: &Binaries,
    backend: &Backend,
    agent_socket: &Path,
    plan: &Plan<'_>,
    server_args: &[&str],
    port: u16,
) -> Result<(Proc, Proc, PathBuf)> {
    let mut server_cmd =
        pingpong_command(binaries, backend, Impl::Native, "server", port, plan, None);
    server_cmd.args(server_args);
    let mut server = Proc::spawn(&format!("agent-{port}-server"), &mut server_cmd)?;
    server.wait_listening(port, Duration::from_secs(60))?;
    let json = std::env::temp_dir().join(format!("agent-{port}.json"));
    let _ = std::fs::remove_file(&json);
    let access = Access::Agent {
        socket: agent_socket,
        user: NOBODY,
    };
    let mut client_cmd = vrdma_pingpong_command(binaries, access, "client", port, plan, None);
    client_cmd.arg("--json").arg(&json);
    let client = Proc::spawn(&format!("agent-{port}-client"), &mut client_cmd)?;
    Ok((server, client, json))
}

/// The rows of a finished pair, once both exited 0; each must show [`PLAN`]'s iterations.
fn finish_pair(
    mut server: Proc,
    mut client: Proc,
    json: &Path,
    plan: &Plan<'_>,
) -> Result<Vec<PingpongRow>> {
    client.wait_success(Duration::from_secs(900))?;
    server.wait_success(Duration::from_secs(60))?;
    let rows = read_report(json)?;
    let expected = plan.ops.split(',').count() * plan.sizes.split(',').count();
    if rows.len() != expected || rows.iter().any(|r| r.iters != plan.iters) {
        return Err(client.failure(&format!(
            "expected {expected} rows of {} iterations, got {rows:?}",
            plan.iters
        )));
    }
    Ok(rows)
}

fn concurrent_pingpongs(
    binaries: &Binaries,
    backend: &Backend,
    agent_socket: &Path,
    next_port: &mut dyn FnMut() -> u16,
) -> Result<Vec<Vec<PingpongRow>>> {
    let mut pairs = Vec::new();
    for _ in 0..CONCURRENT {
        pairs.push(start_agent_pair(
            binaries,
            backend,
            agent_socket,
            &PLAN,
            &[],
            next_port(),
        )?);
    }
    let mut reports = Vec::new();
    for (server, client, json) in pairs {
        reports.push(finish_pair(server, client, &json, &PLAN)?);
    }
    println!("  ok: {CONCURRENT} processes, every byte verified");
    Ok(reports)
}

/// Waits until rxe0 has sent `count` more RNR NAKs than in `before`.
fn wait_for_rnr_naks(count: u64, before: &BTreeMap<String, u64>) -> Result<()> {
    let sent = |counters: &BTreeMap<String, u64>| counters.get("send_rnr_err").copied();
    let base = sent(before).unwrap_or(0);
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    loop {
        let now = sent(&rxe_counters()?).unwrap_or(0);
        if now >= base + count {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(Error::Scenario(format!(
                "{DEVICE} sent {} RNR NAKs, not {count}: the survivors have no send in flight",
                now - base
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct CrashOutcome {
    before_victim: ResourceCounts,
    with_victim: ResourceCounts,
    survivors: Vec<Vec<PingpongRow>>,
}

fn crash_isolation(
    binaries: &Binaries,
    backend: &Backend,
    agent_socket: &Path,
    next_port: &mut dyn FnMut() -> u16,
) -> Result<CrashOutcome> {
    // The survivors' native servers post no receive until the release file exists; their
    // clients retry on RNR for ever (rnr_retry 7), so each holds a send in flight however
    // long the victim's death takes.
    let release = std::env::temp_dir().join("agent-crash-release");
    let _ = std::fs::remove_file(&release);
    let release_arg = release.to_string_lossy().into_owned();
    let survivor_plan = Plan {
        ops: "send,write",
        sizes: "4096",
        iters: 20,
        // Longer than everything the step does before it releases them.
        timeout_s: 900,
        tool_args: &["--rnr-retry", "7"],
        ..PLAN
    };
    let server_args = [
        "--min-rnr-timer",
        "14",
        "--receives-after",
        release_arg.as_str(),
    ];
    let base_naks = rxe_counters()?;
    let mut survivors = Vec::new();
    for _ in 0..2 {
        let (server, mut client, json) = start_agent_pair(
            binaries,
            backend,
            agent_socket,
            &survivor_plan,
            &server_args,
            next_port(),
        )?;
        client.wait_for_output("RUNNING", Duration::from_secs(120))?;
        survivors.push((server, client, json));
    }
    // Both survivors have a send in flight once their peers' rxe NAKed at least twice each.
    wait_for_rnr_naks(2 * 2, &base_naks)?;
    let before_victim = resource_counts(DEVICE)?;

    let victim_plan = Plan {
        iters: 1_000_000,
        ..PLAN
    };
    let (mut victim_server, mut victim, _) = start_agent_pair(
        binaries,
        backend,
        agent_socket,
        &victim_plan,
        &[],
        next_port(),
    )?;
    victim.wait_for_output("RUNNING", Duration::from_secs(120))?;
    let with_victim = resource_counts(DEVICE)?;
    if with_victim.qp <= before_victim.qp {
        return Err(Error::Scenario(format!(
            "the victim's QPs do not show: {before_victim:?} then {with_victim:?}"
        )));
    }
    victim.signal("KILL")?;
    victim.kill();
    victim_server.kill();
    if let Err(last) = wait_for_counts(DEVICE, before_victim, Duration::from_secs(60)) {
        return Err(Error::Scenario(format!(
            "after the victim's death {DEVICE} holds {last:?}, before it {before_victim:?}"
        )));
    }
    println!("  ok: the victim's objects are gone ({with_victim:?} -> {before_victim:?})");
    for (_, client, _) in &mut survivors {
        if let Some(status) = client.try_wait()? {
            return Err(client.failure(&format!("a survivor exited ({status})")));
        }
    }
    std::fs::write(&release, b"")
        .map_err(|e| Error::Scenario(format!("creating {}: {e}", release.display())))?;
    let mut rows = Vec::new();
    for (server, client, json) in survivors {
        rows.push(finish_pair(server, client, &json, &survivor_plan)?);
    }
    println!("  ok: both survivors finished, every byte verified");
    Ok(CrashOutcome {
        before_victim,
        with_victim,
        survivors: rows,
    })
}

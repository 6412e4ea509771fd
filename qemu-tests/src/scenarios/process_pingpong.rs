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
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::backend::Backend;
use crate::error::{Error, Result};
use crate::inside::{resource_counts, wait_for_counts, Proc, ResourceCounts, DEVICE};
use crate::perftest::{self, Side};

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
    /// How the reporting side awaited completions ("poll" or "events"; vrdma only).
    pub completion: Option<String>,
    /// Completion events it received during the step (vrdma only).
    pub completion_events: Option<u64>,
    /// ARM_CQ commands it sent during the step (vrdma only).
    pub arms: Option<u64>,
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
    /// What the asynchronous-event step observed.
    pub async_event: Option<AsyncEventOutcome>,
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

    let backend = Backend::start(&binaries.backend, "vrdma-backend", &["--allow-ud"], "info")?;
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

    for (label, pair) in [
        ("events-vrdma-over-native", (Impl::Native, Impl::Vrdma)),
        ("events-vrdma-over-vrdma", (Impl::Vrdma, Impl::Vrdma)),
    ] {
        println!("== {label}: completion events instead of polling");
        let rows = completion_events(binaries, &backend, pair, settings, label, &mut next_port)?;
        results.pingpong.insert(label.to_string(), rows);
    }

    println!("== asynchronous event: RDMA WRITE with a wrong rkey");
    results.async_event = Some(async_event(&backend)?);

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

/// Runs verified ping-pongs (send, write, read) and a bandwidth stream between `pair`, with
/// every vrdma side waiting for completions by events (`--events`). Checks that the vrdma
/// client's rows, and a vrdma server's summary, say events were used and that they came
/// (in every step, and never more than ARM_CQ commands); returns the client's rows.
fn completion_events(
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
        },
        Plan {
            ops: "write,send",
            sizes: "4096,65536",
            iters: settings.large_iters * 10,
            bw: true,
            oneway: false,
        },
    ];
    let mut rows = Vec::new();
    for plan in &plans {
        let port = next_port();
        let json = std::env::temp_dir().join(format!("pingpong-{label}.json"));
        let _ = std::fs::remove_file(&json);
        let with_events = |which: Impl, role: &str| {
            let mut cmd = pingpong_command(binaries, backend, which, role, port, plan);
            if which == Impl::Vrdma {
                cmd.arg("--events");
            }
            cmd
        };
        let mut server = Proc::spawn(
            &format!("{label}-server"),
            &mut with_events(pair.0, "server"),
        )?;
        wait_listening(port, &mut server)?;
        let mut client_cmd = with_events(pair.1, "client");
        client_cmd.arg("--json").arg(&json);
        let mut client = Proc::spawn(&format!("{label}-client"), &mut client_cmd)?;
        client.wait_success(Duration::from_secs(900))?;
        server.wait_success(Duration::from_secs(60))?;
        let plan_rows = read_report(&json)?;
        for row in &plan_rows {
            if row.completion.as_deref() != Some("events")
                || row.completion_events.unwrap_or(0) == 0
            {
                return Err(client.failure(&format!(
                    "{label}: {} {} did not wait by events: {row:?}",
                    row.op, row.size
                )));
            }
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

/// An event by its spec name, with the object it names: ("CQ_ERR", "overflow CQ").
pub type NamedEvent = (String, String);

/// What the asynchronous-event step observed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AsyncEventOutcome {
    /// Completion status of the requester's RDMA WRITE with the wrong rkey.
    pub requester_status: String,
    /// The responder QP's state afterwards.
    pub responder_state: String,
    /// Asynchronous events the responder's context delivered, by name ("QP_ACCESS_ERR" …),
    /// with the object they named ("responder QP" …).
    pub responder_events: Vec<NamedEvent>,
    /// Asynchronous events the requester's context delivered.
    pub requester_events: Vec<NamedEvent>,
    /// Capacity of the CQ overflowed on purpose, and the receives flushed into it.
    pub overflow_cq_capacity: u32,
    pub overflow_receives: u32,
    /// Asynchronous events delivered after that overflow.
    pub overflow_events: Vec<NamedEvent>,
}

/// One vrdma guest (its own context on the backend) with an RC QP over rxe0.
struct AsyncSide {
    qp: vrdma::verbs::Qp,
    cq: vrdma::verbs::Cq,
    mr: vrdma::verbs::Mr<'static>,
    pd: vrdma::verbs::Pd,
    ctx: vrdma::verbs::Context,
    gid: vrdma::verbs::Gid,
    psn: u32,
}

fn verbs_err(what: &'static str) -> impl Fn(vrdma::verbs::VerbsError) -> Error {
    move |e| Error::Scenario(format!("{what}: {e}"))
}

impl AsyncSide {
    fn open(socket: &Path, psn: u32) -> Result<Self> {
        use vrdma::verbs::{AccessFlags, Context, Cq, Qp, QpCaps, QpInitAttr, QpType};
        let ctx = Context::connect_process(socket).map_err(verbs_err("opening vrdma"))?;
        let gid = ctx
            .query_gid(1, 0)
            .map_err(verbs_err("QUERY_GID"))?
            .ok_or_else(|| Error::Scenario("port 1 has no GID 0".into()))?
            .gid;
        let pd = ctx.alloc_pd().map_err(verbs_err("ALLOC_PD"))?;
        let buffer = ctx.alloc_buffer(4096).map_err(verbs_err("buffer"))?;
        let mr = pd
            .register_owned(buffer, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .map_err(verbs_err("REG_MR"))?;
        let cq = Cq::new(&ctx, 16).map_err(verbs_err("CREATE_CQ"))?;
        let qp = Qp::new(
            &pd,
            &QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                caps: QpCaps {
                    max_send_wr: 4,
                    max_recv_wr: 4,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            },
        )
        .map_err(verbs_err("CREATE_QP"))?;
        Ok(Self {
            qp,
            cq,
            mr,
            pd,
            ctx,
            gid,
            psn,
        })
    }

    fn connect(&self, peer: &AsyncSide) -> Result<()> {
        use vrdma::verbs::{ConnectOptions, RemoteQp};
        let opts = ConnectOptions {
            sq_psn: self.psn,
            max_rd_atomic: Some(1),
            max_dest_rd_atomic: Some(1),
            hop_limit: 1,
            ..ConnectOptions::default()
        };
        let remote = RemoteQp {
            qpn: peer.qp.qpn(),
            psn: peer.psn,
            gid: peer.gid,
            lid: 0,
        };
        self.qp
            .to_init(opts.port, opts.access)
            .map_err(verbs_err("QP to INIT"))?;
        self.qp
            .to_rtr(&remote, &opts)
            .map_err(verbs_err("QP to RTR"))?;
        self.qp.to_rts(&opts).map_err(verbs_err("QP to RTS"))
    }

    /// Posts a signaled 64-byte RDMA WRITE from the start of this side's buffer.
    ///
    /// The one `unsafe` of this crate: posting a send is unsafe because the device reads the
    /// SGE's memory later, which the harness needs for this single request.
    #[allow(unsafe_code)]
    fn post_write(&self, remote_addr: u64, rkey: u32) -> Result<()> {
        use vrdma::verbs::{SendFlags, SendWr, WrOpcode};
        let sge = [self.mr.sge(0, 64).expect("64 bytes fit the MR")];
        let wr = SendWr {
            wr_id: 1,
            opcode: WrOpcode::RdmaWrite,
            flags: SendFlags::SIGNALED,
            sg_list: &sge,
            remote_addr,
            rkey,
            ..SendWr::default()
        };
        // SAFETY: not inline, so nothing is read now; the SGE lies in the buffer that `self.mr`
        // owns and keeps registered, and `self` outlives the request (its QP is destroyed, so
        // the request flushed, before the MR and buffer are dropped).
        unsafe { self.qp.post_send(&[wr]) }
            .map_err(|e| Error::Scenario(format!("posting the RDMA WRITE: {e}")))
    }

    /// Polls the CQ for up to `timeout`.
    fn poll(&self, timeout: Duration) -> Option<vrdma::verbs::WorkCompletion> {
        let deadline = std::time::Instant::now() + timeout;
        let mut wc = [vrdma::verbs::WorkCompletion::default()];
        while std::time::Instant::now() < deadline {
            if self.cq.poll(&mut wc) == 1 {
                return Some(wc[0]);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    }

    /// Every asynchronous event this context delivers until `quiet` passes without one (or
    /// `total` is over), with the objects named after `names`.
    fn events(
        &self,
        quiet: Duration,
        total: Duration,
        names: &Names<'_>,
    ) -> Result<Vec<NamedEvent>> {
        let deadline = std::time::Instant::now() + total;
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match self
                .ctx
                .next_event(Some(left.min(quiet)))
                .map_err(verbs_err("waiting for an event"))?
            {
                Some(event) => seen.push(names.describe(&event)),
                None => break,
            }
        }
        Ok(seen)
    }
}

/// Names of the step's QPs and CQs, by guest handle.
struct Names<'a> {
    qps: Vec<(&'a str, u32)>,
    cqs: Vec<(&'a str, u32)>,
}

impl Names<'_> {
    /// An event's spec name and the object it names, e.g. ("QP_ACCESS_ERR", "responder QP").
    fn describe(&self, event: &vrdma::verbs::DeviceEvent) -> (String, String) {
        use vrdma::verbs::DeviceEvent as E;
        let name = |table: &[(&str, u32)], kind: &str, h: u32| {
            table
                .iter()
                .find(|(_, handle)| *handle == h)
                .map_or(format!("unknown {kind} {h:#x}"), |(n, _)| {
                    format!("{n} {kind}")
                })
        };
        let qp = |h| name(&self.qps, "QP", h);
        let cq = |h| name(&self.cqs, "CQ", h);
        let (event_name, subject) = match *event {
            E::QpFatal { qp: h } => ("QP_FATAL", qp(h)),
            E::QpRequestError { qp: h } => ("QP_REQ_ERR", qp(h)),
            E::QpAccessError { qp: h } => ("QP_ACCESS_ERR", qp(h)),
            E::CommunicationEstablished { qp: h } => ("COMM_EST", qp(h)),
            E::SqDrained { qp: h } => ("SQ_DRAINED", qp(h)),
            E::QpLastWqeReached { qp: h } => ("QP_LAST_WQE_REACHED", qp(h)),
            E::CqError { cq: h } => ("CQ_ERR", cq(h)),
            E::Completion { cq: h } => ("COMPLETION", cq(h)),
            other => return (format!("{other:?}"), String::new()),
        };
        (event_name.to_string(), subject)
    }
}

/// Asynchronous events on real rxe.
///
/// 1. Two guests, each with an RC QP on rxe0, connected to each other; the requester
///    RDMA-WRITEs to the responder with a wrong rkey. The requester's write completes with
///    REM_ACCESS_ERR and the responder's QP goes to the error state. rxe (6.12) raises no
///    asynchronous event for that on either side (no QP_ACCESS_ERR, no QP_FATAL): whatever
///    the contexts deliver is recorded, not required.
/// 2. The responder's guest overflows a CQ: a QP whose CQ holds `c` entries gets `c + 2`
///    receives and is moved to ERR, so rxe flushes them into the full CQ and raises
///    IB_EVENT_CQ_ERR. The guest's context must deliver CQ_ERR naming that CQ by its handle.
fn async_event(backend: &Backend) -> Result<AsyncEventOutcome> {
    use vrdma::verbs::{RecvWr, WcStatus};
    let requester = AsyncSide::open(&backend.socket, 0x1234)?;
    let responder = AsyncSide::open(&backend.socket, 0x5678)?;
    requester.connect(&responder)?;
    responder.connect(&requester)?;
    let recv_sge = [responder.mr.sge(0, 64).expect("64 bytes fit the MR")];
    responder
        .qp
        .post_recv(&[RecvWr {
            wr_id: 7,
            sg_list: &recv_sge,
        }])
        .map_err(|(_, e)| Error::Scenario(format!("posting a receive: {e}")))?;

    let wrong_rkey = responder.mr.rkey() ^ 0x00ff_ff00;
    requester.post_write(responder.mr.addr(), wrong_rkey)?;
    let wc = requester
        .poll(Duration::from_secs(30))
        .ok_or_else(|| Error::Scenario("the RDMA WRITE never completed".into()))?;

    let mut names = Names {
        qps: vec![
            ("requester", requester.qp.handle()),
            ("responder", responder.qp.handle()),
        ],
        cqs: vec![
            ("requester", requester.cq.handle()),
            ("responder", responder.cq.handle()),
        ],
    };
    let responder_events =
        responder.events(Duration::from_secs(2), Duration::from_secs(10), &names)?;
    let requester_events =
        requester.events(Duration::from_millis(500), Duration::from_secs(5), &names)?;
    let responder_state = responder
        .qp
        .state()
        .map_err(verbs_err("QUERY_QP of the responder"))?;
    println!("  requester WRITE completion: {:?}", wc.status);
    println!("  responder QP state: {responder_state:?}");
    println!("  responder events: {responder_events:?}");
    println!("  requester events: {requester_events:?}");
    if wc.status != WcStatus::RemAccessErr {
        return Err(Error::Scenario(format!(
            "the wrong-rkey WRITE completed with {:?}, expected RemAccessErr",
            wc.status
        )));
    }
    if responder_state != vrdma::verbs::QpState::Err {
        return Err(Error::Scenario(format!(
            "the responder's QP is {responder_state:?} after the access error, not Err"
        )));
    }

    let (capacity, receives, overflow_events) = overflow_cq(&responder, &mut names)?;
    println!("  CQ of {capacity} entries, {receives} receives flushed: events {overflow_events:?}");
    let outcome = AsyncEventOutcome {
        requester_status: format!("{:?}", wc.status),
        responder_state: format!("{responder_state:?}"),
        responder_events,
        requester_events,
        overflow_cq_capacity: capacity,
        overflow_receives: receives,
        overflow_events,
    };
    let expected = ("CQ_ERR".to_string(), "overflow CQ".to_string());
    if !outcome.overflow_events.contains(&expected) {
        return Err(Error::Scenario(format!(
            "the guest's context did not deliver {expected:?} after the overflow: {:?}",
            outcome.overflow_events
        )));
    }
    println!("  ok: the guest's context delivered {expected:?}");
    Ok(outcome)
}

/// Overflows a CQ of `side`'s guest (see [`async_event`]); returns its capacity, the
/// receives flushed into it and the events that followed.
fn overflow_cq(side: &AsyncSide, names: &mut Names<'_>) -> Result<(u32, u32, Vec<NamedEvent>)> {
    use vrdma::verbs::{AccessFlags, Cq, Qp, QpCaps, QpInitAttr, QpType, RecvWr};
    let cq = Cq::new(&side.ctx, 1).map_err(verbs_err("CREATE_CQ of 1 entry"))?;
    let capacity = cq.capacity();
    let receives = capacity + 2;
    let qp = Qp::new(
        &side.pd,
        &QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            caps: QpCaps {
                max_send_wr: 1,
                max_recv_wr: receives,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        },
    )
    .map_err(verbs_err("CREATE_QP on the small CQ"))?;
    qp.to_init(1, AccessFlags::LOCAL_WRITE)
        .map_err(verbs_err("QP to INIT"))?;
    let sge = [side.mr.sge(0, 64).expect("64 bytes fit the MR")];
    for wr_id in 0..u64::from(receives) {
        qp.post_recv(&[RecvWr {
            wr_id,
            sg_list: &sge,
        }])
        .map_err(|(_, e)| Error::Scenario(format!("posting receive {wr_id}: {e}")))?;
    }
    names.qps.push(("overflow", qp.handle()));
    names.cqs.push(("overflow", cq.handle()));
    qp.to_error().map_err(verbs_err("QP to ERR"))?;
    let events = side.events(Duration::from_secs(2), Duration::from_secs(10), names)?;
    Ok((capacity, receives, events))
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
    backend.proc.wait_state('T', Duration::from_secs(30))?;
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
    if !still_stopped {
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

//! `vrdma-ctlbench`: the vrdma side of `vrdma-vm bench`'s control-path and doorbell benches.
//!
//! Does through the vrdma verbs API (process transport) what the native
//! `qemu-tests/native/ctlbench.c` does through rdma-core on the host device — same objects,
//! sizes and attributes, same output — so that the two can be compared in one boot:
//!
//! * `control`: the time of each CREATE/DESTROY of a CQ and of a QP, of each QP transition
//!   RESET→INIT→RTR→RTS, and of registering and deregistering one large buffer (page list
//!   transfer and the backend's window mapping included);
//! * `scale`: with `--qps` RC QPs open (each connected to a peer QP of its own in the same
//!   context, loopback on the host device), the time of each `post_send` of a 64-byte RDMA
//!   WRITE — writing the WQE and ringing the doorbell — with the sends spread round robin over
//!   the QPs, and the time until all have completed.
//!
//! Output (stdout): one JSON object with raw samples in nanoseconds; the harness computes the
//! statistics.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use serde_json::json;

use vrdma::dma::RamPages;
use vrdma::spec::verbs::{QpAttrMask, QpState};
use vrdma::transport::process::{ProcessOptions, ProcessTransport};
use vrdma::verbs::{
    AccessFlags, ConnectOptions, Context, Cq, Gid, Pd, Qp, QpCaps, QpInitAttr, QpType, RemoteQp,
    SendFlags, SendWr, WcStatus, WorkCompletion, WrOpcode,
};

/// Entries of the CQs the control bench creates (as ctlbench.c's CTL_CQE).
const CTL_CQE: u32 = 64;
/// Queue depths of the QPs the control bench creates (as CTL_WR).
const CTL_WR: u32 = 16;
/// Most outstanding sends on one QP of the scale bench (as SCALE_QP_DEPTH).
const SCALE_QP_DEPTH: u32 = 16;
/// Guest RAM besides the control bench's MR: rings, command buffers, doorbell area.
const RAM_HEADROOM: usize = 64 << 20;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Time vrdma's control verbs and doorbell path (the vrdma side of `vrdma-vm bench`)"
)]
struct Cli {
    /// The vrdma backend's vhost-user socket (process transport).
    #[arg(long, env = "VRDMA_SOCKET")]
    socket: PathBuf,
    /// At most how many microseconds a control round trip polls for its answer before it
    /// sleeps (0: never polls); the library's default when absent.
    #[arg(long, env = "VRDMA_COMMAND_SPIN_US")]
    command_spin_us: Option<u64>,
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand, Debug)]
enum Bench {
    /// Time CQ and QP creation and destruction, QP transitions and MR registration.
    Control {
        /// Repetitions of the CQ and QP measurements.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
        reps: u32,
        /// Size of the registered buffer in bytes.
        #[arg(long, default_value_t = 256 << 20)]
        mr_bytes: usize,
        /// Repetitions of the registration.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
        mr_reps: u32,
        /// Make guest RAM of 2 MiB hugetlb pages (needs `vm.nr_hugepages` reserved) instead of
        /// ordinary pages.
        #[arg(long)]
        huge_pages: bool,
    },
    /// Time post_send with QPS QPs open.
    Scale {
        /// RC QPs that send (each has a peer QP in the same context).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65536))]
        qps: u32,
        /// Timed messages.
        #[arg(long, default_value_t = 4000, value_parser = clap::value_parser!(u32).range(1..))]
        messages: u32,
        /// Most messages in flight over all QPs.
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
        window: u32,
        /// Bytes per message.
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1048576))]
        size: u32,
        /// Once set up, create this file and wait for --start-file before the timed part
        /// (lines up several processes).
        #[arg(long, requires = "start_file")]
        ready_file: Option<PathBuf>,
        /// See --ready-file.
        #[arg(long, requires = "ready_file")]
        start_file: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    match run(&cli) {
        Ok(output) => {
            println!("{output}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("vrdma-ctlbench: error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> Result<serde_json::Value, String> {
    match &cli.bench {
        Bench::Control {
            reps,
            mr_bytes,
            mr_reps,
            huge_pages,
        } => {
            let pages = if *huge_pages {
                RamPages::Huge2M
            } else {
                RamPages::Small
            };
            let ctx = open(cli, mr_bytes.saturating_add(RAM_HEADROOM), pages)?;
            control(&ctx, *reps, *mr_bytes, *mr_reps, pages.size())
        }
        Bench::Scale {
            qps,
            messages,
            window,
            size,
            ready_file,
            start_file,
        } => {
            let ctx = open(cli, RAM_HEADROOM, RamPages::Small)?;
            let plan = ScalePlan {
                qps: *qps,
                messages: *messages,
                window: *window,
                size: *size,
            };
            let barrier = ready_file.as_deref().zip(start_file.as_deref());
            scale(&ctx, &plan, barrier)
        }
    }
}

/// Connects to the backend `cli` names with `ram` bytes of guest RAM made of `pages`.
fn open(cli: &Cli, ram: usize, pages: RamPages) -> Result<Context, String> {
    let socket = &cli.socket;
    let defaults = ProcessOptions::default();
    let ram = ram
        .max(defaults.guest_ram_size)
        .next_multiple_of(pages.size());
    let options = ProcessOptions {
        guest_ram_size: ram,
        guest_ram_pages: pages,
        command_spin: cli
            .command_spin_us
            .map_or(defaults.command_spin, Duration::from_micros),
        ..defaults
    };
    let transport = ProcessTransport::connect(socket, options)
        .map_err(|e| format!("connecting to {}: {e}", socket.display()))?;
    Context::open(Arc::new(transport)).map_err(|e| format!("opening the device: {e}"))
}

/// Nanoseconds `f` took, and what it returned.
fn timed<T>(f: impl FnOnce() -> T) -> (u64, T) {
    let start = Instant::now();
    let out = f();
    (nanos(start.elapsed()), out)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Named series of samples.
#[derive(Default)]
struct Samples(BTreeMap<&'static str, Vec<u64>>);

impl Samples {
    fn push(&mut self, name: &'static str, ns: u64) {
        self.0.entry(name).or_default().push(ns);
    }
}

/// GID 0 of port 1: where the loopback peers are.
fn local_gid(ctx: &Context) -> Result<Gid, String> {
    ctx.query_gid(1, 0)
        .map_err(|e| format!("querying GID 0: {e}"))?
        .map(|entry| Gid(entry.gid))
        .ok_or_else(|| "port 1 has no GID 0".to_string())
}

/// QPs each repetition of the setup measurement brings from nothing to RTS.
const SETUP_QPS: usize = 32;
/// Repetitions of the setup measurement.
const SETUP_REPS: usize = 3;

/// Brings SETUP_QPS QPs from nothing to RTS (each towards itself), one command at a time and
/// then in two batches (every CREATE_QP, then every INIT, RTR and RTS); records the time per
/// QP of each way as `setup_qp` and `setup_qp_batched`.
fn setup(
    pd: &Pd,
    cq: &Cq,
    gid: Gid,
    opts: &ConnectOptions,
    samples: &mut Samples,
) -> Result<(), String> {
    let to_self = |qp: &Qp| RemoteQp {
        qpn: qp.qpn(),
        psn: 0,
        gid,
        lid: 0,
    };
    let per_qp = |t: u64| t / SETUP_QPS as u64;
    for _ in 0..SETUP_REPS {
        let (t, qps) = timed(|| -> Result<Vec<Qp>, String> {
            let qps = (0..SETUP_QPS)
                .map(|_| rc_qp(pd, cq, CTL_WR, CTL_WR))
                .collect::<Result<Vec<Qp>, String>>()?;
            for qp in &qps {
                qp.connect(&to_self(qp), opts)
                    .map_err(|e| format!("connecting a QP: {e}"))?;
            }
            Ok(qps)
        });
        drop(qps?);
        samples.push("setup_qp", per_qp(t));

        let init = rc_init(cq, CTL_WR, CTL_WR);
        let (t, qps) = timed(|| -> Result<Vec<Qp>, String> {
            let qps = Qp::create_many(pd, &[init; SETUP_QPS])
                .map_err(|e| format!("creating QPs: {e}"))?
                .into_iter()
                .collect::<vrdma::verbs::Result<Vec<Qp>>>()
                .map_err(|e| format!("creating a QP of a batch: {e}"))?;
            let targets: Vec<(&Qp, RemoteQp)> = qps.iter().map(|qp| (qp, to_self(qp))).collect();
            for result in
                Qp::connect_many(&targets, opts).map_err(|e| format!("connecting: {e}"))?
            {
                result.map_err(|e| format!("connecting a QP of a batch: {e}"))?;
            }
            Ok(qps)
        });
        let qps = qps?;
        // The batch must have done what the single commands do.
        for qp in &qps {
            let (attr, _) = qp
                .query(QpAttrMask::STATE)
                .map_err(|e| format!("querying a QP: {e}"))?;
            if attr.qp_state.get() != QpState::Rts as u32 {
                return Err(format!(
                    "a batched QP ended in state {}",
                    attr.qp_state.get()
                ));
            }
        }
        drop(qps);
        samples.push("setup_qp_batched", per_qp(t));
    }
    Ok(())
}

fn rc_init(cq: &Cq, send_wr: u32, recv_wr: u32) -> QpInitAttr<'_> {
    QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        caps: QpCaps {
            max_send_wr: send_wr,
            max_recv_wr: recv_wr,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    }
}

fn rc_qp(pd: &Pd, cq: &Cq, send_wr: u32, recv_wr: u32) -> Result<Qp, String> {
    Qp::new(pd, &rc_init(cq, send_wr, recv_wr)).map_err(|e| format!("creating a QP: {e}"))
}

fn control(
    ctx: &Context,
    reps: u32,
    mr_bytes: usize,
    mr_reps: u32,
    mr_align: usize,
) -> Result<serde_json::Value, String> {
    let mut samples = Samples::default();
    let pd = ctx
        .alloc_pd()
        .map_err(|e| format!("allocating a PD: {e}"))?;
    let gid = local_gid(ctx)?;
    let opts = ConnectOptions::default();

    for _ in 0..reps {
        let (t, cq) = timed(|| Cq::new(ctx, CTL_CQE));
        let cq = cq.map_err(|e| format!("creating a CQ: {e}"))?;
        samples.push("create_cq", t);
        samples.push("destroy_cq", timed(|| drop(cq)).0);
    }

    let cq = Cq::new(ctx, CTL_CQE).map_err(|e| format!("creating a CQ: {e}"))?;
    for _ in 0..reps {
        let (t, qp) = timed(|| rc_qp(&pd, &cq, CTL_WR, CTL_WR));
        let qp = qp?;
        samples.push("create_qp", t);
        // Towards itself: the transition does the same work for any peer.
        let remote = RemoteQp {
            qpn: qp.qpn(),
            psn: 0,
            gid,
            lid: 0,
        };
        let transitions: [(&'static str, &dyn Fn() -> vrdma::verbs::Result<()>); 3] = [
            ("modify_init", &|| qp.to_init(opts.port, opts.access)),
            ("modify_rtr", &|| qp.to_rtr(&remote, &opts)),
            ("modify_rts", &|| qp.to_rts(&opts)),
        ];
        for (name, transition) in transitions {
            let (t, result) = timed(transition);
            result.map_err(|e| format!("{name}: {e}"))?;
            samples.push(name, t);
        }
        samples.push("destroy_qp", timed(|| drop(qp)).0);
    }
    setup(&pd, &cq, gid, &opts, &mut samples)?;
    drop(cq);

    // Aligned to guest RAM's pages, as native memory of huge pages is.
    let buffer = ctx
        .alloc_buffer_aligned(mr_bytes, mr_align)
        .map_err(|e| format!("allocating {mr_bytes} bytes: {e}"))?;
    // Fault the pages in first: the bench times registration, not page allocation.
    // SAFETY: the buffer is ours, `buffer.len()` bytes long and registered with nothing yet.
    unsafe { std::ptr::write_bytes(buffer.as_mut_ptr(), 0x5a, buffer.len()) };
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    for _ in 0..mr_reps {
        let (t, mr) = timed(|| pd.register(&buffer, access));
        let mr = mr.map_err(|e| format!("registering {mr_bytes} bytes: {e}"))?;
        samples.push("reg_mr", t);
        samples.push("dereg_mr", timed(|| drop(mr)).0);
    }
    Ok(json!({ "mr_bytes": buffer.len(), "samples_ns": samples.0 }))
}

/// What the scale bench sends.
struct ScalePlan {
    qps: u32,
    messages: u32,
    window: u32,
    size: u32,
}

/// Waits for one completion (busy polling) and returns the index of its QP.
fn reap(cq: &Cq, wc: &mut [WorkCompletion; 1]) -> Result<usize, String> {
    while cq.poll(wc) == 0 {
        std::hint::spin_loop();
    }
    let [wc] = wc;
    if wc.status != WcStatus::Success {
        return Err(format!(
            "a write on QP {} completed with {:?}",
            wc.wr_id, wc.status
        ));
    }
    usize::try_from(wc.wr_id).map_err(|_| format!("unexpected wr_id {}", wc.wr_id))
}

fn scale(
    ctx: &Context,
    plan: &ScalePlan,
    barrier: Option<(&Path, &Path)>,
) -> Result<serde_json::Value, String> {
    let setup_start = Instant::now();
    let n = plan.qps as usize;
    let size = plan.size as usize;
    let area = n * size;
    let pd = ctx
        .alloc_pd()
        .map_err(|e| format!("allocating a PD: {e}"))?;
    let gid = local_gid(ctx)?;
    let opts = ConnectOptions::default();
    // One MR: the first half holds the sources, the second the destinations.
    let buffer = ctx
        .alloc_buffer(2 * area)
        .map_err(|e| format!("allocating {} bytes: {e}", 2 * area))?;
    let mr = pd
        .register(
            &buffer,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .map_err(|e| format!("registering {} bytes: {e}", 2 * area))?;
    let send_cq = Cq::new(ctx, plan.window).map_err(|e| format!("creating the send CQ: {e}"))?;
    let peer_cq = Cq::new(ctx, 1).map_err(|e| format!("creating the peer CQ: {e}"))?;
    let mut qps = Vec::with_capacity(n);
    let mut peers = Vec::with_capacity(n);
    for _ in 0..n {
        qps.push(rc_qp(&pd, &send_cq, SCALE_QP_DEPTH, 1)?);
        peers.push(rc_qp(&pd, &peer_cq, 1, 1)?);
    }
    let remote = |qp: &Qp| RemoteQp {
        qpn: qp.qpn(),
        psn: 0,
        gid,
        lid: 0,
    };
    for (qp, peer) in qps.iter().zip(&peers) {
        qp.connect(&remote(peer), &opts)
            .map_err(|e| format!("connecting QP {}: {e}", qp.qpn()))?;
        peer.connect(&remote(qp), &opts)
            .map_err(|e| format!("connecting QP {}: {e}", peer.qpn()))?;
    }

    let write = |i: usize| -> Result<(u64, ()), String> {
        let sge = mr
            .sge(i * size, size)
            .ok_or_else(|| "source outside the MR".to_string())?;
        let sg_list = [sge];
        let wr = SendWr {
            wr_id: i as u64,
            opcode: WrOpcode::RdmaWrite,
            flags: SendFlags::SIGNALED,
            sg_list: &sg_list,
            remote_addr: mr.addr() + (area + i * size) as u64,
            rkey: mr.rkey(),
            ..SendWr::default()
        };
        let start = Instant::now();
        // SAFETY: not inline; the SGE lies in `mr`, which outlives every completion (all are
        // reaped before it is dropped).
        let result = unsafe { qps[i].post_send(std::slice::from_ref(&wr)) };
        let t = nanos(start.elapsed());
        result.map_err(|e| format!("posting a write on QP {i}: {e}"))?;
        Ok((t, ()))
    };

    let mut wc = [WorkCompletion::default()];
    // Warm-up: one message on every QP, so that first touches of queue pages are not timed.
    for i in 0..n {
        write(i)?;
        reap(&send_cq, &mut wc)?;
    }
    let setup_ns = nanos(setup_start.elapsed());
    if let Some((ready, start)) = barrier {
        std::fs::write(ready, b"").map_err(|e| format!("creating {}: {e}", ready.display()))?;
        while !start.exists() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    // Round robin over the QPs, at most `window` in flight, SCALE_QP_DEPTH per QP.
    let mut samples = Samples::default();
    let mut outstanding = vec![0u32; n];
    let mut in_flight = 0u32;
    let start = Instant::now();
    for m in 0..plan.messages as usize {
        let i = m % n;
        while in_flight >= plan.window || outstanding[i] >= SCALE_QP_DEPTH {
            outstanding[reap(&send_cq, &mut wc)?] -= 1;
            in_flight -= 1;
        }
        let (t, ()) = write(i)?;
        samples.push("post_send", t);
        outstanding[i] += 1;
        in_flight += 1;
    }
    while in_flight > 0 {
        outstanding[reap(&send_cq, &mut wc)?] -= 1;
        in_flight -= 1;
    }
    let elapsed_ns = nanos(start.elapsed());
    Ok(json!({
        "qps": plan.qps,
        "messages": plan.messages,
        "size": plan.size,
        "window": plan.window,
        "setup_ns": setup_ns,
        "elapsed_ns": elapsed_ns,
        "samples_ns": samples.0,
    }))
}

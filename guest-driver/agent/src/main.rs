//! `vrdma-guestd`: the guest agent. It alone drives the vrdma device and serves any number of
//! unprivileged application processes over a unix socket whose owner, group and mode decide
//! who may use RDMA. Control verbs go through it; each process's data path stays in that
//! process (see `vrdma::transport::agent`).
//!
//! Process mode (`--backend`): the agent opens one vhost-user session with the backend per
//! application process, so that each process has its own guest RAM, handle namespace, quotas
//! and host verbs context, all released by the backend when the process goes.
//!
//! VM mode (`--pci`): the agent drives the vrdma PCI function of the guest and shares it
//! among its processes, keeping their objects, memory and events apart itself
//! (see `shared_device`).

use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use clap::Parser;
use log::{error, info, warn};
use vrdma::transport::agent::DEFAULT_AGENT_SOCKET;
use vrdma_guestd::pin_budget::PinLimits;

mod admission;
mod discovery;
mod doorbell_pacing;
mod listener;
mod pinned;
mod reach;
mod refusals;
mod session;
mod shared_device;

use admission::Admission;
use refusals::{Refusals, QUEUED_REFUSALS};
use session::{Peer, SessionOptions};
use shared_device::{SharedDevice, SharedOptions};

/// The vrdma guest agent.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The vrdma backend's vhost-user socket (process mode: one session per application
    /// process).
    #[arg(
        long,
        env = "VRDMA_BACKEND_SOCKET",
        required_unless_present = "pci",
        conflicts_with = "pci"
    )]
    backend: Option<PathBuf>,

    /// Drive the guest's vrdma PCI function (VM mode: one device shared by every process),
    /// at this PCI address, or the first one found (no address, or `auto`).
    #[arg(
        long,
        env = "VRDMA_PCI_DEVICE",
        num_args = 0..=1,
        default_missing_value = "auto",
        value_name = "ADDRESS"
    )]
    pci: Option<String>,

    /// Where applications connect.
    #[arg(long, default_value = DEFAULT_AGENT_SOCKET)]
    socket: PathBuf,

    /// Group that owns the socket (its members may use RDMA).
    #[arg(long)]
    group: Option<String>,

    /// Mode of the socket (octal).
    #[arg(long, default_value = "660", value_parser = parse_mode)]
    mode: u32,

    /// Guest RAM of each application process (its registrable memory), in MiB. A memfd:
    /// only what the process touches costs memory; in VM mode the agent pins what its
    /// registrations cover, for as long as they live.
    #[arg(long, default_value_t = 1024)]
    guest_ram_mib: usize,

    /// VM mode: memory the registrations of all processes of one user may have pinned at
    /// once, in MiB [default: a quarter of the guest's RAM].
    #[arg(long, value_name = "MIB", conflicts_with = "backend")]
    max_pinned_mib_per_user: Option<u64>,

    /// VM mode: memory the agent pins for all processes' registrations at once, in MiB
    /// [default: half of the guest's RAM].
    #[arg(long, value_name = "MIB", conflicts_with = "backend")]
    max_pinned_mib: Option<u64>,

    /// VM mode: the least time between two notifications of the device's doorbell queue, in
    /// µs (asks that come sooner are served together at its end; 0: no pacing).
    #[arg(long, value_name = "US", default_value_t = doorbell_pacing::DEFAULT_MIN_INTERVAL.as_micros() as u64, conflicts_with = "backend")]
    doorbell_min_interval_us: u64,

    /// Where to publish what RDMA software reads to find the device (`/dev/infiniband/vrdma0`,
    /// `/sys/class/infiniband/vrdma0`): `system` (a tmpfs mounted over
    /// /sys/class/infiniband, which must exist and list no other device), a directory (for a
    /// container runtime to bind-mount its `class/infiniband` and `dev/infiniband/vrdma0`),
    /// or `none` [default: `system` in VM mode, `none` in process mode].
    #[arg(long, value_name = "WHERE")]
    publish: Option<String>,

    /// Application processes served at once; further ones are refused.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    max_processes: u32,

    /// Application processes of any one user served at once.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    max_processes_per_user: u32,
}

fn parse_mode(text: &str) -> Result<u32, String> {
    u32::from_str_radix(text, 8)
        .ok()
        .filter(|mode| *mode <= 0o777)
        .ok_or_else(|| format!("{text:?} is not an octal mode"))
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = Args::parse();
    if let Err(e) = run(&args) {
        error!("{e}");
        std::process::exit(1);
    }
}

/// Descriptors a session holds: the process's socket and event socket, the vhost-user
/// connection and backend channel, two guest-RAM memfds, six vring eventfds, epolls.
const FDS_PER_SESSION: u64 = 16;

/// Raises the soft limit on open files to the hard one, and says so if the limit cannot
/// hold `--max-processes` sessions.
fn raise_file_limit(max_processes: usize) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct on the stack.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return;
    }
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: setrlimit reads the struct on the stack.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        warn!(
            "cannot raise the open-file limit: {}",
            std::io::Error::last_os_error()
        );
    }
    let needed = (max_processes as u64).saturating_mul(FDS_PER_SESSION) + 64;
    if limit.rlim_cur < needed {
        warn!(
            "the open-file limit {} holds fewer than --max-processes {max_processes} sessions              (about {needed} descriptors); raise it (LimitNOFILE=) or lower --max-processes",
            limit.rlim_cur
        );
    }
}

/// The pin budgets of VM mode: the options, or their defaults from the guest's RAM.
fn pin_limits(args: &Args) -> Result<PinLimits, String> {
    let defaults = match (args.max_pinned_mib_per_user, args.max_pinned_mib) {
        (Some(_), Some(_)) => PinLimits::for_guest_ram(0),
        _ => PinLimits::for_guest_ram(guest_ram_bytes()?),
    };
    let mib = |value: Option<u64>, default: u64| {
        value.map_or(Ok(default), |mib| {
            mib.checked_mul(1 << 20)
                .ok_or_else(|| format!("{mib} MiB is not a size"))
        })
    };
    Ok(PinLimits {
        per_user: mib(args.max_pinned_mib_per_user, defaults.per_user)?,
        total: mib(args.max_pinned_mib, defaults.total)?,
    })
}

/// The guest's RAM (`MemTotal`).
fn guest_ram_bytes() -> Result<u64, String> {
    let meminfo =
        std::fs::read_to_string("/proc/meminfo").map_err(|e| format!("/proc/meminfo: {e}"))?;
    meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse::<u64>().ok())
        .map(|kib| kib << 10)
        .ok_or_else(|| "/proc/meminfo has no MemTotal".into())
}

/// Where the device is published.
enum Publish {
    System,
    Directory(PathBuf),
}

impl Publish {
    fn from_args(args: &Args) -> Option<Self> {
        match args.publish.as_deref() {
            Some("none") => None,
            Some("system") => Some(Publish::System),
            Some(dir) => Some(Publish::Directory(dir.into())),
            None if args.pci.is_some() => Some(Publish::System),
            None => None,
        }
    }
}

/// Publishes the device (what it says it is, asked through a session of the agent's own,
/// like any process's) and keeps it published for the agent's life. A failure is logged:
/// programs that look only through libibverbs still work.
fn publish(place: Publish, socket: PathBuf, pci_function: Option<PathBuf>) {
    let published = (|| -> Result<discovery::Publication, String> {
        let context = vrdma::Context::connect_agent(&socket)
            .map_err(|e| format!("cannot open a session of its own: {e}"))?;
        let facts = discovery::DeviceFacts::read(vrdma::DEVICE_NAME, &context)
            .map_err(|e| format!("cannot query the device: {e}"))?;
        drop(context);
        info!("{}", discovery::summary(&facts));
        let access = discovery::NodeAccess::of(&socket).map_err(|e| e.to_string())?;
        let function = pci_function.as_deref();
        match &place {
            Publish::System => discovery::Publication::system(&facts, function, access),
            Publish::Directory(dir) => {
                discovery::Publication::directory(dir, &facts, function, access)
            }
        }
        .map_err(|e| e.to_string())
    })();
    match published {
        // The agent runs until it is stopped; a restarted agent replaces what is left.
        Ok(publication) => std::mem::forget(publication),
        Err(e) => warn!("the device is not published for discovery: {e}"),
    }
}

/// How the agent serves each admitted process.
enum Server {
    /// A device session of its own.
    Sessions(Arc<SessionOptions>),
    /// The one shared device.
    Shared(Arc<SharedDevice>),
}

fn run(args: &Args) -> Result<(), String> {
    raise_file_limit(args.max_processes as usize);
    let guest_ram_size = args
        .guest_ram_mib
        .checked_mul(1 << 20)
        .filter(|size| *size > 0)
        .ok_or("--guest-ram-mib must be a positive size")?;
    let (server, device_name) = match (&args.backend, &args.pci) {
        (Some(backend), _) => {
            let options = SessionOptions {
                backend: backend.clone(),
                guest_ram_size,
            };
            // Fail at start, with the reason, rather than at each application's first verb.
            session::probe(&options).map_err(|e| {
                format!(
                    "the vrdma backend at {} is not usable: {e}",
                    backend.display()
                )
            })?;
            (
                Server::Sessions(Arc::new(options)),
                format!("the backend at {}", backend.display()),
            )
        }
        (None, pci) => {
            let address = pci.clone().filter(|a| !a.is_empty() && a != "auto");
            let options = SharedOptions {
                address,
                process_ram_size: guest_ram_size,
                quotas: Default::default(),
                pin_limits: pin_limits(args)?,
                doorbell_min_interval: Duration::from_micros(args.doorbell_min_interval_us),
            };
            info!(
                "pinned for registrations at most {} MiB per user, {} MiB in all",
                options.pin_limits.per_user >> 20,
                options.pin_limits.total >> 20
            );
            (
                Server::Shared(SharedDevice::open(&options)?),
                "the vrdma PCI device".to_string(),
            )
        }
    };
    let listener = listener::listen(&args.socket, args.group.as_deref(), args.mode)
        .map_err(|e| e.to_string())?;
    info!("serving {} for {device_name}", args.socket.display());
    if let Some(place) = Publish::from_args(args) {
        let socket = args.socket.clone();
        let function = match &server {
            Server::Shared(device) => Some(device.function_dir().to_path_buf()),
            Server::Sessions(_) => None,
        };
        // Its session is served by the loop below.
        thread::Builder::new()
            .name("discovery".into())
            .spawn(move || publish(place, socket, function))
            .map_err(|e| format!("cannot start the discovery thread: {e}"))?;
    }
    let admission = Admission::new(
        args.max_processes as usize,
        args.max_processes_per_user as usize,
    );
    let refusals = Refusals::start(QUEUED_REFUSALS)
        .map_err(|e| format!("cannot start the refusals thread: {e}"))?;
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(stream) => stream,
            Err(e) => {
                // Out of descriptors (or a transient failure): the connection stays queued;
                // wait for sessions to end instead of spinning on it.
                warn!("accept: {e}");
                thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let peer = match Peer::of(&stream) {
            Ok(peer) => peer,
            Err(e) => {
                warn!("SO_PEERCRED: {e}");
                continue;
            }
        };
        let ticket = match admission.admit(peer.uid) {
            Ok(ticket) => ticket,
            Err(why) => {
                warn!("process {} (uid {}) refused: {why}", peer.pid, peer.uid);
                // Not on this loop: a process that never says hello must not hold it up.
                refusals.refuse(stream, why.to_string());
                continue;
            }
        };
        let serve: Box<dyn FnOnce() + Send> = match &server {
            Server::Sessions(options) => {
                let options = options.clone();
                Box::new(move || session::serve(stream, peer, &options))
            }
            Server::Shared(device) => {
                let device = device.clone();
                Box::new(move || device.serve(stream, peer))
            }
        };
        // The ticket goes with the thread (or with the closure if no thread starts).
        let spawned = thread::Builder::new()
            .name(format!("process-{}", peer.pid))
            .spawn(move || {
                serve();
                drop(ticket);
            });
        if let Err(e) = spawned {
            warn!("cannot serve process {}: {e}", peer.pid);
        }
    }
    Ok(())
}

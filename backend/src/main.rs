//! vrdma-backend: the vhost-user daemon of the vrdma device (see spec/README.md).
//!
//! Serves every guest that connects to `--socket` from one host RDMA device, each with its own
//! host context, handle namespace and quotas, until SIGINT or SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use log::info;
use vrdma_backend::guest::device::GuestDeviceFactory;
use vrdma_backend::guest::options::{
    DeviceOptions, DEFAULT_DOORBELL_POLL_US, DEFAULT_MAX_MR_MAPPINGS, DEFAULT_SHM_SIZE,
};
use vrdma_backend::host::{HostDevice, RxeDevice};
use vrdma_backend::listener::Listener;
use vrdma_backend::memory::budget::{
    default_mapping_budget, default_pinned_budget, read_max_map_count, HostBudget, HostBudgetLimits,
};
use vrdma_backend::resources::quotas::Quotas;
use vrdma_spec::verbs::PortState;

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "vrdma-backend",
    version,
    about = "vhost-user back-end of the vrdma device"
)]
struct Args {
    /// Path of the vhost-user socket to listen on (a stale socket file is replaced).
    #[arg(long)]
    socket: PathBuf,
    /// Host RDMA device (default: the first one with an ACTIVE port).
    #[arg(long)]
    device: Option<String>,
    /// Host port exposed to guests as their port 1 (default: the first ACTIVE port).
    #[arg(long)]
    port: Option<u8>,
    /// Size of each guest's queue region in bytes (power of two; suffixes K, M, G).
    #[arg(long, value_parser = parse_size, default_value_t = DEFAULT_SHM_SIZE)]
    shm_size: u64,
    /// Most QPs per guest.
    #[arg(long)]
    max_qps: Option<u32>,
    /// Most CQs per guest.
    #[arg(long)]
    max_cqs: Option<u32>,
    /// Most MRs per guest.
    #[arg(long)]
    max_mrs: Option<u32>,
    /// Most bytes of all MRs of a guest together (suffixes K, M, G).
    #[arg(long, value_parser = parse_size)]
    max_mr_bytes: Option<u64>,
    /// Most memory mappings of all MR windows of a guest together: a window needs one per run
    /// of pages contiguous in guest RAM (default 16384).
    #[arg(long)]
    max_guest_mappings: Option<u32>,
    /// Most memory mappings of one MR's window; a REG_MR needing more is refused.
    #[arg(long, default_value_t = DEFAULT_MAX_MR_MAPPINGS)]
    max_mr_mappings: u32,
    /// Most memory mappings of all MR windows of all guests together (default: a quarter less
    /// than vm.max_map_count, which every mapping of the daemon counts against).
    #[arg(long)]
    max_mappings: Option<u64>,
    /// Most distinct guest bytes the MRs of all guests pin together (suffixes K, M, G; default:
    /// three quarters of RAM, and at most RLIMIT_MEMLOCK without CAP_IPC_LOCK).
    #[arg(long, value_parser = parse_size)]
    max_pinned_bytes: Option<u64>,
    /// Most PDs per guest.
    #[arg(long)]
    max_pds: Option<u32>,
    /// Most SRQs per guest.
    #[arg(long)]
    max_srqs: Option<u32>,
    /// Most address handles per guest.
    #[arg(long)]
    max_ahs: Option<u32>,
    /// Most memory windows per guest (with --allow-memory-windows).
    #[arg(long)]
    max_mws: Option<u32>,
    /// Offer unreliable-datagram QPs and address handles. UD sends go through a staging ring
    /// that the daemon checks (VRDMA_F_UD_STAGED_SQ, spec §9.6): a guest sends only through
    /// its own address handles.
    #[arg(long)]
    allow_ud: bool,
    /// With --allow-ud, also accept UD QPs of drivers that did not negotiate
    /// VRDMA_F_UD_STAGED_SQ. Their UD sends are not checked: on rxe such a guest can choose the
    /// source and destination addresses of its packets (spec §12). Only for trusted guests.
    #[arg(long, requires = "allow_ud")]
    allow_unenforced_ud: bool,
    /// Offer memory windows (ALLOC_MW, MW_BIND access, bind and invalidate work requests).
    /// rxe checks neither the MR of a bind nor the window of an invalidate against the
    /// binding QP's PD, so guests that all have this can reach each other's MRs that were
    /// registered with MW_BIND access (spec §12): only for guests that trust each other.
    #[arg(long)]
    allow_memory_windows: bool,
    /// After a doorbell, keep polling the guest's doorbell area for this many microseconds
    /// (restarted by every doorbell found, at most 8 windows per notification) while telling the
    /// guest not to notify (VRDMA_F_DOORBELL_POLL, spec §5.3); 0 turns polling off.
    #[arg(long, default_value_t = DEFAULT_DOORBELL_POLL_US)]
    doorbell_poll_us: u64,
}

/// Parses a byte count with an optional binary suffix (K, M, G).
fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, shift) = match text.char_indices().last() {
        Some((i, 'k' | 'K')) => (&text[..i], 10),
        Some((i, 'm' | 'M')) => (&text[..i], 20),
        Some((i, 'g' | 'G')) => (&text[..i], 30),
        _ => (text, 0),
    };
    let value: u64 = digits
        .parse()
        .map_err(|e| format!("{text:?} is not a byte count: {e}"))?;
    value
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

impl Args {
    fn options(&self, host_port: u8) -> DeviceOptions {
        let defaults = Quotas::default();
        let quotas = Quotas {
            pds: self.max_pds.unwrap_or(defaults.pds),
            mrs: self.max_mrs.unwrap_or(defaults.mrs),
            mr_bytes: self.max_mr_bytes.unwrap_or(defaults.mr_bytes),
            mappings: self.max_guest_mappings.unwrap_or(defaults.mappings),
            cqs: self.max_cqs.unwrap_or(defaults.cqs),
            qps: self.max_qps.unwrap_or(defaults.qps),
            srqs: self.max_srqs.unwrap_or(defaults.srqs),
            ahs: self.max_ahs.unwrap_or(defaults.ahs),
            mws: self.max_mws.unwrap_or(defaults.mws),
        };
        DeviceOptions {
            quotas,
            shm_size: self.shm_size,
            allow_ud: self.allow_ud,
            allow_unenforced_ud: self.allow_unenforced_ud,
            allow_memory_windows: self.allow_memory_windows,
            host_port,
            max_mr_mappings: self.max_mr_mappings,
            doorbell_poll: Duration::from_micros(self.doorbell_poll_us),
            ..DeviceOptions::default()
        }
    }
}

impl Args {
    /// The daemon-wide budgets of MR windows: the options given, else this host's defaults.
    fn budget_limits(&self) -> HostBudgetLimits {
        let max_map_count = read_max_map_count();
        let mappings = self
            .max_mappings
            .unwrap_or_else(|| default_mapping_budget(max_map_count));
        if mappings >= max_map_count {
            log::warn!(
                "--max-mappings {mappings} leaves nothing of vm.max_map_count {max_map_count} \
                 for the daemon's other mappings: a guest may make every mmap fail"
            );
        }
        HostBudgetLimits {
            mappings,
            pinned_bytes: self.max_pinned_bytes.unwrap_or_else(default_pinned_budget),
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    // Blocked before any thread exists, so every thread inherits the mask and only the
    // signal thread ever sees them.
    let signals = signals::block_termination().map_err(|e| format!("signal setup: {e}"))?;
    // Bad options are reported before the host is looked at.
    args.options(1).validate().map_err(|e| e.to_string())?;
    let device = RxeDevice::find_system(args.device.as_deref()).map_err(|e| e.to_string())?;
    let host_port = args.port.unwrap_or_else(|| {
        device
            .info()
            .ports
            .iter()
            .find(|p| p.state == PortState::Active)
            .map_or(1, |p| p.port)
    });
    let device: Arc<dyn HostDevice> = Arc::new(device);
    let options = args.options(host_port);
    let limits = args.budget_limits();
    info!(
        "MR windows of all guests: at most {} mappings and {} MiB pinned",
        limits.mappings,
        limits.pinned_bytes >> 20
    );
    let budget = Arc::new(HostBudget::new(limits));
    let factory = GuestDeviceFactory::with_budget(Arc::clone(&device), options, budget)
        .map_err(|e| e.to_string())?;
    let mut listener =
        Listener::bind(&args.socket, || factory.create()).map_err(|e| e.to_string())?;
    let stop = listener.stop_handle();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let signal = signals.wait();
            info!("signal {signal}: shutting down");
            stop.stop();
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    info!(
        "serving {} port {} on {} ({} MiB queue region per guest{})",
        device.info().name,
        factory.options().host_port,
        args.socket.display(),
        factory.options().shm_size >> 20,
        match (
            factory.options().allow_ud,
            factory.options().allow_memory_windows
        ) {
            (false, false) => "",
            (true, false) => ", UD allowed",
            (false, true) => ", memory windows allowed",
            (true, true) => ", UD and memory windows allowed",
        }
    );
    let result = listener.run().map_err(|e| e.to_string());
    if let Err(e) = std::fs::remove_file(&args.socket) {
        log::warn!("cannot remove {}: {e}", args.socket.display());
    }
    result
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vrdma-backend: {e}");
            ExitCode::FAILURE
        }
    }
}

/// SIGINT/SIGTERM, received synchronously by one thread.
mod signals {
    use std::io;

    /// The blocked termination signals.
    pub struct Termination {
        set: libc::sigset_t,
    }

    /// Blocks SIGINT and SIGTERM in the calling thread (and the threads it creates later).
    pub fn block_termination() -> io::Result<Termination> {
        // SAFETY: an all-zero sigset_t is a valid value to initialise with sigemptyset.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid sigset_t owned by this frame; these calls only write it.
        let ok = unsafe {
            libc::sigemptyset(&mut set) == 0
                && libc::sigaddset(&mut set, libc::SIGINT) == 0
                && libc::sigaddset(&mut set, libc::SIGTERM) == 0
        };
        if !ok {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `set` is initialised; a null old-set pointer is allowed.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(Termination { set })
    }

    impl Termination {
        /// Waits for one of the signals and returns its number.
        pub fn wait(&self) -> i32 {
            loop {
                let mut signal = 0;
                // SAFETY: `self.set` is an initialised sigset_t and `signal` a valid int.
                if unsafe { libc::sigwait(&self.set, &mut signal) } == 0 {
                    return signal;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("8k"), Ok(8192));
        assert!(parse_size("x").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999G").is_err());
    }

    #[test]
    fn mapping_and_pinned_limits_come_from_the_command_line() {
        let args = Args::parse_from([
            "vrdma-backend",
            "--socket=s",
            "--max-mappings=100",
            "--max-pinned-bytes=1G",
            "--max-guest-mappings=50",
            "--max-mr-mappings=10",
        ]);
        let limits = args.budget_limits();
        assert_eq!((limits.mappings, limits.pinned_bytes), (100, 1 << 30));
        let options = args.options(1);
        assert_eq!((options.quotas.mappings, options.max_mr_mappings), (50, 10));
        // Without them: this host's defaults, below vm.max_map_count.
        let defaults = Args::parse_from(["vrdma-backend", "--socket=s"]);
        assert!(defaults.budget_limits().mappings < read_max_map_count());
        assert_eq!(defaults.options(1), DeviceOptions::default());
    }
}

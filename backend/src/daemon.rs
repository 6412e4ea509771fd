//! The daemon: its command line ([`Args`]) and what [`run`] does with it. Serves guests from one host RDMA device, each with its own host context, handle namespace,
//! quotas and (with addresses) network identity, until SIGINT or SIGTERM: every guest that
//! connects to `--socket` (one named guest described by the command line), or the guests of a
//! `--config` file, each on its own socket.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{parse_addresses, parse_size, DaemonConfig, GuestConfig, GuestSettings};
use crate::guest::options::DeviceOptions;
use crate::guest_device::GuestDeviceFactory;
use crate::host::sysfs::SYSFS_ROOT;
use crate::host::{HostDevice, RxeDevice};
use crate::identity::endpoints::LocalEndpoints;
use crate::identity::netlink::NetlinkAddresses;
use crate::identity::provision::{self, ProvisionedAddresses, DEFAULT_GID_WAIT};
use crate::identity::GuestIdentity;
use crate::listener::{self, Listener};
use crate::memory::budget::{
    default_locked_budget, default_mapping_budget, default_pinned_budget, read_max_map_count,
    HostBudget, HostBudgetLimits,
};
use clap::Parser;
use log::info;
use vrdma_spec::verbs::PortState;

/// The daemon's command line.
#[derive(Debug, Parser)]
#[command(
    name = "vrdma-backend",
    version,
    about = "vhost-user back-end of the vrdma device"
)]
pub struct Args {
    /// Configuration file (TOML) describing every guest: its socket, addresses, quotas and
    /// policy (backend/README.md; example in backend/examples/guests.toml). Instead of
    /// --socket and the per-guest options.
    // Nothing that describes the one guest of `--socket` goes with it: a configuration file
    // describes each of its guests itself (the settings' groups are named after their types).
    #[arg(long, value_name = "FILE", conflicts_with_all = [
        "socket", "name", "address", "GuestSettings", "QuotaSettings", "PolicySettings",
    ])]
    config: Option<PathBuf>,
    /// Path of the vhost-user socket to listen on (a stale socket file is replaced).
    #[arg(long, required_unless_present = "config")]
    socket: Option<PathBuf>,
    /// Host RDMA device (default: the first one with an ACTIVE port).
    #[arg(long)]
    device: Option<String>,
    /// Host port exposed to guests as their port 1 (default: the first ACTIVE port).
    #[arg(long)]
    port: Option<u8>,
    /// Most memory mappings of all MR windows and staged queues of all guests together
    /// (default: a quarter less than vm.max_map_count, which every mapping of the daemon
    /// counts against).
    #[arg(long)]
    max_mappings: Option<u64>,
    /// Most distinct guest bytes the MRs of all guests pin together (suffixes K, M, G; default:
    /// three quarters of RAM).
    #[arg(long, value_parser = parse_size)]
    max_pinned_bytes: Option<u64>,
    /// Most bytes the MRs of all guests may make the kernel charge to the daemon's locked
    /// memory, every MR its pages, overlaps included (suffixes K, M, G; default: RLIMIT_MEMLOCK
    /// without CAP_IPC_LOCK, else no limit).
    #[arg(long, value_parser = parse_size)]
    max_locked_bytes: Option<u64>,
    /// Name of the guest of --socket (logs; its node GUID is derived from it when it has
    /// addresses).
    #[arg(long, default_value = "guest")]
    name: String,
    /// An RDMA address of the guest (IPv6 or IPv4, optionally with /prefix-length; repeat for
    /// more). The daemon adds it to the host port's netdev, waits for its GIDs and shows the
    /// guest only its own GID entries. Without any, the guest sees the host's whole GID table.
    #[arg(long = "address", value_name = "ADDR")]
    address: Vec<String>,
    /// Longest wait, in milliseconds, for the GID entries of an address the daemon added.
    #[arg(long, default_value_t = DEFAULT_GID_WAIT.as_millis() as u64)]
    gid_wait_ms: u64,
    /// The settings of the guest of --socket.
    #[command(flatten)]
    settings: GuestSettings,
}

impl Args {
    /// The options of the guest of --socket (identity included).
    fn options(&self) -> Result<DeviceOptions, String> {
        let (options, policy) = self.settings.options()?;
        Ok(DeviceOptions {
            identity: GuestIdentity {
                name: self.name.clone(),
                addresses: parse_addresses(&self.address)?,
                policy,
            },
            ..options
        })
    }

    /// What the daemon serves: the configuration file's guests, or the one guest of --socket.
    fn daemon_config(&self) -> Result<DaemonConfig, String> {
        if let Some(path) = &self.config {
            let mut config = DaemonConfig::load(path).map_err(|e| e.to_string())?;
            // The command line's device and port win over the file's.
            config.device = self.device.clone().or(config.device);
            config.port = self.port.or(config.port);
            return Ok(config);
        }
        let socket = self
            .socket
            .clone()
            .ok_or("--socket or --config is needed")?;
        let options = self.options()?;
        let config = DaemonConfig {
            device: self.device.clone(),
            port: self.port,
            gid_wait: Duration::from_millis(self.gid_wait_ms),
            guests: vec![GuestConfig { socket, options }],
        };
        config
            .validate()
            .map_err(|(place, message)| format!("{}{place}: {message}", "command line"))?;
        Ok(config)
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
            locked_bytes: self.max_locked_bytes.unwrap_or_else(default_locked_budget),
        }
    }
}

/// Serves what `args` describe until SIGINT or SIGTERM; the error says why it could not.
pub fn run(args: &Args) -> Result<(), String> {
    // Blocked before any thread exists, so every thread inherits the mask and only the
    // signal thread ever sees them.
    let signals = signals::block_termination().map_err(|e| format!("signal setup: {e}"))?;
    // Bad options are reported before the host is looked at.
    let mut config = args.daemon_config()?;
    let device = RxeDevice::find_system(config.device.as_deref()).map_err(|e| e.to_string())?;
    let host_port = config.port.unwrap_or_else(|| {
        device
            .info()
            .ports
            .iter()
            .find(|p| p.state == PortState::Active)
            .map_or(1, |p| p.port)
    });
    let device: Arc<dyn HostDevice> = Arc::new(device);
    let limits = args.budget_limits();
    info!(
        "MR windows and staged queues of all guests: at most {} mappings; MRs: at most {} MiB \
         pinned, {} locked",
        limits.mappings,
        limits.pinned_bytes >> 20,
        match limits.locked_bytes {
            u64::MAX => "no limit of".to_string(),
            bytes => format!("{} MiB", bytes >> 20),
        }
    );
    // One budget for every guest of every socket: the limits are the daemon's.
    let budget = Arc::new(HostBudget::new(limits));
    // One table of tenant addresses and QP numbers: a guest's QPs are reachable through its
    // addresses only, whichever socket the sender came through.
    let endpoints = LocalEndpoints::new();
    let mut factories = Vec::with_capacity(config.guests.len());
    for guest in &mut config.guests {
        guest.options.host_port = host_port;
        let factory = GuestDeviceFactory::with_daemon(
            Arc::clone(&device),
            guest.options.clone(),
            Arc::clone(&budget),
            Arc::clone(&endpoints),
        )
        .map_err(|e| format!("guest {}: {e}", guest.options.identity.name))?;
        factories.push(factory);
    }
    let addresses = provision_addresses(&config, &*device, host_port)?;
    let result = serve(&config, &factories, &device, signals);
    for guest in &config.guests {
        if let Err(e) = std::fs::remove_file(&guest.socket) {
            log::warn!("cannot remove {}: {e}", guest.socket.display());
        }
    }
    if let Some((netdev, added)) = addresses {
        added.release(&netdev);
    }
    result
}

/// Puts every guest's addresses on the host port's netdev and waits for their GIDs; `None`
/// when no guest has addresses.
fn provision_addresses(
    config: &DaemonConfig,
    device: &dyn HostDevice,
    host_port: u8,
) -> Result<Option<(NetlinkAddresses, ProvisionedAddresses)>, String> {
    if !config
        .guests
        .iter()
        .any(|g| g.options.identity.has_addresses())
    {
        return Ok(None);
    }
    let netdev = NetlinkAddresses::for_port(Path::new(SYSFS_ROOT), &device.info().name, host_port)
        .map_err(|e| e.to_string())?;
    let mut added = ProvisionedAddresses::none();
    for guest in &config.guests {
        let identity = &guest.options.identity;
        match provision::provision(
            &netdev,
            device,
            host_port,
            &identity.addresses,
            config.gid_wait,
        ) {
            Ok(more) => added.extend(more),
            Err(e) => {
                added.release(&netdev);
                return Err(format!("guest {}: {e}", identity.name));
            }
        }
    }
    Ok(Some((netdev, added)))
}

/// Serves every guest's socket until SIGINT or SIGTERM.
fn serve(
    config: &DaemonConfig,
    factories: &[GuestDeviceFactory],
    device: &Arc<dyn HostDevice>,
    signals: signals::Termination,
) -> Result<(), String> {
    let mut listeners = Vec::with_capacity(factories.len());
    for (guest, factory) in config.guests.iter().zip(factories) {
        let listener = Listener::bind(&guest.socket, || factory.create())
            .map_err(|e| format!("guest {}: {e}", guest.options.identity.name))?;
        listeners.push(listener);
    }
    let stops: Vec<_> = listeners.iter().map(Listener::stop_handle).collect();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let signal = signals.wait();
            info!("signal {signal}: shutting down");
            stops.iter().for_each(listener::StopHandle::stop);
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    for (guest, factory) in config.guests.iter().zip(factories) {
        let options = factory.options();
        info!(
            "serving guest {} from {} port {} on {} ({} MiB queue region{})",
            options.identity.name,
            device.info().name,
            options.host_port,
            guest.socket.display(),
            options.shm_size >> 20,
            match (options.allow_ud, options.allow_memory_windows) {
                (false, false) => "",
                (true, false) => ", UD allowed",
                (false, true) => ", memory windows allowed",
                (true, true) => ", UD and memory windows allowed",
            }
        );
    }
    listener::run_all(&mut listeners).map_err(|e| e.to_string())
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
    use crate::resources::quotas::Quotas;

    fn parse(line: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("vrdma-backend").chain(line.iter().copied()))
    }

    #[test]
    fn the_defaults_the_help_states_are_the_real_ones() {
        use clap::CommandFactory;
        let q = Quotas::default();
        let command = Args::command();
        let help = |id: &str| {
            let arg = command.get_arguments().find(|a| a.get_id() == id);
            arg.and_then(|a| a.get_help())
                .map(|h| h.to_string())
                .unwrap_or_default()
        };
        let d = DeviceOptions::default();
        for (id, value) in [
            ("qps", q.qps.to_string()),
            ("cqs", q.cqs.to_string()),
            ("mrs", q.mrs.to_string()),
            ("mr_bytes", format!("{}G", q.mr_bytes >> 30)),
            ("pds", q.pds.to_string()),
            ("srqs", q.srqs.to_string()),
            ("ahs", q.ahs.to_string()),
            ("mws", q.mws.to_string()),
            ("cm_ids", q.cm_ids.to_string()),
            ("mappings", q.mappings.to_string()),
            ("shm_size", format!("{}M", d.shm_size >> 20)),
            ("max_mr_pages", d.max_mr_pages.to_string()),
            ("max_mr_mappings", d.max_mr_mappings.to_string()),
            ("doorbell_poll_us", d.doorbell_poll.as_micros().to_string()),
        ] {
            assert!(
                help(id).contains(&format!("default {value})")),
                "{id}: {}",
                help(id)
            );
        }
    }

    #[test]
    fn the_single_socket_command_line_is_unchanged() {
        let args = parse(&[
            "--socket",
            "/tmp/v.sock",
            "--max-qps",
            "4",
            "--max-mr-bytes",
            "64M",
            "--allow-ud",
            "--shm-size",
            "16M",
            "--doorbell-poll-us",
            "20",
        ])
        .unwrap();
        let config = args.daemon_config().unwrap();
        assert_eq!((config.device, config.port), (None, None));
        let [guest] = &config.guests[..] else {
            panic!()
        };
        assert_eq!(guest.socket, Path::new("/tmp/v.sock"));
        let options = &guest.options;
        assert_eq!(
            *options,
            DeviceOptions {
                identity: options.identity.clone(),
                ..args.options().unwrap()
            }
        );
        assert_eq!((options.quotas.qps, options.quotas.mr_bytes), (4, 64 << 20));
        assert!(options.allow_ud);
        assert_eq!(options.shm_size, 16 << 20);
        // No addresses: no identity, the host's GID table as before.
        assert_eq!(options.identity, GuestIdentity::default());
        assert_eq!(config.gid_wait, DEFAULT_GID_WAIT);
    }

    #[test]
    fn one_named_guest_gets_addresses_and_policy_on_the_command_line() {
        let args = parse(&[
            "--socket",
            "/tmp/v.sock",
            "--name",
            "vm7",
            "--address",
            "fd00::7/64",
            "--address",
            "10.0.0.7",
            "--traffic-classes",
            "0,96",
            "--service-levels",
            "0-3",
            "--allow-destination",
            "fd00::/48",
            "--gid-wait-ms",
            "900",
        ])
        .unwrap();
        let config = args.daemon_config().unwrap();
        let identity = &config.guests[0].options.identity;
        assert_eq!(identity.name, "vm7");
        assert_eq!(identity.addresses.len(), 2);
        assert!(identity.policy.traffic_classes.contains(96));
        assert!(!identity.policy.traffic_classes.contains(1));
        assert!(identity.policy.service_levels.contains(3));
        assert!(!identity.policy.service_levels.contains(4));
        assert_eq!(identity.policy.destinations.as_ref().unwrap().len(), 1);
        assert_eq!(config.gid_wait, Duration::from_millis(900));

        let bad = |line: &[&str]| parse(line).unwrap().daemon_config().unwrap_err();
        assert!(bad(&["--socket", "/s", "--address", "nope"]).contains("address: \"nope\""));
        assert!(bad(&["--socket", "/s", "--service-levels", "16"]).contains("out of range"));
        assert!(bad(&["--socket", "/s", "--allow-destination", "::/200"]).contains("over 128"));
        assert!(bad(&["--socket", "/s", "--name", "a b"]).starts_with("command line: guest"));
    }

    #[test]
    fn a_config_file_replaces_the_per_guest_options() {
        let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/guests.toml");
        let args = parse(&["--config", example, "--port", "2"]).unwrap();
        let config = args.daemon_config().unwrap();
        assert_eq!(config.guests.len(), 3);
        assert_eq!(
            (config.device.as_deref(), config.port),
            (Some("rxe0"), Some(2))
        );
        for conflicting in [
            &["--config", example, "--socket", "/s"][..],
            &["--config", example, "--address", "fd00::1"],
            &["--config", example, "--max-qps", "3"],
        ] {
            let e = parse(conflicting).unwrap_err();
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::ArgumentConflict,
                "{conflicting:?}"
            );
        }
        assert_eq!(
            parse(&[]).unwrap_err().kind(),
            clap::error::ErrorKind::MissingRequiredArgument
        );
    }

    #[test]
    fn mapping_and_pinned_limits_come_from_the_command_line() {
        let args = Args::parse_from([
            "vrdma-backend",
            "--socket=s",
            "--max-mappings=100",
            "--max-pinned-bytes=1G",
            "--max-locked-bytes=2G",
            "--max-guest-mappings=50",
            "--max-mr-mappings=10",
        ]);
        let limits = args.budget_limits();
        assert_eq!(
            (limits.mappings, limits.pinned_bytes, limits.locked_bytes),
            (100, 1 << 30, 2 << 30)
        );
        let options = args.options().unwrap();
        assert_eq!((options.quotas.mappings, options.max_mr_mappings), (50, 10));
        // Without them: this host's defaults, below vm.max_map_count.
        let defaults = Args::parse_from(["vrdma-backend", "--socket=s"]);
        assert!(defaults.budget_limits().mappings < read_max_map_count());
        assert_eq!(defaults.options().unwrap(), DeviceOptions::default());
    }
}

//! `vrdma-vm`: builds and boots the Soft-RoCE VM that vrdma's RDMA tests run in.
//!
//! This file is the command line and its dispatch; the subcommands' bodies are in
//! [`vrdma_qemu_tests::cli`].

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use vrdma_qemu_tests::bench;
use vrdma_qemu_tests::cli::{
    self, agent, backend_device, dropin, native_perftest, perftest_over_vrdma, process_pingpong,
    qtest_pingpong, rdmacm_utils, real_guest, tenants, two_hosts, verbs_utils, vm_args::VmArgs,
};
use vrdma_qemu_tests::workspace;
use vrdma_qemu_tests::{Error, Result};

#[derive(Parser)]
#[command(version, about = "Soft-RoCE (rdma_rxe) test VM for vrdma")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build the VM's root file system into the cache (once; later runs return at once).
    Prepare {
        /// Rebuild even if a complete root exists.
        #[arg(long)]
        force: bool,
    },
    /// Boot the VM with rxe0 up and run CMD in it; exits with CMD's status.
    Run {
        #[command(flatten)]
        vm: VmArgs,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Run one of the VM test suites and print its results.
    Test {
        suite: Suite,
        #[command(flatten)]
        vm: VmArgs,
        /// Also write the results as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Use the workspace binaries as they are instead of building them first (for
        /// `cargo test`, which has built them and holds cargo's build lock).
        #[arg(long)]
        no_build: bool,
    },
    /// The demo: a real Linux guest under QEMU 11.1 with the vrdma device runs unmodified
    /// perftest and vrdma-pingpong against native peers, next to the same perftest natively;
    /// the backend stopped while traffic flows into the guest; a reboot with live RDMA objects.
    Demo {
        #[command(flatten)]
        vm: VmArgs,
        /// Use the workspace binaries as they are (see `test`).
        #[arg(long)]
        no_build: bool,
    },
    /// Benchmarks in one boot: perftest natively and over vrdma, control-path costs, doorbell
    /// cost with many QPs and guests; prints tables (and JSON with --json).
    Bench {
        #[command(flatten)]
        vm: VmArgs,
        #[command(flatten)]
        settings: bench::Settings,
        /// Also write the results (with machine info) as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Use the workspace binaries as they are (see `test`).
        #[arg(long)]
        no_build: bool,
    },
    /// Commands that run inside the VM (used by `test`).
    #[command(hide = true)]
    Guest {
        #[command(subcommand)]
        command: GuestCmd,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Suite {
    /// perftest's five main tools natively on rxe0: the baseline vrdma is compared against.
    NativePerftest,
    /// vrdma in process mode on rxe0 against native peers: verification, bypass, isolation,
    /// cleanup, and latency/bandwidth next to native.
    ProcessPingpong,
    /// The backend's host-device layer on rxe0 (its `device_rxe` integration tests, which
    /// `cargo test` builds but cannot run outside the VM).
    BackendDevice,
    /// The drop-in libibverbs.so.1: unmodified ibv_devinfo and a C verbs program (SEND, WRITE,
    /// READ with data checks) over vrdma, next to the same program on rxe0 natively.
    Dropin,
    /// Debian's unmodified perftest (five tools) natively, with the client over vrdma's drop-in
    /// libibverbs.so.1 (process transport) against a native server, and with both sides over
    /// vrdma, in one boot.
    PerftestOverVrdma,
    /// QEMU's vrdma device (vhost-user-test-device-pci on vrdma-backend) driven through qtest:
    /// the library over the PCI transport against native peers, every byte verified, a
    /// device reset and a QEMU kill in mid-traffic; and the README's QEMU command line.
    QtestPingpong,
    /// A real Linux guest under QEMU 11.1 with the vrdma device (KVM where it works, nested
    /// TCG otherwise): ibv_devinfo and unmodified perftest over the drop-in, vrdma-pingpong
    /// over the PCI transport, the bypass proof and a reboot with live objects, against
    /// native peers; the same perftest natively beside it.
    RealGuest,
    /// Debian's unmodified libibverbs examples (ibv_rc_pingpong with polling, with events and
    /// through the extended QP API (-N), ibv_uc_pingpong, ibv_ud_pingpong, ibv_srq_pingpong) over the drop-in against native peers
    /// both ways and vrdma to vrdma, received data checked by the programs (-c).
    VerbsUtils,
    /// Debian's unmodified librdmacm examples (rping -V, ucmatose, udaddy, rdma_server and
    /// rdma_client) over the drop-in librdmacm.so.1 against native peers both ways and vrdma
    /// to vrdma, on rxe0's link-local address.
    RdmacmUtils,
    /// One vrdma-backend serving three tenants with their own link-local addresses: unmodified
    /// examples between them, every attack of vrdma-hostile from one of them while another
    /// keeps passing verified ping-pongs, the addresses removed and rxe idle afterwards.
    Tenants,
    /// Two rxe hosts (VMs) joined by an Ethernet link, each with its own vrdma-backend:
    /// verified ping-pongs across it vrdma -> native, native -> vrdma and vrdma <-> vrdma, then
    /// under packet duplication (tc netem on both NICs); unmodified perftest across it (short
    /// cases); RNR retries; the link failing; the backend killed and restarted.
    TwoHosts,
    /// Many unprivileged processes through one guest agent (vrdma-guestd, process mode):
    /// socket permissions, 8 verified ping-pongs at once against native peers, unmodified
    /// perftest on both ends, a process killed in mid-traffic while two others hold sends in
    /// flight, and another process's handles refused.
    Agent,
    /// two-hosts, then 1 % and 5 % loss and reordering too, each next to a native baseline.
    TwoHostsFaults,
    /// Only the goodput streams of `vrdma-vm bench` across the two-host link (clean and 1 %
    /// loss, native and vrdma).
    TwoHostsGoodput,
    /// Debian's unmodified perftest across the two-host link: every baseline case, native on
    /// both hosts, vrdma as client, as server and on both ends, with ratios to native.
    TwoHostsPerftest,
}

#[derive(Subcommand)]
enum GuestCmd {
    /// Run the baseline perftest cases between two processes; results go to
    /// $VRDMA_RESULT_DIR/perftest.json.
    Perftest {
        #[arg(long, default_value = "rxe0")]
        device: String,
        #[arg(long, default_value_t = 18515)]
        port: u16,
    },
    /// The process-pingpong scenario; results go to $VRDMA_RESULT_DIR/process-pingpong.json.
    ProcessPingpong {
        /// The native C peer (built on the host).
        #[arg(long)]
        native: PathBuf,
        /// Rounds of the kill-mid-traffic cleanup check.
        #[arg(long, default_value_t = 50)]
        cleanup_rounds: u32,
    },
    /// The qtest-pingpong scenario; results go to $VRDMA_RESULT_DIR/qtest-pingpong.json.
    QtestPingpong {
        /// The native C peer (built on the host).
        #[arg(long)]
        native: PathBuf,
        /// Iterations per operation and size of the verified run.
        #[arg(long, default_value_t = 20)]
        iters: u32,
        /// CQ+QP pairs to create through QEMU (0: none).
        #[arg(long, default_value_t = 0)]
        qps: u32,
    },
    /// The real-guest suite's host side; results go to $VRDMA_RESULT_DIR/real-guest.json.
    RealGuest {
        /// The native C peer (built on the host).
        #[arg(long)]
        native: PathBuf,
        /// The prepared root file system (kernel, initramfs, tree) for the nested guest.
        #[arg(long)]
        root_dir: PathBuf,
        /// Directory with the drop-in as libibverbs.so.1.
        #[arg(long)]
        library_dir: PathBuf,
        /// The vrdma-guest Debian package, installed into the nested guest's root.
        #[arg(long)]
        guest_package: PathBuf,
        /// End with a reboot of the guest with a live application.
        #[arg(long)]
        reboot: bool,
    },
    /// Inside the nested guest: this boot's part of the real-guest suite.
    RealGuestInside {
        #[arg(long)]
        library_dir: PathBuf,
        /// Iterations per operation and size of the ping-pongs.
        #[arg(long)]
        iters: u32,
        /// End the first boot with a reboot with a live application.
        #[arg(long)]
        reboot: bool,
        /// The rxe VM's link-local address (the native rping server).
        #[arg(long)]
        rping_server: String,
    },
    /// The benchmarks; results go to $VRDMA_RESULT_DIR/bench.json.
    Bench(bench::GuestArgs),
    /// The perftest-over-vrdma scenario; results go to
    /// $VRDMA_RESULT_DIR/perftest-over-vrdma.json.
    PerftestOverVrdma {
        /// Directory with the drop-in as libibverbs.so.1.
        #[arg(long)]
        library_dir: PathBuf,
    },
    /// The verbs-utils scenario; results go to $VRDMA_RESULT_DIR/verbs-utils.json.
    VerbsUtils {
        /// Directory with the drop-in as libibverbs.so.1.
        #[arg(long)]
        library_dir: PathBuf,
    },
    /// The rdmacm-utils scenario; results go to $VRDMA_RESULT_DIR/rdmacm-utils.json.
    RdmacmUtils {
        /// Directory with the drop-in as libibverbs.so.1 and librdmacm.so.1.
        #[arg(long)]
        library_dir: PathBuf,
    },
    /// The agent scenario; results go to $VRDMA_RESULT_DIR/agent.json.
    Agent {
        /// The native C peer (built on the host).
        #[arg(long)]
        native: PathBuf,
        /// Directory with the drop-in as libibverbs.so.1.
        #[arg(long)]
        library_dir: PathBuf,
    },
    /// The tenants scenario; results go to $VRDMA_RESULT_DIR/tenants.json.
    Tenants {
        /// Directory with the drop-in as libibverbs.so.1.
        #[arg(long)]
        library_dir: PathBuf,
    },
    /// One host's half of the two-hosts suite; results go to
    /// $VRDMA_RESULT_DIR/two-hosts-HOST.json.
    TwoHosts {
        /// Which end of the link this VM is: a or b.
        #[arg(long)]
        host: String,
        /// The native C peer (built on the host).
        #[arg(long)]
        native: PathBuf,
        /// Directory with the drop-in as libibverbs.so.1.
        #[arg(long)]
        library_dir: PathBuf,
        /// Which steps to run.
        #[arg(long, value_enum, default_value = "short")]
        mode: two_hosts::Mode,
    },
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    match dispatch(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("vrdma-vm: error: {e}");
            match e {
                // The autotools convention for "skipped": tests outside CI may skip on it.
                Error::Prerequisite(_) => ExitCode::from(77),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

fn dispatch(command: Cmd) -> Result<ExitCode> {
    match command {
        Cmd::Prepare { force } => cli::prepare::prepare(force)?,
        Cmd::Run { vm, command } => return Ok(ExitCode::from(cli::run::run(&vm, &command)?)),
        Cmd::Test {
            suite,
            vm,
            json,
            no_build,
        } => {
            if suite.runs_workspace_binaries() {
                build_scenario_binaries(no_build)?;
            }
            match suite {
                Suite::NativePerftest => native_perftest::test(&vm, json)?,
                Suite::BackendDevice => backend_device::test(&vm)?,
                Suite::Dropin => dropin::test(&vm)?,
                Suite::ProcessPingpong => process_pingpong::test(&vm, json)?,
                Suite::PerftestOverVrdma => perftest_over_vrdma::test(&vm, json)?,
                Suite::QtestPingpong => qtest_pingpong::test(&vm, json)?,
                Suite::RealGuest => real_guest::test(&vm, json, true)?,
                Suite::VerbsUtils => verbs_utils::test(&vm, json)?,
                Suite::RdmacmUtils => rdmacm_utils::test(&vm, json)?,
                Suite::Tenants => tenants::test(&vm, json)?,
                Suite::TwoHosts => two_hosts::test(&vm, json, two_hosts::Mode::Short)?,
                Suite::TwoHostsFaults => two_hosts::test(&vm, json, two_hosts::Mode::Faults)?,
                Suite::Agent => agent::test(&vm, json)?,
                Suite::TwoHostsGoodput => two_hosts::test(&vm, json, two_hosts::Mode::Goodput)?,
                Suite::TwoHostsPerftest => two_hosts::test(&vm, json, two_hosts::Mode::Perftest)?,
            }
        }
        Cmd::Bench {
            vm,
            settings,
            json,
            no_build,
        } => {
            build_scenario_binaries(no_build)?;
            cli::bench::run(&vm, &settings, json)?;
        }
        Cmd::Demo { vm, no_build } => {
            build_scenario_binaries(no_build)?;
            // The reboot is a test of its own; the demo shows the guest's traffic.
            real_guest::test(&vm, None, false)?;
        }
        Cmd::Guest { command } => match command {
            GuestCmd::Perftest { device, port } => native_perftest::guest(&device, port)?,
            GuestCmd::ProcessPingpong {
                native,
                cleanup_rounds,
            } => process_pingpong::guest(native, cleanup_rounds)?,
            GuestCmd::PerftestOverVrdma { library_dir } => {
                perftest_over_vrdma::guest(&library_dir)?
            }
            GuestCmd::VerbsUtils { library_dir } => verbs_utils::guest(&library_dir)?,
            GuestCmd::RdmacmUtils { library_dir } => rdmacm_utils::guest(&library_dir)?,
            GuestCmd::Tenants { library_dir } => tenants::guest(&library_dir)?,
            GuestCmd::Agent {
                native,
                library_dir,
            } => agent::guest(native, &library_dir)?,
            GuestCmd::TwoHosts {
                host,
                native,
                library_dir,
                mode,
            } => two_hosts::guest(&host, &native, &library_dir, mode)?,
            GuestCmd::QtestPingpong { native, iters, qps } => {
                qtest_pingpong::guest(native, iters, qps)?
            }
            GuestCmd::RealGuest {
                native,
                root_dir,
                library_dir,
                guest_package,
                reboot,
            } => real_guest::guest(native, root_dir, library_dir, guest_package, reboot)?,
            GuestCmd::RealGuestInside {
                library_dir,
                iters,
                reboot,
                rping_server,
            } => real_guest::guest_inside(library_dir, iters, reboot, rping_server)?,
            GuestCmd::Bench(args) => cli::bench::guest(&args)?,
        },
    }
    Ok(ExitCode::SUCCESS)
}

impl Suite {
    /// Whether the suite runs the workspace's binaries (built first unless `--no-build`);
    /// native-perftest runs only Debian's perftest, backend-device the test binary that
    /// `cargo test` built.
    fn runs_workspace_binaries(self) -> bool {
        !matches!(self, Suite::NativePerftest | Suite::BackendDevice)
    }
}

/// Builds the binaries the scenarios run, unless `--no-build` says they are built already.
fn build_scenario_binaries(no_build: bool) -> Result<()> {
    if no_build {
        return Ok(());
    }
    workspace::build_scenario_binaries()
}

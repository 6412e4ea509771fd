//! `vrdma-vm`: builds and boots the Soft-RoCE VM that vrdma's RDMA tests run in.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use vrdma_qemu_tests::bench;
use vrdma_qemu_tests::cache::Cache;
use vrdma_qemu_tests::native;
use vrdma_qemu_tests::perftest::{self, Row, Side};
use vrdma_qemu_tests::rootfs::{self, PreparedRoot, TRIXIE_RXE};
use vrdma_qemu_tests::scenarios::{
    binaries, perftest_over_vrdma, process_pingpong, qtest_pingpong, readme_qemu, real_guest,
};
use vrdma_qemu_tests::vm::{self, shares_for, Accel, VmConfig};
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
    },
    /// The benchmarks; results go to $VRDMA_RESULT_DIR/bench.json.
    Bench(bench::GuestArgs),
    /// The perftest-over-vrdma scenario; results go to
    /// $VRDMA_RESULT_DIR/perftest-over-vrdma.json.
    PerftestOverVrdma {
        /// Directory with the drop-in as libibverbs.so.1 and the vendor library stand-ins.
        #[arg(long)]
        library_dir: PathBuf,
    },
}

#[derive(clap::Args)]
struct VmArgs {
    /// Give up after this many seconds [default: $VRDMA_VM_TIMEOUT or 1800].
    #[arg(long)]
    timeout: Option<u64>,
    /// Guest memory in MiB.
    #[arg(long)]
    memory: Option<u32>,
    /// Guest CPUs [default: host CPUs, at most 8].
    #[arg(long)]
    cpus: Option<u32>,
    /// Extra host directories to share read-only at the same path (the workspace and the
    /// target directory are always shared).
    #[arg(long)]
    share: Vec<PathBuf>,
}

impl VmArgs {
    fn config(&self, root: &PreparedRoot) -> Result<VmConfig> {
        let mut config = VmConfig::for_host(Accel::choose(root)?)?;
        if let Some(secs) = self.timeout {
            config.timeout = Duration::from_secs(secs);
        }
        if let Some(memory) = self.memory {
            config.memory_mib = memory;
        }
        if let Some(cpus) = self.cpus {
            config.cpus = cpus;
        }
        if !self.share.is_empty() {
            let mut paths: Vec<PathBuf> = config.shares.drain(..).map(|s| s.host_path).collect();
            for path in &self.share {
                paths.push(
                    path.canonicalize()
                        .map_err(|e| Error::Usage(format!("--share {}: {e}", path.display())))?,
                );
            }
            config.shares = shares_for(paths);
        }
        Ok(config)
    }
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
        Cmd::Prepare { force } => {
            let root = rootfs::prepare(&Cache::from_env()?, &TRIXIE_RXE, force)?;
            println!("{}", root.tree.display());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Run { vm, command } => {
            let root = rootfs::prepare(&Cache::from_env()?, &TRIXIE_RXE, false)?;
            let outcome = vm::run(&root, &vm.config(&root)?, &command)?;
            log::info!(
                "command exited with {} after {:.1?}",
                outcome.status,
                outcome.elapsed
            );
            Ok(ExitCode::from(u8::try_from(outcome.status).unwrap_or(1)))
        }
        Cmd::Test {
            suite,
            vm,
            json,
            no_build,
        } => match suite {
            Suite::NativePerftest => native_perftest(&vm, json),
            Suite::BackendDevice => backend_device(&vm),
            Suite::Dropin => {
                if !no_build {
                    vrdma_qemu_tests::workspace::build_scenario_binaries()?;
                }
                dropin(&vm)
            }
            Suite::ProcessPingpong => {
                if !no_build {
                    vrdma_qemu_tests::workspace::build_scenario_binaries()?;
                }
                process_pingpong(&vm, json)
            }
            Suite::PerftestOverVrdma => {
                if !no_build {
                    vrdma_qemu_tests::workspace::build_scenario_binaries()?;
                }
                perftest_over_vrdma(&vm, json)
            }
            Suite::QtestPingpong => {
                if !no_build {
                    vrdma_qemu_tests::workspace::build_scenario_binaries()?;
                }
                qtest_pingpong(&vm, json)
            }
            Suite::RealGuest => {
                if !no_build {
                    vrdma_qemu_tests::workspace::build_scenario_binaries()?;
                }
                real_guest(&vm, json, true)
            }
        },
        Cmd::Bench {
            vm,
            settings,
            json,
            no_build,
        } => run_bench(&vm, &settings, json, no_build),
        Cmd::Demo { vm, no_build } => {
            if !no_build {
                vrdma_qemu_tests::workspace::build_scenario_binaries()?;
            }
            // The reboot is a test of its own; the demo shows the guest's traffic.
            real_guest(&vm, None, false)
        }
        Cmd::Guest { command } => match command {
            GuestCmd::Perftest { device, port } => guest_perftest(&device, port),
            GuestCmd::ProcessPingpong {
                native,
                cleanup_rounds,
            } => guest_process_pingpong(native, cleanup_rounds),
            GuestCmd::PerftestOverVrdma { library_dir } => guest_perftest_over_vrdma(&library_dir),
            GuestCmd::QtestPingpong { native, iters } => guest_qtest_pingpong(native, iters),
            GuestCmd::RealGuest {
                native,
                root_dir,
                library_dir,
                reboot,
            } => guest_real_guest(native, root_dir, library_dir, reboot),
            GuestCmd::RealGuestInside {
                library_dir,
                iters,
                reboot,
            } => {
                let exe = std::env::current_exe()
                    .map_err(|e| Error::Usage(format!("current_exe: {e}")))?;
                let result_dir = std::env::var_os("VRDMA_RESULT_DIR")
                    .ok_or_else(|| Error::Usage("VRDMA_RESULT_DIR is not set".into()))?;
                let paths = real_guest::guest::GuestPaths {
                    pingpong: exe
                        .parent()
                        .unwrap_or(Path::new("."))
                        .join("vrdma-pingpong"),
                    library_dir,
                    result_dir: result_dir.into(),
                };
                real_guest::guest::run(&paths, iters, reboot)?;
                Ok(ExitCode::SUCCESS)
            }
            GuestCmd::Bench(args) => {
                let results = bench::run_in_guest(&args)?;
                deliver_results(bench::SUITE, &results, || {
                    bench::report::render_guest(&results)
                })
            }
        },
    }
}

fn run_bench(
    vm_args: &VmArgs,
    settings: &bench::Settings,
    json: Option<PathBuf>,
    no_build: bool,
) -> Result<ExitCode> {
    if !no_build {
        vrdma_qemu_tests::workspace::build_scenario_binaries()?;
    }
    let root = rootfs::prepare(&Cache::from_env()?, &TRIXIE_RXE, false)?;
    let mut config = vm_args.config(&root)?;
    config.echo = true;
    let (_, library) = dropin_library()?;
    // The guest's part is not copied to `json`: `write_json` adds the machine information.
    let results = bench::run_on_host(settings, &config, &library, |args| {
        run_guest_suite(&root, &config, bench::SUITE, args, None)
    })?;
    print!("{}", bench::report::render(&results));
    if let Some(path) = json {
        bench::write_json(&results, &path)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn native_perftest(vm_args: &VmArgs, json: Option<PathBuf>) -> Result<ExitCode> {
    let root = rootfs::prepare(&Cache::from_env()?, &TRIXIE_RXE, false)?;
    let mut config = vm_args.config(&root)?;
    config.echo = true;
    let (outcome, rows): (_, Vec<Row>) =
        run_guest_suite(&root, &config, "perftest", Vec::new(), json.as_deref())?;
    println!(
        "\nnative perftest on rxe0 ({:?}, {} vCPUs; VM run {:.0?}):",
        config.accel, config.cpus, outcome.elapsed
    );
    print!("{}", perftest::render_table(&rows));
    Ok(ExitCode::SUCCESS)
}

/// Runs `vrdma-vm guest SUITE ARGS…` (this executable) in the VM and returns the outcome and
/// the results the suite left as `SUITE.json`, a copy of which goes to `json` when asked.
fn run_guest_suite<T: serde::de::DeserializeOwned>(
    root: &PreparedRoot,
    config: &VmConfig,
    suite: &str,
    args: Vec<String>,
    json: Option<&Path>,
) -> Result<(vm::RunOutcome, T)> {
    let exe = std::env::current_exe().map_err(|e| Error::Usage(format!("current_exe: {e}")))?;
    let mut command = vec![
        exe.to_string_lossy().into_owned(),
        "guest".into(),
        suite.into(),
    ];
    command.extend(args);
    let outcome = vm::run(root, config, &command)?;
    if outcome.status != 0 {
        return Err(Error::Scenario(format!(
            "{suite} failed in the VM (status {})",
            outcome.status
        )));
    }
    let file = format!("{suite}.json");
    let data = outcome
        .results
        .iter()
        .find(|(name, _)| *name == file)
        .map(|(_, data)| data)
        .ok_or_else(|| Error::Scenario(format!("the VM left no {file}")))?;
    let results =
        serde_json::from_slice(data).map_err(|e| Error::Scenario(format!("{file}: {e}")))?;
    if let Some(path) = json {
        std::fs::write(path, data)
            .map_err(|e| Error::Usage(format!("writing {}: {e}", path.display())))?;
    }
    Ok((outcome, results))
}

/// Inside the VM: hands `results` to the host as `SUITE.json` in `$VRDMA_RESULT_DIR`; run by
/// hand (no result directory), prints `table()` instead.
fn deliver_results<T: serde::Serialize>(
    suite: &str,
    results: &T,
    table: impl FnOnce() -> String,
) -> Result<ExitCode> {
    match std::env::var_os("VRDMA_RESULT_DIR") {
        Some(dir) => {
            let json =
                serde_json::to_vec_pretty(results).map_err(|e| Error::Scenario(e.to_string()))?;
            std::fs::write(PathBuf::from(dir).join(format!("{suite}.json")), json)
                .map_err(|e| Error::Scenario(format!("writing results: {e}")))?
        }
        None => print!("{}", table()),
    }
    Ok(ExitCode::SUCCESS)
}

fn guest_perftest(device: &str, port: u16) -> Result<ExitCode> {
    let side = Side::native(device);
    let mut rows = Vec::new();
    for case in perftest::BASELINE {
        println!(
            "running {} size {} x{} …",
            case.tool.command(),
            case.size,
            case.iterations
        );
        rows.push(perftest::run_case(case, &side, &side, port)?);
    }
    deliver_results("perftest", &rows, || perftest::render_table(&rows))
}

fn process_pingpong(vm_args: &VmArgs, json: Option<PathBuf>) -> Result<ExitCode> {
    let root = rootfs::prepare(&Cache::from_env()?, &TRIXIE_RXE, false)?;
    let target = native::default_target_dir()
        .ok_or_else(|| Error::Usage("cannot find the cargo target directory".into()))?;
    let native_peer = native::build(&target)?;
    let config = vm_args.config(&root)?;
    let mut args = vec![
        "--native".into(),
        native_peer.to_string_lossy().into_owned(),
    ];
    if let Ok(rounds) = std::env::var("VRDMA_CLEANUP_ROUNDS") {
        args.extend(["--cleanup-rounds".into(), rounds]);
    }
    let (outcome, results): (_, process_pingpong::results::Results) =
        run_guest_suite(&root, &config, "process-pingpong", args, json.as_deref())?;
    println!(
        "\nvrdma process mode on rxe0 ({:?}, {} vCPUs; VM run {:.0?})",
        config.accel, config.cpus, outcome.elapsed
    );
    println!("\nnative perftest, same boot:");
    print!("{}", perftest::render_table(&results.perftest));
    println!("\nvrdma-pingpong, vrdma next to native (typical one-way latency; bandwidth):");
    print!("{}", process_pingpong::results::render_comparison(&results));
    println!(
        "\nbypass: {} messages per op/size delivered with the backend stopped; cleanup: {} kills, \
         backend fds {:?}, RSS {:?} KiB (first -> last)",
        results.bypass_messages,
        results.cleanup_rounds,
        results.backend_fds,
        results.backend_rss_kib
    );
    Ok(ExitCode::SUCCESS)
}

fn guest_process_pingpong(native: PathBuf, cleanup_rounds: u32) -> Result<ExitCode> {
    let binaries = binaries::Binaries::beside_current_exe(native)?;
    let settings = process_pingpong::settings::Settings {
        cleanup_rounds,
        ..Default::default()
    };
    let results = process_pingpong::run(&binaries, &settings)?;
    deliver_results("process-pingpong", &results, || {
        process_pingpong::results::render_comparison(&results)
    })
}

fn qtest_pingpong(vm_args: &VmArgs, json: Option<PathBuf>) -> Result<ExitCode> {
    let root = rootfs::prepare(&Cache::from_env()?, &TRIXIE_RXE, false)?;
    let target = native::default_target_dir()
        .ok_or_else(|| Error::Usage("cannot find the cargo target directory".into()))?;
    let native_peer = native::build(&target)?;
    let config = vm_args.config(&root)?;
    let args = vec![
        "--native".into(),
        native_peer.to_string_lossy().into_owned(),
    ];
    let (outcome, results): (_, qtest_pingpong::Results) =
        run_guest_suite(&root, &config, "qtest-pingpong", args, json.as_deref())?;
    let device = &results.device;
    println!(
        "\nvrdma over QEMU's device under qtest, on rxe0 ({:?}, {} vCPUs; VM run {:.0?})",
        config.accel, config.cpus, outcome.elapsed
    );
    println!(
        "device {} magic {:?}, {}; shared memory {:#x} bytes",
        device.function,
        device.magic,
        device.bars.join(", "),
        device.shared_memory_len
    );
    println!(
        "\nvrdma-pingpong, library over qtest next to the native pair (typical one-way latency):"
    );
    print!("{}", qtest_pingpong::render_comparison(&results));
    println!(
        "\nreset mid-traffic: run ended with \"{}\"; backend released everything in {} ms; \
         {} rows verified on a new context",
        results.reset.interrupted_run,
        results.reset.release_ms,
        results.reset.continued.len()
    );
    println!(
        "QEMU SIGKILLed mid-traffic: run ended with \"{}\"; rxe0 idle after {} ms",
        results.kill.interrupted_run, results.kill.release_ms
    );
    if let Some(readme) = &results.readme {
        println!(
            "README's QEMU command line: device {} up, shared-memory BAR of {} MiB",
            readme.id,
            readme.shm_bar_size >> 20
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn guest_qtest_pingpong(native: PathBuf, iters: u32) -> Result<ExitCode> {
    let binaries = qtest_pingpong::Binaries::beside_current_exe(native)?;
    let settings = qtest_pingpong::Settings { iters };
    let mut results = qtest_pingpong::run(&binaries, &settings)?;
    results.readme = Some(readme_qemu_check(&binaries.backend)?);
    deliver_results("qtest-pingpong", &results, || {
        qtest_pingpong::render_comparison(&results)
    })
}

/// Runs the README's QEMU command line (adapted to the VM) against a fresh backend.
fn readme_qemu_check(backend_binary: &Path) -> Result<readme_qemu::DeviceSeen> {
    println!("== the README's QEMU command line");
    let exe = std::env::current_exe().map_err(|e| Error::Usage(format!("current_exe: {e}")))?;
    let workspace = vm::find_workspace_root(&exe)
        .ok_or_else(|| Error::Usage("cannot find the workspace (and its README)".into()))?;
    let readme = std::fs::read_to_string(workspace.join("README.md"))
        .map_err(|e| Error::Scenario(format!("reading README.md: {e}")))?;
    let backend = vrdma_qemu_tests::scenarios::backend::Backend::start(
        backend_binary,
        "vrdma-readme-backend",
        &[],
        "info",
    )?;
    let args = readme_qemu::adapt(
        &readme_qemu::readme_command(&readme)?,
        &backend.socket,
        "512M",
    )?;
    let seen = readme_qemu::bring_up("qemu-system-x86_64", &args, Duration::from_secs(120))?;
    println!(
        "  ok: {} with a {} MiB shared-memory BAR",
        seen.id,
        seen.shm_bar_size >> 20
    );
    Ok(seen)
}

fn real_guest(vm_args: &VmArgs, json: Option<PathBuf>, reboot: bool) -> Result<ExitCode> {
    let root = rootfs::prepare(&Cache::from_env()?, &TRIXIE_RXE, false)?;
    let target = native::default_target_dir()
        .ok_or_else(|| Error::Usage("cannot find the cargo target directory".into()))?;
    let native_peer = native::build(&target)?;
    let (_, library) = dropin_library()?;
    let library_dir = perftest_over_vrdma::prepare_library_dir(&target, &library)?;
    let root_dir = root
        .tree
        .parent()
        .ok_or_else(|| Error::Usage("the root file system has no parent directory".into()))?
        .to_path_buf();
    let mut config = vm_args.config(&root)?;
    let mut shares: Vec<PathBuf> = config.shares.drain(..).map(|s| s.host_path).collect();
    shares.push(root_dir.clone());
    config.shares = shares_for(shares);
    let mut args = vec![
        "--native".into(),
        native_peer.to_string_lossy().into_owned(),
        "--root-dir".into(),
        root_dir.to_string_lossy().into_owned(),
        "--library-dir".into(),
        library_dir.to_string_lossy().into_owned(),
    ];
    if reboot {
        args.push("--reboot".into());
    }
    let (outcome, report): (_, real_guest::Report) =
        run_guest_suite(&root, &config, "real-guest", args, json.as_deref())?;
    println!(
        "\n== vrdma in a real guest: Linux under QEMU 11.1 ({} guest inside the {:?} rxe VM; \
         guest {:.0} s, VM run {:.0?})",
        report.accel, config.accel, report.elapsed_secs, outcome.elapsed
    );
    println!(
        "\nunmodified perftest: server in the guest over vrdma's drop-in libibverbs.so.1 (PCI \
         transport), native client measuring, next to both sides native on rxe0 (latency: \
         typical µs, lower is better; bandwidth: MiB/s, higher is better):"
    );
    print!("{}", real_guest::render_comparison(&report.perftest));
    if report.accel == "Tcg" {
        println!(
            "(the guest's CPU is emulated inside an emulated CPU: its latency says how slow \
             nested TCG is, not vrdma; the bandwidth is the NIC's DMA into guest pages)"
        );
    }
    println!(
        "\nvrdma-pingpong --pci in the guest against the native peer, every byte verified:\n{}",
        report.first_boot.pingpong.trim_end()
    );
    println!(
        "\nbypass: backend stopped (SIGSTOP); {} messages per op and size written and sent into \
         the guest and verified there",
        report.first_boot.bypass_messages
    );
    println!(
        "\nwhere the guest's time went: {}",
        real_guest::render_phases(&report.first_boot.phases)
    );
    if let Some(reboot) = &report.reboot {
        println!(
            "\nreboot -f with a live application ({} QPs, {} MRs on rxe0): QEMU stayed up, rxe0 \
             idle {} ms after the new boot reported, and the ping-pong ran again:\n{}",
            reboot.live.qp,
            reboot.live.mr,
            reboot.release_ms,
            reboot.after.pingpong.trim_end()
        );
        println!(
            "the boot after the reboot: {}",
            real_guest::render_phases(&reboot.after.phases)
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn guest_real_guest(
    native: PathBuf,
    root_dir: PathBuf,
    library_dir: PathBuf,
    reboot: bool,
) -> Result<ExitCode> {
    let binaries = binaries::Binaries::beside_current_exe(native)?;
    let nested_tcg = !std::env::var("VRDMA_GUEST_ACCEL").is_ok_and(|a| a == "kvm");
    let settings = real_guest::Settings {
        root_dir,
        library_dir,
        iters: if nested_tcg { 5 } else { 50 },
        reboot,
        timeout: Duration::from_secs(3000),
    };
    let report = real_guest::host::run(&binaries, &settings)?;
    deliver_results("real-guest", &report, || {
        real_guest::render_comparison(&report.perftest)
    })
}

fn backend_device(vm_args: &VmArgs) -> Result<ExitCode> {
    let root = rootfs::prepare(&Cache::from_env()?, &TRIXIE_RXE, false)?;
    let test = vrdma_qemu_tests::workspace::newest_test_binary("device_rxe")?;
    let config = vm_args.config(&root)?;
    let command = vec![
        test.to_string_lossy().into_owned(),
        "--ignored".into(),
        "--test-threads=1".into(),
        // The VM's serial console is a terminal; keep escape codes out of the host's logs.
        "--color=never".into(),
    ];
    let outcome = vm::run(&root, &config, &command)?;
    if outcome.status != 0 {
        return Err(Error::Scenario(format!(
            "{} failed in the VM (status {})",
            test.display(),
            outcome.status
        )));
    }
    Ok(ExitCode::SUCCESS)
}

/// The drop-in library as cargo names it (installed as libibverbs.so.1).
const DROPIN_LIBRARY: &str = "libvrdma_ibverbs.so";

/// The profile directory of this executable and the drop-in library cargo built there.
fn dropin_library() -> Result<(PathBuf, PathBuf)> {
    let exe = std::env::current_exe().map_err(|e| Error::Usage(format!("current_exe: {e}")))?;
    let profile_dir = exe.parent().unwrap_or(Path::new(".")).to_path_buf();
    // `cargo build` puts the cdylib next to the binaries; `cargo test` leaves it in deps/.
    let library = [
        profile_dir.join(DROPIN_LIBRARY),
        profile_dir.join("deps").join(DROPIN_LIBRARY),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .ok_or_else(|| {
        Error::Usage(format!(
            "no {DROPIN_LIBRARY} in {}: build the workspace first",
            profile_dir.display()
        ))
    })?;
    Ok((profile_dir, library))
}

fn dropin(vm_args: &VmArgs) -> Result<ExitCode> {
    let root = rootfs::prepare(&Cache::from_env()?, &TRIXIE_RXE, false)?;
    let target = native::default_target_dir()
        .ok_or_else(|| Error::Usage("cannot find the cargo target directory".into()))?;
    let workspace = vm::find_workspace_root(Path::new(env!("CARGO_MANIFEST_DIR")))
        .ok_or_else(|| Error::Usage("cannot find the workspace".into()))?;
    let tests = workspace.join("guest-driver/capi/tests");
    let program =
        native::build_program(&target, &tests.join("c/verbs_loopback.c"), "verbs_loopback")?;
    let (profile_dir, library) = dropin_library()?;
    let command: Vec<String> = vec![
        "sh".into(),
        tests.join("vm-dropin.sh").to_string_lossy().into_owned(),
        profile_dir
            .join("vrdma-backend")
            .to_string_lossy()
            .into_owned(),
        library.to_string_lossy().into_owned(),
        program.to_string_lossy().into_owned(),
    ];
    let outcome = vm::run(&root, &vm_args.config(&root)?, &command)?;
    if outcome.status != 0 {
        return Err(Error::Scenario(format!(
            "the drop-in run failed in the VM (status {})",
            outcome.status
        )));
    }
    Ok(ExitCode::SUCCESS)
}

fn perftest_over_vrdma(vm_args: &VmArgs, json: Option<PathBuf>) -> Result<ExitCode> {
    let root = rootfs::prepare(&Cache::from_env()?, &TRIXIE_RXE, false)?;
    let target = native::default_target_dir()
        .ok_or_else(|| Error::Usage("cannot find the cargo target directory".into()))?;
    let (_, library) = dropin_library()?;
    let library_dir = perftest_over_vrdma::prepare_library_dir(&target, &library)?;
    let mut config = vm_args.config(&root)?;
    config.echo = true;
    let args = vec![
        "--library-dir".into(),
        library_dir.to_string_lossy().into_owned(),
    ];
    let (outcome, rows): (_, Vec<Row>) =
        run_guest_suite(&root, &config, "perftest-over-vrdma", args, json.as_deref())?;
    println!(
        "\nunmodified perftest on rxe0: native, client over vrdma (server native), both over \
         vrdma ({:?}, {} vCPUs; VM run {:.0?}):",
        config.accel, config.cpus, outcome.elapsed
    );
    print!("{}", perftest::render_table(&rows));
    Ok(ExitCode::SUCCESS)
}

fn guest_perftest_over_vrdma(library_dir: &Path) -> Result<ExitCode> {
    let exe = std::env::current_exe().map_err(|e| Error::Usage(format!("current_exe: {e}")))?;
    let backend = exe.parent().unwrap_or(Path::new(".")).join("vrdma-backend");
    let rows = perftest_over_vrdma::run(&backend, library_dir)?;
    deliver_results("perftest-over-vrdma", &rows, || {
        perftest::render_table(&rows)
    })
}

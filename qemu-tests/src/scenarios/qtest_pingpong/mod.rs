//! `qtest-pingpong`: the real QEMU vrdma device, driven through qtest, inside the rxe VM.
//!
//! QEMU 11.1 runs `vhost-user-test-device-pci` (virtio ID 38) backed by vrdma-backend on rxe0,
//! with no guest CPU. This process is the guest: it assigns the function's BARs, reads the
//! device configuration through them, opens the library's PCI transport and a verbs context
//! on it, and runs the RC ping-pong of [`vrdma_tools::pingpong`] as the client against the native C
//! peer: SEND, SEND_WITH_IMM, WRITE, WRITE_WITH_IMM and READ at several sizes, every byte
//! verified. Every register and shared-memory access is a qtest round trip; guest RAM is the
//! memory-backend file, mapped here too. Then:
//! - a device reset in the middle of traffic: the backend must release everything the driver
//!   had created (rxe0 back to its idle counts), and a new transport and context on the same
//!   function continue the run;
//! - QEMU killed (SIGKILL) in the middle of traffic: rxe0 returns to its idle counts;
//! - the back-end killed (SIGKILL) in the middle of traffic, on a second machine whose QEMU
//!   connects through vrdma-keeper ([`daemon_restart`]): QEMU stays up, rxe0 returns to its
//!   idle counts with no daemon, a new daemon takes the connection over, the guest gets
//!   DEVICE_FATAL and a new transport and context run a verified ping-pong (spec §11.5).

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use vrdma::transport::pci::{PciFunction, PciOptions, PciTransport};
use vrdma::transport::Transport;
use vrdma::verbs::Context;
use vrdma_tools::pingpong::options::{Options, PathAttrs};
use vrdma_tools::pingpong::runner::run_client;
use vrdma_tools::pingpong::wait::Completion;
use vrdma_tools::pingpong::Plan;

mod daemon_restart;

use super::backend::Backend;
use super::pingpong_peer::{read_report, PingpongReport, PingpongRow};
use crate::error::{tail, Error, Result};
use crate::inside::{resource_counts, wait_for_counts, Proc, ResourceCounts, DEVICE};
use crate::qtest::{Machine, MachineConfig, QtestPciFunction};

/// The operations every verified run covers.
pub const VERIFY_OPS: &str = "send,send_imm,write,write_imm,read";
/// The sizes of the verified run.
pub const VERIFY_SIZES: &str = "1,64,4096,65536";

/// virtio-pci capability type of the device configuration.
const VIRTIO_PCI_CAP_DEVICE_CFG: u8 = 4;
/// The configuration magic, "vRDM".
const VRDMA_MAGIC: &[u8; 4] = b"vRDM";

pub use crate::scenarios::binaries::Binaries;

/// Settings of a run: every qtest access is a socket round trip, so iterations are few.
#[derive(Debug, Clone)]
pub struct Settings {
    pub iters: u32,
    /// QPs the library creates through QEMU ([`super::qtest_qp_scale`]); 0 skips it.
    pub qps: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { iters: 20, qps: 0 }
    }
}

/// What the function looked like to the test.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DeviceSummary {
    /// e.g. "00:01.0 1af4:1066".
    pub function: String,
    /// Assigned BARs, e.g. "BAR4 Mem64 0x100000000 +0x4000000".
    pub bars: Vec<String>,
    /// The configuration magic as read through the device-configuration BAR.
    pub magic: String,
    /// Length of shared-memory region 0.
    pub shared_memory_len: u64,
}

/// What the reset step observed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ResetOutcome {
    /// How the interrupted client run ended (an error, or "completed").
    pub interrupted_run: String,
    /// Time from the reset until rxe0 was back at its idle counts.
    pub release_ms: u64,
    /// The run continued on a new transport and context.
    pub continued: Vec<PingpongRow>,
}

/// What the kill step observed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct KillOutcome {
    /// How the interrupted client run ended.
    pub interrupted_run: String,
    /// Time from SIGKILL until rxe0 was back at its idle counts.
    pub release_ms: u64,
}

/// Everything the scenario measured.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Results {
    pub device: DeviceSummary,
    /// The native C peer against itself, same plan.
    pub native: Vec<PingpongRow>,
    /// The library over the qtest-driven device against the native peer.
    pub qtest: Vec<PingpongRow>,
    /// qtest requests the verified run needed.
    pub qtest_requests: u64,
    /// QPs through QEMU, if asked for.
    pub qp_scale: Option<super::qtest_qp_scale::QpScale>,
    /// The verified ping-pong on one more QP while they all lived.
    pub qp_scale_exchange: Vec<PingpongRow>,
    pub reset: ResetOutcome,
    pub kill: KillOutcome,
    pub daemon_restart: daemon_restart::RestartOutcome,
    /// The README's QEMU command line, run as documented (filled in by the caller).
    pub readme: Option<super::readme_qemu::DeviceSeen>,
}

/// Name (socket, log) of this scenario's backend.
const BACKEND: &str = "vrdma-qtest-backend";

/// The QP quota of this scenario's backend: QPs past QEMU's memory slots get staging rings
/// (spec §9.7), so a guest holds thousands; the quota ends the QP step.
pub const QP_QUOTA: u32 = 4096;

/// A native pingpong process with `plan`.
fn native_command(
    binaries: &Binaries,
    role: &str,
    port: u16,
    ops: &str,
    sizes: &str,
    iters: u32,
) -> Command {
    let mut cmd = Command::new(&binaries.native_pingpong);
    cmd.arg(role)
        .args(["--device", DEVICE])
        .args(["--port", &port.to_string()])
        .args(["--ops", ops])
        .args(["--sizes", sizes])
        .args(["--iters", &iters.to_string()])
        .args(["--timeout", "120"]);
    cmd
}

/// Starts a native server and waits until it listens.
fn native_server(
    binaries: &Binaries,
    port: u16,
    ops: &str,
    sizes: &str,
    iters: u32,
    label: &str,
) -> Result<Proc> {
    let mut server = Proc::spawn(
        &format!("qtest-{label}-server"),
        &mut native_command(binaries, "server", port, ops, sizes, iters),
    )?;
    server.wait_listening(port, Duration::from_secs(60))?;
    Ok(server)
}

/// The native pair with the verified plan; the client's rows.
fn native_pair(binaries: &Binaries, settings: &Settings, port: u16) -> Result<Vec<PingpongRow>> {
    let json = std::env::temp_dir().join("qtest-native-pingpong.json");
    let _ = std::fs::remove_file(&json);
    let mut server = native_server(
        binaries,
        port,
        VERIFY_OPS,
        VERIFY_SIZES,
        settings.iters,
        "native",
    )?;
    let mut cmd = native_command(
        binaries,
        "client",
        port,
        VERIFY_OPS,
        VERIFY_SIZES,
        settings.iters,
    );
    cmd.arg("--json").arg(&json);
    let mut client = Proc::spawn("qtest-native-client", &mut cmd)?;
    client.wait_success(Duration::from_secs(600))?;
    server.wait_success(Duration::from_secs(60))?;
    read_report(&json)
}

/// A PCI transport and a verbs context on `function`.
struct Guest {
    transport: Arc<PciTransport>,
    ctx: Context,
}

impl Guest {
    fn open(function: &Arc<QtestPciFunction>) -> Result<Self> {
        let options = PciOptions {
            command_timeout: Duration::from_secs(10),
            // Every look at the used ring is a qtest round trip over a socket: wait for the
            // interrupt instead of polling.
            command_spin: Duration::ZERO,
            ..PciOptions::default()
        };
        let transport = Arc::new(
            PciTransport::open(function.clone() as Arc<dyn PciFunction>, options)
                .map_err(|e| Error::Scenario(format!("opening the PCI transport: {e}")))?,
        );
        let ctx = Context::open(transport.clone())
            .map_err(|e| Error::Scenario(format!("opening a verbs context over PCI: {e}")))?;
        Ok(Guest { transport, ctx })
    }
}

/// Runs the library as client against a native server with `plan`; the client's rows.
fn qtest_client(
    guest: &Guest,
    binaries: &Binaries,
    plan: &Plan,
    port: u16,
    label: &str,
) -> Result<Vec<PingpongRow>> {
    let ops: Vec<String> = plan.ops().iter().map(|op| op.to_string()).collect();
    let sizes: Vec<String> = plan.sizes().iter().map(|s| s.to_string()).collect();
    let mut server = native_server(
        binaries,
        port,
        &ops.join(","),
        &sizes.join(","),
        plan.iters(),
        label,
    )?;
    let report = run_client(&guest.ctx, plan, &client_options(port, plan));
    let report = match report {
        Ok(report) => report,
        Err(e) => {
            server.kill();
            return Err(Error::Scenario(format!(
                "{label}: vrdma over qtest: {e}\n--- native server ---\n{}",
                tail(&server.output(), 15)
            )));
        }
    };
    server.wait_success(Duration::from_secs(60))?;
    let report: PingpongReport = serde_json::from_str(&report.to_json())
        .map_err(|e| Error::Scenario(format!("re-reading the client's report: {e}")))?;
    Ok(report.rows)
}

fn client_options(port: u16, plan: &Plan) -> Options {
    Options {
        host: "127.0.0.1".into(),
        port,
        timeout: Duration::from_secs(60),
        len: plan.area_len(),
        start_file: None,
        completion: Completion::Poll,
        path: PathAttrs::default(),
        receives_after: None,
    }
}

fn plan(ops: &str, sizes: &str, iters: u32) -> Result<Plan> {
    Plan::from_parts(ops, sizes, &iters.to_string(), "verify")
        .map_err(|e| Error::Scenario(format!("plan {ops}:{sizes}:{iters}: {e}")))
}

/// Reads the device configuration's magic through the device-configuration capability, with
/// memory decoding on, before any driver touches the device.
fn read_magic(function: &QtestPciFunction) -> Result<String> {
    let pci = |what: &str| {
        let what = what.to_string();
        move |e: vrdma::transport::pci::PciError| Error::Scenario(format!("{what}: {e}"))
    };
    let mut command = [0u8; 2];
    function
        .config_read(4, &mut command)
        .map_err(pci("reading the command register"))?;
    command[0] |= 0x2;
    function
        .config_write(4, &command)
        .map_err(pci("enabling memory decoding"))?;
    let (bar, offset, _) = function
        .virtio_capability(VIRTIO_PCI_CAP_DEVICE_CFG)
        .map_err(pci("walking the capabilities"))?
        .ok_or_else(|| {
            Error::Scenario("the function has no device-configuration capability".into())
        })?;
    let mut magic = [0u8; 4];
    function
        .bar_read(bar, u64::from(offset), &mut magic)
        .map_err(pci("reading the configuration magic"))?;
    if &magic != VRDMA_MAGIC {
        return Err(Error::Scenario(format!(
            "configuration magic {magic:02x?}, expected \"vRDM\""
        )));
    }
    Ok(String::from_utf8_lossy(&magic).into_owned())
}

fn summarize_device(function: &QtestPciFunction, magic: String, shm_len: u64) -> DeviceSummary {
    let info = function.info();
    DeviceSummary {
        function: format!(
            "00:{:02x}.{} {:04x}:{:04x}",
            info.slot, info.function, info.vendor, info.device
        ),
        bars: info
            .bars
            .iter()
            .enumerate()
            .filter_map(|(i, bar)| {
                bar.map(|b| format!("BAR{i} {:?} {:#x} +{:#x}", b.kind, b.base, b.size))
            })
            .collect(),
        magic,
        shared_memory_len: shm_len,
    }
}

/// Waits until rxe0 is back at `idle`; the time it took.
fn wait_idle(idle: ResourceCounts, since: Instant, what: &str, backend: &Backend) -> Result<u64> {
    wait_for_counts(DEVICE, idle, Duration::from_secs(30)).map_err(|last| {
        Error::Scenario(format!(
            "{what}: {DEVICE} holds {last:?}, idle is {idle:?}\n--- backend ---\n{}",
            tail(&backend.proc.output(), 20)
        ))
    })?;
    Ok(since.elapsed().as_millis() as u64)
}

/// What interrupting traffic showed.
struct Interruption {
    /// How the client's run ended.
    run: String,
    /// Time from the interruption until rxe0 held `expected`.
    release_ms: u64,
}

/// Starts a long run of the library against a native server, lets traffic flow, calls
/// `interrupt`, kills the server and waits, while the library's client still runs, until
/// rxe0 holds `expected`.
fn interrupt_traffic(
    guest: &Guest,
    binaries: &Binaries,
    backend: &Backend,
    (port, label): (u16, &str),
    interrupt: impl FnOnce() -> Result<()>,
    expected: ResourceCounts,
) -> Result<Interruption> {
    const ITERS: u32 = 1_000_000;
    let plan = plan("send,write", "4096", ITERS)?;
    let mut server = native_server(binaries, port, "send,write", "4096", ITERS, label)?;
    let mut options = client_options(port, &plan);
    options.timeout = Duration::from_secs(20);
    std::thread::scope(|scope| {
        let client = scope.spawn(|| run_client(&guest.ctx, &plan, &options));
        let released = server
            .wait_for_output("RUNNING", Duration::from_secs(120))
            .and_then(|()| {
                // Some traffic first.
                std::thread::sleep(Duration::from_millis(500));
                let at = Instant::now();
                interrupt()?;
                // The native peer's own objects are not the backend's to release.
                server.kill();
                wait_idle(expected, at, &format!("after the {label}"), backend)
            });
        let outcome = client
            .join()
            .map_err(|_| Error::Scenario(format!("{label}: the client thread panicked")))?;
        server.kill();
        Ok(Interruption {
            run: match outcome {
                Ok(_) => "completed".to_string(),
                Err(e) => e.to_string(),
            },
            release_ms: released?,
        })
    })
}

/// Runs the whole scenario; a failure shows the ends of the backend's log and QEMU's stderr.
pub fn run(binaries: &Binaries, settings: &Settings) -> Result<Results> {
    let qemu_stderr = std::cell::RefCell::new(None);
    let _ = std::fs::remove_file(Backend::log_path(BACKEND));
    run_steps(binaries, settings, &qemu_stderr).map_err(|e| {
        let backend_log = std::fs::read_to_string(Backend::log_path(BACKEND)).unwrap_or_default();
        let qemu = qemu_stderr
            .borrow()
            .as_ref()
            .map(|qtest: &Arc<crate::qtest::Qtest>| {
                crate::error::summarize_qemu_stderr(&qtest.stderr())
            })
            .unwrap_or_default();
        Error::Scenario(format!(
            "{e}\n--- vrdma-backend ---\n{}\n--- QEMU stderr ---\n{}",
            tail(&backend_log, 30),
            tail(&qemu, 20)
        ))
    })
}

fn run_steps(
    binaries: &Binaries,
    settings: &Settings,
    qemu_cell: &std::cell::RefCell<Option<Arc<crate::qtest::Qtest>>>,
) -> Result<Results> {
    let idle = resource_counts(DEVICE)?;
    println!("idle {DEVICE} resources: {idle:?}");
    let mut results = Results::default();
    let mut port = 18700;
    let mut next_port = || {
        port += 1;
        port
    };

    println!("== native pair: verified ping-pong");
    results.native = native_pair(binaries, settings, next_port())?;

    println!("== QEMU with the vrdma device under qtest");
    let (backend, machine) = start_machine(binaries)?;
    *qemu_cell.borrow_mut() = Some(machine.qtest.clone());
    let function = probe(&machine)?;
    let magic = read_magic(&function)?;
    println!("  {:x?}; magic {magic:?}", function.info());

    println!("== library over the qtest-driven device: verified ping-pong");
    let guest = Guest::open(&function)?;
    let shm_len = guest.transport.shared_memory().len() as u64;
    results.device = summarize_device(&function, magic, shm_len);
    let before = machine.qtest.requests();
    let verify = plan(VERIFY_OPS, VERIFY_SIZES, settings.iters)?;
    results.qtest = qtest_client(&guest, binaries, &verify, next_port(), "verify")?;
    results.qtest_requests = machine.qtest.requests() - before;
    println!(
        "  ok: {} rows verified, {} qtest requests",
        results.qtest.len(),
        results.qtest_requests
    );

    // rxe0 while QEMU is connected and the guest holds nothing but its context.
    let connected = ResourceCounts {
        ctx: idle.ctx + 1,
        ..idle
    };
    if settings.qps > 0 {
        println!("== {} QPs through QEMU", settings.qps);
        let exchange_port = next_port();
        // The earlier steps' native peers may still be releasing their objects (rxe frees
        // them after the process is gone): wait for that first.
        wait_idle(connected, Instant::now(), "before the QP step", &backend)?;
        let (scale, exchange) = super::qtest_qp_scale::run(
            &guest.ctx,
            settings.qps,
            || read_magic(&function).is_ok_and(|m| m == "vRDM"),
            || {
                let plan = plan(VERIFY_OPS, "64,4096", settings.iters.min(10))?;
                qtest_client(&guest, binaries, &plan, exchange_port, "scale")
            },
        )?;
        println!("  {scale:?}");
        println!("  ok: {} rows verified on one more QP", exchange.len());
        // Everything the step made is gone from the host again (the mappings: see
        // `direct_after_release`).
        wait_idle(connected, Instant::now(), "after the QP step", &backend)?;
        println!("  ok: {DEVICE} back to {connected:?} after destroying them");
        results.qp_scale = Some(scale);
        results.qp_scale_exchange = exchange;
    }

    // The reset a reboot does: no DISCARD_STATE first, so QEMU removes the live mappings
    // itself while the device is stopped. QEMU 11.1.3 crashed at the next DRIVER_OK while the
    // backend accepted its mappings as guest memory (spec §11.1); the new context below
    // writes DRIVER_OK again. (Dropping a transport, between the steps, takes the
    // DISCARD_STATE path.)
    println!("== device reset in the middle of traffic, as a guest reboot does it");
    // QEMU stays connected, and the backend keeps the host context of the connection.
    let reset = interrupt_traffic(
        &guest,
        binaries,
        &backend,
        (next_port(), "reset"),
        || {
            guest
                .transport
                .device()
                .reset()
                .map_err(|e| Error::Scenario(format!("resetting the device: {e}")))
        },
        connected,
    )?;
    println!("  interrupted run: {}", reset.run);
    println!(
        "  ok: the backend released every object {} ms after the reset",
        reset.release_ms
    );
    drop(guest);
    let guest = Guest::open(&function)?;
    let continued = plan(VERIFY_OPS, "64,4096", settings.iters.min(10))?;
    results.reset = ResetOutcome {
        interrupted_run: reset.run,
        release_ms: reset.release_ms,
        continued: qtest_client(&guest, binaries, &continued, next_port(), "after-reset")?,
    };
    println!("  ok: a new transport and context continued the run");

    println!("== QEMU killed in the middle of traffic");
    let kill = interrupt_traffic(
        &guest,
        binaries,
        &backend,
        (next_port(), "kill"),
        || {
            machine.kill();
            Ok(())
        },
        idle,
    )?;
    println!("  interrupted run: {}", kill.run);
    println!(
        "  ok: {DEVICE} back to idle {} ms after SIGKILL",
        kill.release_ms
    );
    results.kill = KillOutcome {
        interrupted_run: kill.run,
        release_ms: kill.release_ms,
    };
    drop(guest);
    drop(function);
    drop(machine);
    drop(backend);
    if let Err(last) = wait_for_counts(DEVICE, idle, Duration::from_secs(30)) {
        return Err(Error::Scenario(format!(
            "after the backend exited {DEVICE} holds {last:?}, idle was {idle:?}"
        )));
    }

    println!("== the back-end killed in the middle of traffic, QEMU behind vrdma-keeper");
    results.daemon_restart = daemon_restart::run(
        binaries,
        settings,
        idle,
        (next_port(), next_port()),
        qemu_cell,
    )?;
    Ok(results)
}

/// A back-end and QEMU with the vrdma device on it, under qtest.
fn start_machine(binaries: &Binaries) -> Result<(Backend, Machine)> {
    // A CQ for every QP, the refused one's and the exchange's included: the QP quota ends
    // the QP step.
    let (qps, cqs) = (QP_QUOTA.to_string(), (2 * QP_QUOTA).to_string());
    let backend = Backend::start(
        &binaries.backend,
        BACKEND,
        &["--max-qps", &qps, "--max-cqs", &cqs],
        "info",
    )?;
    let machine = Machine::start(&MachineConfig::new(&backend.socket))
        .map_err(|e| Error::Scenario(format!("starting QEMU: {e}")))?;
    Ok((backend, machine))
}

/// The machine's vrdma function, its BARs assigned.
fn probe(machine: &Machine) -> Result<Arc<QtestPciFunction>> {
    let function = machine
        .function()
        .map_err(|e| Error::Scenario(format!("probing the vrdma function: {e}")))?;
    Ok(Arc::new(function))
}

/// The library over qtest next to the native pair, per (op, size).
pub fn render_comparison(results: &Results) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<10} {:>8} {:>6} {:>14} {:>14} {:>9} {:>12} {:>12}",
        "op",
        "size",
        "iters",
        "native_lat_us",
        "qtest_lat_us",
        "ratio",
        "native_MiB/s",
        "qtest_MiB/s"
    );
    let lat = |r: &PingpongRow| r.latency.as_ref().map(|l| l.typical_us);
    let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    for row in &results.qtest {
        let base = results
            .native
            .iter()
            .find(|n| n.op == row.op && n.size == row.size);
        let ratio = match (lat(row), base.and_then(lat)) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.1}", a / b),
            _ => "-".to_string(),
        };
        let _ = writeln!(
            out,
            "{:<10} {:>8} {:>6} {:>14} {:>14} {:>9} {:>12} {:>12.2}",
            row.op,
            row.size,
            row.iters,
            show(base.and_then(lat)),
            show(lat(row)),
            ratio,
            base.map_or("-".to_string(), |b| format!("{:.2}", b.mib_s)),
            row.mib_s
        );
    }
    let iterations: u64 = results.qtest.iter().map(|r| u64::from(r.iters)).sum();
    if iterations > 0 {
        let _ = writeln!(
            out,
            "qtest requests: {} ({:.1} per iteration)",
            results.qtest_requests,
            results.qtest_requests as f64 / iterations as f64
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(op: &str, size: u32, typical_us: f64) -> PingpongRow {
        serde_json::from_value(serde_json::json!({
            "op": op, "size": size, "iters": 10, "mib_s": 1.5, "mmsg_s": 0.1,
            "latency": {"typical_us": typical_us, "avg_us": typical_us, "p99_us": typical_us},
            "completion": null, "completion_events": null, "arms": null
        }))
        .unwrap()
    }

    #[test]
    fn comparison_pairs_rows_by_op_and_size() {
        let results = Results {
            native: vec![row("send", 64, 50.0), row("read", 64, 80.0)],
            qtest: vec![row("send", 64, 500.0), row("write", 64, 700.0)],
            qtest_requests: 300,
            ..Results::default()
        };
        let table = render_comparison(&results);
        let send = table.lines().find(|l| l.starts_with("send")).unwrap();
        assert!(send.contains("50.00") && send.contains("500.00") && send.contains("10.0"));
        let write = table.lines().find(|l| l.starts_with("write")).unwrap();
        assert!(write.contains(" - "), "{write}");
        assert!(table.contains("15.0 per iteration"), "{table}");
    }
}

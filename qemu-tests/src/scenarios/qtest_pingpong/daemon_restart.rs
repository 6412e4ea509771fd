//! The back-end killed under a running QEMU that reaches it through vrdma-keeper (spec §11.5):
//! QEMU stays up, the host releases every object of the dead daemon while QEMU runs, a new
//! daemon takes the connection over, the guest's old context gets DEVICE_FATAL, and a new
//! transport and context on the same function run a verified ping-pong: no QEMU restart.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use vrdma::verbs::DeviceEvent;

use super::{
    interrupt_traffic, plan, probe, qtest_client, read_magic, wait_idle, Binaries, Guest, Settings,
    QP_QUOTA, VERIFY_OPS,
};
use crate::error::{tail, Error, Result};
use crate::inside::{resource_counts, ResourceCounts, DEVICE};
use crate::qtest::{Machine, MachineConfig, Qtest};
use crate::scenarios::backend::{Backend, Keeper};
use crate::scenarios::pingpong_peer::PingpongRow;

/// Name (socket, log) of the daemon behind the keeper.
const DAEMON: &str = "vrdma-qtest-daemon";
/// Name (socket, log) of the keeper; its socket is QEMU's.
const KEEPER: &str = "vrdma-qtest-keeper";
/// Bound of each wait for something the device or host must do (never reached by a run
/// that works).
const BOUND: Duration = Duration::from_secs(60);

/// What the daemon's death and the next daemon showed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RestartOutcome {
    /// How the run interrupted by the daemon's death ended.
    pub interrupted_run: String,
    /// Time from the SIGKILL until rxe0 was back at its idle counts (QEMU up, no daemon).
    pub release_ms: u64,
    /// rxe0's counts then, and before this machine started.
    pub released_to: ResourceCounts,
    pub idle: ResourceCounts,
    /// QEMU was running with no daemon, and after the takeover.
    pub qemu_alive_without_daemon: bool,
    pub qemu_alive_after: bool,
    /// The configuration magic read with no daemon (the keeper answered).
    pub magic_without_daemon: String,
    /// The epoch DEVICE_FATAL named (the library passes on only one naming an epoch other
    /// than the one its context opened at).
    pub fatal_epoch: Option<u32>,
    /// Time from the new daemon's start until the old context got DEVICE_FATAL.
    pub fatal_after_ms: u64,
    /// The verified run of a new transport and context on the new daemon.
    pub continued: Vec<PingpongRow>,
    /// What the keeper logged.
    pub keeper_log: String,
}

/// A daemon for the machine, with the arguments of every qtest daemon.
fn start_daemon(binaries: &Binaries) -> Result<Backend> {
    let (qps, cqs) = (QP_QUOTA.to_string(), (2 * QP_QUOTA).to_string());
    Backend::start(
        &binaries.backend,
        DAEMON,
        &["--max-qps", &qps, "--max-cqs", &cqs],
        "info",
    )
}

/// Runs the step: a machine behind a keeper, its daemon killed mid-traffic and replaced.
pub fn run(
    binaries: &Binaries,
    settings: &Settings,
    idle: ResourceCounts,
    (traffic_port, verify_port): (u16, u16),
    qemu_cell: &std::cell::RefCell<Option<Arc<Qtest>>>,
) -> Result<RestartOutcome> {
    let daemon = start_daemon(binaries)?;
    let mut keeper = Keeper::start(&binaries.keeper, KEEPER, &daemon.socket)?;
    let machine = Machine::start(&MachineConfig::new(&keeper.socket))
        .map_err(|e| Error::Scenario(format!("starting QEMU behind the keeper: {e}")))?;
    *qemu_cell.borrow_mut() = Some(machine.qtest.clone());
    let function = probe(&machine)?;
    read_magic(&function)?;
    let guest = Guest::open(&function)?;

    // Traffic, then the daemon's death under it. With no daemon, the keeper removed the
    // dead daemon's mappings, so the host gives everything back while QEMU runs.
    let interrupted = interrupt_traffic(
        &guest,
        binaries,
        &daemon,
        (traffic_port, "daemon-kill"),
        || daemon.proc.signal("KILL"),
        idle,
    )?;
    let (interrupted_run, release_ms) = (interrupted.run, interrupted.release_ms);
    println!("  interrupted run: {interrupted_run}");
    let released_to = resource_counts(DEVICE)?;
    let qemu_alive_without_daemon = machine.qtest.exit_status().is_none();
    let magic_without_daemon = read_magic(&function)?;
    println!(
        "  ok: {DEVICE} idle {release_ms} ms after the SIGKILL, QEMU up, the keeper read \
         {magic_without_daemon:?}"
    );

    // The next daemon: the keeper gives it the connection, it tells the guest.
    let started = Instant::now();
    let mut daemon = start_daemon(binaries)?;
    let fatal_epoch = wait_for_fatal(&guest)?;
    let fatal_after_ms = started.elapsed().as_millis() as u64;
    println!("  ok: DEVICE_FATAL (epoch {fatal_epoch:?}) {fatal_after_ms} ms after the new daemon started");
    drop(guest);
    let guest = Guest::open(&function)?;
    let verify = plan(VERIFY_OPS, "64,4096", settings.iters.min(10))?;
    let continued = qtest_client(&guest, binaries, &verify, verify_port, "after-restart")?;
    println!(
        "  ok: {} rows verified on a new context, same QEMU",
        continued.len()
    );
    let qemu_alive_after = machine.qtest.exit_status().is_none();
    daemon.check_alive("the takeover")?;
    keeper.check_alive()?;

    drop(guest);
    drop(function);
    let qemu_killed_at = Instant::now();
    machine.kill();
    drop(machine);
    wait_idle(
        idle,
        qemu_killed_at,
        "after QEMU behind the keeper exited",
        &daemon,
    )?;
    let keeper_log = tail(&keeper.proc.output(), 12);
    keeper.proc.kill();
    Ok(RestartOutcome {
        interrupted_run,
        release_ms,
        released_to,
        idle,
        qemu_alive_without_daemon,
        qemu_alive_after,
        magic_without_daemon,
        fatal_epoch,
        fatal_after_ms,
        continued,
        keeper_log,
    })
}

/// Waits until `guest`'s context gets DEVICE_FATAL; the epoch it names.
fn wait_for_fatal(guest: &Guest) -> Result<Option<u32>> {
    let deadline = Instant::now() + BOUND;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Scenario(format!(
                "no DEVICE_FATAL within {} s of the new daemon",
                BOUND.as_secs()
            )));
        }
        match guest.ctx.next_event(Some(left)) {
            Ok(Some(DeviceEvent::DeviceFatal { epoch })) => return Ok(Some(epoch)),
            Ok(_) => {}
            Err(e) => return Err(Error::Scenario(format!("waiting for DEVICE_FATAL: {e}"))),
        }
    }
}

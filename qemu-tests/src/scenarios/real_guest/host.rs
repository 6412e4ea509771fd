//! The rxe VM's side of the real-guest suite: the backend, the native peers, the relays and
//! the answers to the guest's requests; then the guest itself under QEMU 11.1, and the
//! native perftest runs to compare with.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::control;
use super::guest::{FIRST_BOOT_FILE, SECOND_BOOT_FILE};
use super::installed::{InstalledRoot, PackageRecord};
use super::*;
use crate::accel::Accel;
use crate::error::{tail, Error, Result};
use crate::inside::{
    objects_of_process, resource_counts, thread_waits, wait_for_counts, Proc, ResourceCounts,
    DEVICE,
};
use crate::perftest::{self, Side};
use crate::relay;
use crate::rootfs::PreparedRoot;
use crate::scenarios::backend::{Backend, Keeper};
use crate::scenarios::binaries::Binaries;
use crate::scenarios::rdmacm_utils::{self, cm_listens, RSTREAM_BLOCKING, UCMATOSE};
use crate::vm::{self, VmConfig};

/// How long the host side waits for the device to be idle after the guest's reboot.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs the suite (inside the rxe VM).
pub fn run(binaries: &Binaries, settings: &Settings) -> Result<Report> {
    let root = PreparedRoot::load(&settings.root_dir).ok_or_else(|| {
        Error::Scenario(format!(
            "no prepared root file system at {}",
            settings.root_dir.display()
        ))
    })?;
    // KVM where a probe guest boots under it, nested TCG otherwise.
    let accel = Accel::choose_by("VRDMA_GUEST_ACCEL", &root)?;
    let idle = resource_counts(DEVICE)?;
    // UD: UCX's ud_verbs, and the address handle UCX creates to test each GID before it
    // picks one (without UD every one fails, a control command each for the whole table).
    let backend = start_backend(binaries)?;
    // QEMU connects to the keeper, which holds the connection while the backend is replaced
    // under the guest (spec §11.5).
    let keeper = Keeper::start(&binaries.keeper, "vrdma-guest-keeper", &backend.socket)?;
    let chardev_dir = std::env::temp_dir().join("vrdma-guest-ports");
    let _ = std::fs::remove_dir_all(&chardev_dir);
    std::fs::create_dir_all(&chardev_dir)
        .map_err(|e| Error::Scenario(format!("creating {}: {e}", chardev_dir.display())))?;
    let timeout = settings.timeout;

    // The native peers the guest's clients meet; the one of the boot after the reboot is
    // started only once the device was seen idle.
    let mut pingpong_server = native_server(
        binaries,
        PINGPONG.tcp,
        (PINGPONG_OPS, PINGPONG_SIZES, settings.iters),
        timeout,
    )?;
    let mut agent_servers = THROUGH_AGENT
        .iter()
        .map(|link| {
            native_server(
                binaries,
                link.tcp,
                (AGENT_OPS, AGENT_SIZES, settings.iters),
                timeout,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    // The peer of the process killed in mid-traffic (stopped when the guest says so: a serial
    // relay carries no end of stream, so it would wait for its peer to the end).
    let agent_victim_server = native_server(
        binaries,
        AGENT_VICTIM.tcp,
        ("send,write", "4096", LIVE_ITERS),
        timeout,
    )?;
    // The native perftest clients connect to their relays now and wait there until the
    // guest's server answers.
    let mut perftest_listeners = Vec::new();
    let mut perftest_clients = Vec::new();
    for (case, link) in PERFTEST.iter().chain(AGENT_PERFTEST) {
        perftest_listeners.push(relay::listen_loopback(link.tcp)?);
        let name = format!(
            "native-{}-{}-client-{}",
            case.tool.command(),
            case.size,
            link.tcp
        );
        perftest_clients.push(Proc::spawn(
            &name,
            &mut Side::native(DEVICE).client_command(case, link.tcp, "127.0.0.1"),
        )?);
    }
    let live_server = if settings.reboot {
        Some(native_server(
            binaries,
            LIVE.tcp,
            ("send,write", "4096", LIVE_ITERS),
            timeout,
        )?)
    } else {
        None
    };
    let rping_address = crate::scenarios::rdmacm_utils::link_local_address()?;
    let mut rping_servers = [
        ("native-rping-server", RPING_PORT),
        ("native-rping-server-for-the-agent", AGENT_RPING_PORT),
    ]
    .into_iter()
    .map(|(name, port)| Proc::spawn(name, &mut native_rping("-s", &rping_address, port)))
    .collect::<Result<Vec<_>>>()?;
    let mut ucmatose_server = Proc::spawn(
        "native-ucmatose-server-for-the-agent",
        &mut native_ucmatose(&rping_address, AGENT_UCMATOSE_PORT, true),
    )?;
    let mut rstream_server = Proc::spawn(
        "native-rstream-server-for-the-agent",
        &mut native_rstream(&rping_address, AGENT_RSTREAM_PORT),
    )?;
    let bypass_listener = relay::listen_loopback(BYPASS.tcp)?;
    let bypass_client = Proc::spawn(
        "native-bypass-client",
        Command::new(&binaries.native_pingpong)
            .args(["client", "--device", DEVICE, "--host", "127.0.0.1"])
            .args(["--port", &BYPASS.tcp.to_string()])
            .args(["--ops", BYPASS_OPS, "--sizes", BYPASS_SIZES])
            .args(["--iters", &BYPASS_MESSAGES.to_string(), "--oneway"])
            .args(["--timeout", &timeout.as_secs().to_string()]),
    )?;

    // The guest boots from its root with the vrdma-guest package installed (dpkg here, not
    // under nested TCG).
    let mut package = PackageRecord::default();
    let installed = InstalledRoot::install(&root, &settings.guest_package, &mut package)?;
    let mut config = VmConfig::for_host(accel)?;
    config.cpus = 2;
    config.memory_mib = GUEST_MEMORY_MIB;
    config.timeout = timeout;
    config.extra_qemu_args = guest_device_args(&keeper.socket, &chardev_dir);
    config.extra_kernel_args = vec![format!("hugepages={GUEST_HUGEPAGES}")];
    config.allow_reboot = settings.reboot;
    config.with_rxe = false;
    let exe = std::env::current_exe()
        .map_err(|e| Error::Scenario(format!("locating this executable: {e}")))?;
    let mut command = vec![
        exe.to_string_lossy().into_owned(),
        "guest".into(),
        "real-guest-inside".into(),
        "--library-dir".into(),
        settings.library_dir.to_string_lossy().into_owned(),
        "--iters".into(),
        settings.iters.to_string(),
        "--rping-server".into(),
        rping_address
            .split('%')
            .next()
            .unwrap_or_default()
            .to_string(),
    ];
    if settings.reboot {
        command.push("--reboot".into());
    }

    let restart_server = native_server(
        binaries,
        RESTART_LIVE.tcp,
        ("send,write", "4096", LIVE_ITERS),
        timeout,
    )?;
    let mut requests = Requests {
        backend,
        restart_server: Some(restart_server),
        rping_address: &rping_address,
        idle,
        live_server,
        bypass_client,
        agent_victim_server: Some(agent_victim_server),
        after_server: None,
        after_restart_server: None,
        binaries,
        settings,
        seen: Reboot::default(),
    };
    // The relays run until their connections end; they are not joined (a serial port has no
    // end of stream) and end with this process at the latest. Where the guest is the server,
    // the host side listens.
    let mut listeners: Vec<(Link, std::net::TcpListener)> = PERFTEST
        .iter()
        .chain(AGENT_PERFTEST)
        .map(|(_, link)| *link)
        .zip(perftest_listeners)
        .collect();
    listeners.push((BYPASS, bypass_listener));
    for link in links() {
        let chardev = chardev_path(&chardev_dir, link.serial);
        if let Some(at) = listeners.iter().position(|(l, _)| *l == link) {
            let (_, listener) = listeners.swap_remove(at);
            std::thread::spawn(move || {
                if let Err(e) = relay::accept_to_chardev(listener, &chardev, timeout) {
                    log::warn!("relay {}: {e}", link.serial);
                }
            });
        } else {
            std::thread::spawn(move || {
                if let Err(e) = relay::connect_chardev_to_tcp(&chardev, link.tcp, timeout) {
                    log::warn!("relay {}: {e}", link.serial);
                }
            });
        }
    }
    let guest_gone = AtomicBool::new(false);
    let outcome = std::thread::scope(|scope| {
        let control_chardev = chardev_path(&chardev_dir, CONTROL_PORT);
        let requests = &mut requests;
        let guest_gone = &guest_gone;
        let control = scope.spawn(move || {
            control::serve(&control_chardev, guest_gone, |request| {
                requests.answer(request)
            })
        });
        let outcome = vm::run(installed.root(), &config, &command);
        guest_gone.store(true, Ordering::Release);
        match control.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => log::warn!("control port: {e}"),
            Err(_) => log::warn!("the control port's thread panicked"),
        }
        outcome
    });
    // A guest that hung (the bound ran out): where the back-end's threads wait says whether
    // it waits for QEMU.
    let outcome = outcome.map_err(|e| {
        let backend = &requests.backend.proc;
        Error::Scenario(format!(
            "{e}\n--- backend threads ---\n{}--- backend ---\n{}",
            thread_waits(backend.pid()),
            tail(&backend.output(), 40)
        ))
    })?;
    let failure = |what: &str, requests: &Requests| {
        Error::Scenario(format!(
            "{what}\n--- guest ---\n{}\n--- backend ---\n{}",
            tail(&outcome.output, 60),
            tail(&requests.backend.proc.output(), 30)
        ))
    };
    if outcome.status != 0 {
        return Err(failure(
            &format!("the guest's suite failed (status {})", outcome.status),
            &requests,
        ));
    }
    let result = |name: &str| -> Result<&[u8]> {
        outcome
            .results
            .iter()
            .find(|(file, _)| file == name)
            .map(|(_, data)| data.as_slice())
            .ok_or_else(|| failure(&format!("the guest left no {name}"), &requests))
    };
    let parse = |name: &str, data: &[u8]| {
        Error::Scenario(format!("{name}: {}", String::from_utf8_lossy(data)))
    };
    let first_data = result(FIRST_BOOT_FILE)?;
    let first_boot: FirstBoot =
        serde_json::from_slice(first_data).map_err(|_| parse(FIRST_BOOT_FILE, first_data))?;
    let second_boot: Option<SecondBoot> = if settings.reboot {
        let data = result(SECOND_BOOT_FILE)?;
        Some(serde_json::from_slice(data).map_err(|_| parse(SECOND_BOOT_FILE, data))?)
    } else {
        None
    };

    // The guest's peers must have finished cleanly, their data verified; the perftest
    // clients' results are the guest's rows.
    pingpong_server.wait_success(Duration::from_secs(60))?;
    for server in &mut agent_servers {
        server.wait_success(Duration::from_secs(60))?;
    }
    for server in &mut rping_servers {
        server.wait_success(Duration::from_secs(60))?;
    }
    ucmatose_server.wait_success(Duration::from_secs(60))?;
    rdmacm_utils::marks(&ucmatose_server.output(), UCMATOSE.server_marks)
        .map_err(|why| ucmatose_server.failure(&why))?;
    rstream_server.wait_success(Duration::from_secs(60))?;
    rdmacm_utils::marks(&rstream_server.output(), RSTREAM_BLOCKING.server_marks)
        .map_err(|why| rstream_server.failure(&why))?;
    let mut guest_rows = Vec::new();
    let labels = std::iter::repeat_n("vrdma-guest", PERFTEST.len())
        .chain(std::iter::repeat_n("vrdma-agent", AGENT_PERFTEST.len()));
    for (((case, _), client), label) in PERFTEST
        .iter()
        .chain(AGENT_PERFTEST)
        .zip(&mut perftest_clients)
        .zip(labels)
    {
        client.wait_success(Duration::from_secs(60))?;
        guest_rows.push(perftest::read_row(case, label, &client.output())?);
    }
    if let Some(server) = &mut requests.after_server {
        server.wait_success(Duration::from_secs(60))?;
    }
    if let Some(server) = &mut requests.after_restart_server {
        server.wait_success(Duration::from_secs(60))?;
    }
    // QEMU has exited: nothing of the guest may remain.
    wait_for_counts(DEVICE, idle, RELEASE_TIMEOUT).map_err(|last| {
        failure(
            &format!("after the guest: {DEVICE} holds {last:?}, idle is {idle:?}"),
            &requests,
        )
    })?;
    let reboot = second_boot.map(|after| Reboot {
        after,
        ..requests.seen.clone()
    });
    drop(requests);
    drop(keeper);

    println!("== the same perftest cases natively");
    let native = Side::native(DEVICE);
    let agent_rows = guest_rows.split_off(PERFTEST.len());
    // Each agent case next to the root process's row of the same case.
    let through_agent = AGENT_PERFTEST
        .iter()
        .zip(agent_rows)
        .map(|((case, _), agent)| {
            let root = PERFTEST
                .iter()
                .position(|(c, _)| c == case)
                .map(|i| guest_rows[i].clone())
                .ok_or_else(|| {
                    Error::Scenario(format!("{case:?} has no root PCI row to compare with"))
                })?;
            Ok(Comparison {
                native: root,
                vrdma: agent,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut perftest = Vec::new();
    for ((case, link), vrdma) in PERFTEST.iter().zip(guest_rows) {
        let native_row = perftest::run_case(case, &native, &native, link.tcp)?;
        perftest.push(Comparison {
            native: native_row,
            vrdma,
        });
    }
    installed.purge(&mut package)?;
    Ok(Report {
        accel: format!("{accel:?}"),
        elapsed_secs: outcome.elapsed.as_secs_f64(),
        first_boot,
        perftest,
        reboot,
        through_agent,
        package,
    })
}

/// A native rping (`role` `-s` or `-c`) on `address` and `port`, as the guest's runs it.
fn native_rping(role: &str, address: &str, port: u16) -> Command {
    let mut command = Command::new("rping");
    command
        .args([role, "-a", address, "-p", &port.to_string()])
        .args(["-C", &RPING_COUNT.to_string(), "-S", "200", "-V", "-v"]);
    command
}

/// A native ucmatose (server or client) on `address` and `port`, as the guest's runs it.
fn native_ucmatose(address: &str, port: u16, server: bool) -> Command {
    let (address_args, _) = rdmacm_utils::address_args(UCMATOSE.server, address, port, server);
    let mut command = Command::new(UCMATOSE.server);
    command.args(UCMATOSE.args).args(address_args);
    command
}

/// A native rstream server on `port` (rdma-core's rsockets), as the guest's client runs it.
fn native_rstream(address: &str, port: u16) -> Command {
    let program = &RSTREAM_BLOCKING;
    let (address_args, _) = rdmacm_utils::address_args(program.server, address, port, true);
    let mut command = Command::new(program.server);
    command.args(program.args).args(address_args);
    command
}

/// `rdma -j resource show cm_id`.
fn cm_ids() -> Result<String> {
    let out =
        crate::host::run_checked(Command::new("rdma").args(["-j", "resource", "show", "cm_id"]))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A native vrdma-native-pingpong server on `port` running `(ops, sizes, iters)`.
fn native_server(
    binaries: &Binaries,
    port: u16,
    (ops, sizes, iters): (&str, &str, u32),
    timeout: Duration,
) -> Result<Proc> {
    Proc::spawn(
        &format!("native-pingpong-server-{port}"),
        Command::new(&binaries.native_pingpong)
            .args(["server", "--device", DEVICE])
            .args(["--port", &port.to_string()])
            .args(["--ops", ops, "--sizes", sizes])
            .args(["--iters", &iters.to_string()])
            .args(["--timeout", &timeout.as_secs().to_string()])
            // Completion events, not busy polling: up to four of these peers run at once, and
            // each polling one would take a CPU of the rxe VM's two from the nested guest,
            // whose clients they wait for.
            .arg("--events"),
    )
}

/// The backend of the guest (QEMU reaches it through the keeper).
fn start_backend(binaries: &Binaries) -> Result<Backend> {
    // UD: UCX's ud_verbs, and the address handle UCX creates to test each GID before it
    // picks one (without UD every one fails, a control command each for the whole table).
    Backend::start(
        &binaries.backend,
        "vrdma-guest-backend",
        &["--allow-ud"],
        "info",
    )
}

/// What the host side does when the guest asks.
struct Requests<'a> {
    /// The backend serving the guest now (replaced by `daemon-restart`).
    backend: Backend,
    /// The peer of the application running when the backend is killed.
    restart_server: Option<Proc>,
    idle: ResourceCounts,
    /// The peer of the application that is running when the guest reboots.
    live_server: Option<Proc>,
    bypass_client: Proc,
    /// The native peer of the process the guest kills among the agent's.
    agent_victim_server: Option<Proc>,
    after_server: Option<Proc>,
    /// The peer of the guest's ping-pong on the next backend.
    after_restart_server: Option<Proc>,
    /// The rxe VM's link-local address, where the rping servers listen.
    rping_address: &'a str,
    binaries: &'a Binaries,
    settings: &'a Settings,
    seen: Reboot,
}

impl Requests<'_> {
    /// Waits until an rdma_cm id (the backend's, for a guest's server) listens on `port`.
    fn wait_listener(&self, port: u16) -> Result<()> {
        let deadline = Instant::now() + self.settings.timeout;
        while !cm_listens(&cm_ids()?, port) {
            if Instant::now() > deadline {
                return Err(Error::Scenario(format!(
                    "no rdma_cm listener on port {port}"
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }

    fn answer(&mut self, request: &str) -> Result<String> {
        match request {
            // The guest's receives are posted: stop the backend, then the guest lets the
            // native client send.
            "bypass-ready" => {
                self.backend.proc.signal("STOP")?;
                self.backend.proc.wait_state('T', Duration::from_secs(30))?;
                Ok("backend stopped".into())
            }
            // The guest verified every message: the native client must have finished with
            // the backend still stopped.
            "bypass-done" => {
                self.bypass_client.wait_success(Duration::from_secs(120))?;
                let still_stopped = self.backend.proc.state() == Some('T');
                self.backend.proc.signal("CONT")?;
                if !still_stopped {
                    return Err(Error::Scenario(
                        "the backend did not stay stopped for the whole one-way run".into(),
                    ));
                }
                Ok(format!(
                    "{BYPASS_MESSAGES} messages per op and size delivered with the backend \
                     stopped; backend resumed"
                ))
            }
            // The guest's rping server as the package's user through the agent was started: once its id
            // (the backend's, on the host) listens, a native client pings it.
            "agent-rping-server" => {
                self.wait_listener(AGENT_RPING_SERVER_PORT)?;
                let mut client = Proc::spawn(
                    "native-rping-client-of-the-agent",
                    &mut native_rping("-c", self.rping_address, AGENT_RPING_SERVER_PORT),
                )?;
                client.wait_success(self.settings.timeout)?;
                let pings = client.output().matches("ping data: rdma-ping-").count();
                Ok(format!("the native rping client verified {pings} pings"))
            }
            // Likewise for the guest's ucmatose server.
            "agent-ucmatose-server" => {
                self.wait_listener(AGENT_UCMATOSE_SERVER_PORT)?;
                let mut client = Proc::spawn(
                    "native-ucmatose-client-of-the-agent",
                    &mut native_ucmatose(self.rping_address, AGENT_UCMATOSE_SERVER_PORT, false),
                )?;
                client.wait_success(self.settings.timeout)?;
                let marks = rdmacm_utils::marks(&client.output(), UCMATOSE.client_marks)
                    .map_err(|why| client.failure(&why))?;
                Ok(format!("the native ucmatose client: {}", marks.join("; ")))
            }
            // The process the guest killed in mid-traffic is gone: its peer goes too (before
            // the release check after the reboot counts rxe0's objects).
            "agent-victim-killed" => {
                let mut server = self.agent_victim_server.take().ok_or_else(|| {
                    Error::Scenario("the victim's peer was stopped already".into())
                })?;
                server.kill();
                Ok("the killed process's native peer is stopped".into())
            }
            // The application on the backend runs: kill the backend (SIGKILL) and its peer,
            // see rxe0 return to idle while QEMU runs with no backend (the keeper removed the
            // dead backend's mappings), start the next backend and the peer of the guest's
            // next ping-pong.
            "daemon-restart" => {
                let mut server = self
                    .restart_server
                    .take()
                    .ok_or_else(|| Error::Scenario("the backend was replaced already".into()))?;
                server.wait_for_output("RUNNING", Duration::from_secs(120))?;
                let at = Instant::now();
                self.backend.proc.signal("KILL")?;
                server.kill();
                wait_for_counts(DEVICE, self.idle, RELEASE_TIMEOUT).map_err(|last| {
                    Error::Scenario(format!(
                        "{DEVICE} holds {last:?} with the backend dead, idle is {:?}",
                        self.idle
                    ))
                })?;
                let release_ms = at.elapsed().as_millis();
                self.backend = start_backend(self.binaries)?;
                self.after_restart_server = Some(native_server(
                    self.binaries,
                    AFTER_RESTART.tcp,
                    ("send,write,read", "4096", self.settings.iters),
                    self.settings.timeout,
                )?);
                Ok(format!(
                    "{DEVICE} idle {release_ms} ms after the backend's SIGKILL, QEMU up; the \
                     next backend started"
                ))
            }
            // The live application runs: the backend must hold its objects.
            "live" => {
                let server = self.live_server.as_mut().ok_or_else(|| {
                    Error::Scenario("no reboot was asked for: no live application".into())
                })?;
                server.wait_for_output("RUNNING", Duration::from_secs(120))?;
                let held = objects_of_process(DEVICE, self.backend.proc.pid())?;
                if held.qp == 0 || held.mr == 0 || held.cq == 0 {
                    let listing = Command::new("rdma")
                        .args(["resource", "show", "qp"])
                        .output()
                        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                        .unwrap_or_default();
                    return Err(Error::Scenario(format!(
                        "the backend holds {held:?} for the live application; QPs:\n{listing}"
                    )));
                }
                self.seen.live = resource_counts(DEVICE)?;
                Ok(format!(
                    "the backend holds {} QPs, {} CQs, {} MRs",
                    held.qp, held.cq, held.mr
                ))
            }
            // The guest is about to reboot with the application's objects alive; its native
            // peer goes now.
            "rebooting" => {
                if let Some(server) = &mut self.live_server {
                    server.kill();
                }
                Ok("the live application's native peer is stopped".into())
            }
            // A new boot: the old application's objects must all be gone, then the peer of
            // the next ping-pong starts.
            "rebooted" => {
                let at = Instant::now();
                // QEMU stays connected, and the backend keeps the host context of the
                // connection; nothing else may remain.
                let connected = ResourceCounts {
                    ctx: self.idle.ctx + 1,
                    ..self.idle
                };
                wait_for_counts(DEVICE, connected, RELEASE_TIMEOUT).map_err(|last| {
                    Error::Scenario(format!(
                        "{DEVICE} holds {last:?} after the reboot, expected {connected:?}"
                    ))
                })?;
                self.seen.release_ms = at.elapsed().as_millis() as u64;
                self.after_server = Some(native_server(
                    self.binaries,
                    AFTER_REBOOT.tcp,
                    ("send,write,read", "64,4096", self.settings.iters),
                    self.settings.timeout,
                )?);
                Ok(format!(
                    "{DEVICE} idle {} ms after the new boot reported",
                    self.seen.release_ms
                ))
            }
            other => Err(Error::Scenario(format!("unknown request {other:?}"))),
        }
    }
}

//! Inside the nested guest: the suite's steps, once per boot. The first boot runs
//! `ibv_devinfo`, the ping-pong, perftest and the bypass run, starts the live application,
//! records what it did and reboots; the boot after that (its record is found in the result
//! directory) has the host side confirm that everything was released and runs the ping-pong
//! again.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use super::control::ControlClient;
use super::installed::{self, ServiceUnit};
use super::*;
use crate::error::{tail, Error, IoContext, Result};
use crate::inside::Proc;
use crate::perftest::{self, Side};
use crate::relay;
use crate::scenarios::{discovery, pin_budget, rdmacm_utils};

/// What the first boot leaves in the result directory (its presence marks the reboot).
pub const FIRST_BOOT_FILE: &str = "first-boot.json";
/// What the second boot leaves.
pub const SECOND_BOOT_FILE: &str = "second-boot.json";
/// The bound of every step's waits.
const STEP_TIMEOUT: Duration = Duration::from_secs(900);

/// What the guest needs.
#[derive(Debug, Clone)]
pub struct GuestPaths {
    pub pingpong: PathBuf,
    pub library_dir: PathBuf,
    /// The rxe VM's link-local address, where the native rping server listens.
    pub rping_server: String,
    /// Where results go (`$VRDMA_RESULT_DIR`, kept across the reboot).
    pub result_dir: PathBuf,
}

/// Runs this boot's part of the suite; with `reboot`, the first boot ends in a reboot with a
/// live application.
pub fn run(paths: &GuestPaths, iters: u32, reboot: bool) -> Result<()> {
    // The serial ports, and ib_core for its /sys/class/infiniband, where the agent publishes
    // the device (no RDMA driver is loaded: the guest's only RDMA device is vrdma's).
    let load = Command::new("modprobe")
        .args(["-a", "virtio_console", "ib_core"])
        .status();
    if !load.is_ok_and(|s| s.success()) {
        return Err(Error::Scenario(
            "cannot load virtio_console and ib_core".into(),
        ));
    }
    let mut control = ControlClient::open(CONTROL_PORT)?;
    if paths.result_dir.join(FIRST_BOOT_FILE).exists() {
        second_boot(paths, &mut control, iters)
    } else {
        first_boot(paths, &mut control, iters, reboot)
    }
}

/// Records how long each step takes.
struct Phases(Vec<(String, f64)>);

impl Phases {
    /// The boot so far, from the kernel's log; the guest's uptime where the log cannot tell.
    fn starting() -> Self {
        Self(match crate::boot_timeline::suite_starts() {
            Some(timeline) => timeline
                .phases
                .into_iter()
                .map(|(name, secs)| (name.to_string(), secs))
                .collect(),
            None => vec![("boot".into(), uptime_secs())],
        })
    }

    fn time<T>(&mut self, name: &str, step: impl FnOnce() -> Result<T>) -> Result<T> {
        println!("== {name}");
        let start = Instant::now();
        let result = step();
        self.0.push((name.into(), start.elapsed().as_secs_f64()));
        result.map_err(|e| Error::Scenario(format!("{name}: {e}")))
    }
}

fn first_boot(
    paths: &GuestPaths,
    control: &mut ControlClient,
    iters: u32,
    reboot: bool,
) -> Result<()> {
    let mut phases = Phases::starting();
    let mut record = FirstBoot {
        devinfo: phases.time("ibv_devinfo", || devinfo(&paths.library_dir))?,
        pingpong: phases.time("vrdma-pingpong", || {
            pingpong_client(paths, PINGPONG, PINGPONG_OPS, PINGPONG_SIZES, iters)
        })?,
        ..Default::default()
    };
    println!("{}", record.pingpong);
    record.rping_pings = phases.time("rping", || rping_client(paths))?;
    for (case, link) in PERFTEST {
        let name = format!("{} {}", case.tool.command(), case.size);
        let side = Side::over_dropin_pci(&paths.library_dir);
        phases.time(&name, || perftest_server(&side, case, *link))?;
    }
    let agent = phases.time("unprivileged processes through vrdma-guestd", || {
        through_agent(paths, control, iters)
    })?;
    record.through_agent = agent.tables;
    record.agent_victim_released = agent.victim_released;
    record.agent_rping_pings = agent.rping_pings;
    record.agent_ucmatose = agent.ucmatose.to_vec();
    record.agent_rstream = agent.rstream;
    record.agent_published = agent.published;
    record.agent_pin_registered = agent.pin_registered;
    record.agent_pin_budget = agent.pin_budget;
    for table in &record.through_agent {
        println!("{table}");
    }
    record.bypass_messages = phases.time("bypass", || bypass(paths, control))?;
    record.daemon_restart = phases.time("the back-end killed and replaced", || {
        daemon_restart(paths, control, iters)
    })?;
    if !reboot {
        record.phases = phases.0;
        return write_json(&paths.result_dir.join(FIRST_BOOT_FILE), &record);
    }
    // The live application: traffic running, QPs, MRs and mappings alive, when the guest
    // reboots.
    let _live = phases.time("live application", || {
        let listener = relay::listen_loopback(LIVE.tcp)?;
        relay_in_background(listener, LIVE);
        let mut live = Proc::spawn(
            "vrdma-live-client",
            pingpong_command(paths, "client", LIVE.tcp)
                .args(["--ops", "send,write", "--sizes", "4096"])
                .args(["--iters", &LIVE_ITERS.to_string()]),
        )?;
        live.wait_for_output("RUNNING", STEP_TIMEOUT)?;
        let seen = control.request("live")?;
        println!("host side sees the live application: {seen}");
        Ok(live)
    })?;
    record.phases = phases.0;
    write_json(&paths.result_dir.join(FIRST_BOOT_FILE), &record)?;
    // The host side stops the native peer now: its busy polling would only slow down the
    // next boot. The application keeps every object it has.
    println!("host side: {}", control.request("rebooting")?);
    println!("== reboot -f with the application running");
    let _ = Command::new("sync").status();
    let status = Command::new("busybox").args(["reboot", "-f"]).status();
    // reboot -f does not return; if it does, the suite cannot go on.
    Err(Error::Scenario(format!("reboot -f returned ({status:?})")))
}

fn second_boot(paths: &GuestPaths, control: &mut ControlClient, iters: u32) -> Result<()> {
    let mut phases = Phases::starting();
    let released = phases.time("release check", || control.request("rebooted"))?;
    println!("host side after the reboot: {released}");
    let pingpong = phases.time("vrdma-pingpong after the reboot", || {
        pingpong_client(paths, AFTER_REBOOT, "send,write,read", "4096", iters)
    })?;
    println!("{pingpong}");
    let record = SecondBoot {
        phases: phases.0,
        pingpong,
    };
    write_json(&paths.result_dir.join(SECOND_BOOT_FILE), &record)
}

/// An application runs when the host side kills the back-end (QEMU is behind vrdma-keeper,
/// spec §11.5): it must end, failed (its objects are gone; the device tells it with
/// DEVICE_FATAL once the next back-end took over), and a new ping-pong must run in this boot.
fn daemon_restart(
    paths: &GuestPaths,
    control: &mut ControlClient,
    iters: u32,
) -> Result<DaemonRestart> {
    let listener = relay::listen_loopback(RESTART_LIVE.tcp)?;
    relay_in_background(listener, RESTART_LIVE);
    let mut live = Proc::spawn(
        "vrdma-restart-client",
        pingpong_command(paths, "client", RESTART_LIVE.tcp)
            .args(["--ops", "send,write", "--sizes", "4096"])
            .args(["--iters", &LIVE_ITERS.to_string()]),
    )?;
    live.wait_for_output("RUNNING", STEP_TIMEOUT)?;
    let host = control.request("daemon-restart")?;
    println!("host side: {host}");
    let status = live.wait_exit(STEP_TIMEOUT)?;
    let interrupted = tail(&live.output(), 3);
    println!("the application running at the kill ended ({status}): {interrupted}");
    let pingpong = pingpong_client(paths, AFTER_RESTART, "send,write,read", "4096", iters)?;
    println!("{pingpong}");
    Ok(DaemonRestart {
        interrupted,
        interrupted_succeeded: status.success(),
        host,
        pingpong,
    })
}

/// Unmodified rping over the drop-in librdmacm against the native server: the pings it
/// printed (rping checks each one with `-V` and fails on a mismatch).
fn rping_client(paths: &GuestPaths) -> Result<u32> {
    let mut client = Proc::spawn(
        "rping-client",
        &mut rping_command(paths, Command::new("rping"), "-c", RPING_PORT),
    )?;
    rping_pings(&mut client)
}

/// An rping command line (`role` `-c` or `-s`) on the rxe VM's link-local address over the
/// drop-in librdmacm, ten pings of 200 bytes, each checked (`-V`).
fn rping_command(paths: &GuestPaths, mut command: Command, role: &str, port: u16) -> Command {
    // The guest has no interface of the rxe VM's: any scope does for a link-local address,
    // the device scopes it to its host netdev (spec §7.5).
    let address = format!("{}%1", paths.rping_server);
    command
        .args([role, "-a", &address, "-p", &port.to_string()])
        .args(["-C", &RPING_COUNT.to_string(), "-S", "200", "-V", "-v"])
        .env("LD_LIBRARY_PATH", &paths.library_dir)
        .env_remove("VRDMA_SOCKET");
    command
}

/// Waits for an rping to succeed; the pings it printed, which must be all of them.
fn rping_pings(rping: &mut Proc) -> Result<u32> {
    rping.wait_success(STEP_TIMEOUT)?;
    let pings = rping.output().matches("ping data: rdma-ping-").count() as u32;
    if pings != RPING_COUNT {
        return Err(rping.failure(&format!("{pings} pings, not {RPING_COUNT}")));
    }
    Ok(pings)
}

/// Unmodified rping as the installed package's user through the agent, both ways: the
/// guest's client against a native server, then the guest's server, which the host side has a
/// native client connect to once it listens. No vrdma variable, no `LD_LIBRARY_PATH`: the
/// loader's cache gives the drop-in, which finds the agent at its default socket.
fn rping_through_agent(
    paths: &GuestPaths,
    control: &mut ControlClient,
    user: (u32, u32),
) -> Result<[u32; 2]> {
    let as_user = |role: &str, port: u16| {
        let mut command = rping_command(
            paths,
            perftest::as_user(user.0, user.1, "rping"),
            role,
            port,
        );
        command
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("VRDMA_AGENT");
        command
    };
    let mut client = Proc::spawn("agent-rping-client", &mut as_user("-c", AGENT_RPING_PORT))?;
    let client_pings = rping_pings(&mut client)?;
    let mut server = Proc::spawn(
        "agent-rping-server",
        &mut as_user("-s", AGENT_RPING_SERVER_PORT),
    )?;
    println!("host side: {}", control.request("agent-rping-server")?);
    Ok([client_pings, rping_pings(&mut server)?])
}

/// Unmodified ucmatose (RC sends over two connections, every message checked by the receiver)
/// as the installed package's user through the agent, both ways like [`rping_through_agent`]:
/// what the guest's client printed to prove a complete run, and what the host side said of
/// its native client.
fn ucmatose_through_agent(
    paths: &GuestPaths,
    control: &mut ControlClient,
    user: (u32, u32),
) -> Result<[String; 2]> {
    let program = &rdmacm_utils::UCMATOSE;
    let address = format!("{}%1", paths.rping_server);
    let as_user = |server: bool, port: u16| {
        let mut command = perftest::as_user(user.0, user.1, program.server);
        command
            .args(program.args)
            .args(rdmacm_utils::address_args(program.server, &address, port, server).0)
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("VRDMA_AGENT")
            .env_remove("VRDMA_SOCKET");
        command
    };
    let mut client = Proc::spawn(
        "agent-ucmatose-client",
        &mut as_user(false, AGENT_UCMATOSE_PORT),
    )?;
    client.wait_success(STEP_TIMEOUT)?;
    let client_marks = rdmacm_utils::marks(&client.output(), program.client_marks)
        .map_err(|why| client.failure(&why))?;
    let mut server = Proc::spawn(
        "agent-ucmatose-server",
        &mut as_user(true, AGENT_UCMATOSE_SERVER_PORT),
    )?;
    let host_client = control.request("agent-ucmatose-server")?;
    println!("host side: {host_client}");
    server.wait_success(STEP_TIMEOUT)?;
    rdmacm_utils::marks(&server.output(), program.server_marks)
        .map_err(|why| server.failure(&why))?;
    Ok([client_marks.join("; "), host_client])
}

/// Unmodified rstream (rsockets, every byte of a running counter checked by the receiver) as
/// the installed package's user through the agent, its client against the host side's native
/// server: what the client printed to prove a complete run.
fn rstream_through_agent(paths: &GuestPaths, user: (u32, u32)) -> Result<String> {
    let program = &rdmacm_utils::RSTREAM_BLOCKING;
    let address = format!("{}%1", paths.rping_server);
    let mut command = perftest::as_user(user.0, user.1, program.client);
    command
        .args(program.args)
        .args(rdmacm_utils::address_args(program.client, &address, AGENT_RSTREAM_PORT, false).0)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("VRDMA_AGENT")
        .env_remove("VRDMA_SOCKET");
    let mut client = Proc::spawn("agent-rstream-client", &mut command)?;
    client.wait_success(STEP_TIMEOUT)?;
    let marks = rdmacm_utils::marks(&client.output(), program.client_marks)
        .map_err(|why| client.failure(&why))?;
    Ok(marks.join("; "))
}

/// `ibv_devinfo` over the drop-in: it must list vrdma0 with an active port.
fn devinfo(library_dir: &Path) -> Result<String> {
    let out = Command::new("ibv_devinfo")
        .env("LD_LIBRARY_PATH", library_dir)
        .env_remove("VRDMA_SOCKET")
        .output()
        .context(|| "running ibv_devinfo".into())?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() || !text.contains(perftest::DROPIN_DEVICE) {
        return Err(Error::Scenario(format!(
            "ibv_devinfo ({}) does not list {}:\n{text}",
            out.status,
            perftest::DROPIN_DEVICE
        )));
    }
    if !text.contains("PORT_ACTIVE") {
        return Err(Error::Scenario(format!("no active port:\n{text}")));
    }
    println!("{}", text.trim_end());
    Ok(text)
}

fn pingpong_command(paths: &GuestPaths, role: &str, port: u16) -> Command {
    let mut cmd = Command::new(&paths.pingpong);
    cmd.args([role, "--pci", "--host", "127.0.0.1"])
        .args(["--port", &port.to_string()])
        .args(["--timeout", &STEP_TIMEOUT.as_secs().to_string()])
        .env_remove("VRDMA_SOCKET");
    cmd
}

/// The verified ping-pong as a client over `link`; returns its table.
fn pingpong_client(
    paths: &GuestPaths,
    link: Link,
    ops: &str,
    sizes: &str,
    iters: u32,
) -> Result<String> {
    let listener = relay::listen_loopback(link.tcp)?;
    relay_in_background(listener, link);
    let out = pingpong_command(paths, "client", link.tcp)
        .args([
            "--ops",
            ops,
            "--sizes",
            sizes,
            "--iters",
            &iters.to_string(),
        ])
        .output()
        .context(|| "running vrdma-pingpong".into())?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(Error::Scenario(format!(
            "vrdma-pingpong failed ({}):\n{text}{}",
            out.status,
            tail(&String::from_utf8_lossy(&out.stderr), 20)
        )));
    }
    Ok(text)
}

/// One perftest case's server on `side`; the native client, which connects through
/// the relay as soon as the server listens, measures.
fn perftest_server(side: &Side, case: &perftest::Case, link: Link) -> Result<()> {
    let child = side
        .server_command(case, link.tcp)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context(|| format!("starting {}", case.tool.command()))?;
    thread::spawn(move || {
        if let Err(e) = relay::connect_serial_to_tcp(link.serial, link.tcp, STEP_TIMEOUT) {
            eprintln!("relay {}: {e}", link.serial);
        }
    });
    perftest::finish(child, STEP_TIMEOUT, "server", case).map(drop)
}

/// What the guest agent step showed.
struct ThroughAgent {
    tables: Vec<String>,
    victim_released: String,
    rping_pings: [u32; 2],
    ucmatose: [String; 2],
    rstream: String,
    published: Vec<(String, String)>,
    pin_registered: u64,
    pin_budget: String,
}

/// The guest side installed from its Debian package (`installed`), the agent started as its
/// unit says, driving the PCI function and serving a member of `rdma` (programs run with no
/// vrdma variable and no `LD_LIBRARY_PATH`): a process running traffic, then two verified
/// ping-pongs at once against their native servers while a hostile root process pins up to
/// its budget and is refused past it, and the first one is SIGKILLed (the agent must release
/// what it left; the two must finish verified); the isolation checks between two of its
/// processes; unmodified perftest servers, the native clients measuring; rping and ucmatose
/// both ways; rstream's client against a native server. The agent stops as `systemctl stop`
/// stops it and the package is purged at the end (the next step opens the function directly,
/// which resets it).
fn through_agent(
    paths: &GuestPaths,
    control: &mut ControlClient,
    iters: u32,
) -> Result<ThroughAgent> {
    let start = Instant::now();
    // Where this step's time goes (it is the suite's longest).
    let lap = |what: &str| println!("  {:7.1} s  {what}", start.elapsed().as_secs_f64());
    // Installed by dpkg into this root before it booted (`installed::InstalledRoot`).
    let user = installed::user()?;
    let unit = ServiceUnit::installed_agent()?;
    installed::configure(
        &unit,
        &[
            (
                "VRDMA_GUESTD_ARGS",
                format!(
                    "--guest-ram-mib={AGENT_PROCESS_MIB} \
                     --max-pinned-mib-per-user={AGENT_PIN_BUDGET_MIB}"
                ),
            ),
            // What the suite waits for in its log.
            ("RUST_LOG", "info".into()),
        ],
    )?;
    let socket = Path::new(installed::AGENT_SOCKET);
    let mut agent = unit.start("vrdma-guestd")?;
    let client = |link: Link, ops: &str, sizes: &str, iters: u32| -> Result<Proc> {
        let listener = relay::listen_loopback(link.tcp)?;
        relay_in_background(listener, link);
        let mut command = perftest::as_user(user.0, user.1, &paths.pingpong);
        command
            .args(["client", "--agent"])
            .arg(socket)
            .args(["--host", "127.0.0.1", "--port", &link.tcp.to_string()])
            .args(["--timeout", &STEP_TIMEOUT.as_secs().to_string()])
            .args(["--ops", ops, "--sizes", sizes])
            .args(["--iters", &iters.to_string()])
            // Three of these run at once on the guest's two vCPUs, beside the agent's
            // doorbell relay: sleeping on completion events leaves the CPUs to whoever works.
            .arg("--events")
            .env_remove("VRDMA_SOCKET");
        Proc::spawn(&format!("agent-client-{}", link.tcp), &mut command)
    };
    lap("the agent started as its unit says");
    let result = (|| {
        agent.wait_for_output("serving", STEP_TIMEOUT)?;
        lap("the agent serves");
        // The agent publishes once it serves its own session: it logs either way.
        agent.wait_for_output("published", STEP_TIMEOUT)?;
        if agent.output().contains("not published") {
            return Err(agent.failure("the agent did not publish the device"));
        }
        let published = discovery::published_in_vm(socket)?;
        lap("the agent published the device");
        // All three start at once: each one's start is mostly waiting (on the agent, the
        // device, its peer across the relay), and one after the other they took minutes.
        let mut victim = client(AGENT_VICTIM, "send,write", "4096", LIVE_ITERS)?;
        let mut survivors = THROUGH_AGENT
            .iter()
            .map(|link| client(*link, AGENT_OPS, AGENT_SIZES, iters))
            .collect::<Result<Vec<_>>>()?;
        for process in std::iter::once(&mut victim).chain(&mut survivors) {
            process.wait_for_output("RUNNING", STEP_TIMEOUT)?;
        }
        lap("three ping-pongs as a member of rdma run");
        let hog = pin_budget::pin_past_budget(socket, agent.pid(), AGENT_PIN_BUDGET_MIB)?;
        let pin_summary = hog.summary(AGENT_PIN_BUDGET_MIB);
        println!("hostile root process: {pin_summary}");
        lap("the hostile process is at its budget");
        victim.kill();
        let released = format!("process {}: released", victim.pid());
        agent.wait_for_output(&released, STEP_TIMEOUT)?;
        let victim_released = agent
            .output()
            .lines()
            .find(|line| line.contains(&released))
            .unwrap_or_default()
            .to_string();
        println!("{victim_released}");
        println!("host side: {}", control.request("agent-victim-killed")?);
        lap("the killed process's objects released");
        let mut tables = Vec::new();
        for mut survivor in survivors {
            survivor.wait_success(STEP_TIMEOUT)?;
            tables.push(survivor.output());
        }
        lap("the two ping-pongs finished, verified");
        let pin_registered = hog.registered;
        let left = pin_budget::release(hog, STEP_TIMEOUT)?;
        let pin_budget = format!(
            "{pin_summary}; the guest's shared memory back to {left} KiB once it closed them"
        );
        lap("the hostile process's memory is given back");
        crate::scenarios::isolation::run_through_agent(socket)?;
        lap("isolation checks");
        let side = Side::installed(user.0, user.1);
        for (case, link) in AGENT_PERFTEST {
            perftest_server(&side, case, *link)?;
            lap(&format!("perftest {} {}", case.tool.command(), case.size));
        }
        let rping_pings = rping_through_agent(paths, control, user)?;
        lap("rping both ways");
        let ucmatose = ucmatose_through_agent(paths, control, user)?;
        lap("ucmatose both ways");
        let rstream = rstream_through_agent(paths, user)?;
        lap("rstream against a native server");
        Ok(ThroughAgent {
            tables,
            victim_released,
            rping_pings,
            ucmatose,
            rstream,
            published,
            pin_registered,
            pin_budget,
        })
    })();
    match result {
        Ok(through) => {
            unit.stop(&mut agent, STEP_TIMEOUT)?;
            lap("the agent stopped as its unit says");
            Ok(through)
        }
        Err(e) => {
            eprintln!("vrdma-guestd:\n{}", tail(&agent.output(), 30));
            agent.kill();
            Err(e)
        }
    }
}

/// The guest as the one-way server: once its receives are posted, the host side stops the
/// backend and a native client writes and sends into the guest, which verifies every message
/// before the backend runs again.
fn bypass(paths: &GuestPaths, control: &mut ControlClient) -> Result<u32> {
    let start_file = std::env::temp_dir().join("vrdma-bypass-go");
    let _ = std::fs::remove_file(&start_file);
    thread::spawn(|| {
        if let Err(e) = relay::connect_serial_to_tcp(BYPASS.serial, BYPASS.tcp, STEP_TIMEOUT) {
            eprintln!("relay {}: {e}", BYPASS.serial);
        }
    });
    let mut server = Proc::spawn(
        "vrdma-bypass-server",
        pingpong_command(paths, "server", BYPASS.tcp)
            .args(["--ops", BYPASS_OPS, "--sizes", BYPASS_SIZES])
            .args(["--iters", &BYPASS_MESSAGES.to_string()])
            .arg("--oneway")
            .arg("--start-file")
            .arg(&start_file),
    )?;
    server.wait_for_output("READY", STEP_TIMEOUT)?;
    println!("host side: {}", control.request("bypass-ready")?);
    std::fs::write(&start_file, b"go").context(|| "writing the start file".into())?;
    // The server prints its verdict before it destroys anything (which needs the backend).
    server.wait_for_output("verified", STEP_TIMEOUT)?;
    println!("host side: {}", control.request("bypass-done")?);
    server.wait_success(STEP_TIMEOUT)?;
    Ok(BYPASS_MESSAGES)
}

/// Relays the next connection to `listener` over `link`'s serial port. The relay is not
/// joined: a serial port has no end of stream, so its reading side ends only with the guest;
/// a relay that fails leaves the client it serves without a peer, which fails the step.
fn relay_in_background(listener: TcpListener, link: Link) {
    thread::spawn(move || {
        if let Err(e) = relay::serve_serial(listener, link.serial, STEP_TIMEOUT) {
            eprintln!("relay {}: {e}", link.serial);
        }
    });
}

fn uptime_secs() -> f64 {
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<()> {
    let json = serde_json::to_vec_pretty(value).map_err(|e| Error::Scenario(e.to_string()))?;
    std::fs::write(path, json).context(|| format!("writing {}", path.display()))
}

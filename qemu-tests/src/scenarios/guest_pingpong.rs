//! Full-guest test, run inside the rxe VM: a real Linux guest booted under QEMU 11.1 with the
//! vrdma device runs `vrdma-pingpong --pci` (the library's PCI transport: sysfs BARs, hugepage
//! rings, pagemap translation) against the native peer on rxe0, every byte verified.
//!
//! The guest needs hardware acceleration: a guest OS under TCG inside the TCG-emulated rxe VM
//! takes far too long to be a test. Without usable KVM in the rxe VM the scenario reports
//! "skipped" with the reason instead of failing; `VRDMA_GUEST_ACCEL=tcg` forces a run anyway.
//!
//! The guest has no network: the ping-pong's out-of-band TCP exchange travels over a
//! virtio-serial port, relayed to loopback TCP on both sides ([`crate::relay`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::backend::Backend;
use super::process_pingpong::{Binaries, DEVICE};
use crate::error::{Error, Result};
use crate::inside::Proc;
use crate::relay;
use crate::rootfs::PreparedRoot;
use crate::vm::{self, Accel, VmConfig};

/// Name of the virtio-serial port carrying the out-of-band exchange.
pub const OOB_PORT_NAME: &str = "vrdma-oob";
/// Guest RAM in MiB (shared with the backend through a memfd).
const GUEST_MEMORY_MIB: u32 = 1024;
/// 2 MiB hugepages reserved in the guest for the driver's ring memory.
const GUEST_HUGEPAGES: u32 = 64;

/// What to run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The prepared root file system (shared into the rxe VM at its host path).
    pub root_dir: PathBuf,
    pub ops: String,
    pub sizes: String,
    pub iters: u32,
    /// TCP port of the exchange on both sides.
    pub port: u16,
    /// Bound on the whole guest run.
    pub timeout: Duration,
}

/// How the run went.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// The guest could not be accelerated.
    Skipped { reason: String },
    /// The guest ran the ping-pong; `report` is vrdma-pingpong's table.
    Passed {
        accel: String,
        report: String,
        elapsed_secs: f64,
    },
}

/// The QEMU device arguments that give the guest the vrdma device and the serial port.
pub fn guest_device_args(backend_socket: &Path, oob_chardev: &Path) -> Vec<String> {
    [
        "-object".to_owned(),
        format!("memory-backend-memfd,id=mem,size={GUEST_MEMORY_MIB}M,share=on"),
        "-machine".to_owned(),
        "memory-backend=mem".to_owned(),
        "-chardev".to_owned(),
        format!("socket,id=vrdma0,path={}", backend_socket.display()),
        "-device".to_owned(),
        "vhost-user-test-device-pci,chardev=vrdma0,virtio-id=38,num_vqs=3,vq_size=256,config_size=64"
            .to_owned(),
        "-chardev".to_owned(),
        format!(
            "socket,id=oob,path={},server=on,wait=off",
            oob_chardev.display()
        ),
        "-device".to_owned(),
        "virtio-serial-pci".to_owned(),
        "-device".to_owned(),
        format!("virtserialport,chardev=oob,name={OOB_PORT_NAME}"),
    ]
    .into()
}

/// The shell command the guest runs: the serial relay in the background, then the client.
pub fn guest_command(relay_exe: &Path, pingpong: &Path, settings: &Settings) -> Vec<String> {
    let port = settings.port;
    let script = format!(
        "modprobe virtio_console 2>/dev/null; \
         {relay} guest serial-relay --name {OOB_PORT_NAME} --port {port} & \
         sleep 1; \
         exec {pingpong} client --pci --host 127.0.0.1 --port {port} \
         --ops {ops} --sizes {sizes} --iters {iters} --timeout 120",
        relay = vm::shell_quote(&relay_exe.to_string_lossy()),
        pingpong = vm::shell_quote(&pingpong.to_string_lossy()),
        ops = vm::shell_quote(&settings.ops),
        sizes = vm::shell_quote(&settings.sizes),
        iters = settings.iters,
    );
    vec!["sh".into(), "-c".into(), script]
}

/// Runs the full-guest test (inside the rxe VM).
pub fn run(binaries: &Binaries, settings: &Settings) -> Result<Outcome> {
    let root = PreparedRoot::load(&settings.root_dir).ok_or_else(|| {
        Error::Scenario(format!(
            "no prepared root file system at {}",
            settings.root_dir.display()
        ))
    })?;
    let accel = match std::env::var("VRDMA_GUEST_ACCEL").ok().as_deref() {
        Some("tcg") => Accel::Tcg,
        Some("kvm") => Accel::Kvm,
        _ => match Accel::kvm_unusable(&root) {
            None => Accel::Kvm,
            Some(why) => {
                return Ok(Outcome::Skipped {
                    reason: format!("needs KVM for the guest ({why})"),
                })
            }
        },
    };

    let backend = Backend::start(&binaries.backend, "vrdma-guest-backend", &[], "info")?;
    let mut native = Proc::spawn(
        "native pingpong server",
        Command::new(&binaries.native_pingpong)
            .args(["server", "--device", DEVICE])
            .args(["--port", &settings.port.to_string()])
            .args(["--ops", &settings.ops, "--sizes", &settings.sizes])
            .args(["--iters", &settings.iters.to_string()])
            .args(["--timeout", &settings.timeout.as_secs().to_string()]),
    )?;
    let oob_chardev = std::env::temp_dir().join("vrdma-guest-oob.sock");
    let _ = std::fs::remove_file(&oob_chardev);
    let relay_target = oob_chardev.clone();
    let (port, relay_timeout) = (settings.port, settings.timeout);
    let relay = std::thread::spawn(move || {
        relay::connect_chardev_to_tcp(&relay_target, port, relay_timeout)
    });

    let mut config = VmConfig::for_host(accel)?;
    config.cpus = 2;
    config.memory_mib = GUEST_MEMORY_MIB;
    config.timeout = settings.timeout;
    config.extra_qemu_args = guest_device_args(&backend.socket, &oob_chardev);
    config.extra_kernel_args = vec![format!("hugepages={GUEST_HUGEPAGES}")];
    let exe = std::env::current_exe()
        .map_err(|e| Error::Scenario(format!("locating this executable: {e}")))?;
    let command = guest_command(&exe, &binaries.pingpong, settings);
    let outcome = vm::run(&root, &config, &command)?;

    match relay.join() {
        Ok(Ok(threads)) => drop(threads),
        Ok(Err(e)) => log::warn!("out-of-band relay: {e}"),
        Err(_) => log::warn!("out-of-band relay panicked"),
    }
    if outcome.status != 0 {
        native.kill();
        return Err(Error::Scenario(format!(
            "the guest's vrdma-pingpong failed (status {}):\n{}\n--- native peer ---\n{}",
            outcome.status,
            outcome.output.trim_end(),
            native.output().trim_end()
        )));
    }
    native.wait_success(Duration::from_secs(30))?;
    drop(backend);
    Ok(Outcome::Passed {
        accel: format!("{accel:?}"),
        report: outcome.output,
        elapsed_secs: outcome.elapsed.as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guest_gets_shared_ram_the_device_and_the_serial_port() {
        let args = guest_device_args(Path::new("/run/b.sock"), Path::new("/run/o.sock"));
        let joined = args.join(" ");
        assert!(joined.contains("memory-backend-memfd,id=mem,size=1024M,share=on"));
        assert!(joined.contains("path=/run/b.sock"));
        assert!(joined.contains("virtio-id=38,num_vqs=3"));
        assert!(joined.contains("path=/run/o.sock,server=on,wait=off"));
        assert!(joined.contains("name=vrdma-oob"));
    }

    #[test]
    fn the_guest_command_relays_then_runs_the_client_over_pci() {
        let settings = Settings {
            root_dir: PathBuf::from("/r"),
            ops: "send,write".into(),
            sizes: "64".into(),
            iters: 5,
            port: 18700,
            timeout: Duration::from_secs(60),
        };
        let command = guest_command(Path::new("/t/vrdma-vm"), Path::new("/t/pp"), &settings);
        assert_eq!(command[..2], ["sh", "-c"]);
        let script = &command[2];
        assert!(script.contains("/t/vrdma-vm guest serial-relay --name vrdma-oob --port 18700 &"));
        assert!(script.contains("exec /t/pp client --pci --host 127.0.0.1 --port 18700"));
        assert!(script.contains("--ops send,write --sizes 64 --iters 5"));
    }
}

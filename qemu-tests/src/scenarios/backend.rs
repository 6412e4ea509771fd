//! A vrdma-backend started for a scenario inside the VM.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::error::Result;
use crate::inside::{wait_for_path, Proc, DEVICE};

/// A running vrdma-backend serving [`DEVICE`] on a socket in the temporary directory.
pub struct Backend {
    pub proc: Proc,
    pub socket: PathBuf,
}

impl Backend {
    /// Fails if the backend has exited: one that died during `what` would have failed its
    /// clients, one that died while they tore down must fail the run too.
    pub fn check_alive(&mut self, what: &str) -> Result<()> {
        match self.proc.try_wait()? {
            Some(status) => Err(self
                .proc
                .failure(&format!("vrdma-backend exited during {what} ({status})"))),
            None => Ok(()),
        }
    }

    /// Where the output of the backend started as `name` goes.
    pub fn log_path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("{name}.log"))
    }

    /// Starts `binary` as `name` (socket `name.sock`, output `name.log` in the temporary
    /// directory) with `extra_args`, logging at `RUST_LOG` or `default_log`, and waits until it
    /// listens.
    pub fn start(
        binary: &Path,
        name: &str,
        extra_args: &[&str],
        default_log: &str,
    ) -> Result<Self> {
        let socket = std::env::temp_dir().join(format!("{name}.sock"));
        let _ = std::fs::remove_file(&socket);
        let mut cmd = Command::new(binary);
        cmd.arg("--socket")
            .arg(&socket)
            .args(["--device", DEVICE])
            .args(extra_args)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or(default_log.into()),
            );
        let mut proc = Proc::spawn(name, &mut cmd)?;
        if let Err(e) = wait_for_path(&socket, Duration::from_secs(30)) {
            let _ = proc.try_wait();
            return Err(proc.failure(&e.to_string()));
        }
        Ok(Self { proc, socket })
    }
}

/// A vrdma-keeper started for a scenario: QEMU connects to [`Keeper::socket`], the keeper
/// relays to a daemon's socket and holds the connection across the daemon's restarts.
pub struct Keeper {
    pub proc: Proc,
    pub socket: PathBuf,
}

impl Keeper {
    /// Starts `binary` as `name` (socket `name.sock`, output `name.log` in the temporary
    /// directory) in front of the daemon socket `daemon`, and waits until it listens.
    pub fn start(binary: &Path, name: &str, daemon: &Path) -> Result<Self> {
        let socket = std::env::temp_dir().join(format!("{name}.sock"));
        let _ = std::fs::remove_file(&socket);
        let mut proc = Proc::spawn(
            name,
            Command::new(binary)
                .arg("--socket")
                .arg(&socket)
                .arg("--backend")
                .arg(daemon)
                .args(["--retry-ms", "50"])
                .env(
                    "RUST_LOG",
                    std::env::var("RUST_LOG").unwrap_or("info".into()),
                ),
        )?;
        if let Err(e) = wait_for_path(&socket, Duration::from_secs(30)) {
            let _ = proc.try_wait();
            return Err(proc.failure(&e.to_string()));
        }
        Ok(Self { proc, socket })
    }

    /// Fails if the keeper has exited: the VM behind it lost its device.
    pub fn check_alive(&mut self) -> Result<()> {
        match self.proc.try_wait()? {
            Some(status) => Err(self
                .proc
                .failure(&format!("vrdma-keeper exited ({status})"))),
            None => Ok(()),
        }
    }
}

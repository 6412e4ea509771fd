//! Host-side prerequisites: commands the harness runs, installed with apt-get when missing.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::error::{tail, Error, Result};

/// A command the harness needs on the host, and the Debian package that ships it.
#[derive(Debug, Clone, Copy)]
pub struct Tool {
    pub command: &'static str,
    pub package: &'static str,
}

/// Everything `prepare` and `run` need on the host. Debian 12's own QEMU is enough to boot the
/// rxe VM: the VM needs nothing newer than virtio-9p and a serial port.
pub const HOST_TOOLS: &[Tool] = &[
    Tool {
        command: "mmdebstrap",
        package: "mmdebstrap",
    },
    Tool {
        command: "qemu-system-x86_64",
        package: "qemu-system-x86",
    },
    Tool {
        command: "xz",
        package: "xz-utils",
    },
    // Unpacks the kernel's zstd payload (see `kernel_image`).
    Tool {
        command: "zstd",
        package: "zstd",
    },
];

/// Finds `command` on `PATH`.
pub fn which(command: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(command))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Whether this process runs as root (read from /proc, so no libc call is needed).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| effective_uid(&status))
        == Some(0)
}

fn effective_uid(proc_status: &str) -> Option<u32> {
    let line = proc_status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Installs the packages of every missing tool with apt-get (as root), idempotently.
pub fn ensure_tools(tools: &[Tool]) -> Result<()> {
    let mut missing: Vec<&str> = tools
        .iter()
        .filter(|t| which(t.command).is_none())
        .map(|t| t.package)
        .collect();
    missing.dedup();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        return Err(Error::Prerequisite(format!(
            "missing {}; install as root: apt-get install --no-install-recommends {}",
            tools
                .iter()
                .filter(|t| which(t.command).is_none())
                .map(|t| t.command)
                .collect::<Vec<_>>()
                .join(", "),
            missing.join(" ")
        )));
    }
    apt_install(&missing)?;
    for tool in tools {
        if which(tool.command).is_none() {
            return Err(Error::Prerequisite(format!(
                "{} still missing after installing {}",
                tool.command, tool.package
            )));
        }
    }
    Ok(())
}

/// `apt-get update` and `apt-get install --no-install-recommends PACKAGES` (as root), one
/// process of this harness at a time: parallel tests on a fresh machine would otherwise run
/// apt-get at once and all but one fail on apt's locks. Other apt users are waited for too
/// (`DPkg::Lock::Timeout`).
pub fn apt_install(packages: &[&str]) -> Result<()> {
    let lock_dir = Path::new("/run/lock");
    let lock_path = if lock_dir.is_dir() {
        lock_dir.join("vrdma-apt-get.lock")
    } else {
        std::env::temp_dir().join("vrdma-apt-get.lock")
    };
    let lock = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|source| Error::io(format!("opening {}", lock_path.display()), source))?;
    lock.lock()
        .map_err(|source| Error::io(format!("locking {}", lock_path.display()), source))?;
    log::info!("installing host packages: {}", packages.join(" "));
    run_checked(apt_get().arg("update"))?;
    run_checked(
        apt_get()
            .args(["install", "-y", "--no-install-recommends"])
            .args(packages),
    )
    .map(drop)
}

fn apt_get() -> Command {
    let mut cmd = Command::new("apt-get");
    cmd.env("DEBIAN_FRONTEND", "noninteractive").args([
        "-q",
        "-o",
        "Dpkg::Use-Pty=0",
        "-o",
        "DPkg::Lock::Timeout=600",
    ]);
    cmd
}

/// Runs `cmd` to completion, capturing its output; a non-zero exit is an error that carries the
/// tail of what it printed.
pub fn run_checked(cmd: &mut Command) -> Result<Output> {
    let shown = describe(cmd);
    log::debug!("running {shown}");
    let output = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| Error::io(format!("starting `{shown}`"), source))?;
    if output.status.success() {
        return Ok(output);
    }
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    Err(Error::Command {
        command: shown,
        status: output.status.to_string(),
        output_tail: tail(&text, 30),
    })
}

/// A command line as a person would type it, for messages.
pub fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(OsStr::to_string_lossy)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The QEMU binary (`$VRDMA_QEMU`, else `qemu-system-x86_64` on the PATH).
pub fn qemu_binary() -> String {
    std::env::var("VRDMA_QEMU").unwrap_or_else(|_| "qemu-system-x86_64".into())
}

/// A fresh directory `<prefix>-<pid>-<n>` under the system temp dir.
pub fn unique_temp_dir(prefix: &str) -> Result<std::path::PathBuf> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_effective_uid() {
        let status = "Name:\tx\nUid:\t1000\t0\t0\t0\nGid:\t0\t0\t0\t0\n";
        assert_eq!(effective_uid(status), Some(0));
        assert_eq!(effective_uid("Name:\tx\n"), None);
    }

    #[test]
    fn which_finds_sh_and_not_nonsense() {
        assert!(which("sh").is_some());
        assert!(which("vrdma-no-such-command").is_none());
    }

    #[test]
    fn failed_command_reports_its_output() {
        let err = run_checked(Command::new("sh").args(["-c", "echo boom >&2; exit 3"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("boom") && err.contains('3'), "{err}");
    }
}

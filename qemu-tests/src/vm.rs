//! Booting the rxe VM and running one command in it.
//!
//! The VM shares the prepared root read-only (under a tmpfs overlay), a per-run directory
//! read-write (scripts in; exit status and result files out) and any number of host directories
//! read-only at their host paths. The kernel console goes to a log file; the command's output
//! comes back on a second serial port and is streamed as it arrives.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::accel::Accel;
use crate::boot_timeline::SCRIPT_MARKER;
use crate::error::{tail, Error, IoContext, Result};
use crate::host::{qemu_binary, unique_temp_dir};
use crate::initramfs::{INIT_FAILED_MARKER, ROOT_TAG, RUN_DIR_IN_VM, RUN_TAG};
use crate::rootfs::PreparedRoot;
use crate::vm_link::{LinkEnd, LINK_NETDEV};
use crate::vm_snapshot::Snapshot;

/// A host directory visible in the VM at the same path, read-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    pub host_path: PathBuf,
}

/// Keeps the shares needed to see every path in `paths`, dropping those nested in another.
pub fn shares_for(paths: impl IntoIterator<Item = PathBuf>) -> Vec<Share> {
    let mut paths: Vec<PathBuf> = paths.into_iter().collect();
    paths.sort();
    paths.dedup();
    let mut kept: Vec<PathBuf> = Vec::new();
    for path in paths {
        if !kept.iter().any(|k| path.starts_with(k)) {
            kept.push(path);
        }
    }
    kept.into_iter()
        .map(|host_path| Share { host_path })
        .collect()
}

/// What one VM run looks like.
#[derive(Debug, Clone)]
pub struct VmConfig {
    pub accel: Accel,
    pub cpus: u32,
    pub memory_mib: u32,
    pub timeout: Duration,
    pub shares: Vec<Share>,
    /// Environment variables set for the command inside the VM.
    pub env: Vec<(String, String)>,
    /// Working directory of the command inside the VM.
    pub cwd: PathBuf,
    /// Echo the command's output live to this process's stdout.
    pub echo: bool,
    /// More QEMU arguments (devices, memory backends) appended to the VM's command line.
    pub extra_qemu_args: Vec<String>,
    /// More kernel command-line parameters (e.g. `hugepages=64`).
    pub extra_kernel_args: Vec<String>,
    /// A guest reboot resets the machine and boots again (the command runs once per boot)
    /// instead of ending the run.
    pub allow_reboot: bool,
    /// Bring up rxe0 before the command (a nested guest that reaches RDMA only through vrdma
    /// needs none, and boots faster without it).
    pub with_rxe: bool,
    /// This VM's end of a link to another VM ([`crate::vm_link`]): rxe0 then runs on that NIC
    /// instead of a VM-internal dummy netdev.
    pub link: Option<LinkEnd>,
}

/// What came back from the VM.
#[derive(Debug)]
pub struct RunOutcome {
    /// The command's exit status.
    pub status: i32,
    /// Everything the command printed (stdout and stderr interleaved).
    pub output: String,
    /// Files the command left in `$VRDMA_RESULT_DIR`, by name.
    pub results: Vec<(String, Vec<u8>)>,
    pub elapsed: Duration,
}

/// How long a VM run may take unless told otherwise: a hang bound.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// `$VRDMA_VM_TIMEOUT` in seconds, if set to a number.
pub fn timeout_from_env() -> Option<Duration> {
    std::env::var("VRDMA_VM_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs)
}

/// Variables passed from the host into the VM's command when set.
const FORWARDED_ENV: &[&str] = &["RUST_LOG", "RUST_BACKTRACE", "CI"];

impl VmConfig {
    /// Defaults for this host: all CPUs, 4 GiB, shares of the workspace and target directory.
    pub fn for_host(accel: Accel) -> Result<Self> {
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(2)
            .min(8);
        let cwd = std::env::current_dir().context(|| "current directory".into())?;
        let mut env: Vec<(String, String)> = FORWARDED_ENV
            .iter()
            .filter_map(|name| std::env::var(name).ok().map(|v| (name.to_string(), v)))
            .collect();
        env.extend(std::env::vars().filter(|(k, _)| k.starts_with("VRDMA_") && k != "VRDMA_CACHE"));
        Ok(Self {
            accel,
            cpus,
            memory_mib: 4096,
            timeout: timeout_from_env().unwrap_or(DEFAULT_TIMEOUT),
            shares: shares_for(default_share_paths(&cwd)),
            env,
            cwd,
            echo: true,
            extra_qemu_args: Vec::new(),
            extra_kernel_args: Vec::new(),
            allow_reboot: false,
            with_rxe: true,
            link: None,
        })
    }
}

/// The workspace (found from this executable or the working directory) and the cargo target
/// directory holding this executable, so test binaries and tools run inside at their host paths.
fn default_share_paths(cwd: &Path) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    let exe = std::env::current_exe().ok();
    for start in exe.iter().map(PathBuf::as_path).chain([cwd]) {
        if let Some(ws) = find_workspace_root(start) {
            paths.push(ws);
        }
    }
    if let Some(target) = exe.as_deref().and_then(find_target_dir) {
        paths.push(target);
    }
    if paths.is_empty() {
        paths.push(cwd.to_path_buf());
    }
    paths
}

/// The nearest ancestor holding a Cargo.toml with a `[workspace]` table.
pub fn find_workspace_root(start: &Path) -> Option<PathBuf> {
    start.ancestors().find_map(|dir| {
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).ok()?;
        manifest
            .lines()
            .any(|l| l.trim() == "[workspace]")
            .then(|| dir.to_path_buf())
    })
}

/// The cargo target directory (it holds a CACHEDIR.TAG) above `exe`.
pub fn find_target_dir(exe: &Path) -> Option<PathBuf> {
    exe.ancestors()
        .skip(1)
        .find(|dir| dir.join("CACHEDIR.TAG").is_file())
        .map(Path::to_path_buf)
}

/// Quotes `s` for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The script that runs as the VM's init after the root is mounted: brings up rxe0 on a
/// VM-internal dummy netdev, runs the command with its output on the second serial port, writes
/// its exit status to the run directory and powers off.
pub fn guest_init_script(config: &VmConfig, command: &[String]) -> String {
    let exports: String = config
        .env
        .iter()
        .map(|(k, v)| format!("export {k}={}\n", shell_quote(v)))
        .collect();
    let command: Vec<String> = command.iter().map(|a| shell_quote(a)).collect();
    format!(
        r#"#!/bin/sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
# Marks where the boot is, in the kernel's log (crate::boot_timeline).
echo "{SCRIPT_MARKER}" > /dev/kmsg 2>/dev/null
# /tmp needs no tmpfs of its own: the overlay root is already writable memory, and a tmpfs here
# would hide host directories shared below /tmp (a checkout in /tmp, say).
chmod 1777 /tmp
mkdir -p /dev/pts /dev/shm /dev/hugepages
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t hugetlbfs hugetlbfs /dev/hugepages
hostname {hostname}
finish() {{ echo "$1" > {RUN_DIR_IN_VM}/status; sync; busybox poweroff -f; }}
{link_function}setup() {{
    ip link set lo up &&
    modprobe rdma_rxe &&
    modprobe rdma_ucm &&
    {netdev_setup} &&
    rdma link add rxe0 type rxe netdev {netdev} || return 1
    for _ in $(seq 100); do
        grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null && return 0
        sleep 0.1
    done
    echo "rxe0 port did not become ACTIVE"; return 1
}}
{setup}
echo "{COMMAND_STARTING}"
ulimit -l unlimited
stty -F /dev/ttyS1 raw -echo 2>/dev/null
{exports}export VRDMA_RESULT_DIR={RUN_DIR_IN_VM}/results
# The command's output is a serial terminal, but it ends up in logs: no colour codes.
export RUST_LOG_STYLE=never
cd {cwd} || finish 126
{command} </dev/null >/dev/ttyS1 2>&1
finish $?
"#,
        cwd = shell_quote(&config.cwd.to_string_lossy()),
        command = command.join(" "),
        hostname = match &config.link {
            Some(link) => format!("vrdma-{}", link.host.name()),
            None => "vrdma-vm".into(),
        },
        link_function = config
            .link
            .as_ref()
            .map(LinkEnd::init_function)
            .unwrap_or_default(),
        netdev_setup = match config.link {
            Some(_) => "link_setup",
            None => "modprobe dummy && ip link add d0 type dummy && ip link set d0 up",
        },
        netdev = match config.link {
            Some(_) => LINK_NETDEV,
            None => "d0",
        },
        setup = if config.with_rxe {
            r#"if ! setup; then echo "vrdma-vm: RDMA setup failed"; finish 125; fi"#
        } else {
            "ip link set lo up"
        },
    )
}

/// Printed on the console once rxe0 is up, right before the command starts.
const COMMAND_STARTING: &str = "vrdma-vm: set up, starting the command";

/// Boots the VM from `root` with `config`, runs `command` in it and returns its outcome.
///
/// A boot that dies before the command started (TCG occasionally panics a guest kernel early
/// in boot) is retried once: nothing has run yet, so nothing can happen twice.
pub fn run(root: &PreparedRoot, config: &VmConfig, command: &[String]) -> Result<RunOutcome> {
    if command.is_empty() {
        return Err(Error::Usage("no command to run in the VM".into()));
    }
    let snapshot = snapshot_of_target(config)?;
    let mut attempt = 1;
    loop {
        let run_dir = tempdir("run")?;
        let outcome = run_in(root, config, command, &run_dir, snapshot.as_ref());
        let started = std::fs::read_to_string(run_dir.join("console.log"))
            .is_ok_and(|console| console.contains(COMMAND_STARTING));
        if let Err(e) = std::fs::remove_dir_all(&run_dir) {
            log::warn!("cannot remove {}: {e}", run_dir.display());
        }
        match outcome {
            Err(Error::Boot {
                reason,
                console_tail,
            }) if !started && attempt == 1 => {
                log::warn!(
                    "the VM died before the command started ({reason}); booting once more\n{console_tail}"
                );
                attempt += 1;
            }
            outcome => return outcome,
        }
    }
}

/// The snapshot of the cargo target directory holding this executable, when the VM sees it
/// through a share: the binaries the VM runs, frozen against builds while it runs
/// ([`crate::vm_snapshot`]).
fn snapshot_of_target(config: &VmConfig) -> Result<Option<Snapshot>> {
    let exe = std::env::current_exe().context(|| "locating this executable".into())?;
    let Some(target) = find_target_dir(&exe) else {
        return Ok(None);
    };
    if !config
        .shares
        .iter()
        .any(|share| target.starts_with(&share.host_path))
    {
        return Ok(None);
    }
    let snapshot = Snapshot::take(&target)?;
    match &snapshot {
        Some(s) => log::info!(
            "{SNAPSHOT_TAKEN} {} in {}",
            target.display(),
            s.dir.display()
        ),
        None => log::debug!("{} is read-only: shared as it is", target.display()),
    }
    Ok(snapshot)
}

/// Kernel arguments that make a throwaway test VM boot and run faster, most of all a nested
/// guest under TCG inside TCG, where every cold instruction is translated twice (a nested boot
/// of Debian's kernel spent 300 s in the kernel alone):
/// - `cryptomgr.notests`: the crypto self-tests of every built-in algorithm at registration;
/// - `mitigations=off`: a test VM's kernel guards no secrets, and TCG does not speculate;
/// - `init_on_alloc=0`: Debian zeroes every page allocation (the boot's huge pages among them),
///   and again where it maps one to user space;
/// - `kfence.sample_interval=0`: no sampled allocations, no timer for them.
pub const TEST_VM_KERNEL_ARGS: &[&str] = &[
    "cryptomgr.notests",
    "mitigations=off",
    "init_on_alloc=0",
    "kfence.sample_interval=0",
];

/// Logged once the VM's binaries are frozen: a build may replace them from then on.
pub const SNAPSHOT_TAKEN: &str = "the VM runs from a snapshot of";

fn run_in(
    root: &PreparedRoot,
    config: &VmConfig,
    command: &[String],
    run_dir: &Path,
    snapshot: Option<&Snapshot>,
) -> Result<RunOutcome> {
    let results_dir = run_dir.join("results");
    std::fs::create_dir_all(&results_dir).context(|| "creating results dir".into())?;
    // The snapshot is mounted last, over the target directory inside a share.
    let exports: Vec<(&Path, &Path)> = config
        .shares
        .iter()
        .map(|s| (s.host_path.as_path(), s.host_path.as_path()))
        .chain(snapshot.map(|s| (s.dir.as_path(), s.target.as_path())))
        .collect();
    let mounts: String = exports
        .iter()
        .enumerate()
        .map(|(i, (_, at))| format!("vrdma-share{i} {} ro,cache=loose\n", at.display()))
        .collect();
    write(run_dir.join("mounts"), mounts.as_bytes())?;
    write(
        run_dir.join("init.sh"),
        guest_init_script(config, command).as_bytes(),
    )?;
    let console = run_dir.join("console.log");

    let mut cmd = Command::new(qemu_binary());
    cmd.args(["-nodefaults", "-no-user-config", "-machine", "q35"])
        .args(config.accel.qemu_args())
        .args(["-smp", &config.cpus.to_string()])
        .args(["-m", &config.memory_mib.to_string()])
        .args(["-display", "none"])
        .args(if config.allow_reboot {
            &[][..]
        } else {
            &["-no-reboot"][..]
        })
        .arg("-kernel")
        .arg(&root.kernel)
        .arg("-initrd")
        .arg(&root.initramfs)
        .arg("-append")
        .arg(
            // tsc=reliable: under TCG the guest's TSC is the host's (linear in real time), but
            // the clocksource watchdog compares it against HPET reads that a busy TCG delays,
            // declares it unstable within seconds and switches to HPET. gettimeofday then traps
            // into QEMU, and perftest's clock calibration (a TSC against gettimeofday fit that
            // must reach r² 0.9) failed in one run of six.
            ["console=ttyS0 panic=-1 loglevel=4 rw tsc=reliable"]
                .into_iter()
                .chain(TEST_VM_KERNEL_ARGS.iter().copied())
                .chain(config.extra_kernel_args.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(" "),
        )
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .args(["-chardev", "stdio,id=cmdout,signal=off"])
        .args(["-serial", "chardev:cmdout"]);
    let mut add_9p = |tag: &str, path: &Path, options: &str| {
        let id = format!("fs-{tag}");
        cmd.arg("-fsdev").arg(format!(
            "local,id={id},path={},security_model=none{options}",
            path.display(),
        ));
        cmd.arg("-device")
            .arg(format!("virtio-9p-pci,fsdev={id},mount_tag={tag}"));
    };
    add_9p(
        ROOT_TAG,
        &root.tree,
        if root.layered {
            ",readonly=on,multidevs=remap"
        } else {
            ",readonly=on"
        },
    );
    add_9p(RUN_TAG, run_dir, "");
    for (i, (source, _)) in exports.iter().enumerate() {
        add_9p(&format!("vrdma-share{i}"), source, ",readonly=on");
    }
    if let Some(link) = &config.link {
        cmd.args(link.qemu_args());
    }
    cmd.args(&config.extra_qemu_args);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    log::debug!("starting {}", crate::host::describe(&cmd));

    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .context(|| format!("starting {} (is QEMU installed?)", qemu_binary()))?;
    let output = Arc::new(Mutex::new(String::new()));
    let stdout = child.stdout.take().expect("stdout is piped");
    let echo = config.echo;
    // Two linked VMs echo at once: each line says whose it is.
    let prefix = config
        .link
        .as_ref()
        .map(|link| format!("[{}] ", link.host.name()))
        .unwrap_or_default();
    let collected = Arc::clone(&output);
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).split(b'\n') {
            let Ok(line) = line else { break };
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches('\r');
            if echo {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{prefix}{line}");
                let _ = out.flush();
            }
            let mut all = collected.lock();
            all.push_str(line);
            all.push('\n');
        }
    });
    let mut stderr = child.stderr.take().expect("stderr is piped");
    let stderr_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });

    let exited = wait_timeout(&mut child, config.timeout)?;
    if !exited {
        let _ = child.kill();
        let _ = child.wait();
    }
    let _ = reader.join();
    let qemu_stderr = stderr_reader.join().unwrap_or_default();
    let elapsed = started.elapsed();
    let console_text = std::fs::read_to_string(&console).unwrap_or_default();
    let console_tail = || {
        let mut t = tail(&console_text, 80);
        if !qemu_stderr.trim().is_empty() {
            t.push_str("\n--- qemu stderr ---\n");
            t.push_str(&tail(
                &crate::error::summarize_qemu_stderr(&qemu_stderr),
                10,
            ));
        }
        t
    };
    if !exited {
        return Err(Error::Boot {
            reason: format!("timed out after {:?} (VRDMA_VM_TIMEOUT)", config.timeout),
            console_tail: console_tail(),
        });
    }
    let status = std::fs::read_to_string(run_dir.join("status")).ok();
    let Some(status) = status.and_then(|s| s.trim().parse::<i32>().ok()) else {
        let reason = if console_text.contains(INIT_FAILED_MARKER) {
            "the VM's init failed".to_string()
        } else {
            format!(
                "QEMU exited ({:?}) before the command finished",
                child.try_wait().ok().flatten()
            )
        };
        return Err(Error::Boot {
            reason,
            console_tail: console_tail(),
        });
    };
    if status == 125 || status == 126 {
        return Err(Error::Boot {
            reason: format!("setup inside the VM failed (status {status})"),
            console_tail: console_tail(),
        });
    }
    let mut results = Vec::new();
    for entry in std::fs::read_dir(&results_dir)
        .context(|| "reading results".into())?
        .flatten()
    {
        let data = std::fs::read(entry.path()).context(|| "reading a result".into())?;
        results.push((entry.file_name().to_string_lossy().into_owned(), data));
    }
    let output = std::mem::take(&mut *output.lock());
    Ok(RunOutcome {
        status,
        output,
        results,
        elapsed,
    })
}

fn write(path: PathBuf, data: &[u8]) -> Result<()> {
    std::fs::write(&path, data).context(|| format!("writing {}", path.display()))
}

/// Waits up to `timeout` for `child`; `Ok(false)` if it is still running.
fn wait_timeout(child: &mut Child, timeout: Duration) -> Result<bool> {
    let deadline = Instant::now() + timeout;
    loop {
        if child
            .try_wait()
            .context(|| "waiting for QEMU".into())?
            .is_some()
        {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A fresh directory for one run, under the system temp dir.
fn tempdir(what: &str) -> Result<PathBuf> {
    unique_temp_dir(&format!("vrdma-vm-{what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_shares_are_folded() {
        let shares = shares_for([
            PathBuf::from("/work/main/target"),
            PathBuf::from("/work/main"),
            PathBuf::from("/elsewhere/target"),
            PathBuf::from("/work/main"),
        ]);
        let paths: Vec<_> = shares.iter().map(|s| s.host_path.clone()).collect();
        assert_eq!(
            paths,
            [
                PathBuf::from("/elsewhere/target"),
                PathBuf::from("/work/main")
            ]
        );
    }

    #[test]
    fn quoting_survives_the_shell() {
        for arg in ["plain", "with space", "it's", "", "$HOME", "a\"b", "x;y"] {
            let out = Command::new("sh")
                .args(["-c", &format!("printf %s {}", shell_quote(arg))])
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout), arg);
        }
    }

    #[test]
    fn workspace_root_is_found_from_a_member() {
        let member = Path::new(env!("CARGO_MANIFEST_DIR"));
        let root = find_workspace_root(member).unwrap();
        assert!(root.join("qemu-tests").is_dir());
        assert!(member.starts_with(&root));
    }

    #[test]
    fn init_script_runs_the_command_quoted_in_its_directory() {
        let config = VmConfig {
            accel: Accel::Tcg,
            cpus: 1,
            memory_mib: 512,
            timeout: Duration::from_secs(1),
            shares: vec![],
            env: vec![("RUST_LOG".into(), "debug x".into())],
            cwd: PathBuf::from("/work/main"),
            echo: false,
            extra_qemu_args: Vec::new(),
            extra_kernel_args: Vec::new(),
            allow_reboot: false,
            with_rxe: true,
            link: None,
        };
        let script = guest_init_script(&config, &["echo".into(), "a b".into()]);
        assert!(script.contains("export RUST_LOG='debug x'"));
        assert!(script.contains("cd /work/main"));
        assert!(script.contains("echo 'a b' </dev/null >/dev/ttyS1"));
        assert!(script.contains("rdma link add rxe0 type rxe netdev d0"));
        assert!(
            !script.contains("tmpfs /tmp"),
            "would hide shares below /tmp"
        );
        assert!(script.find(COMMAND_STARTING) < script.find("echo 'a b'"));
    }
}

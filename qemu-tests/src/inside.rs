//! Tools for test scenarios that run *inside* the rxe VM: child processes with logs and
//! deadlines, signals, and the host RDMA device's resource counts.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{tail, Error, Result};

/// The RDMA device inside the VM.
pub const DEVICE: &str = "rxe0";

/// Debian's `nobody` and `nogroup`: the ordinary user application processes run as.
pub const NOBODY: (u32, u32) = (65534, 65534);

/// How long [`Proc::kill`] waits for a killed process to exit.
const KILL_WAIT: Duration = Duration::from_secs(60);

/// A child process whose output goes to a log file, killed when dropped.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr in `/tmp/<name>.log`.
    pub fn spawn(name: &str, cmd: &mut Command) -> Result<Self> {
        let log = std::env::temp_dir().join(format!("{name}.log"));
        let out =
            File::create(&log).map_err(|e| Error::io(format!("creating {}", log.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| Error::io("duplicating a log file", e))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| {
                Error::io(
                    format!("starting {name} ({})", crate::host::describe(cmd)),
                    e,
                )
            })?;
        Ok(Self {
            name: name.to_string(),
            child,
            log,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the process printed so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the process printed `needle`, failing if it exits first or `timeout` passes.
    pub fn wait_for_output(&mut self, needle: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.output().contains(needle) {
                return Ok(());
            }
            if let Some(status) = self.try_wait()? {
                return Err(self.failure(&format!("exited ({status}) before printing {needle:?}")));
            }
            if Instant::now() >= deadline {
                return Err(self.failure(&format!("did not print {needle:?} within {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        self.child
            .try_wait()
            .map_err(|e| Error::io(format!("waiting for {}", self.name), e))
    }

    /// Waits for the process to exit within `timeout` and returns its status; kills it and
    /// fails otherwise.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(self.failure(&format!("did not exit within {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the process to exit successfully within `timeout`; kills it otherwise.
    pub fn wait_success(&mut self, timeout: Duration) -> Result<()> {
        let status = self.wait_exit(timeout)?;
        if status.success() {
            Ok(())
        } else {
            Err(self.failure(&format!("failed ({status})")))
        }
    }

    /// Waits until a TCP socket listens on `port` (the out-of-band exchange of perftest and the
    /// libibverbs examples), so that a client never races this server's start-up.
    pub fn wait_listening(&mut self, port: u16, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while !tcp_listening(port) {
            if let Some(status) = self.try_wait()? {
                return Err(self.failure(&format!("exited ({status}) before listening")));
            }
            if Instant::now() >= deadline {
                return Err(self.failure(&format!("not listening on {port} after {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        // A process SIGKILLed inside a kernel wait it cannot leave (a verbs call stuck in
        // rdma_rxe) never exits: teardown goes on without it rather than hang the suite.
        let deadline = Instant::now() + KILL_WAIT;
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let pid = self.pid();
        let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
        log::warn!(
            "{} (pid {pid}) did not exit {}s after SIGKILL (waiting in {wchan:?}); going on",
            self.name,
            KILL_WAIT.as_secs()
        );
    }

    /// Sends a signal by name (`STOP`, `CONT`, `TERM`, `KILL`).
    pub fn signal(&self, signal: &str) -> Result<()> {
        crate::host::run_checked(
            Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(self.pid().to_string()),
        )
        .map(drop)
    }

    /// The scheduler state letter of the process (`R`, `S`, `T` for stopped, …).
    pub fn state(&self) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).ok()?;
        // The command name in parentheses may hold spaces: the state follows the last ')'.
        stat.rsplit_once(')')?.1.trim_start().chars().next()
    }

    /// Number of open file descriptors.
    /// Waits until the process is in `state` (`ps` letter: `T` once a SIGSTOP took effect,
    /// which is not at once).
    pub fn wait_state(&self, state: char, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.state() != Some(state) {
            if Instant::now() >= deadline {
                return Err(self.failure(&format!("not in state {state} after {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    pub fn fd_count(&self) -> Option<usize> {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .ok()
            .map(|d| d.count())
    }

    /// Resident set size in KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    /// An error naming this process, with the tail of its log.
    pub fn failure(&self, what: &str) -> Error {
        Error::Scenario(format!(
            "{} {what}\n--- last lines of {} ---\n{}",
            self.name,
            self.log.display(),
            tail(&self.output(), 25)
        ))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// Each thread of process `pid`, one line each: its name and the kernel function it waits in
/// (`/proc/PID/task/*/wchan`), for the diagnostics of a hang.
pub fn thread_waits(pid: u32) -> String {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return format!("(process {pid} is gone)\n");
    };
    let mut lines: Vec<String> = tasks
        .flatten()
        .map(|task| {
            let read = |file: &str| {
                std::fs::read_to_string(task.path().join(file))
                    .map(|text| text.trim().to_string())
                    .unwrap_or_default()
            };
            format!(
                "{} {:<16} {}\n",
                task.file_name().to_string_lossy(),
                read("comm"),
                read("wchan")
            )
        })
        .collect();
    lines.sort();
    lines.concat()
}

/// Whether a TCP socket of this machine listens on `port` (IPv4 or IPv6).
pub fn tcp_listening(port: u16) -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .any(|table| listens_on(&table, port))
}

/// Whether a /proc/net/tcp{,6} table has a socket in LISTEN (state 0A) on `port`.
pub fn listens_on(table: &str, port: u16) -> bool {
    let wanted = format!("{port:04X}");
    table.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let local_port = fields.get(1).and_then(|a| a.rsplit(':').next());
        local_port == Some(wanted.as_str()) && fields.get(3) == Some(&"0A")
    })
}

/// Waits until `path` exists (a daemon's socket).
pub fn wait_for_path(path: &Path, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !path.exists() {
        if Instant::now() >= deadline {
            return Err(Error::Scenario(format!(
                "{} did not appear within {timeout:?}",
                path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Objects the kernel holds on one RDMA device (`rdma resource show`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceCounts {
    pub pd: u64,
    pub cq: u64,
    pub qp: u64,
    pub mr: u64,
    #[serde(default)]
    pub srq: u64,
    #[serde(default)]
    pub ctx: u64,
    /// Connection-manager ids (the kernel's rdma_cm, on this device).
    #[serde(default)]
    pub cm_id: u64,
}

#[derive(Deserialize)]
struct ResourceLine {
    ifname: String,
    #[serde(flatten)]
    counts: ResourceCounts,
}

/// Parses `rdma -j resource show` for `device`.
pub fn parse_resource_counts(json: &str, device: &str) -> Result<ResourceCounts> {
    let lines: Vec<ResourceLine> = serde_json::from_str(json)
        .map_err(|e| Error::Scenario(format!("rdma -j resource show: {e}: {json}")))?;
    lines
        .into_iter()
        .find(|l| l.ifname == device)
        .map(|l| l.counts)
        .ok_or_else(|| Error::Scenario(format!("no {device} in rdma resource show: {json}")))
}

/// The current resource counts of `device`.
pub fn resource_counts(device: &str) -> Result<ResourceCounts> {
    let out = crate::host::run_checked(Command::new("rdma").args(["-j", "resource", "show"]))?;
    parse_resource_counts(&String::from_utf8_lossy(&out.stdout), device)
}

/// The objects that process `pid` holds on `device` (`rdma resource show pd|cq|qp|mr|srq`
/// lists each object with the thread that created it, so every thread of `pid` counts).
pub fn objects_of_process(device: &str, pid: u32) -> Result<ResourceCounts> {
    let threads: Vec<u64> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map_err(|e| Error::io(format!("listing the threads of {pid}"), e))?
        .flatten()
        .filter_map(|t| t.file_name().to_str()?.parse().ok())
        .collect();
    let mut counts = ResourceCounts::default();
    for kind in ["pd", "cq", "qp", "mr", "srq"] {
        let out =
            crate::host::run_checked(Command::new("rdma").args(["-j", "resource", "show", kind]))?;
        let n = count_objects_of(&String::from_utf8_lossy(&out.stdout), device, &threads)?;
        match kind {
            "pd" => counts.pd = n,
            "cq" => counts.cq = n,
            "qp" => counts.qp = n,
            "mr" => counts.mr = n,
            _ => counts.srq = n,
        }
    }
    Ok(counts)
}

/// Counts the entries of one `rdma -j resource show KIND` listing on `device` created by one
/// of `threads`.
pub fn count_objects_of(json: &str, device: &str, threads: &[u64]) -> Result<u64> {
    let entries: Vec<serde_json::Value> = serde_json::from_str(json)
        .map_err(|e| Error::Scenario(format!("rdma -j resource show: {e}: {json}")))?;
    Ok(entries
        .iter()
        .filter(|e| {
            e["ifname"] == device && e["pid"].as_u64().is_some_and(|p| threads.contains(&p))
        })
        .count() as u64)
}

/// Waits until `device`'s counts equal `expected` (objects are released asynchronously after
/// a process dies), returning the last counts seen on timeout.
pub fn wait_for_counts(
    device: &str,
    expected: ResourceCounts,
    timeout: Duration,
) -> Result<(), ResourceCounts> {
    let deadline = Instant::now() + timeout;
    let mut last = ResourceCounts::default();
    while Instant::now() < deadline {
        match resource_counts(device) {
            Ok(counts) if counts == expected => return Ok(()),
            Ok(counts) => last = counts,
            Err(_) => {}
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(last)
}

/// rxe's hardware counters of port 1 (`sent_pkts`, `duplicate_request`, `rcvd_seq_err`, …).
pub fn rxe_counters() -> Result<BTreeMap<String, u64>> {
    let dir = format!("/sys/class/infiniband/{DEVICE}/ports/1/hw_counters");
    let entries =
        std::fs::read_dir(&dir).map_err(|e| Error::Scenario(format!("reading {dir}: {e}")))?;
    let mut counters = BTreeMap::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Ok(value) = std::fs::read_to_string(entry.path()) {
            if let Ok(value) = value.trim().parse() {
                counters.insert(name, value);
            }
        }
    }
    Ok(counters)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_listening_sockets() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue
   0: 00000000:4853 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0
   1: 0100007F:4854 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0
";
        assert!(listens_on(table, 0x4853));
        assert!(!listens_on(table, 0x4854), "established, not listening");
        assert!(!listens_on(table, 1));
    }

    #[test]
    fn parses_rdma_json() {
        let json = r#"[{"ifindex":0,"ifname":"rxe0","pd":1,"cq":1,"qp":1,"cm_id":2,"mr":0,"ctx":0,"srq":0}
]"#;
        let counts = parse_resource_counts(json, "rxe0").unwrap();
        assert_eq!(
            counts,
            ResourceCounts {
                pd: 1,
                cq: 1,
                qp: 1,
                mr: 0,
                srq: 0,
                ctx: 0,
                cm_id: 2
            }
        );
        assert!(parse_resource_counts(json, "rxe1").is_err());
        assert!(parse_resource_counts("nonsense", "rxe0").is_err());
    }

    #[test]
    fn objects_are_counted_by_owner() {
        let json = r#"[{"ifindex":2,"ifname":"rxe0","lqpn":17,"type":"RC","pid":40,"comm":"vrdma-backend"},
{"ifindex":2,"ifname":"rxe0","lqpn":18,"type":"RC","pid":41,"comm":"ib_write_bw"},
{"ifindex":2,"ifname":"rxe0","lqpn":1,"type":"GSI","comm":"[ib_core]"},
{"ifindex":3,"ifname":"rxe1","lqpn":19,"type":"RC","pid":40,"comm":"vrdma-backend"}]"#;
        assert_eq!(count_objects_of(json, "rxe0", &[40]).unwrap(), 1);
        assert_eq!(count_objects_of(json, "rxe0", &[40, 41]).unwrap(), 2);
        assert_eq!(count_objects_of(json, "rxe0", &[42]).unwrap(), 0);
        assert_eq!(count_objects_of("[]", "rxe0", &[40]).unwrap(), 0);
        assert!(count_objects_of("nonsense", "rxe0", &[40]).is_err());
    }

    #[test]
    fn process_lifecycle_and_introspection() {
        let mut p = Proc::spawn(
            &format!("vrdma-proc-test-{}", std::process::id()),
            Command::new("sh").args(["-c", "echo READY; sleep 30"]),
        )
        .unwrap();
        p.wait_for_output("READY", Duration::from_secs(10)).unwrap();
        assert!(p.fd_count().unwrap() >= 3);
        assert!(p.rss_kib().unwrap() > 0);
        p.signal("STOP").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while p.state() != Some('T') && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(p.state(), Some('T'));
        p.signal("CONT").unwrap();
        p.kill();
        assert!(p.try_wait().unwrap().is_some());
    }

    #[test]
    fn failing_process_reports_its_output() {
        let mut p = Proc::spawn(
            &format!("vrdma-proc-fail-{}", std::process::id()),
            Command::new("sh").args(["-c", "echo broken pipe dream; exit 4"]),
        )
        .unwrap();
        let err = p
            .wait_success(Duration::from_secs(10))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("broken pipe dream") && err.contains('4'),
            "{err}"
        );
    }
}

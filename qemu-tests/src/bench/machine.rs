//! What a result was measured on, so that runs can be compared over time.

use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::vm::VmConfig;

/// One system: the host or the VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemInfo {
    /// `model name` of the first CPU in /proc/cpuinfo.
    pub cpu_model: String,
    /// CPUs this process may run on.
    pub cpus: u32,
    /// Kernel release.
    pub kernel: String,
    /// MemTotal in MiB.
    pub memory_mib: u64,
}

impl SystemInfo {
    /// The system this process runs on.
    pub fn this_machine() -> SystemInfo {
        let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
        SystemInfo {
            cpu_model: cpu_model(&read("/proc/cpuinfo")).unwrap_or_else(|| "unknown".into()),
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get() as u32),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            memory_mib: mem_total_kib(&read("/proc/meminfo")).unwrap_or(0) >> 10,
        }
    }
}

/// The host, the VM and the build a result came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    pub host: SystemInfo,
    pub guest: SystemInfo,
    /// `Kvm` or `Tcg`.
    pub accel: String,
    pub vcpus: u32,
    pub vm_memory_mib: u32,
    /// Cargo profile of the binaries (`debug`, `release`).
    pub profile: String,
    /// `git describe --always --dirty` of the workspace, when it is a git checkout.
    pub commit: Option<String>,
    /// Seconds since the epoch when the run ended.
    pub unix_time: u64,
}

impl Machine {
    /// The machine of a VM run with `config` whose guest reported `guest`.
    pub fn describe(config: &VmConfig, guest: SystemInfo) -> Machine {
        let exe = std::env::current_exe().ok();
        let profile = exe
            .as_deref()
            .and_then(Path::parent)
            .and_then(Path::file_name)
            .map_or_else(|| "unknown".into(), |n| n.to_string_lossy().into_owned());
        Machine {
            host: SystemInfo::this_machine(),
            guest,
            accel: format!("{:?}", config.accel),
            vcpus: config.cpus,
            vm_memory_mib: config.memory_mib,
            profile,
            commit: commit(),
            unix_time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }

    /// One line for the table's heading.
    pub fn summary(&self) -> String {
        format!(
            "host: {} ({} CPUs, Linux {}); VM: {} {}, {} vCPUs, {} MiB, Linux {}; {} build{}",
            self.host.cpu_model,
            self.host.cpus,
            self.host.kernel,
            self.accel,
            self.guest.cpu_model,
            self.vcpus,
            self.vm_memory_mib,
            self.guest.kernel,
            self.profile,
            self.commit
                .as_deref()
                .map(|c| format!(" of {c}"))
                .unwrap_or_default()
        )
    }
}

fn commit() -> Option<String> {
    let workspace = crate::vm::find_workspace_root(Path::new(env!("CARGO_MANIFEST_DIR")))?;
    let out = Command::new("git")
        .arg("-C")
        .arg(workspace)
        .args(["describe", "--always", "--dirty"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// `model name` of the first processor in a /proc/cpuinfo text.
pub fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == "model name").then(|| value.trim().to_string())
    })
}

/// MemTotal (KiB) of a /proc/meminfo text.
pub fn mem_total_kib(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cpu_model_and_memory() {
        let cpuinfo = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: QEMU TCG CPU version 2.5+\n\nprocessor\t: 1\nmodel name\t: other\n";
        assert_eq!(
            cpu_model(cpuinfo).as_deref(),
            Some("QEMU TCG CPU version 2.5+")
        );
        assert_eq!(cpu_model("processor : 0\n"), None);
        assert_eq!(
            mem_total_kib("MemTotal:        4026580 kB\nMemFree: 1 kB\n"),
            Some(4026580)
        );
        assert_eq!(mem_total_kib("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn this_machine_has_a_kernel_and_cpus() {
        let info = SystemInfo::this_machine();
        assert!(!info.kernel.is_empty());
        assert!(info.cpus >= 1);
    }
}

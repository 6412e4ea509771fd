//! How QEMU runs a VM's CPUs: KVM where a probe guest boots under it, TCG otherwise.
//!
//! An openable /dev/kvm is not enough: some hypervisors expose one that cannot run a normal
//! guest (on this project's machines a KVM guest prints nothing and never boots). The probe
//! boots the root's kernel to the initramfs's probe marker; its verdict holds for the host's
//! boot and is kept in the cache, so only the first `vrdma-vm` of a boot pays for a probe.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cache::Cache;
use crate::error::{Error, Result};
use crate::host::{qemu_binary, unique_temp_dir};
use crate::initramfs::PROBE_MARKER;
use crate::rootfs::PreparedRoot;

/// How QEMU runs the guest CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

/// How long a probe guest under KVM may take to reach the initramfs.
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);
/// A KVM guest's kernel prints its banner on the console at once; one that has printed nothing
/// for this long does not run at all.
const PROBE_SILENCE: Duration = Duration::from_secs(15);

impl Accel {
    pub(crate) fn qemu_args(self) -> &'static [&'static str] {
        match self {
            Accel::Kvm => &["-accel", "kvm", "-cpu", "host"],
            Accel::Tcg => &["-accel", "tcg,thread=multi", "-cpu", "max"],
        }
    }

    /// `VRDMA_ACCEL=kvm|tcg` decides; otherwise KVM is used only if a probe boot under it
    /// works.
    pub fn choose(root: &PreparedRoot) -> Result<Accel> {
        Self::choose_by("VRDMA_ACCEL", root)
    }

    /// [`Accel::choose`] with the environment variable `variable` deciding.
    pub fn choose_by(variable: &str, root: &PreparedRoot) -> Result<Accel> {
        match std::env::var(variable).ok().as_deref() {
            Some("kvm") => return Ok(Accel::Kvm),
            Some("tcg") => return Ok(Accel::Tcg),
            Some("") | None => {}
            Some(other) => {
                return Err(Error::Usage(format!(
                    "{variable}={other}: expected kvm or tcg"
                )))
            }
        }
        match Accel::kvm_unusable(root) {
            None => {
                log::info!("KVM works: using it");
                Ok(Accel::Kvm)
            }
            Some(why) => {
                log::info!("KVM unavailable or unusable ({why}): using TCG");
                Ok(Accel::Tcg)
            }
        }
    }

    /// Why KVM cannot run a guest here, or `None` if a probe boot under it worked (in this
    /// host boot: the verdict is kept).
    pub fn kvm_unusable(root: &PreparedRoot) -> Option<String> {
        if let Err(e) = std::fs::File::options()
            .read(true)
            .write(true)
            .open("/dev/kvm")
        {
            return Some(format!("/dev/kvm: {e}"));
        }
        let verdict_file = verdict_file();
        if let Some(verdict) = verdict_file.as_deref().and_then(Verdict::read) {
            return verdict.unusable();
        }
        let verdict = if probe_kvm(root) {
            Verdict::Works
        } else {
            Verdict::Unusable
        };
        if let Some(path) = verdict_file {
            verdict.write(&path);
        }
        verdict.unusable()
    }
}

/// What a probe boot under KVM showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Works,
    Unusable,
}

impl Verdict {
    const WORKS: &'static str = "works";
    const UNUSABLE: &'static str = "unusable";

    fn unusable(self) -> Option<String> {
        match self {
            Verdict::Works => None,
            Verdict::Unusable => {
                Some("/dev/kvm opens but a probe guest did not boot under KVM".into())
            }
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text.trim() {
            Self::WORKS => Some(Verdict::Works),
            Self::UNUSABLE => Some(Verdict::Unusable),
            _ => None,
        }
    }

    fn read(path: &Path) -> Option<Self> {
        Self::parse(&std::fs::read_to_string(path).ok()?)
    }

    /// Keeps the verdict for this boot and drops those of earlier boots. Best effort: a cache
    /// that cannot be written only means the next run probes again.
    fn write(self, path: &Path) {
        let text = match self {
            Verdict::Works => Self::WORKS,
            Verdict::Unusable => Self::UNUSABLE,
        };
        let Some(dir) = path.parent() else { return };
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                if name.to_string_lossy().starts_with(VERDICT_PREFIX) && entry.path() != path {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        // Written whole and renamed, so that a concurrent run reads all of it or nothing.
        let partial = path.with_extension(format!("{}.tmp", std::process::id()));
        if std::fs::write(&partial, text).is_ok() && std::fs::rename(&partial, path).is_err() {
            let _ = std::fs::remove_file(&partial);
        }
    }
}

const VERDICT_PREFIX: &str = "kvm-probe-";

/// The cache file of this host boot's verdict (`None` without a cache or a boot id).
fn verdict_file() -> Option<PathBuf> {
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let cache = Cache::from_env().ok()?;
    Some(verdict_path(cache.dir(), &boot_id))
}

fn verdict_path(cache: &Path, boot_id: &str) -> PathBuf {
    let id: String = boot_id
        .trim()
        .chars()
        .filter(|c| c.is_ascii_hexdigit() || *c == '-')
        .collect();
    cache.join(format!("{VERDICT_PREFIX}{id}"))
}

fn probe_kvm(root: &PreparedRoot) -> bool {
    let Ok(dir) = unique_temp_dir("vrdma-vm-probe") else {
        return false;
    };
    let console = dir.join("console.log");
    let mut cmd = Command::new(qemu_binary());
    cmd.args(["-nodefaults", "-no-user-config", "-machine", "q35"])
        .args(Accel::Kvm.qemu_args())
        .args(["-m", "256", "-display", "none", "-no-reboot"])
        .arg("-kernel")
        .arg(&root.kernel)
        .arg("-initrd")
        .arg(&root.initramfs)
        .args(["-append", "console=ttyS0 panic=-1 vrdma.probe=1"])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let ok = match cmd.spawn() {
        Ok(mut child) => {
            let started = Instant::now();
            let booted = loop {
                let shown = std::fs::read_to_string(&console).unwrap_or_default();
                if shown.contains(PROBE_MARKER) {
                    break true;
                }
                let exited = child.try_wait().map_or(true, |status| status.is_some());
                let waited = started.elapsed();
                if exited
                    || waited >= PROBE_TIMEOUT
                    || (shown.is_empty() && waited >= PROBE_SILENCE)
                {
                    break false;
                }
                std::thread::sleep(Duration::from_millis(100));
            };
            let _ = child.kill();
            let _ = child.wait();
            booted
        }
        Err(_) => false,
    };
    let _ = std::fs::remove_dir_all(dir);
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accel_arguments() {
        assert!(Accel::Tcg.qemu_args().contains(&"tcg,thread=multi"));
        assert!(Accel::Kvm.qemu_args().contains(&"kvm"));
    }

    #[test]
    fn a_verdict_is_kept_for_its_boot_only() {
        let dir = unique_temp_dir("vrdma-vm-verdict-test").unwrap();
        let this_boot = verdict_path(&dir, "4e9ba5fb-b5e7-4203-9f77-7eeb752e92b7\n");
        let earlier = verdict_path(&dir, "00000000-0000-0000-0000-000000000000");
        Verdict::Works.write(&earlier);
        assert_eq!(Verdict::read(&earlier), Some(Verdict::Works));
        assert_eq!(Verdict::read(&this_boot), None);
        Verdict::Unusable.write(&this_boot);
        assert_eq!(Verdict::read(&this_boot), Some(Verdict::Unusable));
        assert!(!earlier.exists(), "an earlier boot's verdict is dropped");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_boot_id_cannot_name_a_path_outside_the_cache() {
        let path = verdict_path(Path::new("/cache"), "../../etc/x");
        assert_eq!(path, Path::new("/cache/kvm-probe-ec"));
    }

    #[test]
    fn an_unreadable_verdict_means_probing_again() {
        assert_eq!(Verdict::parse("works\n"), Some(Verdict::Works));
        assert_eq!(Verdict::parse("unusable"), Some(Verdict::Unusable));
        assert_eq!(Verdict::parse(""), None);
        assert_eq!(Verdict::parse("maybe"), None);
    }
}

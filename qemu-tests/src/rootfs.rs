//! The Debian trixie root file system of the rxe VM, built once with mmdebstrap into the cache.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use crate::cache::Cache;
use crate::error::{Error, IoContext, Result};
use crate::host::{ensure_tools, is_root, run_checked, HOST_TOOLS};
use crate::initramfs;
use crate::kernel_image;

/// What goes into the root file system. Changing any of it builds a new root (the cache key is
/// a hash of this recipe).
#[derive(Debug, Clone)]
pub struct Recipe {
    pub suite: &'static str,
    pub sources: &'static [&'static str],
    pub packages: &'static [&'static str],
}

/// The VM's root: trixie-backports' kernel (rdma_rxe as a module; trixie's 6.12 rxe crashed
/// across the two-host link), QEMU 11.1 from trixie-backports (its
/// common/data/seabios siblings must come from backports too, else apt refuses), rdma-core and
/// perftest. busybox-static, because the initramfs needs a static shell.
pub const TRIXIE_RXE: Recipe = Recipe {
    suite: "trixie",
    sources: &[
        "deb http://deb.debian.org/debian trixie main",
        "deb http://deb.debian.org/debian trixie-backports main",
    ],
    packages: &[
        "linux-image-amd64/trixie-backports",
        "qemu-system-x86/trixie-backports",
        "qemu-system-common/trixie-backports",
        "qemu-system-data/trixie-backports",
        "seabios/trixie-backports",
        "rdma-core",
        "ibverbs-utils",
        "ibverbs-providers",
        "rdmacm-utils",
        "perftest",
        "iproute2",
        "kmod",
        "busybox-static",
        "procps",
        // Profiling inside the VM (benchmark investigations): perf and syscall traces.
        "linux-perf",
        "strace",
        // The software stacks users run over an RDMA device: UCX (ucx_info, ucx_perftest),
        // Open MPI over UCX with mpi4py for the programs that check what MPI carried,
        // libfabric's tools (fi_info, fi_pingpong), rdma-core's own test suite (pyverbs).
        "ucx-utils",
        "openmpi-bin",
        "python3-mpi4py",
        "libfabric-bin",
        "python3-pyverbs",
        // A plain TCP program for rsockets' preload library (librspreload.so, librdmacm1):
        // iperf 2 works under it natively (nc.openbsd, socat and Python's servers do not).
        "iperf",
    ],
};

/// The kernel's ELF image in a root's directory, unpacked from its bzImage.
const UNPACKED_KERNEL: &str = "vmlinux";

/// Commands the tests run inside the VM; a root that lacks one is rebuilt.
const REQUIRED_IN_ROOT: &[&str] = &[
    "usr/bin/ib_send_lat",
    "usr/bin/ib_write_lat",
    "usr/bin/ib_send_bw",
    "usr/bin/ib_write_bw",
    "usr/bin/ib_read_bw",
    "usr/bin/ibv_devinfo",
    "usr/bin/qemu-system-x86_64",
    "usr/bin/rdma",
    "usr/bin/busybox",
    "usr/bin/ucx_info",
    "usr/bin/mpirun.openmpi",
    "usr/bin/fi_info",
    "usr/bin/iperf",
    "usr/share/doc/rdma-core/tests/run_tests.py",
];

impl Recipe {
    /// A stable 64-bit FNV-1a hash of everything in the recipe.
    pub fn key(&self) -> String {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let parts = std::iter::once(self.suite)
            .chain(self.sources.iter().copied())
            .chain(self.packages.iter().copied());
        for part in parts {
            for byte in part.bytes().chain([0]) {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        format!("{}-{hash:016x}", self.suite)
    }
}

/// A prepared root: the tree to share over 9p, and the kernel and initramfs to boot it with.
#[derive(Debug, Clone)]
pub struct PreparedRoot {
    pub tree: PathBuf,
    /// The kernel QEMU boots: the unpacked ELF image where there is one (see
    /// [`kernel_image`]), else Debian's bzImage.
    pub kernel: PathBuf,
    pub initramfs: PathBuf,
    pub kernel_release: String,
    /// The tree is an overlay of several file systems (their inode numbers may collide), so
    /// QEMU must remap them (`multidevs=remap`).
    pub layered: bool,
    /// A shared lock on the root's `ready` file for as long as this (or a clone) lives: a
    /// `prepare` of another recipe removes the roots it replaced only when no one holds one
    /// (a VM of another checkout may be running from it).
    _in_use: Option<Arc<File>>,
}

impl PreparedRoot {
    fn paths(dir: &Path) -> (PathBuf, PathBuf, PathBuf, PathBuf) {
        (
            dir.join("tree"),
            dir.join("vmlinuz"),
            dir.join("initramfs.cpio"),
            dir.join("ready"),
        )
    }

    /// The root as `prepare` left it, if it is complete.
    pub fn load(dir: &Path) -> Option<Self> {
        let (tree, kernel, initramfs, ready) = Self::paths(dir);
        let kernel_release = std::fs::read_to_string(&ready).ok()?.trim().to_string();
        let complete = kernel.is_file()
            && initramfs.is_file()
            && REQUIRED_IN_ROOT.iter().all(|p| tree.join(p).exists());
        let unpacked = dir.join(UNPACKED_KERNEL);
        complete.then_some(Self {
            tree,
            kernel: if unpacked.is_file() { unpacked } else { kernel },
            initramfs,
            kernel_release,
            layered: false,
            _in_use: hold(&ready).map(Arc::new),
        })
    }

    /// The same kernel and initramfs over `tree`, an overlay with this root's tree below.
    pub fn layered_over(&self, tree: PathBuf) -> PreparedRoot {
        PreparedRoot {
            tree,
            layered: true,
            ..self.clone()
        }
    }
}

/// The root's `ready` file, locked shared; `None` where it cannot be (a root seen over 9p
/// inside a VM, whose host holds the lock for it).
fn hold(ready: &Path) -> Option<File> {
    let file = File::open(ready).ok()?;
    match file.try_lock_shared() {
        Ok(()) => Some(file),
        Err(e) => {
            log::debug!("{} not locked: {e}", ready.display());
            None
        }
    }
}

/// Whether some process holds `dir`'s root (see [`PreparedRoot`]). A root without a ready file
/// is a build that did not finish: nobody runs from it.
fn in_use(dir: &Path) -> bool {
    let Ok(file) = File::open(PreparedRoot::paths(dir).3) else {
        return false;
    };
    matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock))
}

/// Makes sure the root of `recipe` is in `cache`, building it if needed. Idempotent and safe to
/// call concurrently; a complete root is found in well under a second.
pub fn prepare(cache: &Cache, recipe: &Recipe, force: bool) -> Result<PreparedRoot> {
    ensure_tools(HOST_TOOLS)?;
    let _lock = cache.lock()?;
    let dir = cache.dir().join(format!("rootfs-{}", recipe.key()));
    if force || PreparedRoot::load(&dir).is_none() {
        build(&dir, recipe)?;
        remove_stale_roots(cache, &dir);
    }
    // Beside the root, not in its recipe: roots built before this step get it too.
    let bzimage = PreparedRoot::paths(&dir).1;
    if let Err(why) = kernel_image::unpack_vmlinux(&bzimage, &dir.join(UNPACKED_KERNEL))? {
        log::info!("booting the bzImage: cannot unpack its kernel ({why})");
    }
    let root = PreparedRoot::load(&dir).ok_or_else(|| Error::Rootfs {
        path: dir,
        reason: "incomplete right after building it".into(),
    })?;
    log::info!("root file system ready at {}", root.tree.display());
    Ok(root)
}

fn build(dir: &Path, recipe: &Recipe) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).context(|| format!("removing {}", dir.display()))?;
    }
    let staging = dir.with_extension("building");
    if staging.exists() {
        std::fs::remove_dir_all(&staging).context(|| format!("removing {}", staging.display()))?;
    }
    std::fs::create_dir_all(&staging).context(|| format!("creating {}", staging.display()))?;
    let (tree, kernel, initramfs_path, ready) = PreparedRoot::paths(&staging);

    let started = Instant::now();
    eprintln!(
        "vrdma-vm: building the {} root file system into {} (one time)…",
        recipe.suite,
        dir.display()
    );
    let mut cmd = Command::new("mmdebstrap");
    cmd.arg(if is_root() {
        "--mode=root"
    } else {
        "--mode=unshare"
    })
    .arg("--variant=minbase")
    .arg(format!("--include={}", recipe.packages.join(",")))
    .arg("--aptopt=APT::Install-Recommends \"false\"")
    // Debian's own initrd is useless here (it cannot mount a 9p root) and costs time to make.
    .arg("--dpkgopt=path-exclude=/usr/share/doc/*")
    // ... except rdma-core's, for its own test suite, which python3-pyverbs ships as
    // documentation (dpkg applies the later include over the earlier exclude; its `*` matches
    // `/` too, so this keeps the directories the tests are in).
    .arg("--dpkgopt=path-include=/usr/share/doc/rdma-core*")
    .arg("--customize-hook=rm -f \"$1\"/boot/initrd.img* \"$1\"/initrd.img*")
    .arg(recipe.suite)
    .arg(&tree)
    .args(recipe.sources);
    run_checked(&mut cmd)?;

    let (release, vmlinuz) = initramfs::kernel_release(&tree)?;
    std::fs::copy(&vmlinuz, &kernel).context(|| format!("copying {}", vmlinuz.display()))?;
    let image = initramfs::build(&tree, &release)?;
    std::fs::write(&initramfs_path, image)
        .context(|| format!("writing {}", initramfs_path.display()))?;
    for required in REQUIRED_IN_ROOT {
        if !tree.join(required).exists() {
            return Err(Error::Rootfs {
                path: tree,
                reason: format!("/{required} is missing"),
            });
        }
    }
    std::fs::write(&ready, format!("{release}\n"))
        .context(|| format!("writing {}", ready.display()))?;
    std::fs::rename(&staging, dir).context(|| format!("moving into {}", dir.display()))?;
    eprintln!(
        "vrdma-vm: root file system ready (kernel {release}) in {:.0?}",
        started.elapsed()
    );
    Ok(())
}

/// Roots built from older recipes are half a gigabyte each: drop them once a new one is ready.
fn remove_stale_roots(cache: &Cache, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(cache.dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let is_root = entry.file_name().to_string_lossy().starts_with("rootfs-");
        if is_root && path != keep {
            if in_use(&path) {
                log::info!("keeping stale root {}: a VM runs from it", path.display());
                continue;
            }
            log::info!("removing stale root {}", path.display());
            if let Err(e) = std::fs::remove_dir_all(&path) {
                log::warn!("cannot remove {}: {e}", path.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_changes_with_the_recipe() {
        let mut other = TRIXIE_RXE.clone();
        assert_eq!(other.key(), TRIXIE_RXE.key());
        other.packages = &["linux-image-amd64"];
        assert_ne!(other.key(), TRIXIE_RXE.key());
        assert!(TRIXIE_RXE.key().starts_with("trixie-"));
    }

    #[test]
    fn incomplete_root_is_not_loaded() {
        let dir = std::env::temp_dir().join(format!("vrdma-rootfs-test-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("tree")).unwrap();
        std::fs::write(dir.join("ready"), "6.12\n").unwrap();
        assert!(PreparedRoot::load(&dir).is_none());
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A complete root in `cache` named `name`.
    fn fake_root(cache: &Cache, name: &str) -> PathBuf {
        let dir = cache.dir().join(name);
        let (tree, kernel, initramfs, ready) = PreparedRoot::paths(&dir);
        for path in REQUIRED_IN_ROOT {
            let path = tree.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "").unwrap();
        }
        std::fs::write(kernel, "").unwrap();
        std::fs::write(initramfs, "").unwrap();
        std::fs::write(ready, "7.3\n").unwrap();
        dir
    }

    #[test]
    fn a_stale_root_a_vm_runs_from_is_kept_until_it_is_let_go() {
        let cache_dir =
            std::env::temp_dir().join(format!("vrdma-rootfs-stale-{}", std::process::id()));
        let cache = Cache::at(&cache_dir).unwrap();
        let current = fake_root(&cache, "rootfs-new");
        let held = fake_root(&cache, "rootfs-held");
        let idle = fake_root(&cache, "rootfs-idle");
        let running = PreparedRoot::load(&held).expect("complete");
        let clone = running.clone();
        drop(running);
        remove_stale_roots(&cache, &current);
        assert!(current.exists());
        assert!(held.exists(), "a clone still holds it");
        assert!(!idle.exists());
        drop(clone);
        remove_stale_roots(&cache, &current);
        assert!(!held.exists());
        assert!(current.exists());
        std::fs::remove_dir_all(cache_dir).unwrap();
    }
}

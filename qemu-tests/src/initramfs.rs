//! The VM's initramfs: a static busybox, the few modules needed to mount a 9p root, and an init
//! that puts a writable overlay over the read-only shared root before handing over to the
//! per-run script.
//!
//! Debian's own initrd cannot boot from 9p, and a tiny one of our own boots in a fraction of the
//! time under TCG.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, IoContext, Result};
use crate::host::run_checked;

/// The 9p tag of the shared root file system.
pub const ROOT_TAG: &str = "vrdma-root";
/// The 9p tag of the per-run directory (scripts in, exit status and results out).
pub const RUN_TAG: &str = "vrdma-run";
/// Where the per-run directory is mounted inside the VM.
pub const RUN_DIR_IN_VM: &str = "/run/vrdma";
/// Printed on the console by the init when the kernel command line asks for a probe boot.
pub const PROBE_MARKER: &str = "VRDMA-PROBE-OK";
/// Printed on the console when the init cannot mount the root; the line before says why.
pub const INIT_FAILED_MARKER: &str = "VRDMA-INIT-FAILED";

/// Modules (by name) that the initramfs loads, with their dependencies, before mounting the root.
pub const INITRAMFS_MODULES: &[&str] = &["9pnet_virtio", "9p", "overlay"];

/// Dependencies of kernel modules, as read from `modules.dep`.
#[derive(Debug, Default)]
pub struct ModuleDeps {
    /// module name (underscores) → (path relative to the modules dir, dependency names)
    entries: BTreeMap<String, (String, Vec<String>)>,
}

/// `foo-bar.ko.xz` → `foo_bar`: modprobe treats `-` and `_` alike.
fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

impl ModuleDeps {
    pub fn parse(modules_dep: &str) -> Self {
        let mut entries = BTreeMap::new();
        for line in modules_dep.lines() {
            let Some((path, deps)) = line.split_once(':') else {
                continue;
            };
            let deps = deps.split_whitespace().map(module_name).collect();
            entries.insert(module_name(path), (path.trim().to_string(), deps));
        }
        Self { entries }
    }

    /// The paths of `wanted` and everything they depend on, dependencies first.
    pub fn load_order(&self, wanted: &[&str]) -> Result<Vec<String>> {
        let mut order = Vec::new();
        let mut seen = HashSet::new();
        for name in wanted {
            self.visit(&name.replace('-', "_"), &mut seen, &mut order, 0)?;
        }
        Ok(order)
    }

    fn visit(
        &self,
        name: &str,
        seen: &mut HashSet<String>,
        order: &mut Vec<String>,
        depth: usize,
    ) -> Result<()> {
        if depth > 64 {
            return Err(Error::Usage(format!("module dependency cycle at {name}")));
        }
        if seen.contains(name) {
            return Ok(());
        }
        let (path, deps) = self
            .entries
            .get(name)
            .ok_or_else(|| Error::Usage(format!("kernel module {name} not in modules.dep")))?;
        for dep in deps {
            self.visit(dep, seen, order, depth + 1)?;
        }
        seen.insert(name.to_string());
        order.push(path.clone());
        Ok(())
    }
}

/// A `newc` cpio archive, the format the kernel unpacks into its initial root.
#[derive(Debug, Default)]
pub struct Cpio {
    data: Vec<u8>,
    next_inode: u32,
}

impl Cpio {
    pub fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, &[]);
    }

    pub fn file(&mut self, name: &str, mode: u32, contents: &[u8]) {
        self.entry(name, 0o100_000 | (mode & 0o7777), contents);
    }

    pub fn symlink(&mut self, name: &str, target: &str) {
        self.entry(name, 0o120_777, target.as_bytes());
    }

    fn entry(&mut self, name: &str, mode: u32, contents: &[u8]) {
        self.next_inode += 1;
        let name_size = name.len() + 1;
        let fields = [
            self.next_inode,
            mode,
            0, // uid
            0, // gid
            if mode & 0o040_000 != 0 { 2 } else { 1 },
            0, // mtime: fixed, so the archive is reproducible
            contents.len() as u32,
            0,
            0,
            0,
            0,
            name_size as u32,
            0, // check
        ];
        self.data.extend_from_slice(b"070701");
        for field in fields {
            self.data
                .extend_from_slice(format!("{field:08x}").as_bytes());
        }
        self.data.extend_from_slice(name.as_bytes());
        self.data.push(0);
        self.pad();
        self.data.extend_from_slice(contents);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.data.len().is_multiple_of(4) {
            self.data.push(0);
        }
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        self.data
    }
}

/// The init script of the initramfs. `modules` are file names under /modules, in load order.
pub fn init_script(modules: &[String]) -> String {
    let modules = modules.join(" ");
    format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
fail() {{ echo "vrdma-init: $*"; echo {INIT_FAILED_MARKER}; poweroff -f; }}
case " $(cat /proc/cmdline) " in
*" vrdma.probe=1 "*) echo {PROBE_MARKER}; poweroff -f ;;
esac
for m in {modules}; do insmod /modules/$m || fail "cannot load $m"; done
opts=trans=virtio,version=9p2000.L,msize=262144
mkdir -p /lower /rw /newroot
mount -t 9p -o $opts,ro,cache=loose {ROOT_TAG} /lower || fail "cannot mount the root over 9p"
mount -t tmpfs -o mode=0755 tmpfs /rw || fail "cannot mount tmpfs"
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot \
    || fail "cannot mount the overlay root"
mkdir -p /newroot{RUN_DIR_IN_VM}
mount -t 9p -o $opts {RUN_TAG} /newroot{RUN_DIR_IN_VM} || fail "cannot mount the run directory"
while read -r tag path mode; do
    mkdir -p "/newroot$path" && mount -t 9p -o "$opts,$mode" "$tag" "/newroot$path" \
        || fail "cannot mount $path"
done < /newroot{RUN_DIR_IN_VM}/mounts
for fs in proc sys dev; do mount --move /$fs /newroot/$fs || fail "cannot move /$fs"; done
exec switch_root /newroot /bin/sh {RUN_DIR_IN_VM}/init.sh
"#
    )
}

/// Reads a module, decompressing `.ko.xz`/`.ko.gz` on the host: busybox insmod loads only plain
/// modules.
fn read_module(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        Some("xz")
    } else if name.ends_with(".gz") {
        Some("gzip")
    } else if name.ends_with(".zst") {
        Some("zstd")
    } else {
        None
    };
    match tool {
        None => std::fs::read(path).context(|| format!("reading {}", path.display())),
        Some(tool) => Ok(run_checked(Command::new(tool).arg("-dc").arg(path))?.stdout),
    }
}

/// Builds the initramfs for the kernel `release` of the root tree at `tree`.
pub fn build(tree: &Path, release: &str) -> Result<Vec<u8>> {
    let modules_dir = tree.join("lib/modules").join(release);
    let dep_path = modules_dir.join("modules.dep");
    let deps =
        std::fs::read_to_string(&dep_path).context(|| format!("reading {}", dep_path.display()))?;
    let order = ModuleDeps::parse(&deps).load_order(INITRAMFS_MODULES)?;

    let busybox = ["usr/bin/busybox", "bin/busybox"]
        .iter()
        .map(|p| tree.join(p))
        .find(|p| p.is_file())
        .ok_or_else(|| Error::Rootfs {
            path: tree.to_path_buf(),
            reason: "no busybox binary".into(),
        })?;
    let busybox_bytes =
        std::fs::read(&busybox).context(|| format!("reading {}", busybox.display()))?;
    if elf_has_interpreter(&busybox_bytes) {
        return Err(Error::Rootfs {
            path: tree.to_path_buf(),
            reason: format!(
                "{} is dynamically linked (need busybox-static)",
                busybox.display()
            ),
        });
    }

    let mut cpio = Cpio::default();
    for dir in ["bin", "dev", "proc", "sys", "modules"] {
        cpio.dir(dir);
    }
    cpio.file("bin/busybox", 0o755, &busybox_bytes);
    cpio.symlink("bin/sh", "busybox");
    let mut loaded = Vec::new();
    for rel in &order {
        let file_name = format!("{}.ko", module_name(rel));
        let bytes = read_module(&modules_dir.join(rel))?;
        cpio.file(&format!("modules/{file_name}"), 0o644, &bytes);
        loaded.push(file_name);
    }
    cpio.file("init", 0o755, init_script(&loaded).as_bytes());
    Ok(cpio.finish())
}

/// Whether an ELF image asks for a program interpreter (i.e. is dynamically linked).
fn elf_has_interpreter(elf: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let read_u16 = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let read_u32 = |at: usize| {
        elf.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let read_u64 = |at: usize| {
        elf.get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
    };
    if elf.get(..5) != Some(b"\x7fELF\x02") {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) =
        (read_u64(0x20), read_u16(0x36), read_u16(0x38))
    else {
        return false;
    };
    (0..phnum as usize).any(|i| {
        let at = phoff as usize + i * phentsize as usize;
        read_u32(at) == Some(PT_INTERP)
    })
}

/// The kernel release of the newest kernel under `tree/boot` (from `vmlinuz-RELEASE`).
pub fn kernel_release(tree: &Path) -> Result<(String, PathBuf)> {
    let boot = tree.join("boot");
    let mut kernels: Vec<(String, PathBuf)> = std::fs::read_dir(&boot)
        .context(|| format!("listing {}", boot.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let release = name.strip_prefix("vmlinuz-")?.to_string();
            Some((release, e.path()))
        })
        .collect();
    kernels.sort();
    kernels.pop().ok_or_else(|| Error::Rootfs {
        path: tree.to_path_buf(),
        reason: "no /boot/vmlinuz-*".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP: &str = "\
kernel/fs/netfs/netfs.ko.xz:
kernel/fs/overlayfs/overlay.ko.xz:
kernel/fs/9p/9p.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/fs/netfs/netfs.ko.xz
kernel/net/9p/9pnet.ko.xz: kernel/fs/netfs/netfs.ko.xz
kernel/net/9p/9pnet_virtio.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/fs/netfs/netfs.ko.xz
kernel/drivers/net/dummy.ko.xz:
";

    #[test]
    fn load_order_puts_dependencies_first_once() {
        let order = ModuleDeps::parse(DEP)
            .load_order(&["9pnet_virtio", "9p", "overlay"])
            .unwrap();
        let names: Vec<String> = order.iter().map(|p| module_name(p)).collect();
        assert_eq!(names, ["netfs", "9pnet", "9pnet_virtio", "9p", "overlay"]);
    }

    #[test]
    fn unknown_module_is_an_error() {
        let err = ModuleDeps::parse(DEP).load_order(&["nope"]).unwrap_err();
        assert!(err.to_string().contains("nope"));
    }

    #[test]
    fn dashes_and_underscores_match() {
        assert_eq!(module_name("a/b/foo-bar.ko.zst"), "foo_bar");
        let deps = ModuleDeps::parse("x/foo-bar.ko:\n");
        assert_eq!(deps.load_order(&["foo_bar"]).unwrap(), ["x/foo-bar.ko"]);
    }

    #[test]
    fn cpio_entries_are_aligned_and_terminated() {
        let mut cpio = Cpio::default();
        cpio.dir("bin");
        cpio.file("bin/x", 0o755, b"hello");
        cpio.symlink("bin/sh", "x");
        let data = cpio.finish();
        assert_eq!(data.len() % 4, 0);
        assert!(data.starts_with(b"070701"));
        // Second entry starts on a 4-byte boundary right after the first (110-byte header,
        // "bin\0" name, padded).
        let second = 116;
        assert_eq!(&data[second..second + 6], b"070701");
        let text = String::from_utf8_lossy(&data);
        assert!(text.contains("bin/x") && text.contains("hello"));
        assert!(text.contains("TRAILER!!!"));
        // File size field of "bin/x" is 5.
        let x = text.find("bin/x").unwrap() - 110;
        assert_eq!(&text[x + 54..x + 62], "00000005");
    }

    #[test]
    fn init_script_loads_modules_in_order_and_probes_first() {
        let script = init_script(&["a.ko".into(), "b.ko".into()]);
        assert!(script.contains("for m in a.ko b.ko;"));
        assert!(script.find(PROBE_MARKER).unwrap() < script.find("insmod").unwrap());
        assert!(script.contains(ROOT_TAG) && script.contains(RUN_TAG));
    }

    #[test]
    fn detects_dynamic_elf() {
        let sh = std::fs::read("/bin/sh").unwrap();
        assert!(elf_has_interpreter(&sh));
        assert!(!elf_has_interpreter(b"not an elf"));
        assert!(!elf_has_interpreter(b"\x7fELF\x02"));
    }
}

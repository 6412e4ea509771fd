//! The binaries a VM runs, frozen at boot.
//!
//! The VM sees the cargo target directory over 9p with `cache=loose`: the guest keeps what it
//! has read of a file and does not look again. A build in the same clone (or a second
//! `vrdma-vm` command, which builds first) replaces binaries under a running VM; the guest then
//! mixes pages of the old and the new file and the program crashes. So before the VM boots, the
//! target directory's runnable files are linked into a snapshot of their own, and the VM
//! mounts the snapshot over the target directory's path: it runs, for its whole life, the
//! files it was started with, whatever happens to the target directory.
//!
//! The snapshot holds hard links (a copy where the file system cannot link). That is enough
//! because nothing writes a built file in place: cargo and rustc's linker remove a file before
//! writing it anew (a running binary cannot be overwritten), and this crate's own writers
//! rename a finished file into place; the old inode the snapshot links stays as it was. A
//! target directory on a read-only file system (the rxe VM's own view of the host's snapshot,
//! when it starts the nested guest) cannot change and is shared as it is.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Where snapshots live, inside the target directory (same file system, so links work).
const SNAPSHOTS_DIR: &str = "vrdma-vm-snapshots";

/// Directories of build intermediates no VM runs anything from.
const SKIPPED_DIRS: &[&str] = &[
    "incremental",
    "build",
    ".fingerprint",
    "tmp",
    "doc",
    SNAPSHOTS_DIR,
];

/// Build intermediates no VM runs (libraries are linked into the binaries).
const SKIPPED_EXTENSIONS: &[&str] = &["rlib", "rmeta", "d", "o", "a"];

/// A frozen copy of a target directory's runnable files; removed when dropped.
#[derive(Debug)]
pub struct Snapshot {
    /// The target directory it freezes (where the VM mounts it).
    pub target: PathBuf,
    /// The snapshot's own directory (what QEMU exports).
    pub dir: PathBuf,
}

impl Snapshot {
    /// Freezes `target`, or `None` when `target` is on a read-only file system (nothing can
    /// replace its files) or this process may not write there (then the VM sees the target
    /// directory itself, as before snapshots, and a warning says so). Snapshots left by
    /// processes that are gone are removed first.
    pub fn take(target: &Path) -> Result<Option<Snapshot>> {
        let parent = target.join(SNAPSHOTS_DIR);
        let unwritable =
            |e: &std::io::Error| matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM));
        let made = std::fs::create_dir_all(&parent).and_then(|()| {
            remove_abandoned(&parent);
            unique_dir(&parent)
        });
        let dir = match made {
            Ok(dir) => dir,
            Err(e) if e.raw_os_error() == Some(libc::EROFS) => return Ok(None),
            Err(e) if unwritable(&e) => {
                log::warn!(
                    "cannot snapshot {} ({e}): the VM sees it as it is, and a build there \
                     while it runs can crash it",
                    target.display()
                );
                return Ok(None);
            }
            Err(e) => return Err(io_error(&parent, "creating", e)),
        };
        let snapshot = Snapshot {
            target: target.to_path_buf(),
            dir,
        };
        // On failure the partial snapshot is removed by the drop.
        freeze(target, &snapshot.dir)?;
        Ok(Some(snapshot))
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            log::warn!("cannot remove {}: {e}", self.dir.display());
        }
    }
}

/// A directory `<pid>-<n>` under `parent` that did not exist.
fn unique_dir(parent: &Path) -> std::io::Result<PathBuf> {
    for n in 0u32.. {
        let dir = parent.join(format!("{}-{n}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    unreachable!("u32 names run out")
}

/// Removes the snapshots of processes that no longer exist (a `vrdma-vm` that was killed).
fn remove_abandoned(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Links every runnable file under `from` into `to`, keeping the tree and its symbolic links
/// (whose targets stay as they are: an absolute one into the target directory resolves into the
/// snapshot in the VM, which mounts it at the target directory's path). An entry that is gone
/// by the time it is linked (a build running now removes its temporary files) is left out.
fn freeze(from: &Path, to: &Path) -> Result<()> {
    let entries = match std::fs::read_dir(from) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error(from, "listing", e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| io_error(from, "listing", e))?;
        let name = entry.file_name();
        let (source, dest) = (entry.path(), to.join(&name));
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            if SKIPPED_DIRS.iter().any(|d| name == *d) {
                continue;
            }
            std::fs::create_dir(&dest).map_err(|e| io_error(&dest, "creating", e))?;
            freeze(&source, &dest)?;
            continue;
        }
        let linked = if kind.is_symlink() {
            std::fs::read_link(&source).and_then(|link| std::os::unix::fs::symlink(link, &dest))
        } else if kind.is_file() && !skipped_file(&source) {
            // A copy where a link cannot be made (a target directory on a bind mount, say).
            std::fs::hard_link(&source, &dest).or_else(|_| std::fs::copy(&source, &dest).map(drop))
        } else {
            Ok(())
        };
        match linked {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                log::debug!("{} went while it was frozen: left out", source.display());
            }
            result => result.map_err(|e| io_error(&source, "freezing", e))?,
        }
    }
    Ok(())
}

fn skipped_file(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| SKIPPED_EXTENSIONS.contains(&e))
}

fn io_error(path: &Path, what: &str, source: std::io::Error) -> Error {
    Error::io(
        format!("{what} {} for the VM's snapshot", path.display()),
        source,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A scratch target directory with a binary, a test binary, a symbolic link into it and
    /// the intermediates a snapshot leaves out.
    fn fake_target(name: &str) -> PathBuf {
        let target =
            std::env::temp_dir().join(format!("vrdma-snapshot-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&target);
        for dir in [
            "release/deps",
            "release/incremental/x",
            "release/build/y",
            "native/lib",
        ] {
            std::fs::create_dir_all(target.join(dir)).unwrap();
        }
        std::fs::write(target.join("CACHEDIR.TAG"), "Signature").unwrap();
        write_executable(&target.join("release/vrdma-backend"), "old backend");
        write_executable(&target.join("release/deps/device_rxe-0123abcd"), "old test");
        std::fs::write(target.join("release/deps/libfoo-0123.rlib"), "lib").unwrap();
        std::fs::write(target.join("release/vrdma-backend.d"), "deps").unwrap();
        std::fs::write(target.join("release/incremental/x/big"), "cache").unwrap();
        std::fs::write(target.join("release/build/y/out"), "out").unwrap();
        write_executable(&target.join("native/vrdma-native-pingpong"), "old peer");
        std::os::unix::fs::symlink(
            target.join("release/vrdma-backend"),
            target.join("native/lib/libibverbs.so.1"),
        )
        .unwrap();
        target
    }

    fn write_executable(path: &Path, text: &str) {
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn read(path: PathBuf) -> String {
        std::fs::read_to_string(path).unwrap()
    }

    #[test]
    fn a_snapshot_keeps_the_files_it_was_taken_with() {
        let target = fake_target("keeps");
        let snapshot = Snapshot::take(&target).unwrap().unwrap();
        assert!(snapshot.dir.starts_with(target.join(SNAPSHOTS_DIR)));
        // cargo's way (a new file renamed over the old), a linker's (removed, then written),
        // and a new build of a test binary next to the old one.
        let backend = target.join("release/vrdma-backend");
        std::fs::write(target.join("release/.new"), "new backend").unwrap();
        std::fs::rename(target.join("release/.new"), &backend).unwrap();
        let peer = target.join("native/vrdma-native-pingpong");
        std::fs::remove_file(&peer).unwrap();
        write_executable(&peer, "new peer");
        write_executable(&target.join("release/deps/device_rxe-4567ef00"), "new test");
        assert_eq!(read(backend), "new backend");

        let frozen = &snapshot.dir;
        assert_eq!(read(frozen.join("release/vrdma-backend")), "old backend");
        assert_eq!(
            read(frozen.join("native/vrdma-native-pingpong")),
            "old peer"
        );
        assert_eq!(
            read(frozen.join("release/deps/device_rxe-0123abcd")),
            "old test"
        );
        assert!(!frozen.join("release/deps/device_rxe-4567ef00").exists());
        assert!(frozen.join("CACHEDIR.TAG").is_file());
        let mode = std::fs::metadata(frozen.join("release/vrdma-backend"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o111, 0o111, "still executable");
        // The link keeps its absolute target: in the VM that path is the snapshot.
        assert_eq!(
            std::fs::read_link(frozen.join("native/lib/libibverbs.so.1")).unwrap(),
            target.join("release/vrdma-backend")
        );
        for left_out in [
            "release/deps/libfoo-0123.rlib",
            "release/vrdma-backend.d",
            "release/incremental",
            "release/build",
        ] {
            assert!(!frozen.join(left_out).exists(), "{left_out}");
        }
        let dir = snapshot.dir.clone();
        drop(snapshot);
        assert!(!dir.exists(), "removed with the run");
        std::fs::remove_dir_all(&target).unwrap();
    }

    #[test]
    fn snapshots_of_processes_that_are_gone_are_removed() {
        let target = fake_target("abandoned");
        let parent = target.join(SNAPSHOTS_DIR);
        // No process has pid 0x7fffffff (above the kernel's pid_max limit).
        let abandoned = parent.join(format!("{}-0", i32::MAX));
        std::fs::create_dir_all(abandoned.join("release")).unwrap();
        let ours = Snapshot::take(&target).unwrap().unwrap();
        let second = Snapshot::take(&target).unwrap().unwrap();
        assert!(!abandoned.exists());
        assert_ne!(
            ours.dir, second.dir,
            "two VMs of one process: two snapshots"
        );
        drop((ours, second));
        std::fs::remove_dir_all(&target).unwrap();
    }
}

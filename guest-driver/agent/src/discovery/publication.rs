//! Where the published files go: at the system paths (a tmpfs of the agent's own over the
//! class directory, the node in `/dev/infiniband`) or in a directory for a container runtime.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use log::info;

use super::facts::{write_class_tree, DeviceFacts};

/// The class directory the stacks read.
pub const SYSTEM_CLASS_DIR: &str = "/sys/class/infiniband";

/// Where the stacks look for a device's node.
pub const SYSTEM_DEV_DIR: &str = "/dev/infiniband";

/// The source name of the tmpfs the agent mounts over [`SYSTEM_CLASS_DIR`], by which it
/// recognises its own mount after a restart.
const MOUNT_SOURCE: &str = "vrdma-discovery";

/// The tmpfs's size. Each file takes a page: a port's GID table alone is a thousand of them
/// on rxe (its `gid_tbl_len` is 1024).
const TMPFS_BYTES: usize = 16 << 20;

/// Who may open the node: the agent socket's owner, group and mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeAccess {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
}

impl NodeAccess {
    /// The access of the file at `path` (the agent's socket).
    pub fn of(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)?;
        Ok(Self {
            uid: meta.uid(),
            gid: meta.gid(),
            mode: meta.mode() & 0o777,
        })
    }
}

fn c_path(path: &Path) -> std::io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
}

fn check(result: libc::c_int) -> std::io::Result<()> {
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Makes `path` a character device with `/dev/null`'s numbers and `access`, replacing what
/// was there.
pub fn make_node(path: &Path, access: NodeAccess) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let c = c_path(path)?;
    // SAFETY: mknod/chown/chmod read the NUL-terminated path, which outlives the calls.
    unsafe {
        check(libc::mknod(
            c.as_ptr(),
            libc::S_IFCHR | access.mode,
            libc::makedev(1, 3),
        ))?;
        check(libc::chown(c.as_ptr(), access.uid, access.gid))?;
        // mknod's mode went through the umask.
        check(libc::chmod(c.as_ptr(), access.mode))
    }
}

/// Where the published files went; what is left of them when this is dropped is removed
/// (the node, and the tmpfs of a system publication).
#[derive(Debug)]
pub struct Publication {
    node: PathBuf,
    mounted: Option<PathBuf>,
    pub class_tree: PathBuf,
}

/// Why the agent could not publish.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("{SYSTEM_CLASS_DIR} does not exist (load ib_core: modprobe ib_core)")]
    NoClassDir,
    #[error(
        "{SYSTEM_CLASS_DIR} lists other RDMA devices ({0}): publishing over it would hide them"
    )]
    OtherDevices(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> PublishError {
    let what = what.into();
    move |source| PublishError::Io { what, source }
}

impl Publication {
    /// Publishes at the system paths: a tmpfs of the agent's own over `/sys/class/infiniband`
    /// (an earlier agent's is taken down first), the node in `/dev/infiniband`.
    pub fn system(
        facts: &DeviceFacts,
        pci_function: Option<&Path>,
        access: NodeAccess,
    ) -> Result<Self, PublishError> {
        let class_dir = Path::new(SYSTEM_CLASS_DIR);
        if own_mount_at(class_dir) {
            let c = c_path(class_dir).map_err(io(SYSTEM_CLASS_DIR))?;
            // SAFETY: umount2 reads the NUL-terminated path.
            check(unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) })
                .map_err(io(format!("unmounting an earlier {MOUNT_SOURCE}")))?;
        }
        let listed = std::fs::read_dir(class_dir).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => PublishError::NoClassDir,
            _ => io(SYSTEM_CLASS_DIR)(e),
        })?;
        let others: Vec<String> = listed
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        if !others.is_empty() {
            return Err(PublishError::OtherDevices(others.join(", ")));
        }
        mount_tmpfs(class_dir).map_err(io(format!("mounting a tmpfs on {SYSTEM_CLASS_DIR}")))?;
        let mut publication = Self {
            node: Path::new(SYSTEM_DEV_DIR).join(&facts.name),
            mounted: Some(class_dir.to_path_buf()),
            class_tree: class_dir.join(&facts.name),
        };
        publication.write(class_dir, facts, pci_function, access)?;
        Ok(publication)
    }

    /// Publishes into `dir`: `dir/class/infiniband/<dev>/…` and `dir/dev/infiniband/<dev>`,
    /// for bind mounts at `/sys/class/infiniband` and `/dev/infiniband/<dev>`.
    pub fn directory(
        dir: &Path,
        facts: &DeviceFacts,
        pci_function: Option<&Path>,
        access: NodeAccess,
    ) -> Result<Self, PublishError> {
        let class_dir = dir.join("class/infiniband");
        let stale = class_dir.join(&facts.name);
        match std::fs::remove_dir_all(&stale) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io(stale.display().to_string())(e))
            }
            _ => {}
        }
        let mut publication = Self {
            node: dir.join("dev/infiniband").join(&facts.name),
            mounted: None,
            class_tree: stale,
        };
        publication.write(&class_dir, facts, pci_function, access)?;
        Ok(publication)
    }

    fn write(
        &mut self,
        class_dir: &Path,
        facts: &DeviceFacts,
        pci_function: Option<&Path>,
        access: NodeAccess,
    ) -> Result<(), PublishError> {
        write_class_tree(class_dir, facts, pci_function)
            .map_err(io(format!("writing {}", self.class_tree.display())))?;
        make_node(&self.node, access).map_err(io(format!("making {}", self.node.display())))?;
        info!(
            "published {} and {} for {}",
            self.class_tree.display(),
            self.node.display(),
            facts.name
        );
        Ok(())
    }
}

impl Drop for Publication {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.node);
        if let Some(dir) = &self.mounted {
            if let Ok(c) = c_path(dir) {
                // SAFETY: umount2 reads the NUL-terminated path.
                let _ = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

fn mount_tmpfs(dir: &Path) -> std::io::Result<()> {
    let source = CString::new(MOUNT_SOURCE).expect("no NUL");
    let fstype = CString::new("tmpfs").expect("no NUL");
    let options = CString::new(format!("mode=0755,size={}m", TMPFS_BYTES >> 20)).expect("no NUL");
    let target = c_path(dir)?;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    check(unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            options.as_ptr().cast(),
        )
    })
}

/// Whether the top mount at `dir` is a tmpfs the agent mounted (its source name).
fn own_mount_at(dir: &Path) -> bool {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    mounts_own(&mounts, dir)
}

/// [`own_mount_at`] on the text of a mountinfo file: the last mount at `dir` (the one on
/// top) has the agent's source.
fn mounts_own(mountinfo: &str, dir: &Path) -> bool {
    let target = dir.to_string_lossy();
    mountinfo
        .lines()
        .rev()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let point = *fields.get(4)?;
            let separator = fields.iter().position(|f| *f == "-")?;
            let source = *fields.get(separator + 2)?;
            (point == target).then_some(source == MOUNT_SOURCE)
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::super::facts::tests::facts;
    use super::super::facts::{class_files, GidFacts, DRIVER_NAME};
    use super::*;
    use vrdma::spec::verbs::GidType;

    #[test]
    fn an_rxe_sized_table_fits_the_tmpfs() {
        let mut big = facts();
        big.ports[0].gid_table_len = 1024;
        let gid = big.ports[0].gids[0].gid;
        big.ports[0].gids = (0..1024)
            .map(|index| GidFacts {
                index,
                gid,
                gid_type: GidType::RoceV2,
                netdev: Some("d0".into()),
            })
            .collect();
        // A page per file and per directory.
        let pages = class_files(&big).len() + 16;
        assert!(pages * 4096 <= TMPFS_BYTES, "{pages} pages");
    }

    #[test]
    fn a_directory_publication_holds_the_tree_the_driver_and_the_function_s_locality() {
        let dir = std::env::temp_dir().join(format!("vrdma-discovery-{}", std::process::id()));
        let function = dir.join("function");
        std::fs::create_dir_all(&function).unwrap();
        std::fs::write(function.join("local_cpus"), "3\n").unwrap();
        std::fs::write(function.join("numa_node"), "-1\n").unwrap();
        let tree = write_class_tree(&dir.join("class"), &facts(), Some(&function)).unwrap();
        assert_eq!(
            std::fs::read_to_string(tree.join("ports/1/gid_attrs/types/0")).unwrap(),
            "RoCE v2\n"
        );
        assert_eq!(
            std::fs::read_to_string(tree.join("device/local_cpus")).unwrap(),
            "3\n"
        );
        let driver = std::fs::read_link(tree.join("device/driver")).unwrap();
        assert_eq!(driver.file_name().unwrap(), DRIVER_NAME);
        // The netdev holding a GID's address, as the kernel lists a device's netdevs.
        assert_eq!(
            std::fs::read_link(tree.join("device/net/d0")).unwrap(),
            Path::new("/sys/class/net/d0")
        );
        // Written again (the agent restarted): the stale tree is replaced, not merged.
        std::fs::write(tree.join("stale"), "x").unwrap();
        let access = NodeAccess::of(&dir).unwrap();
        let publication = Publication::directory(&dir, &facts(), None, access);
        if let Ok(publication) = &publication {
            assert!(!publication.class_tree.join("stale").exists());
        }
        // Making a node needs CAP_MKNOD: only the tree is checked where it is missing.
        match publication {
            Ok(publication) => {
                use std::os::unix::fs::FileTypeExt;
                let node = dir.join("dev/infiniband/vrdma0");
                assert!(std::fs::metadata(&node)
                    .unwrap()
                    .file_type()
                    .is_char_device());
                drop(publication);
                assert!(!node.exists(), "the node goes with the publication");
            }
            Err(PublishError::Io { what, source }) => {
                assert!(what.starts_with("making"), "{what}: {source}");
            }
            Err(e) => panic!("{e}"),
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_agent_recognises_only_its_own_mount_on_top() {
        let base = "22 1 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw";
        let ours = "90 22 0:50 / /sys/class/infiniband rw - tmpfs vrdma-discovery rw,size=1024k";
        let other = "91 90 0:51 / /sys/class/infiniband rw - tmpfs tmpfs rw";
        let dir = Path::new("/sys/class/infiniband");
        assert!(!mounts_own(base, dir));
        assert!(mounts_own(&format!("{base}\n{ours}"), dir));
        assert!(!mounts_own(&format!("{base}\n{ours}\n{other}"), dir));
        assert!(!mounts_own(
            &format!("{base}\n{ours}"),
            Path::new("/sys/class")
        ));
    }
}

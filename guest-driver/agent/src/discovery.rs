//! Discovery: what RDMA software reads, besides libibverbs, to find and classify a device,
//! published for the device the agent serves (spec §7.6).
//!
//! UCX keeps a verbs device only if `/dev/infiniband/<dev_name>` is a character device the
//! process may read and write, reads each GID's type from
//! `/sys/class/infiniband/<dev>/ports/<p>/gid_attrs/types/<i>` (missing: RoCE v1, which a
//! native RoCE v2 peer then refuses) and the device's CPUs from `device/local_cpus`; Open MPI
//! reads `device/driver`; rdma-core's tests read the port files. No kernel driver makes these
//! for vrdma, so the agent writes them from what the device reports, through a session of its
//! own:
//! - the class tree `<dev>/…` with the kernel's file formats (`drivers/infiniband/core/sysfs.c`);
//! - the node `<dev>`: a character device with the numbers of `/dev/null` and the agent
//!   socket's owner, group and mode. Whoever may open it may reach the agent; opening it gives
//!   nothing, the agent socket is the device.
//!
//! [`Publication::system`] mounts a tmpfs over `/sys/class/infiniband` (in a guest whose only
//! RDMA device is vrdma's) and makes the node in `/dev/infiniband`;
//! [`Publication::directory`] writes both into a directory for a container runtime to
//! bind-mount at those paths. The tree is written once, at start: GID changes after that are
//! not followed.

use std::ffi::CString;
use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use log::{info, warn};
use vrdma::spec::verbs::{GidType, PortState};
use vrdma::Context;

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
/// What `device/driver` names (Open MPI matches its last component).
pub const DRIVER_NAME: &str = "vrdma";

/// What the device reported, as the files say it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFacts {
    /// `ibv_device.name` (and `dev_name`) of the drop-in.
    pub name: String,
    pub fw_ver: String,
    /// Network byte order, as the device reports them.
    pub node_guid: [u8; 8],
    pub sys_image_guid: [u8; 8],
    pub ports: Vec<PortFacts>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortFacts {
    pub number: u8,
    pub state: u32,
    pub phys_state: u8,
    /// `IBV_LINK_LAYER_*`: 1 InfiniBand, 2 Ethernet.
    pub link_layer: u8,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub sm_sl: u8,
    pub cap_flags: u32,
    /// Every index of the table (its length), and the populated ones with their types.
    pub gid_table_len: u32,
    pub gids: Vec<(u32, [u8; 16], GidType)>,
    pub pkey0: u16,
}

impl DeviceFacts {
    /// Asks the device through `context`.
    pub fn read(name: &str, context: &Context) -> vrdma::verbs::Result<Self> {
        let attr = context.query_device();
        let mut ports = Vec::new();
        for number in 1..=attr.phys_port_cnt {
            let port = context.query_port(number)?;
            let table = context.read_gid_table(number)?;
            let gids = table
                .populated()
                .iter()
                .filter_map(|(index, entry)| Some((*index, entry.gid, entry.gid_type().ok()?)))
                .collect();
            ports.push(PortFacts {
                number,
                state: port.state.get(),
                phys_state: port.phys_state,
                link_layer: port.link_layer,
                lid: port.lid.get(),
                sm_lid: port.sm_lid.get(),
                lmc: port.lmc,
                sm_sl: port.sm_sl,
                cap_flags: port.port_cap_flags.get(),
                gid_table_len: table.len(),
                gids,
                pkey0: context.query_pkey(number, 0)?,
            });
        }
        let fw_ver = attr.fw_ver.split(|b| *b == 0).next().unwrap_or_default();
        Ok(Self {
            name: name.to_owned(),
            fw_ver: String::from_utf8_lossy(fw_ver).into_owned(),
            node_guid: attr.node_guid,
            sys_image_guid: attr.sys_image_guid,
            ports,
        })
    }
}

/// The kernel's GUID format: four groups of four hex digits.
fn guid_text(guid: &[u8; 8]) -> String {
    guid.chunks(2)
        .map(|pair| format!("{:02x}{:02x}", pair[0], pair[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// The kernel's GID format (`%pI6`): eight groups of four hex digits, nothing left out.
fn gid_text(gid: &[u8; 16]) -> String {
    gid.chunks(2)
        .map(|pair| format!("{:02x}{:02x}", pair[0], pair[1]))
        .collect::<Vec<_>>()
        .join(":")
}

fn gid_type_text(gid_type: GidType) -> &'static str {
    match gid_type {
        GidType::RoceV2 => "RoCE v2",
        GidType::Ib | GidType::RoceV1 => "IB/RoCE v1",
    }
}

fn port_state_text(state: u32) -> String {
    let name = match PortState::try_from(state) {
        Ok(PortState::Nop) => "NOP",
        Ok(PortState::Down) => "DOWN",
        Ok(PortState::Init) => "INIT",
        Ok(PortState::Armed) => "ARMED",
        Ok(PortState::Active) => "ACTIVE",
        Ok(PortState::ActiveDefer) => "ACTIVE_DEFER",
        Err(_) => "UNKNOWN",
    };
    format!("{state}: {name}")
}

fn phys_state_text(state: u8) -> String {
    let name = match state {
        1 => "Sleep",
        2 => "Polling",
        3 => "Disabled",
        4 => "PortConfigurationTraining",
        5 => "LinkUp",
        6 => "LinkErrorRecovery",
        7 => "Phy Test",
        _ => "<unknown>",
    };
    format!("{state}: {name}")
}

/// The files of the class tree, relative to the device's directory, and their contents.
pub fn class_files(facts: &DeviceFacts) -> Vec<(PathBuf, String)> {
    let mut files = vec![
        ("node_type".into(), "1: CA\n".to_string()),
        (
            "node_guid".into(),
            format!("{}\n", guid_text(&facts.node_guid)),
        ),
        (
            "sys_image_guid".into(),
            format!("{}\n", guid_text(&facts.sys_image_guid)),
        ),
        ("fw_ver".into(), format!("{}\n", facts.fw_ver)),
        ("node_desc".into(), format!("{}\n", facts.name)),
    ];
    for port in &facts.ports {
        let dir = PathBuf::from(format!("ports/{}", port.number));
        let file = |name: &str| dir.join(name);
        let link_layer = if port.link_layer == 2 {
            "Ethernet"
        } else {
            "InfiniBand"
        };
        files.extend([
            (file("state"), format!("{}\n", port_state_text(port.state))),
            (
                file("phys_state"),
                format!("{}\n", phys_state_text(port.phys_state)),
            ),
            (file("link_layer"), format!("{link_layer}\n")),
            (file("lid"), format!("0x{:x}\n", port.lid)),
            (file("sm_lid"), format!("0x{:x}\n", port.sm_lid)),
            (file("lid_mask_count"), format!("{}\n", port.lmc)),
            (file("sm_sl"), format!("{}\n", port.sm_sl)),
            (file("cap_mask"), format!("0x{:08x}\n", port.cap_flags)),
            (file("pkeys/0"), format!("0x{:04x}\n", port.pkey0)),
        ]);
        // Every index has a GID file (zeros where empty), as the kernel's table does; only a
        // populated entry has a type (the kernel fails the read of an empty one's).
        for index in 0..port.gid_table_len {
            let entry = port.gids.iter().find(|(i, _, _)| *i == index);
            let gid = entry.map_or([0; 16], |(_, gid, _)| *gid);
            files.push((
                file(&format!("gids/{index}")),
                format!("{}\n", gid_text(&gid)),
            ));
            if let Some((_, _, gid_type)) = entry {
                files.push((
                    file(&format!("gid_attrs/types/{index}")),
                    format!("{}\n", gid_type_text(*gid_type)),
                ));
            }
        }
    }
    files
}

/// Writes the device's class tree into `class_dir/<name>`, with `device/` holding the
/// driver's name and, when the device is a PCI function, its CPUs and NUMA node.
pub fn write_class_tree(
    class_dir: &Path,
    facts: &DeviceFacts,
    pci_function: Option<&Path>,
) -> std::io::Result<PathBuf> {
    let root = class_dir.join(&facts.name);
    for (relative, text) in class_files(facts) {
        let path = root.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, text)?;
    }
    let device = root.join("device");
    std::fs::create_dir_all(&device)?;
    // Dangling, as seen from the tree: what is read of it is its last component.
    std::os::unix::fs::symlink(
        format!("../../../bus/pci/drivers/{DRIVER_NAME}"),
        device.join("driver"),
    )?;
    if let Some(function) = pci_function {
        for name in [
            "local_cpus",
            "local_cpulist",
            "numa_node",
            "vendor",
            "device",
        ] {
            match std::fs::read(function.join(name)) {
                Ok(bytes) => std::fs::write(device.join(name), bytes)?,
                Err(e) => warn!("{}: {e}", function.join(name).display()),
            }
        }
    }
    Ok(root)
}

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

/// What `ibv_devinfo`-style listings would show of the facts, one line: for the agent's log.
pub fn summary(facts: &DeviceFacts) -> String {
    let mut out = format!("{}: fw {}", facts.name, facts.fw_ver);
    for port in &facts.ports {
        let _ = write!(
            out,
            "; port {} {} with {} GIDs",
            port.number,
            port_state_text(port.state),
            port.gids.len()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> DeviceFacts {
        let mut link_local = [0u8; 16];
        link_local[..2].copy_from_slice(&[0xfe, 0x80]);
        link_local[8..].copy_from_slice(&[0x02, 0x2a, 0x3f, 0xff, 0xfe, 0xc5, 0xc7, 0xf2]);
        DeviceFacts {
            name: "vrdma0".into(),
            fw_ver: "0.1.0".into(),
            node_guid: [0x00, 0x2a, 0x3f, 0xff, 0xfe, 0xc5, 0xc7, 0xf2],
            sys_image_guid: [0x00, 0x2a, 0x3f, 0xff, 0xfe, 0xc5, 0xc7, 0xf2],
            ports: vec![PortFacts {
                number: 1,
                state: 4,
                phys_state: 5,
                link_layer: 2,
                lid: 0,
                sm_lid: 0,
                lmc: 0,
                sm_sl: 0,
                cap_flags: 0x0001_0000,
                gid_table_len: 4,
                gids: vec![
                    (0, link_local, GidType::RoceV2),
                    (2, link_local, GidType::RoceV1),
                ],
                pkey0: 0xffff,
            }],
        }
    }

    fn file<'a>(files: &'a [(PathBuf, String)], name: &str) -> Option<&'a str> {
        files
            .iter()
            .find(|(path, _)| path == Path::new(name))
            .map(|(_, text)| text.as_str())
    }

    #[test]
    fn files_are_in_the_kernels_formats() {
        let files = class_files(&facts());
        assert_eq!(file(&files, "node_type"), Some("1: CA\n"));
        assert_eq!(file(&files, "node_guid"), Some("002a:3fff:fec5:c7f2\n"));
        assert_eq!(file(&files, "ports/1/state"), Some("4: ACTIVE\n"));
        assert_eq!(file(&files, "ports/1/phys_state"), Some("5: LinkUp\n"));
        assert_eq!(file(&files, "ports/1/link_layer"), Some("Ethernet\n"));
        assert_eq!(file(&files, "ports/1/cap_mask"), Some("0x00010000\n"));
        assert_eq!(file(&files, "ports/1/pkeys/0"), Some("0xffff\n"));
        assert_eq!(
            file(&files, "ports/1/gids/0"),
            Some("fe80:0000:0000:0000:022a:3fff:fec5:c7f2\n")
        );
    }

    #[test]
    fn an_rxe_sized_table_fits_the_tmpfs() {
        let mut big = facts();
        big.ports[0].gid_table_len = 1024;
        let gid = big.ports[0].gids[0].1;
        big.ports[0].gids = (0..1024).map(|i| (i, gid, GidType::RoceV2)).collect();
        // A page per file and per directory.
        let pages = class_files(&big).len() + 16;
        assert!(pages * 4096 <= TMPFS_BYTES, "{pages} pages");
    }

    #[test]
    fn every_index_has_a_gid_and_only_populated_ones_a_type() {
        let files = class_files(&facts());
        for index in 0..4 {
            assert!(file(&files, &format!("ports/1/gids/{index}")).is_some());
        }
        assert_eq!(
            file(&files, "ports/1/gids/1"),
            Some("0000:0000:0000:0000:0000:0000:0000:0000\n")
        );
        assert_eq!(file(&files, "ports/1/gid_attrs/types/0"), Some("RoCE v2\n"));
        assert_eq!(
            file(&files, "ports/1/gid_attrs/types/2"),
            Some("IB/RoCE v1\n")
        );
        assert_eq!(file(&files, "ports/1/gid_attrs/types/1"), None);
        assert_eq!(file(&files, "ports/1/gid_attrs/types/3"), None);
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

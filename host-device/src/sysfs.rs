//! RDMA device discovery and GID tables from sysfs.
//!
//! Every function takes the sysfs root (normally `/sys`) and, where a character device is
//! involved, the dev root (normally `/dev`), so tests run against a fake tree.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use vrdma_spec::verbs::{GidType, PortState};
use vrdma_spec::wire::GidEntry;

use super::error::{DeviceError, Result};

/// Default sysfs mount point.
pub const SYSFS_ROOT: &str = "/sys";
/// Default device directory.
pub const DEV_ROOT: &str = "/dev";

/// One port of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// Port number (from 1).
    pub port: u8,
    pub state: PortState,
    /// "Ethernet" for RoCE, "InfiniBand" for IB.
    pub link_layer: String,
}

/// An RDMA device as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name (`rxe0`).
    pub name: String,
    /// Kernel driver (`rxe`, `mlx5_core`, …), or "unknown".
    pub driver: String,
    /// The uverbs character device (`/dev/infiniband/uverbs0`).
    pub uverbs_path: PathBuf,
    /// Firmware version string.
    pub fw_ver: String,
    pub ports: Vec<PortInfo>,
}

impl DeviceInfo {
    /// Whether any port is ACTIVE.
    pub fn has_active_port(&self) -> bool {
        self.ports.iter().any(|p| p.state == PortState::Active)
    }
}

/// The GID type of a `ports/N/gid_attrs/types/I` text: "IB/RoCE v1" is RoCE v1 on an
/// Ethernet port and plain IB otherwise; kernels without `gid_attrs` (`None`) only know v1.
fn gid_type(text: Option<&str>, ethernet: bool) -> GidType {
    match text {
        Some("RoCE v2") => GidType::RoceV2,
        _ if ethernet => GidType::RoceV1,
        _ => GidType::Ib,
    }
}

fn read_attr(path: &Path) -> Result<String> {
    fs::read_to_string(path)
        .map(|s| s.trim_end().to_owned())
        .map_err(|source| DeviceError::Sysfs {
            path: path.to_owned(),
            source,
        })
}

fn read_attr_opt(path: &Path) -> Result<Option<String>> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s.trim_end().to_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(DeviceError::Sysfs {
            path: path.to_owned(),
            source,
        }),
    }
}

fn read_dir_names(path: &Path) -> Result<Vec<String>> {
    let entries = fs::read_dir(path).map_err(|source| DeviceError::Sysfs {
        path: path.to_owned(),
        source,
    })?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| DeviceError::Sysfs {
            path: path.to_owned(),
            source,
        })?;
        if let Some(name) = entry.file_name().to_str() {
            names.push(name.to_owned());
        }
    }
    names.sort();
    Ok(names)
}

fn class_dir(sysfs_root: &Path) -> PathBuf {
    sysfs_root.join("class/infiniband")
}

/// Names of all RDMA devices, sorted.
pub fn device_names(sysfs_root: &Path) -> Result<Vec<String>> {
    let dir = class_dir(sysfs_root);
    if !dir.is_dir() {
        return Err(DeviceError::NoRdmaSubsystem);
    }
    read_dir_names(&dir)
}

/// Describes one device.
pub fn device_info(sysfs_root: &Path, dev_root: &Path, name: &str) -> Result<DeviceInfo> {
    let class = class_dir(sysfs_root);
    if !class.is_dir() {
        return Err(DeviceError::NoRdmaSubsystem);
    }
    let dir = class.join(name);
    if name.is_empty() || name.contains('/') || !dir.is_dir() {
        return Err(DeviceError::DeviceNotFound {
            name: name.to_owned(),
        });
    }
    let uverbs = uverbs_name(sysfs_root, name)?.ok_or_else(|| DeviceError::NoVerbsDevice {
        name: name.to_owned(),
    })?;
    Ok(DeviceInfo {
        name: name.to_owned(),
        driver: driver_name(&dir)?,
        uverbs_path: dev_root.join("infiniband").join(uverbs),
        fw_ver: read_attr_opt(&dir.join("fw_ver"))?.unwrap_or_default(),
        ports: ports(&dir)?,
    })
}

/// Describes every device, sorted by name.
pub fn list_devices(sysfs_root: &Path, dev_root: &Path) -> Result<Vec<DeviceInfo>> {
    device_names(sysfs_root)?
        .iter()
        .map(|name| device_info(sysfs_root, dev_root, name))
        .collect()
}

/// The named device, or (no name) the first device, by name, with an ACTIVE port.
pub fn find_device(sysfs_root: &Path, dev_root: &Path, name: Option<&str>) -> Result<DeviceInfo> {
    match name {
        Some(name) => device_info(sysfs_root, dev_root, name),
        None => {
            for name in device_names(sysfs_root)? {
                // A device that cannot be described (no uverbs node, odd sysfs) cannot be the
                // default either; say why and look further.
                match device_info(sysfs_root, dev_root, &name) {
                    Ok(info) if info.has_active_port() => return Ok(info),
                    Ok(_) => {}
                    Err(e) => log::warn!("skipping RDMA device {name}: {e}"),
                }
            }
            Err(DeviceError::NoActiveDevice)
        }
    }
}

/// The uverbs node of a device: `device/infiniband_verbs/uverbsN` for devices with a parent
/// (PCI NICs), else the `infiniband_verbs` class entry whose `ibdev` names it (virtual devices
/// such as rxe have no `device` link).
fn uverbs_name(sysfs_root: &Path, name: &str) -> Result<Option<String>> {
    let via_parent = class_dir(sysfs_root)
        .join(name)
        .join("device/infiniband_verbs");
    if via_parent.is_dir() {
        if let Some(first) = read_dir_names(&via_parent)?
            .into_iter()
            .find(|n| n.starts_with("uverbs"))
        {
            return Ok(Some(first));
        }
    }
    let verbs_class = sysfs_root.join("class/infiniband_verbs");
    if !verbs_class.is_dir() {
        return Ok(None);
    }
    for entry in read_dir_names(&verbs_class)? {
        if !entry.starts_with("uverbs") {
            continue;
        }
        if read_attr_opt(&verbs_class.join(&entry).join("ibdev"))?.as_deref() == Some(name) {
            return Ok(Some(entry));
        }
    }
    Ok(None)
}

/// The driver: the `device/driver` link for devices with a parent; rxe devices have none and are
/// recognized by the `parent` attribute only rxe registers plus its node description "rxe".
fn driver_name(dir: &Path) -> Result<String> {
    if let Ok(target) = fs::read_link(dir.join("device/driver")) {
        if let Some(driver) = target.file_name().and_then(|n| n.to_str()) {
            return Ok(driver.to_owned());
        }
    }
    let node_desc = read_attr_opt(&dir.join("node_desc"))?;
    if dir.join("parent").exists() && node_desc.as_deref().is_some_and(|d| d.starts_with("rxe")) {
        return Ok("rxe".to_owned());
    }
    Ok("unknown".to_owned())
}

fn ports(dir: &Path) -> Result<Vec<PortInfo>> {
    let ports_dir = dir.join("ports");
    let mut ports = Vec::new();
    for entry in read_dir_names(&ports_dir)? {
        let Ok(port) = entry.parse::<u8>() else {
            continue;
        };
        let port_dir = ports_dir.join(&entry);
        let state_path = port_dir.join("state");
        let state_text = read_attr(&state_path)?;
        let state = state_text
            .split(':')
            .next()
            .and_then(|n| n.trim().parse::<u32>().ok())
            .and_then(|n| PortState::try_from(n).ok())
            .ok_or_else(|| DeviceError::SysfsFormat {
                path: state_path.clone(),
                content: state_text.clone(),
            })?;
        let link_layer = read_attr_opt(&port_dir.join("link_layer"))?.unwrap_or_default();
        ports.push(PortInfo {
            port,
            state,
            link_layer,
        });
    }
    ports.sort_by_key(|p| p.port);
    Ok(ports)
}

/// The netdev behind `port` of RDMA device `device`: the one the port's GID entries name
/// (`ports/<port>/gid_attrs/ndevs/*`), else the device's `parent` (rxe's netdev).
pub fn port_netdev(sysfs_root: &Path, device: &str, port: u8) -> Option<String> {
    let dir = sysfs_root.join("class/infiniband").join(device);
    netdev_of_gids(&dir.join(format!("ports/{port}/gid_attrs/ndevs"))).or_else(|| {
        fs::read_to_string(dir.join("parent"))
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    })
}

/// The first netdev name among `ndevs/*` (a file per GID slot; empty slots cannot be read).
fn netdev_of_gids(ndevs: &Path) -> Option<String> {
    let mut slots: Vec<u32> = fs::read_dir(ndevs)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    slots.sort_unstable();
    slots.into_iter().find_map(|slot| {
        let name = fs::read_to_string(ndevs.join(slot.to_string())).ok()?;
        let name = name.trim();
        (!name.is_empty()).then(|| name.to_owned())
    })
}

/// The interface index of netdev `name` (`<sysfs>/class/net/<name>/ifindex`).
pub fn netdev_ifindex(sysfs_root: &Path, name: &str) -> io::Result<u32> {
    if name.is_empty() || name.contains('/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a netdev name"),
        ));
    }
    let path = sysfs_root.join("class/net").join(name).join("ifindex");
    let text = fs::read_to_string(&path)?;
    text.trim().parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {text:?} is not an interface index", path.display()),
        )
    })
}

/// Parses a sysfs GID ("fe80:0000:…:0702", eight groups of four hex digits).
pub fn parse_gid(text: &str) -> Option<[u8; 16]> {
    let mut gid = [0u8; 16];
    let mut groups = text.split(':');
    for pair in gid.chunks_exact_mut(2) {
        let group = groups.next()?;
        if group.len() != 4 {
            return None;
        }
        let value = u16::from_str_radix(group, 16).ok()?;
        pair.copy_from_slice(&value.to_be_bytes());
    }
    groups.next().is_none().then_some(gid)
}

/// The populated GID entries of a port with their indices, by index (all-zero entries are
/// skipped).
pub fn gid_table(sysfs_root: &Path, device: &str, port: u8) -> Result<Vec<(u32, GidEntry)>> {
    let port_dir = port_dir(sysfs_root, device, port)?;
    let mut indices: Vec<u32> = read_dir_names(&port_dir.join("gids"))?
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect();
    indices.sort_unstable();
    let mut table = Vec::new();
    for index in indices {
        table.extend(read_gid_entry(&port_dir, index)?.map(|entry| (index, entry)));
    }
    Ok(table)
}

/// GID entry `index` of a port, `None` if the slot is empty. One file read (two for a
/// populated slot) instead of the whole table, which holds 1024 slots on rxe.
pub fn gid_entry(
    sysfs_root: &Path,
    device: &str,
    port: u8,
    index: u32,
) -> Result<Option<GidEntry>> {
    read_gid_entry(&port_dir(sysfs_root, device, port)?, index)
}

fn port_dir(sysfs_root: &Path, device: &str, port: u8) -> Result<PathBuf> {
    let class = class_dir(sysfs_root);
    if !class.is_dir() {
        return Err(DeviceError::NoRdmaSubsystem);
    }
    if !class.join(device).is_dir() {
        return Err(DeviceError::DeviceNotFound {
            name: device.to_owned(),
        });
    }
    Ok(class.join(device).join("ports").join(port.to_string()))
}

fn read_gid_entry(port_dir: &Path, index: u32) -> Result<Option<GidEntry>> {
    let path = port_dir.join("gids").join(index.to_string());
    let Some(text) = read_attr_opt(&path)? else {
        return Ok(None);
    };
    let gid = parse_gid(&text).ok_or_else(|| DeviceError::SysfsFormat {
        path: path.clone(),
        content: text.clone(),
    })?;
    if gid == [0; 16] {
        return Ok(None);
    }
    // The kernel answers EINVAL for the type of an empty slot; a slot can empty between
    // the two reads, so a failed type read falls back to the link layer's default type
    // instead of failing.
    let type_path = port_dir.join("gid_attrs/types").join(index.to_string());
    let type_text = fs::read_to_string(&type_path).ok();
    let ethernet = fs::read_to_string(port_dir.join("link_layer"))
        .is_ok_and(|layer| layer.trim_end() == "Ethernet");
    let gid_type = gid_type(type_text.as_deref().map(str::trim_end), ethernet);
    Ok(Some(GidEntry::valid(gid, gid_type)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A fake sysfs + dev tree in a fresh temporary directory, removed on drop.
    struct FakeTree {
        root: PathBuf,
    }

    impl FakeTree {
        fn new() -> FakeTree {
            static SEQ: AtomicU32 = AtomicU32::new(0);
            let root = std::env::temp_dir().join(format!(
                "vrdma-sysfs-test-{}-{}",
                std::process::id(),
                SEQ.fetch_add(1, Ordering::Relaxed)
            ));
            fs::create_dir_all(&root).unwrap();
            FakeTree { root }
        }

        fn sys(&self) -> PathBuf {
            self.root.join("sys")
        }

        fn dev(&self) -> PathBuf {
            self.root.join("dev")
        }

        fn write(&self, rel: &str, content: &str) {
            let path = self.sys().join(rel);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, content).unwrap();
        }

        /// An rxe device the way kernel 6.12 lays it out (no `device` link).
        fn add_rxe(&self, name: &str, uverbs: &str, state: &str) {
            let dev = format!("class/infiniband/{name}");
            self.write(&format!("{dev}/node_desc"), "rxe\n");
            self.write(&format!("{dev}/parent"), "d0\n");
            self.write(&format!("{dev}/fw_ver"), "0.0.0\n");
            self.write(&format!("{dev}/ports/1/state"), &format!("{state}\n"));
            self.write(&format!("{dev}/ports/1/link_layer"), "Ethernet\n");
            self.write(
                &format!("{dev}/ports/1/gids/0"),
                "fe80:0000:0000:0000:e831:2eff:feaa:0702\n",
            );
            self.write(
                &format!("{dev}/ports/1/gids/1"),
                "0000:0000:0000:0000:0000:0000:0000:0000\n",
            );
            self.write(
                &format!("{dev}/ports/1/gids/10"),
                "0000:0000:0000:0000:0000:ffff:c000:0201\n",
            );
            self.write(&format!("{dev}/ports/1/gid_attrs/types/0"), "RoCE v2\n");
            self.write(&format!("{dev}/ports/1/gid_attrs/types/10"), "IB/RoCE v1\n");
            self.write(
                &format!("class/infiniband_verbs/{uverbs}/ibdev"),
                &format!("{name}\n"),
            );
        }
    }

    impl Drop for FakeTree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.root);
        }
    }

    #[test]
    fn no_infiniband_class_is_no_rdma_subsystem() {
        let tree = FakeTree::new();
        fs::create_dir_all(tree.sys().join("class/net")).unwrap();
        let err = find_device(&tree.sys(), &tree.dev(), None).unwrap_err();
        assert!(matches!(err, DeviceError::NoRdmaSubsystem));
        assert_eq!(
            err.to_string(),
            "no RDMA subsystem in this kernel (no /sys/class/infiniband)"
        );
        assert!(matches!(
            find_device(&tree.sys(), &tree.dev(), Some("rxe0")),
            Err(DeviceError::NoRdmaSubsystem)
        ));
        assert!(matches!(
            gid_table(&tree.sys(), "rxe0", 1),
            Err(DeviceError::NoRdmaSubsystem)
        ));
    }

    #[test]
    fn this_machine_without_rdma_reports_the_same_error() {
        // The host test machines have no RDMA; where one does, the lookup must still work.
        match device_names(Path::new(SYSFS_ROOT)) {
            Err(DeviceError::NoRdmaSubsystem) => {
                assert!(!Path::new("/sys/class/infiniband").exists())
            }
            Ok(_) => assert!(Path::new("/sys/class/infiniband").is_dir()),
            Err(other) => panic!("unexpected error {other}"),
        }
    }

    #[test]
    fn rxe_device_is_found_through_the_verbs_class() {
        let tree = FakeTree::new();
        tree.add_rxe("rxe0", "uverbs0", "4: ACTIVE");
        let info = find_device(&tree.sys(), &tree.dev(), Some("rxe0")).unwrap();
        assert_eq!(info.name, "rxe0");
        assert_eq!(info.driver, "rxe");
        assert_eq!(info.uverbs_path, tree.dev().join("infiniband/uverbs0"));
        assert_eq!(info.fw_ver, "0.0.0");
        assert_eq!(
            info.ports,
            vec![PortInfo {
                port: 1,
                state: PortState::Active,
                link_layer: "Ethernet".into()
            }]
        );
    }

    #[test]
    fn missing_named_device_is_its_own_error() {
        let tree = FakeTree::new();
        tree.add_rxe("rxe0", "uverbs0", "4: ACTIVE");
        let err = find_device(&tree.sys(), &tree.dev(), Some("mlx5_0")).unwrap_err();
        assert!(matches!(err, DeviceError::DeviceNotFound { ref name } if name == "mlx5_0"));
        assert!(matches!(
            find_device(&tree.sys(), &tree.dev(), Some("../rxe0")),
            Err(DeviceError::DeviceNotFound { .. })
        ));
    }

    #[test]
    fn default_device_is_the_first_with_an_active_port() {
        let tree = FakeTree::new();
        tree.add_rxe("rxe0", "uverbs0", "1: DOWN");
        tree.add_rxe("rxe1", "uverbs1", "4: ACTIVE");
        tree.add_rxe("rxe2", "uverbs2", "4: ACTIVE");
        let info = find_device(&tree.sys(), &tree.dev(), None).unwrap();
        assert_eq!(info.name, "rxe1");
        assert_eq!(info.uverbs_path, tree.dev().join("infiniband/uverbs1"));
    }

    #[test]
    fn no_active_port_anywhere() {
        let tree = FakeTree::new();
        tree.add_rxe("rxe0", "uverbs0", "1: DOWN");
        assert!(matches!(
            find_device(&tree.sys(), &tree.dev(), None),
            Err(DeviceError::NoActiveDevice)
        ));
    }

    #[test]
    fn pci_device_uses_its_parent_links() {
        let tree = FakeTree::new();
        let dev = "class/infiniband/mlx5_0";
        tree.write(&format!("{dev}/ports/1/state"), "4: ACTIVE\n");
        tree.write(
            &format!("{dev}/device/infiniband_verbs/uverbs3/ibdev"),
            "mlx5_0\n",
        );
        let drivers = tree.sys().join("bus/pci/drivers/mlx5_core");
        fs::create_dir_all(&drivers).unwrap();
        std::os::unix::fs::symlink(&drivers, tree.sys().join(dev).join("device/driver")).unwrap();
        let info = device_info(&tree.sys(), &tree.dev(), "mlx5_0").unwrap();
        assert_eq!(info.driver, "mlx5_core");
        assert_eq!(info.uverbs_path, tree.dev().join("infiniband/uverbs3"));
    }

    #[test]
    fn device_without_uverbs_is_reported() {
        let tree = FakeTree::new();
        tree.write("class/infiniband/odd0/ports/1/state", "4: ACTIVE\n");
        assert!(matches!(
            device_info(&tree.sys(), &tree.dev(), "odd0"),
            Err(DeviceError::NoVerbsDevice { .. })
        ));
    }

    #[test]
    fn malformed_port_state_is_an_error_not_a_panic() {
        let tree = FakeTree::new();
        tree.add_rxe("rxe0", "uverbs0", "garbage");
        assert!(matches!(
            device_info(&tree.sys(), &tree.dev(), "rxe0"),
            Err(DeviceError::SysfsFormat { .. })
        ));
    }

    #[test]
    fn gid_table_skips_empty_entries_and_reads_types() {
        let tree = FakeTree::new();
        tree.add_rxe("rxe0", "uverbs0", "4: ACTIVE");
        let table = gid_table(&tree.sys(), "rxe0", 1).unwrap();
        assert_eq!(table.len(), 2);
        assert_eq!(table[0].0, 0);
        assert!(table[0].1.is_valid());
        assert_eq!(
            table[0].1.gid,
            [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0xe8, 0x31, 0x2e, 0xff, 0xfe, 0xaa, 0x07, 0x02]
        );
        assert_eq!(table[0].1.gid_type(), Ok(GidType::RoceV2));
        assert_eq!(table[1].0, 10, "numeric, not lexicographic, order");
        // "IB/RoCE v1" on an Ethernet port.
        assert_eq!(table[1].1.gid_type(), Ok(GidType::RoceV1));
    }

    #[test]
    fn gid_types_by_link_layer() {
        assert_eq!(gid_type(Some("RoCE v2"), true), GidType::RoceV2);
        assert_eq!(gid_type(Some("IB/RoCE v1"), true), GidType::RoceV1);
        assert_eq!(gid_type(None, true), GidType::RoceV1);
        assert_eq!(gid_type(Some("IB/RoCE v1"), false), GidType::Ib);
    }

    #[test]
    fn single_gid_entries_match_the_table() {
        let tree = FakeTree::new();
        tree.add_rxe("rxe0", "uverbs0", "4: ACTIVE");
        let table = gid_table(&tree.sys(), "rxe0", 1).unwrap();
        for (index, entry) in &table {
            assert_eq!(
                gid_entry(&tree.sys(), "rxe0", 1, *index).unwrap().as_ref(),
                Some(entry)
            );
        }
        // Slot 1 is all zeroes, slot 500 has no file: both empty.
        assert_eq!(gid_entry(&tree.sys(), "rxe0", 1, 1).unwrap(), None);
        assert_eq!(gid_entry(&tree.sys(), "rxe0", 1, 500).unwrap(), None);
        assert!(matches!(
            gid_entry(&tree.sys(), "rxe9", 1, 0),
            Err(DeviceError::DeviceNotFound { .. })
        ));
    }

    #[test]
    fn gid_parsing_is_strict() {
        assert!(parse_gid("fe80:0000:0000:0000:e831:2eff:feaa:0702").is_some());
        assert!(parse_gid("fe80::1").is_none());
        assert!(parse_gid("fe80:0000:0000:0000:e831:2eff:feaa:0702:0000").is_none());
        assert!(parse_gid("zz80:0000:0000:0000:e831:2eff:feaa:0702").is_none());
    }
}

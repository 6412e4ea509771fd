//! What the device reported, as the class tree's files say it: the facts read through the
//! agent's own session ([`DeviceFacts`]), the files written from them ([`class_files`],
//! [`write_class_tree`]) and a one-line summary for the log.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use log::warn;
use vrdma::interfaces::{self, Addresses};
use vrdma::spec::verbs::{GidType, PortState};
use vrdma::Context;

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
    /// Every index of the table (its length), and the populated ones.
    pub gid_table_len: u32,
    pub gids: Vec<GidFacts>,
    pub pkey0: u16,
}

/// A populated entry of a port's GID table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidFacts {
    pub index: u32,
    pub gid: [u8; 16],
    pub gid_type: GidType,
    /// The interface of the agent's network namespace that holds the GID's address: what the
    /// kernel names in `gid_attrs/ndevs` (and lists in `device/net`) for its own devices.
    pub netdev: Option<String>,
}

impl GidFacts {
    fn new(index: u32, gid: [u8; 16], gid_type: GidType, local: &Addresses) -> Self {
        let netdev = local.holding(interfaces::gid_address(gid)).map(|i| i.name);
        Self {
            index,
            gid,
            gid_type,
            netdev,
        }
    }
}

impl DeviceFacts {
    /// Asks the device through `context`.
    pub fn read(name: &str, context: &Context) -> vrdma::verbs::Result<Self> {
        let attr = context.query_device();
        // One look at the namespace's addresses for every GID (an empty list if it fails:
        // the GIDs then name no netdev).
        let local = Addresses::current().unwrap_or_default();
        let mut ports = Vec::new();
        for number in 1..=attr.phys_port_cnt {
            let port = context.query_port(number)?;
            let table = context.read_gid_table(number)?;
            let gids = table
                .populated()
                .iter()
                .filter_map(|(index, entry)| {
                    Some(GidFacts::new(
                        *index,
                        entry.gid,
                        entry.gid_type().ok()?,
                        &local,
                    ))
                })
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

/// The kernel's GUID and GID formats (`%pI6` for GIDs): the bytes in groups of four hex
/// digits joined by colons, nothing left out.
fn hex_groups(bytes: &[u8]) -> String {
    bytes
        .chunks(2)
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
            format!("{}\n", hex_groups(&facts.node_guid)),
        ),
        (
            "sys_image_guid".into(),
            format!("{}\n", hex_groups(&facts.sys_image_guid)),
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
        // populated entry has a type and a netdev (the kernel fails the read of an empty one's).
        for index in 0..port.gid_table_len {
            let entry = port.gids.iter().find(|entry| entry.index == index);
            let gid = entry.map_or([0; 16], |entry| entry.gid);
            files.push((
                file(&format!("gids/{index}")),
                format!("{}\n", hex_groups(&gid)),
            ));
            let Some(entry) = entry else { continue };
            files.push((
                file(&format!("gid_attrs/types/{index}")),
                format!("{}\n", gid_type_text(entry.gid_type)),
            ));
            if let Some(netdev) = &entry.netdev {
                files.push((
                    file(&format!("gid_attrs/ndevs/{index}")),
                    format!("{netdev}\n"),
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
    // The interfaces holding the GIDs' addresses, as the kernel lists a device's netdevs
    // (rdma-core's tests find the port's address through it).
    let mut netdevs: Vec<&str> = facts
        .ports
        .iter()
        .flat_map(|port| &port.gids)
        .filter_map(|entry| entry.netdev.as_deref())
        .collect();
    netdevs.sort_unstable();
    netdevs.dedup();
    if !netdevs.is_empty() {
        std::fs::create_dir_all(device.join("net"))?;
    }
    for netdev in netdevs {
        std::os::unix::fs::symlink(
            Path::new("/sys/class/net").join(netdev),
            device.join("net").join(netdev),
        )?;
    }
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
pub(crate) mod tests {
    use super::*;

    pub(crate) fn facts() -> DeviceFacts {
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
                    GidFacts {
                        index: 0,
                        gid: link_local,
                        gid_type: GidType::RoceV2,
                        netdev: Some("d0".into()),
                    },
                    GidFacts {
                        index: 2,
                        gid: link_local,
                        gid_type: GidType::RoceV1,
                        netdev: None,
                    },
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
        // The netdev only where an interface holds the address.
        assert_eq!(file(&files, "ports/1/gid_attrs/ndevs/0"), Some("d0\n"));
        assert_eq!(file(&files, "ports/1/gid_attrs/ndevs/2"), None);
    }

    #[test]
    fn a_gid_of_an_address_here_names_the_interface_holding_it() {
        let loopback = std::net::Ipv6Addr::LOCALHOST.octets();
        let local = Addresses::current().unwrap();
        let entry = GidFacts::new(0, loopback, GidType::RoceV2, &local);
        // ::1 is lo's unless this namespace has no IPv6 at all.
        if std::fs::metadata("/proc/net/if_inet6").is_ok() {
            assert_eq!(entry.netdev.as_deref(), Some("lo"));
        }
        let documentation: std::net::Ipv6Addr = "2001:db8::77".parse().unwrap();
        assert_eq!(
            GidFacts::new(1, documentation.octets(), GidType::RoceV2, &local).netdev,
            None
        );
    }
}

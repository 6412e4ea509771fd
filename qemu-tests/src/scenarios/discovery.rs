//! Discovery: UCX finds the device the way it finds any RDMA device, through the files the
//! guest agent publishes (`vrdma-guestd --publish`, spec §7.6), natively first.
//!
//! In process mode the agent writes them into a directory, and a container runtime
//! bind-mounts it at `/sys/class/infiniband` and `/dev/infiniband/vrdma0`; the scenario does
//! what the runtime does, in a mount namespace of its own, and runs unmodified `ucx_info -d`
//! there as `nobody` over the drop-in and the agent. In VM mode the agent publishes at those
//! paths itself (the real-guest suite checks it there).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::inside::{Proc, DEVICE};
use crate::perftest::DROPIN_DEVICE as VRDMA_DEVICE;
use crate::vm::shell_quote;

/// The UCX transports a verbs device must offer.
pub const VERBS_TRANSPORTS: &[&str] = &["rc_verbs", "ud_verbs"];

/// Where `vrdma-guestd --publish DIR` puts the node.
pub fn published_node(dir: &Path) -> PathBuf {
    dir.join("dev/infiniband").join(VRDMA_DEVICE)
}

/// What UCX listed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UcxListing {
    /// `(transport, device)` pairs on rxe0 natively.
    pub native: Vec<(String, String)>,
    /// The same over vrdma.
    pub vrdma: Vec<(String, String)>,
}

/// The `(transport, device)` pairs of `ucx_info -d`'s output.
pub fn ucx_devices(output: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut transport = None;
    for line in output.lines() {
        let line = line.trim_start_matches('#').trim();
        if let Some(name) = line.strip_prefix("Transport:") {
            transport = Some(name.trim().to_string());
        } else if let Some(device) = line.strip_prefix("Device:") {
            if let Some(transport) = &transport {
                pairs.push((transport.clone(), device.trim().to_string()));
            }
        }
    }
    pairs
}

/// Whether `pairs` list every verbs transport on `device` port 1; the first missing one if not.
fn verbs_transports_on(pairs: &[(String, String)], device: &str) -> Result<(), &'static str> {
    let port = format!("{device}:1");
    match VERBS_TRANSPORTS
        .iter()
        .find(|transport| !pairs.iter().any(|(t, d)| t == *transport && *d == port))
    {
        Some(missing) => Err(missing),
        None => Ok(()),
    }
}

/// How long one `ucx_info -d` may take: a hang bound (it loads every UCX module it has and
/// opens every transport, each of its verbs a command through the agent, under nested TCG).
const UCX_INFO_TIMEOUT: Duration = Duration::from_secs(600);

/// Runs `command` (an `ucx_info -d`) and returns what it listed, which must include the verbs
/// transports on `device` port 1.
fn listing_of(name: &str, command: &mut Command, device: &str) -> Result<Vec<(String, String)>> {
    let mut ucx_info = Proc::spawn(name, command)?;
    ucx_info.wait_success(UCX_INFO_TIMEOUT)?;
    let text = ucx_info.output();
    let pairs = ucx_devices(&text);
    verbs_transports_on(&pairs, device)
        .map_err(|missing| ucx_info.failure(&format!("lists no {missing} on {device}:1")))?;
    Ok(pairs)
}

/// `ucx_info -d` as `nobody` over the drop-in in `library_dir` and the agent at `socket`,
/// run by `sh -c` after `setup` (shell lines).
fn ucx_info_as_nobody(setup: &str, socket: &Path, library_dir: &Path) -> String {
    format!(
        "set -e\n{setup}exec setpriv --reuid=65534 --regid=65534 --clear-groups -- \
         env VRDMA_AGENT={socket} LD_LIBRARY_PATH={library} ucx_info -d\n",
        socket = shell_quote(&socket.to_string_lossy()),
        library = shell_quote(&library_dir.to_string_lossy()),
    )
}

/// Process mode: `ucx_info -d` natively, then as `nobody` over the drop-in and the agent, with
/// the agent's publication in `published` mounted where UCX looks, as a container runtime
/// would mount it.
pub fn ucx_listing(
    published: &Path,
    agent_socket: &Path,
    library_dir: &Path,
) -> Result<UcxListing> {
    let native = listing_of(
        "ucx-info-native",
        Command::new("ucx_info").arg("-d"),
        DEVICE,
    )?;
    let setup = format!(
        "mount --bind {class} /sys/class/infiniband\n\
         mount -t tmpfs -o mode=0755 tmpfs /dev/infiniband\n\
         touch /dev/infiniband/{VRDMA_DEVICE}\n\
         mount --bind {node} /dev/infiniband/{VRDMA_DEVICE}\n",
        class = shell_quote(&published.join("class/infiniband").to_string_lossy()),
        node = shell_quote(&published_node(published).to_string_lossy()),
    );
    let vrdma = listing_of(
        "ucx-info-container",
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(ucx_info_as_nobody(&setup, agent_socket, library_dir))
            .env_remove("VRDMA_SOCKET"),
        VRDMA_DEVICE,
    )?;
    Ok(UcxListing { native, vrdma })
}

/// VM mode (`vrdma-guestd --pci` publishes at the system paths): what UCX reads there, as
/// `(path, what it holds)`: the node, a character device with the agent socket's group and
/// mode, and each GID's type, at least one of them RoCE v2. (`ucx_info -d` itself runs over the
/// same files in process mode: in the nested guest it took 2 to 10 minutes.)
pub fn published_in_vm(agent_socket: &Path) -> Result<Vec<(String, String)>> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let node = Path::new("/dev/infiniband").join(VRDMA_DEVICE);
    let stat = |path: &Path| {
        std::fs::metadata(path).map_err(|e| Error::Scenario(format!("{}: {e}", path.display())))
    };
    let (node_meta, socket_meta) = (stat(&node)?, stat(agent_socket)?);
    let same_access = node_meta.mode() & 0o777 == socket_meta.mode() & 0o777
        && node_meta.gid() == socket_meta.gid();
    if !node_meta.file_type().is_char_device() || !same_access {
        return Err(Error::Scenario(format!(
            "{} is not a character device with the agent socket's access: {node_meta:?}",
            node.display()
        )));
    }
    let mut published = vec![(
        node.display().to_string(),
        format!(
            "character device, mode {:o}, group {}",
            node_meta.mode() & 0o777,
            node_meta.gid()
        ),
    )];
    let types = Path::new("/sys/class/infiniband")
        .join(VRDMA_DEVICE)
        .join("ports/1/gid_attrs/types");
    let entries = std::fs::read_dir(&types)
        .map_err(|e| Error::Scenario(format!("{}: {e}", types.display())))?;
    for entry in entries.flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        published.push((entry.path().display().to_string(), text.trim().to_string()));
    }
    if !published.iter().any(|(_, text)| text == "RoCE v2") {
        return Err(Error::Scenario(format!(
            "no RoCE v2 GID in {}: {published:?}",
            types.display()
        )));
    }
    Ok(published)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of `ucx_info -d` (UCX 1.18), trimmed.
    const LISTING: &str = "\
#      Transport: tcp
#         Device: lo
#  Type: network
#      Transport: rc_verbs
#         Device: vrdma0:1
#           capabilities:
#      Transport: ud_verbs
#         Device: vrdma0:1
#       error handling: peer failure, ep_check
";

    #[test]
    fn transports_are_paired_with_their_devices() {
        let pairs = ucx_devices(LISTING);
        assert_eq!(
            pairs,
            [
                ("tcp".to_string(), "lo".to_string()),
                ("rc_verbs".into(), "vrdma0:1".into()),
                ("ud_verbs".into(), "vrdma0:1".into()),
            ]
        );
        assert!(verbs_transports_on(&pairs, "vrdma0").is_ok());
        assert!(verbs_transports_on(&pairs, "rxe0").is_err());
        let without_ud = ucx_devices(&LISTING.replace("ud_verbs", "ud_mlx5"));
        assert!(verbs_transports_on(&without_ud, "vrdma0").is_err());
    }
}

//! Booting the two hosts of [`crate::vm_link`] at once, joined by their link.

use std::path::{Path, PathBuf};
use std::thread;

use crate::error::{Error, Result};
use crate::rootfs::PreparedRoot;
use crate::vm::{self, RunOutcome, VmConfig};
use crate::vm_link::{Host, LinkEnd};

/// Boots the VMs of hosts A and B from `root`, joined by a link, each running its command
/// with its configuration, and returns their outcomes (A first) once both ended.
///
/// Each VM gets its link end and host name; everything else comes from its configuration. The
/// two run concurrently and meet only over the link, so scenarios must bound every wait on
/// the other side (a VM that fails early leaves its peer waiting until its own timeouts).
pub fn run_linked(
    root: &PreparedRoot,
    runs: [(VmConfig, Vec<String>); 2],
) -> Result<[Result<RunOutcome>; 2]> {
    let dir = link_dir()?;
    let socket = |host: Host| dir.join(format!("{}.sock", host.name()));
    let [(mut config_a, command_a), (mut config_b, command_b)] = runs;
    for (config, host) in [(&mut config_a, Host::A), (&mut config_b, Host::B)] {
        config.link = Some(LinkEnd {
            host,
            local_socket: socket(host),
            peer_socket: socket(host.peer()),
        });
    }
    let outcomes = thread::scope(|scope| {
        let b = scope.spawn(|| vm::run(root, &config_b, &command_b));
        let a = vm::run(root, &config_a, &command_a);
        let b = b
            .join()
            .unwrap_or_else(|_| Err(Error::Scenario("host B's runner panicked".into())));
        [a, b]
    });
    if let Err(e) = std::fs::remove_dir_all(&dir) {
        log::warn!("cannot remove {}: {e}", dir.display());
    }
    Ok(outcomes)
}

/// A fresh directory for the link's sockets (unix socket paths must stay short).
fn link_dir() -> Result<PathBuf> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = Path::new("/tmp").join(format!(
        "vrdma-link-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::Usage(format!("creating {}: {e}", dir.display())))?;
    Ok(dir)
}

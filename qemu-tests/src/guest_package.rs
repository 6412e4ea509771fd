//! The `vrdma-guest` Debian package of this build, as the real guest installs it: made by
//! `vrdma-deb` (next to this executable) from the drop-in and the agent this build made.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, IoContext, Result};
use crate::host::run_checked;

/// Builds the package into `out` from the drop-in at `dropin` and the agent and `vrdma-deb`
/// in `profile_dir`; returns the package's path.
pub fn build(profile_dir: &Path, dropin: &Path, out: &Path) -> Result<PathBuf> {
    // vrdma-deb takes its inputs from one directory, by cargo's names; the drop-in in use may
    // be cargo test's copy in deps/.
    let artifacts = out.join("artifacts");
    std::fs::create_dir_all(&artifacts).context(|| format!("creating {}", artifacts.display()))?;
    for (name, from) in [
        ("libvrdma_ibverbs.so", dropin.to_path_buf()),
        ("vrdma-guestd", profile_dir.join("vrdma-guestd")),
    ] {
        let link = artifacts.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&from, &link)
            .context(|| format!("linking {} to {}", link.display(), from.display()))?;
    }
    let tool = profile_dir.join("vrdma-deb");
    let output = run_checked(
        Command::new(&tool)
            .arg("--artifacts")
            .arg(&artifacts)
            .arg("--out")
            .arg(out)
            // Quick: the test builds a package on every run.
            .args(["--compression", "gzip"]),
    )?;
    let printed = String::from_utf8_lossy(&output.stdout);
    let package = PathBuf::from(printed.trim());
    if !package.is_file() {
        return Err(Error::Scenario(format!(
            "{} printed {printed:?}, which is not a package",
            tool.display()
        )));
    }
    Ok(package)
}

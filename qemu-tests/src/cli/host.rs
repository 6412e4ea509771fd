//! What the host halves of the suites share: the root file system they boot, the cargo target
//! directory, and the drop-in library cargo built.

use std::path::{Path, PathBuf};

use crate::cache::Cache;
use crate::error::{Error, Result};
use crate::native;
use crate::rootfs::{self, PreparedRoot, TRIXIE_RXE};

/// The VM's root file system, prepared into the cache unless it is there already.
pub fn prepared_root() -> Result<PreparedRoot> {
    rootfs::prepare(&Cache::from_env()?, &TRIXIE_RXE, false)
}

/// The cargo target directory this executable runs from.
pub fn target_dir() -> Result<PathBuf> {
    native::default_target_dir()
        .ok_or_else(|| Error::Usage("cannot find the cargo target directory".into()))
}

/// The drop-in library as cargo names it (installed as libibverbs.so.1).
const DROPIN_LIBRARY: &str = "libvrdma_ibverbs.so";

/// The directory of this executable: the cargo profile directory the workspace binaries are in.
pub fn profile_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().map_err(|e| Error::Usage(format!("current_exe: {e}")))?;
    Ok(exe.parent().unwrap_or(Path::new(".")).to_path_buf())
}

/// The vrdma-backend cargo built beside this executable.
pub fn backend_binary() -> Result<PathBuf> {
    Ok(profile_dir()?.join("vrdma-backend"))
}

/// The profile directory of this executable and the drop-in library cargo built there.
pub fn dropin_library() -> Result<(PathBuf, PathBuf)> {
    let profile_dir = profile_dir()?;
    // `cargo build` puts the cdylib next to the binaries; `cargo test` leaves it in deps/.
    let library = [
        profile_dir.join(DROPIN_LIBRARY),
        profile_dir.join("deps").join(DROPIN_LIBRARY),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .ok_or_else(|| {
        Error::Usage(format!(
            "no {DROPIN_LIBRARY} in {}: build the workspace first",
            profile_dir.display()
        ))
    })?;
    Ok((profile_dir, library))
}

//! The workspace binaries a scenario runs inside the VM (process-pingpong, qtest and the real
//! guest's host side): vrdma-backend, vrdma-keeper, vrdma-pingpong and vrdma-guestd next to
//! this executable, and the native C peer built on the host.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Where the binaries of this run are.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub backend: PathBuf,
    /// vrdma-keeper, which QEMU connects to when the daemon is to restart under it.
    pub keeper: PathBuf,
    pub pingpong: PathBuf,
    pub native_pingpong: PathBuf,
    /// The guest agent, vrdma-guestd.
    pub agent: PathBuf,
}

impl Binaries {
    /// The workspace binaries next to this executable and the native peer at `native`.
    pub fn beside_current_exe(native: PathBuf) -> Result<Self> {
        let exe = std::env::current_exe()
            .map_err(|e| Error::Scenario(format!("locating this executable: {e}")))?;
        let dir = exe.parent().unwrap_or(Path::new("."));
        let binaries = Self {
            backend: dir.join("vrdma-backend"),
            keeper: dir.join("vrdma-keeper"),
            pingpong: dir.join("vrdma-pingpong"),
            native_pingpong: native,
            agent: dir.join("vrdma-guestd"),
        };
        for path in [
            &binaries.backend,
            &binaries.keeper,
            &binaries.pingpong,
            &binaries.native_pingpong,
            &binaries.agent,
        ] {
            if !path.is_file() {
                return Err(Error::Scenario(format!(
                    "{} is missing: build the workspace first (cargo build --workspace --bins)",
                    path.display()
                )));
            }
        }
        Ok(binaries)
    }
}

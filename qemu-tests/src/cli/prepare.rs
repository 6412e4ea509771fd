//! `vrdma-vm prepare`: the VM's root file system, built into the cache.

use crate::cache::Cache;
use crate::error::Result;
use crate::rootfs::{self, TRIXIE_RXE};

/// Prepares the root file system (again if `force`) and prints where its tree is.
pub fn prepare(force: bool) -> Result<()> {
    let root = rootfs::prepare(&Cache::from_env()?, &TRIXIE_RXE, force)?;
    println!("{}", root.tree.display());
    Ok(())
}

//! The VM options of every subcommand that boots the VM, and the configuration they give.

use std::path::PathBuf;
use std::time::Duration;

use crate::accel::Accel;
use crate::error::{Error, Result};
use crate::rootfs::PreparedRoot;
use crate::vm::{shares_for, timeout_from_env, VmConfig, DEFAULT_TIMEOUT};

#[derive(clap::Args)]
pub struct VmArgs {
    /// Give up after this many seconds [default: $VRDMA_VM_TIMEOUT, or 1800; 3900 for the
    /// real guest, whose nested guest may take 3000].
    #[arg(long)]
    timeout: Option<u64>,
    /// Guest memory in MiB.
    #[arg(long)]
    memory: Option<u32>,
    /// Guest CPUs [default: host CPUs, at most 8].
    #[arg(long)]
    cpus: Option<u32>,
    /// Extra host directories to share read-only at the same path (the workspace and the
    /// target directory are always shared).
    #[arg(long)]
    share: Vec<PathBuf>,
}

impl VmArgs {
    /// The configuration of a VM booting `root`: this host's defaults, with these options.
    pub fn config(&self, root: &PreparedRoot) -> Result<VmConfig> {
        self.config_lasting(root, DEFAULT_TIMEOUT)
    }

    /// [`VmArgs::config`] of a VM whose run may take up to `default` when neither
    /// `--timeout` nor `$VRDMA_VM_TIMEOUT` says otherwise.
    pub fn config_lasting(&self, root: &PreparedRoot, default: Duration) -> Result<VmConfig> {
        let mut config = VmConfig::for_host(Accel::choose(root)?)?;
        config.timeout = timeout_from_env().unwrap_or(default);
        if let Some(secs) = self.timeout {
            config.timeout = Duration::from_secs(secs);
        }
        if let Some(memory) = self.memory {
            config.memory_mib = memory;
        }
        if let Some(cpus) = self.cpus {
            config.cpus = cpus;
        }
        if !self.share.is_empty() {
            let mut paths: Vec<PathBuf> = config.shares.drain(..).map(|s| s.host_path).collect();
            for path in &self.share {
                paths.push(
                    path.canonicalize()
                        .map_err(|e| Error::Usage(format!("--share {}: {e}", path.display())))?,
                );
            }
            config.shares = shares_for(paths);
        }
        Ok(config)
    }
}

//! `vrdma-vm run`: one command in the VM.

use super::host::prepared_root;
use super::vm_args::VmArgs;
use crate::error::Result;
use crate::vm;

/// Boots the VM, runs `command` in it and returns its exit status as this process's (1 for a
/// status that does not fit).
pub fn run(vm_args: &VmArgs, command: &[String]) -> Result<u8> {
    let root = prepared_root()?;
    let outcome = vm::run(&root, &vm_args.config(&root)?, command)?;
    log::info!(
        "command exited with {} after {:.1?}",
        outcome.status,
        outcome.elapsed
    );
    Ok(u8::try_from(outcome.status).unwrap_or(1))
}

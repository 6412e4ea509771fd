//! `backend-device`: the backend's host-device layer on rxe0, its `device_rxe` integration
//! tests run in the VM.

use super::host::prepared_root;
use super::vm_args::VmArgs;
use crate::error::{Error, Result};
use crate::vm;
use crate::workspace;

/// `vrdma-vm test backend-device`.
pub fn test(vm_args: &VmArgs) -> Result<()> {
    let root = prepared_root()?;
    let test = workspace::newest_test_binary("device_rxe")?;
    let config = vm_args.config(&root)?;
    let command = vec![
        test.to_string_lossy().into_owned(),
        "--ignored".into(),
        "--test-threads=1".into(),
        // The VM's serial console is a terminal; keep escape codes out of the host's logs.
        "--color=never".into(),
    ];
    let outcome = vm::run(&root, &config, &command)?;
    if outcome.status != 0 {
        return Err(Error::Scenario(format!(
            "{} failed in the VM (status {})",
            test.display(),
            outcome.status
        )));
    }
    Ok(())
}

//! `backend-device`: the backend's host-device layer on rxe0: its `device_rxe`,
//! `device_rxe_windows` and `device_rxe_cm` integration tests (ignored outside the VM), run in
//! one VM boot.

use super::host::prepared_root;
use super::vm_args::VmArgs;
use crate::error::{Error, Result};
use crate::vm;
use crate::workspace;

/// The backend's test binaries that need rdma_rxe.
const DEVICE_TESTS: &[&str] = &["device_rxe", "device_rxe_windows", "device_rxe_cm"];

/// `vrdma-vm test backend-device`.
pub fn test(vm_args: &VmArgs) -> Result<()> {
    let root = prepared_root()?;
    let mut script = String::from("set -e\n");
    for name in DEVICE_TESTS {
        let binary = workspace::newest_test_binary(name)?;
        let path = binary.to_string_lossy();
        if path.contains('\'') {
            return Err(Error::Usage(format!("{path}: a quote in the path")));
        }
        // The VM's serial console is a terminal; keep escape codes out of the host's logs.
        script.push_str(&format!(
            "'{path}' --ignored --test-threads=1 --color=never\n"
        ));
    }
    let config = vm_args.config(&root)?;
    let command = vec!["sh".to_string(), "-c".to_string(), script];
    let outcome = vm::run(&root, &config, &command)?;
    if outcome.status != 0 {
        return Err(Error::Scenario(format!(
            "the backend's device tests failed in the VM (status {})",
            outcome.status
        )));
    }
    Ok(())
}

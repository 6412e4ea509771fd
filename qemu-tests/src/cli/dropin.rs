//! `dropin`: the drop-in libibverbs.so.1 under unmodified ibv_devinfo and the C verbs programs
//! of `guest-driver/capi/tests/c`, next to the same programs on rxe0 natively.

use std::path::Path;

use super::host::{dropin_library, prepared_root, target_dir};
use super::vm_args::VmArgs;
use crate::error::{Error, Result};
use crate::native;
use crate::vm;

/// `vrdma-vm test dropin`.
pub fn test(vm_args: &VmArgs) -> Result<()> {
    let root = prepared_root()?;
    let target = target_dir()?;
    let workspace = vm::find_workspace_root(Path::new(env!("CARGO_MANIFEST_DIR")))
        .ok_or_else(|| Error::Usage("cannot find the workspace".into()))?;
    let tests = workspace.join("guest-driver/capi/tests");
    let program =
        native::build_program(&target, &tests.join("c/verbs_loopback.c"), "verbs_loopback")?;
    let async_events =
        native::build_program(&target, &tests.join("c/async_events.c"), "async_events")?;
    let (profile_dir, library) = dropin_library()?;
    let command: Vec<String> = vec![
        "sh".into(),
        tests.join("vm-dropin.sh").to_string_lossy().into_owned(),
        profile_dir
            .join("vrdma-backend")
            .to_string_lossy()
            .into_owned(),
        library.to_string_lossy().into_owned(),
        program.to_string_lossy().into_owned(),
        async_events.to_string_lossy().into_owned(),
    ];
    let outcome = vm::run(&root, &vm_args.config(&root)?, &command)?;
    if outcome.status != 0 {
        return Err(Error::Scenario(format!(
            "the drop-in run failed in the VM (status {})",
            outcome.status
        )));
    }
    Ok(())
}

//! `dropin`: the drop-in libibverbs.so.1 under unmodified ibv_devinfo and the C verbs programs
//! of `guest-driver/capi/tests/c`, next to the same programs on rxe0 natively.

use std::path::{Path, PathBuf};

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
    let programs = build_c_programs(&target, &tests.join("c"))?;
    let (profile_dir, library) = dropin_library()?;
    let mut command: Vec<String> = vec![
        "sh".into(),
        tests.join("vm-dropin.sh").to_string_lossy().into_owned(),
        profile_dir
            .join("vrdma-backend")
            .to_string_lossy()
            .into_owned(),
        library.to_string_lossy().into_owned(),
    ];
    command.extend(programs.iter().map(|p| p.to_string_lossy().into_owned()));
    let outcome = vm::run(&root, &vm_args.config(&root)?, &command)?;
    if outcome.status != 0 {
        return Err(Error::Scenario(format!(
            "the drop-in run failed in the VM (status {})",
            outcome.status
        )));
    }
    Ok(())
}

/// Builds every `*.c` of `dir` (in name order) with the system C compiler against the system
/// rdma-core headers, warnings as errors; the binaries, named after their sources.
fn build_c_programs(target: &Path, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut sources: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::Usage(format!("listing {}: {e}", dir.display())))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "c"))
        .collect();
    sources.sort();
    sources
        .iter()
        .map(|source| {
            let name = source.file_stem().unwrap_or_default().to_string_lossy();
            native::build_program(target, source, &name)
        })
        .collect()
}

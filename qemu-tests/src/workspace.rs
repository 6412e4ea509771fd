//! The workspace binaries the VM scenarios run (the daemon, the vrdma tools), built with the
//! same cargo profile as this executable.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};
use crate::vm::{find_target_dir, find_workspace_root};

/// Packages whose binaries (and, for vrdma-ibverbs, the drop-in library) the scenarios use
/// inside the VM.
const PACKAGES: &[&str] = &[
    "vrdma-backend",
    "vrdma-keeper",
    "vrdma-ibverbs",
    "vrdma-tools",
    "vrdma-guestd",
    "vrdma-packaging",
];

/// `cargo build`s the scenario binaries next to this executable, so that
/// `cargo run -p vrdma-qemu-tests --bin vrdma-vm -- test …` needs nothing built beforehand.
///
/// Under `cargo test` the binaries are built by cargo itself and a nested cargo would wait
/// forever for the build directory lock cargo test holds: tests pass `--no-build`.
pub fn build_scenario_binaries() -> Result<()> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::Usage(format!("locating this executable: {e}")))?;
    let (Some(workspace), Some(target)) = (find_workspace_root(&exe), find_target_dir(&exe)) else {
        log::info!("not inside a cargo workspace: using the binaries next to this executable");
        return Ok(());
    };
    let cmd = build_command(&exe, &workspace, &target);
    log::info!(
        "building the scenario binaries: {}",
        crate::host::describe(&cmd)
    );
    let mut cmd = cmd;
    let status = cmd
        .status()
        .map_err(|e| Error::Usage(format!("running cargo: {e}")))?;
    if !status.success() {
        return Err(Error::Usage(format!("cargo build failed ({status})")));
    }
    Ok(())
}

/// The most recently built cargo test binary `NAME-HASH` next to this executable (in `deps/`).
pub fn newest_test_binary(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::Usage(format!("locating this executable: {e}")))?;
    let deps = exe.parent().unwrap_or(Path::new(".")).join("deps");
    let prefix = format!("{name}-");
    let newest = std::fs::read_dir(&deps)
        .map_err(|e| Error::Usage(format!("listing {}: {e}", deps.display())))?
        .flatten()
        .filter(|entry| {
            let file = entry.file_name().to_string_lossy().into_owned();
            file.strip_prefix(&prefix)
                .is_some_and(|hash| hash.chars().all(|c| c.is_ascii_hexdigit()))
        })
        .filter_map(|entry| Some((entry.metadata().ok()?.modified().ok()?, entry.path())))
        .max();
    newest.map(|(_, path)| path).ok_or_else(|| {
        Error::Usage(format!(
            "no {name} test binary in {}: build it first (cargo test --workspace --no-run)",
            deps.display()
        ))
    })
}

/// `cargo build --profile P -p … --bins` for this executable's profile and target directory.
fn build_command(exe: &Path, workspace: &Path, target: &Path) -> Command {
    let profile = match exe
        .parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
    {
        Some("debug") | None => "dev".to_string(),
        Some(other) => other.to_string(),
    };
    let cargo = std::env::var_os("CARGO").map_or_else(|| PathBuf::from("cargo"), PathBuf::from);
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace)
        .env("CARGO_TARGET_DIR", target)
        .args(["build", "--profile", &profile]);
    for package in PACKAGES {
        cmd.args(["-p", package]);
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_with_the_profile_of_this_executable() {
        let args = |exe: &str| {
            build_command(Path::new(exe), Path::new("/ws"), Path::new("/ws/target"))
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(
            args("/ws/target/release/vrdma-vm"),
            "build --profile release -p vrdma-backend -p vrdma-keeper -p vrdma-ibverbs -p vrdma-tools \
             -p vrdma-guestd -p vrdma-packaging"
        );
        assert!(args("/ws/target/debug/vrdma-vm").contains("--profile dev"));
    }
}

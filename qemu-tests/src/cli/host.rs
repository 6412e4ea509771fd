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
    let library = newest_build(&profile_dir, DROPIN_LIBRARY).ok_or_else(|| {
        Error::Usage(format!(
            "no {DROPIN_LIBRARY} in {}: build the workspace first",
            profile_dir.display()
        ))
    })?;
    Ok((profile_dir, library))
}

/// The newer of the two copies of `file` cargo may have built in `profile_dir`. `cargo build`
/// puts a cdylib next to the binaries; `cargo test` builds it in `deps/` only and leaves an
/// earlier `cargo build`'s copy next to the binaries as it was: taking the first that exists
/// would test an old library in any tree where both commands ran.
fn newest_build(profile_dir: &Path, file: &str) -> Option<PathBuf> {
    let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    [profile_dir.join(file), profile_dir.join("deps").join(file)]
        .into_iter()
        .filter_map(|path| Some((modified(&path)?, path)))
        .max_by_key(|(time, _)| *time)
        .map(|(_, path)| path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    #[test]
    fn the_newer_of_the_two_builds_is_the_library() {
        let dir = std::env::temp_dir().join(format!("vrdma-newest-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("deps")).unwrap();
        let beside = dir.join("lib.so");
        let in_deps = dir.join("deps").join("lib.so");
        assert_eq!(newest_build(&dir, "lib.so"), None);
        std::fs::write(&in_deps, b"new").unwrap();
        assert_eq!(newest_build(&dir, "lib.so"), Some(in_deps.clone()));
        // An older `cargo build` copy beside the binaries loses to the newer one in deps/.
        std::fs::write(&beside, b"old").unwrap();
        let old = SystemTime::now() - Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&beside)
            .unwrap()
            .set_modified(old)
            .unwrap();
        assert_eq!(newest_build(&dir, "lib.so"), Some(in_deps.clone()));
        // And the other way round.
        std::fs::File::options()
            .write(true)
            .open(&in_deps)
            .unwrap()
            .set_modified(old - Duration::from_secs(60))
            .unwrap();
        assert_eq!(newest_build(&dir, "lib.so"), Some(beside));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

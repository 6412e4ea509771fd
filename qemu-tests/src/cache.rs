//! The cache outside the repository that holds root file systems and boot files.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::{IoContext, Result};

/// Where prepared artefacts live: `$VRDMA_CACHE`, else `$XDG_CACHE_HOME/vrdma`, else
/// `~/.cache/vrdma`.
#[derive(Debug, Clone)]
pub struct Cache {
    dir: PathBuf,
}

impl Cache {
    /// The cache named by the environment.
    pub fn from_env() -> Result<Self> {
        let dir = cache_dir_from(|name| std::env::var_os(name).filter(|v| !v.is_empty()))
            .ok_or_else(|| {
                crate::Error::Usage("cannot find a cache directory: set VRDMA_CACHE or HOME".into())
            })?;
        Self::at(dir)
    }

    /// A cache rooted at `dir` (created if missing).
    pub fn at(dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).context(|| format!("creating cache {}", dir.display()))?;
        Ok(Self { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Holds an exclusive lock on the cache until the guard drops, so that concurrent
    /// `prepare` runs (parallel tests) build each artefact once.
    pub fn lock(&self) -> Result<CacheLock> {
        let path = self.dir.join(".lock");
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .context(|| format!("opening {}", path.display()))?;
        file.lock()
            .context(|| format!("locking {}", path.display()))?;
        Ok(CacheLock { _file: file })
    }
}

/// Exclusive lock on a [`Cache`]; released on drop (closing the file releases the flock).
#[derive(Debug)]
pub struct CacheLock {
    _file: File,
}

fn cache_dir_from(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    if let Some(dir) = var("VRDMA_CACHE") {
        return Some(dir.into());
    }
    if let Some(xdg) = var("XDG_CACHE_HOME") {
        return Some(PathBuf::from(xdg).join("vrdma"));
    }
    var("HOME").map(|home| PathBuf::from(home).join(".cache").join("vrdma"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn vrdma_cache_wins() {
        let dir = cache_dir_from(env(&[("VRDMA_CACHE", "/c"), ("HOME", "/h")]));
        assert_eq!(dir, Some(PathBuf::from("/c")));
    }

    #[test]
    fn falls_back_to_xdg_then_home() {
        assert_eq!(
            cache_dir_from(env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])),
            Some(PathBuf::from("/x/vrdma"))
        );
        assert_eq!(
            cache_dir_from(env(&[("HOME", "/h")])),
            Some(PathBuf::from("/h/.cache/vrdma"))
        );
        assert_eq!(cache_dir_from(env(&[])), None);
    }

    #[test]
    fn lock_is_reentrant_after_drop() {
        let dir = std::env::temp_dir().join(format!("vrdma-cache-test-{}", std::process::id()));
        let cache = Cache::at(&dir).unwrap();
        drop(cache.lock().unwrap());
        drop(cache.lock().unwrap());
        std::fs::remove_dir_all(dir).unwrap();
    }
}

//! The agent's socket: who may connect is decided by its owner, group and mode.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

/// Why the socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Another agent answers on the socket.
    #[error("another agent is listening on {0}")]
    InUse(String),
    /// The path exists and is not a socket.
    #[error("{0} exists and is not a socket")]
    NotASocket(String),
    /// The named group does not exist.
    #[error("no group named {0:?}")]
    NoGroup(String),
    /// A system call failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The socket's path.
        path: String,
        /// Cause.
        source: io::Error,
    },
}

/// Listens on `path` (its directory is created), with `mode` and, if given, group `group`.
/// A stale socket left by an agent that died is replaced; a live one is not.
pub fn listen(path: &Path, group: Option<&str>, mode: u32) -> Result<UnixListener, ListenError> {
    let shown = path.display().to_string();
    let io_error = |what: &'static str| {
        let path = shown.clone();
        move |source| ListenError::Io { what, path, source }
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(io_error("cannot create the directory of"))?;
    }
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if UnixStream::connect(path).is_ok() {
                return Err(ListenError::InUse(shown));
            }
            fs::remove_file(path).map_err(io_error("cannot remove the stale socket"))?;
        }
        Ok(_) => return Err(ListenError::NotASocket(shown)),
        Err(_) => {}
    }
    let gid = group.map(group_id).transpose()?;
    let listener = UnixListener::bind(path).map_err(io_error("cannot listen on"))?;
    if let Some(gid) = gid {
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(io_error("cannot chown"))?;
    }
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(io_error("cannot chmod"))?;
    Ok(listener)
}

/// The id of group `name`.
fn group_id(name: &str) -> Result<u32, ListenError> {
    let no_group = || ListenError::NoGroup(name.to_string());
    let c_name = CString::new(name).map_err(|_| no_group())?;
    // SAFETY: `struct group` is plain data (integers and pointers): all-zero is valid.
    let mut group: libc::group = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::group = std::ptr::null_mut();
    // A group with many members needs a larger buffer: grow it while the call says so.
    let mut size = 16 << 10;
    loop {
        let mut buffer = vec![0 as libc::c_char; size];
        // SAFETY: getgrnam_r writes into `group` and `buffer` (of the length given) and sets
        // `result` to `&group` or null; all live for the call, and only `gr_gid` is read
        // afterwards (the other fields point into `buffer`).
        let rc = unsafe {
            libc::getgrnam_r(
                c_name.as_ptr(),
                &mut group,
                buffer.as_mut_ptr(),
                buffer.len(),
                &mut result,
            )
        };
        match rc {
            0 if !result.is_null() => return Ok(group.gr_gid),
            libc::ERANGE if size < 16 << 20 => size *= 4,
            _ => return Err(no_group()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_socket_is_replaced_and_a_live_one_is_not() {
        let dir = std::env::temp_dir().join(format!("vrdma-guestd-test-{}", std::process::id()));
        let path = dir.join("agent.sock");
        let first = listen(&path, None, 0o660).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        assert!(matches!(
            listen(&path, None, 0o660),
            Err(ListenError::InUse(_))
        ));
        drop(first);
        // The socket file stays behind with nobody listening: stale. (Group `root` when this
        // runs as root; a group of one's own otherwise is not known by name here.)
        // SAFETY: geteuid has no preconditions.
        let group = (unsafe { libc::geteuid() } == 0).then_some("root");
        let _second = listen(&path, group, 0o600).unwrap();
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert!(matches!(
            listen(&dir.join("x"), Some("no-such-group-vrdma"), 0o600),
            Err(ListenError::NoGroup(_))
        ));
        fs::write(dir.join("file"), b"").unwrap();
        assert!(matches!(
            listen(&dir.join("file"), None, 0o600),
            Err(ListenError::NotASocket(_))
        ));
        fs::remove_dir_all(&dir).unwrap();
    }
}

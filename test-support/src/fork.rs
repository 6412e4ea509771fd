//! Running a check in a `fork()` child, for tests of what a child inherits.
//!
//! The child of a multi-threaded test process has only the forking thread; locks other test
//! threads held stay locked there. A check therefore does only what is safe in such a child:
//! system calls, reads and writes of memory it knows, no printing and no panics (the panic
//! hook locks stderr). It says how things went with its exit code.

use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Exit code of a child whose check panicked.
pub const PANICKED: i32 = 101;

/// Forks; the child runs `check` and leaves with `_exit` of its result (never returning into
/// the test harness). Returns that exit code, or 128 + the signal that killed the child.
pub fn in_child(check: impl FnOnce() -> i32) -> i32 {
    // SAFETY: fork has no preconditions; the child below only runs `check` and `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        let code = catch_unwind(AssertUnwindSafe(check)).unwrap_or(PANICKED);
        // SAFETY: leaves the child at once, without running the harness's exit paths.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    loop {
        // SAFETY: waits for the child just forked; `status` is a valid out pointer.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        if rc == pid {
            break;
        }
        let error = io::Error::last_os_error();
        assert_eq!(error.kind(), io::ErrorKind::Interrupted, "waitpid: {error}");
    }
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_and_signals_come_back() {
        assert_eq!(in_child(|| 0), 0);
        assert_eq!(in_child(|| 7), 7);
        assert_eq!(
            in_child(|| {
                // SAFETY: raising a signal in the child only ends the child.
                unsafe { libc::raise(libc::SIGKILL) };
                0
            }),
            128 + libc::SIGKILL
        );
    }
}

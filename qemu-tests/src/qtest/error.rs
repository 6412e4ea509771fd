//! The errors of the qtest client, each with the end of QEMU's stderr where it explains them.

use std::time::Duration;

/// Errors of the qtest client.
#[derive(Debug, thiserror::Error)]
pub enum QtestError {
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// QEMU exited (or was killed): before connecting, or while a request was in flight.
    #[error("QEMU {when}: {status}{}", stderr_suffix(.stderr))]
    Exited {
        when: String,
        status: String,
        stderr: String,
    },
    /// QEMU did not connect to the qtest socket in time.
    #[error("QEMU did not connect to the qtest socket within {timeout:?}{}", stderr_suffix(.stderr))]
    NoConnection { timeout: Duration, stderr: String },
    /// QEMU answered a request with FAIL (or anything but OK).
    #[error("qtest `{command}` failed: {reply}")]
    Failed { command: String, reply: String },
    /// QEMU's answer could not be parsed.
    #[error("qtest `{command}`: unexpected reply {reply:?}")]
    BadReply { command: String, reply: String },
    /// No reply in time; the connection is unusable afterwards.
    #[error("qtest `{command}`: no reply within {timeout:?}{}", stderr_suffix(.stderr))]
    Timeout {
        command: String,
        timeout: Duration,
        stderr: String,
    },
    /// An earlier failure left the connection unusable.
    #[error("the qtest connection is unusable: {0}")]
    Broken(String),
    /// A request the protocol cannot express (not sent).
    #[error("invalid qtest request: {0}")]
    InvalidRequest(String),
}

fn stderr_suffix(stderr: &str) -> String {
    let stderr = crate::error::summarize_qemu_stderr(stderr);
    if stderr.trim().is_empty() {
        String::new()
    } else {
        format!(
            "\n--- QEMU stderr ---\n{}",
            crate::error::tail(stderr.trim_end(), 20)
        )
    }
}

/// Result of this module.
pub type Result<T, E = QtestError> = std::result::Result<T, E>;

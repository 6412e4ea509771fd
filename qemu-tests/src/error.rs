//! Errors of the harness: each says what failed and what to look at.

use std::path::PathBuf;

/// Everything the harness can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}){}", tail_suffix(.output_tail))]
    Command {
        command: String,
        status: String,
        output_tail: String,
    },
    #[error("host prerequisite missing: {0}")]
    Prerequisite(String),
    #[error("root file system at {path} is incomplete: {reason}")]
    Rootfs { path: PathBuf, reason: String },
    #[error("the VM did not finish: {reason}{}", tail_suffix(.console_tail))]
    Boot {
        reason: String,
        console_tail: String,
    },
    #[error("perftest: {0}")]
    Perftest(String),
    #[error("{0}")]
    Scenario(String),
    #[error("{0}")]
    Usage(String),
}

fn tail_suffix(tail: &str) -> String {
    if tail.trim().is_empty() {
        String::new()
    } else {
        format!("\n--- last lines ---\n{}", tail.trim_end())
    }
}

/// Result alias of the harness.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Attaches a description to an I/O error.
pub trait IoContext<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::Io {
            what: what(),
            source,
        })
    }
}

/// The last `lines` lines of `text`, for error messages.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
        assert_eq!(tail("", 3), "");
    }

    #[test]
    fn boot_error_shows_console_tail() {
        let e = Error::Boot {
            reason: "timed out".into(),
            console_tail: "Kernel panic".into(),
        };
        let text = e.to_string();
        assert!(
            text.contains("timed out") && text.contains("Kernel panic"),
            "{text}"
        );
    }
}

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
impl Error {
    /// An I/O failure while doing `what`.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}

pub trait IoContext<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::io(what(), source))
    }
}

/// The last `lines` lines of `text`, for error messages.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// QEMU's line for each memory-table update while the device's queues are mapped: the
/// back-end refuses its own mappings as guest memory on purpose (spec §2.1).
const REFUSED_MAPPING_LINE: &str = "vhost_set_mem_table failed: Input/output error (5)";

/// QEMU's stderr with the expected refusal lines folded into one count, so that what is
/// left is what went wrong.
pub fn summarize_qemu_stderr(stderr: &str) -> String {
    let refused = stderr
        .lines()
        .filter(|l| l.ends_with(REFUSED_MAPPING_LINE))
        .count();
    let mut kept: String = stderr
        .lines()
        .filter(|l| !l.ends_with(REFUSED_MAPPING_LINE))
        .map(|l| format!("{l}\n"))
        .collect();
    if refused > 0 {
        kept.push_str(&format!(
            "({refused} × \"{REFUSED_MAPPING_LINE}\": the back-end refusing its queue mappings \
             as guest memory, as it must)\n"
        ));
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_refusals_are_counted_not_listed() {
        let stderr = "qemu-system-x86_64: vhost_set_mem_table failed: Input/output error (5)\n\
                      qemu-system-x86_64: something else\n\
                      qemu-system-x86_64: vhost_set_mem_table failed: Input/output error (5)\n";
        let summary = summarize_qemu_stderr(stderr);
        assert!(
            summary.starts_with("qemu-system-x86_64: something else\n"),
            "{summary}"
        );
        assert!(summary.contains("(2 × "), "{summary}");
        assert_eq!(summarize_qemu_stderr("plain\n"), "plain\n");
    }

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

//! What can go wrong while building a package.

use std::path::PathBuf;

/// Errors of `vrdma-deb`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// An external tool (`cc`, `readelf`, `strip`, `dpkg-deb`) failed.
    #[error("{tool}: {why}")]
    Tool {
        /// The command.
        tool: String,
        /// Its exit status and what it printed.
        why: String,
    },
    /// The input cannot be packaged as it is.
    #[error("{0}")]
    Input(String),
}

/// Results of `vrdma-deb`.
pub type Result<T> = std::result::Result<T, Error>;

/// Adds the path to an I/O error.
pub fn at(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { path, source }
}

/// Runs `command`, returning its standard output; a failure carries what it printed.
pub fn run(command: &mut std::process::Command) -> Result<String> {
    let tool = format!("{command:?}");
    let output = command.output().map_err(|e| Error::Tool {
        tool: tool.clone(),
        why: e.to_string(),
    })?;
    if !output.status.success() {
        return Err(Error::Tool {
            tool,
            why: format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        });
    }
    String::from_utf8(output.stdout).map_err(|e| Error::Tool {
        tool,
        why: e.to_string(),
    })
}

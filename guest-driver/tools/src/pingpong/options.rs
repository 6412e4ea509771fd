//! Where and how long a ping-pong run talks ([`Options`]), as the command line gives it.

use std::path::PathBuf;
use std::time::Duration;

use super::wait::Completion;

/// Where and how long to talk.
#[derive(Clone, Debug)]
pub struct Options {
    pub host: String,
    pub port: u16,
    /// Bound of every wait.
    pub timeout: Duration,
    /// Area length: the client uses at least its plan's; the server refuses plans that need
    /// more.
    pub len: u64,
    /// Once the queue pairs are ready, wait for this file to exist before sending `ready`.
    pub start_file: Option<PathBuf>,
    /// How this side waits for its completions (a local choice, not part of the protocol).
    pub completion: Completion,
}

//! Where and how long a ping-pong run talks ([`Options`]), as the command line gives it.

use std::path::PathBuf;
use std::time::Duration;

use vrdma::verbs::Mtu;

use super::wait::Completion;

/// The RC path attributes a side sets on its QP (the peers need not agree, as with any two
/// verbs applications; each side's own values govern what it sends).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathAttrs {
    pub mtu: Mtu,
    /// Local ACK timeout: 4.096 µs × 2^timeout.
    pub timeout: u8,
    /// Transport retries before a send fails (rxe retries for ever at 7).
    pub retry_cnt: u8,
    /// RNR retries before a send fails (7: for ever).
    pub rnr_retry: u8,
    /// The RNR NAK timer this side asks its peer to wait when it has no receive posted (the
    /// IB encoding: 1 = 0.01 ms … 31 = 491.52 ms, 0 = 655.36 ms).
    pub min_rnr_timer: u8,
}

impl Default for PathAttrs {
    fn default() -> Self {
        PathAttrs {
            mtu: Mtu::Mtu1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
        }
    }
}

impl PathAttrs {
    /// The MTU of `bytes` (256 to 4096, a power of two).
    pub fn mtu_of(bytes: u32) -> Option<Mtu> {
        [
            Mtu::Mtu256,
            Mtu::Mtu512,
            Mtu::Mtu1024,
            Mtu::Mtu2048,
            Mtu::Mtu4096,
        ]
        .into_iter()
        .find(|mtu| mtu.bytes() == bytes)
    }
}

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
    /// This side's RC path attributes.
    pub path: PathAttrs,
    /// Post the RC receives only once this file exists (after `ready`): until then the peer's
    /// sends meet RNR NAKs. A harness uses it to exercise RNR retries.
    pub receives_after: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtus_are_named_by_their_size() {
        assert_eq!(PathAttrs::mtu_of(4096), Some(Mtu::Mtu4096));
        assert_eq!(PathAttrs::mtu_of(1024), Some(Mtu::Mtu1024));
        assert_eq!(PathAttrs::mtu_of(1500), None);
    }
}

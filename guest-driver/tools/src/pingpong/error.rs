//! Why a ping-pong run fails ([`RunError`]), and whether the peer caused it.

use std::time::Duration;

use vrdma::provider::PostError;
use vrdma::spec::verbs::WcStatus;
use vrdma::verbs::{PostSendError, VerbsError};

use super::endpoint::EndpointError;
use super::oob::OobError;
use super::pattern::Mismatch;
use super::plan::Op;
use super::wait::WaitError;

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    #[error("out-of-band connection: {0}")]
    Oob(#[from] OobError),
    #[error("opening the device: {0}")]
    Open(#[source] VerbsError),
    #[error("{0}")]
    Protocol(String),
    #[error(transparent)]
    PostSend(#[from] PostSendError),
    #[error("posting a receive: {0}")]
    PostRecv(PostError),
    #[error("no {0} completion within {1:?}")]
    Timeout(&'static str, Duration),
    #[error("{0} CQ: {1}")]
    Events(&'static str, #[source] WaitError),
    #[error("{what} completion with status {status:?} (vendor error {vendor_err:#x})")]
    Completion {
        what: &'static str,
        status: WcStatus,
        vendor_err: u32,
    },
    #[error("{0}")]
    BadCompletion(String),
    #[error("data mismatch: {0}")]
    Mismatch(Mismatch),
    #[error("{op} size {size} iteration {iter}: {source}")]
    InStep {
        op: Op,
        size: u32,
        iter: u32,
        #[source]
        source: Box<RunError>,
    },
}

impl RunError {
    /// Whether the peer caused this failure (and so needs no report of it).
    pub(super) fn caused_by_peer(&self) -> bool {
        match self {
            RunError::Oob(OobError::PeerFailed(_) | OobError::Closed) => true,
            RunError::InStep { source, .. } => source.caused_by_peer(),
            _ => false,
        }
    }
}

pub(super) type Result<T, E = RunError> = std::result::Result<T, E>;

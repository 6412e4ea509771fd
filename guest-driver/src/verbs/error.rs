//! Errors of the verbs layer.

use vrdma_spec::control::Opcode;
use vrdma_spec::rxe_v1::GeometryError;
use vrdma_spec::status::{Status, StatusError};
use vrdma_spec::DecodeError;

use crate::dma::DmaError;
use crate::provider::PostError;
use crate::transport::TransportError;

/// Result of a verbs call.
pub type Result<T, E = VerbsError> = std::result::Result<T, E>;

/// Why a verbs call failed.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    /// The device executed the command and refused it.
    #[error("{} failed: {source}", opcode_name(*.opcode))]
    Status {
        /// The command.
        opcode: Opcode,
        /// Status (and host errno for `DEVICE_ERROR`) from the response header.
        #[source]
        source: StatusError,
    },
    /// The command never reached the device, or its answer never came back.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The device answered something the specification does not allow.
    #[error("device protocol violation: {0}")]
    Protocol(#[from] ProtocolError),
    /// An argument cannot be expressed on the wire, or is out of the device's limits.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// The device (or the negotiated features) cannot do what was asked.
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
    /// The device announced that every object of this context is lost (DEVICE_FATAL, new
    /// configuration epoch `epoch`): the device must be opened again.
    #[error("the device lost every object of this context (DEVICE_FATAL, epoch {epoch})")]
    DeviceLost { epoch: u32 },
}

/// Memory the device reaches could not be allocated or translated: a failure of the
/// transport's DMA memory, like any other of its failures.
impl From<DmaError> for VerbsError {
    fn from(e: DmaError) -> Self {
        VerbsError::Transport(e.into())
    }
}

impl VerbsError {
    /// The device status if the device refused the command.
    pub fn status(&self) -> Option<Status> {
        match self {
            VerbsError::Status { source, .. } => Some(source.status()),
            _ => None,
        }
    }
}

/// What the device got wrong.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The configuration space is not a vrdma 1.x configuration.
    #[error("configuration space: {0}")]
    Config(#[source] DecodeError),
    /// A configuration field is out of range.
    #[error("configuration field `{field}` has unusable value {value}")]
    ConfigValue {
        /// Field name as in the specification.
        field: &'static str,
        /// Value found.
        value: u64,
    },
    /// A control response could not be decoded.
    #[error("malformed {} response: {source}", opcode_name(*.opcode))]
    Response {
        /// The command.
        opcode: Opcode,
        /// Why decoding failed.
        #[source]
        source: DecodeError,
    },
    /// A response body field is inconsistent with the request or the specification.
    #[error("{} response field `{field}` has invalid value {value}", opcode_name(*.opcode))]
    ResponseValue {
        /// The command.
        opcode: Opcode,
        /// Field name.
        field: &'static str,
        /// Value found.
        value: u64,
    },
    /// A ring description does not describe a usable rxe v1 queue in the region.
    #[error("ring description: {0}")]
    Ring(#[from] GeometryError),
    /// The mapped queue buffer disagrees with its description.
    #[error("mapped queue: {0}")]
    Queue(GeometryError),
    /// A ring lies outside the shared-memory region this process mapped.
    #[error("ring at {offset:#x}+{len:#x} lies outside the mapped queue region")]
    OutsideRegion {
        /// Offset in the region.
        offset: u64,
        /// Length.
        len: u32,
    },
}

/// Why [`crate::verbs::Qp::post_send`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum PostSendError {
    /// Request `index` was refused; the requests before it were posted (and the doorbell rung).
    #[error("send work request {index} refused: {error}")]
    Refused {
        /// Index of the refused request in the slice.
        index: usize,
        /// Why.
        #[source]
        error: PostError,
    },
    /// `posted` requests are in the send queue but the device could not be notified. The
    /// transport is most likely broken; the QP should be considered lost.
    #[error("{posted} send work requests posted, doorbell failed: {source}")]
    Doorbell {
        /// Requests written to the send queue.
        posted: usize,
        /// Transport failure.
        #[source]
        source: TransportError,
    },
}

/// Why a send batch ([`SendBatch`](super::SendBatch)) was not completed.
#[derive(Debug, thiserror::Error)]
pub enum SendBatchError {
    /// Request `index` of the batch was refused: nothing of the batch was posted.
    #[error("send work request {index} of the batch refused: {error}")]
    Refused {
        /// Index of the refused request in the batch.
        index: usize,
        /// Why.
        #[source]
        error: PostError,
    },
    /// The `posted` requests of the batch are in the send queue but the device could not be
    /// notified. The transport is most likely broken; the QP should be considered lost.
    #[error("{posted} send work requests posted, doorbell failed: {source}")]
    Doorbell {
        /// Requests written to the send queue.
        posted: usize,
        /// Transport failure.
        #[source]
        source: TransportError,
    },
}

impl PostSendError {
    /// Number of requests of the call that reached the send queue.
    pub fn posted(&self) -> usize {
        match self {
            PostSendError::Refused { index, .. } => *index,
            PostSendError::Doorbell { posted, .. } => *posted,
        }
    }
}

/// The specification's name of an opcode, for messages.
pub fn opcode_name(opcode: Opcode) -> &'static str {
    opcode.name()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_errors_name_the_command_and_keep_the_status() {
        let e = VerbsError::Status {
            opcode: Opcode::CreateQp,
            source: StatusError::device_error(12),
        };
        assert_eq!(e.status(), Some(Status::DeviceError));
        let text = e.to_string();
        assert!(text.starts_with("CREATE_QP failed"), "{text}");
        assert!(text.contains("host errno 12"), "{text}");
        assert_eq!(VerbsError::InvalidArgument("x").status(), None);
    }

    #[test]
    fn every_opcode_has_a_distinct_name() {
        let mut names: Vec<_> = Opcode::ALL.iter().map(|o| opcode_name(*o)).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Opcode::ALL.len());
    }
}

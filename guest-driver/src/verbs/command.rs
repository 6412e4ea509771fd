//! What the control command of every verbs object shares: the body naming one object, and the
//! checks of the device's answer that are not specific to one command.

use vrdma_spec::control::Opcode;
use vrdma_spec::wire::HandleReq;
use vrdma_spec::Le32;

use super::error::{ProtocolError, Result, VerbsError};

/// The body naming one object.
pub(crate) fn handle_req(handle: u32) -> HandleReq {
    HandleReq {
        handle: Le32::new(handle),
        reserved: Le32::ZERO,
    }
}

/// Checks that a handle the device returned is not 0 (which it never is, spec §7.3).
pub(crate) fn nonzero_handle(opcode: Opcode, handle: u32) -> Result<u32> {
    if handle == 0 {
        return Err(ProtocolError::ResponseValue {
            opcode,
            field: "handle",
            value: 0,
        }
        .into());
    }
    Ok(handle)
}

/// The error for a success body of the wrong kind (the spec crate's decoder rules it out; this
/// keeps the match total without a panic).
pub(crate) fn unexpected_body(opcode: Opcode) -> VerbsError {
    ProtocolError::ResponseValue {
        opcode,
        field: "body",
        value: 0,
    }
    .into()
}

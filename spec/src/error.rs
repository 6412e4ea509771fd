//! Decoding errors.

use crate::status::Status;
use thiserror::Error;

/// Why a buffer was rejected by a decoder.
///
/// Decoders never panic; every malformed input maps to one of these. The device answers
/// with [`DecodeError::status`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// Fewer bytes than the fixed layout (or the declared page list) needs.
    #[error("buffer too short: need {needed} bytes, got {got}")]
    Short {
        /// Bytes required.
        needed: usize,
        /// Bytes present.
        got: usize,
    },
    /// More bytes than the layout allows.
    #[error("unexpected trailing bytes: expected {expected} bytes, got {got}")]
    Trailing {
        /// Exact size the layout allows.
        expected: usize,
        /// Bytes present.
        got: usize,
    },
    /// The opcode is not defined by this version of the specification.
    #[error("unknown opcode {0:#06x}")]
    UnknownOpcode(u16),
    /// A reserved field or flag word is not zero.
    #[error("reserved field `{0}` is not zero")]
    Reserved(&'static str),
    /// A field holds a value outside its defined range or enumeration.
    #[error("field `{field}` has invalid value {value:#x}")]
    InvalidValue {
        /// Field name as in the specification.
        field: &'static str,
        /// Offending value.
        value: u64,
    },
    /// `page_shift` of REG_MR is outside 12..=30.
    #[error("page_shift {0} outside 12..=30")]
    PageShift(u32),
    /// The page count does not cover `iova mod page_size + length` exactly.
    #[error("page list has {got} entries, the range needs exactly {expected}")]
    PageCount {
        /// Pages needed by `(iova mod page_size) + length`.
        expected: u64,
        /// `npages` in the request.
        got: u32,
    },
    /// An address is not aligned to the size it must be aligned to.
    #[error("field `{field}` value {value:#x} is misaligned")]
    Misaligned {
        /// Field name.
        field: &'static str,
        /// Offending value.
        value: u64,
    },
    /// An address range wraps around the 64-bit address space.
    #[error("range `{0}` overflows 64 bits")]
    Overflow(&'static str),
    /// A status word in a response is not a defined [`Status`].
    #[error("unknown status {0}")]
    UnknownStatus(u32),
    /// An event type is not defined by this version.
    #[error("unknown event type {0}")]
    UnknownEventType(u32),
    /// The configuration space does not start with the vrdma magic.
    #[error("bad config magic {0:#010x}")]
    BadMagic(u32),
    /// The configuration space reports a major version this crate does not implement.
    #[error("unsupported spec major version {0}")]
    UnsupportedVersion(u16),
}

impl DecodeError {
    /// Status the device returns for a request rejected with this error.
    pub const fn status(&self) -> Status {
        match self {
            DecodeError::UnknownOpcode(_) => Status::Unsupported,
            _ => Status::Invalid,
        }
    }
}

//! Doorbell buffers: arrays of le32 QP handles on the doorbell queue.

use crate::error::DecodeError;

/// Size of one doorbell entry.
pub const ENTRY_SIZE: usize = 4;

/// A decoded doorbell buffer, borrowing its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Doorbell<'a> {
    bytes: &'a [u8],
}

impl<'a> Doorbell<'a> {
    /// Decodes the device-readable bytes of one doorbell chain. The buffer must hold
    /// 1..=`max_handles` entries and nothing else. Handle values are not checked here:
    /// zero, unknown and foreign handles are the device's to ignore.
    pub fn decode(bytes: &'a [u8], max_handles: u32) -> Result<Self, DecodeError> {
        if bytes.is_empty() {
            return Err(DecodeError::Short {
                needed: ENTRY_SIZE,
                got: 0,
            });
        }
        if bytes.len() & (ENTRY_SIZE - 1) != 0 {
            return Err(DecodeError::Trailing {
                expected: bytes.len() & !(ENTRY_SIZE - 1),
                got: bytes.len(),
            });
        }
        let max = (max_handles as usize).saturating_mul(ENTRY_SIZE);
        if bytes.len() > max {
            return Err(DecodeError::Trailing {
                expected: max,
                got: bytes.len(),
            });
        }
        Ok(Doorbell { bytes })
    }

    /// Number of handles.
    pub fn len(&self) -> usize {
        self.bytes.len() / ENTRY_SIZE
    }

    /// Always false for a decoded doorbell.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The QP handles, in buffer order (duplicates possible).
    pub fn handles(&self) -> impl ExactSizeIterator<Item = u32> + 'a {
        self.bytes
            .chunks_exact(ENTRY_SIZE)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    }

    /// Appends the encoding of `handles` to `out` (driver side).
    pub fn encode_into(handles: impl IntoIterator<Item = u32>, out: &mut Vec<u8>) {
        for h in handles {
            out.extend_from_slice(&h.to_le_bytes());
        }
    }
}

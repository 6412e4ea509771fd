//! Field-level decoding shared by the request and response decoders: a fixed-size body with
//! errors counted from the start of the message, reserved-zero and range checks, and the two
//! bodies many commands share (a handle, a table index).

use zerocopy::FromBytes;

use super::opcode::HEADER_SIZE;
use crate::config::exact;
use crate::error::DecodeError;
use crate::wire::{HandleReq, QueryTableReq};

pub(super) fn take_body<
    T: FromBytes + zerocopy::KnownLayout + zerocopy::Immutable + zerocopy::Unaligned + Copy,
>(
    body: &[u8],
) -> Result<T, DecodeError> {
    exact::<T>(body).map_err(|e| match e {
        DecodeError::Short { needed, got } => DecodeError::Short {
            needed: needed + HEADER_SIZE,
            got: got + HEADER_SIZE,
        },
        DecodeError::Trailing { expected, got } => DecodeError::Trailing {
            expected: expected + HEADER_SIZE,
            got: got + HEADER_SIZE,
        },
        e => e,
    })
}

pub(super) fn zero(v: u64, field: &'static str) -> Result<(), DecodeError> {
    if v == 0 {
        Ok(())
    } else {
        Err(DecodeError::Reserved(field))
    }
}

pub(super) fn range(v: u64, lo: u64, hi: u64, field: &'static str) -> Result<(), DecodeError> {
    if (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(DecodeError::InvalidValue { field, value: v })
    }
}

pub(super) fn handle_req(body: &[u8]) -> Result<HandleReq, DecodeError> {
    let r: HandleReq = take_body(body)?;
    zero(r.reserved.get().into(), "reserved")?;
    Ok(r)
}

pub(super) fn table_req(body: &[u8]) -> Result<QueryTableReq, DecodeError> {
    let r: QueryTableReq = take_body(body)?;
    range(r.port_num.get().into(), 1, u8::MAX.into(), "port_num")?;
    Ok(r)
}

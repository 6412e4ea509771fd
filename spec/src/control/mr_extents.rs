//! REG_MR_EXTENTS: the borrowed extent list, the decoded request, and the checks of its
//! entries (spec §7.4). An extent list says what a REG_MR page list says, with each run of
//! consecutive guest-physical pages as one entry, so its size grows with the fragmentation of
//! the buffer rather than with its length.

use super::reg_mr::exact_list;
use crate::error::DecodeError;
use crate::wire::RegMrReq;

/// Bytes of one extent-list entry: le64 guest-physical address, le64 length.
pub const EXTENT_ENTRY_SIZE: usize = 16;

/// Most extents one REG_MR_EXTENTS may carry on a device whose `max_mr_pages` is given: half
/// of it (at least one), so that a full extent list is no larger than a full page list.
pub const fn max_mr_extents(max_mr_pages: u32) -> u32 {
    if max_mr_pages < 2 {
        1
    } else {
        max_mr_pages / 2
    }
}

/// The extent list of a REG_MR_EXTENTS request, borrowed from the request bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtentList<'a> {
    bytes: &'a [u8],
}

fn le64(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(bytes);
    u64::from_le_bytes(b)
}

impl<'a> ExtentList<'a> {
    /// Wraps raw entries (length must be a multiple of [`EXTENT_ENTRY_SIZE`]).
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        debug_assert!(bytes.len().is_multiple_of(EXTENT_ENTRY_SIZE));
        ExtentList { bytes }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.bytes.len() / EXTENT_ENTRY_SIZE
    }

    /// True if there are no entries (never the case for a decoded request).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Iterates over the extents as (guest-physical address, length in bytes).
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (u64, u64)> + 'a {
        self.bytes
            .chunks_exact(EXTENT_ENTRY_SIZE)
            .map(|c| (le64(&c[..8]), le64(&c[8..])))
    }

    /// The raw little-endian bytes.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }
}

/// A decoded REG_MR_EXTENTS request. Its fixed part is REG_MR's, with `npages` counting
/// extents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegMrExtents<'a> {
    /// Fixed part (`npages` = number of extents).
    pub req: RegMrReq,
    /// The extents, in MR order; together they are the pages REG_MR would list.
    pub extents: ExtentList<'a>,
}

impl<'a> RegMrExtents<'a> {
    /// Builds a request over extent-list bytes produced by [`encode_extent_list`]. Not
    /// validated; [`ControlRequest::decode`](super::ControlRequest::decode) of its encoding is.
    pub fn new(req: RegMrReq, extent_list_bytes: &'a [u8]) -> Self {
        let n = extent_list_bytes.len() / EXTENT_ENTRY_SIZE * EXTENT_ENTRY_SIZE;
        RegMrExtents {
            req,
            extents: ExtentList::new(&extent_list_bytes[..n]),
        }
    }

    /// Page size in bytes.
    pub fn page_size(&self) -> u64 {
        1u64 << self.req.page_shift.get()
    }
}

/// Appends extent-list entries (guest-physical address, length) to `out` (driver side).
pub fn encode_extent_list(extents: impl IntoIterator<Item = (u64, u64)>, out: &mut Vec<u8>) {
    for (gpa, len) in extents {
        out.extend_from_slice(&gpa.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
    }
}

/// Validates one extent against the page size: aligned, at least one page, a whole number of
/// pages, not wrapping.
pub fn check_extent(gpa: u64, len: u64, page_shift: u32) -> Result<(), DecodeError> {
    let page_mask = (1u64 << page_shift.min(63)) - 1;
    if gpa & page_mask != 0 {
        return Err(DecodeError::Misaligned {
            field: "extent address",
            value: gpa,
        });
    }
    if len == 0 || len & page_mask != 0 {
        return Err(DecodeError::Misaligned {
            field: "extent length",
            value: len,
        });
    }
    gpa.checked_add(len)
        .ok_or(DecodeError::Overflow("extent address + length"))?;
    Ok(())
}

/// Splits off and checks the extent list that follows a fixed body: exactly `nextents`
/// entries, each valid for `page_shift`, together `pages` pages (`fixed` is the fixed body's
/// size, `total` the length of the whole request, both for error reports).
pub(super) fn take_extent_list(
    list: &[u8],
    nextents: u32,
    page_shift: u32,
    pages: u64,
    fixed: usize,
    total: usize,
) -> Result<ExtentList<'_>, DecodeError> {
    if nextents == 0 {
        return Err(DecodeError::InvalidValue {
            field: "nextents",
            value: 0,
        });
    }
    let list = exact_list(list, nextents.into(), EXTENT_ENTRY_SIZE, fixed, total)?;
    let extents = ExtentList::new(list);
    let mut covered = 0u64;
    for (gpa, len) in extents.iter() {
        check_extent(gpa, len, page_shift)?;
        covered = covered
            .checked_add(len >> page_shift)
            .ok_or(DecodeError::Overflow("sum of extent lengths"))?;
    }
    if covered != pages {
        return Err(DecodeError::InvalidValue {
            field: "sum of extent lengths (pages)",
            value: covered,
        });
    }
    Ok(extents)
}

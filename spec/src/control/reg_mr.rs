//! REG_MR: the page-shift limits, the borrowed page list, the decoded request, and the checks
//! of its fixed part and of each page address.

use super::opcode::HEADER_SIZE;
use crate::error::DecodeError;
use crate::verbs::AccessFlags;
use crate::wire::RegMrReq;

/// Smallest `page_shift` of REG_MR (4 KiB).
pub const MIN_PAGE_SHIFT: u32 = 12;
/// Largest `page_shift` of REG_MR (1 GiB).
pub const MAX_PAGE_SHIFT: u32 = 30;

/// The page list of a REG_MR request, borrowed from the request bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageList<'a> {
    bytes: &'a [u8],
}

impl<'a> PageList<'a> {
    /// Wraps raw little-endian page addresses (length must be a multiple of 8).
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        debug_assert!(bytes.len() & 7 == 0);
        PageList { bytes }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.bytes.len() / 8
    }

    /// True if there are no entries (never the case for a decoded request).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Entry `i`.
    pub fn get(&self, i: usize) -> Option<u64> {
        let start = i.checked_mul(8)?;
        let chunk = self.bytes.get(start..start.checked_add(8)?)?;
        let mut b = [0u8; 8];
        b.copy_from_slice(chunk);
        Some(u64::from_le_bytes(b))
    }

    /// Iterates over the guest-physical page addresses.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = u64> + 'a {
        self.bytes.chunks_exact(8).map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            u64::from_le_bytes(b)
        })
    }

    /// The raw little-endian bytes.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }
}

/// A decoded REG_MR request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegMr<'a> {
    /// Fixed part.
    pub req: RegMrReq,
    /// `npages` page addresses, each aligned to `1 << page_shift`.
    pub pages: PageList<'a>,
}

impl RegMr<'_> {
    /// Page size in bytes.
    pub fn page_size(&self) -> u64 {
        1u64 << self.req.page_shift.get()
    }

    /// Offset of the first byte of the region inside the first page.
    pub fn first_page_offset(&self) -> u64 {
        self.req.iova.get() & (self.page_size() - 1)
    }
}

impl<'a> RegMr<'a> {
    /// Builds a REG_MR request over page-list bytes produced by [`encode_page_list`].
    /// The result is not validated; [`ControlRequest::decode`](super::ControlRequest::decode) of
    /// its encoding is.
    pub fn new(req: RegMrReq, page_list_bytes: &'a [u8]) -> Self {
        let n = page_list_bytes.len() / 8 * 8;
        RegMr {
            req,
            pages: PageList::new(&page_list_bytes[..n]),
        }
    }
}

/// Validates the fixed part of REG_MR; returns the number of pages it needs.
///
/// Useful on its own to a device that streams a large page list from the descriptor
/// chain instead of collecting it.
pub fn check_reg_mr(r: &RegMrReq) -> Result<u64, DecodeError> {
    let expected = check_mr_span(r)?;
    if expected != u64::from(r.npages.get()) {
        return Err(DecodeError::PageCount {
            expected,
            got: r.npages.get(),
        });
    }
    Ok(expected)
}

/// Validates the fixed part of REG_MR or REG_MR_EXTENTS but its entry count: access, page
/// shift, length and iova. Returns the number of pages `(iova mod P) + length` spans.
pub fn check_mr_span(r: &RegMrReq) -> Result<u64, DecodeError> {
    check_mr_access(r.access.get())?;
    let shift = r.page_shift.get();
    if !(MIN_PAGE_SHIFT..=MAX_PAGE_SHIFT).contains(&shift) {
        return Err(DecodeError::PageShift(shift));
    }
    let length = r.length.get();
    if length == 0 {
        return Err(DecodeError::InvalidValue {
            field: "length",
            value: 0,
        });
    }
    let iova = r.iova.get();
    iova.checked_add(length)
        .ok_or(DecodeError::Overflow("iova + length"))?;
    let page_size = 1u64 << shift;
    let span = (iova & (page_size - 1))
        .checked_add(length)
        .ok_or(DecodeError::Overflow("iova offset + length"))?;
    Ok(span.div_ceil(page_size))
}

/// Validates MR access flags (REG_MR, REREG_MR): only [`AccessFlags::MR_ALLOWED`] bits, and
/// remote write or remote atomic only with local write.
pub fn check_mr_access(acc: u32) -> Result<AccessFlags, DecodeError> {
    let invalid = DecodeError::InvalidValue {
        field: "access",
        value: acc.into(),
    };
    let flags = AccessFlags::from_bits(acc).ok_or(invalid)?;
    if flags.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
        && !flags.contains(AccessFlags::LOCAL_WRITE)
    {
        return Err(invalid);
    }
    Ok(flags)
}

/// Validates one page-list entry against the page size.
pub fn check_page_address(addr: u64, page_shift: u32) -> Result<(), DecodeError> {
    let page_size = 1u64 << page_shift.min(63);
    if addr & (page_size - 1) != 0 {
        return Err(DecodeError::Misaligned {
            field: "page",
            value: addr,
        });
    }
    addr.checked_add(page_size)
        .ok_or(DecodeError::Overflow("page address + page size"))?;
    Ok(())
}

/// Splits off and checks the page list that follows a fixed body: exactly `npages` entries
/// (`fixed` is the fixed body's size, `total` the length of the whole request, both for error
/// reports), each aligned to the page size.
pub(super) fn take_page_list(
    list: &[u8],
    npages: u64,
    page_shift: u32,
    fixed: usize,
    total: usize,
) -> Result<PageList<'_>, DecodeError> {
    let list = exact_list(list, npages, 8, fixed, total)?;
    let pages = PageList::new(list);
    for addr in pages.iter() {
        check_page_address(addr, page_shift)?;
    }
    Ok(pages)
}

/// Checks that `list`, what follows a fixed body of `fixed` bytes in a request of `total`
/// bytes, is exactly `entries` entries of `entry_size` bytes (`Short` or `Trailing` if not).
pub(super) fn exact_list(
    list: &[u8],
    entries: u64,
    entry_size: usize,
    fixed: usize,
    total: usize,
) -> Result<&[u8], DecodeError> {
    // entries <= u32::MAX, so this cannot overflow on 64-bit; checked anyway.
    let list_len = usize::try_from(entries)
        .ok()
        .and_then(|n| n.checked_mul(entry_size))
        .ok_or(DecodeError::Overflow("list entries * entry size"))?;
    let expected = HEADER_SIZE + fixed + list_len;
    match list.len().cmp(&list_len) {
        core::cmp::Ordering::Less => Err(DecodeError::Short {
            needed: expected,
            got: total,
        }),
        core::cmp::Ordering::Greater => Err(DecodeError::Trailing {
            expected,
            got: total,
        }),
        core::cmp::Ordering::Equal => Ok(list),
    }
}

/// Reads REG_MR's fixed body (also REG_MR_EXTENTS') from the front of `body`; returns it and
/// what follows. `total` is the whole request's length, for the error report.
pub(super) fn reg_mr_prefix(body: &[u8], total: usize) -> Result<(RegMrReq, &[u8]), DecodeError> {
    use zerocopy::FromBytes;
    RegMrReq::read_from_prefix(body).map_err(|_| DecodeError::Short {
        needed: HEADER_SIZE + core::mem::size_of::<RegMrReq>(),
        got: total,
    })
}

/// Builds the page-list bytes of a REG_MR request from page addresses (driver side).
pub fn encode_page_list(pages: impl IntoIterator<Item = u64>, out: &mut Vec<u8>) {
    for p in pages {
        out.extend_from_slice(&p.to_le_bytes());
    }
}

//! REREG_MR: its flags, the decoded request (with the page list of a translation change) and
//! the structural checks, which reuse REG_MR's for the new translation.

use zerocopy::FromBytes;

use super::body::zero;
use super::opcode::HEADER_SIZE;
use super::reg_mr::{check_mr_access, check_reg_mr, take_page_list, PageList};
use crate::error::DecodeError;
use crate::wire::{RegMrReq, ReregMrReq};

/// REREG_MR `flags` (the values of `IBV_REREG_MR_CHANGE_*`).
pub mod rereg_flags {
    /// New iova, length and pages (a page list follows the fixed body).
    pub const CHANGE_TRANSLATION: u32 = 1 << 0;
    /// New PD (`pd`).
    pub const CHANGE_PD: u32 = 1 << 1;
    /// New access flags (`access`).
    pub const CHANGE_ACCESS: u32 = 1 << 2;
    /// Every flag.
    pub const ALL: u32 = CHANGE_TRANSLATION | CHANGE_PD | CHANGE_ACCESS;
}

/// A decoded REREG_MR request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReregMr<'a> {
    /// Fixed part.
    pub req: ReregMrReq,
    /// The new page list with `CHANGE_TRANSLATION`, else empty.
    pub pages: PageList<'a>,
}

impl<'a> ReregMr<'a> {
    /// Builds a request over page-list bytes produced by
    /// [`encode_page_list`](super::encode_page_list) (empty without `CHANGE_TRANSLATION`). The
    /// result is not validated; [`ControlRequest::decode`](super::ControlRequest::decode) of its
    /// encoding is.
    pub fn new(req: ReregMrReq, page_list_bytes: &'a [u8]) -> Self {
        let n = page_list_bytes.len() / 8 * 8;
        ReregMr {
            req,
            pages: PageList::new(&page_list_bytes[..n]),
        }
    }

    fn has(&self, flag: u32) -> bool {
        self.req.flags.get() & flag != 0
    }

    /// The new PD handle, with `CHANGE_PD`.
    pub fn new_pd(&self) -> Option<u32> {
        self.has(rereg_flags::CHANGE_PD).then(|| self.req.pd.get())
    }

    /// The new access flags, with `CHANGE_ACCESS`.
    pub fn new_access(&self) -> Option<u32> {
        self.has(rereg_flags::CHANGE_ACCESS)
            .then(|| self.req.access.get())
    }

    /// True with `CHANGE_TRANSLATION`.
    pub fn changes_translation(&self) -> bool {
        self.has(rereg_flags::CHANGE_TRANSLATION)
    }

    /// Page size of the new page list in bytes (meaningful with `CHANGE_TRANSLATION`).
    pub fn page_size(&self) -> u64 {
        1u64 << self.req.page_shift.get().min(63)
    }
}

/// The new translation of a request as a REG_MR fixed body (PD zero, access the new access or
/// zero), so that REG_MR's checks apply to it unchanged.
fn translation_as_reg_mr(r: &ReregMrReq) -> RegMrReq {
    RegMrReq {
        pd: 0.into(),
        access: r.access,
        iova: r.iova,
        length: r.length,
        page_shift: r.page_shift,
        npages: r.npages,
    }
}

/// Decodes a REREG_MR body (`total` is the whole request's length, for error reports).
pub(super) fn decode_rereg_mr(body: &[u8], total: usize) -> Result<ReregMr<'_>, DecodeError> {
    let fixed = core::mem::size_of::<ReregMrReq>();
    let (req, list) = ReregMrReq::read_from_prefix(body).map_err(|_| DecodeError::Short {
        needed: HEADER_SIZE + fixed,
        got: total,
    })?;
    let flags = req.flags.get();
    if flags == 0 || flags & !rereg_flags::ALL != 0 {
        return Err(DecodeError::InvalidValue {
            field: "flags",
            value: flags.into(),
        });
    }
    if flags & rereg_flags::CHANGE_PD == 0 {
        zero(req.pd.get().into(), "pd")?;
    }
    if flags & rereg_flags::CHANGE_ACCESS == 0 {
        zero(req.access.get().into(), "access")?;
    }
    let pages = if flags & rereg_flags::CHANGE_TRANSLATION != 0 {
        // Access flags (when changing), page shift, length, iova and page count as REG_MR.
        let npages = check_reg_mr(&translation_as_reg_mr(&req))?;
        take_page_list(list, npages, req.page_shift.get(), fixed, total)?
    } else {
        if flags & rereg_flags::CHANGE_ACCESS != 0 {
            check_mr_access(req.access.get())?;
        }
        zero(req.iova.get(), "iova")?;
        zero(req.length.get(), "length")?;
        zero(req.page_shift.get().into(), "page_shift")?;
        zero(req.npages.get().into(), "npages")?;
        if !list.is_empty() {
            return Err(DecodeError::Trailing {
                expected: HEADER_SIZE + fixed,
                got: total,
            });
        }
        PageList::new(&[])
    };
    Ok(ReregMr { req, pages })
}

/// Appends the encoding of a REREG_MR body (fixed part and page list) to `out`.
pub(super) fn encode_rereg_mr(m: &ReregMr<'_>, out: &mut Vec<u8>) {
    use zerocopy::IntoBytes;
    out.extend_from_slice(m.req.as_bytes());
    out.extend_from_slice(m.pages.as_bytes());
}

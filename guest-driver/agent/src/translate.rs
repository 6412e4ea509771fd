//! Addresses of a process's memory, as the process names them and as the device needs them.
//!
//! When the agent shares one PCI function among its processes, each process's registrable
//! memory is a memfd the agent allocated, pinned and resolved page by page to guest-physical
//! addresses. The process itself cannot read those (pagemap hides them from unprivileged
//! processes), so it names its memory by *process addresses*: `base + offset` in its memfd,
//! contiguous, as the process transport names its guest RAM. Before a command reaches the
//! device the agent rewrites every address list in it (REG_MR, REG_MR_EXTENTS, REREG_MR) into
//! the pinned pages' guest-physical addresses, 4 KiB page by page. An address outside the
//! process's memory is refused with BAD_ADDRESS: a process reaches no other memory.

use vrdma_spec::control::{
    encode_extent_list, encode_page_list, max_mr_extents, RegMr, RegMrExtents, ReregMr,
    MIN_PAGE_SHIFT,
};
use vrdma_spec::wire::RegMrReq;
use vrdma_spec::{ControlRequest, Le32, Status};

const PAGE: u64 = 1 << MIN_PAGE_SHIFT;

/// A process's memory: page `i` has process address `base + i * 4 KiB` and guest-physical
/// address `pages[i]`.
#[derive(Clone, Debug)]
pub struct ProcessPages {
    base: u64,
    pages: Vec<u64>,
}

/// The request, rewritten to guest-physical addresses, or why it is refused.
pub type Rewritten = Result<Option<Vec<u8>>, Status>;

impl ProcessPages {
    /// Pages at process addresses from `base` (page aligned).
    pub fn new(base: u64, pages: Vec<u64>) -> Self {
        ProcessPages { base, pages }
    }

    /// The guest-physical address of the page at process address `addr` (page aligned).
    fn guest_page(&self, addr: u64) -> Option<u64> {
        let offset = addr.checked_sub(self.base)?;
        if offset % PAGE != 0 {
            return None;
        }
        self.pages
            .get(usize::try_from(offset / PAGE).ok()?)
            .copied()
    }

    /// The 4 KiB guest pages under an MR of `length` bytes at `iova`, whose translation lists
    /// process pages of `1 << shift` bytes as `list` (in MR order, already validated by the
    /// spec's decoder).
    fn guest_pages(
        &self,
        iova: u64,
        length: u64,
        shift: u32,
        list: impl Iterator<Item = (u64, u64)>,
    ) -> Result<Vec<u64>, Status> {
        let in_first = iova & ((1u64 << shift) - 1);
        let count = (iova % PAGE)
            .checked_add(length)
            .ok_or(Status::Invalid)?
            .div_ceil(PAGE);
        // More pages than the process has can only name memory it does not own.
        if count > self.pages.len() as u64 {
            return Err(Status::BadAddress);
        }
        let skip = in_first / PAGE;
        let mut out = Vec::with_capacity(count as usize);
        let small_pages =
            list.flat_map(|(start, len)| (0..len / PAGE).map(move |i| start + i * PAGE));
        for addr in small_pages.skip(skip as usize).take(count as usize) {
            out.push(self.guest_page(addr).ok_or(Status::BadAddress)?);
        }
        if out.len() as u64 != count {
            return Err(Status::Invalid);
        }
        Ok(out)
    }

    /// `request` with every process address replaced by its guest-physical one; `Ok(None)`
    /// for a request that names no memory. A REG_MR or REG_MR_EXTENTS becomes the form that
    /// is shorter on the wire (extents if the device takes them, within `max_mr_pages`).
    pub fn rewrite(
        &self,
        request: &ControlRequest<'_>,
        extents: bool,
        max_mr_pages: u32,
    ) -> Rewritten {
        let (req, pages) = match request {
            ControlRequest::RegMr(m) => {
                let shift = m.req.page_shift.get();
                let list = m.pages.iter().map(move |p| (p, 1u64 << shift));
                (
                    m.req,
                    self.guest_pages(m.req.iova.get(), m.req.length.get(), shift, list)?,
                )
            }
            ControlRequest::RegMrExtents(m) => {
                let shift = m.req.page_shift.get();
                (
                    m.req,
                    self.guest_pages(
                        m.req.iova.get(),
                        m.req.length.get(),
                        shift,
                        m.extents.iter(),
                    )?,
                )
            }
            ControlRequest::ReregMr(m) if m.changes_translation() => {
                let shift = m.req.page_shift.get();
                let list = m.pages.iter().map(move |p| (p, 1u64 << shift));
                let pages = self.guest_pages(m.req.iova.get(), m.req.length.get(), shift, list)?;
                let mut fixed = m.req;
                fixed.page_shift = Le32::new(MIN_PAGE_SHIFT);
                fixed.npages = Le32::new(u32::try_from(pages.len()).map_err(|_| Status::Invalid)?);
                let mut list = Vec::with_capacity(pages.len() * 8);
                encode_page_list(pages, &mut list);
                return Ok(Some(
                    ControlRequest::ReregMr(ReregMr::new(fixed, &list)).to_vec(),
                ));
            }
            _ => return Ok(None),
        };
        Ok(Some(registration(req, &pages, extents, max_mr_pages)?))
    }
}

/// A REG_MR (4 KiB page list) or REG_MR_EXTENTS (runs of consecutive pages) of `pages`.
fn registration(
    req: RegMrReq,
    pages: &[u64],
    extents: bool,
    max_mr_pages: u32,
) -> Result<Vec<u8>, Status> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &page in pages {
        match runs.last_mut() {
            Some((start, len)) if *start + *len == page => *len += PAGE,
            _ => runs.push((page, PAGE)),
        }
    }
    let mut fixed = req;
    fixed.page_shift = Le32::new(MIN_PAGE_SHIFT);
    let mut list = Vec::new();
    if extents
        && runs.len() as u64 <= u64::from(max_mr_extents(max_mr_pages))
        && runs.len() < pages.len()
    {
        fixed.npages = Le32::new(runs.len() as u32);
        encode_extent_list(runs, &mut list);
        Ok(ControlRequest::RegMrExtents(RegMrExtents::new(fixed, &list)).to_vec())
    } else {
        fixed.npages = Le32::new(u32::try_from(pages.len()).map_err(|_| Status::Invalid)?);
        encode_page_list(pages.iter().copied(), &mut list);
        Ok(ControlRequest::RegMr(RegMr::new(fixed, &list)).to_vec())
    }
}

#[cfg(test)]
mod tests;

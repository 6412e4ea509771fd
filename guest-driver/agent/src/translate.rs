//! Addresses of a process's memory, as the process names them and as the device needs them.
//!
//! When the agent shares one PCI function among its processes, each process's registrable
//! memory is a memfd the agent allocated. The process cannot read guest-physical addresses
//! (pagemap hides them from unprivileged processes), so it names its memory by *process
//! addresses*: `base + offset` in its memfd, contiguous, as the process transport names its
//! guest RAM. A registration (REG_MR, REG_MR_EXTENTS, a REREG_MR that changes the
//! translation) is first checked to name only the process's memory ([`ProcessRam::registration`]:
//! anything outside is refused with BAD_ADDRESS, so a process reaches no other memory); the
//! agent pins the pages it names ([`Registration::runs`]) and then rewrites it into the pinned
//! pages' guest-physical addresses, 4 KiB page by page ([`Registration::rewrite`]).

use vrdma_spec::control::{
    encode_extent_list, encode_page_list, max_mr_extents, RegMr, RegMrExtents, ReregMr,
    MIN_PAGE_SHIFT,
};
use vrdma_spec::wire::{RegMrReq, ReregMrReq};
use vrdma_spec::{ControlRequest, Le32, Status};

const PAGE: u64 = 1 << MIN_PAGE_SHIFT;

/// A process's memory: `pages` 4 KiB pages at process addresses from `base`.
#[derive(Clone, Copy, Debug)]
pub struct ProcessRam {
    base: u64,
    pages: u64,
}

/// A registration a process asked for, checked to name only its own memory.
#[derive(Clone, Debug)]
pub struct Registration {
    form: Form,
    /// The 4 KiB process pages under the MR, in MR order.
    pages: Vec<u64>,
}

#[derive(Clone, Copy, Debug)]
enum Form {
    Register(RegMrReq),
    Reregister(ReregMrReq),
}

impl ProcessRam {
    /// `pages` 4 KiB pages from process address `base` (page aligned).
    pub fn new(base: u64, pages: u64) -> Self {
        ProcessRam { base, pages }
    }

    /// Whether the 4 KiB page at process address `addr` is the process's.
    fn owns(&self, addr: u64) -> bool {
        addr.checked_sub(self.base)
            .is_some_and(|offset| offset % PAGE == 0 && offset / PAGE < self.pages)
    }

    /// The registration `request` asks for, or `None` for a request that names no memory.
    pub fn registration(
        &self,
        request: &ControlRequest<'_>,
    ) -> Result<Option<Registration>, Status> {
        let (form, pages) = match request {
            ControlRequest::RegMr(m) => {
                let shift = m.req.page_shift.get();
                let list = m.pages.iter().map(move |p| (p, 1u64 << shift));
                (
                    Form::Register(m.req),
                    self.pages_under(m.req.iova.get(), m.req.length.get(), shift, list)?,
                )
            }
            ControlRequest::RegMrExtents(m) => {
                let shift = m.req.page_shift.get();
                (
                    Form::Register(m.req),
                    self.pages_under(
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
                (
                    Form::Reregister(m.req),
                    self.pages_under(m.req.iova.get(), m.req.length.get(), shift, list)?,
                )
            }
            _ => return Ok(None),
        };
        Ok(Some(Registration { form, pages }))
    }

    /// The 4 KiB process pages under an MR of `length` bytes at `iova`, whose translation lists
    /// process pages of `1 << shift` bytes as `list` (in MR order, already validated by the
    /// spec's decoder).
    fn pages_under(
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
        if count > self.pages {
            return Err(Status::BadAddress);
        }
        let skip = in_first / PAGE;
        let mut out = Vec::with_capacity(count as usize);
        let small_pages =
            list.flat_map(|(start, len)| (0..len / PAGE).map(move |i| start + i * PAGE));
        for addr in small_pages.skip(skip as usize).take(count as usize) {
            if !self.owns(addr) {
                return Err(Status::BadAddress);
            }
            out.push(addr);
        }
        if out.len() as u64 != count {
            return Err(Status::Invalid);
        }
        Ok(out)
    }
}

impl Registration {
    /// The 4 KiB process pages under the MR, in MR order.
    pub fn pages(&self) -> &[u64] {
        &self.pages
    }

    /// The distinct process pages under the MR as runs of consecutive pages `(address,
    /// bytes)`, in address order: what has to be pinned.
    pub fn runs(&self) -> Vec<(u64, u64)> {
        let mut sorted = self.pages.clone();
        sorted.sort_unstable();
        sorted.dedup();
        merge_runs(&sorted)
    }

    /// The request with every process page replaced by its guest-physical page
    /// (`guest_page`, which must know every page of [`Registration::runs`]). A registration
    /// becomes the form that is shorter on the wire (extents if the device takes them, within
    /// `max_mr_pages`).
    pub fn rewrite(
        &self,
        guest_page: impl Fn(u64) -> Option<u64>,
        extents: bool,
        max_mr_pages: u32,
    ) -> Result<Vec<u8>, Status> {
        let pages = self
            .pages
            .iter()
            .map(|&addr| guest_page(addr).ok_or(Status::BadAddress))
            .collect::<Result<Vec<u64>, Status>>()?;
        match self.form {
            Form::Register(req) => registration(req, &pages, extents, max_mr_pages),
            Form::Reregister(req) => {
                let mut fixed = req;
                fixed.page_shift = Le32::new(MIN_PAGE_SHIFT);
                fixed.npages = Le32::new(u32::try_from(pages.len()).map_err(|_| Status::Invalid)?);
                let mut list = Vec::with_capacity(pages.len() * 8);
                encode_page_list(pages, &mut list);
                Ok(ControlRequest::ReregMr(ReregMr::new(fixed, &list)).to_vec())
            }
        }
    }
}

/// Sorted 4 KiB pages as runs of consecutive pages `(first, bytes)`.
fn merge_runs(pages: &[u64]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &page in pages {
        match runs.last_mut() {
            Some((start, len)) if *start + *len == page => *len += PAGE,
            _ => runs.push((page, PAGE)),
        }
    }
    runs
}

/// A REG_MR (4 KiB page list) or REG_MR_EXTENTS (runs of consecutive pages) of `pages`.
fn registration(
    req: RegMrReq,
    pages: &[u64],
    extents: bool,
    max_mr_pages: u32,
) -> Result<Vec<u8>, Status> {
    let runs = merge_runs(pages);
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

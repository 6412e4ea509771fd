//! Memory regions: registration (REG_MR), re-registration (REREG_MR) and deregistration.

use std::marker::PhantomData;
use std::sync::Arc;

use log::warn;
use std::mem::size_of;

use vrdma_spec::control::{
    encode_extent_list, encode_page_list, max_mr_extents, rereg_flags, ControlRequest, Opcode,
    RegMr, RegMrExtents, ReregMr, ResponseBody, EXTENT_ENTRY_SIZE, HEADER_SIZE, MAX_PAGE_SHIFT,
    MIN_PAGE_SHIFT,
};
use vrdma_spec::features::{VRDMA_F_MR_EXTENTS, VRDMA_F_ODP};
use vrdma_spec::wire::{RegMrReq, ReregMrReq};
use vrdma_spec::{Le32, Le64};
use zerocopy::FromZeros;

use super::command::{handle_req, nonzero_handle, unexpected_body};
use super::context::ContextInner;
use super::error::{Result, VerbsError};
use super::pd::{Pd, PdInner};
use crate::dma::{DmaBuffer, PAGE_SHIFT, PAGE_SIZE};
use crate::provider::Sge;
use vrdma_spec::verbs::AccessFlags;

// REG_MR page lists are lists of the pages `DmaMemory::translate` returns.
const _: () = assert!(MIN_PAGE_SHIFT <= PAGE_SHIFT && PAGE_SHIFT <= MAX_PAGE_SHIFT);

/// Refuses access flags the device would refuse (remote write or atomic without local write).
fn check_access(ctx: &ContextInner, access: AccessFlags) -> Result<()> {
    let remote = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    if access.bits() & remote.bits() != 0 && !access.contains(AccessFlags::LOCAL_WRITE) {
        return Err(VerbsError::InvalidArgument(
            "remote write or atomic access needs local write access",
        ));
    }
    // As rxe built without on-demand paging refuses it (EOPNOTSUPP), without a round trip.
    if access.contains(AccessFlags::ON_DEMAND) && ctx.features() & VRDMA_F_ODP == 0 {
        return Err(VerbsError::Unsupported(
            "the device did not negotiate on-demand paging (VRDMA_F_ODP)",
        ));
    }
    Ok(())
}

/// The encoded page list of `[addr, addr + len)` in the transport's DMA memory, and its number
/// of pages, checked against the device's limits for a request whose fixed body is
/// `fixed_body` bytes.
fn page_list(
    ctx: &ContextInner,
    addr: *const u8,
    len: usize,
    fixed_body: usize,
) -> Result<(Vec<u8>, u32)> {
    if len == 0 {
        return Err(VerbsError::InvalidArgument(
            "a memory region needs at least one byte",
        ));
    }
    let span = (addr as u64 % PAGE_SIZE as u64) + len as u64;
    let npages = span.div_ceil(PAGE_SIZE as u64);
    let config = ctx.config();
    if npages > u64::from(config.max_mr_pages.get()) {
        return Err(VerbsError::InvalidArgument(
            "the buffer spans more pages than the device's max_mr_pages",
        ));
    }
    let request_len = (HEADER_SIZE + fixed_body) as u64 + 8 * npages;
    if request_len > u64::from(config.max_request_size.get()) {
        return Err(VerbsError::InvalidArgument(
            "the page list exceeds the device's max_request_size",
        ));
    }
    let pages = ctx.transport().dma().translate(addr, len)?;
    if pages.len() as u64 != npages {
        return Err(VerbsError::InvalidArgument(
            "the transport's translation does not list one entry per page",
        ));
    }
    let mut bytes = Vec::with_capacity(pages.len() * 8);
    encode_page_list(pages.iter().copied(), &mut bytes);
    // npages <= max_mr_pages, a u32.
    Ok((bytes, npages as u32))
}

/// How a REG_MR names the pages of a buffer.
enum Translation {
    /// REG_MR: encoded page list and its number of pages.
    Pages(Vec<u8>, u32),
    /// REG_MR_EXTENTS: encoded extent list and its number of extents.
    Extents(Vec<u8>, u32),
}

/// The translation of `[addr, addr + len)` for REG_MR: extents when the device takes them
/// (`VRDMA_F_MR_EXTENTS`) and they fit its limit, else the page list.
fn translation(ctx: &ContextInner, addr: *const u8, len: usize) -> Result<Translation> {
    if ctx.features() & VRDMA_F_MR_EXTENTS != 0 && len != 0 {
        let extents = ctx.transport().dma().translate_extents(addr, len)?;
        let max = max_mr_extents(ctx.config().max_mr_pages.get());
        if let Ok(count) = u32::try_from(extents.len()) {
            if count <= max {
                let mut bytes = Vec::with_capacity(extents.len() * EXTENT_ENTRY_SIZE);
                encode_extent_list(extents, &mut bytes);
                return Ok(Translation::Extents(bytes, count));
            }
        }
    }
    let (bytes, npages) = page_list(ctx, addr, len, size_of::<RegMrReq>())?;
    Ok(Translation::Pages(bytes, npages))
}

/// What [`Mr::rereg`] changes (`ibv_rereg_mr`'s `IBV_REREG_MR_CHANGE_PD` and
/// `IBV_REREG_MR_CHANGE_ACCESS`): each field that is `Some`.
#[derive(Clone, Copy, Debug, Default)]
pub struct MrChange<'p> {
    /// The new PD (of the same context).
    pub pd: Option<&'p Pd>,
    /// The new access flags.
    pub access: Option<AccessFlags>,
}

/// A registered memory region (`ibv_mr`). Deregistered when dropped.
///
/// Its iova is the address of the memory in this process, so an SGE's `addr` is an ordinary
/// pointer into the buffer ([`Mr::sge`] builds one).
pub struct Mr<'a> {
    // Declared first: DEREG_MR (its drop) must happen before an owned buffer is freed.
    object: MrObject,
    addr: u64,
    len: usize,
    lkey: u32,
    rkey: u32,
    access: AccessFlags,
    _memory: Memory<'a>,
}

/// What keeps the registered memory alive.
enum Memory<'a> {
    /// The caller's buffer, which the borrow keeps alive.
    Borrowed(PhantomData<&'a DmaBuffer>),
    /// A buffer the region owns.
    Owned(DmaBuffer),
    /// Memory the caller promised to keep (`register_raw`).
    Raw,
}

/// The device object.
struct MrObject {
    pd: Arc<PdInner>,
    handle: u32,
}

impl Drop for MrObject {
    fn drop(&mut self) {
        let req = ControlRequest::DeregMr(handle_req(self.handle));
        if let Err(e) = self.pd.ctx.execute_empty(&req) {
            warn!("DEREG_MR of MR {:#x} failed: {e}", self.handle);
        }
    }
}

impl<'a> Mr<'a> {
    pub(crate) fn register_buffer(
        pd: &Pd,
        buffer: &'a DmaBuffer,
        access: AccessFlags,
    ) -> Result<Self> {
        let memory = Memory::Borrowed(PhantomData);
        // SAFETY: the borrow ties the region's life to the buffer's.
        unsafe { Self::register(pd, buffer.as_ptr(), buffer.len(), access, memory) }
    }

    /// Registers `[addr, addr + len)` with iova = `addr`.
    ///
    /// # Safety
    ///
    /// `memory` keeps the range allocated for as long as the region lives.
    unsafe fn register(
        pd: &Pd,
        addr: *const u8,
        len: usize,
        access: AccessFlags,
        memory: Memory<'a>,
    ) -> Result<Self> {
        // SAFETY: forwarded contract.
        unsafe { Self::register_at(pd, addr, len, addr as u64, access, memory) }
    }

    /// Registers `[addr, addr + len)` so that work requests and peers address it as
    /// `[iova, iova + len)`. rxe translates an iova page by page, keeping its offset within the
    /// page, so `iova` and `addr` must have the same offset within a page.
    ///
    /// # Safety
    ///
    /// `memory` keeps the range allocated for as long as the region lives.
    unsafe fn register_at(
        pd: &Pd,
        addr: *const u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
        memory: Memory<'a>,
    ) -> Result<Self> {
        check_access(&pd.inner.ctx, access)?;
        let page_mask = (1u64 << PAGE_SHIFT) - 1;
        if iova & page_mask != addr as u64 & page_mask {
            return Err(VerbsError::InvalidArgument(
                "the iova and the address must have the same offset within a page",
            ));
        }
        if iova.checked_add(len as u64).is_none() {
            return Err(VerbsError::InvalidArgument("iova + length overflows"));
        }
        let translation = translation(&pd.inner.ctx, addr, len)?;
        let entries = match &translation {
            Translation::Pages(_, n) | Translation::Extents(_, n) => *n,
        };
        let req = RegMrReq {
            pd: Le32::new(pd.inner.handle),
            access: Le32::new(access.bits()),
            iova: Le64::new(iova),
            length: Le64::new(len as u64),
            page_shift: Le32::new(PAGE_SHIFT),
            npages: Le32::new(entries),
        };
        let request = match &translation {
            Translation::Pages(list, _) => ControlRequest::RegMr(RegMr::new(req, list)),
            Translation::Extents(list, _) => {
                ControlRequest::RegMrExtents(RegMrExtents::new(req, list))
            }
        };
        let opcode = request.opcode();
        let ResponseBody::RegMr(resp) = pd.inner.ctx.execute(&request)? else {
            return Err(unexpected_body(opcode));
        };
        let handle = nonzero_handle(opcode, resp.mr.get())?;
        Ok(Mr {
            object: MrObject {
                pd: pd.inner.clone(),
                handle,
            },
            addr: iova,
            len,
            lkey: resp.lkey.get(),
            rkey: resp.rkey.get(),
            access,
            _memory: memory,
        })
    }

    /// The device's handle of this region.
    pub fn handle(&self) -> u32 {
        self.object.handle
    }

    /// Local key, for SGEs.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Remote key, for peers.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The iova: the start address work requests and peers use (the memory's own address
    /// unless registered with [`Pd::register_raw_at`]).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a region has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Access rights the region was registered with.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The owned buffer, for regions made by [`Pd::register_owned`].
    pub fn buffer(&self) -> Option<&DmaBuffer> {
        match &self._memory {
            Memory::Owned(buffer) => Some(buffer),
            Memory::Borrowed(_) | Memory::Raw => None,
        }
    }

    /// An SGE for `len` bytes at `offset` in the region; `None` if that leaves the region or
    /// does not fit an SGE's 32-bit length.
    pub fn sge(&self, offset: usize, len: usize) -> Option<Sge> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        Some(Sge {
            addr: self.addr + offset as u64,
            length: u32::try_from(len).ok()?,
            lkey: self.lkey,
        })
    }
}

impl<'a> Mr<'a> {
    /// Changes the region's PD and/or access flags in place (REREG_MR, `ibv_rereg_mr` without
    /// `IBV_REREG_MR_CHANGE_TRANSLATION`). Its keys may change; [`Mr::lkey`] and [`Mr::rkey`]
    /// return the new ones. On failure the region is unchanged.
    pub fn rereg(&mut self, change: MrChange<'_>) -> Result<()> {
        self.execute_rereg(change, None)
    }

    /// Changes the region's translation to `[addr, addr + len)` (iova = `addr`), and its PD
    /// and/or access flags with it (REREG_MR with `IBV_REREG_MR_CHANGE_TRANSLATION`). The device
    /// registers the new range before it releases the old one: on failure the region still
    /// covers its old memory with its old keys. On success the region no longer keeps the old
    /// memory (an owned buffer is freed).
    ///
    /// # Safety
    ///
    /// As for [`Pd::register_raw`]: the new memory lies in the transport's DMA memory and stays
    /// allocated until the region is dropped or re-registered again.
    pub unsafe fn rereg_translation(
        &mut self,
        change: MrChange<'_>,
        addr: *const u8,
        len: usize,
    ) -> Result<()> {
        self.execute_rereg(change, Some((addr, len)))
    }

    fn execute_rereg(
        &mut self,
        change: MrChange<'_>,
        translation: Option<(*const u8, usize)>,
    ) -> Result<()> {
        let ctx = self.object.pd.ctx.clone();
        let mut req = ReregMrReq::new_zeroed();
        req.mr = Le32::new(self.object.handle);
        let mut flags = 0;
        if let Some(pd) = change.pd {
            if !Arc::ptr_eq(&pd.inner.ctx, &ctx) {
                return Err(VerbsError::InvalidArgument(
                    "the new PD belongs to another context",
                ));
            }
            flags |= rereg_flags::CHANGE_PD;
            req.pd = Le32::new(pd.inner.handle);
        }
        if let Some(access) = change.access {
            check_access(&ctx, access)?;
            flags |= rereg_flags::CHANGE_ACCESS;
            req.access = Le32::new(access.bits());
        }
        let mut list = Vec::new();
        if let Some((addr, len)) = translation {
            let (bytes, npages) = page_list(&ctx, addr, len, size_of::<ReregMrReq>())?;
            list = bytes;
            flags |= rereg_flags::CHANGE_TRANSLATION;
            req.iova = Le64::new(addr as u64);
            req.length = Le64::new(len as u64);
            req.page_shift = Le32::new(PAGE_SHIFT);
            req.npages = Le32::new(npages);
        }
        if flags == 0 {
            return Err(VerbsError::InvalidArgument(
                "a re-registration must change the PD, the access flags or the translation",
            ));
        }
        req.flags = Le32::new(flags);
        let request = ControlRequest::ReregMr(ReregMr::new(req, &list));
        let ResponseBody::ReregMr(resp) = ctx.execute(&request)? else {
            return Err(unexpected_body(Opcode::ReregMr));
        };
        // The device holds the new state: follow it.
        if let Some(pd) = change.pd {
            self.object.pd = pd.inner.clone();
        }
        if let Some(access) = change.access {
            self.access = access;
        }
        if let Some((addr, len)) = translation {
            self.addr = addr as u64;
            self.len = len;
            // The old memory is no longer registered; the caller keeps the new one.
            self._memory = Memory::Raw;
        }
        self.lkey = resp.lkey.get();
        self.rkey = resp.rkey.get();
        Ok(())
    }
}

impl Mr<'static> {
    pub(crate) fn register_owned(pd: &Pd, buffer: DmaBuffer, access: AccessFlags) -> Result<Self> {
        let (addr, len) = (buffer.as_ptr(), buffer.len());
        // SAFETY: the region owns the buffer; `object` is declared before `_memory`, so the
        // buffer is freed only after DEREG_MR.
        unsafe { Self::register(pd, addr, len, access, Memory::Owned(buffer)) }
    }

    /// # Safety
    ///
    /// As for [`Pd::register_raw`].
    pub(crate) unsafe fn register_raw(
        pd: &Pd,
        addr: *const u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Self> {
        // SAFETY: the caller keeps the memory allocated while the region lives.
        unsafe { Self::register_at(pd, addr, len, iova, access, Memory::Raw) }
    }
}

impl Pd {
    /// Registers `buffer` (memory the transport allocated) as a memory region whose iova is
    /// the buffer's address in this process. The region cannot outlive the buffer.
    pub fn register<'a>(&self, buffer: &'a DmaBuffer, access: AccessFlags) -> Result<Mr<'a>> {
        Mr::register_buffer(self, buffer, access)
    }

    /// Registers `buffer` and keeps it inside the region (for regions stored next to their
    /// users).
    pub fn register_owned(&self, buffer: DmaBuffer, access: AccessFlags) -> Result<Mr<'static>> {
        Mr::register_owned(self, buffer, access)
    }

    /// Registers `len` bytes at `addr`, which must lie in memory the transport's DMA allocator
    /// handed out (checked by translating it).
    ///
    /// # Safety
    ///
    /// The memory must stay allocated until the returned region is dropped: the device (and
    /// remote peers, with remote access) may write it until then.
    pub unsafe fn register_raw(
        &self,
        addr: *const u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Mr<'static>> {
        // SAFETY: forwarded contract.
        unsafe { Mr::register_raw(self, addr, len, addr as u64, access) }
    }

    /// As [`Self::register_raw`], addressed by work requests and peers as `[iova, iova + len)`
    /// (`ibv_reg_mr_iova`): `iova` must have the same offset within a page as `addr`, as rxe
    /// translates an iova page by page.
    ///
    /// # Safety
    ///
    /// As for [`Self::register_raw`].
    pub unsafe fn register_raw_at(
        &self,
        addr: *const u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Mr<'static>> {
        // SAFETY: forwarded contract.
        unsafe { Mr::register_raw(self, addr, len, iova, access) }
    }
}

impl std::fmt::Debug for Mr<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("handle", &self.object.handle)
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .finish()
    }
}

//! Protection domains.

use std::sync::Arc;

use log::warn;
use vrdma_spec::control::{ControlRequest, Opcode, ResponseBody};
use vrdma_spec::wire::HandleReq;
use vrdma_spec::Le32;

use super::attr::AccessFlags;
use super::context::{unexpected_body, Context, ContextInner};
use super::error::{ProtocolError, Result};
use super::mr::Mr;
use crate::dma::DmaBuffer;

/// A protection domain (`ibv_pd`). Deallocated when it and every object created in it are
/// dropped.
pub struct Pd {
    pub(crate) inner: Arc<PdInner>,
}

/// The device object; objects of the PD hold it so that DEALLOC_PD comes after them.
pub(crate) struct PdInner {
    pub(crate) ctx: Arc<ContextInner>,
    pub(crate) handle: u32,
}

impl Pd {
    /// Allocates a protection domain (ALLOC_PD).
    pub fn new(ctx: &Context) -> Result<Pd> {
        let ResponseBody::AllocPd(resp) = ctx.inner.execute(&ControlRequest::AllocPd)? else {
            return Err(unexpected_body(Opcode::AllocPd));
        };
        let handle = nonzero_handle(Opcode::AllocPd, resp.handle.get())?;
        Ok(Pd {
            inner: Arc::new(PdInner {
                ctx: ctx.inner.clone(),
                handle,
            }),
        })
    }

    /// The device's handle of this PD.
    pub fn handle(&self) -> u32 {
        self.inner.handle
    }

    /// The context the PD belongs to.
    pub fn context(&self) -> Context {
        Context {
            inner: self.inner.ctx.clone(),
        }
    }

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
        unsafe { Mr::register_raw(self, addr, len, access) }
    }
}

impl Drop for PdInner {
    fn drop(&mut self) {
        let req = ControlRequest::DeallocPd(handle_req(self.handle));
        if let Err(e) = self.ctx.execute_empty(&req) {
            warn!("DEALLOC_PD of PD {:#x} failed: {e}", self.handle);
        }
    }
}

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

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pd")
            .field("handle", &self.inner.handle)
            .finish()
    }
}

//! Protection domains.

use std::sync::Arc;

use log::warn;
use vrdma_spec::control::{ControlRequest, Opcode, ResponseBody};

use super::command::{handle_req, nonzero_handle, unexpected_body};
use super::context::{Context, ContextInner};
use super::error::Result;

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
}

impl Context {
    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Result<Pd> {
        Pd::new(self)
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

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pd")
            .field("handle", &self.inner.handle)
            .finish()
    }
}

//! Memory windows (`ibv_mw`): allocation and freeing are control commands (ALLOC_MW,
//! DEALLOC_MW, with `VRDMA_F_MW`); binding and invalidating are send work requests the
//! provider writes like any other, which the host kernel executes (spec §9.2).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use log::warn;
use vrdma_spec::control::{ControlRequest, Opcode, ResponseBody};
use vrdma_spec::verbs::{AccessFlags, MwType};
use vrdma_spec::wire::AllocMwReq;
use vrdma_spec::Le32;

use super::command::{handle_req, nonzero_handle, unexpected_body};
use super::error::{PostSendError, Result, VerbsError};
use super::mr::Mr;
use super::pd::{Pd, PdInner};
use super::qp::Qp;
use crate::provider::{inc_rkey, MwBind, PostError, SendFlags, SendWr};

/// A memory window. Freed (DEALLOC_MW) when dropped, bound or not.
pub struct Mw {
    pd: Arc<PdInner>,
    handle: u32,
    mw_type: MwType,
    /// The current rkey. Type-1 binds through [`Qp::bind_mw`] update it when they are posted,
    /// as rdma-core does; after a type-2 bind posted with [`SendWr::bind_mw`] the application
    /// records the new key itself ([`Mw::set_rkey`]), as with `ibv_post_send`.
    rkey: AtomicU32,
}

impl Pd {
    /// Allocates a memory window of `mw_type` in this PD (ALLOC_MW).
    pub fn alloc_mw(&self, mw_type: MwType) -> Result<Mw> {
        let ctx = &self.inner.ctx;
        if !ctx.has_memory_windows() {
            return Err(VerbsError::InvalidArgument(
                "the device did not negotiate memory windows (VRDMA_F_MW)",
            ));
        }
        let req = ControlRequest::AllocMw(AllocMwReq {
            pd: Le32::new(self.inner.handle),
            mw_type: Le32::new(mw_type as u32),
        });
        let ResponseBody::AllocMw(resp) = ctx.execute(&req)? else {
            return Err(unexpected_body(Opcode::AllocMw));
        };
        let handle = nonzero_handle(Opcode::AllocMw, resp.mw.get())?;
        Ok(Mw {
            pd: self.inner.clone(),
            handle,
            mw_type,
            rkey: AtomicU32::new(resp.rkey.get()),
        })
    }
}

impl Mw {
    /// The device's handle of this window.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Type 1 or type 2.
    pub fn mw_type(&self) -> MwType {
        self.mw_type
    }

    /// The window's current rkey, to hand to peers once it is bound.
    pub fn rkey(&self) -> u32 {
        self.rkey.load(Ordering::Acquire)
    }

    /// Records the rkey a type-2 bind gave the window (the `rkey` of its [`MwBind`]).
    pub fn set_rkey(&self, rkey: u32) {
        self.rkey.store(rkey, Ordering::Release);
    }

    /// The bind of this window onto `[addr, addr + length)` of `mr` with `access`, under the
    /// window's next rkey: for [`SendWr::bind_mw`] (type 2) or [`Qp::bind_mw`] (type 1).
    pub fn bind_info(&self, mr: &Mr<'_>, addr: u64, length: u64, access: AccessFlags) -> MwBind {
        self.bind_to_key(mr.lkey(), addr, length, access)
    }

    /// [`Mw::bind_info`] naming the MR by its local key; a type-1 window is unbound with
    /// `(0, 0, 0, AccessFlags::empty())`.
    pub fn bind_to_key(&self, mr_lkey: u32, addr: u64, length: u64, access: AccessFlags) -> MwBind {
        let rkey = self.rkey();
        MwBind {
            mw_rkey: rkey,
            rkey: inc_rkey(rkey),
            mr_lkey,
            addr,
            length,
            access,
        }
    }
}

impl Qp {
    /// Binds a type-1 window (`ibv_bind_mw`): posts `bind` (from [`Mw::bind_info`]) as a
    /// BIND_MW request; its new rkey becomes [`Mw::rkey`] once the request is posted, as
    /// rdma-core does, and is returned. A `length` of 0 unbinds. Its completion (if signaled)
    /// is a [`WcOpcode::BindMw`](super::WcOpcode). A bind made for another key of the window
    /// is refused with [`PostError::InvalidBind`].
    pub fn bind_mw(
        &self,
        mw: &Mw,
        wr_id: u64,
        flags: SendFlags,
        bind: MwBind,
    ) -> std::result::Result<u32, PostSendError> {
        if mw.mw_type != MwType::Type1 || bind.mw_rkey != mw.rkey() {
            return Err(PostSendError::Refused {
                index: 0,
                error: PostError::InvalidBind,
            });
        }
        let wr = SendWr::bind_mw(wr_id, bind, flags);
        // SAFETY: a bind carries no SGEs and no inline data.
        unsafe { self.post_send(std::slice::from_ref(&wr)) }?;
        mw.set_rkey(bind.rkey);
        Ok(bind.rkey)
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        let req = ControlRequest::DeallocMw(handle_req(self.handle));
        if let Err(e) = self.pd.ctx.execute_empty(&req) {
            warn!("DEALLOC_MW of MW {:#x} failed: {e}", self.handle);
        }
    }
}

impl std::fmt::Debug for Mw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mw")
            .field("handle", &self.handle)
            .field("type", &self.mw_type)
            .field("rkey", &self.rkey())
            .finish()
    }
}

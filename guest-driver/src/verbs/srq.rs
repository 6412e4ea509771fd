//! Shared receive queues.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use log::warn;
use parking_lot::Mutex;
use vrdma_spec::control::{ControlRequest, Opcode, ResponseBody};
use vrdma_spec::verbs::srq_attr;
use vrdma_spec::wire::{CreateSrqReq, ModifySrqReq, ResizeSrqReq, RingDesc};
use vrdma_spec::Le32;

use super::command::{handle_req, nonzero_handle, unexpected_body};
use super::context::ContextInner;
use super::error::{ProtocolError, Result, VerbsError};
use super::pd::{Pd, PdInner};
use super::ring::{map_ring, replace_ring};
use crate::provider::rxe_v1::RecvQueue;
use crate::provider::{PostError, RecvWr};

/// Attributes of an SRQ (`ibv_srq_attr`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SrqAttr {
    /// Capacity in receive requests.
    pub max_wr: u32,
    /// Most SGEs per receive request.
    pub max_sge: u32,
    /// Limit-event threshold (0: not armed).
    pub srq_limit: u32,
}

/// A shared receive queue (`ibv_srq`): receive requests that every QP attached to it consumes.
///
/// Posting writes native receive WQEs into the mapped queue behind a lock of its own (no
/// device involvement, no allocation). Destroyed when dropped and no QP uses it any more.
pub struct Srq {
    // Declared first: the mapping must not be used after DESTROY_SRQ (`shared`'s drop).
    // `None` after a resize that failed once the device had replaced the buffer.
    queue: Mutex<Option<RecvQueue>>,
    pub(crate) shared: Arc<SrqShared>,
    srq_num: u32,
    /// Actual capacity; changes only under `queue`'s lock (RESIZE_SRQ).
    max_wr: AtomicU32,
    max_sge: u32,
}

/// The device object; QPs hold it so that DESTROY_SRQ comes after their DESTROY_QP.
pub(crate) struct SrqShared {
    pd: Arc<PdInner>,
    pub(crate) handle: u32,
}

impl SrqShared {
    pub(crate) fn ctx(&self) -> &Arc<ContextInner> {
        &self.pd.ctx
    }
}

impl Drop for SrqShared {
    fn drop(&mut self) {
        let req = ControlRequest::DestroySrq(handle_req(self.handle));
        if let Err(e) = self.pd.ctx.execute_empty(&req) {
            warn!("DESTROY_SRQ of SRQ {:#x} failed: {e}", self.handle);
        }
    }
}

impl Srq {
    /// Creates an SRQ in `pd` with room for at least `max_wr` requests of `max_sge` SGEs
    /// (CREATE_SRQ), arming the limit event at `srq_limit` (0: not armed), and wraps the
    /// buffer the device mapped for it.
    pub fn new(pd: &Pd, max_wr: u32, max_sge: u32, srq_limit: u32) -> Result<Srq> {
        let ctx = &pd.inner.ctx;
        if !ctx.has_rxe_v1() {
            return Err(VerbsError::Unsupported(
                "SRQs need the rxe v1 ring format, which was not negotiated",
            ));
        }
        if max_wr == 0 || max_sge == 0 {
            return Err(VerbsError::InvalidArgument(
                "an SRQ needs at least one entry of at least one SGE",
            ));
        }
        let req = ControlRequest::CreateSrq(CreateSrqReq {
            pd: Le32::new(pd.inner.handle),
            max_wr: Le32::new(max_wr),
            max_sge: Le32::new(max_sge),
            srq_limit: Le32::new(srq_limit),
        });
        let ResponseBody::CreateSrq(resp) = ctx.execute(&req)? else {
            return Err(unexpected_body(Opcode::CreateSrq));
        };
        let handle = nonzero_handle(Opcode::CreateSrq, resp.srq.get())?;
        // From here on, dropping `shared` (on any error below) destroys the SRQ again.
        let shared = Arc::new(SrqShared {
            pd: pd.inner.clone(),
            handle,
        });
        let bad = |field, value: u32| ProtocolError::ResponseValue {
            opcode: Opcode::CreateSrq,
            field,
            value: value.into(),
        };
        let actual_wr = resp.max_wr.get();
        let actual_sge = resp.max_sge.get();
        if actual_wr < max_wr {
            return Err(bad("max_wr", actual_wr).into());
        }
        if actual_sge < max_sge {
            return Err(bad("max_sge", actual_sge).into());
        }
        // SAFETY: DESTROY_SRQ is sent by `shared`'s drop, after the queue (declared first in
        // `Srq`, or dropped on the error path before `shared`) is gone; RESIZE_SRQ (`resize`)
        // replaces it under its lock; the ring is wrapped once.
        let queue = unsafe { receive_queue(ctx, &resp.ring, actual_sge) }?;
        if queue.capacity() < actual_wr {
            return Err(bad("max_wr", actual_wr).into());
        }
        Ok(Srq {
            queue: Mutex::new(Some(queue)),
            shared,
            srq_num: resp.srq_num.get(),
            max_wr: AtomicU32::new(actual_wr),
            max_sge: actual_sge,
        })
    }

    /// Gives the SRQ room for at least `max_wr` receive requests (RESIZE_SRQ, like
    /// `ibv_modify_srq` with `IBV_SRQ_MAX_WR`) and returns the new capacity, smaller or larger
    /// than before. The receives posted and not consumed are kept, in order. Fails with an
    /// `INVALID` status when `max_wr` is below their number or below an armed limit, and then
    /// changes nothing.
    ///
    /// Posters to this SRQ wait for the resize: the device copies the receives up to the
    /// producer index last published, and unmaps the old buffer before it answers.
    pub fn resize(&self, max_wr: u32) -> Result<u32> {
        let ctx = self.shared.ctx();
        if max_wr == 0 {
            return Err(VerbsError::InvalidArgument(
                "an SRQ needs at least one entry",
            ));
        }
        let resized = replace_ring(
            &self.queue,
            "the SRQ lost its buffer in an earlier failed resize",
            || {
                let req = ControlRequest::ResizeSrq(ResizeSrqReq {
                    srq: Le32::new(self.shared.handle),
                    max_wr: Le32::new(max_wr),
                });
                match ctx.execute(&req)? {
                    ResponseBody::ResizeSrq(resp) => Ok(resp),
                    _ => Err(unexpected_body(Opcode::ResizeSrq)),
                }
            },
            |resp| {
                let capacity = resp.max_wr.get();
                // SAFETY: as in `new`: the device unmaps this ring on DESTROY_SRQ (after the
                // queue is dropped) or on the next RESIZE_SRQ (sent under the queue's lock,
                // which drops it unused).
                let queue = unsafe { receive_queue(ctx, &resp.ring, self.max_sge) }?;
                if capacity < max_wr || queue.capacity() < capacity {
                    return Err(ProtocolError::ResponseValue {
                        opcode: Opcode::ResizeSrq,
                        field: "max_wr",
                        value: capacity.into(),
                    }
                    .into());
                }
                Ok(queue)
            },
        )?;
        let capacity = resized.max_wr.get();
        self.max_wr.store(capacity, Ordering::Relaxed);
        Ok(capacity)
    }

    /// The device's handle of this SRQ (as found in SRQ events).
    pub fn handle(&self) -> u32 {
        self.shared.handle
    }

    /// The host's SRQ number.
    pub fn srq_num(&self) -> u32 {
        self.srq_num
    }

    /// Actual capacity.
    pub fn max_wr(&self) -> u32 {
        self.max_wr.load(Ordering::Relaxed)
    }

    /// Actual SGEs per request.
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// Posts receive requests, like `ibv_post_srq_recv`. On `Err((n, e))` the first `n` were
    /// posted. No device involvement and no allocation.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), (usize, PostError)> {
        match self.queue.lock().as_mut() {
            Some(queue) => queue.post_recv(wrs),
            None => Err((0, PostError::QueueLost)),
        }
    }

    /// Arms the one-shot limit event: it fires when fewer than `limit` requests remain
    /// (MODIFY_SRQ with `LIMIT`, like `ibv_modify_srq`).
    pub fn modify(&self, limit: u32) -> Result<()> {
        let req = ControlRequest::ModifySrq(ModifySrqReq {
            srq: Le32::new(self.shared.handle),
            attr_mask: Le32::new(srq_attr::LIMIT),
            max_wr: Le32::ZERO,
            srq_limit: Le32::new(limit),
        });
        self.shared.ctx().execute_empty(&req)
    }

    /// Current attributes (QUERY_SRQ).
    pub fn query(&self) -> Result<SrqAttr> {
        let req = ControlRequest::QuerySrq(handle_req(self.shared.handle));
        let ResponseBody::QuerySrq(resp) = self.shared.ctx().execute(&req)? else {
            return Err(unexpected_body(Opcode::QuerySrq));
        };
        Ok(SrqAttr {
            max_wr: resp.max_wr.get(),
            max_sge: resp.max_sge.get(),
            srq_limit: resp.srq_limit.get(),
        })
    }
}

/// Checks and wraps an SRQ buffer the device mapped, for receives of `max_sge` SGEs.
///
/// # Safety
///
/// As [`map_ring`]'s.
unsafe fn receive_queue(ctx: &ContextInner, desc: &RingDesc, max_sge: u32) -> Result<RecvQueue> {
    // SAFETY: forwarded to the caller.
    let ring = unsafe { map_ring(ctx, desc) }?;
    Ok(RecvQueue::new(ring, max_sge).map_err(ProtocolError::Queue)?)
}

impl std::fmt::Debug for Srq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Srq")
            .field("handle", &self.shared.handle)
            .field("srq_num", &self.srq_num)
            .finish()
    }
}

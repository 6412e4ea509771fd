//! Completion queues.

use std::sync::Arc;
use std::time::Duration;

use log::warn;
use parking_lot::{Mutex, MutexGuard};
use vrdma_spec::control::{ControlRequest, Opcode, ResponseBody};
use vrdma_spec::verbs::arm_flags;
use vrdma_spec::wire::{ring_flags, ArmCqReq, CreateCqReq, ResizeCqReq, RingDesc};
use vrdma_spec::Le32;

use super::command::{handle_req, nonzero_handle, unexpected_body};
use super::context::{Context, ContextInner};
use super::error::{ProtocolError, Result, VerbsError};
use super::event::{DeviceEvent, Wanted};
use super::ring::{map_ring, replace_ring};
use crate::provider::rxe_v1::CompletionQueue;
use crate::provider::WorkCompletion;

/// A completion queue (`ibv_cq`) with its completion events.
///
/// Polling reads the native CQ directly (no device involvement, no allocation); the provider
/// queue lives in the `Cq` behind a lock of its own, so `Cq` can be shared between threads
/// and CQs never contend with each other. Destroyed when dropped and no QP uses it any more.
pub struct Cq {
    // Declared first: the mapping must not be used after DESTROY_CQ (`shared`'s drop).
    // `None` once a RESIZE_CQ unmapped the old buffer but the new one proved unusable: the CQ
    // then yields nothing and should be destroyed.
    queue: Mutex<Option<CompletionQueue>>,
    pub(crate) shared: Arc<CqShared>,
    /// The device gave this CQ a staging ring (spec §9.8).
    staged: bool,
}

/// The device object; QPs hold it so that DESTROY_CQ comes after their DESTROY_QP.
pub(crate) struct CqShared {
    pub(crate) ctx: Arc<ContextInner>,
    pub(crate) handle: u32,
}

impl Drop for CqShared {
    fn drop(&mut self) {
        let req = ControlRequest::DestroyCq(handle_req(self.handle));
        if let Err(e) = self.ctx.execute_empty(&req) {
            warn!("DESTROY_CQ of CQ {:#x} failed: {e}", self.handle);
        }
        // After the DESTROY response the device sends no more events for this CQ.
        self.ctx.events.unregister_cq(self.handle);
    }
}

impl Cq {
    /// Creates a CQ with room for at least `cqe` completions (CREATE_CQ) and wraps the
    /// buffer the device mapped for it.
    pub fn new(ctx: &Context, cqe: u32) -> Result<Cq> {
        let ctx = &ctx.inner;
        let req = Self::create_request(ctx, cqe)?;
        let resp = ctx.execute(&req)?;
        Self::created(ctx, cqe, resp)
    }

    /// Creates a CQ for each of `cqes` with one batch of CREATE_CQ commands (one round trip
    /// where the transport batches); each result is that CQ's.
    pub fn new_many(ctx: &Context, cqes: &[u32]) -> Result<Vec<Result<Cq>>> {
        let ctx = &ctx.inner;
        let mut requests = Vec::with_capacity(cqes.len());
        let mut checked = Vec::with_capacity(cqes.len());
        for &cqe in cqes {
            match Self::create_request(ctx, cqe) {
                Ok(req) => {
                    checked.push(Ok(()));
                    requests.push(req);
                }
                Err(e) => checked.push(Err(e)),
            }
        }
        let mut answers = ctx.execute_batch(&requests)?.into_iter();
        Ok(cqes
            .iter()
            .zip(checked)
            .map(|(&cqe, checked)| {
                checked?;
                let resp = answers
                    .next()
                    .ok_or_else(|| unexpected_body(Opcode::CreateCq))??;
                Self::created(ctx, cqe, resp)
            })
            .collect())
    }

    /// Checks a creation and builds its CREATE_CQ.
    fn create_request(ctx: &ContextInner, cqe: u32) -> Result<ControlRequest<'static>> {
        if !ctx.has_rxe_v1() {
            return Err(VerbsError::Unsupported(
                "CQs need the rxe v1 ring format, which was not negotiated",
            ));
        }
        if cqe == 0 {
            return Err(VerbsError::InvalidArgument("a CQ needs at least one entry"));
        }
        Ok(ControlRequest::CreateCq(CreateCqReq {
            cqe: Le32::new(cqe),
            reserved: Le32::ZERO,
        }))
    }

    /// The CQ a CREATE_CQ for `cqe` entries answered with `resp`.
    fn created(ctx: &Arc<ContextInner>, cqe: u32, resp: ResponseBody) -> Result<Cq> {
        let ResponseBody::CreateCq(resp) = resp else {
            return Err(unexpected_body(Opcode::CreateCq));
        };
        let handle = nonzero_handle(Opcode::CreateCq, resp.cq.get())?;
        ctx.events.register_cq(handle);
        // From here on, dropping `shared` (on any error below) destroys the CQ again.
        let shared = Arc::new(CqShared {
            ctx: ctx.clone(),
            handle,
        });
        check_capacity(Opcode::CreateCq, cqe, resp.cqe.get(), &resp.ring)?;
        // SAFETY: DESTROY_CQ is sent by `shared`'s drop, after the queue (declared first in
        // `Cq`, or dropped on the error path before `shared`) is gone; RESIZE_CQ (`resize`)
        // replaces it under its lock; the ring is wrapped once.
        let queue = unsafe { completion_queue(ctx, &resp.ring) }?;
        Ok(Cq {
            queue: Mutex::new(Some(queue)),
            shared,
            staged: resp.ring.flags.get() & ring_flags::STAGED != 0,
        })
    }

    /// Gives the CQ room for at least `cqe` completions (RESIZE_CQ, like `ibv_resize_cq`) and
    /// returns the new capacity, which may be smaller or larger than before. The completions
    /// the CQ holds are kept, in order: polls after the resize return them first. Fails with
    /// an `INVALID` status when `cqe` is below their number, and then changes nothing.
    ///
    /// Pollers of this CQ wait for the resize: the device copies the pending completions from
    /// the consumer index last published, and unmaps the old buffer before it answers.
    pub fn resize(&self, cqe: u32) -> Result<u32> {
        let ctx = &self.shared.ctx;
        if cqe == 0 {
            return Err(VerbsError::InvalidArgument("a CQ needs at least one entry"));
        }
        let resized = replace_ring(
            &self.queue,
            "the CQ lost its buffer in an earlier failed resize",
            || {
                let req = ControlRequest::ResizeCq(ResizeCqReq {
                    cq: Le32::new(self.shared.handle),
                    cqe: Le32::new(cqe),
                });
                match ctx.execute(&req)? {
                    ResponseBody::ResizeCq(resp) => Ok(resp),
                    _ => Err(unexpected_body(Opcode::ResizeCq)),
                }
            },
            |resp| {
                check_capacity(Opcode::ResizeCq, cqe, resp.cqe.get(), &resp.ring)?;
                // SAFETY: as in `new`: the device unmaps this ring on DESTROY_CQ (after the
                // queue is dropped) or on the next RESIZE_CQ (sent under the queue's lock,
                // which drops it unused).
                unsafe { completion_queue(ctx, &resp.ring) }
            },
        )?;
        Ok(resized.cqe.get())
    }

    /// Whether the device gave this CQ a staging ring (spec §9.8): it is polled the same, the
    /// device copies the host's completions into it.
    pub fn is_staged(&self) -> bool {
        self.staged
    }

    /// The device's handle of this CQ (as found in [`DeviceEvent::Completion`]).
    pub fn handle(&self) -> u32 {
        self.shared.handle
    }

    /// How many completions the CQ holds.
    pub fn capacity(&self) -> u32 {
        self.queue
            .lock()
            .as_ref()
            .map_or(0, CompletionQueue::capacity)
    }

    /// Moves up to `out.len()` completions, oldest first, into `out`; returns how many.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        self.queue
            .lock()
            .as_mut()
            .map_or(0, |queue| queue.poll(out))
    }

    /// Starts a batch poll (`ibv_start_poll` .. `ibv_end_poll`): the CQ stays locked for the
    /// batch's lifetime (other pollers wait), completions are read in place one by one, and the
    /// ones consumed are handed back to the device together when the batch ends (is dropped).
    pub fn poll_batch(&self) -> CqPollBatch<'_> {
        CqPollBatch {
            queue: self.queue.lock(),
            consumed: false,
        }
    }

    /// Requests one completion event for the next completion (or the next solicited one)
    /// added to the CQ (ARM_CQ, like `ibv_req_notify_cq`). Completions already in the CQ do
    /// not trigger it: poll again after arming.
    pub fn arm(&self, solicited_only: bool) -> Result<()> {
        let flags = if solicited_only {
            arm_flags::SOLICITED_ONLY
        } else {
            0
        };
        let req = ControlRequest::ArmCq(ArmCqReq {
            cq: Le32::new(self.shared.handle),
            flags: Le32::new(flags),
        });
        self.shared.ctx.execute_empty(&req)
    }

    /// Waits up to `timeout` (`None`: forever) for this CQ's completion event; `Ok(false)` if
    /// none came. Events of other CQs and asynchronous events read meanwhile are kept for
    /// their own waiters (see [`crate::verbs::event`]).
    pub fn wait_event(&self, timeout: Option<Duration>) -> Result<bool> {
        let ctx = &self.shared.ctx;
        let wanted = Wanted::Completion(self.shared.handle);
        let event = ctx.wait_event(wanted, timeout)?;
        debug_assert!(matches!(event, None | Some(DeviceEvent::Completion { .. })));
        Ok(event.is_some())
    }
}

/// Checks the capacity a CREATE_CQ or RESIZE_CQ answered against the request and the ring.
fn check_capacity(opcode: Opcode, requested: u32, capacity: u32, ring: &RingDesc) -> Result<()> {
    if capacity < requested || capacity.checked_add(1) != Some(ring.num_slots.get()) {
        return Err(ProtocolError::ResponseValue {
            opcode,
            field: "cqe",
            value: capacity.into(),
        }
        .into());
    }
    Ok(())
}

/// Checks and wraps a CQ buffer the device mapped.
///
/// # Safety
///
/// As [`map_ring`]'s.
unsafe fn completion_queue(ctx: &ContextInner, desc: &RingDesc) -> Result<CompletionQueue> {
    // SAFETY: forwarded to the caller.
    let ring = unsafe { map_ring(ctx, desc) }?;
    Ok(CompletionQueue::new(ring).map_err(ProtocolError::Queue)?)
}

/// A batch poll of a [`Cq`] (see [`Cq::poll_batch`]). No allocation, no device involvement.
pub struct CqPollBatch<'a> {
    /// `None` after a failed resize: the batch then sees an empty CQ.
    queue: MutexGuard<'a, Option<CompletionQueue>>,
    /// Whether a completion was consumed, so the consumer index must be published.
    consumed: bool,
}

impl CqPollBatch<'_> {
    /// The oldest completion not consumed yet, or `None` when the CQ holds no more.
    pub fn peek(&mut self) -> Option<WorkCompletion> {
        self.queue.as_mut()?.peek()
    }

    /// Consumes the completion [`Self::peek`] returned; false if there was none.
    pub fn consume(&mut self) -> bool {
        let moved = self.queue.as_mut().is_some_and(CompletionQueue::skip);
        self.consumed |= moved;
        moved
    }
}

impl Drop for CqPollBatch<'_> {
    fn drop(&mut self) {
        if let (true, Some(queue)) = (self.consumed, self.queue.as_mut()) {
            queue.publish();
        }
    }
}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq")
            .field("handle", &self.shared.handle)
            .finish()
    }
}

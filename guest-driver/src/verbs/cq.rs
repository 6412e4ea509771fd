//! Completion queues.

use std::sync::Arc;
use std::time::Duration;

use log::warn;
use parking_lot::{Mutex, MutexGuard};
use vrdma_spec::control::{ControlRequest, Opcode, ResponseBody};
use vrdma_spec::verbs::arm_flags;
use vrdma_spec::wire::{ArmCqReq, CreateCqReq};
use vrdma_spec::Le32;

use super::command::{handle_req, nonzero_handle, unexpected_body};
use super::context::{Context, ContextInner};
use super::error::{ProtocolError, Result, VerbsError};
use super::event::{DeviceEvent, Wanted};
use super::ring::map_ring;
use crate::provider::rxe_v1::CompletionQueue;
use crate::provider::WorkCompletion;

/// A completion queue (`ibv_cq`) with its completion events.
///
/// Polling reads the native CQ directly (no device involvement, no allocation); the provider
/// queue lives in the `Cq` behind a lock of its own, so `Cq` can be shared between threads
/// and CQs never contend with each other. Destroyed when dropped and no QP uses it any more.
pub struct Cq {
    // Declared first: the mapping must not be used after DESTROY_CQ (`shared`'s drop).
    queue: Mutex<CompletionQueue>,
    pub(crate) shared: Arc<CqShared>,
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
        if !ctx.has_rxe_v1() {
            return Err(VerbsError::Unsupported(
                "CQs need the rxe v1 ring format, which was not negotiated",
            ));
        }
        if cqe == 0 {
            return Err(VerbsError::InvalidArgument("a CQ needs at least one entry"));
        }
        let req = ControlRequest::CreateCq(CreateCqReq {
            cqe: Le32::new(cqe),
            reserved: Le32::ZERO,
        });
        let ResponseBody::CreateCq(resp) = ctx.execute(&req)? else {
            return Err(unexpected_body(Opcode::CreateCq));
        };
        let handle = nonzero_handle(Opcode::CreateCq, resp.cq.get())?;
        ctx.events.register_cq(handle);
        // From here on, dropping `shared` (on any error below) destroys the CQ again.
        let shared = Arc::new(CqShared {
            ctx: ctx.clone(),
            handle,
        });
        let capacity = resp.cqe.get();
        if capacity < cqe || capacity.checked_add(1) != Some(resp.ring.num_slots.get()) {
            return Err(ProtocolError::ResponseValue {
                opcode: Opcode::CreateCq,
                field: "cqe",
                value: capacity.into(),
            }
            .into());
        }
        // SAFETY: DESTROY_CQ is sent by `shared`'s drop, after the queue (declared first in
        // `Cq`, or dropped on the error path before `shared`) is gone; the ring is wrapped once.
        let ring = unsafe { map_ring(ctx, &resp.ring) }?;
        let queue = CompletionQueue::new(ring).map_err(ProtocolError::Queue)?;
        Ok(Cq {
            queue: Mutex::new(queue),
            shared,
        })
    }

    /// The device's handle of this CQ (as found in [`DeviceEvent::Completion`]).
    pub fn handle(&self) -> u32 {
        self.shared.handle
    }

    /// How many completions the CQ holds.
    pub fn capacity(&self) -> u32 {
        self.queue.lock().capacity()
    }

    /// Moves up to `out.len()` completions, oldest first, into `out`; returns how many.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        self.queue.lock().poll(out)
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
        let event = ctx.events.wait(ctx.transport(), wanted, timeout)?;
        debug_assert!(matches!(event, None | Some(DeviceEvent::Completion { .. })));
        Ok(event.is_some())
    }
}

/// A batch poll of a [`Cq`] (see [`Cq::poll_batch`]). No allocation, no device involvement.
pub struct CqPollBatch<'a> {
    queue: MutexGuard<'a, CompletionQueue>,
    /// Whether a completion was consumed, so the consumer index must be published.
    consumed: bool,
}

impl CqPollBatch<'_> {
    /// The oldest completion not consumed yet, or `None` when the CQ holds no more.
    pub fn peek(&mut self) -> Option<WorkCompletion> {
        self.queue.peek()
    }

    /// Consumes the completion [`Self::peek`] returned; false if there was none.
    pub fn consume(&mut self) -> bool {
        let moved = self.queue.skip();
        self.consumed |= moved;
        moved
    }
}

impl Drop for CqPollBatch<'_> {
    fn drop(&mut self) {
        if self.consumed {
            self.queue.publish();
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

//! Send requests built piece by piece and published together, as rdma-core's `ibv_wr_*` API
//! builds them (`ibv_wr_start` .. `ibv_wr_complete`): an opcode call starts a request in the
//! next free slot, the setters (`ibv_wr_set_sge`, `_set_inline_data`, `_set_ud_addr`...) fill
//! its payload and destination, and publishing hands every request of the batch to the kernel
//! with one Release store of the producer index.
//!
//! Requests are written straight into their slots with the encoders `ibv_post_send` uses
//! ([`super::send`]) and checked with the same rules ([`SendQueue::check_shape`]) once complete.
//! The first refused request fails the batch, as in rdma-core's rxe provider: later calls are
//! ignored, and publishing reports the error and publishes nothing. Nothing allocates.

use std::mem::size_of;
use std::sync::atomic::Ordering;

use vrdma_spec::rxe_v1::RxeSendWqe;
use vrdma_spec::verbs::QpType;

use super::send::{
    put_dma, put_inline, put_operand, put_request, put_send_flags, put_sges, put_ud_dest,
    SendQueue, WqeShape,
};
use crate::provider::{PostError, SendFlags, SendWr, Sge, UdDest};

/// The state of one batch on a [`SendQueue`], from [`SendQueue::batch_begin`] to
/// [`SendQueue::batch_publish`] (or to being dropped: an aborted batch publishes nothing).
///
/// The caller keeps the queue to itself for the whole batch (the QP's send lock), so that no
/// other request takes the slots the batch fills.
#[derive(Debug)]
pub struct SendBatchState {
    /// The slot the next request goes into; the batch's requests occupy the slots from the
    /// queue's producer index up to it.
    next: u32,
    /// Requests of the batch completed (checked and written out).
    done: usize,
    /// The request the setters fill.
    current: Option<Building>,
    /// The first refusal: the index of the refused request in the batch, and why.
    error: Option<(usize, PostError)>,
}

/// A started request.
#[derive(Clone, Copy, Debug)]
struct Building {
    /// Its slot.
    index: u32,
    /// What the checks look at, as the setters left it.
    shape: WqeShape,
    /// End of its bytes in the slot.
    end: usize,
}

impl SendBatchState {
    /// The first refusal of the batch so far: the refused request's index and why.
    pub fn error(&self) -> Option<(usize, PostError)> {
        self.error
    }

    /// Records a refusal of the current request (the first one counts) and drops it.
    pub fn fail(&mut self, error: PostError) {
        if self.error.is_none() {
            self.error = Some((self.done, error));
        }
        self.current = None;
    }

    /// The request the setters fill, if the batch is still good; records [`PostError::NoRequest`]
    /// when there is none.
    fn current(&mut self) -> Option<Building> {
        if self.error.is_some() {
            return None;
        }
        if self.current.is_none() {
            self.fail(PostError::NoRequest);
        }
        self.current
    }
}

impl SendQueue {
    /// Starts a batch at the producer index.
    pub fn batch_begin(&self) -> SendBatchState {
        SendBatchState {
            next: self.producer,
            done: 0,
            current: None,
            error: None,
        }
    }

    /// Starts the next request of `batch`: `wr`'s id, opcode, flags, immediate data, remote
    /// operands, window bind and invalidated rkey (its `sg_list` and `ud` are not looked at:
    /// the setters give them). Until a
    /// setter gives one, its payload is empty. A full queue, an opcode the QP type lacks or
    /// inline data for an opcode that takes none refuses it.
    pub fn batch_add(&mut self, batch: &mut SendBatchState, wr: &SendWr<'_>) {
        self.batch_finish_current(batch);
        if batch.error.is_some() {
            return;
        }
        let index = batch.next;
        // Acquire: the kernel's last accesses to the slot it passed happen before the writes
        // below reuse it.
        if self.queue.next(index) == self.queue.load_consumer(Ordering::Acquire) {
            return batch.fail(PostError::QueueFull);
        }
        let qp_type = self.caps.qp_type;
        if !wr.opcode.valid_on(qp_type) {
            return batch.fail(PostError::OpcodeNotSupported {
                opcode: wr.opcode,
                qp_type,
            });
        }
        if wr.flags.contains(SendFlags::INLINE) && !wr.opcode.allows_inline() {
            return batch.fail(PostError::InlineNotAllowed(wr.opcode));
        }
        let request = SendWr {
            sg_list: &[],
            ud: None,
            ..*wr
        };
        // SAFETY: `index` is a free slot past the producer index (the queue is not full up to
        // it), which the kernel does not access until the batch is published.
        let mut entry = unsafe { self.queue.slot_writer(index) };
        put_request(&mut entry, &request);
        // ATOMIC_WRITE's operand is part of the request, a FLUSH's range is its length; other
        // payloads come from the setters.
        let length = wr.fixed_length().unwrap_or(0);
        put_dma(&mut entry, length as u32, 0);
        let end = if wr.opcode.wqe_operand_len() != 0 {
            put_operand(&mut entry, wr.compare_add)
        } else {
            size_of::<RxeSendWqe>()
        };
        batch.current = Some(Building {
            index,
            shape: WqeShape {
                opcode: wr.opcode,
                flags: wr.flags,
                num_sge: 0,
                length,
                has_ud_dest: false,
                remote_addr: wr.remote_addr,
                bind: wr.bind,
            },
            end,
        });
        batch.next = self.queue.next(index);
    }

    /// Makes `sges` the payload of the current request (`ibv_wr_set_sge`, `_set_sge_list`),
    /// replacing any payload given before; the request is no longer inline.
    pub fn batch_set_sges(&mut self, batch: &mut SendBatchState, sges: &[Sge]) {
        let Some(mut current) = batch.current() else {
            return;
        };
        if !current.shape.opcode.takes_sges() {
            return batch.fail(PostError::UnexpectedSges(current.shape.opcode));
        }
        if sges.len() > self.caps.max_sge as usize {
            return batch.fail(PostError::TooManySges {
                num: sges.len(),
                max: self.caps.max_sge,
            });
        }
        let length: u64 = sges.iter().map(|sge| u64::from(sge.length)).sum();
        let flags = without_inline(current.shape.flags);
        // SAFETY: the current request's slot, not published yet (see `batch_add`).
        let mut entry = unsafe { self.queue.slot_writer(current.index) };
        current.end = put_sges(&mut entry, sges);
        // A length past u32 is refused when the request completes; nothing is published then.
        put_dma(&mut entry, length as u32, sges.len() as u32);
        put_send_flags(&mut entry, flags);
        current.shape = WqeShape {
            flags,
            num_sge: sges.len(),
            length,
            ..current.shape
        };
        batch.current = Some(current);
    }

    /// Copies the bytes of `chunks` (start, length), one after the other, as the inline payload
    /// of the current request (`ibv_wr_set_inline_data`, `_set_inline_data_list`), replacing
    /// any payload given before; the request becomes inline. More than the queue's inline
    /// room, or an opcode that takes no local data, refuses it.
    ///
    /// # Safety
    /// Each chunk is readable memory of this process for the duration of the call.
    pub unsafe fn batch_set_inline(
        &mut self,
        batch: &mut SendBatchState,
        chunks: impl Iterator<Item = (*const u8, usize)> + Clone,
    ) {
        let Some(mut current) = batch.current() else {
            return;
        };
        if !current.shape.opcode.allows_inline() {
            return batch.fail(PostError::InlineNotAllowed(current.shape.opcode));
        }
        let length = chunks
            .clone()
            .fold(0u64, |sum, (_, len)| sum.saturating_add(len as u64));
        let max = self.caps.max_inline;
        if length > u64::from(max) {
            return batch.fail(PostError::InlineTooLong { len: length, max });
        }
        let flags = current.shape.flags | SendFlags::INLINE;
        // SAFETY: the current request's slot, not published yet (see `batch_add`).
        let mut entry = unsafe { self.queue.slot_writer(current.index) };
        // SAFETY: the caller's contract; the total fits the slot's inline room (checked).
        current.end = unsafe { put_inline(&mut entry, chunks) };
        put_dma(&mut entry, length as u32, 0);
        put_send_flags(&mut entry, flags);
        current.shape = WqeShape {
            flags,
            num_sge: 0,
            length,
            ..current.shape
        };
        batch.current = Some(current);
    }

    /// Sets the destination of the current request (`ibv_wr_set_ud_addr`); refused on a
    /// connected QP.
    pub fn batch_set_ud_dest(&mut self, batch: &mut SendBatchState, dest: &UdDest<'_>) {
        let Some(mut current) = batch.current() else {
            return;
        };
        if self.caps.qp_type != QpType::Ud {
            return batch.fail(PostError::UnexpectedUdDest);
        }
        // SAFETY: the current request's slot, not published yet (see `batch_add`).
        let mut entry = unsafe { self.queue.slot_writer(current.index) };
        put_ud_dest(&mut entry, dest);
        current.shape.has_ud_dest = true;
        batch.current = Some(current);
    }

    /// Completes the batch: `Ok(n)` when its `n` requests were all accepted and are now
    /// published (the caller rings the doorbell if `n > 0`); `Err((i, e))` when request `i`
    /// was refused for `e`, in which case nothing of the batch is published.
    pub fn batch_publish(
        &mut self,
        mut batch: SendBatchState,
    ) -> Result<usize, (usize, PostError)> {
        self.batch_finish_current(&mut batch);
        if let Some(error) = batch.error {
            return Err(error);
        }
        if batch.next != self.producer {
            // Release: the WQE writes of the batch become visible to the kernel before the
            // index that hands them over.
            self.queue.store_producer(batch.next, Ordering::Release);
            self.producer = batch.next;
        }
        Ok(batch.done)
    }

    /// Checks the current request with every rule `ibv_post_send` applies and completes it
    /// (an accessed queue's entry reaches its slot now).
    fn batch_finish_current(&mut self, batch: &mut SendBatchState) {
        let Some(current) = batch.current.take() else {
            return;
        };
        if let Err(e) = self.check_shape(&current.shape) {
            return batch.fail(e);
        }
        // SAFETY: the current request's slot, not published yet (see `batch_add`).
        let entry = unsafe { self.queue.slot_writer(current.index) };
        entry.commit(current.end);
        batch.done += 1;
    }
}

/// `flags` without [`SendFlags::INLINE`].
fn without_inline(flags: SendFlags) -> SendFlags {
    SendFlags::from_bits(flags.bits() & !SendFlags::INLINE.bits()).unwrap_or_default()
}

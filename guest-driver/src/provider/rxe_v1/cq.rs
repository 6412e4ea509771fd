//! Polling native rxe completions.

use std::mem::size_of;
use std::sync::atomic::Ordering;

use vrdma_spec::rxe_v1::IbUverbsWc;

use super::queue::RxeQueue;
use vrdma_spec::rxe_v1::GeometryError;
use vrdma_spec::verbs::{WcOpcode, WcStatus};

use crate::provider::{WcFlags, WorkCompletion};

/// A completion queue.
///
/// Polling needs no kernel call. Arming the CQ for an event is a control command and not
/// part of the data path.
#[derive(Debug)]
pub struct CompletionQueue {
    queue: RxeQueue,
    /// Next slot to read; the authoritative copy of the consumer index.
    consumer: u32,
}

impl CompletionQueue {
    /// A completion queue over `queue`, whose slots must hold a `struct ib_uverbs_wc`.
    pub fn new(queue: RxeQueue) -> Result<Self, GeometryError> {
        queue.check_entry(size_of::<IbUverbsWc>())?;
        let consumer = queue.load_consumer(Ordering::Relaxed);
        Ok(CompletionQueue { queue, consumer })
    }

    /// How many completions the queue holds at most.
    pub fn capacity(&self) -> u32 {
        self.queue.capacity()
    }

    /// Moves up to `out.len()` completions, oldest first, into `out`; returns how many.
    pub fn poll(&mut self, out: &mut [WorkCompletion]) -> usize {
        // Acquire: the kernel's CQE writes happen before the reads below. The value is masked,
        // so even a corrupted index only names slots of this queue.
        let producer = self.queue.load_producer(Ordering::Acquire);
        let mut consumer = self.consumer;
        let mut polled = 0;
        for wc in out.iter_mut() {
            if consumer == producer {
                break;
            }
            // SAFETY: the slot lies between the consumer and the producer index, so the kernel
            // finished writing it and will not touch it until the consumer passes it.
            let cqe: IbUverbsWc = unsafe { self.queue.read_slot(consumer) };
            *wc = completion(&cqe);
            consumer = self.queue.next(consumer);
            polled += 1;
        }
        if polled != 0 && !self.queue.still_mapped() {
            // The back-end was lost and the buffer replaced by zeroed memory: what was read
            // is not completions. The device reports the loss (DEVICE_FATAL); the CQ stays
            // empty meanwhile.
            return 0;
        }
        if polled != 0 {
            // Release: the CQE reads above complete before the kernel may reuse the slots.
            self.queue.store_consumer(consumer, Ordering::Release);
            self.consumer = consumer;
        }
        polled
    }

    /// The oldest completion not consumed yet (at the read cursor), without consuming it; `None`
    /// when the queue holds no more. For batch polling (`ibv_start_poll`): see [`Self::skip`]
    /// and [`Self::publish`].
    pub fn peek(&mut self) -> Option<WorkCompletion> {
        // Acquire: as in `poll`, the kernel's CQE writes happen before the read below.
        let producer = self.queue.load_producer(Ordering::Acquire);
        if self.consumer == producer {
            return None;
        }
        // SAFETY: the slot lies between the consumer and the producer index (see `poll`).
        let cqe: IbUverbsWc = unsafe { self.queue.read_slot(self.consumer) };
        // As in `poll`: a buffer replaced after a lost back-end holds no completions.
        self.queue.still_mapped().then(|| completion(&cqe))
    }

    /// Moves the read cursor past the completion [`Self::peek`] returned; false (and nothing
    /// moves) if the queue holds none. The kernel may reuse the slot only after
    /// [`Self::publish`].
    pub fn skip(&mut self) -> bool {
        if self.consumer == self.queue.load_producer(Ordering::Acquire)
            || !self.queue.still_mapped()
        {
            return false;
        }
        self.consumer = self.queue.next(self.consumer);
        true
    }

    /// Publishes the read cursor as the consumer index: the completions skipped so far are
    /// consumed.
    pub fn publish(&mut self) {
        // Release: the CQE reads of `peek` complete before the kernel may reuse the slots.
        self.queue.store_consumer(self.consumer, Ordering::Release);
    }
}

/// The kernel's `IB_WC_WITH_INVALIDATE`, which rxe writes into user CQEs as it is.
const KERNEL_WC_WITH_INVALIDATE: u32 = 1 << 2;

/// rxe's user CQEs carry the kernel's `ib_wc_flags`, which agree with ibverbs' on GRH and
/// WITH_IMM but put WITH_INVALIDATE at bit 2, ibverbs' IP_CSUM_OK (which rxe never reports):
/// moved to [`WcFlags::WITH_INV`]. Other bits stay as found.
fn wc_flags(raw: u32) -> WcFlags {
    let flags = if raw & KERNEL_WC_WITH_INVALIDATE != 0 {
        (raw & !KERNEL_WC_WITH_INVALIDATE) | WcFlags::WITH_INV.bits()
    } else {
        raw
    };
    WcFlags::from_bits_retain(flags)
}

/// Converts a native CQE; `imm_data` keeps its network byte order, as with rdma-core (for a
/// received SEND_WITH_INV it holds the invalidated rkey in host order).
fn completion(cqe: &IbUverbsWc) -> WorkCompletion {
    WorkCompletion {
        wr_id: cqe.wr_id.get(),
        status: WcStatus::from_raw(cqe.status.get()),
        opcode: WcOpcode::from_raw(cqe.opcode.get()),
        byte_len: cqe.byte_len.get(),
        imm_data: u32::from_ne_bytes(cqe.ex),
        qp_num: cqe.qp_num.get(),
        src_qp: cqe.src_qp.get(),
        wc_flags: wc_flags(cqe.wc_flags.get()),
        pkey_index: cqe.pkey_index.get(),
        slid: cqe.slid.get(),
        sl: cqe.sl,
        dlid_path_bits: cqe.dlid_path_bits,
        port_num: cqe.port_num,
        vendor_err: cqe.vendor_err.get(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_invalidate_flag_becomes_ibverbs_with_inv() {
        assert_eq!(wc_flags(0x1 | 0x4), WcFlags::GRH | WcFlags::WITH_INV);
        assert_eq!(wc_flags(0x3), WcFlags::GRH | WcFlags::WITH_IMM);
        assert_eq!(wc_flags(0x100), WcFlags::from_bits_retain(0x100));
    }
}

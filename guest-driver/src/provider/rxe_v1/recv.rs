//! Posting receive work requests as native rxe receive WQEs (QP receive queues and SRQs).

use std::mem::size_of;
use std::sync::atomic::Ordering;

use vrdma_spec::rxe_v1::{recv_wqe_size, RxeDmaInfo, RxeRecvWqe, RxeSge};
use vrdma_spec::{Le32, Le64};

use super::queue::RxeQueue;
use crate::provider::{PostError, RecvWr};
use vrdma_spec::rxe_v1::GeometryError;

/// The receive queue of a QP, or a shared receive queue (same format).
///
/// Posting a receive needs no kernel call: the kernel picks receive WQEs up when a message
/// arrives.
#[derive(Debug)]
pub struct RecvQueue {
    queue: RxeQueue,
    max_sge: u32,
    /// Next slot to fill; the authoritative copy of the producer index.
    producer: u32,
}

impl RecvQueue {
    /// A receive queue over `queue`, whose slots must hold `max_sge` SGEs.
    pub fn new(queue: RxeQueue, max_sge: u32) -> Result<Self, GeometryError> {
        queue.check_entry(recv_wqe_size(max_sge))?;
        let producer = queue.load_producer(Ordering::Relaxed);
        Ok(RecvQueue {
            queue,
            max_sge,
            producer,
        })
    }

    /// Most SGEs per request.
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// How many requests the queue holds at most.
    pub fn capacity(&self) -> u32 {
        self.queue.capacity()
    }

    /// Writes `wrs` into the queue in order, like `ibv_post_recv`. On error, `Err((n, e))`
    /// says that the first `n` requests were posted and request `n` was refused for `e`.
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<(), (usize, PostError)> {
        let mut result = Ok(());
        let mut producer = self.producer;
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = self.post_one(producer, wr) {
                result = Err((i, e));
                break;
            }
            producer = self.queue.next(producer);
        }
        if producer != self.producer {
            // Release: the WQE writes (in place, or each one `RegionAccess::write`) become
            // visible before the index that hands them over.
            self.queue.store_producer(producer, Ordering::Release);
            self.producer = producer;
        }
        result
    }

    /// Checks `wr` and writes it into slot `index`, without publishing it.
    fn post_one(&mut self, index: u32, wr: &RecvWr<'_>) -> Result<(), PostError> {
        if wr.sg_list.len() > self.max_sge as usize {
            return Err(PostError::TooManySges {
                num: wr.sg_list.len(),
                max: self.max_sge,
            });
        }
        let total: u64 = wr.sg_list.iter().map(|sge| u64::from(sge.length)).sum();
        let length = u32::try_from(total).map_err(|_| PostError::MessageTooLong(total))?;
        // Acquire: the kernel is done with the slot it passed before it is reused.
        if self.queue.next(index) == self.queue.load_consumer(Ordering::Acquire) {
            return Err(PostError::QueueFull);
        }

        let header = RxeRecvWqe {
            wr_id: Le64::new(wr.wr_id),
            reserved: Le32::ZERO,
            padding: Le32::ZERO,
            dma: RxeDmaInfo {
                length: Le32::new(length),
                resid: Le32::new(length),
                cur_sge: Le32::ZERO,
                num_sge: Le32::new(wr.sg_list.len() as u32),
                sge_offset: Le32::ZERO,
                reserved: Le32::ZERO,
            },
        };
        // SAFETY: `index` is the producer slot of a queue that is not full, so the kernel
        // does not access it until `post_recv` publishes the producer index.
        let mut entry = unsafe { self.queue.slot_writer(index) };
        entry.put(0, header);
        // `new` checked that the slot holds the WQE plus `max_sge` SGEs, which the check above
        // enforced.
        let mut end = size_of::<RxeRecvWqe>();
        for sge in wr.sg_list {
            let sge = RxeSge {
                addr: Le64::new(sge.addr),
                length: Le32::new(sge.length),
                lkey: Le32::new(sge.lkey),
            };
            entry.put(end, sge);
            end += size_of::<RxeSge>();
        }
        entry.commit(end);
        Ok(())
    }
}

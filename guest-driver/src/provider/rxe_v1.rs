//! Ring format "rxe v1": the native queues of Linux Soft-RoCE (`rdma_rxe`), as used by
//! rdma-core's `providers/rxe`.
//!
//! The layout of the queues (header, WQEs, CQEs) is [`vrdma_spec::rxe_v1`]'s; this module adds
//! what the provider does with it. Every SQ, RQ, SRQ and CQ is one kernel buffer: a 384-byte
//! header holding the slot geometry and the two indices, followed by a power-of-two number of
//! power-of-two sized slots. This
//! process owns the SQ/RQ/SRQ producer index and the CQ consumer index; the host kernel owns
//! the other two. The kernel keeps its own copy of the geometry and masks every index it reads,
//! and so does this module: the header is cross-checked once against what the device reported,
//! and every index read from shared memory is masked before it addresses a slot.
//!
//! Ordering follows `providers/rxe/rxe_queue.h`: a slot is filled (or read) with plain
//! accesses, then the new producer (or consumer) index is published with a Release store; the
//! other side's index is read with an Acquire load before a slot is reused (or read).
//!
//! A queue buffer is either mapped into this process (entries are written and read in place)
//! or reached through the transport's [`RegionAccess`](crate::transport::RegionAccess) when the
//! shared-memory region cannot be mapped (entries are built in a scratch slot and written with
//! one access; the indices go through the accessor's Acquire load and Release store). See
//! [`RxeQueue`].
//!
//! Posting needs no kernel call except for sends: the caller rings the send doorbell after
//! [`SendQueue::post_send`] posted at least one request, or [`SendQueue::batch_publish`]
//! published an `ibv_wr_*` batch.

mod ah;
mod cq;
mod queue;
mod recv;
mod send;
mod send_batch;

pub use ah::RxeAddressHandle;
pub use cq::CompletionQueue;
pub use queue::RxeQueue;
pub use recv::RecvQueue;
pub use send::{SendQueue, SendQueueCaps};
pub use send_batch::SendBatchState;

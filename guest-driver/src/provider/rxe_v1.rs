//! Ring format "rxe v1": the native queues of Linux Soft-RoCE (`rdma_rxe`), as used by
//! rdma-core's `providers/rxe`.
//!
//! Every SQ, RQ, SRQ and CQ is one kernel buffer: a 384-byte header holding the slot geometry
//! and the two indices, followed by a power-of-two number of power-of-two sized slots. This
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
//! [`SendQueue::post_send`] posted at least one request.

mod abi;
mod cq;
mod queue;
mod recv;
mod send;

pub use abi::{
    IbUverbsWc, RxeAtomicWr, RxeDmaInfo, RxeQueueBuf, RxeRdmaWr, RxeRecvWqe, RxeSendWqe, RxeSendWr,
    RxeSendWrUnion, RxeSge, RxeUdWr, RXE_AV_SIZE, WQE_STATE_POSTED,
};
pub use cq::CompletionQueue;
pub use queue::{QueueError, QueueGeometry, RxeQueue};
pub use recv::RecvQueue;
pub use send::{SendQueue, SendQueueCaps};

/// An address handle created on the device, as its CREATE_AH response describes it.
///
/// Kernels since 5.10 return a non-zero `ah_num` that a UD send names; older kernels return 0
/// and expect the address vector (`struct rxe_av`) copied into every UD send instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxeAddressHandle {
    /// The kernel's AH index, or 0 on kernels that want the address vector inline.
    pub ah_num: u32,
    /// Bytes of the kernel's `struct rxe_av` for this handle.
    pub av: [u8; RXE_AV_SIZE],
}

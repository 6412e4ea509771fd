//! Ring format "rxe v1": the native queue layout of Linux Soft-RoCE (`rdma_rxe`) on
//! little-endian 64-bit hosts, as defined by `include/uapi/rdma/rdma_user_rxe.h` and
//! `ib_user_verbs.h` (kernel 5.16 and later: `ah_num` in UD send WQEs).
//!
//! This is the one definition of that layout: the device sizes queue buffers with it, the
//! driver writes WQEs into them and reads CQEs from them through these types. Every queue
//! buffer is a [`header`] followed by power-of-two sized slots; offsets in the structs are
//! from the start of the buffer (header) or of one slot (WQE, CQE). The tests next to this
//! module compare every size and offset, and the opcode values written into WQEs and read
//! from CQEs, with the system's uapi headers.

mod av;
mod cqe;
mod geometry;
pub mod header;
pub mod kick;
mod wqe;

#[cfg(test)]
mod uapi_header_tests;

pub use av::RxeAv;
pub use cqe::{IbUverbsWc, CQE_SIZE};
pub use geometry::{
    num_slots_for, GeometryError, RingGeometry, FORMAT_ID, MAX_LOG2_SLOT_SIZE, MIN_LOG2_SLOT_SIZE,
};
pub use header::RxeQueueBuf;
pub use wqe::{
    recv_wqe_size, send_wqe_size, RxeAtomicWr, RxeDmaInfo, RxeFlushWr, RxeMwWr, RxeRdmaWr,
    RxeRecvWqe, RxeSendWqe, RxeSendWr, RxeSendWrUnion, RxeSge, RxeUdWr, SGE_SIZE, WQE_STATE_POSTED,
};

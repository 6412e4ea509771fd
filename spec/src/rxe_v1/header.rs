//! The queue-buffer header (`struct rxe_queue_buf` without its slots): the slot geometry the
//! host writes once, and the two indices, each alone in its cache line.

use core::mem::{offset_of, size_of};

use crate::Le32;

wire_struct! {
    /// `struct rxe_queue_buf` without its flexible `data` array, 384 bytes.
    pub struct RxeQueueBuf {
        /// log2 of the slot size (written once by the host).
        pub log2_elem_size: Le32,
        /// `num_slots - 1` (written once by the host).
        pub index_mask: Le32,
        /// Keeps the producer index in its own cache line.
        pub pad_1: [u8; 120],
        /// Producer index: the driver's for SQ/RQ/SRQ, the host's for a CQ.
        pub producer_index: Le32,
        /// Keeps the consumer index in its own cache line.
        pub pad_2: [u8; 124],
        /// Consumer index: the host's for SQ/RQ/SRQ, the driver's for a CQ.
        pub consumer_index: Le32,
        /// Pads the header to three cache lines.
        pub pad_3: [u8; 124],
    }
}
assert_layout!(RxeQueueBuf, 384, log2_elem_size @ 0, index_mask @ 4, producer_index @ 128,
    pad_2 @ 132, consumer_index @ 256, pad_3 @ 260);

/// Offset of `log2_elem_size`.
pub const LOG2_ELEM_SIZE: usize = offset_of!(RxeQueueBuf, log2_elem_size);
/// Offset of `index_mask`.
pub const INDEX_MASK: usize = offset_of!(RxeQueueBuf, index_mask);
/// Offset of `producer_index`.
pub const PRODUCER_INDEX: usize = offset_of!(RxeQueueBuf, producer_index);
/// Offset of `consumer_index`.
pub const CONSUMER_INDEX: usize = offset_of!(RxeQueueBuf, consumer_index);
/// Header size.
pub const SIZE: usize = size_of::<RxeQueueBuf>();
/// Offset of the first slot: right after the header.
pub const DATA: usize = SIZE;

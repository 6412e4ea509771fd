//! One rxe v1 queue buffer as the fake's kernel sees it: the header words and the slots.

use std::sync::atomic::{AtomicU32, Ordering};

use vrdma::spec::config::ring_format;
use vrdma::spec::wire::RingDesc;
use vrdma::spec::{Le32, Le64};

/// The kernel's view of one queue buffer in the region.
#[derive(Clone, Copy)]
pub(crate) struct Ring {
    pub(crate) offset: usize,
    pub(crate) map_len: usize,
    pub(crate) base: *mut u8,
    pub(crate) mask: u32,
    pub(crate) log2: u32,
}

impl Ring {
    pub(crate) fn word(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: header words lie in the mapped extent (mapped while the object lives), are
        // aligned, and both sides access them atomically.
        unsafe { AtomicU32::from_ptr(self.base.add(offset).cast()) }
    }

    pub(crate) fn producer(&self) -> &AtomicU32 {
        self.word(128)
    }

    pub(crate) fn consumer(&self) -> &AtomicU32 {
        self.word(256)
    }

    pub(crate) fn slot(&self, index: u32) -> *mut u8 {
        // SAFETY: a masked index names a slot inside the extent.
        unsafe {
            self.base
                .add(384 + (((index & self.mask) as usize) << self.log2))
        }
    }

    pub(crate) fn desc(&self) -> RingDesc {
        RingDesc {
            shm_offset: Le64::new(self.offset as u64),
            map_len: Le32::new(self.map_len as u32),
            num_slots: Le32::new(self.mask + 1),
            log2_slot_size: Le32::new(self.log2),
            format: Le32::new(ring_format::RXE_V1),
            db_offset: Le64::ZERO,
            db_len: Le32::ZERO,
            flags: Le32::ZERO,
        }
    }

    /// Next entry the consumer (the kernel, for SQ/RQ) would take, if any.
    pub(crate) fn peek(&self) -> Option<u32> {
        let c = self.consumer().load(Ordering::Relaxed) & self.mask;
        (self.producer().load(Ordering::Acquire) & self.mask != c).then_some(c)
    }

    pub(crate) fn pop(&self, index: u32) {
        self.consumer()
            .store((index + 1) & self.mask, Ordering::Release);
    }
}

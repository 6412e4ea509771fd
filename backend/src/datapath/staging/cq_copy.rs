//! Staged completion queues (spec §9.8): the device's copy of host completions into a CQ ring
//! of the guest's staging file.
//!
//! A CQ the front-end could not map (it holds only so many mappings, and rxe maps each host
//! buffer once) gets a staging ring with the host CQ's geometry in a shared chunk of the queue
//! region. The device keeps the host CQ armed: on each of its completion events it re-arms it,
//! then copies every new completion into the staging ring (slots first, then the staging
//! producer index with Release, then the host consumer index with Release, which gives the
//! host its slots back). The driver polls the staging ring exactly as a CQ (§9.4). The guest's
//! own arming (ARM_CQ) is the device's to honour: after a copy that moved completions, a
//! guest that armed gets its COMPLETION event. One copy of each completion (a slot), no
//! allocation.

use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::{Acquire, Release};
use std::sync::Arc;

use log::warn;
use vrdma_spec::rxe_v1::{self, header, GeometryError, RingGeometry};

use super::file::{SharedMapping, StagingExtent, StagingFile};
use crate::host::{CqHandle, HostContext};
use crate::memory::queue_region::ShmRange;

/// Where a staged CQ's ring is and what it looks like.
#[derive(Debug, Clone, Copy)]
pub struct StagedCqInit {
    /// The host CQ.
    pub host_cq: CqHandle,
    /// The staging ring's extent (region offset = staging-file offset).
    pub staging_range: ShmRange,
    /// The host CQ's geometry, which the staging ring shares.
    pub geometry: RingGeometry,
}

/// What one pump did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CqPump {
    /// Completions copied into the staging ring.
    pub copied: u32,
    /// Completions left in the host CQ because the staging ring was full (the guest has not
    /// polled what it was given: more completions outstanding than its CQ holds).
    pub left_behind: bool,
}

/// A staging ring in front of a host CQ.
pub struct StagedCq {
    host_cq: CqHandle,
    staging: StagingExtent,
    host_queue: SharedMapping,
    geometry: RingGeometry,
    /// Next host slot to copy: the host consumer index.
    host_position: u32,
    /// Next staging slot to fill: the staging producer index. The same as `host_position`
    /// until a resize carries completions over (both rings restart then, with different
    /// counts).
    staging_producer: u32,
    /// The guest armed the CQ and has not had its event yet.
    guest_armed: bool,
}

impl std::fmt::Debug for StagedCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagedCq")
            .field("host_cq", &self.host_cq)
            .field("staging_range", &self.staging.range())
            .field("geometry", &self.geometry)
            .field("host_position", &self.host_position)
            .field("staging_producer", &self.staging_producer)
            .field("guest_armed", &self.guest_armed)
            .finish_non_exhaustive()
    }
}

impl StagedCq {
    /// A staged CQ at `init.staging_range` of `staging` (whose header the caller initialised)
    /// in front of `host_queue` (the device's mapping of the host CQ's buffer).
    pub fn new(
        init: StagedCqInit,
        staging: Arc<StagingFile>,
        host_queue: SharedMapping,
    ) -> Result<Self, GeometryError> {
        let geometry = init.geometry;
        geometry.check_entry(rxe_v1::CQE_SIZE)?;
        geometry.check_len(host_queue.len())?;
        Ok(StagedCq {
            host_cq: init.host_cq,
            staging: StagingExtent::new(staging, init.staging_range, geometry)?,
            host_queue,
            geometry,
            host_position: 0,
            staging_producer: 0,
            guest_armed: false,
        })
    }

    fn staging_word(&self, at: usize) -> &AtomicU32 {
        self.staging.word(at)
    }

    fn host_word(&self, at: usize) -> &AtomicU32 {
        // `new` checked that the whole ring lies in the host mapping.
        self.host_queue
            .word(at)
            .expect("host header inside the host mapping")
    }

    /// Copies every completion the host produced since the last pump into the staging ring,
    /// as far as the guest left room, and publishes both indices.
    pub fn pump(&mut self) -> CqPump {
        // The kernel owns the host producer index, the guest the staging consumer index: both
        // are masked like any index read. A wild consumer index only loses the guest its own
        // completions (they wait in the host CQ, which then overflows as it would natively).
        let producer = self.host_producer();
        let guest_consumer = self.guest_consumer();
        let mut pumped = CqPump::default();
        while self.host_position != producer {
            let next = self.geometry.next(self.staging_producer);
            if next == guest_consumer {
                pumped.left_behind = true;
                break;
            }
            let src = self.host_slot(self.host_position);
            let dst = self.staging_slot(self.staging_producer);
            // SAFETY: both ranges lie in their mappings (checked in `new`) and do not overlap
            // (one is the kernel's buffer, the other the staging file). The kernel wrote the
            // source slot before publishing the producer index we loaded with Acquire, and
            // does not reuse it before the consumer index passes it (stored below, after the
            // copy); the guest reads the destination slot only after its Acquire load of the
            // staging producer index, stored with Release after this copy.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, self.geometry.slot_size()) };
            self.host_position = self.geometry.next(self.host_position);
            self.staging_producer = next;
            pumped.copied += 1;
        }
        if pumped.copied != 0 {
            self.staging_word(header::PRODUCER_INDEX)
                .store(self.staging_producer, Release);
            self.host_word(header::CONSUMER_INDEX)
                .store(self.host_position, Release);
        }
        pumped
    }

    fn host_slot(&self, index: u32) -> *mut u8 {
        self.host_queue
            .range(self.geometry.slot_offset(index), self.geometry.slot_size())
            .expect("host slot inside the host mapping")
    }

    fn staging_slot(&self, index: u32) -> *mut u8 {
        self.staging
            .bytes(self.geometry.slot_offset(index), self.geometry.slot_size())
    }

    /// The kernel's producer index in the host CQ, masked like any index read.
    fn host_producer(&self) -> u32 {
        self.geometry
            .mask(self.host_word(header::PRODUCER_INDEX).load(Acquire))
    }

    /// Completions the guest has not consumed in the staging ring, and completions the host
    /// holds that were not copied yet (RESIZE_CQ's check that the new size holds them).
    pub fn pending(&self) -> (u32, u32) {
        (
            self.unconsumed_after(self.guest_consumer()),
            self.geometry
                .count(self.host_producer(), self.host_position),
        )
    }

    /// The guest's consumer index in the staging ring, masked like any index read.
    fn guest_consumer(&self) -> u32 {
        self.geometry
            .mask(self.staging_word(header::CONSUMER_INDEX).load(Acquire))
    }

    /// Completions in the staging ring past the guest's consumer index `guest_consumer`.
    fn unconsumed_after(&self, guest_consumer: u32) -> u32 {
        self.geometry.count(self.staging_producer, guest_consumer)
    }

    /// RESIZE_CQ: takes over from `old` (the same CQ before the host resized it): the
    /// completions the guest had not consumed in the old staging ring are copied into this
    /// one's first slots, in order, then what the host carried over into its new buffer is
    /// copied after them, and the guest's arm stays. RESIZE_CQ checked that the new size
    /// holds them all; only a guest that polled during the resize (which it must not) can
    /// lose what then no longer fits.
    pub fn take_over(&mut self, old: &StagedCq) {
        // One read of the guest's index: the count and the slots copied must agree.
        let guest_consumer = old.guest_consumer();
        let carried = old
            .unconsumed_after(guest_consumer)
            .min(self.geometry.capacity());
        let len = self.geometry.slot_size().min(old.geometry.slot_size());
        for i in 0..carried {
            let src = old.staging_slot(guest_consumer.wrapping_add(i));
            let dst = self.staging_slot(i);
            // SAFETY: both slots lie in the staging mapping (checked in `new` of each ring),
            // in two different extents of the region (the old ring is released only after
            // this); `len` is at most either slot. The guest does not poll during a resize
            // (spec §7.4 RESIZE_CQ), and reads the new ring only after the producer index
            // stored below with Release.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        }
        self.staging_producer = carried;
        self.staging_word(header::PRODUCER_INDEX)
            .store(carried, Release);
        self.guest_armed = old.guest_armed;
        self.pump();
    }

    /// The host CQ's completion event: re-arms the host CQ (so that a completion after the
    /// copy raises the next event), copies, and returns whether the guest gets its own
    /// COMPLETION event (it armed, and completions were copied).
    pub fn on_host_event(&mut self, host: &dyn HostContext) -> bool {
        if let Err(e) = self.arm_host(host) {
            warn!("re-arming host CQ {} failed: {e}", self.host_cq);
        }
        let pumped = self.pump();
        if pumped.left_behind {
            log::debug!(
                "staged CQ of host CQ {}: the guest's ring is full, completions wait",
                self.host_cq
            );
        }
        pumped.copied != 0 && std::mem::take(&mut self.guest_armed)
    }

    /// ARM_CQ: copies what the host holds (so that the guest's poll after arming sees it, as
    /// with a host CQ), then arms: the next copy that moves completions raises the guest's
    /// event. A solicited-only arm is treated as a plain one: the device cannot tell solicited
    /// completions from the others (spec §9.8).
    pub fn arm_guest(&mut self) {
        self.pump();
        self.guest_armed = true;
    }

    /// Arms the host CQ for any next completion.
    pub fn arm_host(&self, host: &dyn HostContext) -> crate::host::Result<()> {
        host.req_notify_cq(self.host_cq, false)
    }
}

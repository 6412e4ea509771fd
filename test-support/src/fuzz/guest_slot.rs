//! One fuzzed guest ([`Slot`]): its device on the fake host, what its driver was told (handles,
//! doorbell indices, the doorbell area), and the steps that reach the device other than
//! through control commands: doorbells, host events and memory-table changes.

use std::collections::HashMap;

use vm_memory::{Bytes, FileOffset, GuestAddress, GuestAddressSpace, GuestMemoryMmap};
use vrdma_backend::guest_device::GuestDeviceFactory;
use vrdma_backend::resources::kind::ResourceKind;
use vrdma_backend::vhost_device::handler::DeviceHandler;
use vrdma_host::{AsyncEvent, AsyncEventKind, CompEvent};
use vrdma_spec::doorbell::{area_bytes, HEAD_WORD, RING_WORD, TAIL_WORD};
use vrdma_spec::wire::RingDesc;

use super::bytes::ByteReader;
use super::invariants::{check_cm_released, check_released, kind_index, KINDS};
use crate::fake_host::device::{memfd, FakeDevice};
use crate::fake_host::harness::{TestGuest, RAM_BASE, RAM_SIZE};

/// Handles remembered per guest and kind.
pub(super) const REMEMBERED: usize = 16;

/// One guest and what its driver learnt.
pub(super) struct Slot {
    pub(super) guest: TestGuest,
    /// Its host context on the fake device.
    pub(super) context: u64,
    /// Handles it was given, by kind (live or not).
    pub(super) seen: [Vec<u32>; KINDS.len()],
    /// Doorbell indices of its QPs.
    pub(super) doorbell_indices: Vec<u32>,
    /// Where it last put its doorbell area.
    pub(super) area: Option<u64>,
    /// QP numbers of its QPs (live or not).
    pub(super) qpns: Vec<u32>,
    /// Its UD QPs with staging rings (live or not).
    pub(super) staged: Vec<StagedQp>,
    /// The staging rings of its staged CQs (spec §9.8; live or not).
    pub(super) staged_cqs: Vec<RingDesc>,
    /// Its QPs with their wire type (live or not), for CM commands that need one of a type.
    pub(super) typed_qps: Vec<(u32, u8)>,
    /// The fake CM's file its device opened (0: the device has no CM).
    pub(super) cm_file: u64,
    /// CM id handles it was given: CM_CREATE_ID answers and CONNECT_REQUEST events.
    pub(super) cm_ids: Vec<u32>,
    /// Events CM_GET_EVENT delivered per id it knows, as CM_DESTROY_ID must count them
    /// (handles are not reused within one device, so entries of gone ids can stay).
    pub(super) cm_delivered: HashMap<u32, u32>,
}

/// A UD QP whose send queue is a staging ring, as its CREATE_QP response described it.
#[derive(Debug, Clone, Copy)]
pub(super) struct StagedQp {
    /// Guest handle.
    pub(super) handle: u32,
    /// QP number (to tell a later QP that reuses the handle apart).
    pub(super) qpn: u32,
    /// The staging ring of its send queue.
    pub(super) sq: RingDesc,
    /// The staging ring of its receive queue (an RC or UC QP with staged queues, spec §9.7),
    /// all zero if it has none.
    pub(super) rq: RingDesc,
    /// The QP's doorbell slot.
    pub(super) doorbell_index: u32,
    /// The producer index the guest last wrote, in the send and in the receive ring.
    pub(super) producer: u32,
    pub(super) rq_producer: u32,
}

impl Slot {
    pub(super) fn new(fake: &FakeDevice, factory: &GuestDeviceFactory, features: u64) -> Slot {
        let guest = TestGuest::from_factory(factory, features);
        let w = fake.world();
        Slot {
            guest,
            context: w.ownership.contexts_opened(),
            seen: Default::default(),
            doorbell_indices: Vec::new(),
            area: None,
            qpns: Vec::new(),
            staged: Vec::new(),
            staged_cqs: Vec::new(),
            typed_qps: Vec::new(),
            cm_file: if w.cm.enabled { w.cm.last_file() } else { 0 },
            cm_ids: Vec::new(),
            cm_delivered: HashMap::new(),
        }
    }

    /// Remembers `value` in `list`, forgetting the oldest beyond [`REMEMBERED`].
    pub(super) fn keep<T>(list: &mut Vec<T>, value: T) {
        if list.len() == REMEMBERED {
            list.remove(0);
        }
        list.push(value);
    }

    pub(super) fn remember(&mut self, kind: ResourceKind, handle: u32) {
        let seen = &mut self.seen[kind_index(kind)];
        if seen.len() == REMEMBERED {
            seen.remove(0);
        }
        seen.push(handle);
    }
    /// Writes doorbells (and now and then garbage) into the guest's doorbell area and
    /// notifies the doorbell queue.
    pub(super) fn doorbells(&self, r: &mut ByteReader<'_>) {
        let slots = self.guest.dev().options().doorbell_slots();
        if let Some(area) = self.area {
            for _ in 0..r.below(6) {
                let index = if !self.doorbell_indices.is_empty() && r.chance(80) {
                    r.pick(&self.doorbell_indices)
                } else {
                    r.u32() % (slots + 2)
                };
                self.ring(index);
            }
            let memory = self.guest.memory.memory();
            let word = |i: usize| GuestAddress(area.wrapping_add(4 * i as u64));
            if r.chance(10) {
                let _ = memory.write_obj(r.u32(), word(TAIL_WORD));
            }
            if r.chance(10) {
                let at = r.below((area_bytes(slots) / 4) as u32) as usize;
                let _ = memory.write_obj(r.u32(), word(at));
            }
            if r.chance(5) {
                let _ = memory.write_obj(r.u32(), word(HEAD_WORD));
            }
        }
        let chain = if r.chance(90) {
            Vec::new()
        } else {
            r.bytes(64)
        };
        self.guest.dev().doorbell(self.guest.guest_io(), &chain);
    }

    /// Rings doorbell slot `index` in the doorbell area as a driver does: the slot's pending
    /// flag, then the index in the next ring entry, then the tail (no notification).
    pub(super) fn ring(&self, index: u32) {
        let Some(area) = self.area else { return };
        let slots = self.guest.dev().options().doorbell_slots();
        let memory = self.guest.memory.memory();
        let word = |i: usize| GuestAddress(area.wrapping_add(4 * i as u64));
        // Errors: the area may no longer be guest RAM after a memory change.
        let tail: u32 = memory.read_obj(word(TAIL_WORD)).unwrap_or(0);
        let _ = memory.write_obj(1u32, word(RING_WORD + (slots + index % slots) as usize));
        let _ = memory.write_obj(
            index.wrapping_add(1),
            word(RING_WORD + (tail % slots) as usize),
        );
        let _ = memory.write_obj(tail.wrapping_add(1), word(TAIL_WORD));
    }

    /// Queues host events naming the guest's objects (or others, or nothing) and lets the
    /// guest's device read them.
    pub(super) fn host_events(&self, fake: &FakeDevice, r: &mut ByteReader<'_>) {
        let context = self.context;
        let user_handle = |r: &mut ByteReader<'_>, kind: ResourceKind| -> u64 {
            let w = fake.world();
            let own: Vec<u64> = match kind {
                ResourceKind::Cq => w
                    .cqs
                    .iter()
                    .filter(|(h, _)| w.ownership.owner(**h) == Some(context))
                    .map(|(_, &u)| u)
                    .collect(),
                ResourceKind::Qp => w
                    .qps
                    .iter()
                    .filter(|(h, _)| w.ownership.owner(**h) == Some(context))
                    .map(|(_, &(_, u))| u)
                    .collect(),
                _ => w
                    .srqs
                    .iter()
                    .filter(|(h, _)| w.ownership.owner(**h) == Some(context))
                    .map(|(_, &u)| u)
                    .collect(),
            };
            drop(w);
            if !own.is_empty() && r.chance(80) {
                r.pick(&own)
            } else {
                u64::from(r.below(16))
            }
        };
        if r.chance(50) {
            let cq_user_handle = user_handle(r, ResourceKind::Cq);
            // The host completes work on that CQ first (for a staged one, what the device
            // copies), and the guest moves a staged CQ's consumer index as it likes.
            let host_cq = fake
                .world()
                .cqs
                .iter()
                .find(|(_, &u)| u == cq_user_handle)
                .map(|(&h, _)| h);
            if let Some(host_cq) = host_cq.filter(|_| r.chance(70)) {
                for _ in 0..r.below(5) {
                    let cqe = r.bytes(48);
                    fake.world().post_completion(host_cq, &cqe);
                }
            }
            if !self.staged_cqs.is_empty() && r.chance(40) {
                let ring = r.pick(&self.staged_cqs);
                let at = ring.shm_offset.get() + vrdma_spec::rxe_v1::header::CONSUMER_INDEX as u64;
                // Wherever the front-end still maps it (its chunk may hold other rings now,
                // or the place may be free: a guest may write there too).
                let mapped = self.guest.frontend.mapped();
                if mapped
                    .iter()
                    .any(|&(offset, len)| offset <= at && at + 4 <= offset + len)
                {
                    let consumer = if r.chance(80) { r.below(64) } else { r.u32() };
                    self.guest.frontend.write(at, &consumer.to_le_bytes());
                }
            }
            fake.world()
                .comp_events
                .push_back(CompEvent { cq_user_handle });
            let guest = &self.guest;
            guest.dev().fd_ready(guest.guest_io(), 0);
        } else {
            use AsyncEventKind::*;
            let kind = r.pick(&[
                CqErr,
                QpFatal,
                QpReqErr,
                QpAccessErr,
                CommEst,
                SqDrained,
                PathMig,
                PathMigErr,
                PortActive,
                PortErr,
                LidChange,
                PkeyChange,
                SmChange,
                SrqErr,
                SrqLimitReached,
                QpLastWqeReached,
                ClientReregister,
                GidChange,
                WqFatal,
                Other(99),
                DeviceFatal,
            ]);
            if kind == DeviceFatal && r.chance(70) {
                return;
            }
            let element = match kind {
                CqErr => user_handle(r, ResourceKind::Cq),
                SrqErr | SrqLimitReached => user_handle(r, ResourceKind::Srq),
                PortActive | PortErr | LidChange | PkeyChange | SmChange | ClientReregister
                | GidChange | DeviceFatal => u64::from(r.below(3)),
                _ => user_handle(r, ResourceKind::Qp),
            };
            fake.world()
                .async_events
                .push_back(AsyncEvent { kind, element });
            let guest = &self.guest;
            guest.dev().fd_ready(guest.guest_io(), 1);
            if kind == DeviceFatal {
                check_released(fake, context);
                check_cm_released(fake, self.cm_file);
            }
        }
        if r.chance(5) {
            let guest = &self.guest;
            guest
                .dev()
                .fd_ready(guest.guest_io(), 2 + r.below(4) as usize);
        }
    }

    /// Replaces the guest's memory table: the same RAM again, part of it, other memory, or
    /// the RAM at another address.
    pub(super) fn change_memory(&self, r: &mut ByteReader<'_>) {
        let guest = &self.guest;
        let other;
        let (file, base, size) = match r.below(4) {
            0 => (&guest.ram, RAM_BASE, RAM_SIZE),
            1 => (&guest.ram, RAM_BASE, RAM_SIZE / 2),
            2 => {
                other = memfd(RAM_SIZE);
                (&other, RAM_BASE, RAM_SIZE)
            }
            _ => (&guest.ram, RAM_BASE + RAM_SIZE, RAM_SIZE),
        };
        let memory = GuestMemoryMmap::from_ranges_with_files([(
            GuestAddress(base),
            size as usize,
            Some(FileOffset::new(file.try_clone().expect("dup"), 0)),
        )])
        .expect("guest memory");
        guest.memory.lock().expect("memory lock").replace(memory);
        guest.dev().memory_changed(guest.guest_io());
    }
}

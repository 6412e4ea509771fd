//! Whole command sequences against two guests of one factory on the fake host device.
//!
//! [`run_handler_sequence`] decodes its input into steps: every control opcode with fuzzed
//! but plausible bodies ([`requests`](super::requests); handles come mostly from what the guest was given
//! before, sometimes from the other guest or from nowhere), doorbells written into the
//! doorbell area, host completion and asynchronous events, memory-table changes, failures of
//! the next host command, device resets, DISCARD_STATE and disconnects; the connection
//! manager's commands and event pump, and whole connections between the two guests
//! ([`cm`]). After every step the [`invariants`](super::invariants) and the
//! [`CM invariants`](super::cm_invariants) must hold for both guests.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use vrdma_backend::guest::options::DeviceOptions;
use vrdma_backend::resources::kind::ResourceKind;
use vrdma_backend::vhost_device::handler::DeviceHandler;
use vrdma_spec::control::{HEADER_SIZE, MAX_CM_RESPONSE_SIZE, MAX_RESPONSE_SIZE};
use vrdma_spec::features::{
    VIRTIO_F_VERSION_1, VRDMA_F_CM, VRDMA_F_CM_EVENT_INLINE, VRDMA_F_CM_MOVES_QP, VRDMA_F_MW,
};
use vrdma_spec::wire::{ring_flags, CreateCqResp, CreateQpResp, ResizeCqResp, RingDesc};
use vrdma_spec::{ControlResponse, Opcode, Status};
use zerocopy::{FromBytes, FromZeros};

use super::bytes::ByteReader;
use super::cm_invariants::check_cm;
use super::guest_slot::Slot;
use super::invariants::{
    check_cm_closed, check_cm_released, check_guest, check_isolation, check_released, kind_index,
    KINDS,
};
use super::requests::{self, Aims};
use super::staged_sends::{check_forwarded, Targets};
use super::tenancy::{destinations, Daemon};
use crate::fake_host::device::FakeDevice;
use crate::fake_host::harness::{test_options, ALL_FEATURES};

mod cm;
mod set_up;
#[cfg(test)]
mod tests;

/// Steps one input runs at most (inputs are truncated to this).
pub const MAX_STEPS: usize = 64;

/// Host commands a step may make fail once (the creations and changes: a failed destroy leaves
/// a host object the guest can no longer name, which `fail_destroys` opts into).
const FAILING_COMMANDS: [&str; 9] = [
    "ALLOC_PD",
    "REG_MR",
    "ALLOC_MW",
    "CREATE_CQ",
    "RESIZE_CQ",
    "CREATE_QP",
    "MODIFY_QP",
    "CREATE_SRQ",
    "CREATE_AH",
];
/// [`FAILING_COMMANDS`] and the host CM's commands that can fail.
const FAILING_WITH_CM: [&str; 14] = [
    "ALLOC_PD",
    "REG_MR",
    "ALLOC_MW",
    "CREATE_CQ",
    "RESIZE_CQ",
    "CREATE_QP",
    "MODIFY_QP",
    "CREATE_SRQ",
    "CREATE_AH",
    "CM_CREATE_ID",
    "CM_BIND",
    "CM_CONNECT",
    "CM_ACCEPT",
    "CM_INIT_QP_ATTR",
];
const FAILING_DESTROYS: [&str; 6] = [
    "DEALLOC_PD",
    "DEREG_MR",
    "DEALLOC_MW",
    "DESTROY_CQ",
    "DESTROY_QP",
    "DESTROY_SRQ",
];

/// What a run may do besides the default.
#[derive(Debug, Clone, Copy, Default)]
pub struct SequenceConfig {
    /// Also fail host destroy commands (DEREG_MR, DESTROY_QP, ...).
    pub fail_destroys: bool,
    /// Read inputs as before the connection manager's steps existed: no host CM, no
    /// `VRDMA_F_CM`, the old step choices. Inputs found then replay exactly.
    pub without_cm: bool,
}

/// The options of the fuzzed guests: the small quotas of the tests, every feature offered,
/// no doorbell polling (a step must not wait).
pub fn fuzz_options() -> DeviceOptions {
    DeviceOptions {
        allow_ud: true,
        allow_memory_windows: true,
        doorbell_poll: Duration::ZERO,
        ..test_options()
    }
}

/// Every feature a fuzzed driver may accept (but the connection manager).
const FEATURES: u64 = ALL_FEATURES | VRDMA_F_MW;
/// The step kinds besides the CM's.
const STEPS: u32 = 36;

/// What a run did: successful commands by opcode, and steps run.
#[derive(Debug, Default)]
pub struct SequenceStats {
    /// Successful commands by opcode.
    pub ok: std::collections::BTreeMap<u16, usize>,
    /// Steps run.
    pub steps: usize,
    /// Connections set up (RC/UC paths and destinations given to the host) and checked.
    pub connections: usize,
    /// Staged UD WQEs found in host send queues and checked, and how many were neutralised.
    pub staged_wqes: (usize, usize),
    /// CM events delivered (by CM_GET_EVENT or whole in an event buffer), by rdma_cm event
    /// number.
    pub cm_events: BTreeMap<u32, usize>,
    /// Of those, how many came whole in an event buffer (`VRDMA_F_CM_EVENT_INLINE`).
    pub cm_events_inline: usize,
}

impl SequenceStats {
    /// Adds what another run did.
    pub fn add(&mut self, other: SequenceStats) {
        for (op, n) in other.ok {
            *self.ok.entry(op).or_default() += n;
        }
        for (event, n) in other.cm_events {
            *self.cm_events.entry(event).or_default() += n;
        }
        self.steps += other.steps;
        self.cm_events_inline += other.cm_events_inline;
        self.connections += other.connections;
        self.staged_wqes.0 += other.staged_wqes.0;
        self.staged_wqes.1 += other.staged_wqes.1;
    }
}

/// The state of one run.
struct Sequence {
    fake: Arc<FakeDevice>,
    daemon: Daemon,
    slots: [Slot; 2],
    /// Host QP to the next index of its send queue to check.
    cursors: HashMap<u32, u32>,
    config: SequenceConfig,
    /// What the guests' drivers accept.
    features: u64,
    /// Every fake CM file the guests' devices opened, with their slot.
    cm_files: BTreeMap<u64, usize>,
    stats: SequenceStats,
}

/// Runs the steps `data` encodes against two fresh guests; panics when an invariant breaks.
pub fn run_handler_sequence(data: &[u8]) {
    run_handler_sequence_with(data, SequenceConfig::default());
}

/// [`run_handler_sequence`] with `config`.
pub fn run_handler_sequence_with(data: &[u8], config: SequenceConfig) -> SequenceStats {
    let mut r = ByteReader::new(data);
    // Bits 0 and 1: set-up steps for each guest; the rest: the daemon's shape.
    let prologue = r.u8();
    let fake = FakeDevice::new();
    fake.world().cm.enabled = !config.without_cm;
    let features = if config.without_cm {
        FEATURES
    } else {
        FEATURES | VRDMA_F_CM | VRDMA_F_CM_MOVES_QP | VRDMA_F_CM_EVENT_INLINE
    };
    let daemon = Daemon::new(&fake, &fuzz_options(), prologue >> 2);
    let slots = [0, 1].map(|g| Slot::new(&fake, &daemon.factories[g], features));
    let cm_files = slots
        .iter()
        .enumerate()
        .map(|(g, s)| (s.cm_file, g))
        .collect();
    let mut seq = Sequence {
        fake,
        daemon,
        slots,
        cursors: HashMap::new(),
        config,
        features,
        cm_files,
        stats: SequenceStats::default(),
    };
    for g in 0..2 {
        if prologue & (1 << g) != 0 {
            seq.set_up(g, &mut r);
        }
    }
    seq.check();
    for _ in 0..MAX_STEPS {
        if r.is_empty() {
            break;
        }
        let g = usize::from(r.u8() & 1);
        seq.step(g, &mut r);
        seq.check();
        seq.stats.steps += 1;
    }
    // Disconnecting both guests leaves nothing on the host.
    let [a, b] = seq.slots;
    let released = [(a.context, a.cm_file), (b.context, b.cm_file)];
    drop((a, b));
    for (context, file) in released {
        check_released(&seq.fake, context);
        check_cm_closed(&seq.fake, file);
    }
    check_isolation(&seq.fake);
    assert_eq!(seq.fake.world().live(), 0, "host objects without a guest");
    let w = seq.fake.world();
    let (cm_left, foreign) = (w.cm.ids.len(), w.cm.foreign_ids.clone());
    drop(w);
    assert_eq!(cm_left, 0, "host CM ids without a guest");
    assert!(foreign.is_empty(), "foreign CM ids named: {foreign:?}");
    seq.stats
}

impl Sequence {
    fn check(&mut self) {
        check_isolation(&self.fake);
        for slot in &self.slots {
            check_guest(&self.fake, &slot.guest, slot.context);
        }
        self.daemon.check(&self.fake, &self.slots);
        check_cm(&self.fake, &self.daemon, &self.slots, &self.cm_files);
        let (wqes, neutralised) =
            check_forwarded(&self.fake, &self.daemon, &self.slots, &mut self.cursors);
        self.stats.staged_wqes.0 += wqes;
        self.stats.staged_wqes.1 += neutralised;
        let held: usize = self
            .slots
            .iter()
            .map(|s| {
                let c = s.guest.dev().object_counts();
                c.pds + c.cqs + c.qps + c.srqs + c.ahs + c.mws
            })
            .sum::<usize>()
            + self
                .slots
                .iter()
                .map(|s| {
                    let inventory = s.guest.dev().inventory();
                    let mrs = inventory.of(ResourceKind::Mr);
                    // Destroyed AHs the host keeps for forwarded UD sends are the guest's too.
                    mrs.filter(|o| o.host.is_some()).count() + inventory.lingering_ahs.len()
                })
                .sum::<usize>();
        assert_eq!(held, self.fake.world().live(), "host objects nobody holds");
    }

    /// A handle of `kind` for guest `g` to name.
    fn handle(&self, g: usize, kind: ResourceKind, r: &mut ByteReader<'_>) -> u32 {
        let own = &self.slots[g].seen[kind_index(kind)];
        let other = &self.slots[1 - g].seen[kind_index(kind)];
        match r.below(16) {
            0..=10 if !own.is_empty() => r.pick(own),
            11..=12 if !other.is_empty() => r.pick(other),
            13 => {
                let any = &self.slots[g].seen[r.below(KINDS.len() as u32) as usize];
                if any.is_empty() {
                    0
                } else {
                    r.pick(any)
                }
            }
            14 => r.u32(),
            _ => r.below(4),
        }
    }

    /// Runs `request` on guest `g` (with a response buffer that is usually large enough) and
    /// returns the response when it succeeded.
    fn run(&mut self, g: usize, request: &[u8], r: &mut ByteReader<'_>) -> Option<Vec<u8>> {
        let capacity = if self.config.without_cm {
            if r.chance(95) {
                MAX_RESPONSE_SIZE
            } else {
                r.below(200) as usize
            }
        } else if r.chance(95) {
            MAX_CM_RESPONSE_SIZE
        } else {
            r.below(MAX_CM_RESPONSE_SIZE as u32 + 8) as usize
        };
        let response = self.slots[g].guest.raw(request, capacity);
        self.stats.connections += self.daemon.check_given(&self.fake, &self.slots);
        let guest = &self.slots[g].guest;
        if capacity < HEADER_SIZE {
            // The device executes nothing and answers nothing; a request too large to be read
            // is rejected by the plumbing, whose answer the virtqueue truncates.
            if request.len() <= guest.dev().max_request_size() {
                assert!(response.is_empty(), "a response without room for a status");
            }
            return None;
        }
        let status = u32::from_le_bytes(response[..4].try_into().unwrap());
        assert!(Status::try_from(status).is_ok(), "status {status:#x}");
        let op = Opcode::ALL.into_iter().find(|&op| {
            request.len() >= 2 && op as u16 == u16::from_le_bytes([request[0], request[1]])
        });
        if let Some(op) = op {
            if status == 0 {
                *self.stats.ok.entry(op as u16).or_default() += 1;
                assert!(
                    matches!(
                        ControlResponse::decode(op, &response),
                        Ok(ControlResponse::Ok(_))
                    ),
                    "{op:?}: a success response that does not decode: {response:?}"
                );
                self.observe_cm(g, op, request, &response);
            }
        }
        (status == 0).then_some(response)
    }

    /// Runs a creation and remembers the handle its response carries in its first word.
    fn create(
        &mut self,
        g: usize,
        kind: ResourceKind,
        request: &[u8],
        r: &mut ByteReader<'_>,
    ) -> Option<Vec<u8>> {
        let response = self.run(g, request, r)?;
        let handle = u32::from_le_bytes(response[HEADER_SIZE..HEADER_SIZE + 4].try_into().unwrap());
        self.slots[g].remember(kind, handle);
        Some(response)
    }

    /// Remembers the ring of a CREATE_CQ or RESIZE_CQ `response` (read by `ring`) if it is
    /// a staging ring (spec §9.8), for the guest's writes of its consumer index.
    fn remember_staged_cq(
        &mut self,
        g: usize,
        response: Option<&[u8]>,
        ring: impl Fn(&[u8]) -> Option<RingDesc>,
    ) {
        let staged = response
            .and_then(|response| ring(response.get(HEADER_SIZE..)?))
            .filter(|ring| ring.flags.get() & ring_flags::STAGED != 0);
        if let Some(ring) = staged {
            Slot::keep(&mut self.slots[g].staged_cqs, ring);
        }
    }

    fn step(&mut self, g: usize, r: &mut ByteReader<'_>) {
        use requests as q;
        use ResourceKind::*;
        let slots = self.slots[g].guest.dev().options().doorbell_slots();
        let kinds = if self.config.without_cm {
            STEPS
        } else {
            STEPS + cm::CM_STEPS
        };
        match r.below(kinds) {
            0..=1 => {
                self.create(g, Pd, &q::request(Opcode::AllocPd, &[]), r);
            }
            2 => {
                let pd = self.handle(g, Pd, r);
                self.run(g, &q::handle_request(Opcode::DeallocPd, pd), r);
            }
            3..=4 => {
                let pd = self.handle(g, Pd, r);
                self.create(g, Mr, &q::reg_mr(r, pd), r);
            }
            5 => {
                let mr = self.handle(g, Mr, r);
                self.run(g, &q::handle_request(Opcode::DeregMr, mr), r);
            }
            6 => {
                let (mr, pd) = (self.handle(g, Mr, r), self.handle(g, Pd, r));
                self.run(g, &q::rereg_mr(r, mr, pd), r);
            }
            7 => {
                let pd = self.handle(g, Pd, r);
                let kind = if r.chance(90) {
                    r.below(2) + 1
                } else {
                    r.u32()
                };
                self.create(g, Mw, &q::two_words(Opcode::AllocMw, pd, kind), r);
            }
            8 => {
                let mw = self.handle(g, Mw, r);
                self.run(g, &q::handle_request(Opcode::DeallocMw, mw), r);
            }
            9..=10 => {
                let cqe = q::count(r);
                let created = self.create(g, Cq, &q::two_words(Opcode::CreateCq, cqe, 0), r);
                self.remember_staged_cq(g, created.as_deref(), |body| {
                    CreateCqResp::read_from_prefix(body)
                        .ok()
                        .map(|(r, _)| r.ring)
                });
            }
            11 => {
                let cq = self.handle(g, Cq, r);
                self.run(g, &q::handle_request(Opcode::DestroyCq, cq), r);
            }
            12 => {
                let cq = self.handle(g, Cq, r);
                let flags = if r.chance(90) { r.below(2) } else { r.u32() };
                self.run(g, &q::two_words(Opcode::ArmCq, cq, flags), r);
            }
            13 => {
                let cq = self.handle(g, Cq, r);
                let cqe = q::count(r);
                let resized = self.run(g, &q::two_words(Opcode::ResizeCq, cq, cqe), r);
                self.remember_staged_cq(g, resized.as_deref(), |body| {
                    ResizeCqResp::read_from_prefix(body)
                        .ok()
                        .map(|(r, _)| r.ring)
                });
            }
            14..=15 => {
                let pd = self.handle(g, Pd, r);
                let send_cq = self.handle(g, Cq, r);
                let recv_cq = if r.chance(50) {
                    send_cq
                } else {
                    self.handle(g, Cq, r)
                };
                let srq = if r.chance(70) {
                    0
                } else {
                    self.handle(g, Srq, r)
                };
                let request = q::create_qp(r, pd, send_cq, recv_cq, srq);
                self.create_qp(g, &request, r);
            }
            16..=18 => {
                let qp = self.handle(g, Qp, r);
                let request = q::modify_qp(r, qp, &self.aims());
                self.run(g, &request, r);
            }
            19 => {
                let qp = self.handle(g, Qp, r);
                let mask = r.u32();
                self.run(g, &q::two_words(Opcode::QueryQp, qp, mask), r);
            }
            20 => {
                let qp = self.handle(g, Qp, r);
                self.run(g, &q::handle_request(Opcode::DestroyQp, qp), r);
            }
            21 => {
                let pd = self.handle(g, Pd, r);
                self.create(g, Srq, &q::create_srq(r, pd), r);
            }
            22 => {
                let srq = self.handle(g, Srq, r);
                let request = match r.below(4) {
                    0 => q::modify_srq(r, srq),
                    1 => q::handle_request(Opcode::QuerySrq, srq),
                    2 => q::two_words(Opcode::ResizeSrq, srq, q::count(r)),
                    _ => q::handle_request(Opcode::DestroySrq, srq),
                };
                self.run(g, &request, r);
            }
            23 => {
                let pd = self.handle(g, Pd, r);
                let request = q::create_ah(r, pd, &self.aims());
                self.create(g, Ah, &request, r);
            }
            24 => {
                let ah = self.handle(g, Ah, r);
                self.run(g, &q::handle_request(Opcode::DestroyAh, ah), r);
            }
            25 => {
                let (request, gpa) = q::set_doorbell_area(r, slots);
                if self.run(g, &request, r).is_some() {
                    self.slots[g].area = Some(gpa);
                }
            }
            26 => {
                let op = r.pick(&[
                    Opcode::QueryDevice,
                    Opcode::QueryPort,
                    Opcode::QueryGid,
                    Opcode::QueryPkey,
                    Opcode::QueryGidTable,
                ]);
                let request = if op == Opcode::QueryDevice {
                    q::request(op, &[])
                } else {
                    let port = if r.chance(90) { 1 } else { r.u32() };
                    q::two_words(op, port, if r.chance(90) { r.below(20) } else { r.u32() })
                };
                self.run(g, &request, r);
            }
            27 => self.slots[g].doorbells(r),
            28 => self.slots[g].host_events(&self.fake, r),
            29 => self.slots[g].change_memory(r),
            30 => {
                let mut w = self.fake.world();
                w.fail_next = Some(if self.config.fail_destroys && r.chance(50) {
                    r.pick(&FAILING_DESTROYS)
                } else if self.config.without_cm {
                    r.pick(&FAILING_COMMANDS)
                } else {
                    r.pick(&FAILING_WITH_CM)
                });
            }
            31 => {
                self.run(g, &q::request(Opcode::DiscardState, &[]), r);
                // Unless the device had failed, nothing is left.
                if self.slots[g].guest.dev().object_counts().is_empty() {
                    check_released(&self.fake, self.slots[g].context);
                    check_cm_released(&self.fake, self.slots[g].cm_file);
                }
            }
            32 => self.reset_or_reconnect(g, r),
            33 => self.set_up(g, r),
            34 => {
                let qpns = self.aims().qpns;
                let foreign_ahs = self.slots[1 - g].seen[kind_index(Ah)].clone();
                let targets = Targets {
                    qpns: &qpns,
                    foreign_ahs: &foreign_ahs,
                };
                self.slots[g].stage_sends(&self.fake, &targets, r);
            }
            35 => {
                let request = q::raw(r);
                self.run(g, &request, r);
            }
            _ => self.cm_step(g, r),
        }
    }

    /// Where guest requests may aim: the interesting GIDs and both guests' QP numbers.
    fn aims(&self) -> Aims {
        Aims {
            dgids: destinations(),
            qpns: self
                .slots
                .iter()
                .flat_map(|s| s.qpns.iter().copied())
                .collect(),
        }
    }

    /// Runs a CREATE_QP and remembers the QP, its number, its doorbell index and (UD) its
    /// staging ring.
    fn create_qp(&mut self, g: usize, request: &[u8], r: &mut ByteReader<'_>) -> Option<u32> {
        let resp = self.create(g, ResourceKind::Qp, request, r)?;
        let (qp, _) = CreateQpResp::read_from_prefix(&resp[HEADER_SIZE..]).expect("a response");
        let slot = &mut self.slots[g];
        for (list, value) in [
            (&mut slot.doorbell_indices, qp.doorbell_index.get()),
            (&mut slot.qpns, qp.qpn.get()),
        ] {
            Slot::keep(list, value);
        }
        // A host kick names the new QP's own host handle, on a send queue the device does
        // not stage, and never on a receive queue.
        if let Some(kick) = qp.sq.host_kick_handle() {
            assert_eq!(
                qp.sq.flags.get() & ring_flags::STAGED,
                0,
                "a staged queue kicked"
            );
            assert_eq!(self.fake.world().qp_by_qpn(qp.qpn.get()), Some(kick));
        }
        assert_eq!(qp.rq.host_kick_handle(), None, "a receive queue kicked");
        let qp_type = request.get(HEADER_SIZE + 36).copied().unwrap_or(0);
        Slot::keep(&mut slot.typed_qps, (qp.qp.get(), qp_type));
        const UD: u8 = 4;
        if qp_type == UD || qp.sq.flags.get() & ring_flags::STAGED != 0 {
            let rq = if qp.rq.flags.get() & ring_flags::STAGED != 0 {
                qp.rq
            } else {
                RingDesc::new_zeroed()
            };
            slot.remember_staged(
                (qp.qp.get(), qp.qpn.get()),
                qp.sq,
                rq,
                qp.doorbell_index.get(),
            );
        }
        Some(qp.qp.get())
    }

    /// Resets guest `g`'s device (the driver then accepts features again), or disconnects it
    /// and connects a new guest in its place.
    fn reset_or_reconnect(&mut self, g: usize, r: &mut ByteReader<'_>) {
        let (context, cm_file) = (self.slots[g].context, self.slots[g].cm_file);
        if r.chance(70) {
            let guest = &self.slots[g].guest;
            guest.dev().reset_requested();
            guest.dev().reset();
            // As QEMU does on a device reset.
            guest.frontend.forget_mappings();
            check_released(&self.fake, context);
            check_cm_released(&self.fake, cm_file);
            assert!(
                guest.dev().object_counts().is_empty(),
                "a reset left objects"
            );
            let features = if r.chance(80) {
                self.features
            } else {
                u64::from(r.u8())
            };
            guest.dev().features_acked(VIRTIO_F_VERSION_1 | features);
            self.slots[g].area = None;
        } else {
            let fresh = Slot::new(&self.fake, &self.daemon.factories[g], self.features);
            self.cm_files.insert(fresh.cm_file, g);
            let old = std::mem::replace(&mut self.slots[g], fresh);
            drop(old);
            check_released(&self.fake, context);
            check_cm_closed(&self.fake, cm_file);
        }
    }
}

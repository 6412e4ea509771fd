//! The staging pump (spec §9.6, §9.7): the doorbell pump's copy of staged WQEs into host queues.
//!
//! A staging ring has the geometry of the host queue behind it and lives in memory of the
//! device's own (the guest's staging file), which the device maps for the guest instead of the
//! host buffer. On a doorbell, [`StagedRing::pump`] copies each new staged WQE once into a
//! private buffer (the guest may rewrite the staging slot meanwhile: only the copy is looked
//! at), writes what it produced into the host slot of the same index, and publishes both the
//! host producer index and the staging consumer index. One copy of one WQE (never of its
//! payload) and no allocation per WQE. Three kinds:
//!
//! - **UD send queues** (`VRDMA_F_UD_STAGED_SQ`): rxe sends a UD WQE whose `ah_num` is 0 to the
//!   address vector embedded in the WQE, source address included, so a guest that could write
//!   the host send queue could send from any address. Staged WQEs name address handles by
//!   their *handle* and are checked; a WQE that fails a check is *neutralised* (its slot
//!   receives a payload-less SEND that keeps only its `wr_id` and names no address handle the
//!   kernel knows) and the host QP is moved to ERR, so the guest sees an error completion for
//!   it (and flushes for the rest) and nothing of it reaches the wire.
//! - **Connected send queues and receive queues** (`VRDMA_F_STAGED_RINGS`): given to RC and UC
//!   QPs when the front-end cannot take another mapping. Staging rings share mappings (pooled
//!   extents of the queue region), host buffers cannot (rxe maps each once), so these QPs cost
//!   no mapping. Their WQEs are copied as the guest wrote them: the host checks them as it
//!   checks a directly mapped queue's.

use std::mem::size_of;
use std::sync::atomic::Ordering::{Acquire, Release};
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::warn;
use vrdma_spec::rxe_v1::{self, header, GeometryError, RingGeometry, RxeSendWqe};
use vrdma_spec::verbs::{QpAttrMask, QpState};
use vrdma_spec::wire::QpAttr;

use super::file::{SharedMapping, StagingExtent, StagingFile};
use super::lingering_ahs::{LingeringAh, Unconsumed};
use super::retry::RetrySchedule;
use super::wqe_check::{
    check, neutralise, payload_len, PassDestinations, Reach, Refusal, StagedAhs,
};
use crate::fault_log::FaultLog;
use crate::host::{AhHandle, DeviceError, HostContext, QpHandle};
use crate::memory::queue_region::ShmRange;
use crate::resources::table::Handle;

/// What a staging ring stands for, and so what its pump does with each WQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StagedKind {
    /// A UD send queue: WQEs checked, AH handles translated, refused ones neutralised.
    UdSend,
    /// An RC or UC send queue: WQEs copied as written.
    ConnectedSend,
    /// A receive queue: WQEs copied; no kick (the host reads receive queues on arrival).
    Recv,
}

/// A staging ring and the host queue behind it.
pub struct StagedRing {
    kind: StagedKind,
    host_qp: QpHandle,
    pd: Handle,
    staging: StagingExtent,
    host_queue: SharedMapping,
    geometry: RingGeometry,
    max_sge: u32,
    max_inline: u32,
    /// Next index to copy: the host producer index and the staging consumer index.
    position: u32,
    /// WQEs the guest published that the last pump could not copy (the host queue was full).
    waiting: bool,
    /// The guest published an impossible index: its doorbells are ignored from then on.
    poisoned: bool,
    /// WQEs stay in the staging ring, unchecked and unforwarded, until the QP can send them
    /// (UD send queues until the guest moves the QP to RTS, see [`Staging::set_sending`]).
    held: bool,
    /// One slot, the private copy checks work on.
    scratch: Box<[u8]>,
}

/// Kind, geometry and limits of a staging ring.
#[derive(Debug, Clone, Copy)]
pub struct StagedRingInit {
    /// What the ring stands for.
    pub kind: StagedKind,
    /// The host QP.
    pub host_qp: QpHandle,
    /// The QP's PD (guest handle).
    pub pd: Handle,
    /// Its staging ring's extent (region offset = staging-file offset).
    pub staging_range: ShmRange,
    /// The host queue's geometry, which the staging ring shares.
    pub geometry: RingGeometry,
    /// The QP's `max_send_sge`.
    pub max_sge: u32,
    /// The QP's `max_inline_data`.
    pub max_inline: u32,
}

impl StagedRing {
    /// A staging ring at `init.staging_range` of `staging` (which the caller initialised) in
    /// front of `host_queue` (the device's mapping of the host buffer).
    pub fn new(
        init: StagedRingInit,
        staging: Arc<StagingFile>,
        host_queue: SharedMapping,
    ) -> Result<Self, GeometryError> {
        let geometry = init.geometry;
        geometry.check_len(host_queue.len())?;
        let staging = StagingExtent::new(staging, init.staging_range, geometry)?;
        geometry.check_entry(match init.kind {
            StagedKind::Recv => rxe_v1::recv_wqe_size(init.max_sge),
            _ => rxe_v1::send_wqe_size(init.max_sge, init.max_inline),
        })?;
        Ok(StagedRing {
            kind: init.kind,
            host_qp: init.host_qp,
            pd: init.pd,
            staging,
            host_queue,
            geometry,
            max_sge: init.max_sge,
            max_inline: init.max_inline,
            position: 0,
            waiting: false,
            poisoned: false,
            // A new QP is in RESET.
            held: init.kind == StagedKind::UdSend,
            scratch: vec![0; geometry.slot_size()].into_boxed_slice(),
        })
    }

    /// Whether the guest's doorbells on this QP are ignored (it published an impossible index).
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    fn staging_word(&self, at: usize) -> &std::sync::atomic::AtomicU32 {
        self.staging.word(at)
    }

    fn host_word(&self, at: usize) -> &std::sync::atomic::AtomicU32 {
        // `new` checked that the whole ring lies in the host mapping.
        self.host_queue
            .word(at)
            .expect("host header inside the host mapping")
    }

    /// Copies (and for UD checks) and forwards every WQE the guest staged since the last pump
    /// (as many as the host ring has room for), then kicks the host QP unless this is a
    /// receive queue or nothing moved. `ahs` are the guest's address handles. Returns the
    /// number of WQEs forwarded (neutralised ones included).
    pub fn pump(&mut self, host: &dyn HostContext, ahs: &StagedAhs, faults: &FaultLog) -> usize {
        self.waiting = false;
        if self.poisoned || self.held {
            return 0;
        }
        let producer = self.staging_word(header::PRODUCER_INDEX).load(Acquire);
        if producer > self.geometry.index_mask() {
            self.poisoned = true;
            faults.report(format_args!(
                "host QP {}: staged producer index {producer:#x} is beyond the ring (mask \
                 {:#x}); moving the QP to ERR and ignoring its doorbells",
                self.host_qp,
                self.geometry.index_mask()
            ));
            move_to_error(host, self.host_qp);
            return 0;
        }
        // The kernel owns the host consumer index; it is masked like any index read.
        let host_consumer = self
            .geometry
            .mask(self.host_word(header::CONSUMER_INDEX).load(Acquire));
        let mut forwarded = 0;
        let mut refused = false;
        let mut pass = PassDestinations::default();
        while self.position != producer {
            let next = self.geometry.next(self.position);
            if next == host_consumer {
                // Full: the host has not retired what it was given (a send is retired when it
                // is acknowledged). The rest waits for the retry timer or a later doorbell.
                self.waiting = true;
                break;
            }
            if let Err(why) = self.forward(self.position, ahs, &mut pass) {
                // Rate-limited per guest: a guest can make refusals on new QPs at will.
                faults.report(format_args!(
                    "host QP {}: staged WQE {} refused ({why}); moving the QP to ERR",
                    self.host_qp, self.position
                ));
                refused = true;
            }
            self.position = next;
            forwarded += 1;
        }
        if refused {
            move_to_error(host, self.host_qp);
        }
        if forwarded != 0 {
            // Slots first, then the indices (the kernel and the guest read slots after their
            // Acquire loads of these words).
            self.host_word(header::PRODUCER_INDEX)
                .store(self.position, Release);
            self.staging_word(header::CONSUMER_INDEX)
                .store(self.position, Release);
        }
        if forwarded != 0 && self.kind != StagedKind::Recv {
            // Only when something moved: a doorbell or retry that found nothing new has
            // nothing for the host to send. Kick errors (QP not in RTS) are the guest's, as
            // for any QP.
            let _ = host.kick_send(self.host_qp);
        }
        forwarded
    }

    /// Copies staging slot `index`, checks the copy (UD) and writes the result (the WQE, or a
    /// neutralised one) into host slot `index`.
    fn forward(
        &mut self,
        index: u32,
        ahs: &StagedAhs,
        pass: &mut PassDestinations,
    ) -> Result<(), Refusal> {
        let offset = self.geometry.slot_offset(index);
        let slot = self.scratch.len();
        let src = self.staging.bytes(offset, slot);
        let copied = match self.kind {
            // Receive WQEs are small (a header and the SGEs): the whole slot.
            StagedKind::Recv => slot,
            StagedKind::UdSend | StagedKind::ConnectedSend => size_of::<RxeSendWqe>(),
        };
        // SAFETY: `src..src + slot` lies in the staging mapping (checked in `new`), `scratch` is
        // our own buffer of `slot` bytes (at least a header, checked in `new`); the guest may
        // write the source concurrently, which is why it is copied once and only the copy is
        // used (a torn copy is merely checked). For a send, the header first, then only the
        // payload it describes.
        unsafe { std::ptr::copy_nonoverlapping(src, self.scratch.as_mut_ptr(), copied) };
        let mut used = copied;
        if self.kind != StagedKind::Recv {
            let payload = payload_len(&self.scratch).min(slot - copied);
            // SAFETY: as above; `copied + payload <= slot`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.add(copied),
                    self.scratch.as_mut_ptr().add(copied),
                    payload,
                )
            };
            used += payload;
        }
        let checked = match self.kind {
            StagedKind::UdSend => check(
                &mut self.scratch,
                self.pd,
                self.max_sge,
                self.max_inline,
                ahs,
                pass,
            ),
            // As the guest wrote them, as in a directly mapped queue: rxe recomputes what it
            // must not trust (the opcode mask) and reads the rest (`iova`, the remote address
            // of an RDMA or atomic WQE) as librxe initialises it.
            StagedKind::ConnectedSend | StagedKind::Recv => Ok(used),
        };
        let used = match checked {
            Ok(used) => used,
            Err(_) => neutralise(&mut self.scratch),
        };
        let dst = self
            .host_queue
            .range(offset, used)
            .expect("host slot inside the host mapping");
        // SAFETY: `dst..dst + used` lies in the host mapping (`used` ≤ the slot, which `new`
        // checked to fit), and the kernel does not read this slot before the producer index
        // passes it (published after this copy with Release).
        unsafe { std::ptr::copy_nonoverlapping(self.scratch.as_ptr(), dst, used) };
        checked.map(|_| ())
    }

    /// Whether the last pump left WQEs behind for want of room in the host queue.
    pub fn is_waiting(&self) -> bool {
        self.waiting
    }

    /// The host consumer index, masked (the kernel owns it).
    fn host_consumer(&self) -> u32 {
        self.geometry
            .mask(self.host_word(header::CONSUMER_INDEX).load(Acquire))
    }

    /// The UD WQEs forwarded to the host that it has not consumed yet, if any (doorbell
    /// `index`).
    fn unconsumed(&self, index: u32) -> Option<Unconsumed> {
        if self.kind != StagedKind::UdSend {
            return None;
        }
        let consumer = self.host_consumer();
        let remaining = self.geometry.mask(self.position.wrapping_sub(consumer));
        (remaining != 0).then_some(Unconsumed {
            index,
            host_qp: self.host_qp,
            last_consumer: consumer,
            remaining,
        })
    }
}

/// Moves `qp` to ERR on the host (its posted WQEs then complete with errors or flushes).
fn move_to_error(host: &dyn HostContext, qp: QpHandle) {
    let attr = QpAttr::default().with_qp_state(QpState::Err);
    if let Err(e) = host.modify_qp(qp, &attr, QpAttrMask::STATE) {
        warn!("host QP {qp}: moving it to ERR failed: {e}");
    }
}

/// The staging rings of one QP.
#[derive(Default)]
struct StagedQueues {
    sq: Option<StagedRing>,
    rq: Option<StagedRing>,
}

impl StagedQueues {
    /// Forwards the receive queue, then the send queue (which kicks); WQEs forwarded, and
    /// whether any were left waiting.
    fn pump(
        &mut self,
        host: &dyn HostContext,
        ahs: &StagedAhs,
        faults: &FaultLog,
    ) -> (usize, bool) {
        let mut forwarded = 0;
        let mut waiting = false;
        for ring in [&mut self.rq, &mut self.sq].into_iter().flatten() {
            forwarded += ring.pump(host, ahs, faults);
            waiting |= ring.is_waiting();
        }
        (forwarded, waiting)
    }
}

/// The staging rings of a guest (by doorbell index) and its address handles.
pub struct Staging {
    queues: Vec<StagedQueues>,
    /// Doorbell indices whose rings have WQEs waiting for room in their host queues.
    waiting: RetrySchedule,
    ahs: StagedAhs,
    /// Host AHs the guest destroyed while forwarded WQEs may still name them.
    lingering_ahs: Vec<LingeringAh>,
    /// The guest's refused WQEs and impossible indices, logged rate-limited.
    faults: Arc<FaultLog>,
}

impl Staging {
    /// Room for `slots` doorbell indices; sends reach local QPs as `reach` allows; what the
    /// guest does wrong goes to `faults` (the guest's own, which outlives a reset).
    pub fn new(slots: u32, reach: Reach, faults: Arc<FaultLog>) -> Self {
        Staging {
            queues: (0..slots).map(|_| StagedQueues::default()).collect(),
            waiting: RetrySchedule::default(),
            ahs: StagedAhs::new(reach),
            lingering_ahs: Vec::new(),
            faults,
        }
    }

    /// Where the sends may go (the daemon's table of tenant addresses and QP numbers, the
    /// host's own addresses).
    pub fn reach(&self) -> &Reach {
        self.ahs.reach()
    }

    /// Where the guest's faults are logged.
    pub fn faults(&self) -> &Arc<FaultLog> {
        &self.faults
    }

    /// Makes doorbells on `index` pump `ring` (the QP's send or receive queue, by its kind).
    pub fn attach(&mut self, index: u32, ring: StagedRing) {
        if let Some(queues) = self.queues.get_mut(index as usize) {
            match ring.kind {
                StagedKind::Recv => queues.rq = Some(ring),
                StagedKind::UdSend | StagedKind::ConnectedSend => queues.sq = Some(ring),
            }
        }
    }

    /// Drops the staging rings of `index`, if any.
    pub fn release(&mut self, index: u32) {
        if let Some(queues) = self.queues.get_mut(index as usize) {
            *queues = StagedQueues::default();
        }
        self.waiting.remove(index);
    }

    /// Serves a doorbell on `index`: forwards its staged receive queue, if any, then its
    /// staged send queue, if any, which kicks the host QP. `false` if the send queue is not
    /// staged (the caller kicks as for any QP).
    pub fn ring(&mut self, index: u32, host: &dyn HostContext) -> bool {
        // Before anything more is forwarded (see `Unconsumed::consumed_up_to`).
        self.release_lingering_ahs(host);
        let Some(queues) = self.queues.get_mut(index as usize) else {
            return false;
        };
        let (_, waiting) = queues.pump(host, &self.ahs, &self.faults);
        if waiting {
            self.waiting.add(index, Instant::now());
        }
        queues.sq.is_some()
    }

    /// Whether the staged UD send queue of `index` forwards its WQEs (`sending`: the guest
    /// moved the QP to RTS, or to ERR, which flushes them) or holds them in the staging ring
    /// (RESET, INIT, RTR, SQD). rxe keeps WQEs given to a QP that cannot send and sends them
    /// once it is in RTS: a WQE checked then could leave long after its check, when the AH it
    /// names was destroyed and its number reused, or its QP number belongs to another QP.
    /// Held, it is checked when it can go at once. Starting to send pumps the queue (the WQEs
    /// the guest posted meanwhile); returns the WQEs forwarded.
    pub fn set_sending(&mut self, index: u32, sending: bool, host: &dyn HostContext) -> usize {
        self.release_lingering_ahs(host);
        let Some(queues) = self.queues.get_mut(index as usize) else {
            return 0;
        };
        let Some(sq) = queues
            .sq
            .as_mut()
            .filter(|sq| sq.kind == StagedKind::UdSend)
        else {
            return 0;
        };
        let was_held = std::mem::replace(&mut sq.held, !sending);
        if !(was_held && sending) {
            return 0;
        }
        let forwarded = sq.pump(host, &self.ahs, &self.faults);
        if sq.is_waiting() {
            self.waiting.add(index, Instant::now());
        }
        forwarded
    }

    /// How long until a ring with WQEs waiting for room in a host queue is due to be pumped
    /// again (see [`Staging::retry`]); `None` if none waits.
    pub fn next_retry(&self) -> Option<Duration> {
        self.waiting.next_delay(Instant::now())
    }

    /// Pumps again every waiting ring that is due; returns how many WQEs moved now, and how
    /// long until the next ring is due (`None`: none waits).
    pub fn retry(&mut self, host: &dyn HostContext) -> (usize, Option<Duration>) {
        self.release_lingering_ahs(host);
        let now = Instant::now();
        let (queues, ahs, faults) = (&mut self.queues, &self.ahs, &self.faults);
        let moved = self
            .waiting
            .retry_due(now, |index| match queues.get_mut(index as usize) {
                Some(queues) => queues.pump(host, ahs, faults),
                None => (0, false),
            });
        (moved, self.waiting.next_delay(now))
    }

    /// The guest's address handles.
    pub fn ahs_mut(&mut self) -> &mut StagedAhs {
        &mut self.ahs
    }

    /// Destroys host AH `host_ah` (the guest's DESTROY_AH; its handle is out of the table
    /// already) once no UD WQE forwarded so far can name it: at once if every staged UD send
    /// queue has consumed what it was given, else when they have, so that the host cannot
    /// reuse its number for another AH while such a WQE waits.
    pub fn destroy_ah(
        &mut self,
        host_ah: AhHandle,
        host: &dyn HostContext,
    ) -> Result<(), DeviceError> {
        self.release_lingering_ahs(host);
        let waits_for: Vec<Unconsumed> = (0u32..)
            .zip(&self.queues)
            .filter_map(|(index, queues)| queues.sq.as_ref()?.unconsumed(index))
            .collect();
        if waits_for.is_empty() {
            return host.destroy_ah(host_ah);
        }
        self.lingering_ahs.push(LingeringAh {
            host: host_ah,
            waits_for,
        });
        Ok(())
    }

    /// Destroys the lingering host AHs whose WQEs the host has consumed (or whose QPs are
    /// gone, and their WQEs with them).
    pub fn release_lingering_ahs(&mut self, host: &dyn HostContext) {
        let queues = &self.queues;
        self.lingering_ahs.retain_mut(|ah| {
            ah.waits_for.retain_mut(|waiting| {
                let ring = queues
                    .get(waiting.index as usize)
                    .and_then(|q| q.sq.as_ref())
                    .filter(|sq| sq.host_qp == waiting.host_qp);
                ring.is_some_and(|sq| {
                    !waiting.consumed_up_to(sq.host_consumer(), sq.geometry.index_mask())
                })
            });
            if !ah.waits_for.is_empty() {
                return true;
            }
            if let Err(e) = host.destroy_ah(ah.host) {
                warn!("destroying host AH {} after its sends failed: {e}", ah.host);
            }
            false
        });
    }

    /// Host AHs destroyed by the guest that the host still holds for its WQEs.
    pub fn lingering_ahs(&self) -> usize {
        self.lingering_ahs.len()
    }

    /// Their host handles.
    pub fn lingering_host_ahs(&self) -> Vec<u32> {
        self.lingering_ahs.iter().map(|ah| ah.host.0).collect()
    }

    /// Takes the host AHs still lingering (a discard destroys them after the QPs).
    pub fn take_lingering_ahs(&mut self) -> Vec<AhHandle> {
        self.lingering_ahs.drain(..).map(|ah| ah.host).collect()
    }
}

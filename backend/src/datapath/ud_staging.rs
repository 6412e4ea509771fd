//! Enforced UD sends (spec §9.6): the doorbell pump's copy of staged WQEs into host send
//! queues.
//!
//! rxe sends a UD WQE whose `ah_num` is 0 to the address vector embedded in the WQE, source
//! address included, so a guest that could write the host send queue could send from any
//! address. With `VRDMA_F_UD_STAGED_SQ` a UD QP's host send queue is mapped by the device
//! alone; the guest writes its WQEs into a *staging ring* of the same geometry, naming
//! address handles by their *handle*. On a doorbell, [`StagedSq::pump`] copies each new staged
//! WQE once into a private buffer (the guest may rewrite the staging slot meanwhile: only the
//! copy is looked at), checks it, writes what the checks produced into the host slot of the
//! same index, and publishes both the host producer index and the staging consumer index
//! before the kick. A WQE that fails a check is *neutralised*: its slot receives a payload-less
//! SEND that keeps only its `wr_id` and names no address handle the kernel knows, and the host
//! QP is moved to ERR, so the guest sees an error completion for it (and flushes for the rest)
//! and nothing of it reaches the wire. One copy of one WQE (never of its payload) and no
//! allocation per WQE.

mod wqe_check;

use std::mem::size_of;
use std::sync::atomic::Ordering::{Acquire, Release};
use std::sync::Arc;

use log::warn;
use vrdma_spec::rxe_v1::{self, header, RxeSendWqe};
use vrdma_spec::verbs::{QpAttrMask, QpState};
use vrdma_spec::wire::QpAttr;

use crate::fault_log::FaultLog;
use crate::host::{HostContext, QpHandle};
use crate::identity::endpoints::LocalEndpoints;
use crate::memory::queue_region::ShmRange;
use crate::memory::staging::{SharedMapping, StagingFile};
use crate::resources::table::Handle;
use wqe_check::payload_len;
pub use wqe_check::{check, neutralise, Refusal, StagedAh, StagedAhs, NEUTRALISED_AH_NUM};

/// A staged send queue: the guest's staging ring and the host send queue behind it.
pub struct StagedSq {
    host_qp: QpHandle,
    pd: Handle,
    staging: Arc<StagingFile>,
    /// Offset of the staging ring in the staging file.
    staging_offset: usize,
    staging_range: ShmRange,
    host_sq: SharedMapping,
    index_mask: u32,
    log2_slot_size: u32,
    max_sge: u32,
    max_inline: u32,
    /// Next index to copy: the host producer index and the staging consumer index.
    position: u32,
    /// The guest published an impossible index: its doorbells are ignored from then on.
    poisoned: bool,
    /// One slot, the private copy checks work on.
    scratch: Box<[u8]>,
}

/// Geometry and limits of a staged send queue.
#[derive(Debug, Clone, Copy)]
pub struct StagedSqInit {
    /// The host QP.
    pub host_qp: QpHandle,
    /// The QP's PD (guest handle).
    pub pd: Handle,
    /// Its staging ring's extent (region offset = staging-file offset).
    pub staging_range: ShmRange,
    /// Slots minus one.
    pub index_mask: u32,
    /// log2 of the slot stride.
    pub log2_slot_size: u32,
    /// The QP's `max_send_sge`.
    pub max_sge: u32,
    /// The QP's `max_inline_data`.
    pub max_inline: u32,
}

impl StagedSq {
    /// A staged send queue over `host_sq` (the device's mapping of the host buffer) and the
    /// staging ring at `init.staging_range` of `staging`, which the caller initialised.
    pub fn new(
        init: StagedSqInit,
        staging: Arc<StagingFile>,
        host_sq: SharedMapping,
    ) -> Result<Self, String> {
        let slot = 1usize
            .checked_shl(init.log2_slot_size)
            .filter(|_| init.log2_slot_size <= rxe_v1::MAX_LOG2_SLOT_SIZE)
            .ok_or_else(|| format!("slot size 2^{}", init.log2_slot_size))?;
        let ring_len = (init.index_mask as usize + 1)
            .checked_mul(slot)
            .and_then(|slots| slots.checked_add(header::SIZE))
            .ok_or("ring size overflows")?;
        let staging_offset =
            usize::try_from(init.staging_range.offset).map_err(|e| e.to_string())?;
        if ring_len > host_sq.len()
            || u64::try_from(ring_len).map_or(true, |len| len > init.staging_range.len)
            || staging.mapping().range(staging_offset, ring_len).is_none()
        {
            return Err(format!(
                "a ring of {ring_len:#x} bytes does not fit its buffers"
            ));
        }
        if rxe_v1::send_wqe_size(init.max_sge, init.max_inline) > slot {
            return Err(format!(
                "2^{}-byte slots cannot hold the QP's WQEs",
                init.log2_slot_size
            ));
        }
        Ok(StagedSq {
            host_qp: init.host_qp,
            pd: init.pd,
            staging,
            staging_offset,
            staging_range: init.staging_range,
            host_sq,
            index_mask: init.index_mask,
            log2_slot_size: init.log2_slot_size,
            max_sge: init.max_sge,
            max_inline: init.max_inline,
            position: 0,
            poisoned: false,
            scratch: vec![0; slot].into_boxed_slice(),
        })
    }

    /// Whether the guest's doorbells on this QP are ignored (it published an impossible index).
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    fn staging_word(&self, at: usize) -> &std::sync::atomic::AtomicU32 {
        // `new` checked that the whole ring lies in the staging mapping.
        self.staging
            .mapping()
            .word(self.staging_offset + at)
            .expect("staging header inside the staging file")
    }

    fn host_word(&self, at: usize) -> &std::sync::atomic::AtomicU32 {
        // `new` checked that the whole ring lies in the host mapping.
        self.host_sq
            .word(at)
            .expect("host header inside the host mapping")
    }

    fn slot_offset(&self, index: u32) -> usize {
        rxe_v1::slot_offset(index, self.index_mask, self.log2_slot_size)
    }

    /// Copies, checks and forwards every WQE the guest staged since the last pump (as many as
    /// the host ring has room for), then kicks the host QP. `ahs` are the guest's address
    /// handles. Returns the number of WQEs forwarded (neutralised ones included).
    pub fn pump(&mut self, host: &dyn HostContext, ahs: &StagedAhs, faults: &FaultLog) -> usize {
        if self.poisoned {
            return 0;
        }
        let producer = self.staging_word(header::PRODUCER_INDEX).load(Acquire);
        if producer > self.index_mask {
            self.poisoned = true;
            faults.report(format_args!(
                "host QP {}: staged producer index {producer:#x} is beyond the ring (mask \
                 {:#x}); moving the QP to ERR and ignoring its doorbells",
                self.host_qp, self.index_mask
            ));
            move_to_error(host, self.host_qp);
            return 0;
        }
        // The kernel owns the host consumer index; it is masked like any index read.
        let host_consumer = self.host_word(header::CONSUMER_INDEX).load(Acquire) & self.index_mask;
        let mut forwarded = 0;
        let mut refused = false;
        while self.position != producer {
            let next = (self.position + 1) & self.index_mask;
            if next == host_consumer {
                // Full; the rest waits for a later doorbell (a driver that keeps to the QP's
                // depth never gets here, spec §9.6).
                break;
            }
            if let Err(why) = self.forward(self.position, ahs) {
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
        // Kick errors (QP not in RTS) are the guest's, as for any QP.
        let _ = host.kick_send(self.host_qp);
        forwarded
    }

    /// Copies staging slot `index`, checks the copy and writes the result (the checked WQE or
    /// a neutralised one) into host slot `index`.
    fn forward(&mut self, index: u32, ahs: &StagedAhs) -> Result<(), Refusal> {
        let offset = self.slot_offset(index);
        let slot = self.scratch.len();
        let src = self
            .staging
            .mapping()
            .range(self.staging_offset + offset, slot)
            .expect("staging slot inside the staging file");
        let head = size_of::<RxeSendWqe>();
        // SAFETY: `src..src + slot` lies in the staging mapping (checked in `new`), `scratch` is
        // our own buffer of `slot` bytes (at least a header, checked in `new`); the guest may
        // write the source concurrently, which is why it is copied once and only the copy is
        // used (a torn copy is merely checked). The header first, then only the payload it
        // describes.
        unsafe { std::ptr::copy_nonoverlapping(src, self.scratch.as_mut_ptr(), head) };
        let payload = payload_len(&self.scratch).min(slot - head);
        // SAFETY: as above; `head + payload <= slot`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.add(head),
                self.scratch.as_mut_ptr().add(head),
                payload,
            )
        };
        let checked = check(
            &mut self.scratch,
            self.pd,
            self.max_sge,
            self.max_inline,
            ahs,
        );
        let used = match checked {
            Ok(used) => used,
            Err(_) => neutralise(&mut self.scratch),
        };
        let dst = self
            .host_sq
            .range(offset, used)
            .expect("host slot inside the host mapping");
        // SAFETY: `dst..dst + used` lies in the host mapping (`used` ≤ the slot, which `new`
        // checked to fit), and the kernel does not read this slot before the producer index
        // passes it (published after this copy with Release).
        unsafe { std::ptr::copy_nonoverlapping(self.scratch.as_ptr(), dst, used) };
        checked.map(|_| ())
    }

    /// The staging ring's extent (released with the QP).
    pub fn staging_range(&self) -> ShmRange {
        self.staging_range
    }
}

impl Drop for StagedSq {
    fn drop(&mut self) {
        // Give the staging pages back; the extent itself is the region allocator's.
        if let Err(e) = self.staging.punch(self.staging_range) {
            warn!("staging ring {:#x}: {e}", self.staging_range.offset);
        }
    }
}

/// Moves `qp` to ERR on the host (its posted WQEs then complete with errors or flushes).
fn move_to_error(host: &dyn HostContext, qp: QpHandle) {
    let attr = QpAttr::default().with_qp_state(QpState::Err);
    if let Err(e) = host.modify_qp(qp, &attr, QpAttrMask::STATE) {
        warn!("host QP {qp}: moving it to ERR failed: {e}");
    }
}

/// The staged send queues of a guest (by doorbell index) and its address handles.
pub struct UdStaging {
    sqs: Vec<Option<StagedSq>>,
    ahs: StagedAhs,
    /// The guest's refused WQEs and impossible indices, logged rate-limited.
    faults: FaultLog,
}

impl UdStaging {
    /// Room for `slots` doorbell indices; sends reach local QPs as `endpoints` allows.
    pub fn new(slots: u32, endpoints: Arc<LocalEndpoints>) -> Self {
        UdStaging {
            sqs: (0..slots).map(|_| None).collect(),
            ahs: StagedAhs::new(endpoints),
            faults: FaultLog::default(),
        }
    }

    /// The daemon's table of tenant addresses and QP numbers the sends are checked against.
    pub fn endpoints(&self) -> &Arc<LocalEndpoints> {
        self.ahs.endpoints()
    }

    /// Makes doorbells on `index` pump `sq`.
    pub fn attach(&mut self, index: u32, sq: StagedSq) {
        if let Some(entry) = self.sqs.get_mut(index as usize) {
            *entry = Some(sq);
        }
    }

    /// Drops the staged send queue of `index`, if any.
    pub fn release(&mut self, index: u32) {
        if let Some(entry) = self.sqs.get_mut(index as usize) {
            *entry = None;
        }
    }

    /// Whether `index` has a staged send queue.
    pub fn is_staged(&self, index: u32) -> bool {
        matches!(self.sqs.get(index as usize), Some(Some(_)))
    }

    /// Serves a doorbell on `index` if it has a staged send queue; `false` if it has none
    /// (the caller kicks as for any QP).
    pub fn ring(&mut self, index: u32, host: &dyn HostContext) -> bool {
        match self.sqs.get_mut(index as usize) {
            Some(Some(sq)) => {
                sq.pump(host, &self.ahs, &self.faults);
                true
            }
            _ => false,
        }
    }

    /// The guest's address handles.
    pub fn ahs_mut(&mut self) -> &mut StagedAhs {
        &mut self.ahs
    }
}

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

use std::collections::HashMap;
use std::mem::{offset_of, size_of};
use std::sync::atomic::Ordering::{Acquire, Release};
use std::sync::Arc;

use log::{debug, warn};
use vrdma_spec::rxe_v1::{self, header, RxeSendWqe, RxeSendWr, RxeSge, RxeUdWr};
use vrdma_spec::verbs::{send_flags, QpAttrMask, QpState, WrOpcode};
use vrdma_spec::wire::QpAttr;
use vrdma_spec::{Le32, Le64};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use crate::host::{HostContext, QpHandle};
use crate::memory::queue_region::ShmRange;
use crate::memory::staging::{SharedMapping, StagingFile};
use crate::resources::table::Handle;

/// `ah_num` of a neutralised WQE: no rxe AH pool reaches it, so the kernel finds no address
/// vector and fails the WQE (`LOC_QP_OP_ERR`) if the QP is not already flushing.
pub const NEUTRALISED_AH_NUM: u32 = u32::MAX;

/// Send flags a staged UD WQE may carry.
const UD_SEND_FLAGS: u32 =
    send_flags::FENCE | send_flags::SIGNALED | send_flags::SOLICITED | send_flags::INLINE;

/// What the pump knows of one of the guest's address handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagedAh {
    /// The AH's PD (guest handle).
    pub pd: Handle,
    /// The host's `ah_num` for it.
    pub ah_num: u32,
}

/// Why a staged WQE was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Not SEND or SEND_WITH_IMM.
    #[error("opcode {0} is not a UD opcode")]
    Opcode(u32),
    /// Undefined send flags.
    #[error("send flags {0:#x}")]
    Flags(u32),
    /// More SGEs than the QP's `max_send_sge`.
    #[error("{0} SGEs")]
    TooManySges(u32),
    /// Inline data longer than the QP's `max_inline_data`.
    #[error("{0} inline bytes")]
    InlineTooLong(u32),
    /// `dma.length`/`resid` do not describe the payload.
    #[error("payload length {0} does not match its SGEs")]
    Length(u32),
    /// `ah_num` names no AH of this guest in the QP's PD (0, a host `ah_num`, another
    /// guest's handle, a destroyed AH).
    #[error("AH handle {0:#x} is not an AH of the QP's PD")]
    AddressHandle(u32),
    /// The destination policy refused `remote_qpn`.
    #[error("destination QPN {0:#x} refused")]
    Destination(u32),
}

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
    /// A refusal was logged: later ones only at debug level (one line per QP, not per WQE).
    refusal_logged: bool,
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
            refusal_logged: false,
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
    pub fn pump(&mut self, host: &dyn HostContext, ahs: &StagedAhs) -> usize {
        if self.poisoned {
            return 0;
        }
        let producer = self.staging_word(header::PRODUCER_INDEX).load(Acquire);
        if producer > self.index_mask {
            self.poisoned = true;
            warn!(
                "host QP {}: staged producer index {producer:#x} is beyond the ring (mask \
                 {:#x}); moving the QP to ERR and ignoring its doorbells",
                self.host_qp, self.index_mask
            );
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
                if !std::mem::replace(&mut self.refusal_logged, true) {
                    warn!(
                        "host QP {}: staged WQE {} refused ({why}); moving the QP to ERR \
                         (further refusals on this QP are logged at debug level)",
                        self.host_qp, self.position
                    );
                } else {
                    debug!(
                        "host QP {}: staged WQE {} refused ({why})",
                        self.host_qp, self.position
                    );
                }
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

/// The checks of one staged WQE, applied to the private copy in `slot`, which becomes the WQE
/// the host receives: host-owned fields zeroed, `ah_num` translated, the embedded AV zeroed.
/// Returns the bytes of the slot in use (header and payload).
pub fn check(
    slot: &mut [u8],
    pd: Handle,
    max_sge: u32,
    max_inline: u32,
    ahs: &StagedAhs,
) -> Result<usize, Refusal> {
    let head = size_of::<RxeSendWqe>();
    let (wqe_bytes, payload) = slot.split_at_mut(head);
    let mut wqe = RxeSendWqe::read_from_bytes(wqe_bytes).expect("slot holds a WQE header");
    let opcode = wqe.wr.opcode.get();
    if opcode != WrOpcode::Send as u32 && opcode != WrOpcode::SendWithImm as u32 {
        return Err(Refusal::Opcode(opcode));
    }
    let flags = wqe.wr.send_flags.get();
    if flags & !UD_SEND_FLAGS != 0 {
        return Err(Refusal::Flags(flags));
    }
    let length = wqe.dma.length.get();
    if wqe.dma.resid.get() != length {
        return Err(Refusal::Length(length));
    }
    let used = if flags & send_flags::INLINE != 0 {
        if length > max_inline || length as usize > payload.len() {
            return Err(Refusal::InlineTooLong(length));
        }
        head + length as usize
    } else {
        let num_sge = wqe.dma.num_sge.get();
        if num_sge > max_sge {
            return Err(Refusal::TooManySges(num_sge));
        }
        let sges = payload
            .get(..num_sge as usize * size_of::<RxeSge>())
            .ok_or(Refusal::TooManySges(num_sge))?;
        let total: u64 = <[RxeSge]>::ref_from_bytes(sges)
            .expect("SGEs are unaligned plain data")
            .iter()
            .map(|sge| u64::from(sge.length.get()))
            .sum();
        if total != u64::from(length) {
            return Err(Refusal::Length(length));
        }
        head + sges.len()
    };
    let ud = wqe.wr.wr.ud();
    let handle = ud.ah_num.get();
    let ah = ahs
        .get(handle)
        .filter(|ah| ah.pd == pd)
        .ok_or(Refusal::AddressHandle(handle))?;
    if !destination_allowed(ah, ud.remote_qpn.get()) {
        return Err(Refusal::Destination(ud.remote_qpn.get()));
    }
    wqe.wr.reserved = Le32::ZERO;
    wqe.wr.wr = rxe_v1::RxeSendWrUnion::from_ud(RxeUdWr {
        remote_qpn: ud.remote_qpn,
        remote_qkey: ud.remote_qkey,
        pkey_index: ud.pkey_index,
        reserved: Default::default(),
        ah_num: Le32::new(ah.ah_num),
        pad: [0; 16],
        av: FromZeros::new_zeroed(),
    });
    clear_host_fields(&mut wqe);
    wqe_bytes.copy_from_slice(wqe.as_bytes());
    Ok(used)
}

/// Bytes after the header that the WQE in `slot` says it uses: its inline data or its SGEs.
fn payload_len(slot: &[u8]) -> usize {
    let Ok((wqe, _)) = RxeSendWqe::read_from_prefix(slot) else {
        return 0;
    };
    if wqe.wr.send_flags.get() & send_flags::INLINE != 0 {
        wqe.dma.length.get() as usize
    } else {
        (wqe.dma.num_sge.get() as usize).saturating_mul(size_of::<RxeSge>())
    }
}

/// Where D's per-guest network identity plugs in: a UD send through `ah` to `remote_qpn`
/// must, when the AH's destination is another local guest, name one of that guest's QPs.
/// Until identities exist, every destination an AH of the guest's own PD reaches is allowed
/// (the AH's source address was checked at CREATE_AH).
fn destination_allowed(_ah: &StagedAh, _remote_qpn: u32) -> bool {
    true
}

/// The fields the host owns once a WQE is posted, as a fresh WQE has them.
fn clear_host_fields(wqe: &mut RxeSendWqe) {
    wqe.status = Le32::ZERO;
    wqe.state = Le32::new(rxe_v1::WQE_STATE_POSTED);
    wqe.iova = Le64::ZERO;
    wqe.mask = Le32::ZERO;
    wqe.first_psn = Le32::ZERO;
    wqe.last_psn = Le32::ZERO;
    wqe.ack_length = Le32::ZERO;
    wqe.ssn = Le32::ZERO;
    wqe.has_rd_atomic = Le32::ZERO;
    wqe.dma.cur_sge = Le32::ZERO;
    wqe.dma.sge_offset = Le32::ZERO;
    wqe.dma.reserved = Le32::ZERO;
}

/// Replaces the WQE in `slot` by a signaled, payload-less SEND with the same `wr_id` through
/// [`NEUTRALISED_AH_NUM`]; returns its length.
pub fn neutralise(slot: &mut [u8]) -> usize {
    let head = size_of::<RxeSendWqe>();
    let wr_id =
        Le64::read_from_prefix(&slot[offset_of!(RxeSendWqe, wr) + offset_of!(RxeSendWr, wr_id)..])
            .map_or(Le64::ZERO, |(id, _)| id);
    let mut wqe = RxeSendWqe::new_zeroed();
    wqe.wr.wr_id = wr_id;
    wqe.wr.opcode = Le32::new(WrOpcode::Send as u32);
    wqe.wr.send_flags = Le32::new(send_flags::SIGNALED);
    wqe.wr.wr = rxe_v1::RxeSendWrUnion::from_ud(RxeUdWr {
        ah_num: Le32::new(NEUTRALISED_AH_NUM),
        ..FromZeros::new_zeroed()
    });
    wqe.state = Le32::new(rxe_v1::WQE_STATE_POSTED);
    slot[..head].copy_from_slice(wqe.as_bytes());
    head
}

/// Moves `qp` to ERR on the host (its posted WQEs then complete with errors or flushes).
fn move_to_error(host: &dyn HostContext, qp: QpHandle) {
    let attr = QpAttr::default().with_qp_state(QpState::Err);
    if let Err(e) = host.modify_qp(qp, &attr, QpAttrMask::STATE) {
        warn!("host QP {qp}: moving it to ERR failed: {e}");
    }
}

/// The guest's address handles as the pump sees them, by raw AH handle.
#[derive(Debug, Default)]
pub struct StagedAhs {
    by_handle: HashMap<u32, StagedAh>,
}

impl StagedAhs {
    /// Makes AH `handle` usable in staged WQEs.
    pub fn insert(&mut self, handle: Handle, ah: StagedAh) {
        self.by_handle.insert(handle.raw(), ah);
    }

    /// Stops AH `handle` from being usable; returns what it was.
    pub fn remove(&mut self, handle: Handle) -> Option<StagedAh> {
        self.by_handle.remove(&handle.raw())
    }

    /// The AH a staged WQE names by `raw` handle.
    pub fn get(&self, raw: u32) -> Option<&StagedAh> {
        self.by_handle.get(&raw)
    }
}

/// The staged send queues of a guest (by doorbell index) and its address handles.
pub struct UdStaging {
    sqs: Vec<Option<StagedSq>>,
    ahs: StagedAhs,
}

impl UdStaging {
    /// Room for `slots` doorbell indices.
    pub fn new(slots: u32) -> Self {
        UdStaging {
            sqs: (0..slots).map(|_| None).collect(),
            ahs: StagedAhs::default(),
        }
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
                sq.pump(host, &self.ahs);
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

#[cfg(test)]
mod tests {
    use super::*;

    const PD: u32 = 0x0100_0001;
    const AH: u32 = 0x0100_0002;

    fn ahs() -> StagedAhs {
        let mut ahs = StagedAhs::default();
        let pd = Handle::from_raw(PD);
        ahs.insert(Handle::from_raw(AH), StagedAh { pd, ah_num: 42 });
        ahs
    }

    /// A slot of 512 bytes holding an inline UD SEND of `len` bytes, with host-owned junk.
    fn inline_slot(len: u32) -> Vec<u8> {
        let mut wqe = RxeSendWqe::new_zeroed();
        wqe.wr.wr_id = Le64::new(5);
        wqe.wr.reserved = Le32::new(7);
        wqe.wr.opcode = Le32::new(WrOpcode::SendWithImm as u32);
        wqe.wr.send_flags = Le32::new(send_flags::INLINE | send_flags::SIGNALED);
        wqe.wr.wr = rxe_v1::RxeSendWrUnion::from_ud(RxeUdWr {
            remote_qpn: Le32::new(0x42),
            ah_num: Le32::new(AH),
            pad: [1; 16],
            ..FromZeros::new_zeroed()
        });
        wqe.status = Le32::new(3);
        wqe.first_psn = Le32::new(9);
        wqe.dma.length = Le32::new(len);
        wqe.dma.resid = Le32::new(len);
        wqe.dma.cur_sge = Le32::new(1);
        let mut slot = vec![0xee; 512];
        slot[..size_of::<RxeSendWqe>()].copy_from_slice(wqe.as_bytes());
        slot
    }

    #[test]
    fn a_checked_wqe_is_rewritten_for_the_host() {
        let mut slot = inline_slot(64);
        let used = check(&mut slot, Handle::from_raw(PD), 1, 64, &ahs()).unwrap();
        assert_eq!(used, size_of::<RxeSendWqe>() + 64);
        let (wqe, _) = RxeSendWqe::read_from_prefix(&slot).unwrap();
        let ud = wqe.wr.wr.ud();
        assert_eq!((ud.ah_num.get(), ud.remote_qpn.get()), (42, 0x42));
        assert_eq!(ud.pad, [0; 16]);
        assert_eq!(wqe.wr.reserved.get(), 0);
        assert_eq!((wqe.status.get(), wqe.first_psn.get()), (0, 0));
        assert_eq!(wqe.dma.cur_sge.get(), 0);
        assert_eq!(wqe.wr.wr_id.get(), 5);
    }

    #[test]
    fn checks_refuse_what_the_qp_cannot_send() {
        let pd = Handle::from_raw(PD);
        let mut long = inline_slot(65);
        assert_eq!(
            check(&mut long, pd, 1, 64, &ahs()),
            Err(Refusal::InlineTooLong(65))
        );
        let mut other_pd = inline_slot(8);
        assert_eq!(
            check(&mut other_pd, Handle::from_raw(PD + 1), 1, 64, &ahs()),
            Err(Refusal::AddressHandle(AH))
        );
        let mut slot = inline_slot(8);
        let used = neutralise(&mut slot);
        let (wqe, _) = RxeSendWqe::read_from_prefix(&slot).unwrap();
        assert_eq!(used, size_of::<RxeSendWqe>());
        assert_eq!(wqe.wr.wr_id.get(), 5);
        assert_eq!(wqe.wr.wr.ud().ah_num.get(), NEUTRALISED_AH_NUM);
        assert_eq!((wqe.dma.length.get(), wqe.wr.ex), (0, [0; 4]));
    }
}

//! Posting send work requests as native rxe send WQEs: `ibv_post_send`'s list of requests
//! here, the piecewise `ibv_wr_*` batches in [`super::send_batch`]. Both check requests with
//! [`SendQueue::check_shape`] and write them with the encoders below, so a WQE is the same
//! bytes whichever API built it.

use std::mem::{offset_of, size_of};
use std::sync::atomic::Ordering;

use vrdma_spec::rxe_v1::{
    send_wqe_size, GeometryError, RxeAtomicWr, RxeAv, RxeDmaInfo, RxeFlushWr, RxeMwWr, RxeRdmaWr,
    RxeSendWqe, RxeSendWr, RxeSendWrUnion, RxeSge, RxeUdWr, WQE_STATE_POSTED,
};
use vrdma_spec::{Le16, Le32, Le64};
use zerocopy::FromZeros;

use super::queue::{RxeQueue, SlotWriter};
use vrdma_spec::verbs::{AccessFlags, QpType, WrOpcode};

use crate::provider::{MwBind, PostError, SendFlags, SendWr, Sge, UdDest};

/// Limits the device reported when it created the send queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendQueueCaps {
    /// Transport of the QP.
    pub qp_type: QpType,
    /// Most SGEs per request.
    pub max_sge: u32,
    /// Most inline bytes per request.
    pub max_inline: u32,
}

/// The send queue of a QP.
///
/// Once posted, a slot belongs to the kernel until its consumer index passes it: the kernel
/// keeps writing into it (state, status, PSNs, DMA progress). Nothing here reads a posted
/// slot back.
#[derive(Debug)]
pub struct SendQueue {
    pub(super) queue: RxeQueue,
    pub(super) caps: SendQueueCaps,
    /// Next slot to fill; the authoritative copy of the producer index (this side owns it, so
    /// it is never re-read from shared memory).
    pub(super) producer: u32,
}

/// What the checks of a send request look at, whichever API built it.
#[derive(Clone, Copy, Debug)]
pub(super) struct WqeShape {
    pub(super) opcode: WrOpcode,
    pub(super) flags: SendFlags,
    pub(super) num_sge: usize,
    /// Sum of the SGE lengths, or the inline bytes.
    pub(super) length: u64,
    pub(super) has_ud_dest: bool,
    pub(super) remote_addr: u64,
    /// The bind of a BIND_MW request.
    pub(super) bind: Option<MwBind>,
}

impl WqeShape {
    fn of(wr: &SendWr<'_>) -> Self {
        WqeShape {
            opcode: wr.opcode,
            flags: wr.flags,
            num_sge: wr.sg_list.len(),
            length: wr
                .fixed_length()
                .unwrap_or_else(|| wr.sg_list.iter().map(|sge| u64::from(sge.length)).sum()),
            has_ud_dest: wr.ud.is_some(),
            remote_addr: wr.remote_addr,
            bind: wr.bind,
        }
    }
}

impl SendQueue {
    /// A send queue over `queue`, whose slots must hold requests of the sizes in `caps`.
    pub fn new(queue: RxeQueue, caps: SendQueueCaps) -> Result<Self, GeometryError> {
        queue.check_entry(send_wqe_size(caps.max_sge, caps.max_inline))?;
        let producer = queue.load_producer(Ordering::Relaxed);
        Ok(SendQueue {
            queue,
            caps,
            producer,
        })
    }

    /// The limits requests are checked against.
    pub fn caps(&self) -> SendQueueCaps {
        self.caps
    }

    /// How many requests the queue holds at most.
    pub fn capacity(&self) -> u32 {
        self.queue.capacity()
    }

    /// Writes `wrs` into the queue in order, like `ibv_post_send`.
    ///
    /// On error, `Err((n, e))` says that the first `n` requests were posted and request `n`
    /// was refused for `e`; nothing after it was looked at. The queue is never overwritten: a
    /// full queue refuses with [`PostError::QueueFull`].
    ///
    /// The device only notices posted requests when the caller rings the send doorbell: after
    /// `Ok(())` with a non-empty `wrs`, or after `Err((n, _))` with `n > 0`.
    ///
    /// # Safety
    ///
    /// For every request with [`SendFlags::INLINE`], each SGE must describe memory of this
    /// process, `[addr, addr + length)`, that is readable for the duration of the call (the
    /// bytes are copied into the queue). Like `ibv_post_send`, the SGEs of other requests are
    /// not dereferenced here: the device checks them against their memory regions.
    pub unsafe fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), (usize, PostError)> {
        let mut result = Ok(());
        let mut producer = self.producer;
        for (i, wr) in wrs.iter().enumerate() {
            // SAFETY: the caller guarantees the inline SGEs of `wrs` are readable.
            if let Err(e) = unsafe { self.post_one(producer, wr) } {
                result = Err((i, e));
                break;
            }
            producer = self.queue.next(producer);
        }
        if producer != self.producer {
            // Release: the WQE writes above (in place, or each one `RegionAccess::write`)
            // become visible to the kernel before the index that hands them over.
            self.queue.store_producer(producer, Ordering::Release);
            self.producer = producer;
        }
        result
    }

    /// Checks `wr` and writes it into slot `index`, without publishing it.
    ///
    /// # Safety
    ///
    /// As for [`Self::post_send`].
    unsafe fn post_one(&mut self, index: u32, wr: &SendWr<'_>) -> Result<(), PostError> {
        let length = self.check(wr)?;
        // Acquire: the kernel's last accesses to the slot it passed happen before the writes
        // below reuse it.
        if self.queue.next(index) == self.queue.load_consumer(Ordering::Acquire) {
            return Err(PostError::QueueFull);
        }

        // SAFETY: `index` is the producer slot and the queue is not full, so the kernel does
        // not access this slot until `post_send` publishes the producer index.
        let mut entry = unsafe { self.queue.slot_writer(index) };
        put_request(&mut entry, wr);
        let end = if wr.opcode.wqe_operand_len() != 0 {
            put_operand(&mut entry, wr.compare_add)
        } else if wr.flags.contains(SendFlags::INLINE) {
            let chunks = wr
                .sg_list
                .iter()
                .map(|sge| (sge.addr as usize as *const u8, sge.length as usize));
            // SAFETY: the sources are readable application memory (contract of `post_send`);
            // `check` bounded their total by the slot's inline room.
            unsafe { put_inline(&mut entry, chunks) }
        } else {
            put_sges(&mut entry, wr.sg_list)
        };
        put_dma(&mut entry, length, wr.sg_list.len() as u32);
        entry.commit(end);
        Ok(())
    }

    /// Validates `wr` against the queue; returns the total payload length.
    fn check(&self, wr: &SendWr<'_>) -> Result<u32, PostError> {
        self.check_shape(&WqeShape::of(wr))
    }

    /// Validates a request against the queue, as rdma-core's rxe provider and rdma_rxe's
    /// opcode table do; returns the total payload length.
    pub(super) fn check_shape(&self, wr: &WqeShape) -> Result<u32, PostError> {
        let caps = &self.caps;
        if wr.num_sge > caps.max_sge as usize {
            return Err(PostError::TooManySges {
                num: wr.num_sge,
                max: caps.max_sge,
            });
        }
        let total = wr.length;
        let length = u32::try_from(total).map_err(|_| PostError::MessageTooLong(total))?;

        match (caps.qp_type, wr.has_ud_dest) {
            (QpType::Ud, false) => return Err(PostError::MissingUdDest),
            (QpType::Rc | QpType::Uc, true) => return Err(PostError::UnexpectedUdDest),
            _ => {}
        }
        // As rdma_rxe's opcode table: a UC QP has no READ or atomics, a UD QP only sends.
        if !wr.opcode.valid_on(caps.qp_type) {
            return Err(PostError::OpcodeNotSupported {
                opcode: wr.opcode,
                qp_type: caps.qp_type,
            });
        }
        if wr.flags.contains(SendFlags::INLINE) {
            if !wr.opcode.allows_inline() {
                return Err(PostError::InlineNotAllowed(wr.opcode));
            }
            if total > u64::from(caps.max_inline) {
                return Err(PostError::InlineTooLong {
                    len: total,
                    max: caps.max_inline,
                });
            }
        }
        if wr.opcode.is_atomic() && (length < 8 || !wr.remote_addr.is_multiple_of(8)) {
            return Err(PostError::InvalidAtomic);
        }
        if !wr.opcode.takes_sges() && wr.num_sge != 0 {
            return Err(PostError::UnexpectedSges(wr.opcode));
        }
        let operand = wr.opcode.wqe_operand_len();
        if operand != 0 {
            // The operand sits where SGEs or inline data would (rxe's `dma.atomic_wr`).
            if size_of::<RxeSendWqe>() + operand > self.queue.slot_size() {
                return Err(PostError::InlineTooLong {
                    len: operand as u64,
                    max: (self.queue.slot_size() - size_of::<RxeSendWqe>()) as u32,
                });
            }
            return Ok(length);
        }
        if wr.opcode == WrOpcode::BindMw {
            let access_ok = |b: &MwBind| b.access.bits() & !AccessFlags::MW_ALLOWED.bits() == 0;
            if !wr.bind.as_ref().is_some_and(access_ok) {
                return Err(PostError::InvalidBind);
            }
        }
        Ok(length)
    }
}

/// Writes the request part of a send WQE: the kernel request (`wr`, whose opcode-specific
/// union and `iova` come from `wr`'s opcode: remote operands, the window bind of BIND_MW, the
/// rkey LOCAL_INV and SEND_WITH_INV invalidate), `state` and `iova`. The payload and its `dma`
/// description are written by [`put_sges`] or [`put_inline`] and [`put_dma`].
///
/// The fields the kernel owns (status, mask, PSNs...) are not written, as in rdma-core's
/// `ibv_post_send`. An accessed queue's single write still covers them, with the zeros its
/// scratch slot always holds there: what rdma-core's `ibv_wr_*` calls, which clear the whole
/// WQE, leave in them.
pub(super) fn put_request(entry: &mut SlotWriter<'_>, wr: &SendWr<'_>) {
    let (union, iova) = wr_union(wr);
    let kwr = RxeSendWr {
        wr_id: Le64::new(wr.wr_id),
        reserved: Le32::ZERO,
        opcode: Le32::new(wr.opcode as u32),
        send_flags: Le32::new(wr.flags.bits()),
        // `imm_data` is kept in network byte order, so its bytes go in unchanged;
        // `invalidate_rkey` is a host-order `__u32`.
        ex: if wr.opcode.has_imm() {
            wr.imm_data.to_ne_bytes()
        } else if wr.opcode.has_invalidate() {
            wr.invalidate_rkey.to_le_bytes()
        } else {
            [0; 4]
        },
        wr: union,
    };
    entry.put(offset_of!(RxeSendWqe, wr), kwr);
    entry.put(offset_of!(RxeSendWqe, state), Le32::new(WQE_STATE_POSTED));
    entry.put(offset_of!(RxeSendWqe, iova), Le64::new(iova));
}

/// Rewrites the send flags of the request [`put_request`] wrote.
pub(super) fn put_send_flags(entry: &mut SlotWriter<'_>, flags: SendFlags) {
    let at = offset_of!(RxeSendWqe, wr) + offset_of!(RxeSendWr, send_flags);
    entry.put(at, Le32::new(flags.bits()));
}

/// Writes the destination of a UD send into the request [`put_request`] wrote.
pub(super) fn put_ud_dest(entry: &mut SlotWriter<'_>, dest: &UdDest<'_>) {
    let at = offset_of!(RxeSendWqe, wr) + offset_of!(RxeSendWr, wr);
    entry.put(at, ud_union(dest));
}

/// Writes the `dma` description of a payload of `length` bytes in `num_sge` SGEs (0 for
/// inline data).
pub(super) fn put_dma(entry: &mut SlotWriter<'_>, length: u32, num_sge: u32) {
    let dma = RxeDmaInfo {
        length: Le32::new(length),
        resid: Le32::new(length),
        cur_sge: Le32::ZERO,
        num_sge: Le32::new(num_sge),
        sge_offset: Le32::ZERO,
        reserved: Le32::ZERO,
    };
    entry.put(offset_of!(RxeSendWqe, dma), dma);
}

/// Writes the 8 bytes of an ATOMIC_WRITE (`value`'s bytes in memory order) into the payload
/// area, rxe's `dma.atomic_wr`; returns the end of the entry.
pub(super) fn put_operand(entry: &mut SlotWriter<'_>, value: u64) -> usize {
    let start = size_of::<RxeSendWqe>();
    let bytes = value.to_ne_bytes();
    entry.put(start, bytes);
    start + bytes.len()
}

/// Writes `sges` into the payload area, which directly follows the WQE; returns the end of the
/// entry. The caller checked that the slot holds them (at most `max_sge`).
pub(super) fn put_sges(entry: &mut SlotWriter<'_>, sges: &[Sge]) -> usize {
    let mut end = size_of::<RxeSendWqe>();
    for sge in sges {
        let sge = RxeSge {
            addr: Le64::new(sge.addr),
            length: Le32::new(sge.length),
            lkey: Le32::new(sge.lkey),
        };
        entry.put(end, sge);
        end += size_of::<RxeSge>();
    }
    end
}

/// Copies the bytes of `chunks` (start, length) one after the other into the payload area;
/// returns the end of the entry. The caller checked that the slot holds them (at most
/// `max_inline` bytes in all).
///
/// # Safety
/// Each chunk is readable memory of this process for the duration of the call.
pub(super) unsafe fn put_inline(
    entry: &mut SlotWriter<'_>,
    chunks: impl Iterator<Item = (*const u8, usize)>,
) -> usize {
    let mut end = size_of::<RxeSendWqe>();
    for (src, len) in chunks.filter(|&(_, len)| len != 0) {
        // SAFETY: the caller's contract.
        unsafe { entry.put_bytes(end, src, len) };
        end += len;
    }
    end
}

/// The opcode-specific union of the kernel request and the WQE's `iova`.
fn wr_union(wr: &SendWr<'_>) -> (RxeSendWrUnion, u64) {
    if wr.opcode == WrOpcode::Flush {
        let flush = RxeFlushWr {
            remote_addr: Le64::new(wr.remote_addr),
            length: Le32::ZERO,
            rkey: Le32::new(wr.rkey),
            flush_type: wr.flush.flush_type,
            level: wr.flush.level,
            reserved: [0; 6],
        };
        (RxeSendWrUnion::from_flush(flush), wr.remote_addr)
    } else if wr.opcode.is_rdma() || wr.opcode == WrOpcode::AtomicWrite {
        let rdma = RxeRdmaWr {
            remote_addr: Le64::new(wr.remote_addr),
            rkey: Le32::new(wr.rkey),
            reserved: Le32::ZERO,
        };
        (RxeSendWrUnion::from_rdma(rdma), wr.remote_addr)
    } else if wr.opcode.is_atomic() {
        let atomic = RxeAtomicWr {
            remote_addr: Le64::new(wr.remote_addr),
            compare_add: Le64::new(wr.compare_add),
            swap: Le64::new(wr.swap),
            rkey: Le32::new(wr.rkey),
            reserved: Le32::ZERO,
        };
        (RxeSendWrUnion::from_atomic(atomic), wr.remote_addr)
    } else if let (WrOpcode::BindMw, Some(bind)) = (wr.opcode, wr.bind) {
        let mw = RxeMwWr {
            addr: Le64::new(bind.addr),
            length: Le64::new(bind.length),
            mr_lkey: Le32::new(bind.mr_lkey),
            mw_rkey: Le32::new(bind.mw_rkey),
            rkey: Le32::new(bind.rkey),
            access: Le32::new(bind.access.bits()),
        };
        (RxeSendWrUnion::from_mw(mw), 0)
    } else {
        let union = wr.ud.as_ref().map_or(RxeSendWrUnion::ZERO, ud_union);
        (union, 0)
    }
}

/// The union of a UD send to `dest`.
fn ud_union(dest: &UdDest<'_>) -> RxeSendWrUnion {
    let ah = dest.ah;
    RxeSendWrUnion::from_ud(RxeUdWr {
        remote_qpn: Le32::new(dest.remote_qpn),
        remote_qkey: Le32::new(dest.remote_qkey),
        pkey_index: Le16::ZERO,
        reserved: Le16::ZERO,
        ah_num: Le32::new(ah.ah_num),
        pad: [0; 16],
        // Kernels that return an AH number look the address up themselves; only the old ones
        // (ah_num 0) need it in every WQE.
        av: if ah.ah_num == 0 {
            ah.av
        } else {
            RxeAv::new_zeroed()
        },
    })
}

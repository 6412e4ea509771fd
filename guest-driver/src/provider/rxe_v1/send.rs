//! Posting send work requests as native rxe send WQEs.

use std::mem::{offset_of, size_of};
use std::sync::atomic::Ordering;

use vrdma_spec::rxe_v1::{
    send_wqe_size, RxeAtomicWr, RxeAv, RxeDmaInfo, RxeMwWr, RxeRdmaWr, RxeSendWqe, RxeSendWr,
    RxeSendWrUnion, RxeSge, RxeUdWr, WQE_STATE_POSTED,
};
use vrdma_spec::{Le16, Le32, Le64};
use zerocopy::FromZeros;

use super::queue::{QueueError, RxeQueue};
use vrdma_spec::verbs::{AccessFlags, QpType, WrOpcode};

use crate::provider::{PostError, SendFlags, SendWr, UdDest};

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
    queue: RxeQueue,
    caps: SendQueueCaps,
    /// Next slot to fill; the authoritative copy of the producer index (this side owns it, so
    /// it is never re-read from shared memory).
    producer: u32,
}

impl SendQueue {
    /// A send queue over `queue`, whose slots must hold requests of the sizes in `caps`.
    pub fn new(queue: RxeQueue, caps: SendQueueCaps) -> Result<Self, QueueError> {
        let need = send_wqe_size(caps.max_sge, caps.max_inline);
        if need > queue.slot_size() {
            return Err(QueueError::SlotTooSmall {
                need,
                slot: queue.slot_size(),
            });
        }
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
        let dma = RxeDmaInfo {
            length: Le32::new(length),
            resid: Le32::new(length),
            cur_sge: Le32::ZERO,
            num_sge: Le32::new(wr.sg_list.len() as u32),
            sge_offset: Le32::ZERO,
            reserved: Le32::ZERO,
        };
        // SAFETY: `index` is the producer slot and the queue is not full, so the kernel does
        // not access this slot until `post_send` publishes the producer index.
        let mut entry = unsafe { self.queue.slot_writer(index) };
        // The fields the kernel owns (status, mask, PSNs...) are not written here, as in
        // rdma-core's `ibv_post_send`. An accessed queue's single write still covers them,
        // with the zeros its scratch slot always holds there: what rdma-core's `ibv_wr_*`
        // calls, which clear the whole WQE, leave in them.
        entry.put(offset_of!(RxeSendWqe, wr), kwr);
        entry.put(offset_of!(RxeSendWqe, state), Le32::new(WQE_STATE_POSTED));
        entry.put(offset_of!(RxeSendWqe, iova), Le64::new(iova));
        entry.put(offset_of!(RxeSendWqe, dma), dma);
        // The payload area directly follows the WQE; `new` checked that the slot holds it with
        // `max_sge` SGEs or `max_inline` bytes, which `check` enforced.
        let mut end = size_of::<RxeSendWqe>();
        if wr.flags.contains(SendFlags::INLINE) {
            for sge in wr.sg_list.iter().filter(|sge| sge.length != 0) {
                let len = sge.length as usize;
                // SAFETY: the source is readable application memory (contract of
                // `post_send`).
                unsafe { entry.put_bytes(end, sge.addr as usize as *const u8, len) };
                end += len;
            }
        } else {
            for sge in wr.sg_list {
                let sge = RxeSge {
                    addr: Le64::new(sge.addr),
                    length: Le32::new(sge.length),
                    lkey: Le32::new(sge.lkey),
                };
                entry.put(end, sge);
                end += size_of::<RxeSge>();
            }
        }
        entry.commit(end);
        Ok(())
    }

    /// Validates `wr` against the queue; returns the total payload length.
    fn check(&self, wr: &SendWr<'_>) -> Result<u32, PostError> {
        let caps = &self.caps;
        if wr.sg_list.len() > caps.max_sge as usize {
            return Err(PostError::TooManySges {
                num: wr.sg_list.len(),
                max: caps.max_sge,
            });
        }
        let total: u64 = wr.sg_list.iter().map(|sge| u64::from(sge.length)).sum();
        let length = u32::try_from(total).map_err(|_| PostError::MessageTooLong(total))?;

        match (caps.qp_type, &wr.ud) {
            (QpType::Ud, None) => return Err(PostError::MissingUdDest),
            (QpType::Rc | QpType::Uc, Some(_)) => return Err(PostError::UnexpectedUdDest),
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
        if wr.opcode.is_local() && !wr.sg_list.is_empty() {
            return Err(PostError::UnexpectedSges(wr.opcode));
        }
        if wr.opcode == WrOpcode::BindMw {
            let access_ok = |b: &crate::provider::MwBind| {
                b.access.bits() & !AccessFlags::MW_ALLOWED.bits() == 0
            };
            if !wr.bind.as_ref().is_some_and(access_ok) {
                return Err(PostError::InvalidBind);
            }
        }
        Ok(length)
    }
}

/// The opcode-specific union of the kernel request and the WQE's `iova`.
fn wr_union(wr: &SendWr<'_>) -> (RxeSendWrUnion, u64) {
    if wr.opcode.is_rdma() {
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
        let union = match wr.ud {
            Some(UdDest {
                ah,
                remote_qpn,
                remote_qkey,
            }) => RxeSendWrUnion::from_ud(RxeUdWr {
                remote_qpn: Le32::new(remote_qpn),
                remote_qkey: Le32::new(remote_qkey),
                pkey_index: Le16::ZERO,
                reserved: Le16::ZERO,
                ah_num: Le32::new(ah.ah_num),
                pad: [0; 16],
                // Kernels that return an AH number look the address up themselves; only the
                // old ones (ah_num 0) need it in every WQE.
                av: if ah.ah_num == 0 {
                    ah.av
                } else {
                    RxeAv::new_zeroed()
                },
            }),
            None => RxeSendWrUnion::ZERO,
        };
        (union, 0)
    }
}

//! The doorbell area: how a driver tells the device *which* QPs to kick without a lock shared
//! across QPs.
//!
//! The area lives in driver memory (guest RAM) and is registered once with
//! `SET_DOORBELL_AREA`. Its layout, in 32-bit little-endian words:
//!
//! | offset | field | owner |
//! | --- | --- | --- |
//! | 0 | `tail`: number of entries ever enqueued (wraps) | driver (atomic fetch-add) |
//! | 64 | `head`: number of entries the device consumed (informational) | device |
//! | 68 | `polling`: non-zero while the device polls the area (with `VRDMA_F_DOORBELL_POLL`) | device |
//! | 128 | `ring[n]`: `doorbell_index + 1`, or 0 when empty | driver writes, device clears |
//! | 128 + 4n | `pending[n]`: 1 while the QP's index is queued, else 0 | both (atomic swap) |
//!
//! `n` is a power of two no smaller than the number of QPs the device allows a guest, so a QP
//! queued at most once can never overrun the ring. Ringing costs the driver one swap and, only
//! when the QP was not already queued, one fetch-add, one store and one notification; the device
//! touches exactly the entries that were queued.
//!
//! Ordering (the race every doorbell design has to close): the driver publishes its SQ producer
//! index with a Release store, then executes a full fence, then swaps `pending`. If the swap finds
//! 1, the QP is still queued and the device has not yet cleared it; the device's later swap of
//! `pending` (Acquire) reads that value, so the producer store happens-before the kick that
//! follows the device's swap. The device therefore clears `pending` *before* it kicks.
//!
//! Notification suppression (`VRDMA_F_DOORBELL_POLL`): a device may keep polling the area for a
//! while after a notification and sets `polling` meanwhile; a driver that queued an entry then
//! skips its notification if it reads `polling` non-zero ([`DoorbellArea::ring_polled`]). The
//! race to close is the device going to sleep just as a driver decides not to notify. Both
//! sides order a store before a load of the other side's word with a full fence:
//!
//! - driver: store `ring[t]` → fence(SeqCst) → load `polling`;
//! - device ([`DoorbellArea::stop_polling`]): store `polling = 0` → fence(SeqCst) → drain.
//!
//! Of two SeqCst fences one precedes the other in their single total order. If the driver's
//! comes first, the device's drain after its own fence observes the driver's `ring[t]` store
//! and kicks. If the device's comes first, the driver's load after its fence observes
//! `polling = 0` (or a later value: a later `polling = 1` belongs to a later polling phase,
//! which ends with the same clear-fence-drain), so the driver notifies. Either way the entry is
//! seen. A driver still between its fetch-add and its store when the device drains blocks the
//! drain at its empty slot; it performs the same store-fence-load afterwards, so the argument
//! covers it and every entry queued behind it.

use core::sync::atomic::{fence, AtomicU32, Ordering};

/// Word offset of `tail`.
pub const TAIL_WORD: usize = 0;
/// Word offset of `head`.
pub const HEAD_WORD: usize = 16;
/// Word offset of `polling` (in the device's cache line, next to `head`).
pub const POLLING_WORD: usize = 17;
/// Word offset of `ring[0]`.
pub const RING_WORD: usize = 32;

/// Bytes of a doorbell area with `slots` entries.
pub const fn area_bytes(slots: u32) -> usize {
    (RING_WORD + 2 * slots as usize) * 4
}

/// Why a region of memory cannot serve as a doorbell area.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AreaError {
    /// `slots` is zero, not a power of two, or above [`MAX_SLOTS`].
    #[error("doorbell area slot count {0} is not a power of two in 1..={MAX_SLOTS}")]
    BadSlots(u32),
    /// The memory is smaller than the layout needs.
    #[error("doorbell area needs {needed} bytes, got {got}")]
    TooSmall {
        /// Bytes the layout needs.
        needed: usize,
        /// Bytes provided.
        got: usize,
    },
}

/// Largest slot count a device accepts (one per QP of a guest).
pub const MAX_SLOTS: u32 = 1 << 16;

/// A doorbell area over shared words. Both sides build one over the same memory; the caller
/// that turns raw shared memory into `&[AtomicU32]` carries the `unsafe`.
#[derive(Debug, Clone, Copy)]
pub struct DoorbellArea<'a> {
    tail: &'a AtomicU32,
    head: &'a AtomicU32,
    polling: &'a AtomicU32,
    ring: &'a [AtomicU32],
    pending: &'a [AtomicU32],
}

impl<'a> DoorbellArea<'a> {
    /// Lays the area over `words` (at least [`area_bytes`]`(slots) / 4` of them).
    pub fn new(words: &'a [AtomicU32], slots: u32) -> Result<Self, AreaError> {
        if slots == 0 || !slots.is_power_of_two() || slots > MAX_SLOTS {
            return Err(AreaError::BadSlots(slots));
        }
        let n = slots as usize;
        let needed = area_bytes(slots);
        if words.len() * 4 < needed {
            return Err(AreaError::TooSmall {
                needed,
                got: words.len() * 4,
            });
        }
        Ok(Self {
            tail: &words[TAIL_WORD],
            head: &words[HEAD_WORD],
            polling: &words[POLLING_WORD],
            ring: &words[RING_WORD..RING_WORD + n],
            pending: &words[RING_WORD + n..RING_WORD + 2 * n],
        })
    }

    /// Number of slots.
    pub fn slots(&self) -> u32 {
        self.ring.len() as u32
    }

    /// Driver side: records that the QP with `index` has new send WQEs. Call it after the SQ
    /// producer index was published with a Release store. Returns whether the driver must notify
    /// the doorbell queue (false when the QP was still queued from an earlier ring).
    ///
    /// An `index` outside the area is ignored (returns false): indices come from the device.
    pub fn ring(&self, index: u32) -> bool {
        let Some(pending) = self.pending.get(index as usize) else {
            return false;
        };
        // Orders the caller's SQ producer store before the pending swap (store-load ordering
        // needs a full fence; AcqRel on the swap alone would not order an earlier store to a
        // different location against the device's reads).
        fence(Ordering::SeqCst);
        if pending.swap(1, Ordering::AcqRel) != 0 {
            return false;
        }
        let at = self.tail.fetch_add(1, Ordering::AcqRel) as usize & (self.ring.len() - 1);
        self.ring[at].store(index + 1, Ordering::Release);
        true
    }

    /// Driver side with `VRDMA_F_DOORBELL_POLL` negotiated: [`DoorbellArea::ring`], then
    /// whether the device must be notified, which it need not while it polls the area. See the
    /// module documentation for why a device that stops polling cannot miss the entry.
    pub fn ring_polled(&self, index: u32) -> bool {
        if !self.ring(index) {
            return false;
        }
        // Orders the `ring[t]` store above before the load of `polling` (store-load: only a
        // full fence does it); pairs with the fence in `stop_polling`.
        fence(Ordering::SeqCst);
        self.polling.load(Ordering::Relaxed) == 0
    }

    /// Device side: announces that the device polls the area, so drivers that negotiated
    /// `VRDMA_F_DOORBELL_POLL` stop notifying. Only [`DoorbellArea::stop_polling`] may end it.
    pub fn start_polling(&self) {
        // No ordering needed: a driver that reads the flag and skips its notification is
        // covered by the clear-fence-drain of `stop_polling`, whenever it happens.
        self.polling.store(1, Ordering::Relaxed);
    }

    /// Device side, when no doorbell can be owed (the area is being registered or dropped with
    /// every QP): clears `polling` without the drain that [`DoorbellArea::stop_polling`] adds.
    pub fn reset_polling(&self) {
        self.polling.store(0, Ordering::Release);
    }

    /// Whether the area says the device polls it (the device's own flag; a driver scribbling
    /// over it only silences its own notifications).
    pub fn is_polling(&self) -> bool {
        self.polling.load(Ordering::Relaxed) != 0
    }

    /// Device side: ends a polling phase. Clears `polling`, executes a full fence, then drains
    /// once more (as [`DoorbellArea::drain`]): a driver that saw the flag still set and skipped
    /// its notification had queued its entry before this drain can miss it. Returns the number
    /// of entries this last drain consumed.
    pub fn stop_polling(&self, head: &mut u32, kick: impl FnMut(u32)) -> usize {
        self.polling.store(0, Ordering::Relaxed);
        // Orders the clear before the drain's loads of `ring` (store-load); pairs with the
        // fence in `ring_polled`.
        fence(Ordering::SeqCst);
        self.drain(head, kick)
    }

    /// Device side: consumes queued entries starting at `*head` and calls `kick` once per valid
    /// index whose `pending` flag it clears. Stops at the first empty slot (a driver between its
    /// fetch-add and its store notifies again afterwards) or after one lap of the ring, so a
    /// driver that scribbles over the area cannot keep the device busy. Indices at or beyond the
    /// slot count are dropped, and so are entries whose `pending` flag is already clear: a
    /// driver queues an index only after setting its flag, so such an entry repeats one already
    /// kicked (a ring filled with one index costs one kick, not one per entry). Returns the
    /// number of entries consumed.
    pub fn drain(&self, head: &mut u32, mut kick: impl FnMut(u32)) -> usize {
        let mask = self.ring.len() - 1;
        let mut consumed = 0;
        while consumed < self.ring.len() {
            let slot = &self.ring[*head as usize & mask];
            let value = slot.load(Ordering::Acquire);
            if value == 0 {
                break;
            }
            slot.store(0, Ordering::Relaxed);
            *head = head.wrapping_add(1);
            consumed += 1;
            let index = value - 1;
            let queued = self.pending.get(index as usize);
            if queued.is_some_and(|pending| pending.swap(0, Ordering::AcqRel) != 0) {
                kick(index);
            }
        }
        self.head.store(*head, Ordering::Release);
        consumed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn words(slots: u32) -> Vec<AtomicU32> {
        (0..area_bytes(slots) / 4)
            .map(|_| AtomicU32::new(0))
            .collect()
    }

    #[test]
    fn layout_and_validation() {
        assert_eq!(area_bytes(1024), 128 + 8 * 1024);
        assert_eq!(POLLING_WORD * 4, 68, "spec §5.3 byte offset");
        let w = words(8);
        assert!(DoorbellArea::new(&w, 8).is_ok());
        assert_eq!(
            DoorbellArea::new(&w, 16).unwrap_err(),
            AreaError::TooSmall {
                needed: area_bytes(16),
                got: area_bytes(8)
            }
        );
        assert_eq!(
            DoorbellArea::new(&w, 6).unwrap_err(),
            AreaError::BadSlots(6)
        );
        assert_eq!(
            DoorbellArea::new(&w, 0).unwrap_err(),
            AreaError::BadSlots(0)
        );
    }

    #[test]
    fn a_queued_qp_is_queued_once_and_kicked_once() {
        let w = words(8);
        let area = DoorbellArea::new(&w, 8).unwrap();
        assert!(area.ring(3));
        assert!(
            !area.ring(3),
            "still queued: no second entry, no notification"
        );
        assert!(area.ring(5));
        assert!(!area.ring(8), "outside the area");
        let mut head = 0;
        let mut kicked = vec![];
        assert_eq!(area.drain(&mut head, |i| kicked.push(i)), 2);
        assert_eq!(kicked, [3, 5]);
        assert!(area.ring(3), "kicked: ringing again queues again");
    }

    #[test]
    fn a_polling_device_is_not_notified_and_its_last_drain_finds_the_entry() {
        let w = words(8);
        let area = DoorbellArea::new(&w, 8).unwrap();
        assert!(!area.is_polling());
        area.start_polling();
        assert!(area.is_polling());
        assert!(!area.ring_polled(2), "the device polls: no notification");
        assert!(!area.ring_polled(2), "still queued");
        let mut head = 0;
        let mut kicked = vec![];
        assert_eq!(area.stop_polling(&mut head, |i| kicked.push(i)), 1);
        assert_eq!(kicked, [2], "the drain after clearing the flag kicks it");
        assert!(!area.is_polling());
        assert!(area.ring_polled(2), "no longer polling: notify");
        // Without the feature, `ring` ignores the flag.
        area.start_polling();
        assert!(area.ring(4));
    }

    #[test]
    fn garbage_in_the_area_costs_at_most_one_lap() {
        let w = words(4);
        for word in &w {
            word.store(0xffff_ffff, Ordering::Relaxed);
        }
        let area = DoorbellArea::new(&w, 4).unwrap();
        let mut head = 0;
        let mut kicked = 0;
        assert_eq!(area.drain(&mut head, |_| kicked += 1), 4);
        assert_eq!(kicked, 0, "indices beyond the area are dropped");
        // The ring is clean again afterwards.
        assert_eq!(area.drain(&mut head, |_| kicked += 1), 0);
    }

    /// Each producer publishes a sequence number per QP (its "SQ producer"), rings, and waits
    /// until a kick has observed that number before the next round. A lost doorbell stalls the
    /// producer: the test fails instead of hanging. Waiting right after the kick puts the next
    /// ring exactly in the window between the device's kick and its clearing of `pending`,
    /// where an implementation that clears after kicking loses doorbells.
    #[test]
    fn a_ring_filled_with_one_index_costs_one_kick() {
        const SLOTS: u32 = 1024;
        let w = words(SLOTS);
        let area = DoorbellArea::new(&w, SLOTS).unwrap();
        // The driver queues QP 7 properly once, then writes its index into every other slot.
        assert!(area.ring(7));
        for slot in 1..SLOTS as usize {
            w[RING_WORD + slot].store(7 + 1, Ordering::Relaxed);
        }
        let mut head = 0;
        let mut kicks = 0;
        assert_eq!(area.drain(&mut head, |_| kicks += 1), SLOTS as usize);
        assert_eq!(
            kicks, 1,
            "one kick for one queued QP, however many entries repeat it"
        );
        // Entries whose flag nobody set (never queued) cost nothing either.
        w[RING_WORD].store(3 + 1, Ordering::Relaxed);
        let mut head = 0;
        assert_eq!(area.drain(&mut head, |_| kicks += 1), 1);
        assert_eq!(kicks, 1);
    }

    #[test]
    fn no_doorbell_is_lost_under_contention() {
        const QPS: u32 = 8;
        const ROUNDS: u32 = 5_000;
        let w: Arc<Vec<AtomicU32>> = Arc::new(words(QPS));
        let producers: Arc<Vec<AtomicU32>> =
            Arc::new((0..QPS).map(|_| AtomicU32::new(0)).collect());
        let seen: Arc<Vec<AtomicU32>> = Arc::new((0..QPS).map(|_| AtomicU32::new(0)).collect());
        let done = Arc::new(AtomicBool::new(false));

        let consumer = {
            let (w, producers, seen, done) =
                (w.clone(), producers.clone(), seen.clone(), done.clone());
            std::thread::spawn(move || {
                let area = DoorbellArea::new(&w, QPS).unwrap();
                let mut head = 0;
                while !done.load(Ordering::Acquire) {
                    area.drain(&mut head, |i| {
                        let v = producers[i as usize].load(Ordering::Acquire);
                        seen[i as usize].store(v, Ordering::Release);
                    });
                }
            })
        };
        let threads: Vec<_> = (0..2)
            .map(|t| {
                let (w, producers, seen) = (w.clone(), producers.clone(), seen.clone());
                std::thread::spawn(move || {
                    let area = DoorbellArea::new(&w, QPS).unwrap();
                    for round in 1..=ROUNDS {
                        for qp in (t..QPS).step_by(2) {
                            producers[qp as usize].store(round, Ordering::Release);
                            area.ring(qp);
                        }
                        for qp in (t..QPS).step_by(2) {
                            let deadline = Instant::now() + Duration::from_secs(10);
                            while seen[qp as usize].load(Ordering::Acquire) < round {
                                assert!(
                                    Instant::now() < deadline,
                                    "QP {qp} lost its doorbell in round {round}"
                                );
                                std::hint::spin_loop();
                            }
                        }
                    }
                })
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join()).collect();
        done.store(true, Ordering::Release);
        consumer.join().unwrap();
        for r in results {
            r.unwrap();
        }
    }
}

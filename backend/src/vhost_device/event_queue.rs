//! The events waiting for buffers of the guest's event queue: bounded, in order, with a
//! policy for what to drop when the guest posts no buffers.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

use log::warn;
use parking_lot::Mutex;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Largest event the event queue carries.
pub const MAX_EVENT_SIZE: usize = 64;

/// Events kept for the guest while it posts no event buffers.
pub const DEFAULT_EVENT_CAPACITY: usize = 4096;

/// How an event may be treated when the guest does not post event buffers fast enough.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventClass {
    /// A completion notification. The guest can recover a lost one by polling its CQ, so these
    /// are dropped first (oldest first) when the queue is full.
    Completion,
    /// Anything else (asynchronous errors, port changes, ...). Dropped only when the queue holds
    /// nothing but such events, oldest first.
    Async,
}

/// Errors of [`EventQueue::push`].
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// The event is empty or larger than [`MAX_EVENT_SIZE`].
    #[error("an event must be 1..={MAX_EVENT_SIZE} bytes, not {0}")]
    BadSize(usize),
    /// Waking the event worker failed.
    #[error("cannot wake the event worker: {0}")]
    Wake(#[source] io::Error),
}

#[derive(Clone, Copy)]
struct QueuedEvent {
    class: EventClass,
    len: u8,
    bytes: [u8; MAX_EVENT_SIZE],
}

impl QueuedEvent {
    fn new(bytes: &[u8], class: EventClass) -> Self {
        let mut event = QueuedEvent {
            class,
            len: bytes.len() as u8,
            bytes: [0; MAX_EVENT_SIZE],
        };
        event.bytes[..bytes.len()].copy_from_slice(bytes);
        event
    }

    fn bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

struct PendingEvents {
    queue: VecDeque<QueuedEvent>,
    lost: u64,
}

/// What one attempt to hand an event to the guest did.
pub(crate) enum Placement {
    /// The event went into a buffer.
    Delivered,
    /// A buffer was used up without taking the event (too small, bad address); try the next.
    BufferWasted,
    /// No buffer is available.
    NoBuffer,
}

/// Events waiting for guest buffers on the event queue: bounded, in order.
///
/// Overflow policy: when full, the oldest [`EventClass::Completion`] event is dropped; if there
/// is none, the oldest event. Dropped events are counted and reported through
/// the device handler's `events_lost` notice before the next delivery.
pub struct EventQueue {
    pending: Mutex<PendingEvents>,
    capacity: usize,
    wake: EventFd,
}

impl EventQueue {
    pub(super) fn new(capacity: usize) -> io::Result<Self> {
        Ok(EventQueue {
            pending: Mutex::new(PendingEvents {
                queue: VecDeque::with_capacity(capacity.min(256)),
                lost: 0,
            }),
            capacity: capacity.max(1),
            wake: EventFd::new(EFD_NONBLOCK)?,
        })
    }

    /// Queues one event (1..=[`MAX_EVENT_SIZE`] bytes) and wakes the event worker.
    pub fn push(&self, event: &[u8], class: EventClass) -> Result<(), EventError> {
        if event.is_empty() || event.len() > MAX_EVENT_SIZE {
            return Err(EventError::BadSize(event.len()));
        }
        {
            let mut pending = self.pending.lock();
            if pending.queue.len() >= self.capacity {
                let victim = pending
                    .queue
                    .iter()
                    .position(|e| e.class == EventClass::Completion);
                match (victim, class) {
                    (Some(index), _) => {
                        pending.queue.remove(index);
                    }
                    // Nothing but asynchronous events queued: a new completion is the least
                    // valuable event.
                    (None, EventClass::Completion) => {
                        pending.lost += 1;
                        return Ok(());
                    }
                    (None, EventClass::Async) => {
                        pending.queue.pop_front();
                    }
                }
                pending.lost += 1;
            }
            pending.queue.push_back(QueuedEvent::new(event, class));
        }
        self.wake.write(1).map_err(EventError::Wake)
    }

    /// Drops every queued event for which `stale` is true (an event about an object whose
    /// DESTROY is being answered must not reach the guest after the answer). Delivery holds the
    /// same lock while it places an event, so none of them is being placed meanwhile. Returns
    /// how many were dropped.
    pub fn discard_where(&self, mut stale: impl FnMut(&[u8]) -> bool) -> usize {
        let mut pending = self.pending.lock();
        let before = pending.queue.len();
        pending.queue.retain(|event| !stale(event.bytes()));
        before - pending.queue.len()
    }

    /// Number of events waiting for a buffer.
    pub fn len(&self) -> usize {
        self.pending.lock().queue.len()
    }

    /// True if no event waits for a buffer.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn wake_fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    pub(crate) fn consume_wake(&self) {
        // EAGAIN only means that nobody pushed since the last read.
        let _ = self.wake.read();
    }

    pub(crate) fn clear(&self) {
        let mut pending = self.pending.lock();
        pending.queue.clear();
        pending.lost = 0;
    }

    /// Moves a pending loss count into a notice event at the head of the queue.
    /// `write_notice` writes the notice for a count of lost events (the device handler's
    /// `events_lost`).
    pub(crate) fn announce_losses(&self, write_notice: impl FnOnce(u64, &mut Vec<u8>)) {
        let lost = std::mem::take(&mut self.pending.lock().lost);
        if lost == 0 {
            return;
        }
        let mut notice = Vec::new();
        write_notice(lost, &mut notice);
        if notice.is_empty() {
            return;
        }
        if notice.len() > MAX_EVENT_SIZE {
            warn!(
                "lost-events notice of {} bytes exceeds {MAX_EVENT_SIZE}; not sent",
                notice.len()
            );
            return;
        }
        self.pending
            .lock()
            .queue
            .push_front(QueuedEvent::new(&notice, EventClass::Async));
    }

    /// Offers queued events, oldest first, to `place` until it runs out of buffers.
    /// Returns true if any buffer was used.
    pub(crate) fn deliver(&self, mut place: impl FnMut(&[u8]) -> Placement) -> bool {
        let mut pending = self.pending.lock();
        let mut used_buffers = false;
        while let Some(event) = pending.queue.front().copied() {
            match place(event.bytes()) {
                Placement::Delivered => {
                    pending.queue.pop_front();
                    used_buffers = true;
                }
                Placement::BufferWasted => used_buffers = true,
                Placement::NoBuffer => break,
            }
        }
        used_buffers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(queue: &EventQueue) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        queue.deliver(|bytes| {
            out.push(bytes.to_vec());
            Placement::Delivered
        });
        out
    }

    #[test]
    fn overflow_drops_oldest_completion_first() {
        let queue = EventQueue::new(3).unwrap();
        queue.push(b"a1", EventClass::Async).unwrap();
        queue.push(b"c1", EventClass::Completion).unwrap();
        queue.push(b"c2", EventClass::Completion).unwrap();
        queue.push(b"a2", EventClass::Async).unwrap();
        assert_eq!(
            drain(&queue),
            vec![b"a1".to_vec(), b"c2".to_vec(), b"a2".to_vec()]
        );
        assert_eq!(queue.pending.lock().lost, 1);
    }

    #[test]
    fn overflow_with_only_async_events() {
        let queue = EventQueue::new(2).unwrap();
        queue.push(b"a1", EventClass::Async).unwrap();
        queue.push(b"a2", EventClass::Async).unwrap();
        queue.push(b"c1", EventClass::Completion).unwrap();
        queue.push(b"a3", EventClass::Async).unwrap();
        assert_eq!(drain(&queue), vec![b"a2".to_vec(), b"a3".to_vec()]);
        assert_eq!(queue.pending.lock().lost, 2);
    }

    #[test]
    fn event_size_is_checked() {
        let queue = EventQueue::new(2).unwrap();
        assert!(matches!(
            queue.push(&[], EventClass::Async),
            Err(EventError::BadSize(0))
        ));
        assert!(matches!(
            queue.push(&[0; MAX_EVENT_SIZE + 1], EventClass::Async),
            Err(EventError::BadSize(_))
        ));
        queue.push(&[7; MAX_EVENT_SIZE], EventClass::Async).unwrap();
        assert_eq!(queue.len(), 1);
    }

    #[test]
    fn delivery_stops_without_buffers_and_keeps_events() {
        let queue = EventQueue::new(4).unwrap();
        queue.push(b"e1", EventClass::Completion).unwrap();
        queue.push(b"e2", EventClass::Completion).unwrap();
        let mut budget = 1;
        let used = queue.deliver(|_| {
            if budget == 0 {
                return Placement::NoBuffer;
            }
            budget -= 1;
            Placement::Delivered
        });
        assert!(used);
        assert_eq!(drain(&queue), vec![b"e2".to_vec()]);
    }

    fn loss_reporter(count: u64, notice: &mut Vec<u8>) {
        notice.extend_from_slice(b"lost:");
        notice.push(count as u8);
    }

    #[test]
    fn losses_are_announced_before_queued_events() {
        let queue = EventQueue::new(2).unwrap();
        for event in [b"c1", b"c2", b"c3", b"c4"] {
            queue.push(event, EventClass::Completion).unwrap();
        }
        queue.announce_losses(loss_reporter);
        assert_eq!(
            drain(&queue),
            vec![b"lost:\x02".to_vec(), b"c3".to_vec(), b"c4".to_vec()]
        );
        // Reported once.
        queue.announce_losses(loss_reporter);
        assert!(queue.is_empty());
    }
}

//! Device events (spec §8) and their dispatch among the threads waiting for them.
//!
//! The device has one event queue per context, carrying both completion events (the backing of
//! `ibv_get_cq_event`) and asynchronous events. Two kinds of waiter read it:
//! [`Context::next_event`](super::Context::next_event) (any event) and
//! [`Cq::wait_event`](super::Cq::wait_event) (a completion event of one CQ). An event read by a
//! thread that does not want it must not be lost, and a thread must not sleep inside the
//! transport while the event it waits for sits in another thread's hands.
//!
//! Design (leader/followers): at most one thread at a time, the *reader*, waits inside
//! [`Transport::next_event`]; the others wait on a condition variable. The reader keeps events
//! it does not want in a small per-context stash — a pending-completion counter per live CQ, a
//! bounded queue for the rest — and wakes the followers after every event and when it steps
//! down, so that one of them takes the stashed event or becomes the next reader. Nothing here
//! is on the data path: polling and posting never touch it.
//!
//! A completion event is delivered once, to whichever waiter takes it first: a `Cq` waiting
//! for it, or `Context::next_event`.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use log::{debug, warn};
use parking_lot::{Condvar, Mutex};
use vrdma_spec::cm::{CmEventResp, CM_EVENT_INLINE_SIZE};
use vrdma_spec::event::{Event, EventType, EVENT_SIZE};
use vrdma_spec::DecodeError;
use zerocopy::FromBytes;

use super::error::Result;
use crate::transport::Transport;

/// Events kept for `Context::next_event` while nobody asks for them; beyond, they are counted
/// and reported as [`DeviceEvent::EventsLost`] (the device's own queue is bounded the same way).
const MAX_STASHED_EVENTS: usize = 256;

/// An event of the device, with the handle or port it concerns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceEvent {
    /// An armed CQ received a completion (one per [`Cq::arm`](super::Cq::arm)).
    Completion {
        /// CQ handle.
        cq: u32,
    },
    /// CQ overrun or error (`IBV_EVENT_CQ_ERR`).
    CqError {
        /// CQ handle.
        cq: u32,
    },
    /// QP fatal error (`IBV_EVENT_QP_FATAL`).
    QpFatal {
        /// QP handle.
        qp: u32,
    },
    /// Invalid request on the QP (`IBV_EVENT_QP_REQ_ERR`).
    QpRequestError {
        /// QP handle.
        qp: u32,
    },
    /// Access violation on the QP (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessError {
        /// QP handle.
        qp: u32,
    },
    /// Communication established (`IBV_EVENT_COMM_EST`).
    CommunicationEstablished {
        /// QP handle.
        qp: u32,
    },
    /// Send queue drained (`IBV_EVENT_SQ_DRAINED`).
    SqDrained {
        /// QP handle.
        qp: u32,
    },
    /// Last WQE reached (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    QpLastWqeReached {
        /// QP handle.
        qp: u32,
    },
    /// SRQ error (`IBV_EVENT_SRQ_ERR`).
    SrqError {
        /// SRQ handle.
        srq: u32,
    },
    /// SRQ limit reached (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    SrqLimitReached {
        /// SRQ handle.
        srq: u32,
    },
    /// Port became active.
    PortActive {
        /// Port number.
        port: u32,
    },
    /// Port went down.
    PortError {
        /// Port number.
        port: u32,
    },
    /// GID table changed.
    GidChange {
        /// Port number.
        port: u32,
    },
    /// The device lost every object of this context; the context must be rebuilt.
    DeviceFatal {
        /// The device's new configuration `epoch`.
        epoch: u32,
    },
    /// Events were dropped (by the device, or by this library's stash).
    EventsLost {
        /// How many.
        count: u32,
    },
    /// An MR was revoked because memory under it was removed (spec §11.3).
    MrRevoked {
        /// MR handle.
        mr: u32,
    },
    /// A connection-manager event of a CM id waits for CM_GET_EVENT (spec §7.5).
    CmEvent {
        /// CM id handle.
        id: u32,
        /// The rdma_cm event number.
        event: u32,
    },
}

impl From<Event> for DeviceEvent {
    fn from(e: Event) -> Self {
        let h = e.handle;
        match e.event_type {
            EventType::Completion => DeviceEvent::Completion { cq: h },
            EventType::CqErr => DeviceEvent::CqError { cq: h },
            EventType::QpFatal => DeviceEvent::QpFatal { qp: h },
            EventType::QpReqErr => DeviceEvent::QpRequestError { qp: h },
            EventType::QpAccessErr => DeviceEvent::QpAccessError { qp: h },
            EventType::CommEst => DeviceEvent::CommunicationEstablished { qp: h },
            EventType::SqDrained => DeviceEvent::SqDrained { qp: h },
            EventType::QpLastWqeReached => DeviceEvent::QpLastWqeReached { qp: h },
            EventType::SrqErr => DeviceEvent::SrqError { srq: h },
            EventType::SrqLimitReached => DeviceEvent::SrqLimitReached { srq: h },
            EventType::PortActive => DeviceEvent::PortActive { port: h },
            EventType::PortErr => DeviceEvent::PortError { port: h },
            EventType::GidChange => DeviceEvent::GidChange { port: h },
            EventType::DeviceFatal => DeviceEvent::DeviceFatal { epoch: e.detail },
            EventType::EventsLost => DeviceEvent::EventsLost { count: e.detail },
            EventType::MrRevoked => DeviceEvent::MrRevoked { mr: h },
            EventType::CmEvent => DeviceEvent::CmEvent {
                id: h,
                event: e.detail,
            },
        }
    }
}

/// What a waiter is waiting for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Wanted {
    /// Any event.
    Any,
    /// A completion event of this CQ.
    Completion(u32),
    /// A connection-manager event of any id (its notification).
    CmEvent,
    /// Nothing: what is read is kept for its own waiters (a look at the device without
    /// waiting, [`EventDispatch::lost_state`]).
    Nothing,
}

impl Wanted {
    fn matches(self, event: &DeviceEvent) -> bool {
        match self {
            Wanted::Any => true,
            Wanted::Completion(cq) => *event == DeviceEvent::Completion { cq },
            Wanted::CmEvent => matches!(event, DeviceEvent::CmEvent { .. }),
            Wanted::Nothing => false,
        }
    }
}

#[derive(Default)]
struct Stash {
    /// A thread is inside `Transport::next_event`.
    reader: bool,
    /// Completion events not taken yet, per live CQ. A CQ missing here is unknown (destroyed
    /// or never created by this context): its events are ignored, as the spec requires.
    completions: HashMap<u32, u32>,
    /// Other events not taken yet.
    others: VecDeque<DeviceEvent>,
    /// Events dropped because `others` was full.
    lost: u32,
    /// The epoch of a DEVICE_FATAL that announced the loss of this context's objects, once
    /// read (it stays: the objects do not come back).
    fatal: Option<u32>,
    /// CM events that came whole with their notices, oldest first (the device delivers them
    /// in order, before any it still holds for CM_GET_EVENT).
    cm_events: VecDeque<Box<CmEventResp>>,
}

impl Stash {
    fn take(&mut self, wanted: Wanted) -> Option<DeviceEvent> {
        match wanted {
            Wanted::Completion(cq) => {
                let pending = self.completions.get_mut(&cq).filter(|n| **n > 0)?;
                *pending -= 1;
                Some(DeviceEvent::Completion { cq })
            }
            Wanted::CmEvent => {
                let at = self
                    .others
                    .iter()
                    .position(|e| matches!(e, DeviceEvent::CmEvent { .. }))?;
                self.others.remove(at)
            }
            Wanted::Nothing => None,
            Wanted::Any => {
                if self.lost != 0 {
                    let count = std::mem::take(&mut self.lost);
                    return Some(DeviceEvent::EventsLost { count });
                }
                if let Some(event) = self.others.pop_front() {
                    return Some(event);
                }
                let (&cq, pending) = self.completions.iter_mut().find(|(_, n)| **n > 0)?;
                *pending -= 1;
                Some(DeviceEvent::Completion { cq })
            }
        }
    }

    fn keep(&mut self, event: DeviceEvent) {
        if let DeviceEvent::Completion { cq } = event {
            match self.completions.get_mut(&cq) {
                Some(pending) => *pending = pending.saturating_add(1),
                None => debug!("completion event for unknown CQ {cq:#x} ignored"),
            }
        } else if self.others.len() < MAX_STASHED_EVENTS {
            self.others.push_back(event);
        } else {
            warn!("no reader for device events: {event:?} dropped");
            self.lost = self.lost.saturating_add(1);
        }
    }
}

/// Per-context event dispatch.
pub(crate) struct EventDispatch {
    stash: Mutex<Stash>,
    changed: Condvar,
    /// The configuration epoch when the context opened: a DEVICE_FATAL naming it announces
    /// a discard that came before this context (spec §11.1), not the loss of its objects.
    opened_at_epoch: u32,
}

impl EventDispatch {
    /// Dispatch for a context that opened at configuration epoch `epoch`.
    pub(crate) fn new(epoch: u32) -> Self {
        EventDispatch {
            stash: Mutex::default(),
            changed: Condvar::default(),
            opened_at_epoch: epoch,
        }
    }

    /// The oldest CM event that came whole in an event buffer and nobody took yet.
    pub(crate) fn take_cm_event(&self) -> Option<CmEventResp> {
        self.stash.lock().cm_events.pop_front().map(|event| *event)
    }

    /// Starts keeping completion events of CQ `handle`.
    pub(crate) fn register_cq(&self, handle: u32) {
        self.stash.lock().completions.insert(handle, 0);
    }

    /// Forgets CQ `handle` and its pending completion events.
    pub(crate) fn unregister_cq(&self, handle: u32) {
        self.stash.lock().completions.remove(&handle);
    }

    /// Waits up to `timeout` (`None`: forever) for an event `wanted` describes. Every event
    /// read from the device is shown to `on_read` first, before it is returned or kept for
    /// another waiter, so that state it makes out of date (the GID cache) is dropped before
    /// anyone learns of the event.
    ///
    /// A wait that ends without an event has read the transport after its last event, even
    /// when the deadline passed before the first read: that read is what asks the device for
    /// a notification of the next event (EVENT_IDX), and a caller that then sleeps on the
    /// transport's event fd would otherwise never be woken for events already used.
    pub(crate) fn wait(
        &self,
        transport: &dyn Transport,
        wanted: Wanted,
        timeout: Option<Duration>,
        on_read: &dyn Fn(&DeviceEvent),
    ) -> Result<Option<DeviceEvent>> {
        self.wait_with(
            &mut |left| read_event(transport, left),
            wanted,
            timeout,
            on_read,
        )
    }

    /// Reads what the device sent, without waiting (each event kept for its own waiter), and
    /// returns the epoch of a DEVICE_FATAL that announced the loss of this context's objects
    /// (spec §11), if one came.
    pub(crate) fn lost_state(
        &self,
        transport: &dyn Transport,
        on_read: &dyn Fn(&DeviceEvent),
    ) -> Result<Option<u32>> {
        if let Some(epoch) = self.stash.lock().fatal {
            return Ok(Some(epoch));
        }
        self.wait(transport, Wanted::Nothing, Some(Duration::ZERO), on_read)?;
        Ok(self.stash.lock().fatal)
    }

    /// [`wait`](Self::wait) over `read`, which reads one event waiting at most its argument.
    fn wait_with(
        &self,
        read: &mut dyn FnMut(Option<Duration>) -> Result<Read>,
        wanted: Wanted,
        timeout: Option<Duration>,
        on_read: &dyn Fn(&DeviceEvent),
    ) -> Result<Option<DeviceEvent>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut stash = self.stash.lock();
        loop {
            if let Some(event) = stash.take(wanted) {
                return Ok(Some(event));
            }
            let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if stash.reader {
                // The reader leaves the transport armed when it stops reading.
                match remaining {
                    None => self.changed.wait(&mut stash),
                    Some(r) if r.is_zero() => return Ok(None),
                    Some(r) => {
                        self.changed.wait_for(&mut stash, r);
                    }
                }
                continue;
            }
            stash.reader = true;
            drop(stash);
            let outcome = read(remaining);
            stash = self.stash.lock();
            stash.reader = false;
            self.changed.notify_all();
            let event = match outcome? {
                Read::Event(event, carried) => {
                    // Kept apart from the notices, which the stash may drop: a CM event the
                    // device delivered is fetched from here first (`take_cm_event`).
                    stash.cm_events.extend(carried);
                    event
                }
                // Consumed without arming the transport: read again (at once if past the
                // deadline).
                Read::Ignored => continue,
                // The read that found nothing armed the transport.
                Read::Nothing if deadline.is_some_and(|d| Instant::now() >= d) => return Ok(None),
                // Woken without an event: wait on.
                Read::Nothing => continue,
            };
            if event
                == (DeviceEvent::DeviceFatal {
                    epoch: self.opened_at_epoch,
                })
            {
                debug!(
                    "DEVICE_FATAL for a discard before this context opened (epoch {}) ignored",
                    self.opened_at_epoch
                );
                continue;
            }
            if let DeviceEvent::DeviceFatal { epoch } = event {
                stash.fatal = Some(epoch);
            }
            on_read(&event);
            if wanted.matches(&event) {
                // A completion of a CQ nobody registered is not ours to report either.
                if let DeviceEvent::Completion { cq } = event {
                    if !stash.completions.contains_key(&cq) {
                        continue;
                    }
                }
                return Ok(Some(event));
            }
            stash.keep(event);
        }
    }
}

/// What one read of the event queue found.
#[derive(Debug, PartialEq, Eq)]
enum Read {
    /// An event, and the CM event a CM_EVENT notice carried whole
    /// (`VRDMA_F_CM_EVENT_INLINE`).
    Event(DeviceEvent, Option<Box<CmEventResp>>),
    /// An event this library must ignore (unknown type, malformed), consumed.
    Ignored,
    /// None within the time given; the transport is armed for the next one.
    Nothing,
}

/// Reads one event, waiting at most `timeout` (`None`: forever).
fn read_event(transport: &dyn Transport, timeout: Option<Duration>) -> Result<Read> {
    let mut buf = [0u8; CM_EVENT_INLINE_SIZE];
    let Some(len) = transport.next_event(&mut buf, timeout)? else {
        return Ok(Read::Nothing);
    };
    match Event::decode(&buf[..len.min(EVENT_SIZE)]) {
        Ok(event) => {
            let carried = (event.event_type == EventType::CmEvent && len >= CM_EVENT_INLINE_SIZE)
                .then(|| {
                    CmEventResp::read_from_bytes(&buf[EVENT_SIZE..])
                        .ok()
                        .map(Box::new)
                })
                .flatten();
            Ok(Read::Event(event.into(), carried))
        }
        // Newer devices may send types this version does not know: the spec says to ignore them.
        Err(DecodeError::UnknownEventType(t)) => {
            debug!("event of unknown type {t} ignored");
            Ok(Read::Ignored)
        }
        Err(e) => {
            warn!("malformed event ignored: {e}");
            Ok(Read::Ignored)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stash_keeps_completions_per_live_cq_and_bounds_the_rest() {
        let mut stash = Stash::default();
        stash.completions.insert(7, 0);
        stash.keep(DeviceEvent::Completion { cq: 7 });
        stash.keep(DeviceEvent::Completion { cq: 9 });
        assert_eq!(
            stash.take(Wanted::Completion(9)),
            None,
            "unknown CQ ignored"
        );
        assert_eq!(
            stash.take(Wanted::Completion(7)),
            Some(DeviceEvent::Completion { cq: 7 })
        );
        assert_eq!(stash.take(Wanted::Completion(7)), None);

        for port in 0..MAX_STASHED_EVENTS as u32 + 3 {
            stash.keep(DeviceEvent::PortActive { port });
        }
        assert_eq!(
            stash.take(Wanted::Any),
            Some(DeviceEvent::EventsLost { count: 3 })
        );
        assert_eq!(
            stash.take(Wanted::Any),
            Some(DeviceEvent::PortActive { port: 0 })
        );
        assert_eq!(stash.take(Wanted::Completion(7)), None);
    }

    /// The cmtime disconnect stall: a wait whose deadline passed before it read the
    /// transport returned at once, leaving the event queue unarmed; the drop-in's event
    /// thread then slept on the event fd while the device, asked for no notification, used
    /// buffers silently.
    #[test]
    fn a_wait_past_its_deadline_still_reads_the_transport_once() {
        let dispatch = EventDispatch::new(0);
        let mut reads = Vec::new();
        let got = dispatch
            .wait_with(
                &mut |left| {
                    reads.push(left);
                    Ok(Read::Nothing)
                },
                Wanted::Any,
                Some(Duration::ZERO),
                &|_| {},
            )
            .unwrap();
        assert_eq!(got, None);
        assert_eq!(
            reads,
            vec![Some(Duration::ZERO)],
            "one read, without waiting"
        );
    }

    #[test]
    fn ignored_events_are_read_past_until_the_queue_is_empty() {
        let dispatch = EventDispatch::new(0);
        let mut queue = VecDeque::from([
            Read::Ignored,
            Read::Event(DeviceEvent::PortActive { port: 1 }, None),
            Read::Ignored,
        ]);
        let mut read = |_left: Option<Duration>| Ok(queue.pop_front().unwrap_or(Read::Nothing));
        let first = dispatch.wait_with(&mut read, Wanted::Any, Some(Duration::ZERO), &|_| {});
        assert_eq!(first.unwrap(), Some(DeviceEvent::PortActive { port: 1 }));
        let second = dispatch.wait_with(&mut read, Wanted::Any, Some(Duration::ZERO), &|_| {});
        assert_eq!(second.unwrap(), None);
        assert!(
            queue.is_empty(),
            "the ignored event and the empty queue were both read"
        );
    }

    #[test]
    fn cm_events_carried_whole_are_kept_apart_in_order_even_when_their_notices_are_dropped() {
        use zerocopy::FromZeros;
        let dispatch = EventDispatch::new(0);
        let body = |event: u32| {
            let mut body = Box::new(CmEventResp::new_zeroed());
            body.event = vrdma_spec::Le32::new(event);
            body
        };
        let notice = DeviceEvent::CmEvent { id: 1, event: 4 };
        // More notices than the stash keeps: the events they carried are all kept.
        let mut queue: VecDeque<Read> = (0..MAX_STASHED_EVENTS as u32 + 2)
            .map(|n| Read::Event(notice, Some(body(n))))
            .collect();
        let mut read = |_left: Option<Duration>| Ok(queue.pop_front().unwrap_or(Read::Nothing));
        let got = dispatch.wait_with(&mut read, Wanted::Nothing, Some(Duration::ZERO), &|_| {});
        assert_eq!(got.unwrap(), None);
        for n in 0..MAX_STASHED_EVENTS as u32 + 2 {
            assert_eq!(dispatch.take_cm_event().unwrap().event.get(), n);
        }
        assert!(dispatch.take_cm_event().is_none());
    }

    #[test]
    fn every_event_type_maps_to_its_subject() {
        for t in EventType::ALL {
            let handle = if t.has_detail() { 0 } else { 5 };
            let event = DeviceEvent::from(Event {
                event_type: t,
                handle,
                detail: if t.has_detail() { 9 } else { 0 },
            });
            let text = format!("{event:?}");
            assert!(
                text.contains(if t.has_detail() { "9" } else { "5" }),
                "{text}"
            );
        }
    }
}

//! Asynchronous events: the queue behind a context's `async_fd`, which `ibv_get_async_event`
//! and `ibv_ack_async_event` ([`crate::async_verbs`]) read and acknowledge.
//!
//! rdma-core reads asynchronous events from the kernel's async event file (`async_fd`):
//! readable while events are queued, blocking unless the application sets `O_NONBLOCK`.
//! Here the event thread ([`crate::events`]) fills a per-context queue, and `async_fd` is an
//! eventfd in semaphore mode whose counter always equals the queue's length (both change
//! under one lock), so `poll()` reports it readable exactly while events are pending.
//!
//! Events name the application's objects: the device names CQs, QPs and SRQs by handle, and
//! the registry here maps each live handle to its `ibv_cq`/`ibv_qp`/`ibv_srq`. As in the
//! kernel (`ib_uverbs_release_uevent` and the `events_reported` count of a destroy), destroying
//! an object drops its queued events and waits until every event already handed out for it
//! was acknowledged; events arriving for it afterwards are dropped, so no event ever carries a
//! dangling pointer.
//!
//! Mapping of the device's event types (spec §8): every type with a verbs equivalent becomes
//! that `ibv_event_type`. `DEVICE_FATAL` (the device discarded this context's objects) and a
//! failed transport (the backend or PCI device is gone) both become one
//! `IBV_EVENT_DEVICE_FATAL` per context, with `element.port_num` 0 as the kernel reports it.
//! `EVENTS_LOST` has no verbs equivalent and is logged (the kernel also drops events silently
//! when it cannot queue them). `MR_REVOKED` is logged and not delivered: verbs has no MR
//! event, the device is not dead (so `DEVICE_FATAL` would make applications tear down a
//! working context), and the application learns of it where it matters: work requests using
//! the MR's keys complete in error, which raises the QP and CQ events above.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_int;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use log::{debug, warn};
use parking_lot::{Condvar, Mutex};
use vrdma::verbs::DeviceEvent;

use crate::fd::{eventfd, is_nonblocking, read_one, wait_readable, write_one};
use crate::sys::{
    ibv_async_event, ibv_async_event__bindgen_ty_1, ibv_event_type,
    ibv_event_type_IBV_EVENT_COMM_EST as COMM_EST, ibv_event_type_IBV_EVENT_CQ_ERR as CQ_ERR,
    ibv_event_type_IBV_EVENT_DEVICE_FATAL as DEVICE_FATAL,
    ibv_event_type_IBV_EVENT_GID_CHANGE as GID_CHANGE,
    ibv_event_type_IBV_EVENT_PATH_MIG as PATH_MIG,
    ibv_event_type_IBV_EVENT_PATH_MIG_ERR as PATH_MIG_ERR,
    ibv_event_type_IBV_EVENT_PORT_ACTIVE as PORT_ACTIVE,
    ibv_event_type_IBV_EVENT_PORT_ERR as PORT_ERR,
    ibv_event_type_IBV_EVENT_QP_ACCESS_ERR as QP_ACCESS_ERR,
    ibv_event_type_IBV_EVENT_QP_FATAL as QP_FATAL,
    ibv_event_type_IBV_EVENT_QP_LAST_WQE_REACHED as QP_LAST_WQE_REACHED,
    ibv_event_type_IBV_EVENT_QP_REQ_ERR as QP_REQ_ERR,
    ibv_event_type_IBV_EVENT_SQ_DRAINED as SQ_DRAINED, ibv_event_type_IBV_EVENT_SRQ_ERR as SRQ_ERR,
    ibv_event_type_IBV_EVENT_SRQ_LIMIT_REACHED as SRQ_LIMIT_REACHED,
};

/// Events queued and not read; beyond, new ones are dropped with a warning, so that an
/// application that never reads them does not grow the queue without bound.
/// `IBV_EVENT_DEVICE_FATAL` is always queued.
const MAX_PENDING: usize = 4096;

/// The kind of object an event names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ObjectKind {
    Cq,
    Qp,
    Srq,
}

impl ObjectKind {
    /// The kind of object an event of `event_type` names in `element`, as rdma-core decodes
    /// it; `None` for port and device events.
    pub(crate) fn of(event_type: ibv_event_type) -> Option<ObjectKind> {
        match event_type {
            CQ_ERR => Some(ObjectKind::Cq),
            QP_FATAL | QP_REQ_ERR | QP_ACCESS_ERR | COMM_EST | SQ_DRAINED | PATH_MIG
            | PATH_MIG_ERR | QP_LAST_WQE_REACHED => Some(ObjectKind::Qp),
            SRQ_ERR | SRQ_LIMIT_REACHED => Some(ObjectKind::Srq),
            _ => None,
        }
    }
}

/// What a device event is about, as the device names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Subject {
    Object(ObjectKind, u32),
    Port(u32),
    Device,
}

/// The verbs event of a device event; `None` for events applications do not receive.
fn translate(event: DeviceEvent) -> Option<(ibv_event_type, Subject)> {
    use ObjectKind::{Cq, Qp, Srq};
    let object = |t, kind, handle| Some((t, Subject::Object(kind, handle)));
    match event {
        DeviceEvent::CqError { cq } => object(CQ_ERR, Cq, cq),
        DeviceEvent::QpFatal { qp } => object(QP_FATAL, Qp, qp),
        DeviceEvent::QpRequestError { qp } => object(QP_REQ_ERR, Qp, qp),
        DeviceEvent::QpAccessError { qp } => object(QP_ACCESS_ERR, Qp, qp),
        DeviceEvent::CommunicationEstablished { qp } => object(COMM_EST, Qp, qp),
        DeviceEvent::SqDrained { qp } => object(SQ_DRAINED, Qp, qp),
        DeviceEvent::QpLastWqeReached { qp } => object(QP_LAST_WQE_REACHED, Qp, qp),
        DeviceEvent::SrqError { srq } => object(SRQ_ERR, Srq, srq),
        DeviceEvent::SrqLimitReached { srq } => object(SRQ_LIMIT_REACHED, Srq, srq),
        DeviceEvent::PortActive { port } => Some((PORT_ACTIVE, Subject::Port(port))),
        DeviceEvent::PortError { port } => Some((PORT_ERR, Subject::Port(port))),
        DeviceEvent::GidChange { port } => Some((GID_CHANGE, Subject::Port(port))),
        DeviceEvent::DeviceFatal { epoch } => {
            warn!("vrdma: the device lost this context's objects (epoch {epoch})");
            Some((DEVICE_FATAL, Subject::Device))
        }
        DeviceEvent::EventsLost { count } => {
            warn!("vrdma: {count} device events were lost");
            None
        }
        // Not an `ibv_async_event`: the connection-manager library reads these (spec §7.5).
        DeviceEvent::CmEvent { .. } => None,
        DeviceEvent::MrRevoked { mr } => {
            warn!(
                "vrdma: MR {mr:#x} was revoked (guest memory under it was removed); work \
                 requests using its keys will fail"
            );
            None
        }
        // Completion events go to completion channels (crate::events), never here.
        DeviceEvent::Completion { .. } => None,
    }
}

/// What a queued event's `element` holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Element {
    /// The application's object (`ibv_cq`/`ibv_qp`/`ibv_srq` address).
    Object(ObjectKind, usize),
    Port(c_int),
    Device,
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    event_type: ibv_event_type,
    element: Element,
}

impl Pending {
    fn to_ibv(self) -> ibv_async_event {
        let element = match self.element {
            Element::Object(ObjectKind::Cq, ptr) => {
                ibv_async_event__bindgen_ty_1 { cq: ptr as *mut _ }
            }
            Element::Object(ObjectKind::Qp, ptr) => {
                ibv_async_event__bindgen_ty_1 { qp: ptr as *mut _ }
            }
            Element::Object(ObjectKind::Srq, ptr) => {
                ibv_async_event__bindgen_ty_1 { srq: ptr as *mut _ }
            }
            Element::Port(port_num) => ibv_async_event__bindgen_ty_1 { port_num },
            Element::Device => ibv_async_event__bindgen_ty_1 { port_num: 0 },
        };
        ibv_async_event {
            element,
            event_type: self.event_type,
        }
    }
}

/// Events of one object handed out and acknowledged.
#[derive(Default, Debug)]
struct Counts {
    delivered: u64,
    acked: u64,
}

#[derive(Default)]
struct State {
    pending: VecDeque<Pending>,
    /// Live objects: device handle -> application object address.
    handles: HashMap<(ObjectKind, u32), usize>,
    /// Per live object (by address): its events handed out and acknowledged.
    counts: HashMap<(ObjectKind, usize), Counts>,
    /// An `IBV_EVENT_DEVICE_FATAL` was queued (it is delivered once per context).
    fatal_queued: bool,
    /// No more events will come (the transport failed).
    closed: bool,
    /// `retire` calls waiting for acknowledgements.
    waiting_retirements: usize,
}

/// The asynchronous events of one context.
pub(crate) struct AsyncEvents {
    /// Counter = `state.pending.len()`, changed only under the `state` lock.
    fd: OwnedFd,
    /// Readable once `state.closed` is set: wakes the calls blocked in `next` (the event that
    /// woke the application's own poll, DEVICE_FATAL, may have been read before).
    closed_fd: OwnedFd,
    state: Mutex<State>,
    acked: Condvar,
}

impl AsyncEvents {
    pub(crate) fn new() -> io::Result<AsyncEvents> {
        Ok(AsyncEvents {
            fd: eventfd(libc::EFD_SEMAPHORE)?,
            closed_fd: eventfd(0)?,
            state: Mutex::new(State::default()),
            acked: Condvar::new(),
        })
    }

    /// The context's `async_fd`.
    pub(crate) fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Starts delivering events of the object `handle` of `kind`, which the application knows
    /// at address `object`.
    pub(crate) fn register(&self, kind: ObjectKind, handle: u32, object: usize) {
        let mut state = self.state.lock();
        state.handles.insert((kind, handle), object);
        state.counts.insert((kind, object), Counts::default());
    }

    /// The application addresses of the live objects of `kind` (registered, not retired).
    pub(crate) fn live(&self, kind: ObjectKind) -> Vec<usize> {
        let state = self.state.lock();
        state
            .handles
            .iter()
            .filter(|((k, _), _)| *k == kind)
            .map(|(_, &object)| object)
            .collect()
    }

    /// The object at `object` (device handle `handle`) is being destroyed: no event names it
    /// from now on, its queued events are dropped, and this waits until every event handed
    /// out for it was acknowledged (as rdma-core's destroy calls wait).
    pub(crate) fn retire(&self, kind: ObjectKind, handle: u32, object: usize) {
        let mut state = self.state.lock();
        if state.handles.get(&(kind, handle)) == Some(&object) {
            state.handles.remove(&(kind, handle));
        }
        let before = state.pending.len();
        state
            .pending
            .retain(|p| p.element != Element::Object(kind, object));
        for _ in state.pending.len()..before {
            self.take_count();
        }
        state.waiting_retirements += 1;
        loop {
            match state.counts.get(&(kind, object)) {
                Some(c) if c.acked < c.delivered => self.acked.wait(&mut state),
                _ => break,
            }
        }
        state.waiting_retirements -= 1;
        state.counts.remove(&(kind, object));
    }

    /// How many `retire` calls are waiting for acknowledgements now.
    #[cfg(test)]
    pub(crate) fn waiting_retirements(&self) -> usize {
        self.state.lock().waiting_retirements
    }

    /// Queues the asynchronous event `event` (from the device) if applications receive it.
    pub(crate) fn deliver(&self, event: DeviceEvent) {
        let Some((event_type, subject)) = translate(event) else {
            return;
        };
        let mut state = self.state.lock();
        let element = match subject {
            Subject::Object(kind, handle) => match state.handles.get(&(kind, handle)) {
                Some(&object) => Element::Object(kind, object),
                None => {
                    debug!("vrdma: {event:?} of an object not (or no longer) live: dropped");
                    return;
                }
            },
            Subject::Port(port) => match c_int::try_from(port) {
                Ok(port) => Element::Port(port),
                Err(_) => {
                    warn!("vrdma: {event:?} names no valid port: dropped");
                    return;
                }
            },
            Subject::Device => {
                self.queue_fatal(&mut state);
                return;
            }
        };
        if state.pending.len() >= MAX_PENDING {
            warn!("vrdma: {MAX_PENDING} asynchronous events unread; {event:?} dropped");
            return;
        }
        self.push(&mut state, event_type, element);
    }

    /// The transport failed: queues `IBV_EVENT_DEVICE_FATAL` (if not queued before) and
    /// makes `next` fail with EIO, instead of waiting forever, once the queue is empty.
    pub(crate) fn device_gone(&self) {
        let mut state = self.state.lock();
        self.queue_fatal(&mut state);
        if !std::mem::replace(&mut state.closed, true) {
            write_one(&self.closed_fd);
        }
    }

    fn queue_fatal(&self, state: &mut State) {
        if !std::mem::replace(&mut state.fatal_queued, true) {
            self.push(state, DEVICE_FATAL, Element::Device);
        }
    }

    fn push(&self, state: &mut State, event_type: ibv_event_type, element: Element) {
        state.pending.push_back(Pending {
            event_type,
            element,
        });
        write_one(&self.fd);
    }

    /// Takes one from the fd's counter, which is at least the (non-zero) number of queued
    /// events: never blocks, even on a blocking fd. Checked with poll all the same, so that an
    /// application reading the fd itself cannot make this block under the lock.
    fn take_count(&self) {
        if let Ok([true]) = wait_readable([self.fd.as_raw_fd()], 0) {
            if let Err(e) = read_one(&self.fd) {
                warn!("vrdma: async event fd read failed: {e}");
            }
        }
    }

    /// The next event: waits for one unless the fd is non-blocking (then EAGAIN), as
    /// rdma-core's read of the kernel's async fd; EIO once the transport failed and every
    /// event was read.
    pub(crate) fn next(&self) -> io::Result<ibv_async_event> {
        loop {
            {
                let mut state = self.state.lock();
                if let Some(event) = state.pending.pop_front() {
                    self.take_count();
                    if let Element::Object(kind, object) = event.element {
                        if let Some(counts) = state.counts.get_mut(&(kind, object)) {
                            counts.delivered += 1;
                        }
                    }
                    return Ok(event.to_ibv());
                }
                if state.closed {
                    return Err(io::Error::from_raw_os_error(libc::EIO));
                }
            }
            if is_nonblocking(&self.fd)? {
                return Err(io::Error::from_raw_os_error(libc::EAGAIN));
            }
            wait_readable([self.fd.as_raw_fd(), self.closed_fd.as_raw_fd()], -1)?;
        }
    }

    /// Acknowledges an event handed out for the object at `object`.
    pub(crate) fn ack(&self, kind: ObjectKind, object: usize) {
        let mut state = self.state.lock();
        match state.counts.get_mut(&(kind, object)) {
            Some(counts) if counts.acked < counts.delivered => {
                counts.acked += 1;
                self.acked.notify_all();
            }
            _ => debug!("vrdma: acknowledgement of an event not handed out ignored"),
        }
    }
}

#[cfg(test)]
mod tests {
    use vrdma::spec::event::{Event, EventType};

    use super::*;

    #[test]
    fn every_device_event_type_has_its_verbs_meaning() {
        for t in EventType::ALL {
            let event = DeviceEvent::from(Event {
                event_type: t,
                handle: 5,
                detail: 0,
            });
            let expected = match t {
                EventType::Completion
                | EventType::EventsLost
                | EventType::MrRevoked
                | EventType::CmEvent => None,
                EventType::DeviceFatal => Some(DEVICE_FATAL),
                EventType::PortActive => Some(PORT_ACTIVE),
                EventType::PortErr => Some(PORT_ERR),
                EventType::GidChange => Some(GID_CHANGE),
                EventType::CqErr => Some(CQ_ERR),
                EventType::QpFatal => Some(QP_FATAL),
                EventType::QpReqErr => Some(QP_REQ_ERR),
                EventType::QpAccessErr => Some(QP_ACCESS_ERR),
                EventType::CommEst => Some(COMM_EST),
                EventType::SqDrained => Some(SQ_DRAINED),
                EventType::QpLastWqeReached => Some(QP_LAST_WQE_REACHED),
                EventType::SrqErr => Some(SRQ_ERR),
                EventType::SrqLimitReached => Some(SRQ_LIMIT_REACHED),
            };
            let translated = translate(event);
            assert_eq!(translated.map(|(ty, _)| ty), expected, "{t:?}");
            // Object events name the kind `ibv_ack_async_event` decodes from the type.
            if let Some((ty, Subject::Object(kind, handle))) = translated {
                assert_eq!(ObjectKind::of(ty), Some(kind), "{t:?}");
                assert_eq!(handle, 5);
            }
        }
    }

    #[test]
    fn the_queue_is_bounded_but_device_fatal_always_fits() {
        let events = AsyncEvents::new().unwrap();
        for _ in 0..MAX_PENDING + 5 {
            events.deliver(DeviceEvent::PortActive { port: 1 });
        }
        events.device_gone();
        events.device_gone();
        for _ in 0..MAX_PENDING {
            assert_eq!(events.next().unwrap().event_type, PORT_ACTIVE);
        }
        assert_eq!(events.next().unwrap().event_type, DEVICE_FATAL);
        assert!(!wait_readable([events.raw_fd()], 0).unwrap()[0]);
        assert_eq!(
            events.next().err().and_then(|e| e.raw_os_error()),
            Some(libc::EIO)
        );
    }
}

//! Asynchronous events end to end: events posted on the fake device's event queue, read by
//! the context's event thread, handed out by `ibv_get_async_event` through the C entry points.

use std::ptr::null_mut;
use std::sync::mpsc;
use std::sync::Arc;

use vrdma::spec::event::{Event, EventType};
use vrdma::Context;
use vrdma_test_support::fake_transport::{object_event, FakeTransport};

use super::*;
use crate::async_events::AsyncEvents;
use crate::cq::{ibv_create_cq, ibv_destroy_cq};
use crate::device::{context_over, device, ibv_close_device};
use crate::fd::wait_readable;
use crate::objects::{ibv_alloc_pd, ibv_dealloc_pd};
use crate::qp::{ibv_create_qp, ibv_destroy_qp};
use crate::sys::{
    ibv_cq, ibv_event_type_IBV_EVENT_COMM_EST as COMM_EST,
    ibv_event_type_IBV_EVENT_CQ_ERR as CQ_ERR,
    ibv_event_type_IBV_EVENT_DEVICE_FATAL as DEVICE_FATAL,
    ibv_event_type_IBV_EVENT_GID_CHANGE as GID_CHANGE,
    ibv_event_type_IBV_EVENT_PORT_ACTIVE as PORT_ACTIVE,
    ibv_event_type_IBV_EVENT_PORT_ERR as PORT_ERR, ibv_event_type_IBV_EVENT_QP_FATAL as QP_FATAL,
    ibv_event_type_IBV_EVENT_SRQ_ERR as SRQ_ERR,
    ibv_event_type_IBV_EVENT_SRQ_LIMIT_REACHED as SRQ_LIMIT_REACHED, ibv_pd, ibv_qp,
    ibv_qp_init_attr, ibv_qp_type_IBV_QPT_RC, ibv_srq,
};
use crate::transport::AppTransport;

/// Bounds every wait for an event the test posted, so that a failure fails instead of
/// hanging; never reached when the code works (nothing is timed).
const GIVE_UP_MS: i32 = 20_000;

/// A context of this library over a fake device, with a PD, a CQ and an RC QP on it.
struct Fixture {
    fake: Arc<FakeTransport>,
    context: *mut ibv_context,
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    qp: *mut ibv_qp,
}

impl Fixture {
    fn new() -> Fixture {
        let fake = FakeTransport::new();
        let transport = Arc::new(AppTransport::over(fake.clone()));
        let ctx = Context::open(transport.clone()).unwrap();
        let context = context_over(device(), ctx, transport).unwrap();
        // SAFETY: a live context of this library; the objects are made in order.
        unsafe {
            let pd = ibv_alloc_pd(context);
            let cq = ibv_create_cq(context, 16, null_mut(), null_mut(), 0);
            assert!(!pd.is_null() && !cq.is_null());
            let qp = Self::create_qp(pd, cq);
            Fixture {
                fake,
                context,
                pd,
                cq,
                qp,
            }
        }
    }

    /// # Safety
    /// `pd` and `cq` are live objects of one context.
    unsafe fn create_qp(pd: *mut ibv_pd, cq: *mut ibv_cq) -> *mut ibv_qp {
        // SAFETY: all-zero is a valid ibv_qp_init_attr; the fields that matter are set.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = cq;
        init.recv_cq = cq;
        init.qp_type = ibv_qp_type_IBV_QPT_RC;
        init.cap.max_send_wr = 4;
        init.cap.max_recv_wr = 4;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        // SAFETY: caller contract.
        let qp = unsafe { ibv_create_qp(pd, &mut init) };
        assert!(!qp.is_null());
        qp
    }

    fn async_events(&self) -> &AsyncEvents {
        // SAFETY: the context lives as long as the fixture.
        &unsafe { VrdmaContext::from_ptr(self.context) }
            .unwrap()
            .async_events
    }

    fn async_fd(&self) -> i32 {
        // SAFETY: the context lives as long as the fixture.
        unsafe { (*self.context).async_fd }
    }

    /// Whether `async_fd` polls readable now.
    fn readable_now(&self) -> bool {
        poll_readable(self.async_fd(), 0)
    }

    /// The next event, once `async_fd` turns readable.
    fn next_event(&self) -> ibv_async_event {
        assert!(
            poll_readable(self.async_fd(), GIVE_UP_MS),
            "no asynchronous event came"
        );
        self.get().expect("an event is pending")
    }

    /// `ibv_get_async_event`: the event, or the errno value.
    fn get(&self) -> Result<ibv_async_event, i32> {
        // SAFETY: all-zero is a valid ibv_async_event; the context is live.
        let mut event: ibv_async_event = unsafe { std::mem::zeroed() };
        // SAFETY: as above; `event` is valid for a write.
        match unsafe { ibv_get_async_event(self.context, &mut event) } {
            0 => Ok(event),
            _ => Err(std::io::Error::last_os_error().raw_os_error().unwrap()),
        }
    }

    fn set_nonblocking(&self) {
        // SAFETY: F_SETFL on the context's live fd touches no memory.
        let rc = unsafe { libc::fcntl(self.async_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        assert_eq!(rc, 0);
    }

    fn qp_handle(&self) -> u32 {
        // SAFETY: the QP is live.
        unsafe { (*self.qp).handle }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // SAFETY: the objects are live (tests that destroy the QP set it to NULL).
        unsafe {
            if !self.qp.is_null() {
                assert_eq!(ibv_destroy_qp(self.qp), 0);
            }
            assert_eq!(ibv_destroy_cq(self.cq), 0);
            assert_eq!(ibv_dealloc_pd(self.pd), 0);
            assert_eq!(ibv_close_device(self.context), 0);
        }
    }
}

fn poll_readable(fd: i32, timeout_ms: i32) -> bool {
    wait_readable([fd], timeout_ms).unwrap()[0]
}

fn ack(mut event: ibv_async_event) {
    // SAFETY: an event handed out by ibv_get_async_event, acknowledged once.
    unsafe { ibv_ack_async_event(&mut event) }
}

fn port_event(event_type: EventType, port: u32) -> Event {
    object_event(event_type, port)
}

#[test]
fn object_events_name_the_applications_objects() {
    let f = Fixture::new();
    assert!(!f.readable_now(), "no event yet");
    // SAFETY: the CQ is live.
    let cq_handle = unsafe { (*f.cq).handle };
    f.fake
        .post_event(object_event(EventType::QpFatal, f.qp_handle()));
    f.fake.post_event(object_event(EventType::CqErr, cq_handle));
    f.fake
        .post_event(object_event(EventType::CommEst, f.qp_handle()));

    let event = f.next_event();
    assert_eq!(event.event_type, QP_FATAL);
    // SAFETY: a QP event's element is the QP.
    assert_eq!(unsafe { event.element.qp }, f.qp);
    ack(event);
    let event = f.next_event();
    assert_eq!(event.event_type, CQ_ERR);
    // SAFETY: a CQ event's element is the CQ.
    assert_eq!(unsafe { event.element.cq }, f.cq);
    ack(event);
    let event = f.next_event();
    assert_eq!(event.event_type, COMM_EST);
    // SAFETY: as above.
    assert_eq!(unsafe { event.element.qp }, f.qp);
    ack(event);
    assert!(!f.readable_now(), "every event was read");
}

#[test]
fn port_events_carry_the_port_number() {
    let f = Fixture::new();
    f.fake.post_event(port_event(EventType::PortErr, 1));
    f.fake.post_event(port_event(EventType::PortActive, 1));
    f.fake.post_event(port_event(EventType::GidChange, 1));
    for expected in [PORT_ERR, PORT_ACTIVE, GID_CHANGE] {
        let event = f.next_event();
        assert_eq!(event.event_type, expected);
        // SAFETY: a port event's element is the port number.
        assert_eq!(unsafe { event.element.port_num }, 1);
        ack(event); // nothing to acknowledge for ports: accepted and ignored
    }
}

#[test]
fn srq_events_name_the_srq() {
    // The fake device has no SRQs: this registers an `ibv_srq` of the context by hand, as
    // ibv_create_srq does, under a handle the device would not use otherwise.
    let f = Fixture::new();
    // SAFETY: all-zero is a valid ibv_srq.
    let mut srq: Box<ibv_srq> = Box::new(unsafe { std::mem::zeroed() });
    srq.context = f.context;
    srq.handle = 0x5eed;
    let address = std::ptr::from_mut(srq.as_mut()) as usize;
    f.async_events()
        .register(ObjectKind::Srq, srq.handle, address);
    f.fake
        .post_event(object_event(EventType::SrqLimitReached, srq.handle));
    f.fake
        .post_event(object_event(EventType::SrqErr, srq.handle));
    for expected in [SRQ_LIMIT_REACHED, SRQ_ERR] {
        let event = f.next_event();
        assert_eq!(event.event_type, expected);
        // SAFETY: an SRQ event's element is the SRQ.
        assert_eq!(unsafe { event.element.srq } as usize, address);
        ack(event);
    }
    // Both acknowledged: retiring does not wait.
    f.async_events()
        .retire(ObjectKind::Srq, srq.handle, address);
}

#[test]
fn a_non_blocking_fd_gives_eagain_while_nothing_is_pending() {
    let f = Fixture::new();
    f.set_nonblocking();
    assert_eq!(f.get().err(), Some(libc::EAGAIN));
    f.fake.post_event(port_event(EventType::PortActive, 1));
    assert_eq!(f.next_event().event_type, PORT_ACTIVE);
    assert!(!f.readable_now());
    assert_eq!(f.get().err(), Some(libc::EAGAIN));
}

#[test]
fn a_blocking_get_waits_for_the_next_event() {
    let f = Fixture::new();
    let context = f.context as usize;
    let (got_tx, got_rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        // SAFETY: all-zero is a valid ibv_async_event.
        let mut event: ibv_async_event = unsafe { std::mem::zeroed() };
        // SAFETY: the context lives until the thread is joined.
        let rc = unsafe { ibv_get_async_event(context as *mut ibv_context, &mut event) };
        got_tx.send((rc, event.event_type)).unwrap();
    });
    f.fake.post_event(port_event(EventType::PortActive, 1));
    assert_eq!(got_rx.recv().unwrap(), (0, PORT_ACTIVE));
    reader.join().unwrap();
}

#[test]
fn destroying_a_qp_waits_until_its_events_are_acknowledged() {
    let mut f = Fixture::new();
    f.fake
        .post_event(object_event(EventType::QpFatal, f.qp_handle()));
    let event = f.next_event();
    // SAFETY: a QP event's element is the QP.
    assert_eq!(unsafe { event.element.qp }, f.qp);

    let qp = std::mem::replace(&mut f.qp, null_mut()) as usize;
    let (done_tx, done_rx) = mpsc::channel();
    let destroyer = std::thread::spawn(move || {
        // SAFETY: the QP is live; this thread destroys it.
        let rc = unsafe { ibv_destroy_qp(qp as *mut ibv_qp) };
        done_tx.send(rc).unwrap();
    });
    // The destroyer is provably inside the wait once it counts as waiting; it cannot have
    // returned then, since the event is not acknowledged.
    while f.async_events().waiting_retirements() == 0 {
        std::thread::yield_now();
    }
    assert_eq!(done_rx.try_recv(), Err(mpsc::TryRecvError::Empty));
    ack(event);
    assert_eq!(done_rx.recv().unwrap(), 0);
    destroyer.join().unwrap();
}

#[test]
fn events_of_a_destroyed_qp_are_never_delivered() {
    let mut f = Fixture::new();
    let handle = f.qp_handle();
    // An event queued but not read when the QP is destroyed is dropped.
    f.fake.post_event(object_event(EventType::QpFatal, handle));
    assert!(poll_readable(f.async_fd(), GIVE_UP_MS));
    let qp = std::mem::replace(&mut f.qp, null_mut());
    // SAFETY: the QP is live; nothing of it was handed out, so this does not wait.
    assert_eq!(unsafe { ibv_destroy_qp(qp) }, 0);
    assert!(!f.readable_now(), "the dropped event left the fd readable");
    // An event arriving for the handle afterwards is dropped too: the next event read is
    // the port event posted after it (the event thread keeps the device's order).
    f.fake
        .post_event(object_event(EventType::SqDrained, handle));
    f.fake.post_event(port_event(EventType::PortErr, 1));
    assert_eq!(f.next_event().event_type, PORT_ERR);
    assert!(!f.readable_now());
}

#[test]
fn a_disconnected_transport_gives_one_device_fatal_then_eio() {
    let f = Fixture::new();
    // The device's own DEVICE_FATAL and the disconnect make one event.
    f.fake.post_event(Event {
        event_type: EventType::DeviceFatal,
        handle: 0,
        detail: 2,
    });
    f.fake.disconnect_events();
    let event = f.next_event();
    assert_eq!(event.event_type, DEVICE_FATAL);
    // SAFETY: a device event's element is the (unused) port number.
    assert_eq!(unsafe { event.element.port_num }, 0);
    ack(event);
    // The event thread has ended; the queue is closed and empty.
    assert!(!f.readable_now());
    assert_eq!(f.get().err(), Some(libc::EIO));
}

#[test]
fn a_device_fatal_about_a_discard_before_the_context_opened_is_not_delivered() {
    let f = Fixture::new();
    // The device's configuration said epoch 0 when the context opened: a DEVICE_FATAL naming
    // it announces the discard that came before (a reboot with live objects), not ours.
    f.fake.post_event(Event {
        event_type: EventType::DeviceFatal,
        handle: 0,
        detail: 0,
    });
    f.fake.post_event(port_event(EventType::PortActive, 1));
    assert_eq!(f.next_event().event_type, PORT_ACTIVE);
    // A later discard took this context's objects.
    f.fake.post_event(Event {
        event_type: EventType::DeviceFatal,
        handle: 0,
        detail: 1,
    });
    let event = f.next_event();
    assert_eq!(event.event_type, DEVICE_FATAL);
    ack(event);
}

#[test]
fn unmapped_device_events_are_not_delivered() {
    let f = Fixture::new();
    f.fake.post_event(Event {
        event_type: EventType::EventsLost,
        handle: 0,
        detail: 3,
    });
    f.fake.post_event(object_event(EventType::MrRevoked, 0x77));
    f.fake.post_event(port_event(EventType::PortActive, 1));
    assert_eq!(f.next_event().event_type, PORT_ACTIVE);
    assert!(!f.readable_now());
}

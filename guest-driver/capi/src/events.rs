//! Completion events: the device's event queue fanned out to completion channels.
//!
//! A completion channel (`ibv_comp_channel`) is an eventfd in semaphore mode plus the queue of
//! CQs whose events it holds: one eventfd count per queued event. Applications may `poll()`
//! the fd, and [`ChannelState::next`] reads it exactly as rdma-core's `ibv_get_cq_event` reads
//! its channel file (blocking unless the application made the fd non-blocking).
//!
//! One thread per context, the [`EventPump`], waits on the transport's event fd and routes
//! each completion event to the channel of its CQ and every other event to the context's
//! asynchronous event queue ([`crate::async_events`]). When the transport fails, the queue
//! gets its one `IBV_EVENT_DEVICE_FATAL` and the thread ends.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use log::{debug, warn};
use parking_lot::Mutex;
use vrdma::transport::{Transport, TransportError};
use vrdma::verbs::{DeviceEvent, VerbsError};
use vrdma::Context;

use crate::async_events::AsyncEvents;
use crate::cm_events::router::{CmRouter, Fetch};
use crate::fd::{eventfd, read_one, wait_readable, write_one};

/// The state of one completion channel.
pub(crate) struct ChannelState {
    fd: OwnedFd,
    /// CQs (their `ibv_cq` addresses) with an event, oldest first; 0 marks an event of a CQ
    /// destroyed before the event was read.
    queue: Mutex<VecDeque<usize>>,
}

impl ChannelState {
    pub(crate) fn new() -> io::Result<Self> {
        Ok(ChannelState {
            fd: eventfd(libc::EFD_SEMAPHORE)?,
            queue: Mutex::new(VecDeque::new()),
        })
    }

    /// The fd applications poll.
    pub(crate) fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Queues an event of the CQ at `cq`.
    fn deliver(&self, cq: usize) {
        self.queue.lock().push_back(cq);
        write_one(&self.fd);
    }

    /// Drops the queued events of the CQ at `cq` (about to be destroyed).
    pub(crate) fn purge(&self, cq: usize) {
        for entry in self.queue.lock().iter_mut().filter(|e| **e == cq) {
            *entry = 0;
        }
    }

    /// Waits for the next event (as the fd's blocking mode says) and returns its CQ.
    pub(crate) fn next(&self) -> io::Result<usize> {
        loop {
            read_one(&self.fd)?;
            match self.queue.lock().pop_front() {
                Some(0) => continue,
                Some(cq) => return Ok(cq),
                None => return Err(io::Error::from_raw_os_error(libc::EIO)),
            }
        }
    }
}

/// Which channel receives the events of which CQ (by device handle).
#[derive(Default)]
pub(crate) struct CompletionRoutes {
    routes: Mutex<HashMap<u32, (Arc<ChannelState>, usize)>>,
}

impl CompletionRoutes {
    pub(crate) fn add(&self, handle: u32, channel: Arc<ChannelState>, cq: usize) {
        self.routes.lock().insert(handle, (channel, cq));
    }

    pub(crate) fn remove(&self, handle: u32) {
        if let Some((channel, cq)) = self.routes.lock().remove(&handle) {
            channel.purge(cq);
        }
    }

    fn deliver(&self, handle: u32) {
        match self.routes.lock().get(&handle) {
            Some((channel, cq)) => channel.deliver(*cq),
            None => debug!("vrdma: completion event of CQ {handle:#x} without a channel"),
        }
    }
}

/// Where the event thread sends what it reads.
#[derive(Clone)]
pub(crate) struct EventSinks {
    /// Completion events, to the channels of their CQs.
    pub(crate) routes: Arc<CompletionRoutes>,
    /// Asynchronous events, to the context's `async_fd` queue.
    pub(crate) async_events: Arc<AsyncEvents>,
    /// Connection-manager events, to the channels of their ids.
    pub(crate) cm: Arc<CmRouter>,
}

/// Why the event loop ended.
enum Ended {
    /// `ibv_close_device` asked it to.
    Stopped,
    /// The transport failed: no more events will come.
    Failed,
}

/// The thread routing a context's events.
pub(crate) struct EventPump {
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl EventPump {
    pub(crate) fn start(
        ctx: Context,
        transport: Arc<dyn Transport>,
        sinks: EventSinks,
    ) -> io::Result<EventPump> {
        let stop = eventfd(0)?;
        let stop_fd = stop.as_raw_fd();
        let thread = std::thread::Builder::new()
            .name("vrdma-events".into())
            .spawn(move || pump(&ctx, transport.as_ref(), &sinks, stop_fd))?;
        Ok(EventPump {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for EventPump {
    fn drop(&mut self) {
        write_one(&self.stop);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                warn!("vrdma: the event thread panicked");
            }
        }
    }
}

fn pump(ctx: &Context, transport: &dyn Transport, sinks: &EventSinks, stop: i32) {
    let ended = match transport.event_fd().map(|fd| fd.as_raw_fd()) {
        Some(events) => pump_notified(ctx, sinks, events, stop),
        None => pump_polling(ctx, sinks, stop),
    };
    if let Ended::Failed = ended {
        // The application learns it the way rdma-core and the kernel's rdma_cm report a
        // device that went away.
        sinks.async_events.device_gone();
        sinks.cm.device_gone();
    }
}

/// For transports with an event fd: sleeps in poll until it or `stop` turns readable.
fn pump_notified(ctx: &Context, sinks: &EventSinks, events: i32, stop: i32) -> Ended {
    loop {
        match wait_readable([events, stop], -1) {
            Ok([_, true]) => return Ended::Stopped,
            Ok(_) => {}
            Err(e) => {
                warn!("vrdma: poll of the event fd failed: {e}");
                return Ended::Failed;
            }
        }
        // Drain what is there; the short timeout only covers a notification racing a read.
        loop {
            match route_next(ctx, sinks, Duration::from_millis(1)) {
                Some(true) => {}
                Some(false) => break,
                None => return Ended::Failed,
            }
        }
    }
}

/// For transports without an event fd (PCI polls its interrupt status): waits on the event
/// queue itself in short slices, looking at `stop` between them.
fn pump_polling(ctx: &Context, sinks: &EventSinks, stop: i32) -> Ended {
    loop {
        match wait_readable([stop], 0) {
            Ok([true]) => return Ended::Stopped,
            Ok(_) => {}
            Err(e) => {
                warn!("vrdma: poll of the stop fd failed: {e}");
                return Ended::Failed;
            }
        }
        if route_next(ctx, sinks, Duration::from_millis(50)).is_none() {
            return Ended::Failed;
        }
    }
}

/// Routes the next event if one comes within `timeout`: `Some(true)` if one came,
/// `Some(false)` if none did, `None` if the transport failed (no more events will come).
fn route_next(ctx: &Context, sinks: &EventSinks, timeout: Duration) -> Option<bool> {
    let event = ctx.next_event(Some(timeout));
    log::trace!("vrdma: event thread read {event:?}");
    match event {
        Ok(Some(DeviceEvent::Completion { cq })) => sinks.routes.deliver(cq),
        Ok(Some(DeviceEvent::CmEvent { .. })) => sinks.cm.wake(Fetch::One),
        Ok(Some(event @ DeviceEvent::EventsLost { .. })) => {
            // CM notifications may be among the lost: fetch whatever waits.
            sinks.cm.wake(Fetch::All);
            sinks.async_events.deliver(event);
        }
        Ok(Some(event)) => sinks.async_events.deliver(event),
        Ok(None) => return Some(false),
        Err(VerbsError::Transport(TransportError::Disconnected)) => {
            warn!("vrdma: the device disconnected; no more events");
            return None;
        }
        Err(e) => {
            warn!("vrdma: reading events failed: {e}; no more events");
            return None;
        }
    }
    Some(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_hands_out_events_in_order_and_skips_purged_ones() {
        let channel = Arc::new(ChannelState::new().unwrap());
        let routes = CompletionRoutes::default();
        routes.add(7, channel.clone(), 0x1000);
        routes.add(8, channel.clone(), 0x2000);
        routes.deliver(7);
        routes.deliver(8);
        routes.deliver(7);
        routes.deliver(9); // no route: ignored
        assert_eq!(channel.next().unwrap(), 0x1000);
        routes.remove(7);
        assert_eq!(channel.next().unwrap(), 0x2000);
        // The purged event of CQ 7 is skipped; nothing else is pending, so a non-blocking
        // read reports EAGAIN like rdma-core's channel.
        // SAFETY: setting O_NONBLOCK on an fd we own.
        unsafe { libc::fcntl(channel.raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        let err = channel.next().unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EAGAIN));
    }
}

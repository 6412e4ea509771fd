//! Completion events: the device's event queue fanned out to completion channels.
//!
//! A completion channel (`ibv_comp_channel`) is an eventfd in semaphore mode plus the queue of
//! CQs whose events it holds: one eventfd count per queued event. Applications may `poll()`
//! the fd, and [`ChannelState::next`] reads it exactly as rdma-core's `ibv_get_cq_event` reads
//! its channel file (blocking unless the application made the fd non-blocking).
//!
//! One thread per context, the [`EventPump`], waits on the transport's event fd and routes
//! each completion event to the channel of its CQ. Asynchronous events are only logged:
//! `ibv_get_async_event` is not provided yet.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use log::{debug, warn};
use parking_lot::Mutex;
use vrdma::transport::{Transport, TransportError};
use vrdma::verbs::{DeviceEvent, VerbsError};
use vrdma::Context;

fn eventfd(flags: i32) -> io::Result<OwnedFd> {
    // SAFETY: creating a new eventfd; no memory is involved.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn write_one(fd: &OwnedFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a live buffer to an eventfd we own.
    let n = unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    if n != 8 {
        warn!(
            "vrdma: eventfd write failed: {}",
            io::Error::last_os_error()
        );
    }
}

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
            let mut count = [0u8; 8];
            // SAFETY: reads 8 bytes into a live buffer from an eventfd we own.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
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

/// The thread routing a context's events.
pub(crate) struct EventPump {
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl EventPump {
    pub(crate) fn start(
        ctx: Context,
        transport: Arc<dyn Transport>,
        routes: Arc<CompletionRoutes>,
    ) -> io::Result<EventPump> {
        let stop = eventfd(0)?;
        let stop_fd = stop.as_raw_fd();
        let thread = std::thread::Builder::new()
            .name("vrdma-events".into())
            .spawn(move || pump(&ctx, transport.as_ref(), &routes, stop_fd))?;
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

fn pump(ctx: &Context, transport: &dyn Transport, routes: &CompletionRoutes, stop: i32) {
    match transport.event_fd().map(|fd| fd.as_raw_fd()) {
        Some(events) => pump_notified(ctx, routes, events, stop),
        None => pump_polling(ctx, routes, stop),
    }
}

/// For transports with an event fd: sleeps in poll until it or `stop` turns readable.
fn pump_notified(ctx: &Context, routes: &CompletionRoutes, events: i32, stop: i32) {
    loop {
        match wait_readable([events, stop], -1) {
            Ok([_, true]) => return,
            Ok(_) => {}
            Err(e) => {
                warn!("vrdma: poll of the event fd failed: {e}");
                return;
            }
        }
        // Drain what is there; the short timeout only covers a notification racing a read.
        loop {
            match route_next(ctx, routes, Duration::from_millis(1)) {
                Some(true) => {}
                Some(false) => break,
                None => return,
            }
        }
    }
}

/// For transports without an event fd (PCI polls its interrupt status): waits on the event
/// queue itself in short slices, looking at `stop` between them.
fn pump_polling(ctx: &Context, routes: &CompletionRoutes, stop: i32) {
    loop {
        match wait_readable([stop, stop], 0) {
            Ok([true, _]) => return,
            Ok(_) => {}
            Err(e) => {
                warn!("vrdma: poll of the stop fd failed: {e}");
                return;
            }
        }
        if route_next(ctx, routes, Duration::from_millis(50)).is_none() {
            return;
        }
    }
}

/// Which of `fds` are readable, waiting up to `timeout_ms` (-1: forever) for one to be.
fn wait_readable(fds: [i32; 2], timeout_ms: i32) -> io::Result<[bool; 2]> {
    let mut polled = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    loop {
        // SAFETY: `polled` is a live array of two pollfd entries.
        let n = unsafe { libc::poll(polled.as_mut_ptr(), 2, timeout_ms) };
        if n >= 0 {
            return Ok(polled.map(|p| p.revents != 0));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Routes the next event if one comes within `timeout`: `Some(true)` if one came,
/// `Some(false)` if none did, `None` if the transport failed (no more events will come).
fn route_next(ctx: &Context, routes: &CompletionRoutes, timeout: Duration) -> Option<bool> {
    match ctx.next_event(Some(timeout)) {
        Ok(Some(DeviceEvent::Completion { cq })) => routes.deliver(cq),
        Ok(Some(event)) => debug!("vrdma: asynchronous event {event:?} not delivered"),
        Ok(None) => return Some(false),
        Err(VerbsError::Transport(TransportError::Disconnected)) => {
            warn!("vrdma: the device disconnected; no more events");
            return None;
        }
        Err(e) => {
            warn!("vrdma: reading events failed: {e}");
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

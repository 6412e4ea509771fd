//! One stream rsocket: its CM id, its options, its state, and the waits that drive it.
//!
//! The socket's state sits behind one lock. A call that must wait processes completions under
//! it, arms the CQ, and sleeps in poll(2) on the completion channel and the id's CM channel
//! with the lock released (one waiter per socket at a time), so that a reader and a writer on
//! two threads both progress. Connection set-up runs synchronously in the calling thread, also
//! for a non-blocking socket (which POSIX allows: `rconnect` then returns 0 at once rather than
//! `EINPROGRESS`).

use std::ffi::c_int;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

use super::config::{defaults, QP_MAX_SIZE, QP_MIN_SIZE};
use super::endpoint::{set_nonblocking, Endpoint, Sizes};
use super::stream::Flow;
use super::wire::{ConnData, CONN_DATA_LEN, CONN_DATA_VERSION, CTRL_DISCONNECT, CTRL_SHUTDOWN};
use crate::ffi::errno;
use crate::query::ibv_query_device;
use crate::rdmacm::event::ack_pending;
use crate::rdmacm::{
    rdma_accept, rdma_ack_cm_event, rdma_bind_addr, rdma_connect, rdma_create_id, rdma_destroy_id,
    rdma_get_cm_event, rdma_get_request, rdma_listen, rdma_reject, rdma_resolve_addr,
    rdma_resolve_route,
};
use crate::sys::*;

/// Address and route resolution time-out of one try, and the tries after a time-out.
const RESOLVE_MS: c_int = 1000;
const RESOLVE_RETRIES: u32 = 6;

/// Options a socket carries from creation (and a listener hands to what it accepts).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Options {
    pub(crate) sq_size: u32,
    pub(crate) rq_size: u32,
    pub(crate) inline: u32,
    pub(crate) sbuf_size: u32,
    pub(crate) rbuf_size: u32,
    pub(crate) iomap_size: u32,
    /// `O_NONBLOCK` and the other file status flags `rfcntl` stores.
    pub(crate) fs_flags: c_int,
    pub(crate) fd_flags: c_int,
    pub(crate) reuseaddr: bool,
    pub(crate) nodelay: bool,
    pub(crate) keepalive: bool,
    pub(crate) keepalive_time: u32,
    pub(crate) oobinline: bool,
    pub(crate) linger: bool,
    pub(crate) afonly: bool,
    pub(crate) tos: u8,
}

impl Options {
    fn new() -> Options {
        let d = defaults();
        Options {
            sq_size: d.sq_size,
            rq_size: d.rq_size,
            inline: d.inline,
            sbuf_size: d.wmem,
            rbuf_size: d.mem,
            iomap_size: d.iomap_size,
            fs_flags: 0,
            fd_flags: 0,
            reuseaddr: false,
            nodelay: false,
            keepalive: false,
            keepalive_time: 7200,
            oobinline: false,
            linger: false,
            afonly: false,
            tos: 0,
        }
    }

    pub(crate) fn nonblocking(&self) -> bool {
        self.fs_flags & libc::O_NONBLOCK != 0
    }
}

/// Where a socket is in its life.
pub(crate) enum State {
    Init,
    Bound,
    Listening,
    Connected(Box<Flow>),
    /// Connecting failed; `SO_ERROR` tells why.
    ConnectError,
}

/// The state behind the socket's lock.
pub(crate) struct Inner {
    pub(crate) id: *mut rdma_cm_id,
    pub(crate) state: State,
    pub(crate) opts: Options,
    /// `SO_ERROR` of a failed connect.
    pub(crate) err: c_int,
}

// SAFETY: `id` is a CM id of this library (thread-safe); the lock serialises its use.
unsafe impl Send for Inner {}

impl Inner {
    pub(crate) fn flow(&mut self) -> Option<&mut Flow> {
        match &mut self.state {
            State::Connected(flow) => Some(flow),
            _ => None,
        }
    }

    /// The id's CM channel descriptor.
    pub(crate) fn cm_fd(&self) -> RawFd {
        // SAFETY: the id is live while the socket is; its channel is its own (synchronous).
        unsafe { (*(*self.id).channel).fd }
    }
}

/// A stream rsocket.
pub(crate) struct RSocket {
    pub(crate) inner: Mutex<Inner>,
    /// Held by the one thread that sleeps on the socket's channels.
    wait: Mutex<()>,
}

/// What a wait is for.
pub(crate) type Test = fn(&Flow) -> bool;

impl RSocket {
    /// A new socket with a synchronous CM id on the TCP port space (the id takes its address
    /// family from the address it is bound or connected to).
    pub(crate) fn new() -> Result<RSocket, c_int> {
        let mut id = std::ptr::null_mut();
        // SAFETY: a NULL channel makes a synchronous id with a channel of its own; `id` a local.
        if unsafe {
            rdma_create_id(
                std::ptr::null_mut(),
                &mut id,
                std::ptr::null_mut(),
                rdma_port_space_RDMA_PS_TCP,
            )
        } != 0
        {
            return Err(errno());
        }
        Ok(Self::around(id, Options::new(), State::Init))
    }

    fn around(id: *mut rdma_cm_id, opts: Options, state: State) -> RSocket {
        RSocket {
            inner: Mutex::new(Inner {
                id,
                state,
                opts,
                err: 0,
            }),
            wait: Mutex::new(()),
        }
    }

    /// The index the application knows the socket by: its CM channel's descriptor.
    pub(crate) fn index(&self) -> c_int {
        self.inner.lock().cm_fd()
    }

    pub(crate) fn bind(&self, addr: *mut sockaddr) -> Result<(), c_int> {
        let mut inner = self.inner.lock();
        if !matches!(inner.state, State::Init) {
            return Err(libc::EINVAL);
        }
        // SAFETY: our live id; `addr` the caller's readable address.
        if unsafe { rdma_bind_addr(inner.id, addr) } != 0 {
            return Err(errno());
        }
        inner.state = State::Bound;
        Ok(())
    }

    pub(crate) fn listen(&self, backlog: c_int) -> Result<(), c_int> {
        let mut inner = self.inner.lock();
        match inner.state {
            State::Listening => return Ok(()),
            State::Bound => {}
            _ => return Err(libc::EINVAL),
        }
        // SAFETY: our live, bound id.
        if unsafe { rdma_listen(inner.id, backlog) } != 0 {
            return Err(errno());
        }
        let nonblocking = inner.opts.nonblocking();
        set_nonblocking(inner.cm_fd(), nonblocking);
        inner.state = State::Listening;
        Ok(())
    }

    fn sizes(inner: &Inner) -> Sizes {
        let mut max_wr = QP_MAX_SIZE;
        // SAFETY: a C struct for which all zeroes are valid.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the id's live context (bound); `attr` a local.
        if unsafe { ibv_query_device((*inner.id).verbs, &mut attr) } == 0 {
            max_wr = max_wr.min(attr.max_qp_wr as u32);
        }
        let clamp = |v: u32| v.clamp(QP_MIN_SIZE, max_wr.max(QP_MIN_SIZE));
        let o = &inner.opts;
        Sizes {
            sq: clamp(o.sq_size),
            rq: clamp(o.rq_size),
            inline: o.inline,
            sbuf: o.sbuf_size,
            rbuf: o.rbuf_size,
            iomap_entries: o.iomap_size,
        }
    }

    /// Connects to `dst`, set-up done in this thread whatever the socket's blocking mode.
    pub(crate) fn connect(&self, dst: *mut sockaddr) -> Result<(), c_int> {
        let mut inner = self.inner.lock();
        match inner.state {
            State::Init | State::Bound => {}
            State::Connected(_) => return Err(libc::EISCONN),
            _ => return Err(libc::EINVAL),
        }
        match Self::do_connect(&mut inner, dst) {
            Ok(flow) => {
                inner.state = State::Connected(Box::new(flow));
                Ok(())
            }
            Err(e) => {
                inner.state = State::ConnectError;
                inner.err = e;
                Err(e)
            }
        }
    }

    fn do_connect(inner: &mut Inner, dst: *mut sockaddr) -> Result<Flow, c_int> {
        let id = inner.id;
        let mut timeout = RESOLVE_MS;
        for retry in 0..=RESOLVE_RETRIES {
            // SAFETY: our live id; `dst` the caller's address.
            if unsafe { rdma_resolve_addr(id, std::ptr::null_mut(), dst, timeout) } == 0 {
                break;
            }
            let e = errno();
            if e != libc::ETIMEDOUT || retry == RESOLVE_RETRIES {
                return Err(e);
            }
            timeout <<= 1;
        }
        // SAFETY: our live id, its address resolved.
        if unsafe { rdma_resolve_route(id, RESOLVE_MS << 1) } != 0 {
            return Err(errno());
        }
        // SAFETY: the id is bound to the device, has no QP and outlives the endpoint (the
        // socket destroys the id last).
        let ep = unsafe { Endpoint::create(id, Self::sizes(inner))? };
        let mut flow = Flow::new(ep);
        let data = flow.conn_data().encode();
        // SAFETY: a C struct for which all zeroes are valid.
        let mut param: rdma_conn_param = unsafe { std::mem::zeroed() };
        param.private_data = data.as_ptr().cast();
        param.private_data_len = CONN_DATA_LEN as u8;
        param.flow_control = 1;
        param.retry_count = 7;
        param.rnr_retry_count = 7;
        // SAFETY: our live id with its QP; `param` and the data it names are locals.
        if unsafe { rdma_connect(id, &mut param) } != 0 {
            return Err(errno());
        }
        // SAFETY: the synchronous connect left its ESTABLISHED event in the id.
        let reply = unsafe { event_private_data(id) };
        let peer = ConnData::decode(&reply).ok_or(libc::EPROTO)?;
        if peer.version != CONN_DATA_VERSION {
            return Err(libc::ENOTSUP);
        }
        flow.save_peer(&peer);
        Self::established(id);
        Ok(flow)
    }

    /// After set-up: the event acknowledged and the CM channel non-blocking (later CM
    /// events are only looked at, never waited for in a read).
    fn established(id: *mut rdma_cm_id) {
        // SAFETY: our live id.
        unsafe {
            ack_pending(id);
            set_nonblocking((*(*id).channel).fd, true);
        }
    }

    /// Accepts the next connection of a listening socket (`EAGAIN` when non-blocking and none
    /// is waiting).
    pub(crate) fn accept(&self) -> Result<RSocket, c_int> {
        let inner = self.inner.lock();
        if !matches!(inner.state, State::Listening) {
            return Err(libc::EINVAL);
        }
        let mut new_id = std::ptr::null_mut();
        // SAFETY: our live listening id (synchronous: the request's id gets its own
        // channel); `new_id` a local.
        if unsafe { rdma_get_request(inner.id, &mut new_id) } != 0 {
            return Err(errno());
        }
        let opts = inner.opts;
        drop(inner);
        // SAFETY: the request's event is in the new id.
        let request = unsafe { event_private_data(new_id) };
        let refuse = |e: c_int| {
            // SAFETY: the new live id; refused and destroyed once.
            unsafe {
                rdma_reject(new_id, std::ptr::null(), 0);
                ack_pending(new_id);
                rdma_destroy_id(new_id);
            }
            Err(e)
        };
        let Some(peer) = ConnData::decode(&request) else {
            return refuse(libc::EPROTO);
        };
        if peer.version != CONN_DATA_VERSION {
            return refuse(libc::ENOTSUP);
        }
        let socket = RSocket::around(new_id, opts, State::Init);
        let mut inner = socket.inner.lock();
        let sizes = Self::sizes(&inner);
        // SAFETY: the new id is bound to the device, has no QP and outlives the endpoint.
        let ep = match unsafe { Endpoint::create(new_id, sizes) } {
            Ok(ep) => ep,
            Err(e) => {
                drop(inner);
                drop(socket);
                return Err(e);
            }
        };
        let mut flow = Flow::new(ep);
        flow.save_peer(&peer);
        let data = flow.conn_data().encode();
        // The request's parameters, echoed, with our connection data.
        // SAFETY: the request's event is in the new id; its parameters are plain data.
        let mut param = unsafe { (*(*new_id).event).param.conn };
        param.private_data = data.as_ptr().cast();
        param.private_data_len = CONN_DATA_LEN as u8;
        // SAFETY: the new live id with its QP; `param` and the data it names are locals.
        if unsafe { rdma_accept(new_id, &mut param) } != 0 {
            let e = errno();
            inner.state = State::Connected(Box::new(flow));
            drop(inner);
            drop(socket);
            return Err(e);
        }
        Self::established(new_id);
        inner.state = State::Connected(Box::new(flow));
        drop(inner);
        Ok(socket)
    }

    /// Processes completions until `test` holds (`rs_get_comp`): `EWOULDBLOCK` when
    /// `nonblock` and it does not yet; `ENOTCONN` when the socket is not connected.
    pub(crate) fn get_comp(
        &self,
        inner: &mut MutexGuard<'_, Inner>,
        nonblock: bool,
        test: Test,
    ) -> Result<(), c_int> {
        let start = Instant::now();
        let polling = defaults().polling_time;
        let interval = defaults().wake_up_interval;
        loop {
            let cm_fd = inner.cm_fd();
            let flow = inner.flow().ok_or(libc::ENOTCONN)?;
            flow.update_credits();
            flow.poll_cq();
            flow.update_credits();
            if test(flow) {
                return Ok(());
            }
            if nonblock {
                return Err(libc::EWOULDBLOCK);
            }
            if start.elapsed() <= polling {
                continue;
            }
            if !flow.cq_armed {
                flow.ep.arm().inspect_err(|&e| flow.err = e)?;
                flow.cq_armed = true;
                continue;
            }
            let cq_fd = flow.ep.channel_fd();
            let cm_ready = MutexGuard::unlocked(inner, || {
                let _sleeper = self.wait.lock();
                wait_readable(&[cq_fd, cm_fd], interval)
            });
            Self::after_wait(inner, cm_ready);
        }
    }

    /// Takes what the channels hold after a sleep: completion events (the CQ must be armed
    /// again) and CM events (a disconnect ends the connection).
    pub(crate) fn after_wait(inner: &mut Inner, cm_maybe_ready: bool) {
        let id = inner.id;
        let Some(flow) = inner.flow() else { return };
        if flow.ep.take_events() {
            flow.cq_armed = false;
        }
        if cm_maybe_ready {
            take_cm_events(id, flow);
        }
    }

    /// Blocks until `test` holds, whatever the socket's mode (close and shutdown).
    fn wait_for(&self, inner: &mut MutexGuard<'_, Inner>, test: Test) -> Result<(), c_int> {
        self.get_comp(inner, false, test)
    }

    /// `rshutdown`.
    pub(crate) fn shutdown(&self, how: c_int) -> Result<(), c_int> {
        let mut inner = self.inner.lock();
        let flow = inner.flow().ok_or(libc::ENOTCONN)?;
        let ctrl = match how {
            libc::SHUT_RDWR => {
                flow.readable = false;
                flow.writable = false;
                CTRL_DISCONNECT
            }
            libc::SHUT_WR => {
                flow.writable = false;
                if flow.readable {
                    CTRL_SHUTDOWN
                } else {
                    CTRL_DISCONNECT
                }
            }
            libc::SHUT_RD => {
                flow.readable = false;
                if flow.writable {
                    return Ok(());
                }
                CTRL_DISCONNECT
            }
            _ => return Err(libc::EINVAL),
        };
        if flow.connected() {
            if !flow.conn_ctrl_avail() {
                self.wait_for(&mut inner, Flow::conn_ctrl_avail)?;
            }
            let flow = inner.flow().ok_or(libc::ENOTCONN)?;
            if flow.connected() {
                flow.post_ctrl(ctrl)?;
                self.wait_for(&mut inner, Flow::all_sends_done)?;
            }
        }
        let flow = inner.flow().ok_or(libc::ENOTCONN)?;
        if ctrl == CTRL_DISCONNECT || !flow.connected() {
            flow.disconnected();
            flow.ep.to_error();
        }
        Ok(())
    }

    /// Sends `buf` (`rsend`): the bytes sent, or an errno when none were.
    pub(crate) fn send(&self, buf: &[u8], dontwait: bool) -> Result<usize, c_int> {
        let mut inner = self.inner.lock();
        let nonblock = dontwait || inner.opts.nonblocking();
        let mut olen = super::stream::FIRST_CHUNK;
        let mut sent = 0usize;
        let mut result = Ok(());
        while sent < buf.len() {
            let flow = inner.flow().ok_or(libc::ENOTCONN)?;
            if !flow.can_send() {
                if let Err(e) = self.get_comp(&mut inner, nonblock, Flow::conn_can_send) {
                    result = Err(e);
                    break;
                }
                let flow = inner.flow().ok_or(libc::ENOTCONN)?;
                if !flow.writable || !flow.connected() {
                    result = Err(libc::ECONNRESET);
                    break;
                }
            }
            let flow = inner.flow().ok_or(libc::ENOTCONN)?;
            match flow.send_chunk(&buf[sent..], &mut olen) {
                Ok(n) => sent += n,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        match result {
            Err(e) if sent == 0 => Err(e),
            _ => Ok(sent),
        }
    }

    /// Receives into `buf` (`rrecv`): the bytes received (0 at the end of the stream).
    pub(crate) fn recv(&self, buf: &mut [u8], flags: c_int) -> Result<usize, c_int> {
        let mut inner = self.inner.lock();
        let nonblock = flags & libc::MSG_DONTWAIT != 0 || inner.opts.nonblocking();
        let peek = flags & libc::MSG_PEEK != 0;
        let waitall = flags & libc::MSG_WAITALL != 0;
        let mut got = 0usize;
        loop {
            let flow = inner.flow().ok_or(libc::ENOTCONN)?;
            if !flow.have_rdata() {
                if let Err(e) = self.get_comp(&mut inner, nonblock, Flow::conn_have_rdata) {
                    if got == 0 {
                        return Err(e);
                    }
                    break;
                }
            }
            let flow = inner.flow().ok_or(libc::ENOTCONN)?;
            got += flow.recv_into(&mut buf[got..], peek);
            if peek || !waitall || got == buf.len() || !flow.readable {
                break;
            }
        }
        if let Some(flow) = inner.flow() {
            flow.update_credits();
        }
        Ok(got)
    }

    /// Shuts down what is connected and releases the socket's objects (`rclose`).
    pub(crate) fn close(&self) {
        let connected = self.inner.lock().flow().is_some_and(|f| f.connected());
        if connected {
            if let Err(e) = self.shutdown(libc::SHUT_RDWR) {
                log::debug!("vrdma rsocket: shutdown at close: {e}");
            }
        }
    }
}

impl Drop for RSocket {
    fn drop(&mut self) {
        let inner = self.inner.get_mut();
        // The endpoint (QP, buffers, CQ) goes before the id.
        inner.state = State::Init;
        // SAFETY: our live id, destroyed once; the event a synchronous step left is
        // acknowledged first.
        unsafe {
            ack_pending(inner.id);
            rdma_destroy_id(inner.id);
        }
    }
}

/// The private data of the event a synchronous operation left in `id`.
///
/// # Safety
/// `id` is a live id of this library.
unsafe fn event_private_data(id: *mut rdma_cm_id) -> Vec<u8> {
    // SAFETY: caller contract.
    let event = unsafe { (*id).event };
    if event.is_null() {
        return Vec::new();
    }
    // SAFETY: a live event; its connection parameters name `private_data_len` bytes.
    unsafe {
        let conn = (*event).param.conn;
        if conn.private_data.is_null() {
            return Vec::new();
        }
        std::slice::from_raw_parts(conn.private_data.cast::<u8>(), conn.private_data_len.into())
            .to_vec()
    }
}

/// Reads the CM events waiting on a connected id's (non-blocking) channel: a disconnect ends
/// the connection; the others mean nothing to a connected stream.
fn take_cm_events(id: *mut rdma_cm_id, flow: &mut Flow) {
    loop {
        let mut event = std::ptr::null_mut();
        // SAFETY: our live id's own channel (non-blocking); `event` a local.
        if unsafe { rdma_get_cm_event((*id).channel, &mut event) } != 0 {
            return;
        }
        // SAFETY: the event just handed out, acknowledged once.
        unsafe {
            let kind = (*event).event;
            if kind == rdma_cm_event_type_RDMA_CM_EVENT_DISCONNECTED
                || kind == rdma_cm_event_type_RDMA_CM_EVENT_DEVICE_REMOVAL
                || kind == rdma_cm_event_type_RDMA_CM_EVENT_TIMEWAIT_EXIT
            {
                flow.disconnected();
            }
            rdma_ack_cm_event(event);
        }
    }
}

/// Sleeps until one of `fds` is readable or `timeout` passes: whether the last one (the CM
/// channel) may be readable.
pub(crate) fn wait_readable(fds: &[RawFd], timeout: Duration) -> bool {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX);
    // SAFETY: `pfds` is a live array of `len` entries.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    n > 0 && pfds.last().is_some_and(|p| p.revents != 0)
}

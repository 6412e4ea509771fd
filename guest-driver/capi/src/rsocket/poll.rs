//! `rpoll` and `rselect`: poll(2) over rsockets and ordinary descriptors together.
//!
//! Each pass evaluates every rsocket from its state (processing its completions) and polls
//! the ordinary descriptors without waiting. When nothing is ready, after rsockets' short
//! busy-poll, the rsockets' CQs are armed and the thread sleeps in poll(2) on their completion
//! and CM channels beside the ordinary descriptors, at most `wake_up_interval` at a time.

use std::ffi::c_int;
use std::time::{Duration, Instant};

use super::config::defaults;
use super::socket::{RSocket, State};
use super::table;

/// What `events` of one rsocket are ready now (`rs_poll_rs`).
fn rsocket_events(s: &RSocket, events: i16) -> i16 {
    let mut inner = s.inner.lock();
    let cm_fd = inner.cm_fd();
    match &mut inner.state {
        State::Connected(flow) => {
            flow.update_credits();
            flow.poll_cq();
            flow.update_credits();
            let mut revents = 0;
            if events & libc::POLLIN != 0 && flow.conn_have_rdata() {
                revents |= libc::POLLIN;
            }
            if events & libc::POLLOUT != 0 && flow.can_send() {
                revents |= libc::POLLOUT;
            }
            if !flow.connected() {
                revents |= if flow.link == super::stream::Link::Disconnected {
                    libc::POLLHUP
                } else {
                    libc::POLLERR
                };
            }
            revents
        }
        State::Listening => {
            let mut p = libc::pollfd {
                fd: cm_fd,
                events: events & libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one live pollfd.
            unsafe { libc::poll(&mut p, 1, 0) };
            p.revents
        }
        State::ConnectError => (events & (libc::POLLIN | libc::POLLOUT)) | libc::POLLERR,
        State::Init | State::Bound => 0,
    }
}

/// Arms every connected rsocket's CQ that is not armed: whether one was (its completions
/// must then be looked at again before sleeping).
fn arm(s: &RSocket) -> bool {
    let mut inner = s.inner.lock();
    let Some(flow) = inner.flow() else {
        return false;
    };
    if flow.cq_armed {
        return false;
    }
    if flow.ep.arm().is_ok() {
        flow.cq_armed = true;
    }
    true
}

/// The descriptors to sleep on for an rsocket.
fn wait_fds(s: &RSocket, out: &mut Vec<libc::pollfd>) {
    let mut inner = s.inner.lock();
    let cm_fd = inner.cm_fd();
    let read = |fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    if let Some(flow) = inner.flow() {
        out.push(read(flow.ep.channel_fd()));
    }
    out.push(read(cm_fd));
}

/// One pass: fills every entry's `revents`; the number of entries with any.
fn check(fds: &mut [libc::pollfd], sockets: &[Option<std::sync::Arc<RSocket>>]) -> c_int {
    let mut ordinary: Vec<libc::pollfd> = Vec::new();
    for (p, s) in fds.iter_mut().zip(sockets) {
        match s {
            Some(s) => p.revents = rsocket_events(s, p.events),
            None => ordinary.push(libc::pollfd {
                fd: p.fd,
                events: p.events,
                revents: 0,
            }),
        }
    }
    if !ordinary.is_empty() {
        // SAFETY: a live array of `len` pollfds.
        unsafe { libc::poll(ordinary.as_mut_ptr(), ordinary.len() as libc::nfds_t, 0) };
        let mut results = ordinary.into_iter();
        for (p, s) in fds.iter_mut().zip(sockets) {
            if s.is_none() {
                p.revents = results.next().map_or(0, |r| r.revents);
            }
        }
    }
    fds.iter().filter(|p| p.revents != 0).count() as c_int
}

/// `rpoll`.
///
/// # Safety
/// `fds` names `nfds` writable pollfds.
pub unsafe extern "C" fn rpoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    crate::ffi::guard("rpoll", -1, || {
        if nfds > 0 && fds.is_null() {
            crate::ffi::set_errno(libc::EFAULT);
            return -1;
        }
        let fds: &mut [libc::pollfd] = if nfds == 0 {
            &mut []
        } else {
            // SAFETY: caller contract.
            unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) }
        };
        poll_all(fds, timeout)
    })
}

fn poll_all(fds: &mut [libc::pollfd], timeout: c_int) -> c_int {
    let sockets: Vec<Option<std::sync::Arc<RSocket>>> = fds
        .iter()
        .map(|p| if p.fd < 0 { None } else { table::get(p.fd) })
        .collect();
    let start = Instant::now();
    let deadline = (timeout >= 0).then(|| start + Duration::from_millis(timeout as u64));
    let d = defaults();
    loop {
        let ready = check(fds, &sockets);
        if ready > 0 || timeout == 0 {
            return ready;
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return 0;
        }
        if now.duration_since(start) <= d.polling_time {
            continue;
        }
        if sockets.iter().flatten().fold(false, |any, s| arm(s) | any) {
            continue;
        }
        let mut sleep: Vec<libc::pollfd> = Vec::with_capacity(fds.len() + 2);
        for (p, s) in fds.iter().zip(&sockets) {
            match s {
                Some(s) => wait_fds(s, &mut sleep),
                None => sleep.push(libc::pollfd {
                    fd: p.fd,
                    events: p.events,
                    revents: 0,
                }),
            }
        }
        let mut span = d.wake_up_interval;
        if let Some(d) = deadline {
            span = span.min(d.saturating_duration_since(now));
        }
        let ms = c_int::try_from(span.as_millis())
            .unwrap_or(c_int::MAX)
            .max(1);
        // SAFETY: a live array of `len` pollfds.
        let n = unsafe { libc::poll(sleep.as_mut_ptr(), sleep.len() as libc::nfds_t, ms) };
        if n < 0 {
            let e = crate::ffi::errno();
            if e != libc::EINTR {
                crate::ffi::set_errno(e);
                return -1;
            }
        }
        for s in sockets.iter().flatten() {
            RSocket::after_wait(&mut s.inner.lock(), true);
        }
    }
}

/// `rselect`: `rpoll` over the descriptors of the three sets.
///
/// # Safety
/// The sets are NULL or valid `fd_set`s for `nfds` descriptors; `timeout` NULL or valid.
pub unsafe extern "C" fn rselect(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    crate::ffi::guard("rselect", -1, || {
        let mut polled = Vec::new();
        for fd in 0..nfds.max(0) {
            let mut events = 0;
            // SAFETY: caller contract.
            unsafe {
                if !readfds.is_null() && libc::FD_ISSET(fd, readfds) {
                    events |= libc::POLLIN;
                }
                if !writefds.is_null() && libc::FD_ISSET(fd, writefds) {
                    events |= libc::POLLOUT;
                }
                if !exceptfds.is_null() && libc::FD_ISSET(fd, exceptfds) {
                    events |= libc::POLLPRI;
                }
            }
            if events != 0 {
                polled.push(libc::pollfd {
                    fd,
                    events,
                    revents: 0,
                });
            }
        }
        // SAFETY: caller contract.
        let ms = match unsafe { timeout.as_ref() } {
            Some(t) => c_int::try_from(t.tv_sec * 1000 + t.tv_usec / 1000).unwrap_or(c_int::MAX),
            None => -1,
        };
        let n = poll_all(&mut polled, ms);
        if n < 0 {
            return n;
        }
        let mut count = 0;
        // SAFETY: caller contract.
        unsafe {
            for set in [readfds, writefds, exceptfds] {
                if !set.is_null() {
                    libc::FD_ZERO(set);
                }
            }
            for p in &polled {
                let hup = p.revents & (libc::POLLHUP | libc::POLLERR) != 0;
                if !readfds.is_null()
                    && p.events & libc::POLLIN != 0
                    && (p.revents & libc::POLLIN != 0 || hup)
                {
                    libc::FD_SET(p.fd, readfds);
                    count += 1;
                }
                if !writefds.is_null()
                    && p.events & libc::POLLOUT != 0
                    && (p.revents & libc::POLLOUT != 0 || hup)
                {
                    libc::FD_SET(p.fd, writefds);
                    count += 1;
                }
                if !exceptfds.is_null()
                    && p.events & libc::POLLPRI != 0
                    && p.revents & libc::POLLPRI != 0
                {
                    libc::FD_SET(p.fd, exceptfds);
                    count += 1;
                }
            }
        }
        count
    })
}

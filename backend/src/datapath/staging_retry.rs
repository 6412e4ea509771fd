//! The doorbell worker's retry of staging rings (spec §9.6, §9.7) whose WQEs wait for room in
//! their host queue: a send is retired from the host queue only once it is acknowledged, so a
//! driver that posts as its own staging ring allows may find some of its WQEs left behind, and
//! no later doorbell may come (a ping-pong waits for the very send that waits). A one-shot
//! timer on the doorbell worker pumps those rings again every 50 µs; only after 16 retries in
//! a row that moved nothing (a QP that is not sending, e.g. still in INIT) does the delay
//! double, up to 10 ms, so that a guest cannot make the daemon spin. Backing off at once made
//! ping-pongs through staging rings slow: the host usually retires the WQE within a few
//! retries, and a doubled delay was then waited out in full (measured: `ib_send_lat` 2 B
//! typical 251–1177 µs staged against 127–147 µs direct).

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use log::warn;
use parking_lot::Mutex;
use vmm_sys_util::timerfd::TimerFd;

/// When rings with waiting WQEs are pumped again (the doorbell worker's timer): soon at first,
/// then, while nothing moves (a QP that is not sending, e.g. one still in INIT), less and less
/// often, so that a guest cannot make the daemon spin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryBackoff {
    next: Duration,
    /// Retries in a row that moved nothing.
    idle: u32,
}

impl RetryBackoff {
    /// The first retry's delay.
    pub const FIRST: Duration = Duration::from_micros(50);
    /// The longest delay between retries.
    pub const LONGEST: Duration = Duration::from_millis(10);
    /// Fruitless retries at [`Self::FIRST`] before the delay starts doubling.
    pub const PATIENCE: u32 = 16;

    /// Delay of the first retry.
    pub fn new() -> Self {
        RetryBackoff {
            next: Self::FIRST,
            idle: 0,
        }
    }

    /// The delay before the next retry, given whether the last one moved anything.
    pub fn after(&mut self, moved: bool) -> Duration {
        if moved {
            self.idle = 0;
            self.next = Self::FIRST;
        } else {
            self.idle = self.idle.saturating_add(1);
            if self.idle > Self::PATIENCE {
                self.next = (self.next * 2).min(Self::LONGEST);
            }
        }
        self.next
    }

    /// The delay of the retry to arm now.
    pub fn current(&self) -> Duration {
        self.next
    }
}

impl Default for RetryBackoff {
    fn default() -> Self {
        Self::new()
    }
}

/// The timer and its backoff.
pub struct RetryTimer {
    timer: Mutex<(TimerFd, RetryBackoff)>,
    fd: RawFd,
}

impl RetryTimer {
    /// A disarmed timer.
    pub fn new() -> io::Result<Self> {
        let timer = TimerFd::new().map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
        let fd = timer.as_raw_fd();
        // Non-blocking: re-arming clears an expiration the worker may already have been told
        // of, and its read must then not wait for the next one.
        // SAFETY: F_GETFL/F_SETFL on an fd we own; no memory is involved.
        let set = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        if !set {
            return Err(io::Error::last_os_error());
        }
        Ok(RetryTimer {
            timer: Mutex::new((timer, RetryBackoff::new())),
            fd,
        })
    }

    /// The fd the doorbell worker watches.
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// Arms the first retry unless one is pending.
    pub fn start(&self) {
        let mut guard = self.timer.lock();
        let (timer, backoff) = &mut *guard;
        if timer.is_armed().unwrap_or(false) {
            return;
        }
        *backoff = RetryBackoff::new();
        Self::arm(timer, backoff.current());
    }

    /// After a retry (the timer fired): reads the expiration, then arms the next retry if WQEs
    /// still wait, sooner if the last one moved some.
    pub fn after_retry(&self, moved: bool, still_waiting: bool) {
        let mut guard = self.timer.lock();
        let (timer, backoff) = &mut *guard;
        // Consume the expiration (EAGAIN if a re-arm cleared it meanwhile).
        let _ = timer.wait();
        if still_waiting {
            let delay = backoff.after(moved);
            Self::arm(timer, delay);
        }
    }

    fn arm(timer: &mut TimerFd, delay: Duration) {
        if let Err(e) = timer.reset(delay, None) {
            warn!("staging retry timer: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_while_nothing_moves_and_restarts_when_something_does() {
        let mut b = RetryBackoff::new();
        assert_eq!(b.current(), RetryBackoff::FIRST);
        for _ in 0..RetryBackoff::PATIENCE {
            assert_eq!(b.after(false), RetryBackoff::FIRST);
        }
        assert_eq!(b.after(false), RetryBackoff::FIRST * 2);
        assert_eq!(b.after(false), RetryBackoff::FIRST * 4);
        for _ in 0..20 {
            b.after(false);
        }
        assert_eq!(b.current(), RetryBackoff::LONGEST);
        assert_eq!(b.after(true), RetryBackoff::FIRST);
        assert_eq!(
            b.after(false),
            RetryBackoff::FIRST,
            "patient again after progress"
        );
    }
}

//! The doorbell worker's retry of staging rings (spec §9.6, §9.7) whose WQEs wait for room in
//! their host queue: a send is retired from the host queue only once it is acknowledged, so a
//! driver that posts as its own staging ring allows may find some of its WQEs left behind, and
//! no later doorbell may come (a ping-pong waits for the very send that waits). A one-shot
//! timer on the doorbell worker pumps those rings again every 50 µs; only after 16 retries in
//! a row that moved nothing (a QP that is not sending, e.g. still in INIT) does a ring's delay
//! double, up to 10 ms, so that a guest cannot make the daemon spin. Each ring backs off on
//! its own ([`RetrySchedule`]): one ring that keeps moving does not keep the others at 50 µs. Backing off at once made
//! ping-pongs through staging rings slow: the host usually retires the WQE within a few
//! retries, and a doubled delay was then waited out in full (measured: `ib_send_lat` 2 B
//! typical 251–1177 µs staged against 127–147 µs direct).

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

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

/// A ring whose WQEs wait for room in its host queue: its own backoff, and when it is due.
#[derive(Debug, Clone, Copy)]
struct WaitingRing {
    index: u32,
    backoff: RetryBackoff,
    due: Instant,
}

/// Which rings are pumped again when. Each ring backs off on its own: a ring that keeps
/// moving is retried every [`RetryBackoff::FIRST`] without holding the others there, and a
/// retry pumps only the rings that are due, so a guest with many stuck rings and one moving
/// one cannot make the daemon pump them all every 50 µs.
#[derive(Debug, Default)]
pub struct RetrySchedule {
    rings: Vec<WaitingRing>,
}

impl RetrySchedule {
    /// `index` has WQEs waiting since `now` (nothing changes if it was waiting already).
    pub fn add(&mut self, index: u32, now: Instant) {
        if !self.rings.iter().any(|r| r.index == index) {
            let backoff = RetryBackoff::new();
            self.rings.push(WaitingRing {
                index,
                due: now + backoff.current(),
                backoff,
            });
        }
    }

    /// `index` waits no more (its rings were released).
    pub fn remove(&mut self, index: u32) {
        self.rings.retain(|r| r.index != index);
    }

    /// Whether any ring waits.
    pub fn is_empty(&self) -> bool {
        self.rings.is_empty()
    }

    /// Pumps every ring due at `now` with `pump`, which answers how many WQEs moved and
    /// whether some still wait; returns the WQEs moved. Rings due within the first delay are
    /// pumped too: one expiry serves rings due close together, and a ring never waits for
    /// less than [`RetryBackoff::FIRST`] after its pump, so the timer never spins.
    pub fn retry_due(&mut self, now: Instant, mut pump: impl FnMut(u32) -> (usize, bool)) -> usize {
        let mut moved = 0;
        let horizon = now + RetryBackoff::FIRST;
        self.rings.retain_mut(|ring| {
            if ring.due > horizon {
                return true;
            }
            let (forwarded, waiting) = pump(ring.index);
            moved += forwarded;
            ring.due = now + ring.backoff.after(forwarded > 0);
            waiting
        });
        moved
    }

    /// How long after `now` the next ring is due; `None` if none waits.
    pub fn next_delay(&self, now: Instant) -> Option<Duration> {
        self.rings
            .iter()
            .map(|r| r.due.saturating_duration_since(now))
            .min()
    }
}

/// The doorbell worker's one-shot timer for the next due ring.
pub struct RetryTimer {
    timer: Mutex<TimerFd>,
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
            timer: Mutex::new(timer),
            fd,
        })
    }

    /// The fd the doorbell worker watches.
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// Arms a retry after `delay` unless one is pending.
    pub fn start(&self, delay: Duration) {
        let mut timer = self.timer.lock();
        if timer.is_armed().unwrap_or(false) {
            return;
        }
        Self::arm(&mut timer, delay);
    }

    /// After a retry (the timer fired): reads the expiration, then arms the next retry, if a
    /// ring still waits, `next` from now.
    pub fn after_retry(&self, next: Option<Duration>) {
        let mut timer = self.timer.lock();
        // Consume the expiration (EAGAIN if a re-arm cleared it meanwhile).
        let _ = timer.wait();
        if let Some(delay) = next {
            Self::arm(&mut timer, delay);
        }
    }

    fn arm(timer: &mut TimerFd, delay: Duration) {
        // A zero delay would disarm the timer: a ring already due is pumped a moment later.
        if let Err(e) = timer.reset(delay.max(Duration::from_micros(1)), None) {
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

    #[test]
    fn a_moving_ring_does_not_keep_a_stuck_one_at_the_first_delay() {
        let start = Instant::now();
        let mut schedule = RetrySchedule::default();
        let (moving, stuck) = (1, 2);
        schedule.add(moving, start);
        schedule.add(stuck, start);
        schedule.add(stuck, start); // already waiting: no second entry
        let mut pumped = [0u32; 3];
        let mut now = start;
        // Retry whenever the next ring is due, for a simulated second.
        while now < start + Duration::from_secs(1) {
            now += schedule.next_delay(now).expect("both rings still wait");
            schedule.retry_due(now, |index| {
                pumped[index as usize] += 1;
                (usize::from(index == moving), true)
            });
        }
        // The moving ring every 50 µs; the stuck one patiently at first, then at most every
        // 10 ms.
        assert!(pumped[moving as usize] >= 19_000, "{pumped:?}");
        let stuck_bound = RetryBackoff::PATIENCE + 10 + 100;
        assert!(pumped[stuck as usize] <= stuck_bound, "{pumped:?}");
        // A ring that stops waiting leaves the schedule; so does a released one.
        schedule.retry_due(now + Duration::from_secs(1), |index| (0, index == stuck));
        schedule.remove(stuck);
        assert!(schedule.is_empty());
        assert_eq!(schedule.next_delay(now), None);
    }
}

//! How a side waits for its completions: by busy polling, or by sleeping on completion events
//! (ARM_CQ, then the context's event queue) the way `ibv_req_notify_cq` +
//! `ibv_get_cq_event` users do.
//!
//! The event loop is the classic one: poll; when the CQ is empty, arm it and poll once more
//! (a completion added between the last poll and the arm raises no event, so without that
//! poll it would be found only after the next event, or never); only then sleep. Arming is
//! one-shot, so a CQ stays armed until its event has been taken, and is armed again only then.
//!
//! Whether a side ever sleeps depends on timing: a fast device can keep every poll busy. So
//! that the count of events says something for certain, the waiter notes when an event is
//! *owed*: a completion was found after the armed CQ had been seen empty, so it arrived after
//! the arm and the device must raise the event. [`Waiter::settle`] then waits for it, and
//! [`Waiter::arm_empty`] arms CQs that are empty by construction (before the peer may send):
//! a run's first completion on such a CQ therefore always yields one counted event.

use std::time::{Duration, Instant};

use serde::Serialize;

use vrdma::provider::WorkCompletion;
use vrdma::verbs::{Cq, VerbsError};

use super::oob::OobError;

/// How often a sleeping side looks at the out-of-band connection (a failed peer says so there).
const PEER_CHECK_INTERVAL: Duration = Duration::from_millis(100);
/// Empty polls between two looks at the clock and the peer while busy polling.
const SPINS_PER_CHECK: u32 = 1024;

/// How completions are awaited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Completion {
    /// Busy polling.
    #[default]
    Poll,
    /// Completion events: arm, poll once more, sleep until the CQ's event.
    Events,
}

/// What the event mode did (all zero when polling).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EventCounts {
    /// Completion events received: each ended one sleep on an empty, armed CQ.
    pub completion_events: u64,
    /// ARM_CQ commands sent. The device sends one event per arm followed by a completion,
    /// so a run never sees more events than arms (a single step can: an arm made at the end
    /// of one step may be answered in the next).
    pub arms: u64,
    /// Events after which the CQ held no new completion: the completion that raised the
    /// event had already been taken by the poll right after arming.
    pub spurious_wakeups: u64,
}

impl EventCounts {
    /// What happened since `earlier` was taken.
    pub fn since(&self, earlier: &EventCounts) -> EventCounts {
        EventCounts {
            completion_events: self.completion_events - earlier.completion_events,
            arms: self.arms - earlier.arms,
            spurious_wakeups: self.spurious_wakeups - earlier.spurious_wakeups,
        }
    }

    /// One line for people: `<n> completion events, <n> arms, <n> spurious wake-ups`.
    pub fn summary(&self) -> String {
        format!(
            "{} completion events, {} arms, {} spurious wake-ups",
            self.completion_events, self.arms, self.spurious_wakeups
        )
    }
}

impl std::ops::Add for EventCounts {
    type Output = EventCounts;

    fn add(self, other: EventCounts) -> EventCounts {
        EventCounts {
            completion_events: self.completion_events + other.completion_events,
            arms: self.arms + other.arms,
            spurious_wakeups: self.spurious_wakeups + other.spurious_wakeups,
        }
    }
}

/// Why no completion came.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    #[error("no completion within {0:?}")]
    Timeout(Duration),
    #[error("arming the CQ: {0}")]
    Arm(#[source] VerbsError),
    #[error("waiting for a completion event: {0}")]
    Event(#[source] VerbsError),
    #[error(transparent)]
    Peer(#[from] OobError),
    /// The device went away (its CQs will stay empty).
    #[error("the device failed: {0}")]
    Device(#[source] VerbsError),
}

/// The arm of one CQ, as far as this side knows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Arm {
    /// An arm is outstanding: the CQ is armed on the device, or its event is on its way;
    /// cleared when the event is taken.
    armed: bool,
    /// The CQ was seen empty since the arm: any completion found later arrived after the arm.
    drained: bool,
    /// A completion arrived after the arm, so its event must come.
    owed: bool,
}

impl Arm {
    /// Notes a poll of the armed CQ that moved `got` completions into room for `room`.
    fn polled(&mut self, got: usize, room: usize) {
        if !self.armed {
            return;
        }
        if got > 0 && self.drained {
            self.owed = true;
        }
        if got < room {
            self.drained = true;
        }
    }
}

/// Waits for completions on a fixed set of CQs, each known by its index (`0..QUEUES`).
#[derive(Debug)]
pub struct Waiter<const QUEUES: usize> {
    mode: Completion,
    arms: [Arm; QUEUES],
    counts: EventCounts,
}

impl<const QUEUES: usize> Waiter<QUEUES> {
    pub fn new(mode: Completion) -> Self {
        Waiter {
            mode,
            arms: [Arm::default(); QUEUES],
            counts: EventCounts::default(),
        }
    }

    pub fn mode(&self) -> Completion {
        self.mode
    }

    /// What the event mode did so far.
    pub fn counts(&self) -> EventCounts {
        self.counts
    }

    /// Arms `cq` (index `queue`), known to be empty: nothing completes on it before this
    /// side lets the peer send. Its first completion then raises an event for certain. Does
    /// nothing when polling.
    pub fn arm_empty(&mut self, cq: &Cq, queue: usize) -> Result<(), WaitError> {
        if self.mode != Completion::Events || self.arms[queue].armed {
            return Ok(());
        }
        cq.arm(false).map_err(WaitError::Arm)?;
        self.counts.arms += 1;
        self.arms[queue] = Arm {
            armed: true,
            drained: true,
            owed: false,
        };
        Ok(())
    }

    /// Takes the event `cq` (index `queue`) owes (see the module documentation), waiting up
    /// to `timeout` for it, so that it counts where its completion was taken. Does nothing
    /// when no event is owed.
    pub fn settle(
        &mut self,
        cq: &Cq,
        queue: usize,
        timeout: Duration,
        mut check: impl FnMut() -> Result<(), WaitError>,
    ) -> Result<(), WaitError> {
        if !self.arms[queue].owed {
            return Ok(());
        }
        self.sleep(cq, queue, Instant::now() + timeout, timeout, &mut check)
    }

    /// Waits up to `timeout` for at least one completion on `cq` (index `queue`), moves up
    /// to `out.len()` of them into `out` and returns how many. `check` (is the peer, is the device still there?) is called
    /// regularly while nothing arrives; its error ends the wait.
    pub fn next(
        &mut self,
        cq: &Cq,
        queue: usize,
        out: &mut [WorkCompletion],
        timeout: Duration,
        mut check: impl FnMut() -> Result<(), WaitError>,
    ) -> Result<usize, WaitError> {
        let deadline = Instant::now() + timeout;
        let mut spins: u32 = 0;
        let mut woken = false;
        loop {
            let got = cq.poll(out);
            self.arms[queue].polled(got, out.len());
            if got > 0 {
                return Ok(got);
            }
            match self.mode {
                Completion::Poll => {
                    spins = spins.wrapping_add(1);
                    if spins.is_multiple_of(SPINS_PER_CHECK) {
                        if Instant::now() > deadline {
                            return Err(WaitError::Timeout(timeout));
                        }
                        check()?;
                    }
                }
                Completion::Events => {
                    if woken {
                        self.counts.spurious_wakeups += 1;
                        woken = false;
                    }
                    if !self.arms[queue].armed {
                        cq.arm(false).map_err(WaitError::Arm)?;
                        self.arms[queue] = Arm {
                            armed: true,
                            ..Arm::default()
                        };
                        self.counts.arms += 1;
                        // Poll once more before sleeping: see the module documentation.
                        continue;
                    }
                    self.sleep(cq, queue, deadline, timeout, &mut check)?;
                    woken = true;
                }
            }
        }
    }

    /// Sleeps until the completion event of the armed CQ `queue`.
    fn sleep(
        &mut self,
        cq: &Cq,
        queue: usize,
        deadline: Instant,
        timeout: Duration,
        check: &mut impl FnMut() -> Result<(), WaitError>,
    ) -> Result<(), WaitError> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(WaitError::Timeout(timeout));
            }
            if cq
                .wait_event(Some(left.min(PEER_CHECK_INTERVAL)))
                .map_err(WaitError::Event)?
            {
                self.arms[queue] = Arm::default();
                self.counts.completion_events += 1;
                return Ok(());
            }
            check()?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_owed_only_for_a_completion_found_after_the_cq_was_seen_empty() {
        let mut arm = Arm {
            armed: true,
            ..Arm::default()
        };
        // The poll right after arming fills all the room: those completions may predate
        // the arm, and more may wait.
        arm.polled(4, 4);
        assert!(!arm.owed && !arm.drained);
        // This one empties the CQ...
        arm.polled(2, 4);
        assert!(!arm.owed && arm.drained);
        // ...so what comes next came after the arm.
        arm.polled(1, 4);
        assert!(arm.owed);

        let mut idle = Arm::default();
        idle.polled(0, 4);
        idle.polled(1, 4);
        assert_eq!(idle, Arm::default(), "no arm, nothing owed");
    }

    #[test]
    fn counts_subtract_per_field() {
        let before = EventCounts {
            completion_events: 3,
            arms: 5,
            spurious_wakeups: 1,
        };
        let after = EventCounts {
            completion_events: 10,
            arms: 12,
            spurious_wakeups: 1,
        };
        assert_eq!(
            after.since(&before),
            EventCounts {
                completion_events: 7,
                arms: 7,
                spurious_wakeups: 0,
            }
        );
    }

    #[test]
    fn completion_mode_serializes_by_name() {
        assert_eq!(
            serde_json::to_string(&Completion::Events).unwrap(),
            "\"events\""
        );
        assert_eq!(Completion::default(), Completion::Poll);
    }
}

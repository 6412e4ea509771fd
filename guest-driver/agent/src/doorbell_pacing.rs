//! How often the agent's doorbell relay notifies the device, in VM mode.
//!
//! Every process of the agent asks for notifications on one eventfd, and one notification
//! covers every doorbell queued since the last (the device reads the whole doorbell area).
//! Without a bound, a process that writes the eventfd in a loop makes the relay, which runs at
//! the highest nice level, write the notify register in a loop: a guest CPU lost, and every
//! write a trap to the hypervisor. So notifications are at least `min_interval` apart: asks
//! that come sooner wait for the rest of the interval and are then served together. A
//! process alone pays nothing unless it asks again within the interval; whatever the others
//! do, an ask waits at most one interval, and the relay wakes at most once per interval.

use std::time::{Duration, Instant};

/// The default spacing: well above what one notification costs under KVM (an MMIO exit and a
/// wake-up of the back-end's thread, a few µs), well below a network round trip.
pub const DEFAULT_MIN_INTERVAL: Duration = Duration::from_micros(20);

/// When the next notification may go.
#[derive(Debug, Clone)]
pub struct DoorbellPacing {
    min_interval: Duration,
    last: Option<Instant>,
}

impl DoorbellPacing {
    pub fn new(min_interval: Duration) -> Self {
        DoorbellPacing {
            min_interval,
            last: None,
        }
    }

    /// How long an ask that came at `now` waits before its notification.
    pub fn wait(&self, now: Instant) -> Duration {
        self.last.map_or(Duration::ZERO, |last| {
            (last + self.min_interval).saturating_duration_since(now)
        })
    }

    /// A notification went at `at`.
    pub fn notified(&mut self, at: Instant) {
        self.last = Some(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Duration = Duration::from_micros(20);

    /// Asks at the given offsets (µs) served as the relay serves them: the notification times.
    fn serve(asks: &[u64]) -> Vec<u64> {
        let start = Instant::now();
        let at = |us: u64| start + Duration::from_micros(us);
        let mut pacing = DoorbellPacing::new(INTERVAL);
        let mut notifications: Vec<u64> = Vec::new();
        let mut clock = 0u64;
        let mut pending = asks.iter().copied().peekable();
        while let Some(ask) = pending.next() {
            // The relay sees the ask once it is free again.
            clock = clock.max(ask);
            let wait = pacing.wait(at(clock)).as_micros() as u64;
            clock += wait;
            // Every ask that came meanwhile is served by the same notification.
            while pending.peek().is_some_and(|&next| next <= clock) {
                pending.next();
            }
            pacing.notified(at(clock));
            notifications.push(clock);
        }
        notifications
    }

    #[test]
    fn a_lone_ask_is_served_at_once() {
        assert_eq!(serve(&[100]), [100]);
        assert_eq!(serve(&[0, 500, 1000]), [0, 500, 1000]);
    }

    #[test]
    fn a_process_asking_without_end_gets_one_notification_per_interval() {
        let hammer: Vec<u64> = (0..1000).collect();
        let notifications = serve(&hammer);
        // At 0, 20, …, 1000: the last serves the asks after 980.
        assert_eq!(notifications, (0..=1000).step_by(20).collect::<Vec<u64>>());
    }

    #[test]
    fn beside_a_hammer_an_ask_waits_at_most_one_interval() {
        let mut asks: Vec<u64> = (0..1000).collect();
        // The victim's asks, in among the hammer's.
        for victim in [137, 401, 777] {
            asks.push(victim);
        }
        asks.sort_unstable();
        let notifications = serve(&asks);
        for victim in [137u64, 401, 777] {
            let served = notifications.iter().find(|&&n| n >= victim).unwrap();
            assert!(served - victim <= 20, "{victim} served at {served}");
        }
    }
}

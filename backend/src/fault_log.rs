//! Rate-limited logging of what guests do wrong.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use log::{debug, warn};

/// Logs what a guest does wrong without letting one guest flood the log: the first few reports
/// and then every power-of-two-th at warn level, the rest at debug level.
#[derive(Default)]
pub struct FaultLog {
    /// The guest connection the reports are about, if known where they are made.
    guest: Option<u64>,
    count: AtomicU64,
}

impl FaultLog {
    const ALWAYS_SHOWN: u64 = 8;

    /// A log whose reports name guest connection `guest`.
    pub fn for_guest(guest: u64) -> Self {
        FaultLog {
            guest: Some(guest),
            count: AtomicU64::new(0),
        }
    }

    /// Reports one fault.
    pub fn report(&self, what: fmt::Arguments<'_>) {
        let n = self.count.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        match (self.guest, Self::shown(n)) {
            (Some(guest), true) => warn!("guest {guest}: error #{n}: {what}"),
            (Some(guest), false) => debug!("guest {guest}: error #{n}: {what}"),
            (None, true) => warn!("guest error #{n}: {what}"),
            (None, false) => debug!("guest error #{n}: {what}"),
        }
    }
}

impl FaultLog {
    /// Whether report number `n` (from 1) goes to the log at warn level.
    fn shown(n: u64) -> bool {
        n <= Self::ALWAYS_SHOWN || n.is_power_of_two()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_faults_costs_a_logarithmic_number_of_lines() {
        let shown = (1..=20_000).filter(|&n| FaultLog::shown(n)).count();
        // 1..=8, then 16, 32, ..., 16384.
        assert_eq!(shown, 8 + 11);
        let log = FaultLog::for_guest(7);
        for _ in 0..20_000 {
            log.report(format_args!("malformed"));
        }
        assert_eq!(log.count.load(Ordering::Relaxed), 20_000);
    }
}

//! Rate-limited logging of what guests do wrong.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use log::{debug, warn};

/// Counts the reports of one kind a guest can cause and says which deserve a line at their
/// level: the first few and then every power-of-two-th; the others go to debug level. A loop a
/// guest runs costs the log a logarithmic number of lines.
#[derive(Default)]
pub struct LogLimit {
    count: AtomicU64,
}

impl LogLimit {
    const ALWAYS_SHOWN: u64 = 8;

    /// Counts one report: its number (from 1), and whether it is shown at its level.
    pub fn next(&self) -> (u64, bool) {
        let n = self.count.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        (n, Self::shown(n))
    }

    /// Whether report number `n` (from 1) is shown at its level.
    fn shown(n: u64) -> bool {
        n <= Self::ALWAYS_SHOWN || n.is_power_of_two()
    }
}

/// Logs what a guest does wrong without letting one guest flood the log ([`LogLimit`], warn
/// level).
#[derive(Default)]
pub struct FaultLog {
    /// The guest connection the reports are about, if known where they are made.
    guest: Option<u64>,
    limit: LogLimit,
}

impl FaultLog {
    /// A log whose reports name guest connection `guest`.
    pub fn for_guest(guest: u64) -> Self {
        FaultLog {
            guest: Some(guest),
            limit: LogLimit::default(),
        }
    }

    /// Reports one fault.
    pub fn report(&self, what: fmt::Arguments<'_>) {
        let (n, shown) = self.limit.next();
        match (self.guest, shown) {
            (Some(guest), true) => warn!("guest {guest}: error #{n}: {what}"),
            (Some(guest), false) => debug!("guest {guest}: error #{n}: {what}"),
            (None, true) => warn!("guest error #{n}: {what}"),
            (None, false) => debug!("guest error #{n}: {what}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_faults_costs_a_logarithmic_number_of_lines() {
        let shown = (1..=20_000).filter(|&n| LogLimit::shown(n)).count();
        // 1..=8, then 16, 32, ..., 16384.
        assert_eq!(shown, 8 + 11);
        let log = FaultLog::for_guest(7);
        for _ in 0..20_000 {
            log.report(format_args!("malformed"));
        }
        assert_eq!(log.limit.next(), (20_001, false));
    }
}

//! Host AHs the guest destroyed while staged UD WQEs that may name them still wait in host
//! send queues (spec §9.6): such an AH stays on the host until those WQEs are consumed, so
//! that the host cannot give its number to a new AH (of this guest, aimed elsewhere) that the
//! WQEs, checked against the old one, would then be sent through.

use crate::host::{AhHandle, QpHandle};

/// WQEs of one host send queue that the host had not consumed when an AH was destroyed, as
/// counted down since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Unconsumed {
    /// The queue's doorbell index.
    pub index: u32,
    /// Its host QP (a doorbell index is reused by later QPs).
    pub host_qp: QpHandle,
    /// The host consumer index when last looked at.
    pub last_consumer: u32,
    /// WQEs still to be consumed.
    pub remaining: u32,
}

impl Unconsumed {
    /// Counts down by what the host consumed since it was last looked at (`consumer`, the
    /// masked consumer index, `index_mask` the ring's); true once all are consumed. The host
    /// consumes only what the device forwarded, and the device looks before it forwards more,
    /// so the consumer never laps the count between two looks.
    pub fn consumed_up_to(&mut self, consumer: u32, index_mask: u32) -> bool {
        let advanced = consumer.wrapping_sub(self.last_consumer) & index_mask;
        self.last_consumer = consumer;
        self.remaining = self.remaining.saturating_sub(advanced);
        self.remaining == 0
    }
}

/// A destroyed AH still held on the host, and the WQEs it waits for.
#[derive(Debug)]
pub(super) struct LingeringAh {
    pub host: AhHandle,
    pub waits_for: Vec<Unconsumed>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_follows_the_consumer_across_the_ring_end() {
        let mut waiting = Unconsumed {
            index: 0,
            host_qp: QpHandle(1),
            last_consumer: 14,
            remaining: 3,
        };
        assert!(!waiting.consumed_up_to(14, 15));
        assert!(!waiting.consumed_up_to(15, 15));
        assert_eq!(waiting.remaining, 2);
        // 15 -> 1 across the end of a 16-slot ring: two more.
        assert!(waiting.consumed_up_to(1, 15));
        assert_eq!(waiting.remaining, 0);
    }
}

//! Waiting for the device's interrupt when several threads wait on different queues.
//!
//! The device has one interrupt (INTx; MSI-X stays off) for all queues, and reading the ISR,
//! which deasserts it, also clears it for everybody. So one waiter at a time sits in
//! [`PciFunction::wait_interrupt`](super::PciFunction::wait_interrupt); when it returns, it
//! reads the ISR and advances a generation count that every other waiter sleeps on, and each
//! waiter then looks at its own used ring again. A waiter notes the generation ([`Interrupts::generation`]) before its
//! last look at the ring, so an interrupt consumed by another thread in between still wakes
//! it.

use std::time::{Duration, Instant};

use log::warn;
use parking_lot::{Condvar, Mutex};

use super::virtio::{pci_failure, status, VirtioPci, ISR_CONFIG};
use crate::transport::TransportError;

/// Longest single call of `wait_interrupt`, so that a waiter without deadline still wakes
/// now and then (to notice, e.g., that the function stopped delivering interrupts).
const MAX_INTERRUPT_WAIT: Duration = Duration::from_secs(1);

#[derive(Default)]
struct State {
    /// Advanced every time an interrupt may have come.
    generation: u64,
    /// A thread is inside `wait_interrupt`.
    waiting: bool,
    /// Why the device can no longer be used, once known.
    failure: Option<String>,
}

/// The interrupt of one device, shared by every thread waiting on one of its queues.
#[derive(Default)]
pub(crate) struct Interrupts {
    state: Mutex<State>,
    changed: Condvar,
}

impl Interrupts {
    /// The current generation: [`Interrupts::wait`] returns as soon as it differs.
    pub(crate) fn generation(&self) -> u64 {
        self.state.lock().generation
    }

    /// Marks the device unusable: every wait fails with `reason` from now on.
    pub(crate) fn fail(&self, reason: String) {
        self.state.lock().failure.get_or_insert(reason);
        self.changed.notify_all();
    }

    /// Sleeps until an interrupt may have come after generation `seen`, or `deadline`
    /// passes (false). Fails once the device needs a reset.
    pub(crate) fn wait(
        &self,
        device: &VirtioPci,
        seen: u64,
        deadline: Option<Instant>,
    ) -> Result<bool, TransportError> {
        let mut state = self.state.lock();
        loop {
            if let Some(reason) = &state.failure {
                return Err(TransportError::DeviceFailure(reason.clone()));
            }
            if state.generation != seen {
                return Ok(true);
            }
            let left = match deadline {
                Some(deadline) => deadline.saturating_duration_since(Instant::now()),
                None => MAX_INTERRUPT_WAIT,
            };
            if left.is_zero() {
                return Ok(false);
            }
            if state.waiting {
                self.changed.wait_for(&mut state, left);
                continue;
            }
            state.waiting = true;
            drop(state);
            let outcome = self.wait_once(device, left.min(MAX_INTERRUPT_WAIT));
            state = self.state.lock();
            state.waiting = false;
            match outcome {
                Ok(true) => state.generation = state.generation.wrapping_add(1),
                Ok(false) => {}
                Err(reason) => {
                    state.failure.get_or_insert(reason);
                }
            }
            // Wake the others: to look at their rings, or to take over the waiting.
            self.changed.notify_all();
        }
    }

    /// One wait for the function's interrupt, then the ISR read that acknowledges it.
    /// Ok(true) if an interrupt may have come; Err with the reason the device is unusable.
    fn wait_once(&self, device: &VirtioPci, timeout: Duration) -> Result<bool, String> {
        let fired = device
            .function()
            .wait_interrupt(timeout)
            .map_err(pci_failure("waiting for the device's interrupt"))
            .map_err(|e| e.to_string())?;
        if !fired {
            return Ok(false);
        }
        let isr = device.read_isr().map_err(|e| e.to_string())?;
        if isr & ISR_CONFIG != 0 {
            let device_status = device.status().map_err(|e| e.to_string())?;
            if device_status & status::DEVICE_NEEDS_RESET != 0 {
                warn!("the vrdma device needs a reset");
                return Err("the device needs a reset (DEVICE_NEEDS_RESET)".into());
            }
        }
        Ok(true)
    }
}

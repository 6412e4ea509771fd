//! [`PciTransport`]: the vrdma device behind a [`PciFunction`], driven as a modern virtio-pci
//! device.
//!
//! Setup (VIRTIO 1.2, 3.1.1): reset, ACKNOWLEDGE and DRIVER, feature negotiation with
//! FEATURES_OK, the configuration checked (magic, major version) before the driver commits,
//! the three queues without MSI-X vectors, eventq buffers, DRIVER_OK. Dropping the
//! transport resets the device: the backend then discards everything it held for this driver
//! (spec, 11.1), and the rings can be freed. A `fork()` child's copy of the transport neither
//! drives nor resets the parent's device.

use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{debug, warn};
use vrdma_spec::config::CONFIG_SIZE;
use vrdma_spec::control::{ControlRequest, ControlResponse, Opcode, HEADER_SIZE};
use vrdma_spec::features::{
    DEVICE_SPECIFIC_MASK, VIRTIO_F_RING_EVENT_IDX, VRDMA_F_ALL, VRDMA_F_HOST_KICK,
};
use vrdma_spec::queue::{CONTROLQ, DOORBELLQ, EVENTQ, NUM_QUEUES};
use vrdma_spec::DeviceConfig;

use super::function::PciFunction;
use super::interrupt::Interrupts;
use super::virtio::{status, NotifyAddress, VirtioPci};
use crate::dma::DmaMemory;
use crate::transport::queues::{
    AdaptiveSpin, ControlChannel, EventChannel, QueueSignal, SignalledQueue,
};
use crate::transport::{
    HostKick, OwnerProcess, SharedMemory, Transport, TransportError, DEFAULT_COMMAND_SPIN,
};
use crate::virtq::SplitQueue;

/// Settings of a [`PciTransport`].
#[derive(Clone, Debug)]
pub struct PciOptions {
    /// Largest number of entries of each virtqueue (a power of two; the device's maximum
    /// may be smaller).
    pub queue_size: u16,
    /// How long a control command may take before the transport gives up.
    pub command_timeout: Duration,
    /// At most how long a control round trip polls for its answer before it waits for the
    /// interrupt (it adapts to the typical round trip below that; zero: never polls).
    pub command_spin: Duration,
    /// Device-specific feature bits (0..=23) the driver accepts if offered.
    pub device_features: u64,
    /// Event buffers kept posted on the event queue.
    pub event_buffers: u16,
    /// Size of each event buffer.
    pub event_buffer_size: u32,
}

impl Default for PciOptions {
    fn default() -> Self {
        PciOptions {
            queue_size: 256,
            command_timeout: Duration::from_secs(30),
            command_spin: DEFAULT_COMMAND_SPIN,
            // Every defined bit this library implements over PCI: the host kick needs the
            // host's verbs context, which only a front-end holds, never a guest.
            device_features: VRDMA_F_ALL & !VRDMA_F_HOST_KICK,
            event_buffers: 64,
            // A CM event carried whole (VRDMA_F_CM_EVENT_INLINE) takes 400.
            event_buffer_size: 512,
        }
    }
}

/// Notifies one queue with a register write and waits for the device's interrupt.
struct PciSignal {
    device: Arc<VirtioPci>,
    interrupts: Arc<Interrupts>,
    notify: NotifyAddress,
}

impl QueueSignal for PciSignal {
    type Ticket = u64;

    fn notify(&self) -> Result<(), TransportError> {
        self.device.notify(&self.notify)
    }

    fn arm(&self) -> u64 {
        self.interrupts.generation()
    }

    fn wait(&self, seen: u64, deadline: Option<Instant>) -> Result<bool, TransportError> {
        self.interrupts.wait(&self.device, seen, deadline)
    }
}

/// A vrdma device driven through its PCI function.
pub struct PciTransport {
    device: Arc<VirtioPci>,
    interrupts: Arc<Interrupts>,
    control: ControlChannel<PciSignal>,
    events: EventChannel<PciSignal>,
    doorbell: NotifyAddress,
    /// The doorbell queue's rings: the driver never posts on them, but the device was given
    /// their addresses and reads and writes them (avail index, `avail_event`) until the
    /// reset in `drop`, so their memory must not be reused before.
    _doorbell_rings: SplitQueue,
    dma: Arc<dyn DmaMemory>,
    shared_memory: SharedMemory,
    config: Vec<u8>,
    device_features: u64,
    /// A `fork()` child's copy neither drives nor resets the parent's device.
    owner: OwnerProcess,
}

impl PciTransport {
    /// Initialises the vrdma device behind `function`. On failure the device is left
    /// FAILED (or reset, if it had been started).
    pub fn open(
        function: Arc<dyn PciFunction>,
        options: PciOptions,
    ) -> Result<Self, TransportError> {
        if options.queue_size == 0 || !options.queue_size.is_power_of_two() {
            return Err(TransportError::InvalidRequest("queue size"));
        }
        let device = Arc::new(VirtioPci::probe(function)?);
        device.reset()?;
        device.add_status(status::ACKNOWLEDGE)?;
        device.add_status(status::DRIVER)?;
        let set_up = Self::set_up(&device, &options);
        if set_up.is_err() {
            // Best effort: the device may be what failed.
            if let Err(e) = device.add_status(status::FAILED) {
                warn!("cannot mark the device FAILED: {e}");
            }
        }
        let mut transport = set_up?;
        // On failure, dropping `transport` resets the device.
        transport.start()?;
        Ok(transport)
    }

    /// Everything up to (not including) DRIVER_OK.
    fn set_up(device: &Arc<VirtioPci>, options: &PciOptions) -> Result<Self, TransportError> {
        let features = device.negotiate(options.device_features)?;
        let event_idx = features & VIRTIO_F_RING_EVENT_IDX != 0;
        // Refuse a device of another major version before committing to it (spec, 3).
        let config = device.read_config(CONFIG_SIZE)?;
        DeviceConfig::decode(&config)
            .map_err(|e| TransportError::DeviceFailure(format!("configuration: {e}")))?;
        let num_queues = device.num_queues()?;
        if num_queues < NUM_QUEUES {
            return Err(TransportError::DeviceFailure(format!(
                "the device has {num_queues} virtqueues, {NUM_QUEUES} needed"
            )));
        }
        device.disable_config_vector()?;
        let dma = device.function().dma();
        let interrupts = Arc::new(Interrupts::default());
        let queue = |index| -> Result<SignalledQueue<PciSignal>, TransportError> {
            let (queue, notify) =
                device.set_up_queue(dma.as_ref(), index, options.queue_size, event_idx)?;
            Ok(SignalledQueue {
                queue,
                signal: PciSignal {
                    device: device.clone(),
                    interrupts: interrupts.clone(),
                    notify,
                },
            })
        };
        let control = queue(CONTROLQ)?;
        let events = queue(EVENTQ)?;
        let doorbell_queue = queue(DOORBELLQ)?;
        let (doorbell, doorbell_rings) = (doorbell_queue.signal.notify, doorbell_queue.queue);
        let control = ControlChannel::new(
            dma.as_ref(),
            control,
            options.command_timeout,
            AdaptiveSpin::new(options.command_spin),
        )?;
        let events = EventChannel::start(
            dma.as_ref(),
            events,
            options.event_buffers,
            options.event_buffer_size,
        )?;
        let shared_memory = device.shared_memory()?;
        Ok(PciTransport {
            device: device.clone(),
            interrupts,
            control,
            events,
            doorbell,
            _doorbell_rings: doorbell_rings,
            dma,
            shared_memory,
            config,
            device_features: features & DEVICE_SPECIFIC_MASK,
            owner: OwnerProcess::current(),
        })
    }

    /// DRIVER_OK, then the buffers posted on the event queue are announced.
    fn start(&mut self) -> Result<(), TransportError> {
        self.device.add_status(status::DRIVER_OK)?;
        let device_status = self.device.status()?;
        if device_status & (status::DRIVER_OK | status::DEVICE_NEEDS_RESET) != status::DRIVER_OK {
            return Err(TransportError::DeviceFailure(format!(
                "the device did not start (status {device_status:#x})"
            )));
        }
        // The device now knows the negotiated features: read what it reports with them.
        self.config = self.device.read_config(CONFIG_SIZE)?;
        self.events.notify()?;
        debug!(
            "vrdma PCI device started: features {:#x}, shared memory {:#x} bytes",
            self.device_features,
            self.shared_memory.len()
        );
        Ok(())
    }

    /// The virtio-pci device (for tests and diagnostics).
    pub fn device(&self) -> &VirtioPci {
        &self.device
    }

    /// Resets the device after asking it to discard every object (DISCARD_STATE), so that
    /// the host objects and the shared-memory mappings are gone before the reset rather
    /// than at it (spec §7.4, §11.1). Waiters fail; the transport is unusable afterwards.
    pub fn reset(&self) -> Result<(), TransportError> {
        self.owner.check()?;
        self.discard_state();
        self.interrupts.fail("the device was reset".into());
        self.device.reset()
    }

    /// Best effort: a device that cannot answer is reset all the same.
    fn discard_state(&self) {
        let request = ControlRequest::DiscardState.to_vec();
        let mut response = [0u8; HEADER_SIZE];
        let outcome = self
            .round_trip(&request, &mut response)
            .map_err(|e| e.to_string())
            .and_then(|len| {
                ControlResponse::decode(Opcode::DiscardState, &response[..len])
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.into_result().map_err(|e| e.to_string()))
            });
        if let Err(e) = outcome {
            debug!("DISCARD_STATE before the reset failed: {e}");
        }
    }
}

impl Transport for PciTransport {
    fn device_features(&self) -> u64 {
        self.device_features
    }

    fn device_config(&self) -> &[u8] {
        &self.config
    }

    fn round_trip(&self, request: &[u8], response: &mut [u8]) -> Result<usize, TransportError> {
        self.owner.check()?;
        self.control
            .round_trip(self.dma.as_ref(), request, response)
    }

    fn round_trip_batch(
        &self,
        commands: &mut [(&[u8], &mut [u8])],
    ) -> Result<Vec<usize>, TransportError> {
        self.owner.check()?;
        self.control.round_trip_batch(self.dma.as_ref(), commands)
    }

    fn notify_doorbell(&self) -> Result<(), TransportError> {
        self.device.notify(&self.doorbell)
    }

    fn next_event(
        &self,
        out: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<Option<usize>, TransportError> {
        self.owner.check()?;
        self.events.next_event(out, timeout)
    }

    fn event_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    fn shared_memory(&self) -> SharedMemory {
        self.shared_memory.clone()
    }

    fn dma(&self) -> &dyn DmaMemory {
        self.dma.as_ref()
    }

    fn host_kick(&self, _qp_handle: u32) -> Option<HostKick> {
        // A guest never holds the host's verbs context.
        None
    }
}

impl Drop for PciTransport {
    fn drop(&mut self) {
        if !self.owner.is_current() {
            // A fork() child's copy: the device, and the interrupt thread, are the parent's.
            return;
        }
        self.discard_state();
        self.interrupts
            .fail("the transport is shutting down".into());
        if let Err(e) = self.device.reset() {
            warn!("cannot reset the vrdma PCI device: {e}");
        }
    }
}

//! How the library reaches a vrdma device.
//!
//! A [`Transport`] offers what the verbs layer needs of the device and nothing about how it
//! is reached: synchronous control commands on the control queue, the send doorbell, events,
//! the shared-memory region where the device maps queue buffers, and memory the device can
//! reach by DMA. Implementations: [`process`] (the library is the vhost-user frontend itself),
//! [`pci`] (a userspace virtio-pci driver in a VM) and [`agent`] (an application process
//! served by the guest agent, `vrdma-guestd`, which alone drives the device).

use std::fmt;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

pub use host_kick::HostKick;

/// At most how long a control round trip polls for its answer by default, before it sleeps
/// (it polls about as long as its typical round trip, up to this): zero, never. Measured on a
/// 2-vCPU TCG machine (docs/benchmarks.md), polling up to 500 µs halves some commands
/// (MODIFY_QP to RTS, CREATE_CQ) and slows others (CREATE_QP, batched set-up), whose answers
/// need other threads of the same few CPUs; with cores to spare, `VRDMA_COMMAND_SPIN_US`
/// (the drop-in) or the transports' `command_spin` turns it on.
pub const DEFAULT_COMMAND_SPIN: Duration = Duration::ZERO;

use crate::dma::{DmaError, DmaMemory};
use crate::virtq::VirtqError;

pub mod agent;
mod host_kick;
pub mod pci;
pub mod process;
mod queues;
pub mod shmem_window;

/// Errors of a transport.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// vhost-user negotiation or messaging failed.
    #[error("{}", describe_vhost(.0))]
    VhostUser(#[source] vhost::Error),
    /// The device lacks something the driver requires.
    #[error("the device does not offer {0}")]
    Unsupported(&'static str),
    /// Memory the device reaches could not be allocated or translated.
    #[error(transparent)]
    Dma(#[from] DmaError),
    /// A virtqueue operation failed.
    #[error(transparent)]
    Virtqueue(#[from] VirtqError),
    /// The device did not answer in time. The transport is unusable afterwards.
    #[error("the device did not answer within {0:?}")]
    Timeout(Duration),
    /// The device went away (the backend closed the connection).
    #[error("the device disconnected")]
    Disconnected,
    /// The transport was opened by the parent of this `fork()` child, whose device it is.
    #[error("the device belongs to the process that opened it, not to this fork() child")]
    ForkedChild,
    /// A request that cannot be sent (empty, or larger than the transport allows).
    #[error("invalid request: {0}")]
    InvalidRequest(&'static str),
    /// The device broke the virtio protocol, or an earlier failure left the transport
    /// unusable.
    #[error("device failure: {0}")]
    DeviceFailure(String),
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// A vhost error under the "vhost-user" heading it has only for protocol errors.
fn describe_vhost(error: &vhost::Error) -> String {
    match error {
        vhost::Error::VhostUserProtocol(_) => error.to_string(),
        other => format!("vhost-user: {other}"),
    }
}

impl TransportError {
    pub(crate) fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        move |source| TransportError::Io { what, source }
    }
}

/// The process that opened a transport. After `fork()` the child holds a copy of every
/// transport, but the device (its queues, the backend's state, the PCI function) is still the
/// parent's: the copy refuses to drive it ([`TransportError::ForkedChild`]) and its drop leaves
/// the device alone.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OwnerProcess(libc::pid_t);

impl OwnerProcess {
    /// The calling process.
    pub(crate) fn current() -> Self {
        // SAFETY: getpid has no preconditions.
        OwnerProcess(unsafe { libc::getpid() })
    }

    /// True in the process that opened the transport, false in a `fork()` child of it.
    pub(crate) fn is_current(&self) -> bool {
        // SAFETY: getpid has no preconditions.
        let current = unsafe { libc::getpid() };
        current == self.0
    }

    /// Fails in a `fork()` child.
    pub(crate) fn check(&self) -> Result<(), TransportError> {
        if self.is_current() {
            Ok(())
        } else {
            Err(TransportError::ForkedChild)
        }
    }
}

/// Access to a shared-memory region this process cannot map, one bus access at a time.
///
/// Used where the region is reached through something other than the MMU, e.g. QEMU's qtest
/// protocol in tests. Offsets are relative to the region start; callers keep accesses inside
/// the region and size-aligned. Like a PCI read that ends in a master abort, a read that fails
/// (the device or the channel to it is gone) returns all-ones bytes and a failed write is
/// dropped; implementations log the first failure.
pub trait RegionAccess: Send + Sync {
    /// Reads `buf.len()` bytes at `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]);

    /// Writes `data` at `offset`. Reaches the region before any later access does.
    fn write(&self, offset: u64, data: &[u8]);

    /// One 32-bit little-endian read at `offset` (4-byte aligned) that is ordered before every
    /// later access (Acquire).
    fn load_u32(&self, offset: u64) -> u32;

    /// One 32-bit little-endian write at `offset` (4-byte aligned) that is ordered after every
    /// earlier access (Release).
    fn store_u32(&self, offset: u64, value: u32);
}

/// VIRTIO shared-memory region 0 as this process reaches it.
///
/// Valid while the transport that returned it lives. Either mapped (pages the device has not
/// mapped are inaccessible: touching them faults) or reached through a [`RegionAccess`].
#[derive(Clone)]
pub struct SharedMemory {
    base: Option<NonNull<u8>>,
    access: Option<Arc<dyn RegionAccess>>,
    len: usize,
}

// SAFETY: a plain address range (dereferencing it needs `unsafe` and the caller's own
// synchronisation, from whichever thread) or a `RegionAccess`, which is Send + Sync.
unsafe impl Send for SharedMemory {}
// SAFETY: as for Send; the struct itself is immutable.
unsafe impl Sync for SharedMemory {}

impl fmt::Debug for SharedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedMemory")
            .field("base", &self.base)
            .field("accessed", &self.access.is_some())
            .field("len", &self.len)
            .finish()
    }
}

impl SharedMemory {
    /// A region of `len` bytes mapped at `base` (`None` with 0 for a device without one).
    pub fn new(base: Option<NonNull<u8>>, len: usize) -> Self {
        SharedMemory {
            base,
            access: None,
            len,
        }
    }

    /// A region of `len` bytes reached through `access`.
    pub fn accessed(access: Arc<dyn RegionAccess>, len: usize) -> Self {
        SharedMemory {
            base: None,
            access: Some(access),
            len,
        }
    }

    /// First byte of the region if it is mapped in this process.
    pub fn base(&self) -> Option<NonNull<u8>> {
        self.base
    }

    /// The region's accessor if it is not mapped.
    pub fn access(&self) -> Option<&Arc<dyn RegionAccess>> {
        self.access.as_ref()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the device has no shared-memory region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `[offset, offset + len)` lies inside the region.
    pub fn contains(&self, offset: usize, len: usize) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len)
    }

    /// Address of `len` bytes at `offset` in a mapped region, if they lie inside it.
    pub fn range(&self, offset: usize, len: usize) -> Option<NonNull<u8>> {
        let base = self.base?;
        if !self.contains(offset, len) {
            return None;
        }
        // SAFETY: `offset <= len` of the mapped region, so the result stays inside it.
        Some(unsafe { base.add(offset) })
    }
}

/// A connection to one vrdma device.
pub trait Transport: Send + Sync {
    /// Device-specific feature bits (0..=23) both sides agreed on.
    fn device_features(&self) -> u64;

    /// The device configuration space, read when the transport started.
    fn device_config(&self) -> &[u8];

    /// One control round trip: `request` goes to the device, its answer lands in `response`,
    /// and the answer's length (the used length) is returned. Blocks until the device
    /// answers; callers on several threads are served one at a time.
    fn round_trip(&self, request: &[u8], response: &mut [u8]) -> Result<usize, TransportError>;

    /// Several control round trips, in order, each as [`Transport::round_trip`] would, and
    /// returns their used lengths. A transport that can publishes them together and notifies
    /// the device once, so that a batch costs about one round trip; the default executes them
    /// one by one. The commands must not depend on each other's answers.
    fn round_trip_batch(
        &self,
        commands: &mut [(&[u8], &mut [u8])],
    ) -> Result<Vec<usize>, TransportError> {
        commands
            .iter_mut()
            .map(|(request, response)| self.round_trip(request, response))
            .collect()
    }

    /// Notifies the doorbell queue (no buffer): the device then looks at the doorbells.
    fn notify_doorbell(&self) -> Result<(), TransportError>;

    /// Whether the device is still there, without waiting: [`TransportError::Disconnected`]
    /// once it went away. The data path never calls into the transport, so a program that
    /// only polls its CQs would otherwise see them stay empty for ever. The default, for a
    /// transport that cannot tell cheaply, says it is.
    fn check_alive(&self) -> Result<(), TransportError> {
        Ok(())
    }

    /// Copies the next event from the event queue into `out` and gives its buffer back to the
    /// device. Waits up to `timeout` (`None`: forever) for one; `Ok(None)` if none came.
    /// Returns the event's length (bytes beyond `out.len()` are cut).
    fn next_event(
        &self,
        out: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<Option<usize>, TransportError>;

    /// A descriptor that polls readable when an event may be pending, for callers that
    /// multiplex it with their own; [`Transport::next_event`] with a zero timeout then says.
    fn event_fd(&self) -> Option<BorrowedFd<'_>>;

    /// Shared-memory region 0 as mapped in this process.
    fn shared_memory(&self) -> SharedMemory;

    /// The doorbell area, when whoever drives the device registered it already (the guest
    /// agent that shares one device among its processes): its first byte and its length,
    /// mapped while the transport lives. `None` (the default): the context allocates an area
    /// of its own and registers it with SET_DOORBELL_AREA.
    fn registered_doorbell_area(&self) -> Option<(NonNull<u8>, usize)> {
        None
    }

    /// Memory the device can reach.
    fn dma(&self) -> &dyn DmaMemory;

    /// The kick of the QP whose handle in the host verbs context is `qp_handle`, when this
    /// process holds that context's file (`VRDMA_F_HOST_KICK`, spec §5.3). `None`: sends
    /// ring the doorbell.
    fn host_kick(&self, qp_handle: u32) -> Option<HostKick>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vhost_errors_carry_one_vhost_user_heading() {
        let refused = std::io::Error::from(std::io::ErrorKind::NotFound);
        let protocol = TransportError::VhostUser(vhost::Error::VhostUserProtocol(
            vhost::vhost_user::Error::SocketConnect(refused),
        ));
        let text = protocol.to_string();
        assert!(
            text.starts_with("vhost-user: can't connect to peer"),
            "{text}"
        );
        assert_eq!(text.matches("vhost-user").count(), 1, "{text}");
        let other = TransportError::VhostUser(vhost::Error::InvalidQueue);
        assert_eq!(other.to_string(), "vhost-user: invalid virtqueue");
    }
}

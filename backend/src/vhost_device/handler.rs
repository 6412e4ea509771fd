//! The contract between the vhost-user device (the virtqueue plumbing) and the
//! device logic of one guest.
//!
//! One [`DeviceHandler`] serves one guest connection. The plumbing owns the virtqueues and
//! calls the handler with plain bytes: a control request, the bytes of a doorbell, "a watched
//! fd is readable". What the handler may do to the guest in return goes through the
//! [`GuestIo`]: read or write guest RAM, map host memory into the VIRTIO shared-memory
//! region, queue events for the event queue.

use std::fmt;
use std::os::fd::RawFd;

use super::guest_io::GuestIo;

/// Why the plumbing did not pass a control request to [`DeviceHandler::handle_command`], or
/// could not deliver the answer it produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandRejection {
    /// The device-readable part of the chain is longer than
    /// [`DeviceHandler::max_request_size`]; the request was not read.
    RequestTooLarge {
        /// Bytes the driver offered.
        len: usize,
        /// The handler's limit.
        max: usize,
    },
    /// The response the handler produced does not fit the device-writable part of the chain.
    ResponseTooSmall {
        /// Length of the response the handler produced.
        needed: usize,
        /// Bytes the driver made writable.
        capacity: usize,
    },
}

impl fmt::Display for CommandRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommandRejection::RequestTooLarge { len, max } => {
                write!(f, "request of {len} bytes exceeds the limit of {max}")
            }
            CommandRejection::ResponseTooSmall { needed, capacity } => {
                write!(
                    f,
                    "response of {needed} bytes does not fit {capacity} writable bytes"
                )
            }
        }
    }
}

/// The device logic of one guest connection.
///
/// Calls come from two worker threads of the connection (control queue on one; event queue,
/// doorbell queue and watched fds on the other) and from the vhost-user request thread
/// (configuration, memory changes, reset), so implementations synchronise internally.
/// Nothing the guest sends may make an implementation panic.
pub trait DeviceHandler: Send + Sync + 'static {
    /// Device-specific virtio feature bits (0..=23) to offer; other bits are ignored.
    fn device_features(&self) -> u64;

    /// The feature bits the driver acknowledged (all of them, transport bits included).
    fn features_acked(&self, _features: u64) {}

    /// The device configuration space (at most 256 bytes). Read on every GET_CONFIG.
    fn config_space(&self) -> Vec<u8>;

    /// Size of VIRTIO shared-memory region 0 (a multiple of [`SHMEM_PAGE_SIZE`](super::shmem::SHMEM_PAGE_SIZE)); 0 for none.
    fn shmem_size(&self) -> u64;

    /// Largest control request (device-readable bytes of one chain) the handler accepts.
    fn max_request_size(&self) -> usize;

    /// Largest doorbell buffer (device-readable bytes of one doorbell chain) to read.
    fn max_doorbell_size(&self) -> usize {
        4096
    }

    /// Executes one control request and appends its response to `response` (empty on entry).
    ///
    /// `response_capacity` is the number of device-writable bytes of the chain. A handler
    /// should check it *before* doing anything with side effects: a response longer than
    /// that is discarded and replaced by [`DeviceHandler::reject_command`] with
    /// [`CommandRejection::ResponseTooSmall`].
    fn handle_command(
        &self,
        guest_io: &GuestIo,
        request: &[u8],
        response_capacity: usize,
        response: &mut Vec<u8>,
    );

    /// Produces the error response for a request that was not executed or whose answer did
    /// not fit (`response` is empty on entry). If this response does not fit either it is
    /// truncated to the writable length.
    fn reject_command(
        &self,
        guest_io: &GuestIo,
        rejection: CommandRejection,
        response: &mut Vec<u8>,
    );

    /// The doorbell queue was notified. Called once per doorbell chain with its
    /// device-readable bytes (at most [`DeviceHandler::max_doorbell_size`]), or once with an
    /// empty slice when the notification came without any chain (doorbells read from memory).
    fn doorbell(&self, guest_io: &GuestIo, rung: &[u8]);

    /// File descriptors to watch while the connection lives, registered once when the
    /// connection starts. Each must stay open until [`DeviceHandler::reset`] and the drop of
    /// the handler. Watching a changing set is done by listing one epoll fd of the handler's.
    fn watched_fds(&self) -> Vec<RawFd> {
        Vec::new()
    }

    /// Watched fd number `index` (position in [`DeviceHandler::watched_fds`]) is readable.
    /// The handler must consume what made it readable (epoll is level-triggered) and may push
    /// events with [`GuestIo::events`].
    fn fd_ready(&self, _ctx: &GuestIo, _index: usize) {}

    /// `count` events were dropped since the last call because the guest posted no event
    /// buffers. The handler may write one event (at most [`MAX_EVENT_SIZE`](super::event_queue::MAX_EVENT_SIZE) bytes) telling the
    /// guest so into `notice`; it is delivered before all queued events. Must not push events.
    fn events_lost(&self, _count: u64, _notice: &mut Vec<u8>) {}

    /// `event` is about to be written into an event buffer of `capacity` bytes: the bytes to
    /// write instead, if any (the CM event a CM_EVENT notice carries whole). Called with the
    /// event queue's lock held: it must not push events or wait for anything that does.
    fn expand_event(&self, _event: &[u8], _capacity: usize) -> Option<Vec<u8>> {
        None
    }

    /// Guest RAM regions were added or removed: anything that refers to guest RAM
    /// (registered memory windows) must be checked against [`GuestIo::memory`].
    fn memory_changed(&self, _ctx: &GuestIo) {}

    /// The driver reset the device: forget what it negotiated and move to the next
    /// configuration epoch now. Called at once, while the discard of [`DeviceHandler::reset`]
    /// may wait for a running command; by then the next driver may have negotiated and read
    /// the epoch, which that discard must leave alone.
    fn reset_requested(&self) {}

    /// The device was reset or the guest disconnected: drop every host object of this guest.
    /// May be called more than once; a later call with nothing to drop does nothing. It must
    /// not touch the negotiation or the epoch ([`DeviceHandler::reset_requested`]).
    fn reset(&self);

    /// Whether `file`, offered by the front-end as guest memory, is really one of this
    /// device's own mappings (QEMU hands `SHMEM_MAP`ped ranges back as memory regions; see
    /// the daemon's frontend filter). Such regions are kept from the guest memory table.
    fn is_device_mapping(&self, _file: &std::fs::File) -> bool {
        false
    }

    /// The vhost-user protocol features the front-end acknowledged (each
    /// `SET_PROTOCOL_FEATURES`).
    fn frontend_protocol_features(&self, _acked: u64) {}

    /// The connection served an earlier daemon, whose state is gone (spec §11.5): the driver
    /// must learn it (a new epoch past the one in `last_config`, the configuration the
    /// earlier daemon last described, and `DEVICE_FATAL`) and reset the device; until then
    /// its commands fail. Called before any vring is set up again.
    fn resumed(&self, _guest_io: &GuestIo, _last_config: &[u8]) {}
}

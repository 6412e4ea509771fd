//! The contract between the vhost-user plumbing ([`crate::backend`]) and the device logic.
//!
//! One [`DeviceHandler`] serves one guest connection. The plumbing owns the virtqueues and
//! calls the handler with plain bytes: a control request, the bytes of a doorbell, "a watched
//! fd is readable". What the handler may do to the guest in return goes through the
//! [`GuestContext`]: read or write guest RAM, map host memory into the VIRTIO shared-memory
//! region, queue events for the event queue.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::{Mutex, MutexGuard, PoisonError};

use log::warn;
use vhost::vhost_user::message::{VhostUserMMap, VhostUserMMapFlags};
use vhost::vhost_user::{Backend, VhostUserFrontendReqHandler};
use vm_memory::{GuestAddressSpace, GuestMemoryLoadGuard};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Guest RAM as the daemon maps it (no dirty-page tracking: the device is not migratable).
pub type GuestRam = vm_memory::GuestMemoryMmap<()>;
/// Guest RAM that the frontend may replace at any time (SET_MEM_TABLE, ADD/REM_MEM_REG).
pub type GuestRamAtomic = vm_memory::GuestMemoryAtomic<GuestRam>;

/// Page size the shared-memory region is mapped with.
pub const SHMEM_PAGE_SIZE: u64 = 4096;

/// Largest event the event queue carries.
pub const MAX_EVENT_SIZE: usize = 64;

/// Events kept for the guest while it posts no event buffers.
pub const DEFAULT_EVENT_CAPACITY: usize = 4096;

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

/// How an event may be treated when the guest does not post event buffers fast enough.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventClass {
    /// A completion notification. The guest can recover a lost one by polling its CQ, so these
    /// are dropped first (oldest first) when the queue is full.
    Completion,
    /// Anything else (asynchronous errors, port changes, ...). Dropped only when the queue holds
    /// nothing but such events, oldest first.
    Async,
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

    /// Size of VIRTIO shared-memory region 0 (a multiple of [`SHMEM_PAGE_SIZE`]); 0 for none.
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
        ctx: &GuestContext,
        request: &[u8],
        response_capacity: usize,
        response: &mut Vec<u8>,
    );

    /// Produces the error response for a request that was not executed or whose answer did
    /// not fit (`response` is empty on entry). If this response does not fit either it is
    /// truncated to the writable length.
    fn reject_command(
        &self,
        ctx: &GuestContext,
        rejection: CommandRejection,
        response: &mut Vec<u8>,
    );

    /// The doorbell queue was notified. Called once per doorbell chain with its
    /// device-readable bytes (at most [`DeviceHandler::max_doorbell_size`]), or once with an
    /// empty slice when the notification came without any chain (doorbells read from memory).
    fn doorbell(&self, ctx: &GuestContext, rung: &[u8]);

    /// File descriptors to watch while the connection lives, registered once when the
    /// connection starts. Each must stay open until [`DeviceHandler::reset`] and the drop of
    /// the handler. Watching a changing set is done by listing one epoll fd of the handler's.
    fn watched_fds(&self) -> Vec<RawFd> {
        Vec::new()
    }

    /// Watched fd number `index` (position in [`DeviceHandler::watched_fds`]) is readable.
    /// The handler must consume what made it readable (epoll is level-triggered) and may push
    /// events with [`GuestContext::events`].
    fn fd_ready(&self, _ctx: &GuestContext, _index: usize) {}

    /// `count` events were dropped since the last call because the guest posted no event
    /// buffers. The handler may write one event (at most [`MAX_EVENT_SIZE`] bytes) telling the
    /// guest so into `notice`; it is delivered before all queued events. Must not push events.
    fn events_lost(&self, _count: u64, _notice: &mut Vec<u8>) {}

    /// Guest RAM regions were added or removed: anything that refers to guest RAM
    /// (registered memory windows) must be checked against [`GuestContext::memory`].
    fn memory_changed(&self, _ctx: &GuestContext) {}

    /// The device was reset or the guest disconnected: drop every host object of this guest.
    /// May be called more than once; a later call with nothing to drop does nothing.
    fn reset(&self);

    /// Whether `file`, offered by the front-end as guest memory, is really one of this
    /// device's own mappings (QEMU hands `SHMEM_MAP`ped ranges back as memory regions; see
    /// [`crate::frontend_filter`]). Such regions are kept from the guest memory table.
    fn is_device_mapping(&self, _file: &std::fs::File) -> bool {
        false
    }
}

/// What a handler can reach of its guest.
pub struct GuestContext {
    memory: GuestRamAtomic,
    shmem: ShmemMapper,
    events: EventQueue,
}

impl GuestContext {
    pub(crate) fn new(
        memory: GuestRamAtomic,
        shmem_size: u64,
        event_capacity: usize,
    ) -> io::Result<Self> {
        Ok(GuestContext {
            memory,
            shmem: ShmemMapper::new(shmem_size),
            events: EventQueue::new(event_capacity)?,
        })
    }

    /// A snapshot of guest RAM. Translating a guest-physical address gives the region's
    /// backing file and offset (`GuestMemoryBackend::find_region`, `file_offset`) and the host
    /// address where this daemon mapped it. Take a new snapshot after
    /// [`DeviceHandler::memory_changed`].
    pub fn memory(&self) -> GuestMemoryLoadGuard<GuestRam> {
        self.memory.memory()
    }

    /// Maps host memory into the guest's VIRTIO shared-memory region 0.
    pub fn shmem(&self) -> &ShmemMapper {
        &self.shmem
    }

    /// Queues events for the guest's event queue.
    pub fn events(&self) -> &EventQueue {
        &self.events
    }
}

/// Errors of [`ShmemMapper`].
#[derive(Debug, thiserror::Error)]
pub enum ShmemError {
    /// The frontend gave no backend request channel (SET_BACKEND_REQ_FD) yet.
    #[error("the frontend opened no backend request channel")]
    NoChannel,
    /// Offset or length not page aligned, zero, or beyond the region.
    #[error("shared-memory range {offset:#x}+{len:#x} is invalid for a region of {size:#x} bytes")]
    BadRange {
        /// Offset in the region.
        offset: u64,
        /// Length.
        len: u64,
        /// Region size.
        size: u64,
    },
    /// The file offset is not page aligned.
    #[error("file offset {0:#x} is not page aligned")]
    BadFileOffset(u64),
    /// The frontend refused or failed the request, or did not negotiate
    /// VHOST_USER_PROTOCOL_F_SHMEM.
    #[error("the frontend did not map/unmap: {0}")]
    Frontend(#[source] io::Error),
}

/// Sends VHOST_USER_BACKEND_SHMEM_MAP/UNMAP for region 0 over the backend request channel.
pub struct ShmemMapper {
    size: u64,
    channel: Mutex<Option<Backend>>,
}

impl ShmemMapper {
    fn new(size: u64) -> Self {
        ShmemMapper {
            size,
            channel: Mutex::new(None),
        }
    }

    /// Size of region 0.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// True once the frontend gave a backend request channel.
    pub fn has_channel(&self) -> bool {
        lock(&self.channel).is_some()
    }

    pub(crate) fn set_channel(&self, backend: Backend) {
        *lock(&self.channel) = Some(backend);
    }

    /// Maps `len` bytes of `fd` from `fd_offset` at `shm_offset` in region 0. The frontend
    /// mmaps the fd itself; the guest then reaches the memory without exits.
    pub fn map(
        &self,
        fd: BorrowedFd<'_>,
        fd_offset: u64,
        shm_offset: u64,
        len: u64,
        writable: bool,
    ) -> Result<(), ShmemError> {
        self.check_range(shm_offset, len)?;
        if !fd_offset.is_multiple_of(SHMEM_PAGE_SIZE) || fd_offset.checked_add(len).is_none() {
            return Err(ShmemError::BadFileOffset(fd_offset));
        }
        let flags = if writable {
            VhostUserMMapFlags::WRITABLE
        } else {
            VhostUserMMapFlags::default()
        };
        let request = VhostUserMMap {
            shmid: 0,
            fd_offset,
            shm_offset,
            len,
            flags: flags.bits(),
            ..Default::default()
        };
        let channel = self.channel()?;
        channel
            .shmem_map(&request, &fd.as_raw_fd())
            .map(|_| ())
            .map_err(ShmemError::Frontend)
    }

    /// Replaces `len` bytes at `shm_offset` of region 0 with an empty (inaccessible) range.
    pub fn unmap(&self, shm_offset: u64, len: u64) -> Result<(), ShmemError> {
        self.check_range(shm_offset, len)?;
        let request = VhostUserMMap {
            shmid: 0,
            shm_offset,
            len,
            ..Default::default()
        };
        let channel = self.channel()?;
        channel
            .shmem_unmap(&request)
            .map(|_| ())
            .map_err(ShmemError::Frontend)
    }

    fn channel(&self) -> Result<Backend, ShmemError> {
        // Clone the channel handle so that no lock of ours is held while the frontend answers.
        lock(&self.channel).clone().ok_or(ShmemError::NoChannel)
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), ShmemError> {
        let aligned = offset.is_multiple_of(SHMEM_PAGE_SIZE) && len.is_multiple_of(SHMEM_PAGE_SIZE);
        let inside = offset.checked_add(len).is_some_and(|end| end <= self.size);
        if len == 0 || !aligned || !inside {
            return Err(ShmemError::BadRange {
                offset,
                len,
                size: self.size,
            });
        }
        Ok(())
    }
}

/// Errors of [`EventQueue::push`].
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// The event is empty or larger than [`MAX_EVENT_SIZE`].
    #[error("an event must be 1..={MAX_EVENT_SIZE} bytes, not {0}")]
    BadSize(usize),
    /// Waking the event worker failed.
    #[error("cannot wake the event worker: {0}")]
    Wake(#[source] io::Error),
}

#[derive(Clone, Copy)]
struct QueuedEvent {
    class: EventClass,
    len: u8,
    bytes: [u8; MAX_EVENT_SIZE],
}

impl QueuedEvent {
    fn new(bytes: &[u8], class: EventClass) -> Self {
        let mut event = QueuedEvent {
            class,
            len: bytes.len() as u8,
            bytes: [0; MAX_EVENT_SIZE],
        };
        event.bytes[..bytes.len()].copy_from_slice(bytes);
        event
    }

    fn bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

struct PendingEvents {
    queue: VecDeque<QueuedEvent>,
    lost: u64,
}

/// What one attempt to hand an event to the guest did.
pub(crate) enum Placement {
    /// The event went into a buffer.
    Delivered,
    /// A buffer was used up without taking the event (too small, bad address); try the next.
    BufferWasted,
    /// No buffer is available.
    NoBuffer,
}

/// Events waiting for guest buffers on the event queue: bounded, in order.
///
/// Overflow policy: when full, the oldest [`EventClass::Completion`] event is dropped; if there
/// is none, the oldest event. Dropped events are counted and reported through
/// [`DeviceHandler::events_lost`] before the next delivery.
pub struct EventQueue {
    pending: Mutex<PendingEvents>,
    capacity: usize,
    wake: EventFd,
}

impl EventQueue {
    fn new(capacity: usize) -> io::Result<Self> {
        Ok(EventQueue {
            pending: Mutex::new(PendingEvents {
                queue: VecDeque::with_capacity(capacity.min(256)),
                lost: 0,
            }),
            capacity: capacity.max(1),
            wake: EventFd::new(EFD_NONBLOCK)?,
        })
    }

    /// Queues one event (1..=[`MAX_EVENT_SIZE`] bytes) and wakes the event worker.
    pub fn push(&self, event: &[u8], class: EventClass) -> Result<(), EventError> {
        if event.is_empty() || event.len() > MAX_EVENT_SIZE {
            return Err(EventError::BadSize(event.len()));
        }
        {
            let mut pending = lock(&self.pending);
            if pending.queue.len() >= self.capacity {
                let victim = pending
                    .queue
                    .iter()
                    .position(|e| e.class == EventClass::Completion);
                match (victim, class) {
                    (Some(index), _) => {
                        pending.queue.remove(index);
                    }
                    // Nothing but asynchronous events queued: a new completion is the least
                    // valuable event.
                    (None, EventClass::Completion) => {
                        pending.lost += 1;
                        return Ok(());
                    }
                    (None, EventClass::Async) => {
                        pending.queue.pop_front();
                    }
                }
                pending.lost += 1;
            }
            pending.queue.push_back(QueuedEvent::new(event, class));
        }
        self.wake.write(1).map_err(EventError::Wake)
    }

    /// Number of events waiting for a buffer.
    pub fn len(&self) -> usize {
        lock(&self.pending).queue.len()
    }

    /// True if no event waits for a buffer.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn wake_fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    pub(crate) fn consume_wake(&self) {
        // EAGAIN only means that nobody pushed since the last read.
        let _ = self.wake.read();
    }

    pub(crate) fn clear(&self) {
        let mut pending = lock(&self.pending);
        pending.queue.clear();
        pending.lost = 0;
    }

    /// Moves a pending loss count into a notice event at the head of the queue.
    pub(crate) fn announce_losses(&self, handler: &dyn DeviceHandler) {
        let lost = std::mem::take(&mut lock(&self.pending).lost);
        if lost == 0 {
            return;
        }
        let mut notice = Vec::new();
        handler.events_lost(lost, &mut notice);
        if notice.is_empty() {
            return;
        }
        if notice.len() > MAX_EVENT_SIZE {
            warn!(
                "lost-events notice of {} bytes exceeds {MAX_EVENT_SIZE}; not sent",
                notice.len()
            );
            return;
        }
        lock(&self.pending)
            .queue
            .push_front(QueuedEvent::new(&notice, EventClass::Async));
    }

    /// Offers queued events, oldest first, to `place` until it runs out of buffers.
    /// Returns true if any buffer was used.
    pub(crate) fn deliver(&self, mut place: impl FnMut(&[u8]) -> Placement) -> bool {
        let mut pending = lock(&self.pending);
        let mut used_buffers = false;
        while let Some(event) = pending.queue.front().copied() {
            match place(event.bytes()) {
                Placement::Delivered => {
                    pending.queue.pop_front();
                    used_buffers = true;
                }
                Placement::BufferWasted => used_buffers = true,
                Placement::NoBuffer => break,
            }
        }
        used_buffers
    }
}

/// Locks `mutex`, continuing with the data of a thread that panicked while holding it: every
/// structure guarded here stays consistent between statements.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(queue: &EventQueue) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        queue.deliver(|bytes| {
            out.push(bytes.to_vec());
            Placement::Delivered
        });
        out
    }

    #[test]
    fn overflow_drops_oldest_completion_first() {
        let queue = EventQueue::new(3).unwrap();
        queue.push(b"a1", EventClass::Async).unwrap();
        queue.push(b"c1", EventClass::Completion).unwrap();
        queue.push(b"c2", EventClass::Completion).unwrap();
        queue.push(b"a2", EventClass::Async).unwrap();
        assert_eq!(
            drain(&queue),
            vec![b"a1".to_vec(), b"c2".to_vec(), b"a2".to_vec()]
        );
        assert_eq!(lock(&queue.pending).lost, 1);
    }

    #[test]
    fn overflow_with_only_async_events() {
        let queue = EventQueue::new(2).unwrap();
        queue.push(b"a1", EventClass::Async).unwrap();
        queue.push(b"a2", EventClass::Async).unwrap();
        queue.push(b"c1", EventClass::Completion).unwrap();
        queue.push(b"a3", EventClass::Async).unwrap();
        assert_eq!(drain(&queue), vec![b"a2".to_vec(), b"a3".to_vec()]);
        assert_eq!(lock(&queue.pending).lost, 2);
    }

    #[test]
    fn event_size_is_checked() {
        let queue = EventQueue::new(2).unwrap();
        assert!(matches!(
            queue.push(&[], EventClass::Async),
            Err(EventError::BadSize(0))
        ));
        assert!(matches!(
            queue.push(&[0; MAX_EVENT_SIZE + 1], EventClass::Async),
            Err(EventError::BadSize(_))
        ));
        queue.push(&[7; MAX_EVENT_SIZE], EventClass::Async).unwrap();
        assert_eq!(queue.len(), 1);
    }

    #[test]
    fn delivery_stops_without_buffers_and_keeps_events() {
        let queue = EventQueue::new(4).unwrap();
        queue.push(b"e1", EventClass::Completion).unwrap();
        queue.push(b"e2", EventClass::Completion).unwrap();
        let mut budget = 1;
        let used = queue.deliver(|_| {
            if budget == 0 {
                return Placement::NoBuffer;
            }
            budget -= 1;
            Placement::Delivered
        });
        assert!(used);
        assert_eq!(drain(&queue), vec![b"e2".to_vec()]);
    }

    struct LossReporter;

    impl DeviceHandler for LossReporter {
        fn device_features(&self) -> u64 {
            0
        }
        fn config_space(&self) -> Vec<u8> {
            Vec::new()
        }
        fn shmem_size(&self) -> u64 {
            0
        }
        fn max_request_size(&self) -> usize {
            0
        }
        fn handle_command(&self, _: &GuestContext, _: &[u8], _: usize, _: &mut Vec<u8>) {}
        fn reject_command(&self, _: &GuestContext, _: CommandRejection, _: &mut Vec<u8>) {}
        fn doorbell(&self, _: &GuestContext, _: &[u8]) {}
        fn events_lost(&self, count: u64, notice: &mut Vec<u8>) {
            notice.extend_from_slice(b"lost:");
            notice.push(count as u8);
        }
        fn reset(&self) {}
    }

    #[test]
    fn losses_are_announced_before_queued_events() {
        let queue = EventQueue::new(2).unwrap();
        for event in [b"c1", b"c2", b"c3", b"c4"] {
            queue.push(event, EventClass::Completion).unwrap();
        }
        queue.announce_losses(&LossReporter);
        assert_eq!(
            drain(&queue),
            vec![b"lost:\x02".to_vec(), b"c3".to_vec(), b"c4".to_vec()]
        );
        // Reported once.
        queue.announce_losses(&LossReporter);
        assert!(queue.is_empty());
    }

    #[test]
    fn shmem_ranges_are_checked_before_any_channel() {
        let mapper = ShmemMapper::new(4 * SHMEM_PAGE_SIZE);
        assert!(matches!(
            mapper.unmap(SHMEM_PAGE_SIZE, 4 * SHMEM_PAGE_SIZE),
            Err(ShmemError::BadRange { .. })
        ));
        assert!(matches!(
            mapper.unmap(1, SHMEM_PAGE_SIZE),
            Err(ShmemError::BadRange { .. })
        ));
        assert!(matches!(
            mapper.unmap(0, 0),
            Err(ShmemError::BadRange { .. })
        ));
        assert!(matches!(
            mapper.unmap(0, SHMEM_PAGE_SIZE),
            Err(ShmemError::NoChannel)
        ));
    }
}

//! The vhost-user device: the `VhostUserBackend` of one guest connection, the virtqueue
//! plumbing around a [`DeviceHandler`] (the device logic: in the daemon, the per-guest device).
//!
//! Queues: 0 = controlq (request then response buffer per chain), 1 = eventq (device-writable
//! buffers the device fills with one event each), 2 = doorbellq (its notification is the send
//! doorbell). The control queue runs on its own worker thread so that a slow command (a large
//! memory registration) never delays doorbells or events, which share the second worker with
//! the handler's watched fds.
//!
//! Nothing a guest puts on a queue may stop a worker: every malformed chain is returned with
//! a used length of 0 and logged (rate-limited, since a guest can produce them at will).

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use log::{debug, warn};
use parking_lot::Mutex;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserShMemConfig};
use vhost::vhost_user::Backend;
use vhost_user_backend::{VhostUserBackend, VringEpollHandler, VringRwLock, VringT};
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use virtio_queue::{DescriptorChain, QueueOwnedT, Reader, Writer};
use vm_memory::GuestMemoryLoadGuard;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use vrdma_spec::features::DEVICE_SPECIFIC_MASK;
use vrdma_spec::queue::{CONTROLQ, DOORBELLQ, EVENTQ, NUM_QUEUES};

use crate::fault_log::FaultLog;
use crate::memory::guest_ram::{AtomicGuestRam, MappedGuestRam};
use event_queue::{Placement, DEFAULT_EVENT_CAPACITY};
use guest_context::GuestContext;
use handler::{CommandRejection, DeviceHandler};

pub mod event_queue;
pub mod guest_context;
pub mod handler;
pub mod shmem;

/// Largest queue size accepted.
pub const MAX_QUEUE_SIZE: usize = 256;
/// Largest configuration space served.
pub const MAX_CONFIG_SIZE: usize = 256;

/// `VHOST_USER_F_PROTOCOL_FEATURES` (virtio feature bit 30 in vhost-user).
const VHOST_USER_F_PROTOCOL_FEATURES: u64 = 1 << 30;

/// Worker thread serving the control queue.
const CONTROL_WORKER: usize = 0;
/// Worker thread serving the event queue, the doorbell queue and the watched fds.
const FAST_WORKER: usize = 1;
/// Epoll token of the event-queue wake-up fd on [`FAST_WORKER`]. Tokens up to `NUM_QUEUES`
/// are reserved by vhost-user-backend (queues, exit event).
const EVENTS_WAKE_TOKEN: u16 = NUM_QUEUES + 1;
/// Epoll token of the handler's first watched fd on [`FAST_WORKER`].
const FIRST_WATCHED_TOKEN: u16 = NUM_QUEUES + 2;

/// Local vring indices on each worker (vhost-user-backend numbers a worker's vrings from 0).
const CONTROL_LOCAL: u16 = 0;
const EVENT_LOCAL: u16 = 0;
const DOORBELL_LOCAL: u16 = 1;

type Vring = VringRwLock<AtomicGuestRam>;
type MemoryGuard = GuestMemoryLoadGuard<MappedGuestRam>;
type Chain = DescriptorChain<MemoryGuard>;

/// Epoll handler of one worker of a [`VhostUserDevice`] connection.
pub type WorkerEpollHandler<H> = VringEpollHandler<Arc<VhostUserDevice<H>>>;

/// The vhost-user backend of one guest connection.
pub struct VhostUserDevice<H: DeviceHandler> {
    handler: Arc<H>,
    ctx: GuestContext,
    event_idx: AtomicBool,
    command: Mutex<CommandBuffers>,
    doorbell_bytes: Mutex<Vec<u8>>,
    faults: FaultLog,
    /// Consumer ends of the worker exit events, which the daemon leaks (see
    /// [`VhostUserDevice::close_leaked_exit_fds`]).
    exit_consumer_fds: Mutex<Vec<RawFd>>,
    /// The device was stopped or reset while a command may have been running: guest state
    /// is discarded as soon as no command is (spec §11.1).
    discard_pending: AtomicBool,
}

#[derive(Default)]
struct CommandBuffers {
    request: Vec<u8>,
    response: Vec<u8>,
}

impl<H: DeviceHandler> VhostUserDevice<H> {
    /// A backend serving `handler` over guest RAM `memory` (the same `GuestMemoryAtomic`
    /// must be given to `VhostUserDaemon::new`).
    pub fn new(handler: Arc<H>, memory: AtomicGuestRam) -> io::Result<Self> {
        let ctx = GuestContext::new(memory, handler.shmem_size(), DEFAULT_EVENT_CAPACITY)?;
        Ok(VhostUserDevice {
            handler,
            ctx,
            event_idx: AtomicBool::new(false),
            command: Mutex::new(CommandBuffers::default()),
            doorbell_bytes: Mutex::new(Vec::new()),
            faults: FaultLog::default(),
            exit_consumer_fds: Mutex::new(Vec::new()),
            discard_pending: AtomicBool::new(false),
        })
    }

    /// Closes the consumer ends of the worker exit events. vhost-user-backend 0.24's
    /// `VringEpollHandler::new` registers the consumer with `into_raw_fd()` and never closes
    /// it, which leaks two descriptors per guest connection; a daemon serving guests for
    /// months would run out. Call only after the daemon (and so every worker and its epoll) has
    /// been dropped.
    pub fn close_leaked_exit_fds(&self) {
        let fds = std::mem::take(&mut *self.exit_consumer_fds.lock());
        for fd in fds {
            // SAFETY: `fd` is the consumer end created in `exit_event` and handed to the daemon,
            // which gave up ownership with `into_raw_fd()` and closes it nowhere; the daemon is
            // gone, so nothing else refers to this still-open descriptor and it is ours to close
            // exactly once (the list was taken above).
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }

    /// The device logic.
    pub fn handler(&self) -> &Arc<H> {
        &self.handler
    }

    /// What the handler can reach of the guest.
    pub fn context(&self) -> &GuestContext {
        &self.ctx
    }

    /// Registers the event-queue wake-up fd and the handler's watched fds with the daemon's
    /// workers (`VhostUserDaemon::get_epoll_handlers()`). Call once, before serving.
    pub fn attach(&self, workers: &[Arc<WorkerEpollHandler<H>>]) -> io::Result<()> {
        let worker = workers.get(FAST_WORKER).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "the daemon has no event worker",
            )
        })?;
        worker.register_listener(
            self.ctx.events().wake_fd(),
            EventSet::IN,
            u64::from(EVENTS_WAKE_TOKEN),
        )?;
        for (index, fd) in self.handler.watched_fds().into_iter().enumerate() {
            let token = watched_token(index).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "too many watched fds")
            })?;
            worker.register_listener(fd, EventSet::IN, u64::from(token))?;
        }
        Ok(())
    }

    fn event_idx(&self) -> bool {
        self.event_idx.load(Ordering::Relaxed)
    }

    /// Pops, executes and completes control requests until the queue is empty.
    fn serve_controlq(&self, vring: &Vring) {
        self.drain_queue(vring, "controlq", |mem, chain| {
            let used_len = self.execute(mem, chain);
            self.finish_pending_discard();
            used_len
        });
    }

    /// Discards guest state (spec §11.1) now if no command is running, else right after the
    /// running one. Never waits for the command: it may itself be waiting for the front-end
    /// (a SHMEM_MAP reply) while the front-end waits for this stop to be acknowledged.
    fn request_discard(&self) {
        self.discard_pending.store(true, Ordering::Release);
        if let Some(_no_command_runs) = self.command.try_lock() {
            if self.discard_pending.swap(false, Ordering::AcqRel) {
                self.discard_guest_state();
            }
        }
    }

    /// Performs a discard requested while the command that just finished was running.
    fn finish_pending_discard(&self) {
        if self.discard_pending.load(Ordering::Acquire) {
            let _no_command_runs = self.command.lock();
            if self.discard_pending.swap(false, Ordering::AcqRel) {
                self.discard_guest_state();
            }
        }
    }

    fn discard_guest_state(&self) {
        self.ctx.events().clear();
        self.handler.reset();
    }

    /// Hands every doorbell chain to the handler; a notification without chains is a doorbell
    /// too (doorbells read from memory).
    fn serve_doorbellq(&self, vring: &Vring) {
        let mut chains = 0usize;
        self.drain_queue(vring, "doorbellq", |mem, chain| {
            chains += 1;
            self.ring_doorbell(mem, chain);
            0
        });
        if chains == 0 {
            self.handler.doorbell(&self.ctx, &[]);
        }
    }

    /// Pops every available chain of `vring`, lets `serve` produce its used length and
    /// completes it. With EVENT_IDX, notifications stay off while the queue is drained.
    ///
    /// No vring lock is held while `serve` runs: a handler may wait for the frontend (a
    /// SHMEM_MAP reply) while the frontend sends requests that need the vring.
    fn drain_queue(
        &self,
        vring: &Vring,
        name: &str,
        mut serve: impl FnMut(&MemoryGuard, Chain) -> u32,
    ) {
        let mem = self.ctx.memory();
        loop {
            if self.event_idx() {
                if let Err(e) = vring.disable_notification() {
                    self.faults.report(format_args!("{name}: {e}"));
                    return;
                }
            }
            loop {
                let chain = match pop_chain(vring, &mem) {
                    Ok(Some(chain)) => chain,
                    Ok(None) => break,
                    Err(e) => {
                        self.faults.report(format_args!("{name}: {e}"));
                        return;
                    }
                };
                let head = chain.head_index();
                let used_len = serve(&mem, chain);
                self.complete(vring, name, head, used_len);
            }
            if !self.event_idx() {
                return;
            }
            match vring.enable_notification() {
                Ok(true) => continue,
                Ok(false) => return,
                Err(e) => {
                    self.faults.report(format_args!("{name}: {e}"));
                    return;
                }
            }
        }
    }

    /// Puts `head` on the used ring and notifies the driver if it asked for it.
    fn complete(&self, vring: &Vring, name: &str, head: u16, used_len: u32) {
        if let Err(e) = vring.add_used(head, used_len) {
            self.faults
                .report(format_args!("{name}: cannot complete chain {head}: {e}"));
            return;
        }
        self.signal(vring, name);
    }

    fn signal(&self, vring: &Vring, name: &str) {
        match vring.needs_notification() {
            Ok(false) => {}
            Ok(true) => {
                if let Err(e) = vring.signal_used_queue() {
                    warn!("{name}: cannot notify the driver: {e}");
                }
            }
            Err(e) => self.faults.report(format_args!("{name}: {e}")),
        }
    }

    /// Executes one control chain; returns the number of response bytes written.
    fn execute(&self, mem: &MemoryGuard, chain: Chain) -> u32 {
        let head = chain.head_index();
        let mut reader = match Reader::new(&**mem, chain.clone()) {
            Ok(reader) => reader,
            Err(e) => {
                self.faults
                    .report(format_args!("controlq chain {head}: unreadable: {e}"));
                return 0;
            }
        };
        let mut writer = match Writer::new(&**mem, chain) {
            Ok(writer) => writer,
            Err(e) => {
                self.faults
                    .report(format_args!("controlq chain {head}: unwritable: {e}"));
                return 0;
            }
        };
        let capacity = writer.available_bytes();
        if capacity == 0 {
            // Without room for a status the driver could never learn the outcome, so the
            // request is not executed at all.
            self.faults
                .report(format_args!("controlq chain {head}: no response buffer"));
            return 0;
        }

        let mut buffers = self.command.lock();
        let CommandBuffers { request, response } = &mut *buffers;
        response.clear();
        let len = reader.available_bytes();
        let max = self.handler.max_request_size();
        if len > max {
            self.faults.report(format_args!(
                "controlq chain {head}: request of {len} bytes over {max}"
            ));
            self.handler.reject_command(
                &self.ctx,
                CommandRejection::RequestTooLarge { len, max },
                response,
            );
        } else {
            request.clear();
            request.resize(len, 0);
            if let Err(e) = reader.read_exact(request) {
                self.faults
                    .report(format_args!("controlq chain {head}: read failed: {e}"));
                return 0;
            }
            self.handler
                .handle_command(&self.ctx, request, capacity, response);
            if response.len() > capacity {
                let needed = response.len();
                response.clear();
                self.handler.reject_command(
                    &self.ctx,
                    CommandRejection::ResponseTooSmall { needed, capacity },
                    response,
                );
            }
        }
        if response.len() > capacity {
            warn!(
                "error response of {} bytes truncated to {capacity}",
                response.len()
            );
            response.truncate(capacity);
        }
        match writer.write_all(response) {
            Ok(()) => response.len() as u32,
            Err(e) => {
                self.faults
                    .report(format_args!("controlq chain {head}: write failed: {e}"));
                writer.bytes_written() as u32
            }
        }
    }

    fn ring_doorbell(&self, mem: &MemoryGuard, chain: Chain) {
        let head = chain.head_index();
        let mut reader = match Reader::new(&**mem, chain) {
            Ok(reader) => reader,
            Err(e) => {
                self.faults
                    .report(format_args!("doorbellq chain {head}: unreadable: {e}"));
                return;
            }
        };
        let len = reader.available_bytes();
        let max = self.handler.max_doorbell_size();
        if len > max {
            self.faults.report(format_args!(
                "doorbellq chain {head}: {len} bytes over {max}"
            ));
            return;
        }
        let mut bytes = self.doorbell_bytes.lock();
        bytes.clear();
        bytes.resize(len, 0);
        if let Err(e) = reader.read_exact(&mut bytes) {
            self.faults
                .report(format_args!("doorbellq chain {head}: read failed: {e}"));
            return;
        }
        self.handler.doorbell(&self.ctx, &bytes);
    }

    /// Moves queued events into event buffers while both exist.
    fn deliver_events(&self, vring: &Vring) {
        let events = self.ctx.events();
        events.announce_losses(|count, notice| self.handler.events_lost(count, notice));
        if events.is_empty() {
            return;
        }
        let mem = self.ctx.memory();
        loop {
            let used = events.deliver(|event| self.place_event(vring, &mem, event));
            if used {
                self.signal(vring, "eventq");
            }
            // Ask for a kick when the driver posts the next buffer, and look again if one
            // arrived meanwhile.
            if events.is_empty() || !self.event_idx() {
                return;
            }
            match vring.enable_notification() {
                Ok(true) => continue,
                Ok(false) => return,
                Err(e) => {
                    self.faults.report(format_args!("eventq: {e}"));
                    return;
                }
            }
        }
    }

    fn place_event(&self, vring: &Vring, mem: &MemoryGuard, event: &[u8]) -> Placement {
        let chain = match pop_chain(vring, mem) {
            Ok(Some(chain)) => chain,
            Ok(None) => return Placement::NoBuffer,
            Err(e) => {
                self.faults.report(format_args!("eventq: {e}"));
                return Placement::NoBuffer;
            }
        };
        let head = chain.head_index();
        let written = match Writer::new(&**mem, chain) {
            Ok(mut writer) if writer.available_bytes() >= event.len() => {
                match writer.write_all(event) {
                    Ok(()) => Some(event.len() as u32),
                    Err(e) => {
                        self.faults
                            .report(format_args!("eventq buffer {head}: write failed: {e}"));
                        None
                    }
                }
            }
            Ok(writer) => {
                self.faults.report(format_args!(
                    "eventq buffer {head}: {} bytes cannot hold a {}-byte event",
                    writer.available_bytes(),
                    event.len()
                ));
                None
            }
            Err(e) => {
                self.faults
                    .report(format_args!("eventq buffer {head}: unwritable: {e}"));
                None
            }
        };
        if let Err(e) = vring.add_used(head, written.unwrap_or(0)) {
            self.faults
                .report(format_args!("eventq: cannot complete buffer {head}: {e}"));
        }
        match written {
            Some(_) => Placement::Delivered,
            None => Placement::BufferWasted,
        }
    }
}

impl<H: DeviceHandler> VhostUserBackend for VhostUserDevice<H> {
    type Bitmap = ();
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        usize::from(NUM_QUEUES)
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC)
            | VHOST_USER_F_PROTOCOL_FEATURES
            | (self.handler.device_features() & DEVICE_SPECIFIC_MASK)
    }

    fn acked_features(&self, features: u64) {
        self.handler.features_acked(features);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::BACKEND_REQ
            | VhostUserProtocolFeatures::BACKEND_SEND_FD
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::RESET_DEVICE
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
            | VhostUserProtocolFeatures::SHMEM
    }

    fn reset_device(&self) {
        self.request_discard();
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        // QEMU stops every vring alike after a guest reset and when the VM stops, and sends
        // nothing else in either case (no SET_STATUS without that protocol feature, no
        // RESET_DEVICE from vhost-user-base): the stop of the control queue is the reset.
        if queue_index == u32::from(CONTROLQ) {
            self.request_discard();
        }
        Ok(())
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let (offset, size) = (offset as usize, size as usize);
        let Some(end) = offset
            .checked_add(size)
            .filter(|&end| end <= MAX_CONFIG_SIZE)
        else {
            // An empty reply tells the frontend that the request failed.
            return Vec::new();
        };
        let mut config = self.handler.config_space();
        config.resize(MAX_CONFIG_SIZE, 0);
        config[offset..end].to_vec()
    }

    fn set_config(&self, _offset: u32, _buf: &[u8]) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the vrdma configuration space is read-only",
        ))
    }

    fn update_memory(&self, _mem: AtomicGuestRam) -> io::Result<()> {
        // `_mem` is the GuestMemoryAtomic the context already holds; only the handler needs
        // to look at what changed.
        self.handler.memory_changed(&self.ctx);
        Ok(())
    }

    fn set_backend_req_fd(&self, backend: Backend) {
        self.ctx.shmem().set_channel(backend);
    }

    fn get_shmem_config(&self) -> io::Result<VhostUserShMemConfig> {
        let size = self.ctx.shmem().size();
        if size == 0 {
            return Ok(VhostUserShMemConfig::new(0, &[]));
        }
        Ok(VhostUserShMemConfig::new(1, &[size]))
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        vec![1 << CONTROLQ, (1 << EVENTQ) | (1 << DOORBELLQ)]
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        // Without an exit event the workers could never be stopped when the guest goes.
        match new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC) {
            Ok(pair) => {
                self.exit_consumer_fds.lock().push(pair.0.as_raw_fd());
                Some(pair)
            }
            Err(e) => {
                warn!("cannot create a worker exit event: {e}");
                None
            }
        }
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        // Errors returned here would end the worker thread, so guest-caused problems are
        // logged where they happen and never returned.
        match (thread_id, device_event) {
            (CONTROL_WORKER, CONTROL_LOCAL) => self.serve_controlq(&vrings[0]),
            (FAST_WORKER, EVENT_LOCAL) => self.deliver_events(&vrings[0]),
            (FAST_WORKER, DOORBELL_LOCAL) => self.serve_doorbellq(&vrings[1]),
            (FAST_WORKER, EVENTS_WAKE_TOKEN) => {
                self.ctx.events().consume_wake();
                self.deliver_events(&vrings[0]);
            }
            (FAST_WORKER, token) if token >= FIRST_WATCHED_TOKEN => {
                self.handler
                    .fd_ready(&self.ctx, usize::from(token - FIRST_WATCHED_TOKEN));
                self.deliver_events(&vrings[0]);
            }
            (thread, token) => debug!("ignoring event {token} on worker {thread}"),
        }
        Ok(())
    }
}

fn watched_token(index: usize) -> Option<u16> {
    u16::try_from(index)
        .ok()
        .and_then(|index| FIRST_WATCHED_TOKEN.checked_add(index))
}

/// Takes the next available chain, holding the vring lock only for that.
fn pop_chain(vring: &Vring, mem: &MemoryGuard) -> Result<Option<Chain>, virtio_queue::Error> {
    let mut state = vring.get_mut();
    let mut available = state.get_queue_mut().iter(mem.clone())?;
    Ok(available.next())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

    #[derive(Default)]
    struct ConfigOnly {
        resets: AtomicU64,
    }

    impl DeviceHandler for ConfigOnly {
        fn device_features(&self) -> u64 {
            // Bit 32 is a transport bit: the handler must not be able to offer it.
            0b101 | (1 << 32) | (1 << 40)
        }
        fn config_space(&self) -> Vec<u8> {
            b"abcdef".to_vec()
        }
        fn shmem_size(&self) -> u64 {
            0x10_0000
        }
        fn max_request_size(&self) -> usize {
            64
        }
        fn handle_command(&self, _: &GuestContext, _: &[u8], _: usize, _: &mut Vec<u8>) {}
        fn reject_command(&self, _: &GuestContext, _: CommandRejection, _: &mut Vec<u8>) {}
        fn doorbell(&self, _: &GuestContext, _: &[u8]) {}
        fn reset(&self) {
            self.resets.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn backend() -> VhostUserDevice<ConfigOnly> {
        let memory = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        VhostUserDevice::new(Arc::new(ConfigOnly::default()), memory).unwrap()
    }

    fn resets(backend: &VhostUserDevice<ConfigOnly>) -> u64 {
        backend.handler().resets.load(Ordering::Relaxed)
    }

    #[test]
    fn stopping_the_control_queue_discards_guest_state() {
        let backend = backend();
        backend.stop_vring(u32::from(EVENTQ)).unwrap();
        backend.stop_vring(u32::from(DOORBELLQ)).unwrap();
        assert_eq!(resets(&backend), 0);
        backend.stop_vring(u32::from(CONTROLQ)).unwrap();
        assert_eq!(resets(&backend), 1);
        backend.reset_device();
        assert_eq!(resets(&backend), 2);
    }

    #[test]
    fn a_stop_during_a_command_discards_after_it_without_waiting() {
        let backend = Arc::new(backend());
        let running = backend.command.lock();
        // Returns at once although a command "runs" (holds the command buffers).
        backend.stop_vring(u32::from(CONTROLQ)).unwrap();
        assert_eq!(resets(&backend), 0);
        drop(running);
        backend.finish_pending_discard();
        assert_eq!(resets(&backend), 1);
        backend.finish_pending_discard();
        assert_eq!(resets(&backend), 1, "one stop, one discard");
    }

    #[test]
    fn configuration_space_is_padded_and_bounded() {
        let backend = backend();
        assert_eq!(backend.get_config(0, 4), b"abcd");
        assert_eq!(backend.get_config(4, 4), b"ef\0\0");
        assert_eq!(backend.get_config(0, 256).len(), 256);
        assert!(backend.get_config(250, 7).is_empty());
        assert!(backend.get_config(u32::MAX, 2).is_empty());
        assert!(backend.set_config(0, b"x").is_err());
    }

    #[test]
    fn features_keep_transport_bits_to_the_plumbing() {
        let features = backend().features();
        assert_eq!(features & DEVICE_SPECIFIC_MASK, 0b101);
        assert_ne!(features & (1 << VIRTIO_F_VERSION_1), 0);
        assert_ne!(features & (1 << VIRTIO_RING_F_EVENT_IDX), 0);
        assert_ne!(features & VHOST_USER_F_PROTOCOL_FEATURES, 0);
        assert_eq!(features & (1 << 40), 0);
    }

    #[test]
    fn protocol_features_and_shared_memory() {
        let backend = backend();
        let protocol = backend.protocol_features();
        // Bit 22 is VHOST_USER_PROTOCOL_F_SHMEM in QEMU 11.1 as in vhost 0.18.
        assert_eq!(VhostUserProtocolFeatures::SHMEM.bits(), 1 << 22);
        assert!(protocol.contains(
            VhostUserProtocolFeatures::CONFIG
                | VhostUserProtocolFeatures::BACKEND_REQ
                | VhostUserProtocolFeatures::BACKEND_SEND_FD
                | VhostUserProtocolFeatures::REPLY_ACK
                | VhostUserProtocolFeatures::SHMEM
        ));
        assert!(!protocol.contains(VhostUserProtocolFeatures::MQ));
        let shmem = backend.get_shmem_config().unwrap();
        assert_eq!(shmem.nregions, 1);
        assert_eq!(shmem.memory_sizes[0], 0x10_0000);
        assert_eq!(backend.num_queues(), 3);
        assert_eq!(backend.queues_per_thread(), vec![0b001, 0b110]);
    }
}

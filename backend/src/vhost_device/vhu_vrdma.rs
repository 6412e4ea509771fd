//! The vhost-user device of one guest connection: its state, and how it serves each queue
//! (pops chains, runs control commands and doorbells through the [`DeviceHandler`], places
//! events). The `VhostUserBackend` trait impl that the daemon calls is in
//! `vhost_user_backend.rs`.

use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use log::warn;
use parking_lot::Mutex;
use vhost_user_backend::{VringEpollHandler, VringRwLock, VringT};
use virtio_queue::{DescriptorChain, QueueOwnedT, QueueT, Reader, Writer};
use vm_memory::GuestMemoryLoadGuard;
use vmm_sys_util::epoll::EventSet;

use vrdma_keeper::resume::Resume;
use vrdma_spec::queue::{CONTROLQ, DOORBELLQ, EVENTQ, NUM_QUEUES};

use super::chain_layout::check_order;
use super::event_queue::{Placement, DEFAULT_EVENT_CAPACITY};
use super::guest_io::GuestIo;
use super::handler::{CommandRejection, DeviceHandler};
use crate::fault_log::FaultLog;
use crate::memory::guest_ram::{AtomicGuestRam, MappedGuestRam};

/// Worker thread serving the control queue.
pub(super) const CONTROL_WORKER: usize = 0;
/// Worker thread serving the event queue, the doorbell queue and the watched fds.
pub(super) const FAST_WORKER: usize = 1;
/// Epoll token of the event-queue wake-up fd on [`FAST_WORKER`]. Tokens up to `NUM_QUEUES`
/// are reserved by vhost-user-backend (queues, exit event).
pub(super) const EVENTS_WAKE_TOKEN: u16 = NUM_QUEUES + 1;
/// Epoll token of the handler's first watched fd on [`FAST_WORKER`].
pub(super) const FIRST_WATCHED_TOKEN: u16 = NUM_QUEUES + 2;

/// Local vring indices on each worker (vhost-user-backend numbers a worker's vrings from 0).
pub(super) const CONTROL_LOCAL: u16 = 0;
pub(super) const EVENT_LOCAL: u16 = 0;
pub(super) const DOORBELL_LOCAL: u16 = 1;

pub(super) type Vring = VringRwLock<AtomicGuestRam>;
type MemoryGuard = GuestMemoryLoadGuard<MappedGuestRam>;
type Chain = DescriptorChain<MemoryGuard>;

/// Epoll handler of one worker of a [`VhuVrdma`] connection.
pub type WorkerEpollHandler<H> = VringEpollHandler<Arc<VhuVrdma<H>>>;

/// The vhost-user backend of one guest connection.
pub struct VhuVrdma<H: DeviceHandler> {
    pub(super) handler: Arc<H>,
    pub(super) guest_io: GuestIo,
    pub(super) event_idx: AtomicBool,
    pub(super) command: Mutex<CommandBuffers>,
    doorbell_bytes: Mutex<Vec<u8>>,
    faults: FaultLog,
    /// Consumer ends of the worker exit events, which the daemon leaks (see
    /// [`VhuVrdma::close_leaked_exit_fds`]).
    pub(super) exit_consumer_fds: Mutex<Vec<RawFd>>,
    /// The device was stopped or reset while a command may have been running: guest state
    /// is discarded as soon as no command is (spec §11.1).
    discard_pending: AtomicBool,
    /// Advanced by every reset request; a command that saw it change was interrupted.
    generation: AtomicU64,
    /// Per queue: take the position from the ring before serving it next (a resumed
    /// connection, spec §11.5).
    resync: [AtomicBool; NUM_QUEUES as usize],
}

#[derive(Default)]
pub(super) struct CommandBuffers {
    request: Vec<u8>,
    response: Vec<u8>,
}

impl<H: DeviceHandler> VhuVrdma<H> {
    /// A backend serving `handler` over guest RAM `memory` (the same `GuestMemoryAtomic`
    /// must be given to `VhostUserDaemon::new`).
    pub fn new(handler: Arc<H>, memory: AtomicGuestRam) -> io::Result<Self> {
        let guest_io = GuestIo::new(memory, handler.shmem_size(), DEFAULT_EVENT_CAPACITY)?;
        Ok(VhuVrdma {
            handler,
            guest_io,
            event_idx: AtomicBool::new(false),
            command: Mutex::new(CommandBuffers::default()),
            doorbell_bytes: Mutex::new(Vec::new()),
            faults: FaultLog::default(),
            exit_consumer_fds: Mutex::new(Vec::new()),
            discard_pending: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            resync: std::array::from_fn(|_| AtomicBool::new(false)),
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
    pub fn context(&self) -> &GuestIo {
        &self.guest_io
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
            self.guest_io.events().wake_fd(),
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

    /// The connection served an earlier daemon (the keeper's `RESUME`): every queue takes
    /// its position from its ring, and the handler fails the device until the driver resets
    /// it (spec §11.5).
    pub fn resume(&self, resume: &Resume) {
        log::info!(
            "resuming a connection after {} lost daemon(s)",
            resume.losses
        );
        for resync in &self.resync {
            resync.store(true, Ordering::Release);
        }
        self.handler.resumed(&self.guest_io, &resume.last_config);
    }

    /// After a resume, sets the next available and used positions of `queue` to the ring's
    /// used index: what the lost daemon completed stays completed, and every chain the
    /// driver made available after it is served again (a command the lost daemon had begun
    /// is answered, failed, by this one). Waits until the queue is ready.
    fn resync(&self, vring: &Vring, queue: u16) {
        let Some(pending) = self.resync.get(usize::from(queue)) else {
            return;
        };
        if !pending.load(Ordering::Acquire) || !vring.get_ref().get_queue().ready() {
            return;
        }
        pending.store(false, Ordering::Release);
        let mem = self.guest_io.memory();
        let mut state = vring.get_mut();
        let queue_state = state.get_queue_mut();
        match queue_state.used_idx(&*mem, Ordering::Acquire) {
            Ok(used) => {
                queue_state.set_next_avail(used.0);
                queue_state.set_next_used(used.0);
                log::info!("queue {queue}: resumed at {}", used.0);
            }
            Err(e) => self.faults.report(format_args!(
                "queue {queue}: cannot read its used index: {e}"
            )),
        }
    }

    fn event_idx(&self) -> bool {
        self.event_idx.load(Ordering::Relaxed)
    }

    /// Pops, executes and completes control requests until the queue is empty.
    pub(super) fn serve_controlq(&self, vring: &Vring) {
        self.resync(vring, CONTROLQ);
        self.drain_queue(vring, "controlq", |mem, chain| {
            let generation = self.generation.load(Ordering::Acquire);
            let used_len = self.serve_control_chain(mem, chain);
            let interrupted = self.generation.load(Ordering::Acquire) != generation;
            self.finish_pending_discard();
            (!interrupted).then_some(used_len)
        });
    }

    /// Discards guest state (spec §11.1) now if no command is running, else right after the
    /// running one. Never waits for the command: it may itself be waiting for the front-end
    /// (a SHMEM_MAP reply) while the front-end waits for this stop to be acknowledged.
    pub(super) fn request_discard(&self) {
        self.handler.reset_requested();
        // A command running now belongs to the driver that is gone: its chain is not
        // completed on the reset ring (spec §11.1, in-flight commands are dropped).
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.discard_pending.store(true, Ordering::Release);
        if let Some(_no_command_runs) = self.command.try_lock() {
            if self.discard_pending.swap(false, Ordering::AcqRel) {
                self.discard_guest_state();
            }
        }
    }

    /// Performs a discard requested while the command that just finished was running.
    pub(super) fn finish_pending_discard(&self) {
        if self.discard_pending.load(Ordering::Acquire) {
            let _no_command_runs = self.command.lock();
            if self.discard_pending.swap(false, Ordering::AcqRel) {
                self.discard_guest_state();
            }
        }
    }

    fn discard_guest_state(&self) {
        self.guest_io.events().clear();
        self.handler.reset();
    }

    /// Hands every doorbell chain to the handler; a notification without chains is a doorbell
    /// too (doorbells read from memory).
    pub(super) fn serve_doorbellq(&self, vring: &Vring) {
        self.resync(vring, DOORBELLQ);
        let mut chains = 0usize;
        self.drain_queue(vring, "doorbellq", |mem, chain| {
            chains += 1;
            self.ring_doorbell(mem, chain);
            Some(0)
        });
        if chains == 0 {
            self.handler.doorbell(&self.guest_io, &[]);
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
        mut serve: impl FnMut(&MemoryGuard, Chain) -> Option<u32>,
    ) {
        let mem = self.guest_io.memory();
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
                // `None`: the queue was reset under the chain; it and the rest are dropped.
                let Some(used_len) = serve(&mem, chain) else {
                    return;
                };
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
            Ok(false) => log::trace!("{name}: no notification wanted"),
            Ok(true) => {
                if let Err(e) = vring.signal_used_queue() {
                    warn!("{name}: cannot notify the driver: {e}");
                }
            }
            Err(e) => self.faults.report(format_args!("{name}: {e}")),
        }
    }

    /// Serves one control chain (the request, then the response it writes); returns the
    /// number of response bytes written.
    fn serve_control_chain(&self, mem: &MemoryGuard, chain: Chain) -> u32 {
        let head = chain.head_index();
        if let Err(e) = check_order(&chain) {
            self.faults
                .report(format_args!("controlq chain {head}: {e}"));
            return 0;
        }
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
                &self.guest_io,
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
                .handle_command(&self.guest_io, request, capacity, response);
            if response.len() > capacity {
                let needed = response.len();
                response.clear();
                self.handler.reject_command(
                    &self.guest_io,
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
        if let Err(e) = check_order(&chain) {
            self.faults
                .report(format_args!("doorbellq chain {head}: {e}"));
            return;
        }
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
        self.handler.doorbell(&self.guest_io, &bytes);
    }

    /// Moves queued events into event buffers while both exist.
    pub(super) fn deliver_events(&self, vring: &Vring) {
        self.resync(vring, EVENTQ);
        let events = self.guest_io.events();
        events.announce_losses(|count, notice| self.handler.events_lost(count, notice));
        if events.is_empty() {
            return;
        }
        let mem = self.guest_io.memory();
        loop {
            let used = events.deliver(|event| self.place_event(vring, &mem, event));
            if used {
                self.signal(vring, "eventq");
            }
            log::trace!("eventq: buffers used {used}, {} events wait", events.len());
            // Ask for a kick when the driver posts the next buffer, and look again if one
            // arrived meanwhile.
            if events.is_empty() || !self.event_idx() {
                return;
            }
            let more = vring.enable_notification();
            log::trace!("eventq: out of buffers, kick asked for; more already: {more:?}");
            match more {
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
        let written = match check_order(&chain).map(|()| Writer::new(&**mem, chain)) {
            Err(e) => {
                self.faults
                    .report(format_args!("eventq buffer {head}: {e}"));
                None
            }
            Ok(Ok(mut writer)) if writer.available_bytes() >= event.len() => {
                let expanded = self.handler.expand_event(event, writer.available_bytes());
                let bytes = expanded.as_deref().unwrap_or(event);
                match writer.write_all(bytes) {
                    Ok(()) => Some(bytes.len() as u32),
                    Err(e) => {
                        self.faults
                            .report(format_args!("eventq buffer {head}: write failed: {e}"));
                        None
                    }
                }
            }
            Ok(Ok(writer)) => {
                self.faults.report(format_args!(
                    "eventq buffer {head}: {} bytes cannot hold a {}-byte event",
                    writer.available_bytes(),
                    event.len()
                ));
                None
            }
            Ok(Err(e)) => {
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

//! The process transport: this library is itself the vhost-user frontend of the backend (as
//! DPDK's virtio-user), with a memfd as its "guest RAM".
//!
//! Setup: SET_OWNER, feature and protocol-feature negotiation, GET_CONFIG, GET_SHMEM_CONFIG
//! (a PROT_NONE window of that size is reserved), the backend request channel (served by a
//! thread that maps what the backend sends with SHMEM_MAP into the window), SET_MEM_TABLE with
//! the memfd, and the three vrings in that memory with eventfds for kicks and calls.
//! Dropping the transport closes the connection; the backend then releases everything it
//! held for this "guest".
//!
//! After `fork()` the child holds a copy of the transport, which it must not use: the
//! connection, the eventfds and the backend's view of guest RAM belong to the parent's
//! device. The child has no mapping of guest RAM or of the shared-memory window (both
//! `MADV_DONTFORK`); its copy refuses commands and events with
//! [`TransportError::ForkedChild`], and dropping it there closes only the child's
//! descriptors (no shutdown of the shared sockets, no join of the parent's threads).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use log::{debug, warn};
use vhost::vhost_user::message::{
    VhostUserConfigFlags, VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost::vhost_user::{Frontend, FrontendReqHandler, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::queues::{AdaptiveSpin, ControlChannel, EventChannel, QueueSignal, SignalledQueue};
use super::{
    HostKick, OwnerProcess, SharedMemory, Transport, TransportError, DEFAULT_COMMAND_SPIN,
};
use crate::dma::{DmaBuffer, DmaError, DmaMemory, MemfdRam, RamPages, DEFAULT_GUEST_RAM_SIZE};
use crate::virtq::SplitQueue;
use vrdma_spec::features::{
    DEVICE_SPECIFIC_MASK, VIRTIO_F_RING_EVENT_IDX, VIRTIO_F_RING_INDIRECT_DESC, VIRTIO_F_VERSION_1,
};
use vrdma_spec::queue::{CONTROLQ, DOORBELLQ, EVENTQ, NUM_QUEUES};

use super::shmem_window::{ShmemWindow, WindowChange};

/// Settings of a [`ProcessTransport`].
#[derive(Clone, Debug)]
pub struct ProcessOptions {
    /// Size of the memfd "guest RAM" (vrings, command buffers, application buffers); a
    /// multiple of `guest_ram_pages.size()`.
    pub guest_ram_size: usize,
    /// What guest RAM is made of.
    pub guest_ram_pages: RamPages,
    /// Entries of each virtqueue (a power of two, at most 256).
    pub queue_size: u16,
    /// How long a control command may take before the transport gives up.
    pub command_timeout: Duration,
    /// At most how long a control round trip polls for its answer before it sleeps (it
    /// adapts to the typical round trip below that; zero: never polls).
    pub command_spin: Duration,
    /// Bytes of configuration space to read.
    pub config_size: u32,
    /// Device-specific feature bits (0..=23) the driver accepts if offered.
    pub device_features: u64,
    /// Event buffers kept posted on the event queue.
    pub event_buffers: u16,
    /// Size of each event buffer.
    pub event_buffer_size: u32,
    /// Bytes of a second guest-RAM region (a memfd of its own, after the first) that this
    /// transport never allocates from: the guest agent hands it to the application process
    /// it opened the session for, which cannot reach the first region (vrings, command
    /// buffers). 0: none.
    pub application_ram_size: usize,
}

impl Default for ProcessOptions {
    fn default() -> Self {
        ProcessOptions {
            guest_ram_size: DEFAULT_GUEST_RAM_SIZE,
            guest_ram_pages: RamPages::Small,
            queue_size: 256,
            command_timeout: Duration::from_secs(30),
            command_spin: DEFAULT_COMMAND_SPIN,
            config_size: 256,
            device_features: DEVICE_SPECIFIC_MASK,
            event_buffers: 64,
            // A CM event carried whole (VRDMA_F_CM_EVENT_INLINE) takes 400.
            event_buffer_size: 512,
            application_ram_size: 0,
        }
    }
}

/// [`DmaMemory`] of the process transport: allocations from the memfd guest RAM.
pub struct ProcessDma {
    ram: Arc<MemfdRam>,
}

impl ProcessDma {
    /// Guest RAM of `len` bytes.
    pub fn new(len: usize) -> Result<Self, TransportError> {
        Self::with_pages(len, RamPages::Small)
    }

    /// Allocations from `ram`.
    pub fn over(ram: Arc<MemfdRam>) -> Self {
        ProcessDma { ram }
    }

    /// `len` bytes (a multiple of `pages.size()`) of guest RAM made of `pages`.
    pub fn with_pages(len: usize, pages: RamPages) -> Result<Self, TransportError> {
        Ok(ProcessDma {
            ram: MemfdRam::with_pages(len, pages)?,
        })
    }

    /// The guest RAM.
    pub fn guest_ram(&self) -> &Arc<MemfdRam> {
        &self.ram
    }

    /// Guest-physical address of a buffer allocated here.
    pub fn guest_address(&self, buffer: &DmaBuffer) -> Result<u64, TransportError> {
        Ok(self.ram.guest_address(buffer.as_ptr(), buffer.len())?)
    }
}

impl DmaMemory for ProcessDma {
    fn alloc(&self, len: usize, align: usize) -> Result<DmaBuffer, DmaError> {
        self.ram.alloc(len, align)
    }

    fn translate(&self, addr: *const u8, len: usize) -> Result<Vec<u64>, DmaError> {
        self.ram.translate(addr, len)
    }

    fn translate_extents(&self, addr: *const u8, len: usize) -> Result<Vec<(u64, u64)>, DmaError> {
        self.ram.translate_extents(addr, len)
    }
}

/// A vrdma device reached over a vhost-user socket, with this process as the frontend.
pub struct ProcessTransport {
    // Kept only to hold the connection open: dropping it makes the backend let go of
    // everything it held for this "guest".
    _frontend: Frontend,
    dma: ProcessDma,
    /// Guest RAM of its own for another process (see [`ProcessOptions::application_ram_size`]).
    application_ram: Option<Arc<MemfdRam>>,
    device_features: u64,
    config: Vec<u8>,
    window: Arc<ShmemWindow>,
    control: ControlChannel<EventFdSignal>,
    events: EventChannel<EventFdSignal>,
    /// What [`Transport::event_fd`] hands out: readable when the event queue's call eventfd
    /// fires *or* the backend hangs up, so that a caller sleeping in poll on it (the drop-in's
    /// event thread) wakes up to learn of a dead backend from `next_event` instead of sleeping
    /// forever. Its registered fds stay open as long as `events` and `_frontend`.
    event_wakeup: Epoll,
    doorbell: EventFdSignal,
    /// The doorbell queue's rings: the driver never posts on them, but the device was given
    /// their addresses and reads and writes them (avail index, `avail_event`) until it is
    /// disconnected, so their memory must not be reused before.
    _doorbell_rings: SplitQueue,
    backend_channel: Option<BackendChannel>,
    /// The process that connected: a `fork()` child's copy must not drive the device.
    owner: OwnerProcess,
}

impl ProcessTransport {
    /// Connects to the backend at `socket_path` and sets the device up.
    pub fn connect(
        socket_path: impl AsRef<Path>,
        options: ProcessOptions,
    ) -> Result<Self, TransportError> {
        if options.queue_size == 0
            || !options.queue_size.is_power_of_two()
            || options.queue_size > 256
        {
            return Err(TransportError::InvalidRequest("queue size"));
        }
        let dma = ProcessDma::with_pages(options.guest_ram_size, options.guest_ram_pages)?;
        let mut frontend = Frontend::connect(socket_path, u64::from(NUM_QUEUES))
            .map_err(TransportError::VhostUser)?;
        frontend.set_owner().map_err(TransportError::VhostUser)?;

        let device_features = negotiate_features(&frontend, options.device_features)?;
        let event_idx = device_features & VIRTIO_F_RING_EVENT_IDX != 0;
        let protocol = negotiate_protocol(&mut frontend)?;

        let config = read_config(&mut frontend, options.config_size)?;
        let shmem_config = frontend
            .get_shmem_config()
            .map_err(TransportError::VhostUser)?;
        let shmem_size = match shmem_config.nregions {
            0 => 0,
            _ => shmem_config.memory_sizes[0],
        };
        let window = Arc::new(ShmemWindow::reserve(shmem_size)?);

        let mut requests = FrontendReqHandler::new(window.clone())
            .map_err(|e| TransportError::VhostUser(e.into()))?;
        requests.set_reply_ack_flag(protocol.contains(VhostUserProtocolFeatures::REPLY_ACK));
        frontend
            .set_backend_request_fd(&requests.get_tx_raw_fd())
            .map_err(TransportError::VhostUser)?;
        let backend_channel = BackendChannel::serve(requests)?;

        let ram = dma.guest_ram();
        let application_ram = match options.application_ram_size {
            0 => None,
            size => {
                // Right after the driver's RAM, on a 2 MiB boundary.
                let base = (ram.guest_base() + ram.len() as u64).next_multiple_of(2 << 20);
                Some(MemfdRam::create_at(size, RamPages::Small, base)?)
            }
        };
        let regions: Vec<VhostUserMemoryRegionInfo> = std::iter::once(ram)
            .chain(application_ram.as_ref())
            .map(|ram| {
                memory_region(
                    ram.fd(),
                    ram.guest_base(),
                    ram.len() as u64,
                    ram.host_base() as u64,
                )
            })
            .collect();
        frontend
            .set_mem_table(&regions)
            .map_err(TransportError::VhostUser)?;

        let size = options.queue_size;
        let control = set_up_vring(&frontend, &dma, CONTROLQ, size, event_idx)?;
        let event_queue = set_up_vring(&frontend, &dma, EVENTQ, size, event_idx)?;
        let doorbell = set_up_vring(&frontend, &dma, DOORBELLQ, size, event_idx)?;
        let event_wakeup = wakeup_epoll(&frontend, &event_queue.signal.call)?;
        let events = EventChannel::start(
            &dma,
            event_queue,
            options.event_buffers,
            options.event_buffer_size,
        )?;
        for index in [CONTROLQ, EVENTQ, DOORBELLQ] {
            frontend
                .set_vring_enable(usize::from(index), true)
                .map_err(TransportError::VhostUser)?;
        }
        events.notify()?;

        let control = ControlChannel::new(
            &dma,
            control,
            options.command_timeout,
            AdaptiveSpin::new(options.command_spin),
        )?;
        Ok(ProcessTransport {
            _frontend: frontend,
            dma,
            application_ram,
            device_features: device_features & DEVICE_SPECIFIC_MASK,
            config,
            window,
            control,
            events,
            event_wakeup,
            doorbell: doorbell.signal,
            _doorbell_rings: doorbell.queue,
            backend_channel: Some(backend_channel),
            owner: OwnerProcess::current(),
        })
    }

    /// The process transport's DMA memory (with guest-physical translation).
    pub fn process_dma(&self) -> &ProcessDma {
        &self.dma
    }

    /// The second guest-RAM region, if [`ProcessOptions::application_ram_size`] asked for one.
    pub fn application_ram(&self) -> Option<&Arc<MemfdRam>> {
        self.application_ram.as_ref()
    }

    /// The doorbell queue's kick eventfd: whoever holds it notifies the device as
    /// [`Transport::notify_doorbell`] does (the guest agent hands it to applications).
    pub fn doorbell_kick(&self) -> BorrowedFd<'_> {
        // SAFETY: the eventfd is owned by `self.doorbell` and stays open while `self` is
        // borrowed.
        unsafe { BorrowedFd::borrow_raw(self.doorbell.kick.as_raw_fd()) }
    }

    /// From now on, the backend's changes of the shared-memory window are not made in this
    /// process but kept for [`Self::take_window_changes`], to be made in another (the guest
    /// agent passes them to the application process the session serves). rxe maps a queue
    /// buffer only once, so only one process can map it.
    pub fn forward_window_changes(&self) {
        self.window.forward();
    }

    /// The window changes received since the last call (see
    /// [`Self::forward_window_changes`]). The backend makes a command's mappings before it
    /// answers it, so after `execute` returns they are all here.
    pub fn take_window_changes(&self) -> Vec<WindowChange> {
        self.window.take_forwarded()
    }
}

fn memory_region(
    fd: BorrowedFd<'_>,
    gpa: u64,
    len: u64,
    host_base: u64,
) -> VhostUserMemoryRegionInfo {
    VhostUserMemoryRegionInfo {
        guest_phys_addr: gpa,
        memory_size: len,
        userspace_addr: host_base,
        mmap_offset: 0,
        mmap_handle: fd.as_raw_fd(),
    }
}

impl Transport for ProcessTransport {
    fn device_features(&self) -> u64 {
        self.device_features
    }

    fn device_config(&self) -> &[u8] {
        &self.config
    }

    fn round_trip(&self, request: &[u8], response: &mut [u8]) -> Result<usize, TransportError> {
        // Checked first: in a child, guest RAM (the command buffers) is not mapped, and the
        // control queue's lock may have been held by a thread the child does not have.
        self.owner.check()?;
        self.control.round_trip(&self.dma, request, response)
    }

    fn round_trip_batch(
        &self,
        commands: &mut [(&[u8], &mut [u8])],
    ) -> Result<Vec<usize>, TransportError> {
        self.owner.check()?;
        self.control.round_trip_batch(&self.dma, commands)
    }

    fn notify_doorbell(&self) -> Result<(), TransportError> {
        self.doorbell.notify()
    }

    fn check_alive(&self) -> Result<(), TransportError> {
        // The event wake-up epoll watches the vhost-user socket, which turns readable only
        // when the backend closes it; level-triggered, so this reads nothing away from
        // `next_event`'s waits.
        let mut ready = [EpollEvent::default(); 2];
        let count = self
            .event_wakeup
            .wait(0, &mut ready)
            .map_err(TransportError::io("epoll_wait"))?;
        if ready[..count].iter().any(|e| e.data() == DISCONNECT_TOKEN) {
            return Err(TransportError::Disconnected);
        }
        Ok(())
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
        // SAFETY: the epoll fd is owned by `self.event_wakeup` and stays open while `self` is
        // borrowed.
        Some(unsafe { BorrowedFd::borrow_raw(self.event_wakeup.as_raw_fd()) })
    }

    fn shared_memory(&self) -> SharedMemory {
        self.window.shared_memory()
    }

    fn host_kick(&self, qp_handle: u32) -> Option<HostKick> {
        Some(HostKick::new(self.window.host_context()?, qp_handle))
    }

    fn dma(&self) -> &dyn DmaMemory {
        &self.dma
    }
}

impl Drop for ProcessTransport {
    fn drop(&mut self) {
        if let Some(channel) = self.backend_channel.take() {
            if self.owner.is_current() {
                channel.stop();
            } else {
                channel.abandon();
            }
        }
    }
}

const CALL_TOKEN: u64 = 0;
const DISCONNECT_TOKEN: u64 = 1;

fn negotiate_features(frontend: &Frontend, accepted_device: u64) -> Result<u64, TransportError> {
    let offered = frontend.get_features().map_err(TransportError::VhostUser)?;
    if offered & VIRTIO_F_VERSION_1 == 0 {
        return Err(TransportError::Unsupported("VIRTIO_F_VERSION_1"));
    }
    let protocol = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
    if offered & protocol == 0 {
        return Err(TransportError::Unsupported(
            "VHOST_USER_F_PROTOCOL_FEATURES",
        ));
    }
    let wanted = VIRTIO_F_VERSION_1
        | VIRTIO_F_RING_EVENT_IDX
        | VIRTIO_F_RING_INDIRECT_DESC
        | protocol
        | (accepted_device & DEVICE_SPECIFIC_MASK);
    let acked = offered & wanted;
    frontend
        .set_features(acked)
        .map_err(TransportError::VhostUser)?;
    Ok(acked)
}

fn negotiate_protocol(
    frontend: &mut Frontend,
) -> Result<VhostUserProtocolFeatures, TransportError> {
    let offered = frontend
        .get_protocol_features()
        .map_err(TransportError::VhostUser)?;
    let required = VhostUserProtocolFeatures::CONFIG
        | VhostUserProtocolFeatures::BACKEND_REQ
        | VhostUserProtocolFeatures::BACKEND_SEND_FD
        | VhostUserProtocolFeatures::SHMEM;
    if !offered.contains(required) {
        return Err(TransportError::Unsupported(
            "vhost-user protocol features CONFIG, BACKEND_REQ, BACKEND_SEND_FD and SHMEM",
        ));
    }
    let acked = offered & (required | VhostUserProtocolFeatures::REPLY_ACK);
    frontend
        .set_protocol_features(acked)
        .map_err(TransportError::VhostUser)?;
    Ok(acked)
}

fn read_config(frontend: &mut Frontend, size: u32) -> Result<Vec<u8>, TransportError> {
    if size == 0 {
        return Ok(Vec::new());
    }
    let buf = vec![0; size as usize];
    let (_, config) = frontend
        .get_config(0, size, VhostUserConfigFlags::empty(), &buf)
        .map_err(TransportError::VhostUser)?;
    Ok(config)
}

/// Kick and call eventfds of one vring, with an epoll that also sees the backend hang up.
struct EventFdSignal {
    kick: EventFd,
    call: EventFd,
    epoll: Epoll,
}

/// An epoll over `call` and the vhost-user socket (which turns readable only when the backend
/// closes it: the backend sends nothing unasked on it).
fn wakeup_epoll(frontend: &Frontend, call: &EventFd) -> Result<Epoll, TransportError> {
    let epoll = Epoll::new().map_err(TransportError::io("epoll"))?;
    for (fd, token) in [
        (call.as_raw_fd(), CALL_TOKEN),
        (frontend.as_raw_fd(), DISCONNECT_TOKEN),
    ] {
        epoll
            .ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN | EventSet::READ_HANG_UP, token),
            )
            .map_err(TransportError::io("epoll_ctl"))?;
    }
    Ok(epoll)
}

/// Creates the rings of vring `index` and hands them to the backend with fresh eventfds.
fn set_up_vring(
    frontend: &Frontend,
    dma: &ProcessDma,
    index: u16,
    size: u16,
    event_idx: bool,
) -> Result<SignalledQueue<EventFdSignal>, TransportError> {
    let queue = SplitQueue::new(dma, size, event_idx)?;
    let kick = EventFd::new(EFD_NONBLOCK).map_err(TransportError::io("eventfd"))?;
    let call = EventFd::new(EFD_NONBLOCK).map_err(TransportError::io("eventfd"))?;
    let epoll = wakeup_epoll(frontend, &call)?;
    let host = queue.host_addresses();
    let config = VringConfigData {
        queue_max_size: size,
        queue_size: size,
        flags: 0,
        desc_table_addr: host.desc,
        used_ring_addr: host.used,
        avail_ring_addr: host.avail,
        log_addr: None,
    };
    let index = usize::from(index);
    let vhost = (|| {
        frontend.set_vring_num(index, size)?;
        frontend.set_vring_addr(index, &config)?;
        frontend.set_vring_base(index, 0)?;
        frontend.set_vring_call(index, &call)?;
        frontend.set_vring_kick(index, &kick)
    })();
    vhost.map_err(TransportError::VhostUser)?;
    Ok(SignalledQueue {
        queue,
        signal: EventFdSignal { kick, call, epoll },
    })
}

impl QueueSignal for EventFdSignal {
    // The call eventfd's counter keeps a notification until it is read: nothing to note.
    type Ticket = ();

    fn notify(&self) -> Result<(), TransportError> {
        self.kick
            .write(1)
            .map_err(TransportError::io("cannot notify the device"))
    }

    fn arm(&self) {}

    fn wait(&self, (): (), deadline: Option<Instant>) -> Result<bool, TransportError> {
        let mut ready = [EpollEvent::default(); 2];
        loop {
            let timeout_ms = match deadline {
                None => -1,
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(false);
                    }
                    i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX)
                }
            };
            match self.epoll.wait(timeout_ms, &mut ready) {
                Ok(0) => continue,
                Ok(count) => {
                    if ready[..count].iter().any(|e| e.data() == DISCONNECT_TOKEN) {
                        return Err(TransportError::Disconnected);
                    }
                    // Reset the counter; EAGAIN means another waiter got there first.
                    let _ = self.call.read();
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(TransportError::io("epoll_wait")(e)),
            }
        }
    }
}

/// Serves the backend request channel (SHMEM_MAP/UNMAP) on a thread of its own.
struct BackendChannel {
    thread: JoinHandle<()>,
    socket: UnixStream,
}

impl BackendChannel {
    fn serve(mut requests: FrontendReqHandler<ShmemWindow>) -> Result<Self, TransportError> {
        let socket = socket_of(&requests)?;
        let thread = thread::Builder::new()
            .name("vrdma-backend-req".into())
            .spawn(move || loop {
                match requests.handle_request() {
                    Ok(_) => {}
                    // Refused requests have been answered; keep serving.
                    Err(vhost::vhost_user::Error::ReqHandlerError(e)) => {
                        debug!("backend request refused: {e}")
                    }
                    Err(e) => {
                        debug!("backend request channel closed: {e}");
                        return;
                    }
                }
            })
            .map_err(TransportError::io(
                "cannot start the backend request thread",
            ))?;
        Ok(BackendChannel { thread, socket })
    }

    /// In a `fork()` child: the serving thread exists only in the parent (joining it would
    /// wait forever) and shutting the socket down would cut the parent's channel; only this
    /// process's descriptor is closed.
    fn abandon(self) {
        std::mem::forget(self.thread);
        drop(self.socket);
    }

    fn stop(self) {
        // Shutting the socket down wakes the thread from its receive.
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
        if self.thread.join().is_err() {
            warn!("the backend request thread panicked");
        }
    }
}

/// A second handle on the receiving socket of the backend request channel.
fn socket_of(requests: &FrontendReqHandler<ShmemWindow>) -> Result<UnixStream, TransportError> {
    // SAFETY: the fd belongs to `requests`, which is alive for this call; it is only
    // duplicated here.
    let fd = unsafe { BorrowedFd::borrow_raw(requests.as_raw_fd()) };
    let owned: OwnedFd = fd.try_clone_to_owned().map_err(TransportError::io(
        "cannot duplicate the backend request socket",
    ))?;
    Ok(UnixStream::from(owned))
}

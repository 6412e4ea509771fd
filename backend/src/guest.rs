//! One guest's vrdma device: the [`DeviceHandler`] of a vhost-user connection.
//!
//! A [`GuestDevice`] owns a host verbs context of its own (one uverbs fd per guest, spec §12),
//! the guest's handle tables, the placement of its queue buffers in the queue region, its MR
//! windows and its doorbell area. [`GuestDeviceFactory`] makes one per connection from the
//! shared host device and the daemon's options.
//!
//! Locking: the control queue, the fast worker (doorbells, host events) and the vhost-user
//! request thread (memory changes, reset) call in concurrently. All object state sits behind
//! one mutex taken for a whole command; the doorbell area and the doorbell-index → QP map sit
//! behind a second one, taken by the control path only for a moment (lock order: state, then
//! doorbells), so a slow command never delays a doorbell.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use log::{debug, info, warn};
use vrdma_spec::config::{self, DeviceConfig};
use vrdma_spec::control::{HEADER_SIZE, MAX_RESPONSE_SIZE};
use vrdma_spec::features::{
    VIRTIO_F_VERSION_1, VRDMA_F_DOORBELL_POLL, VRDMA_F_RING_RXE_V1, VRDMA_F_SRQ, VRDMA_F_UD,
};
use vrdma_spec::StatusError;
use vrdma_spec::{ControlRequest, ControlResponse, Event, EventType, Le16, Le32, Le64, Status};
use zerocopy::IntoBytes;

use crate::control::doorbell::{self, Doorbells};
use crate::control::{self, ah, cq, mr, pd, qp, srq, CommandError, Session};
use crate::device::{DeviceAttr, DeviceError, HostContext, HostDevice};
use crate::handler::{
    lock, CommandRejection, DeviceHandler, EventClass, GuestContext, SHMEM_PAGE_SIZE,
};
use crate::resources::{Handle, HandleTable, Quotas, ResourceError, ResourceKind};
use crate::shm_alloc::{ShmAllocError, ShmAllocator};

/// Default size of the queue region: 64 MiB.
pub const DEFAULT_SHM_SIZE: u64 = 64 << 20;
/// Default largest page list of one REG_MR: 64 Ki pages (256 MiB in 4 KiB pages, one request of
/// 512 KiB).
pub const DEFAULT_MAX_MR_PAGES: u32 = 1 << 16;
/// Default doorbell poll window in microseconds (`--doorbell-poll-us`); 0 is off.
pub const DEFAULT_DOORBELL_POLL_US: u64 = 0;
/// Longest doorbell poll window: the worker that polls also delivers events, which wait for up
/// to [`doorbell::POLL_BUDGET_WINDOWS`] windows.
pub const MAX_DOORBELL_POLL: Duration = Duration::from_millis(1);
/// The one port a guest sees (spec §4 `num_ports`); it stands for the host port of
/// [`DeviceOptions::host_port`].
pub const GUEST_PORT: u8 = 1;

/// What the daemon's command line decides about every guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceOptions {
    /// Per-guest object and MR byte quotas (spec §10).
    pub quotas: Quotas,
    /// Size of the queue region (shared-memory region 0), a power of two of whole pages.
    pub shm_size: u64,
    /// Offer `VRDMA_F_UD` (spec §12: on rxe UD lets a guest choose its packets' addresses).
    pub allow_ud: bool,
    /// Host port exposed to guests as their port 1.
    pub host_port: u8,
    /// Largest `npages` of one REG_MR.
    pub max_mr_pages: u32,
    /// How long the doorbell worker keeps polling a guest's doorbell area after a doorbell
    /// (offering `VRDMA_F_DOORBELL_POLL`); zero for never.
    pub doorbell_poll: Duration,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions {
            quotas: Quotas::default(),
            shm_size: DEFAULT_SHM_SIZE,
            allow_ud: false,
            host_port: 1,
            max_mr_pages: DEFAULT_MAX_MR_PAGES,
            doorbell_poll: Duration::from_micros(DEFAULT_DOORBELL_POLL_US),
        }
    }
}

/// Errors of [`DeviceOptions`], [`GuestDeviceFactory`] and [`GuestDevice`] creation.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// The queue region size is unusable.
    #[error("queue region size {0:#x} must be a power of two of at least one page, below 4 GiB")]
    ShmSize(u64),
    /// A quota does not fit a handle table.
    #[error(transparent)]
    Quota(#[from] ResourceError),
    /// The QP quota needs more doorbell slots than the spec allows.
    #[error("at most {max} QPs per guest are possible (doorbell area limit), not {qps}")]
    TooManyQps {
        /// Requested QP quota.
        qps: u32,
        /// Largest possible.
        max: u32,
    },
    /// `max_mr_pages` is 0 or makes requests too large.
    #[error("max MR pages must be 1..={max}, not {pages}")]
    MaxMrPages {
        /// Requested value.
        pages: u32,
        /// Largest accepted.
        max: u32,
    },
    /// The host device has no such port.
    #[error("RDMA device {device} has no port {port}")]
    NoSuchPort {
        /// Device name.
        device: String,
        /// Requested port.
        port: u8,
    },
    /// The doorbell poll window is too long.
    #[error("a doorbell poll window of {0:?} is over the limit of {MAX_DOORBELL_POLL:?}")]
    DoorbellPoll(Duration),
    /// The host device could not be opened or queried.
    #[error("host device: {0}")]
    Host(#[from] DeviceError),
    /// The queue region could not be set up.
    #[error(transparent)]
    Placement(#[from] ShmAllocError),
}

/// Largest `max_mr_pages` accepted: keeps a REG_MR request below 8 MiB.
const MAX_MR_PAGES_LIMIT: u32 = 1 << 20;

impl DeviceOptions {
    /// Checks every option against the spec's limits.
    pub fn validate(&self) -> Result<(), GuestError> {
        let size = self.shm_size;
        if !size.is_power_of_two() || size < SHMEM_PAGE_SIZE || size > u64::from(u32::MAX) {
            return Err(GuestError::ShmSize(size));
        }
        self.quotas.validate()?;
        if self.quotas.qps > vrdma_spec::doorbell::MAX_SLOTS {
            return Err(GuestError::TooManyQps {
                qps: self.quotas.qps,
                max: vrdma_spec::doorbell::MAX_SLOTS,
            });
        }
        if self.doorbell_poll > MAX_DOORBELL_POLL {
            return Err(GuestError::DoorbellPoll(self.doorbell_poll));
        }
        if self.max_mr_pages == 0 || self.max_mr_pages > MAX_MR_PAGES_LIMIT {
            return Err(GuestError::MaxMrPages {
                pages: self.max_mr_pages,
                max: MAX_MR_PAGES_LIMIT,
            });
        }
        Ok(())
    }

    /// Slots of the doorbell area: the QP quota rounded up to a power of two (spec §4).
    pub fn doorbell_slots(&self) -> u32 {
        self.quotas.qps.max(1).next_power_of_two()
    }

    /// Largest control request: header, REG_MR body and a full page list (spec §4).
    pub fn max_request_size(&self) -> usize {
        HEADER_SIZE + size_of::<vrdma_spec::wire::RegMrReq>() + 8 * self.max_mr_pages as usize
    }
}

/// Makes one [`GuestDevice`] per guest connection.
pub struct GuestDeviceFactory {
    device: Arc<dyn HostDevice>,
    options: Arc<DeviceOptions>,
    next_id: AtomicU64,
}

impl GuestDeviceFactory {
    /// A factory serving guests from `device` with `options` (validated here).
    pub fn new(device: Arc<dyn HostDevice>, options: DeviceOptions) -> Result<Self, GuestError> {
        options.validate()?;
        let info = device.info();
        if !info.ports.iter().any(|p| p.port == options.host_port) {
            return Err(GuestError::NoSuchPort {
                device: info.name.clone(),
                port: options.host_port,
            });
        }
        Ok(GuestDeviceFactory {
            device,
            options: Arc::new(options),
            next_id: AtomicU64::new(0),
        })
    }

    /// The options every guest gets.
    pub fn options(&self) -> &DeviceOptions {
        &self.options
    }

    /// A fresh device with its own host context, for one new guest.
    pub fn create(&self) -> Result<GuestDevice, GuestError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        GuestDevice::new(id, Arc::clone(&self.device), Arc::clone(&self.options))
    }
}

/// Host limits read once when the guest's context is opened.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostLimits {
    pub(crate) attr: DeviceAttr,
}

/// Every object and placement of one guest.
pub(crate) struct GuestState {
    pub(crate) pds: HandleTable<pd::PdEntry>,
    pub(crate) mrs: HandleTable<mr::MrEntry>,
    /// Bytes of live (not revoked) MRs, against `Quotas::mr_bytes`.
    pub(crate) mr_bytes: u64,
    pub(crate) cqs: HandleTable<cq::CqEntry>,
    pub(crate) qps: HandleTable<qp::QpEntry>,
    pub(crate) srqs: HandleTable<srq::SrqEntry>,
    pub(crate) ahs: HandleTable<ah::AhEntry>,
    /// Extents of the queue region in use.
    pub(crate) shm: ShmAllocator,
    /// Source of the `user_handle`s given to the host: events name objects by them.
    pub(crate) next_user_handle: u64,
    /// The object behind each `user_handle` in use.
    pub(crate) owners: HashMap<u64, EventOwner>,
    /// State was discarded; tell the guest with DEVICE_FATAL at the next opportunity.
    pub(crate) announce_discard: bool,
}

impl GuestState {
    fn new(options: &DeviceOptions) -> Result<Self, GuestError> {
        let q = &options.quotas;
        Ok(GuestState {
            pds: HandleTable::new(ResourceKind::Pd, q.pds)?,
            // MR bytes are counted here rather than by the table: a revoked MR (spec §11.3)
            // releases its bytes while its handle stays allocated.
            mrs: HandleTable::new(ResourceKind::Mr, q.mrs)?,
            mr_bytes: 0,
            cqs: HandleTable::new(ResourceKind::Cq, q.cqs)?,
            qps: HandleTable::new(ResourceKind::Qp, q.qps)?,
            srqs: HandleTable::new(ResourceKind::Srq, q.srqs)?,
            ahs: HandleTable::new(ResourceKind::Ah, q.ahs)?,
            shm: ShmAllocator::new(options.shm_size, SHMEM_PAGE_SIZE)?,
            next_user_handle: 1,
            owners: HashMap::new(),
            announce_discard: false,
        })
    }

    /// A `user_handle` never given out before on this connection.
    pub(crate) fn new_user_handle(&mut self) -> u64 {
        let handle = self.next_user_handle;
        self.next_user_handle = self.next_user_handle.wrapping_add(1).max(1);
        handle
    }

    /// Counts of live objects, for logs and tests.
    pub(crate) fn counts(&self) -> ObjectCounts {
        ObjectCounts {
            pds: self.pds.len(),
            mrs: self.mrs.len(),
            cqs: self.cqs.len(),
            qps: self.qps.len(),
            srqs: self.srqs.len(),
            ahs: self.ahs.len(),
            shm_extents: self.shm.used_extents(),
        }
    }
}

/// The guest object a host `user_handle` stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventOwner {
    Cq(Handle),
    Qp(Handle),
    Srq(Handle),
}

/// How many objects a guest holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObjectCounts {
    /// Protection domains.
    pub pds: usize,
    /// Memory regions (revoked ones included until deregistered).
    pub mrs: usize,
    /// Completion queues.
    pub cqs: usize,
    /// Queue pairs.
    pub qps: usize,
    /// Shared receive queues.
    pub srqs: usize,
    /// Address handles.
    pub ahs: usize,
    /// Extents of the queue region in use.
    pub shm_extents: usize,
}

impl ObjectCounts {
    /// Whether the guest holds nothing.
    pub fn is_empty(&self) -> bool {
        *self == ObjectCounts::default()
    }
}

impl std::fmt::Display for ObjectCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} PDs, {} MRs, {} CQs, {} QPs, {} SRQs, {} AHs, {} queue-region extents",
            self.pds, self.mrs, self.cqs, self.qps, self.srqs, self.ahs, self.shm_extents
        )
    }
}

/// The device of one guest connection.
pub struct GuestDevice {
    id: u64,
    device: Arc<dyn HostDevice>,
    options: Arc<DeviceOptions>,
    limits: HostLimits,
    state: Mutex<GuestState>,
    doorbells: Mutex<Doorbells>,
    /// Feature bits the driver accepted; `None` until it did (after a reset again).
    acked: Mutex<Option<u64>>,
    epoch: AtomicU32,
    /// The host device reported a fatal error (spec §11.2).
    failed: AtomicBool,
    faults: FaultLog,
    // Declared last so it is dropped last: every host object of the guest goes with it, even
    // one whose explicit destruction failed.
    host: Box<dyn HostContext>,
}

impl GuestDevice {
    fn new(
        id: u64,
        device: Arc<dyn HostDevice>,
        options: Arc<DeviceOptions>,
    ) -> Result<Self, GuestError> {
        let host = device.open_context()?;
        let attr = host.query_device()?;
        let state = GuestState::new(&options)?;
        info!(
            "guest {id}: host context on {} opened (port {} exposed as port {GUEST_PORT})",
            device.info().name,
            options.host_port
        );
        Ok(GuestDevice {
            id,
            doorbells: Mutex::new(Doorbells::new(options.doorbell_slots())),
            device,
            limits: HostLimits { attr },
            state: Mutex::new(state),
            acked: Mutex::new(None),
            epoch: AtomicU32::new(0),
            failed: AtomicBool::new(false),
            faults: FaultLog::default(),
            options,
            host,
        })
    }

    /// Connection number (for logs).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The current configuration `epoch`.
    pub fn epoch(&self) -> u32 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Live objects of this guest.
    pub fn object_counts(&self) -> ObjectCounts {
        lock(&self.state).counts()
    }

    /// The daemon's options.
    pub fn options(&self) -> &DeviceOptions {
        &self.options
    }

    pub(crate) fn host(&self) -> &dyn HostContext {
        &*self.host
    }

    pub(crate) fn device(&self) -> &dyn HostDevice {
        &*self.device
    }

    pub(crate) fn limits(&self) -> &HostLimits {
        &self.limits
    }

    pub(crate) fn doorbells(&self) -> &Mutex<Doorbells> {
        &self.doorbells
    }

    /// The host port behind guest port `port`, if the guest has such a port.
    pub(crate) fn host_port(&self, port: u32) -> Option<u8> {
        (port == u32::from(GUEST_PORT)).then_some(self.options.host_port)
    }

    /// The guest's number for host port `port` (0 for ports the guest does not see).
    pub(crate) fn guest_port(&self, port: u8) -> u8 {
        if port == self.options.host_port {
            GUEST_PORT
        } else {
            0
        }
    }

    fn features(&self) -> Option<u64> {
        *lock(&self.acked)
    }

    fn ring_format_reported(&self) -> u32 {
        let offered = self.device.ring_format();
        match self.features() {
            None => offered,
            Some(f) if f & VRDMA_F_RING_RXE_V1 != 0 => offered,
            Some(_) => config::ring_format::NONE,
        }
    }

    /// Decodes, checks and executes one request.
    fn run_command(
        &self,
        ctx: &GuestContext,
        request: &[u8],
        capacity: usize,
    ) -> (Option<vrdma_spec::Opcode>, control::CommandResult) {
        let decoded = match ControlRequest::decode(request) {
            Ok(decoded) => decoded,
            Err(e) => return (None, Err(e.into())),
        };
        let op = decoded.opcode();
        (Some(op), self.run_decoded(ctx, &decoded, capacity))
    }

    fn run_decoded(
        &self,
        ctx: &GuestContext,
        request: &ControlRequest<'_>,
        capacity: usize,
    ) -> control::CommandResult {
        let op = request.opcode();
        let needed = HEADER_SIZE + op.response_body_len();
        if capacity < needed {
            return Err(CommandError::Invalid {
                what: "response buffer length",
                value: capacity as u64,
            });
        }
        let features = self.features().unwrap_or(0);
        if features & VIRTIO_F_VERSION_1 == 0 {
            return Err(CommandError::NotNegotiated("VIRTIO_F_VERSION_1"));
        }
        let missing = request.required_features() & !features;
        if missing & VRDMA_F_SRQ != 0 {
            return Err(CommandError::NotNegotiated("VRDMA_F_SRQ"));
        }
        if missing & VRDMA_F_UD != 0 {
            return Err(CommandError::NotNegotiated("VRDMA_F_UD"));
        }
        if self.failed.load(Ordering::Acquire) {
            return Err(CommandError::DeviceFailed);
        }
        let mut state = lock(&self.state);
        self.announce_discard(ctx, &mut state);
        let mut session = Session {
            dev: self,
            ctx,
            state: &mut state,
            features,
        };
        control::execute(&mut session, request)
    }

    /// Delivers the DEVICE_FATAL owed for an earlier discard (spec §11.1).
    pub(crate) fn announce_discard(&self, ctx: &GuestContext, state: &mut GuestState) {
        if !std::mem::take(&mut state.announce_discard) {
            return;
        }
        let event = Event {
            event_type: EventType::DeviceFatal,
            handle: 0,
            detail: self.epoch(),
        };
        if let Err(e) = ctx.events().push(&event.to_bytes(), EventClass::Async) {
            warn!("guest {}: cannot queue DEVICE_FATAL: {e}", self.id);
        }
    }

    /// Discards every object of the guest (spec §11.1), in dependency order. `ctx` is `None`
    /// when the frontend already removed every queue-region mapping (reset, disconnect).
    pub(crate) fn discard(&self, state: &mut GuestState, ctx: Option<&GuestContext>) -> bool {
        let counts = state.counts();
        let had_area = lock(&self.doorbells).clear();
        if counts.is_empty() && !had_area {
            return false;
        }
        let host = self.host();
        for (handle, entry) in state.qps.drain() {
            qp::release(host, ctx, &mut state.shm, handle, entry);
        }
        for (handle, entry) in state.srqs.drain() {
            srq::release(host, ctx, &mut state.shm, handle, entry);
        }
        for (handle, entry) in state.cqs.drain() {
            cq::release(host, ctx, &mut state.shm, handle, entry);
        }
        for (handle, entry) in state.ahs.drain() {
            ah::release(host, handle, entry);
        }
        for (handle, entry) in state.mrs.drain() {
            mr::release(host, handle, entry);
        }
        for (handle, entry) in state.pds.drain() {
            pd::release(host, handle, entry);
        }
        state.mr_bytes = 0;
        state.owners.clear();
        state.shm.clear();
        state.announce_discard = true;
        let epoch = self.epoch.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
        info!(
            "guest {}: discarded {counts}; epoch is now {epoch}",
            self.id
        );
        true
    }

    /// The host device failed: drop everything and refuse commands until reset (spec §11.2).
    pub(crate) fn host_failed(&self, ctx: &GuestContext) {
        warn!(
            "guest {}: the host RDMA device reported a fatal error",
            self.id
        );
        self.failed.store(true, Ordering::Release);
        let mut state = lock(&self.state);
        self.discard(&mut state, Some(ctx));
        // Also announce when nothing existed: the device is unusable either way.
        state.announce_discard = true;
        self.announce_discard(ctx, &mut state);
    }

    pub(crate) fn state(&self) -> &Mutex<GuestState> {
        &self.state
    }
}

impl DeviceHandler for GuestDevice {
    fn device_features(&self) -> u64 {
        let mut features = VRDMA_F_SRQ;
        if self.device.ring_format() == vrdma_spec::rxe_v1::FORMAT_ID {
            features |= VRDMA_F_RING_RXE_V1;
        }
        if self.options.allow_ud {
            features |= VRDMA_F_UD;
        }
        if !self.options.doorbell_poll.is_zero() {
            features |= VRDMA_F_DOORBELL_POLL;
        }
        features
    }

    fn features_acked(&self, features: u64) {
        debug!("guest {}: driver accepted features {features:#x}", self.id);
        *lock(&self.acked) = Some(features);
    }

    fn config_space(&self) -> Vec<u8> {
        let options = &self.options;
        let config = DeviceConfig {
            magic: Le32::new(config::MAGIC),
            version_major: Le16::new(config::VERSION_MAJOR),
            version_minor: Le16::new(config::VERSION_MINOR),
            ring_format: Le32::new(self.ring_format_reported()),
            num_ports: Le32::new(u32::from(GUEST_PORT)),
            shm_size: Le64::new(options.shm_size),
            shm_id: Le32::new(u32::from(vrdma_spec::shm::QUEUE_REGION_ID)),
            shm_page_shift: Le32::new(SHMEM_PAGE_SIZE.trailing_zeros()),
            max_request_size: Le32::new(
                u32::try_from(options.max_request_size()).unwrap_or(u32::MAX),
            ),
            max_response_size: Le32::new(MAX_RESPONSE_SIZE as u32),
            max_mr_pages: Le32::new(options.max_mr_pages),
            doorbell_slots: Le32::new(options.doorbell_slots()),
            epoch: Le32::new(self.epoch()),
            reserved: [0; 12],
        };
        config.as_bytes().to_vec()
    }

    fn shmem_size(&self) -> u64 {
        self.options.shm_size
    }

    fn max_request_size(&self) -> usize {
        self.options.max_request_size()
    }

    fn handle_command(
        &self,
        ctx: &GuestContext,
        request: &[u8],
        response_capacity: usize,
        response: &mut Vec<u8>,
    ) {
        if response_capacity < HEADER_SIZE {
            // Spec §5.1: without room for a status the command is not executed.
            self.faults.report(
                self.id,
                format_args!("response buffer of {response_capacity} bytes"),
            );
            return;
        }
        let (op, result) = self.run_command(ctx, request, response_capacity);
        match result {
            Ok(body) => {
                debug!("guest {}: {op:?}: OK", self.id);
                ControlResponse::Ok(body).encode_into(response);
            }
            Err(e) => {
                let status = e.status();
                self.faults
                    .report(self.id, format_args!("{op:?}: {} ({e})", status.status()));
                ControlResponse::Err(status).encode_into(response);
            }
        }
    }

    fn reject_command(
        &self,
        _ctx: &GuestContext,
        rejection: CommandRejection,
        response: &mut Vec<u8>,
    ) {
        self.faults
            .report(self.id, format_args!("command rejected: {rejection}"));
        ControlResponse::Err(StatusError::new(Status::Invalid)).encode_into(response);
    }

    fn doorbell(&self, _ctx: &GuestContext, rung: &[u8]) {
        if !rung.is_empty() {
            // The driver posts no doorbellq buffers (spec §5.3); their bytes mean nothing.
            debug!(
                "guest {}: ignoring a {}-byte doorbellq buffer",
                self.id,
                rung.len()
            );
        }
        doorbell::serve(&self.doorbells, self.host(), self.options.doorbell_poll);
    }

    fn watched_fds(&self) -> Vec<RawFd> {
        vec![
            self.host.comp_channel_fd().as_raw_fd(),
            self.host.async_fd().as_raw_fd(),
        ]
    }

    fn fd_ready(&self, ctx: &GuestContext, index: usize) {
        match index {
            control::events::COMP_CHANNEL_FD => control::events::completions(self, ctx),
            control::events::ASYNC_FD => control::events::async_events(self, ctx),
            other => debug!("guest {}: no watched fd {other}", self.id),
        }
    }

    fn events_lost(&self, count: u64, notice: &mut Vec<u8>) {
        let event = Event {
            event_type: EventType::EventsLost,
            handle: 0,
            detail: u32::try_from(count).unwrap_or(u32::MAX),
        };
        notice.extend_from_slice(&event.to_bytes());
    }

    fn memory_changed(&self, ctx: &GuestContext) {
        let mut state = lock(&self.state);
        mr::revoke_unbacked(self, ctx, &mut state);
        lock(&self.doorbells).memory_changed(ctx.memory().into_inner());
    }

    fn reset(&self) {
        let mut state = lock(&self.state);
        self.discard(&mut state, None);
        self.failed.store(false, Ordering::Release);
        *lock(&self.acked) = None;
    }

    fn is_device_mapping(&self, file: &std::fs::File) -> bool {
        // Queue buffers are mapped from the context's uverbs fd: a region backed by the same
        // character device is one of them, never guest RAM.
        let queue_fd = match self.host().queue_fd().try_clone_to_owned() {
            Ok(fd) => std::fs::File::from(fd),
            Err(_) => return false,
        };
        same_character_device(file, &queue_fd)
    }
}

fn same_character_device(a: &std::fs::File, b: &std::fs::File) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => {
            a.file_type().is_char_device() && b.file_type().is_char_device() && a.rdev() == b.rdev()
        }
        _ => false,
    }
}

impl Drop for GuestDevice {
    fn drop(&mut self) {
        let mut state = lock(&self.state);
        let counts = state.counts();
        if !counts.is_empty() {
            info!("guest {}: closing with {counts}", self.id);
        }
        self.discard(&mut state, None);
    }
}

/// Logs what a guest does wrong without letting it flood the log: the first few reports and
/// then every power-of-two-th at warn level, the rest at debug level.
#[derive(Default)]
pub(crate) struct FaultLog {
    count: AtomicU64,
}

impl FaultLog {
    const ALWAYS_SHOWN: u64 = 8;

    pub(crate) fn report(&self, guest: u64, what: std::fmt::Arguments<'_>) {
        let n = self.count.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        if n <= Self::ALWAYS_SHOWN || n.is_power_of_two() {
            warn!("guest {guest}: error #{n}: {what}");
        } else {
            debug!("guest {guest}: error #{n}: {what}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_mappings_are_recognised_by_their_character_device() {
        let null = || std::fs::File::open("/dev/null").unwrap();
        let zero = std::fs::File::open("/dev/zero").unwrap();
        let regular = std::fs::File::open(env!("CARGO_MANIFEST_PATH")).unwrap();
        assert!(same_character_device(&null(), &null()));
        assert!(!same_character_device(&null(), &zero));
        assert!(!same_character_device(&regular, &regular));
    }
}

//! One guest's vrdma device: the [`DeviceHandler`] of a vhost-user connection.
//!
//! A [`GuestDevice`] owns a host verbs context of its own (one uverbs fd per guest, spec §12),
//! the guest's handle tables, the placement of its queue buffers in the queue region, its MR
//! windows and its doorbell area. [`GuestDeviceFactory`] makes one per connection from the
//! shared host device and the daemon's options. It decodes and checks control requests and
//! hands them to [`crate::control`]; doorbells go to [`crate::datapath`], host events to
//! [`host_events`] and [`cm_events`], which turn them into guest events.
//!
//! This is the top of the per-guest layers: it calls down into `control`, `datapath` and the
//! guest's object model (`guest`), and nothing below calls up into it.
//!
//! Locking: the control queue, the fast worker (doorbells, host events) and the vhost-user
//! request thread (memory changes, reset) call in concurrently. All object state sits behind
//! one mutex taken for a whole command; the doorbell area and the doorbell-index → QP map sit
//! behind a second one, taken by the control path only for a moment (lock order: state, then
//! doorbells), so a slow command never delays a doorbell.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use log::{debug, info, warn};
use parking_lot::Mutex;
use vhost::vhost_user::VhostUserProtocolFeatures;
use vrdma_spec::cm::{cm_event, CM_EVENT_INLINE_SIZE};
use vrdma_spec::config::{self, DeviceConfig};
use vrdma_spec::control::{HEADER_SIZE, MAX_CM_RESPONSE_SIZE, MAX_RESPONSE_SIZE};
use vrdma_spec::features::{
    VIRTIO_F_VERSION_1, VRDMA_F_CM, VRDMA_F_CM_EVENT_INLINE, VRDMA_F_CM_MOVES_QP,
    VRDMA_F_DOORBELL_POLL, VRDMA_F_HOST_KICK, VRDMA_F_MR_EXTENTS, VRDMA_F_MW, VRDMA_F_ODP,
    VRDMA_F_RING_RXE_V1, VRDMA_F_SRQ, VRDMA_F_STAGED_CQS, VRDMA_F_STAGED_RINGS, VRDMA_F_UC,
    VRDMA_F_UD, VRDMA_F_UD_STAGED_SQ,
};
use vrdma_spec::StatusError;
use vrdma_spec::{ControlRequest, ControlResponse, Event, EventType, Le16, Le32, Le64, Status};
use zerocopy::{FromBytes, IntoBytes};

use crate::control::discard::{self, Epoch};
use crate::control::error::CommandError;
use crate::control::session::{CommandResult, Session};
use crate::control::{self, mr};
use crate::datapath::doorbell;
use crate::datapath::staging::file::StagingFile;
use crate::datapath::staging::retry::RetryTimer;
use crate::fault_log::FaultLog;
use crate::guest::cm_ids::CmInbox;
use crate::guest::inventory::Inventory;
use crate::guest::options::{DeviceOptions, GuestError, StagedRings};
use crate::guest::shared::{GuestAddressing, GuestShared, HostLimits, PortLimits, GUEST_PORT};
use crate::guest::state::{GuestState, ObjectCounts};
use crate::host::HostDevice;
use crate::identity::address_gid;
use crate::identity::endpoints::{LocalEndpoints, TenantLink};
use crate::identity::gid_view::GidView;
use crate::memory::budget::{HostBudget, HostBudgetLimits};
use crate::vhost_device::guest_io::GuestIo;
use crate::vhost_device::handler::{CommandRejection, DeviceHandler};
use crate::vhost_device::shmem::{SHMEM_PAGE_SIZE, SLOT_COUNTING_FRONTEND_MAPPINGS};

pub mod cm_events;
pub mod host_events;

/// Makes one [`GuestDevice`] per guest connection.
pub struct GuestDeviceFactory {
    device: Arc<dyn HostDevice>,
    options: Arc<DeviceOptions>,
    /// Mappings and pinned memory shared by every guest's MRs.
    budget: Arc<HostBudget>,
    /// The daemon's tenant addresses and QP numbers, and this factory's tenant.
    tenant: TenantLink,
}

/// Index of the staging retry timer in `watched_fds` (before the connection manager's).
const STAGING_RETRY_FD: usize = 2;

/// Guest device numbers (for logs), unique in the daemon: several factories serve side by side.
static NEXT_GUEST_ID: AtomicU64 = AtomicU64::new(0);

impl GuestDeviceFactory {
    /// A factory serving guests from `device` with `options` (validated here), within a budget
    /// of its own with this host's default limits ([`HostBudgetLimits::for_this_host`]).
    pub fn new(device: Arc<dyn HostDevice>, options: DeviceOptions) -> Result<Self, GuestError> {
        let budget = Arc::new(HostBudget::new(HostBudgetLimits::for_this_host()));
        Self::with_budget(device, options, budget)
    }

    /// A factory serving guests from `device` with `options` (validated here), whose guests'
    /// MRs share `budget` (with every other factory given the same one).
    pub fn with_budget(
        device: Arc<dyn HostDevice>,
        options: DeviceOptions,
        budget: Arc<HostBudget>,
    ) -> Result<Self, GuestError> {
        Self::with_daemon(device, options, budget, LocalEndpoints::new())
    }

    /// A factory whose guests share `budget` and whose tenant (if its guests have addresses)
    /// is entered in `endpoints`, with every other factory of the daemon given the same two.
    pub fn with_daemon(
        device: Arc<dyn HostDevice>,
        options: DeviceOptions,
        budget: Arc<HostBudget>,
        endpoints: Arc<LocalEndpoints>,
    ) -> Result<Self, GuestError> {
        options.validate()?;
        let info = device.info();
        let Some(port) = info.ports.iter().find(|p| p.port == options.host_port) else {
            return Err(GuestError::NoSuchPort {
                device: info.name.clone(),
                port: options.host_port,
            });
        };
        let identity = &options.identity;
        if identity.has_addresses() && port.link_layer != "Ethernet" {
            return Err(GuestError::AddressesNeedRoce {
                name: identity.name.clone(),
                device: info.name.clone(),
                port: port.port,
            });
        }
        if identity.has_addresses() {
            info!(
                "guest {}: addresses {}; policy {:?}",
                identity.name,
                identity
                    .addresses
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                identity.policy
            );
        } else {
            warn!(
                "guest {}: no network identity (no addresses): it sees the GID table of {} port \
                 {} without the tenants' entries and may send from any of the host's addresses",
                identity.name, info.name, port.port
            );
        }
        Ok(GuestDeviceFactory {
            tenant: TenantLink {
                tenant: identity.has_addresses().then(|| {
                    endpoints.add_tenant(identity.addresses.iter().map(|a| address_gid(a.ip)))
                }),
                endpoints,
            },
            device,
            options: Arc::new(options),
            budget,
        })
    }

    /// The mappings and pinned memory budget its guests share.
    pub fn budget(&self) -> &Arc<HostBudget> {
        &self.budget
    }

    /// The options every guest gets.
    pub fn options(&self) -> &DeviceOptions {
        &self.options
    }

    /// A fresh device with its own host context, for one new guest.
    pub fn create(&self) -> Result<GuestDevice, GuestError> {
        let id = NEXT_GUEST_ID.fetch_add(1, Ordering::Relaxed);
        GuestDevice::new(
            id,
            Arc::clone(&self.device),
            Arc::clone(&self.options),
            Arc::clone(&self.budget),
            self.tenant.clone(),
        )
    }
}

/// Host memory one guest's live MRs use (spec §10).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Bytes against the MR byte quota: `npages · page size` per MR.
    pub mr_bytes: u64,
    /// Memory mappings of the MR windows and staged queues.
    pub mappings: u64,
    /// Distinct guest bytes pinned.
    pub pinned_bytes: u64,
    /// Bytes the kernel charges for the MRs to the daemon's locked memory.
    pub locked_bytes: u64,
}

/// The device of one guest connection.
pub struct GuestDevice {
    state: Mutex<GuestState>,
    /// The guest's undelivered CM events (also in `state`): a CM_EVENT notice placed into a
    /// large enough event buffer takes the oldest along, without the state lock
    /// (`VRDMA_F_CM_EVENT_INLINE`).
    cm_inbox: Arc<CmInbox>,
    /// Feature bits the driver accepted; `None` until it did (after a reset again).
    acked: Mutex<Option<u64>>,
    /// The host device reported a fatal error (spec §11.2).
    failed: AtomicBool,
    /// The front-end counts every queue mapping as a memory slot (it acknowledged
    /// CONFIGURE_MEM_SLOTS): commands cap the guest's queue mappings. Set by the front-end
    /// filter's relay thread, which must never wait for the state lock (a command holding it
    /// may be waiting for the front-end).
    slot_counting_frontend: AtomicBool,
    /// The guest's memory table changed and its MRs are still to be checked against it
    /// (`memory_changed`, on the front-end filter's relay thread, which must never wait for
    /// the state lock either: a command holding it may be waiting for the front-end's answer
    /// to a SHMEM_MAP while the front-end waits for the answer to its memory-table change).
    /// Whoever holds the state next applies it.
    memory_change_pending: AtomicBool,
    faults: FaultLog,
    /// Pumps again staging rings whose WQEs wait for room in their host queues.
    staging_retry: RetryTimer,
    // Declared last so it is dropped last: it holds the host context.
    shared: GuestShared,
}

impl GuestDevice {
    fn new(
        id: u64,
        device: Arc<dyn HostDevice>,
        options: Arc<DeviceOptions>,
        budget: Arc<HostBudget>,
        tenant: TenantLink,
    ) -> Result<Self, GuestError> {
        let host = device.open_context()?;
        let attr = host.query_device()?;
        // Only a host whose on-demand paging serves a guest's MRs (at an iova other than
        // their address) is asked; one that cannot say has no ODP for its guests.
        let odp = if host.odp_serves_any_iova() {
            host.odp_caps().unwrap_or_else(|e| {
                warn!("guest {id}: cannot read the host's ODP capabilities ({e}): no ODP offered");
                None
            })
        } else {
            None
        };
        let port = PortLimits::from(&host.query_port(options.host_port)?);
        let state = GuestState::new(&options, budget)?;
        // UD sends and QPs past the front-end's mappings are staged (spec §9.6, §9.7); the
        // file is sparse, so a guest that stages nothing costs nothing.
        let staging = Some(Arc::new(
            StagingFile::new(options.shm_size).map_err(GuestError::Staging)?,
        ));
        let gids = GidView::for_port(
            &*device,
            options.host_port,
            &options.identity.addresses,
            &tenant.endpoints,
        )?;
        let cm = match device.open_cm() {
            Ok(cm) => cm,
            Err(e) => {
                warn!(
                    "guest {id} ({}): no connection manager ({e}): VRDMA_F_CM is not offered",
                    options.identity.name
                );
                None
            }
        };
        let netdev_ifindex = device.netdev_ifindex(options.host_port).unwrap_or(0);
        info!(
            "guest {id} ({}): host context on {} opened (port {} exposed as port {GUEST_PORT})",
            options.identity.name,
            device.info().name,
            options.host_port
        );
        Ok(GuestDevice {
            cm_inbox: Arc::clone(&state.cm.pending),
            state: Mutex::new(state),
            acked: Mutex::new(None),
            failed: AtomicBool::new(false),
            slot_counting_frontend: AtomicBool::new(false),
            memory_change_pending: AtomicBool::new(false),
            faults: FaultLog::for_guest(id),
            staging_retry: RetryTimer::new().map_err(GuestError::Staging)?,
            shared: GuestShared::new(
                id,
                device,
                options,
                host,
                HostLimits { attr, odp, port },
                staging,
                GuestAddressing {
                    gids,
                    tenant,
                    cm,
                    netdev_ifindex,
                },
            ),
        })
    }

    /// Connection number (for logs).
    pub fn id(&self) -> u64 {
        self.shared.id()
    }

    /// The current configuration `epoch`.
    pub fn epoch(&self) -> u32 {
        self.shared.epoch()
    }

    /// Live objects of this guest.
    pub fn object_counts(&self) -> ObjectCounts {
        self.state.lock().counts()
    }

    /// A snapshot of everything this guest holds, for consistency checks (tests, fuzzing).
    pub fn inventory(&self) -> Inventory {
        let mut inventory = self.state.lock().inventory();
        let mut doorbells = self.shared.doorbells().lock();
        inventory.lingering_ahs = doorbells.staging().lingering_host_ahs();
        inventory
    }

    /// The daemon's options.
    pub fn options(&self) -> &DeviceOptions {
        self.shared.options()
    }

    /// Host memory this guest's live MRs use.
    pub fn memory_usage(&self) -> MemoryUsage {
        let state = self.state.lock();
        MemoryUsage {
            mr_bytes: state.mr_bytes,
            mappings: state.memory.mappings(),
            pinned_bytes: state.memory.pinned_bytes(),
            locked_bytes: state.memory.locked_bytes(),
        }
    }

    fn features(&self) -> Option<u64> {
        *self.acked.lock()
    }

    fn ring_format_reported(&self) -> u32 {
        let offered = self.shared.device().ring_format();
        match self.features() {
            None => offered,
            Some(f) if f & VRDMA_F_RING_RXE_V1 != 0 => offered,
            Some(_) => config::ring_format::NONE,
        }
    }

    /// Decodes, checks and executes one request.
    fn run_command(
        &self,
        guest_io: &GuestIo,
        request: &[u8],
        capacity: usize,
    ) -> (Option<vrdma_spec::Opcode>, CommandResult) {
        let decoded = match ControlRequest::decode(request) {
            Ok(decoded) => decoded,
            Err(e) => return (None, Err(e.into())),
        };
        let op = decoded.opcode();
        (Some(op), self.run_decoded(guest_io, &decoded, capacity))
    }

    fn run_decoded(
        &self,
        guest_io: &GuestIo,
        request: &ControlRequest<'_>,
        capacity: usize,
    ) -> CommandResult {
        let op = request.opcode();
        let epoch = self.shared.epoch();
        let features = self.features().unwrap_or(0);
        if features & VIRTIO_F_VERSION_1 == 0 {
            return Err(CommandError::NotNegotiated("VIRTIO_F_VERSION_1"));
        }
        let missing = request.required_features() & !features;
        // Before the response-size check: CM_GET_EVENT's answer is larger than what a device
        // without the connection manager advertises.
        if missing & VRDMA_F_CM != 0 {
            return Err(CommandError::NotNegotiated("VRDMA_F_CM"));
        }
        let needed = HEADER_SIZE + op.response_body_len();
        if capacity < needed {
            return Err(CommandError::Invalid {
                what: "response buffer length",
                value: capacity as u64,
            });
        }
        if missing & VRDMA_F_SRQ != 0 {
            return Err(CommandError::NotNegotiated("VRDMA_F_SRQ"));
        }
        if missing & VRDMA_F_UD != 0 {
            return Err(CommandError::NotNegotiated("VRDMA_F_UD"));
        }
        if missing & VRDMA_F_UC != 0 {
            return Err(CommandError::NotNegotiated("VRDMA_F_UC"));
        }
        if missing & VRDMA_F_MW != 0 {
            return Err(CommandError::NotNegotiated("VRDMA_F_MW"));
        }
        if missing & VRDMA_F_MR_EXTENTS != 0 {
            return Err(CommandError::NotNegotiated("VRDMA_F_MR_EXTENTS"));
        }
        if missing & VRDMA_F_ODP != 0 {
            return Err(CommandError::NotNegotiated("VRDMA_F_ODP"));
        }
        if missing & VRDMA_F_CM_MOVES_QP != 0 {
            return Err(CommandError::NotNegotiated("VRDMA_F_CM_MOVES_QP"));
        }
        if self.failed.load(Ordering::Acquire) {
            return Err(CommandError::DeviceFailed);
        }
        // Spec §5.3: a command sees every post whose doorbell was queued before it was sent.
        // The doorbell worker may not have drained them yet (it runs on its own thread), and a
        // RESIZE_CQ or MODIFY_QP run ahead of them would act on a CQ or QP without the
        // completions the caller's earlier posts produce natively.
        let next_retry = doorbell::drain(self.shared.doorbells(), self.shared.host());
        self.arm_staging_retry(next_retry);
        let mut state = self.state.lock();
        state
            .shm
            .set_max_extents(if self.slot_counting_frontend.load(Ordering::Acquire) {
                SLOT_COUNTING_FRONTEND_MAPPINGS
            } else {
                usize::MAX
            });
        self.shared.announce_discard(guest_io, &mut state);
        // A memory-table change the front-end thread left pending: before the command, which
        // must see the MRs it revokes gone.
        self.revoke_if_pending(guest_io, &mut state);
        let mut session = Session {
            guest: &self.shared,
            guest_io,
            state: &mut state,
            features,
            epoch,
        };
        control::dispatch(&mut session, request)
    }

    /// Applies a memory-table change the front-end thread could not (see
    /// `memory_change_pending`); called on the worker threads after each command and event,
    /// where waiting for the state is safe.
    fn apply_memory_change(&self, guest_io: &GuestIo) {
        if self.memory_change_pending.load(Ordering::SeqCst) {
            let mut state = self.state.lock();
            self.revoke_if_pending(guest_io, &mut state);
        }
    }

    /// Revokes the MRs the current memory table no longer backs, once per change.
    fn revoke_if_pending(&self, guest_io: &GuestIo, state: &mut GuestState) {
        if self.memory_change_pending.swap(false, Ordering::SeqCst) {
            mr::revoke_unbacked(&self.shared, guest_io, state);
        }
    }

    /// Starts the staging retry timer when a drain left a staged ring not fully forwarded
    /// (`next_retry`, as the drain reported it).
    fn arm_staging_retry(&self, next_retry: Option<Duration>) {
        if let Some(delay) = next_retry {
            self.staging_retry.start(delay);
        }
    }

    /// The host device failed: drop everything and refuse commands until reset (spec §11.2).
    fn host_failed(&self, guest_io: &GuestIo) {
        warn!(
            "guest {}: the host RDMA device reported a fatal error",
            self.id()
        );
        self.failed.store(true, Ordering::Release);
        let mut state = self.state.lock();
        if !discard::discard_all(&self.shared, &mut state, Some(guest_io), Epoch::Advanced) {
            // Nothing was discarded, so the epoch did not move; the DEVICE_FATAL below must
            // still name a new one (a driver ignores one naming the epoch it opened at).
            self.shared.advance_epoch();
        }
        // Also announce when nothing existed: the device is unusable either way.
        state.announce_discard = true;
        self.shared.announce_discard(guest_io, &mut state);
    }
}

impl DeviceHandler for GuestDevice {
    fn device_features(&self) -> u64 {
        // Every rxe device has SRQs and UC QPs; extent lists are the daemon's own.
        let mut features = VRDMA_F_SRQ | VRDMA_F_UC | VRDMA_F_MR_EXTENTS;
        if self.shared.options().staged_rings != StagedRings::Never {
            features |= VRDMA_F_STAGED_RINGS;
        }
        if self.shared.options().staged_cqs != StagedRings::Never {
            features |= VRDMA_F_STAGED_CQS;
        }
        if self.shared.device().ring_format() == vrdma_spec::rxe_v1::FORMAT_ID {
            // An rxe v1 send queue buffer is mapped from the host verbs context's file, and its
            // kick is an empty POST_SEND on it: a front-end holding the file can kick itself.
            features |= VRDMA_F_RING_RXE_V1 | VRDMA_F_HOST_KICK;
        }
        if self.shared.options().allow_ud {
            features |= VRDMA_F_UD | VRDMA_F_UD_STAGED_SQ;
        }
        if self.shared.options().allow_memory_windows {
            features |= VRDMA_F_MW;
        }
        if !self.shared.options().doorbell_poll.is_zero() {
            features |= VRDMA_F_DOORBELL_POLL;
        }
        if self.shared.cm().is_some() {
            features |= VRDMA_F_CM | VRDMA_F_CM_MOVES_QP | VRDMA_F_CM_EVENT_INLINE;
        }
        if self.shared.limits().odp.is_some() {
            features |= VRDMA_F_ODP;
        }
        features
    }

    fn expand_event(&self, event: &[u8], capacity: usize) -> Option<Vec<u8>> {
        // Every event placed comes here: the cheap checks first, the feature's lock last.
        if capacity < CM_EVENT_INLINE_SIZE
            || Event::decode(event).map_or(true, |e| e.event_type != EventType::CmEvent)
            || self.acked.lock().unwrap_or(0) & VRDMA_F_CM_EVENT_INLINE == 0
        {
            return None;
        }
        // The oldest waiting event, whichever notice carries it (a notice may have been
        // dropped, or its event fetched already): the notice is rewritten to name it. None
        // left: the bare notice (CM_GET_EVENT then answers none).
        let body = self.cm_inbox.take_oldest()?;
        let request = body.event.get() == cm_event::CONNECT_REQUEST;
        let carried = Event {
            event_type: EventType::CmEvent,
            handle: if request {
                body.listen_id.get()
            } else {
                body.id.get()
            },
            detail: body.event.get(),
        };
        let mut bytes = Vec::with_capacity(CM_EVENT_INLINE_SIZE);
        bytes.extend_from_slice(&carried.to_bytes());
        bytes.extend_from_slice(body.as_bytes());
        Some(bytes)
    }

    fn features_acked(&self, features: u64) {
        debug!(
            "guest {}: driver accepted features {features:#x}",
            self.id()
        );
        *self.acked.lock() = Some(features);
    }

    fn config_space(&self) -> Vec<u8> {
        let options = self.shared.options();
        let odp = self.shared.limits().odp.unwrap_or_default();
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
            // CM_GET_EVENT's answer is the largest (spec §7.5).
            max_response_size: Le32::new(if self.shared.cm().is_some() {
                MAX_CM_RESPONSE_SIZE as u32
            } else {
                MAX_RESPONSE_SIZE as u32
            }),
            max_mr_pages: Le32::new(options.max_mr_pages),
            doorbell_slots: Le32::new(options.doorbell_slots()),
            epoch: Le32::new(self.epoch()),
            odp_rc_caps: Le32::new(odp.rc),
            odp_uc_caps: Le32::new(odp.uc),
            odp_ud_caps: Le32::new(odp.ud),
        };
        config.as_bytes().to_vec()
    }

    fn shmem_size(&self) -> u64 {
        self.shared.options().shm_size
    }

    fn max_request_size(&self) -> usize {
        self.shared.options().max_request_size()
    }

    fn handle_command(
        &self,
        guest_io: &GuestIo,
        request: &[u8],
        response_capacity: usize,
        response: &mut Vec<u8>,
    ) {
        if response_capacity < HEADER_SIZE {
            // Spec §5.1: without room for a status the command is not executed.
            self.faults
                .report(format_args!("response buffer of {response_capacity} bytes"));
            return;
        }
        let (op, result) = self.run_command(guest_io, request, response_capacity);
        self.apply_memory_change(guest_io);
        // A command may leave staged WQEs waiting for room (a QP that starts sending); the
        // host may have consumed the sends a destroyed AH waited for.
        let next_retry = {
            let mut doorbells = self.shared.doorbells().lock();
            let staging = doorbells.staging();
            staging.release_lingering_ahs(self.shared.host());
            staging.next_retry()
        };
        self.arm_staging_retry(next_retry);
        match result {
            Ok(body) => {
                debug!("guest {}: {op:?}: OK", self.id());
                ControlResponse::Ok(body).encode_into(response);
            }
            Err(e) => {
                let status = e.status();
                self.faults
                    .report(format_args!("{op:?}: {} ({e})", status.status()));
                ControlResponse::Err(status).encode_into(response);
            }
        }
    }

    fn reject_command(&self, _ctx: &GuestIo, rejection: CommandRejection, response: &mut Vec<u8>) {
        self.faults
            .report(format_args!("command rejected: {rejection}"));
        ControlResponse::Err(StatusError::new(Status::Invalid)).encode_into(response);
    }

    fn doorbell(&self, _ctx: &GuestIo, rung: &[u8]) {
        if !rung.is_empty() {
            // The driver posts no doorbellq buffers (spec §5.3); their bytes mean nothing.
            debug!(
                "guest {}: ignoring a {}-byte doorbellq buffer",
                self.id(),
                rung.len()
            );
        }
        let next_retry = doorbell::serve(
            self.shared.doorbells(),
            self.shared.host(),
            self.shared.options().doorbell_poll,
        );
        self.arm_staging_retry(next_retry);
    }

    fn watched_fds(&self) -> Vec<RawFd> {
        let mut fds = vec![
            self.shared.host().comp_channel_fd().as_raw_fd(),
            self.shared.host().async_fd().as_raw_fd(),
            self.staging_retry.fd(),
        ];
        if let Some(cm) = self.shared.cm() {
            fds.push(cm.event_fd().as_raw_fd());
        }
        fds
    }

    fn fd_ready(&self, guest_io: &GuestIo, index: usize) {
        match index {
            host_events::COMP_CHANNEL_FD => {
                host_events::completions(&self.shared, &self.state, guest_io)
            }
            host_events::ASYNC_FD => {
                if host_events::async_events(&self.shared, &self.state, guest_io) {
                    self.host_failed(guest_io);
                }
            }
            STAGING_RETRY_FD => {
                let (_, next) = self
                    .shared
                    .doorbells()
                    .lock()
                    .staging()
                    .retry(self.shared.host());
                self.staging_retry.after_retry(next);
            }
            cm_events::CM_FD => cm_events::cm_events(&self.shared, &self.state, guest_io),
            other => debug!("guest {}: no watched fd {other}", self.id()),
        }
        self.apply_memory_change(guest_io);
    }

    fn events_lost(&self, count: u64, notice: &mut Vec<u8>) {
        let event = Event {
            event_type: EventType::EventsLost,
            handle: 0,
            detail: u32::try_from(count).unwrap_or(u32::MAX),
        };
        notice.extend_from_slice(&event.to_bytes());
    }

    fn memory_changed(&self, guest_io: &GuestIo) {
        // The doorbell lock is never held across a front-end round trip.
        self.shared
            .doorbells()
            .lock()
            .memory_changed(guest_io.memory().into_inner());
        // SeqCst with the loads in `apply_memory_change`: a holder that lets the state go
        // after this store sees it.
        self.memory_change_pending.store(true, Ordering::SeqCst);
        if let Some(mut state) = self.state.try_lock() {
            self.revoke_if_pending(guest_io, &mut state);
        }
    }

    fn reset_requested(&self) {
        self.failed.store(false, Ordering::Release);
        *self.acked.lock() = None;
        // The discard this reset owes may come late: the next driver already reads the epoch
        // it belongs to, so the DEVICE_FATAL announcing it names an epoch that driver knows.
        self.shared.advance_epoch();
    }

    fn reset(&self) {
        // Negotiation and epoch moved on when the reset was requested: this discard may run
        // after a command the reset interrupted, when the next driver has negotiated already.
        let mut state = self.state.lock();
        discard::discard_all(&self.shared, &mut state, None, Epoch::Kept);
    }

    fn frontend_protocol_features(&self, acked: u64) {
        // Every queue buffer is a memory slot of such a front-end: commands stay below its
        // limit, so that a guest creating queues gets QUOTA rather than aborting QEMU.
        let counts_slots = acked & VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS.bits() != 0;
        self.slot_counting_frontend
            .store(counts_slots, Ordering::Release);
    }

    fn resumed(&self, guest_io: &GuestIo, last_config: &[u8]) {
        // The driver read the lost daemon's epoch at most: start past it. Nothing of that
        // daemon exists here, so there is nothing to discard, only the loss to announce.
        let seen = DeviceConfig::read_from_prefix(last_config)
            .ok()
            .map(|(config, _)| config.epoch.get());
        let epoch = match seen {
            Some(seen) => self.shared.start_past(seen),
            None => self.shared.advance_epoch(),
        };
        warn!(
            "guest {}: resumed after a lost daemon; epoch {epoch}, commands fail until the driver resets",
            self.id()
        );
        self.failed.store(true, Ordering::Release);
        let mut state = self.state.lock();
        state.announce_discard = true;
        self.shared.announce_discard(guest_io, &mut state);
    }

    fn is_device_mapping(&self, file: &std::fs::File) -> bool {
        // Queue buffers are mapped from the context's uverbs fd: a region backed by the same
        // character device is one of them, never guest RAM.
        // So are staging rings, which live in the guest's staging file (spec §9.6).
        if let Some(staging) = self.shared.staging() {
            if staging.is_same_file(file) {
                return true;
            }
        }
        let queue_fd = match self.shared.host().queue_fd().try_clone_to_owned() {
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
        let mut state = self.state.lock();
        let counts = state.counts();
        if !counts.is_empty() {
            info!("guest {}: closing with {counts}", self.id());
        }
        discard::discard_all(&self.shared, &mut state, None, Epoch::Kept);
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

//! What every layer serving one guest shares outside the guest's state lock: its host context
//! and device, the limits read from them, the daemon's options, the doorbell table and the
//! configuration epoch.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use log::warn;
use parking_lot::Mutex;
use vrdma_spec::{Event, EventType};

use super::options::DeviceOptions;
use super::state::GuestState;
use crate::datapath::doorbell::Doorbells;
use crate::datapath::staging::file::StagingFile;
use crate::datapath::staging::Reach;
use crate::fault_log::{FaultLog, LogLimit};
use crate::host::cm::HostCm;
use crate::host::uverbs::{QueryDeviceResp, QueryPortResp};
use crate::host::{ContextGids, HostContext, HostDevice};
use crate::identity::endpoints::TenantLink;
use crate::identity::gid_view::GidView;
use crate::vhost_device::event_queue::EventClass;
use crate::vhost_device::guest_io::GuestIo;
use vrdma_spec::config::OdpCaps;

/// The one port a guest sees (spec §4 `num_ports`); it stands for the host port of
/// [`DeviceOptions::host_port`].
pub const GUEST_PORT: u8 = 1;

/// Host limits read once when the guest's context is opened.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostLimits {
    pub(crate) attr: QueryDeviceResp,
    /// What the host's on-demand-paging MRs serve; `None`: no ODP (`VRDMA_F_ODP` not offered).
    pub(crate) odp: Option<OdpCaps>,
    /// Of the host port the guest sees.
    pub(crate) port: PortLimits,
}

/// What a port's attributes fix for its lifetime, which the control commands check against:
/// its table sizes, its largest MTU and its link layer. Read once, so that connecting a QP
/// costs no QUERY_PORT per transition (rxe also logs a kernel warning on each for a netdev
/// without a link speed). The port's state and active MTU change and are read when asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PortLimits {
    pub(crate) gid_tbl_len: u32,
    pub(crate) pkey_tbl_len: u16,
    pub(crate) max_mtu: u8,
    pub(crate) link_layer: u8,
}

impl From<&QueryPortResp> for PortLimits {
    fn from(attr: &QueryPortResp) -> Self {
        PortLimits {
            gid_tbl_len: attr.gid_tbl_len,
            pkey_tbl_len: attr.pkey_tbl_len,
            max_mtu: attr.max_mtu,
            link_layer: attr.link_layer,
        }
    }
}

/// Where a guest stands on the network: its GID table, its tenant and its connection manager.
pub(crate) struct GuestAddressing {
    /// Its own entries, or the host's whole table without an identity.
    pub(crate) gids: GidView,
    /// Its tenant and the daemon's table of tenant addresses and QP numbers.
    pub(crate) tenant: TenantLink,
    /// Its ids on the host's connection manager; `None` when the host has none.
    pub(crate) cm: Option<Box<dyn HostCm>>,
    /// The host port's netdev (the scope of its link-local addresses; 0 if unknown).
    pub(crate) netdev_ifindex: u32,
}

/// The parts of one guest's device that the control commands, the doorbell and the event pumps
/// use besides the guest's state.
pub(crate) struct GuestShared {
    id: u64,
    device: Arc<dyn HostDevice>,
    options: Arc<DeviceOptions>,
    limits: HostLimits,
    /// The guest's GID table (its own entries, or the host's without an identity).
    gids: GidView,
    /// Its tenant and the daemon's table of tenant addresses and QP numbers.
    tenant: TenantLink,
    /// The host port's netdev (the scope of its link-local addresses; 0 if unknown).
    netdev_ifindex: u32,
    /// Taken by the control path only for a moment (lock order: state, then doorbells), so a
    /// slow command never delays a doorbell.
    doorbells: Mutex<Doorbells>,
    epoch: AtomicU32,
    /// How often the guest's state was discarded with something in it (a guest resetting in
    /// a loop must not flood the log).
    discards: LogLimit,
    /// Where staged UD send queues live (spec §9.6); `None` when UD is not offered.
    staging: Option<Arc<StagingFile>>,
    /// Its ids on the host's connection manager (dropped before the context: closing it ends
    /// every connection of the guest's QPs first).
    cm: Option<Box<dyn HostCm>>,
    // Declared last so it is dropped last: every host object of the guest goes with it, even
    // one whose explicit destruction failed.
    host: Box<dyn HostContext>,
}

impl GuestShared {
    pub(crate) fn new(
        id: u64,
        device: Arc<dyn HostDevice>,
        options: Arc<DeviceOptions>,
        host: Box<dyn HostContext>,
        limits: HostLimits,
        staging: Option<Arc<StagingFile>>,
        addressing: GuestAddressing,
    ) -> Self {
        let GuestAddressing {
            gids,
            tenant,
            cm,
            netdev_ifindex,
        } = addressing;
        // A staged send's destination is classified when it goes, by the host's addresses
        // then; one the host cannot list counts as its own (the stricter rules).
        let host_device = Arc::clone(&device);
        let reach = Reach::new(
            Arc::clone(&tenant.endpoints),
            Arc::new(move |gid| host_device.delivers_locally(gid).unwrap_or(true)),
        );
        let doorbells = Doorbells::with_reach(
            options.doorbell_slots(),
            reach,
            Arc::new(FaultLog::for_guest(id)),
        );
        GuestShared {
            id,
            tenant,
            netdev_ifindex,
            cm,
            doorbells: Mutex::new(doorbells),
            gids,
            device,
            options,
            limits,
            epoch: AtomicU32::new(0),
            discards: LogLimit::default(),
            staging,
            host,
        }
    }

    /// Connection number (for logs).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Counts a discard that found something: its number, and whether it deserves a line at
    /// info level ([`LogLimit`]).
    pub(crate) fn count_discard(&self) -> (u64, bool) {
        self.discards.next()
    }

    /// The current configuration `epoch`.
    pub(crate) fn epoch(&self) -> u32 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Moves to the next configuration `epoch` (after a discard); returns it.
    pub(crate) fn advance_epoch(&self) -> u32 {
        self.epoch.fetch_add(1, Ordering::AcqRel).wrapping_add(1)
    }

    /// Moves to the epoch after `seen`, whatever the epoch is now (a resumed connection:
    /// `seen` is the lost daemon's); returns it.
    pub(crate) fn start_past(&self, seen: u32) -> u32 {
        let next = seen.wrapping_add(1);
        self.epoch.store(next, Ordering::Release);
        next
    }

    /// Moves to the epoch after `seen` if the epoch is still `seen`; returns the epoch now.
    pub(crate) fn advance_epoch_from(&self, seen: u32) -> u32 {
        let next = seen.wrapping_add(1);
        match self
            .epoch
            .compare_exchange(seen, next, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => next,
            Err(now) => now,
        }
    }

    /// The daemon's options.
    pub(crate) fn options(&self) -> &DeviceOptions {
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

    /// The staging file of enforced UD sends, when UD is offered.
    pub(crate) fn staging(&self) -> Option<&Arc<StagingFile>> {
        self.staging.as_ref()
    }

    /// Its tenant and the daemon's table of tenant addresses and QP numbers.
    pub(crate) fn tenant(&self) -> &TenantLink {
        &self.tenant
    }

    /// The guest's ids on the host's connection manager, if the host has one.
    pub(crate) fn cm(&self) -> Option<&dyn HostCm> {
        self.cm.as_deref()
    }

    /// The host port's netdev: the scope of its link-local addresses (0 if unknown).
    pub(crate) fn netdev_ifindex(&self) -> u32 {
        self.netdev_ifindex
    }

    /// Where this guest's GID tables are read: its host context reads the whole table, or
    /// one entry, in one call each; the device's sysfs files where the kernel cannot.
    pub(crate) fn gid_source(&self) -> ContextGids<'_> {
        ContextGids {
            device: self.device(),
            context: self.host(),
        }
    }

    /// The guest's view of its port's GID table.
    pub(crate) fn gids(&self) -> &GidView {
        &self.gids
    }

    /// The doorbell table and the staged UD send queues.
    pub(crate) fn doorbells(&self) -> &Mutex<Doorbells> {
        &self.doorbells
    }

    /// The host port behind guest port `port`, if the guest has such a port.
    pub(crate) fn host_port(&self, port: u32) -> Option<u8> {
        (port == u32::from(GUEST_PORT)).then_some(self.options.host_port)
    }

    /// The fixed attributes of the one host port the guest sees (every port number
    /// [`GuestShared::host_port`] accepts maps to it).
    pub(crate) fn port_limits(&self) -> &PortLimits {
        &self.limits.port
    }

    /// The guest's number for host port `port` (0 for ports the guest does not see).
    pub(crate) fn guest_port(&self, port: u8) -> u8 {
        if port == self.options.host_port {
            GUEST_PORT
        } else {
            0
        }
    }

    /// Delivers the DEVICE_FATAL owed for an earlier discard (spec §11.1).
    pub(crate) fn announce_discard(&self, guest_io: &GuestIo, state: &mut GuestState) {
        if !std::mem::take(&mut state.announce_discard) {
            return;
        }
        let event = Event {
            event_type: EventType::DeviceFatal,
            handle: 0,
            detail: self.epoch(),
        };
        if let Err(e) = guest_io.events().push(&event.to_bytes(), EventClass::Async) {
            warn!("guest {}: cannot queue DEVICE_FATAL: {e}", self.id);
        }
    }
}

//! What the daemon's command line decides about every guest, checked against the spec's limits.

use std::time::Duration;

use vrdma_spec::control::HEADER_SIZE;

use crate::host::DeviceError;
use crate::identity::{GuestIdentity, IdentityError};
use crate::memory::queue_region::ShmAllocError;
use crate::resources::kind::ResourceError;
use crate::resources::quotas::Quotas;
use crate::vhost_device::shmem::SHMEM_PAGE_SIZE;

/// Default size of the queue region: 64 MiB.
pub const DEFAULT_SHM_SIZE: u64 = 64 << 20;
/// Default largest page list of one REG_MR: 64 Ki pages (256 MiB in 4 KiB pages, one request of
/// 512 KiB).
pub const DEFAULT_MAX_MR_PAGES: u32 = 1 << 16;
/// Default largest number of memory mappings of one MR's window (`--max-mr-mappings`): one
/// per run of pages contiguous in guest RAM. Every MR of up to 32 MiB fits even in scattered
/// 4 KiB pages; a largest MR (64 Ki pages) fits if its pages come in runs of 32 KiB on average,
/// which the guest's buddy allocator and transparent huge pages give large buffers.
pub const DEFAULT_MAX_MR_MAPPINGS: u32 = 8 << 10;
/// Default doorbell poll window in microseconds (`--doorbell-poll-us`); 0 is off.
pub const DEFAULT_DOORBELL_POLL_US: u64 = 0;
/// Longest doorbell poll window: the worker that polls also delivers events, which wait for up
/// to [`POLL_BUDGET_WINDOWS`](crate::datapath::doorbell::POLL_BUDGET_WINDOWS) windows.
pub const MAX_DOORBELL_POLL: Duration = Duration::from_millis(1);
/// When RC and UC QPs get staging rings instead of host queue buffers (spec §9.7):
/// `--staged-rings` and `--staged-cqs` (and the configuration file's `staged_rings`,
/// `staged_cqs`): when QPs (spec §9.7) and CQs (spec §9.8) get staging rings instead of host
/// buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StagedRings {
    /// When the front-end could not take the object's mappings and still keep a reserve of
    /// its slots free: [`staging_reserve`](crate::control::staged_rings::staging_reserve)
    /// for QPs, [`cq_staging_reserve`](crate::control::staged_rings::cq_staging_reserve) for
    /// CQs.
    #[default]
    Auto,
    /// Always (for drivers that negotiated `VRDMA_F_STAGED_RINGS`, `VRDMA_F_STAGED_CQS`):
    /// every connected QP (every CQ) goes through the device's copy; for tests and for
    /// guests with very many QPs.
    Always,
    /// Never: past the front-end's mappings, CREATE_QP and CREATE_CQ fail with `QUOTA`.
    Never,
}

/// What the daemon's command line decides about every guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceOptions {
    /// Per-guest object and MR byte quotas (spec §10).
    pub quotas: Quotas,
    /// Size of the queue region (shared-memory region 0), a power of two of whole pages.
    pub shm_size: u64,
    /// Offer `VRDMA_F_UD` with `VRDMA_F_UD_STAGED_SQ` (spec §9.6: UD sends are checked).
    pub allow_ud: bool,
    /// With `allow_ud`, also create UD QPs for drivers without `VRDMA_F_UD_STAGED_SQ`, whose
    /// UD sends are not checked (spec §12: on rxe they choose their packets' addresses).
    pub allow_unenforced_ud: bool,
    /// Offer `VRDMA_F_MW` (spec §12: on rxe a guest with memory windows can bind them to
    /// another such guest's MRs that allow binding).
    pub allow_memory_windows: bool,
    /// Host port exposed to guests as their port 1.
    pub host_port: u8,
    /// Largest `npages` of one REG_MR.
    pub max_mr_pages: u32,
    /// Most memory mappings of one MR's window (spec §10; over it REG_MR is `INVALID`).
    pub max_mr_mappings: u32,
    /// How long the doorbell worker keeps polling a guest's doorbell area after a doorbell
    /// (offering `VRDMA_F_DOORBELL_POLL`); zero for never.
    pub doorbell_poll: Duration,
    /// When RC and UC QPs get staging rings (offered with `VRDMA_F_STAGED_RINGS`).
    pub staged_rings: StagedRings,
    /// When CQs get staging rings (offered with `VRDMA_F_STAGED_CQS`).
    pub staged_cqs: StagedRings,
    /// The guest's name, addresses and traffic policy (spec §12); without addresses the
    /// guest sees the host port's GID table and GUIDs.
    pub identity: GuestIdentity,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions {
            quotas: Quotas::default(),
            shm_size: DEFAULT_SHM_SIZE,
            allow_ud: false,
            allow_unenforced_ud: false,
            allow_memory_windows: false,
            host_port: 1,
            max_mr_pages: DEFAULT_MAX_MR_PAGES,
            max_mr_mappings: DEFAULT_MAX_MR_MAPPINGS,
            doorbell_poll: Duration::from_micros(DEFAULT_DOORBELL_POLL_US),
            staged_rings: StagedRings::Auto,
            staged_cqs: StagedRings::Auto,
            identity: GuestIdentity::default(),
        }
    }
}

/// Errors of [`DeviceOptions`] and of the creation of a guest's device.
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
    /// `max_mr_mappings` is 0.
    #[error("max MR mappings must be at least 1")]
    MaxMrMappings,
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
    /// The guest's identity is not acceptable.
    #[error("guest identity: {0}")]
    Identity(#[from] IdentityError),
    /// A guest with addresses needs a RoCE (Ethernet) port: its GIDs are IP addresses.
    #[error("guest {name} has addresses but port {port} of {device} is not a RoCE port")]
    AddressesNeedRoce {
        /// Guest name.
        name: String,
        /// Device name.
        device: String,
        /// The port.
        port: u8,
    },
    /// The host device could not be opened or queried.
    #[error("host device: {0}")]
    Host(#[from] DeviceError),
    /// The queue region could not be set up.
    #[error(transparent)]
    Placement(#[from] ShmAllocError),
    /// The staging file or the staging retry timer could not be created.
    #[error("staging rings: {0}")]
    Staging(std::io::Error),
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
        self.identity.validate()?;
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
        if self.max_mr_mappings == 0 {
            return Err(GuestError::MaxMrMappings);
        }
        Ok(())
    }

    /// Slots of the doorbell area: the QP quota rounded up to a power of two (spec §4).
    pub fn doorbell_slots(&self) -> u32 {
        self.quotas.qps.max(1).next_power_of_two()
    }

    /// Largest control request: header, the larger of the REG_MR and REREG_MR bodies and a
    /// full page list (spec §4), so that both accept `max_mr_pages` pages; and never less than
    /// the largest fixed body of any command (MODIFY_QP, CM_CONNECT), whatever `max_mr_pages`.
    pub fn max_request_size(&self) -> usize {
        let body =
            size_of::<vrdma_spec::wire::RegMrReq>().max(size_of::<vrdma_spec::wire::ReregMrReq>());
        HEADER_SIZE + (body + 8 * self.max_mr_pages as usize).max(LARGEST_FIXED_BODY)
    }
}

/// The largest fixed request body of any command, computed once at build time: the control
/// worker asks for the request limit before every command.
const LARGEST_FIXED_BODY: usize = {
    let mut largest = 0;
    let mut i = 0;
    while i < vrdma_spec::Opcode::ALL.len() {
        let len = vrdma_spec::Opcode::ALL[i].request_body_len();
        if len > largest {
            largest = len;
        }
        i += 1;
    }
    largest
};

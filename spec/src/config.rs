//! Device configuration space (64 bytes, read-only, little-endian).

use crate::error::DecodeError;
use crate::{Le16, Le32, Le64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `magic`: the bytes "vRDM" read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"vRDM");
/// Specification major version implemented by this crate.
pub const VERSION_MAJOR: u16 = 1;
/// Specification minor version implemented by this crate.
pub const VERSION_MINOR: u16 = 0;
/// Size of the configuration space (QEMU property `config_size`).
pub const CONFIG_SIZE: usize = 64;

/// Ring-format identifiers (`ring_format`, `RingDesc::format`).
pub mod ring_format {
    /// No data-path format negotiated (the driver acknowledged no ring-format bit).
    pub const NONE: u32 = 0;
    /// Soft-RoCE native queues, see [`crate::rxe_v1`].
    pub const RXE_V1: u32 = 1;
}

wire_struct! {
    /// The configuration space.
    pub struct DeviceConfig {
        /// [`MAGIC`].
        pub magic: Le32,
        /// Specification major version; a driver refuses a major it does not know.
        pub version_major: Le16,
        /// Specification minor version (backwards compatible additions).
        pub version_minor: Le16,
        /// Format of the queue buffers ([`ring_format`]).
        pub ring_format: Le32,
        /// Number of ports (ports are numbered 1..=num_ports).
        pub num_ports: Le32,
        /// Size of shared-memory region `shm_id` in bytes.
        pub shm_size: Le64,
        /// ID of the queue region (always 0).
        pub shm_id: Le32,
        /// log2 of the placement granularity inside the region (host page size).
        pub shm_page_shift: Le32,
        /// Largest device-readable part of a control chain, in bytes.
        pub max_request_size: Le32,
        /// Largest response the device writes, in bytes.
        pub max_response_size: Le32,
        /// Largest `npages` of one REG_MR.
        pub max_mr_pages: Le32,
        /// Slot count the driver's doorbell area must have (a power of two, at least the
        /// per-guest QP quota; see [`crate::doorbell`]).
        pub doorbell_slots: Le32,
        /// Incremented every time the device discards all guest state.
        pub epoch: Le32,
        /// [`odp_caps`] bits: what an `ON_DEMAND` MR may serve on RC QPs (0 unless
        /// `VRDMA_F_ODP` is offered).
        pub odp_rc_caps: Le32,
        /// The same for UC QPs.
        pub odp_uc_caps: Le32,
        /// The same for UD QPs.
        pub odp_ud_caps: Le32,
    }
}
assert_layout!(DeviceConfig, 64, magic @ 0, version_major @ 4, version_minor @ 6,
    ring_format @ 8, num_ports @ 12, shm_size @ 16, shm_id @ 24, shm_page_shift @ 28,
    max_request_size @ 32, max_response_size @ 36, max_mr_pages @ 40,
    doorbell_slots @ 44, epoch @ 48, odp_rc_caps @ 52, odp_uc_caps @ 56, odp_ud_caps @ 60);

/// What on-demand-paging MRs serve, per transport ([`odp_caps`] bits): the host device's
/// report, and the configuration space's with `VRDMA_F_ODP`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OdpCaps {
    /// On RC QPs.
    pub rc: u32,
    /// On UC QPs.
    pub uc: u32,
    /// On UD QPs.
    pub ud: u32,
}

impl DeviceConfig {
    /// The ODP capabilities the configuration describes (meaningful with `VRDMA_F_ODP`).
    pub fn odp_caps(&self) -> OdpCaps {
        OdpCaps {
            rc: self.odp_rc_caps.get(),
            uc: self.odp_uc_caps.get(),
            ud: self.odp_ud_caps.get(),
        }
    }
}

/// Per-transport on-demand-paging capability bits (`ibv_odp_transport_cap_bits`, the kernel's
/// `IB_ODP_SUPPORT_*`), as the host reports them.
pub mod odp_caps {
    /// Sends from an ODP MR.
    pub const SEND: u32 = 1 << 0;
    /// Receives into an ODP MR.
    pub const RECV: u32 = 1 << 1;
    /// RDMA writes into an ODP MR.
    pub const WRITE: u32 = 1 << 2;
    /// RDMA reads from an ODP MR.
    pub const READ: u32 = 1 << 3;
    /// Atomics on an ODP MR.
    pub const ATOMIC: u32 = 1 << 4;
    /// Receives through an SRQ into an ODP MR.
    pub const SRQ_RECV: u32 = 1 << 5;
    /// RDMA FLUSH of an ODP MR.
    pub const FLUSH: u32 = 1 << 6;
    /// Atomic writes into an ODP MR.
    pub const ATOMIC_WRITE: u32 = 1 << 7;
}

impl DeviceConfig {
    /// Parses a configuration-space image and checks the magic and the major version.
    /// Fields a feature bit governs are read only where it was negotiated.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let cfg = exact::<DeviceConfig>(bytes)?;
        if cfg.magic.get() != MAGIC {
            return Err(DecodeError::BadMagic(cfg.magic.get()));
        }
        if cfg.version_major.get() != VERSION_MAJOR {
            return Err(DecodeError::UnsupportedVersion(cfg.version_major.get()));
        }
        Ok(cfg)
    }

    /// The configuration image a device reports.
    pub fn as_wire(&self) -> &[u8] {
        self.as_bytes()
    }
}

/// Reads exactly one `T` from `bytes`.
pub(crate) fn exact<T: FromBytes + KnownLayout + Immutable + Unaligned + Copy>(
    bytes: &[u8],
) -> Result<T, DecodeError> {
    let need = core::mem::size_of::<T>();
    match bytes.len().cmp(&need) {
        core::cmp::Ordering::Less => Err(DecodeError::Short {
            needed: need,
            got: bytes.len(),
        }),
        core::cmp::Ordering::Greater => Err(DecodeError::Trailing {
            expected: need,
            got: bytes.len(),
        }),
        core::cmp::Ordering::Equal => T::read_from_bytes(bytes).map_err(|_| DecodeError::Short {
            needed: need,
            got: bytes.len(),
        }),
    }
}

//! Wire format of the vrdma virtio device (virtio device ID 42).
//!
//! `README.md` next to this crate is the normative specification; this crate is its
//! machine-checked transcription. Every wire struct is `#[repr(C)]`, built only from
//! byte-order-explicit little-endian fields and explicit padding, and its size and field
//! offsets are asserted at compile time against the tables in the specification.
//!
//! Both sides use the same types: the device (`vrdma-backend`) decodes requests and
//! encodes responses, the driver (`vrdma`) does the opposite. All decoders take
//! untrusted bytes and never panic; they return [`DecodeError`], whose
//! [`DecodeError::status`] is the status the device must answer with.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

/// Compile-time layout checks: size and every listed field offset.
macro_rules! assert_layout {
    ($t:ty, $size:expr $(, $field:ident @ $off:expr)* $(,)?) => {
        const _: () = {
            assert!(core::mem::size_of::<$t>() == $size);
            assert!(core::mem::align_of::<$t>() == 1);
            $(assert!(core::mem::offset_of!($t, $field) == $off);)*
        };
    };
}

/// A wire struct: `#[repr(C)]`, alignment 1, convertible from and to bytes.
macro_rules! wire_struct {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident : $t:ty),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, zerocopy::FromBytes, zerocopy::IntoBytes,
            zerocopy::KnownLayout, zerocopy::Immutable, zerocopy::Unaligned)]
        #[repr(C)]
        pub struct $name { $($(#[$fm])* pub $f: $t),* }
    };
}

pub mod attr;
pub mod cm;
pub mod config;
pub mod control;
pub mod doorbell;
pub mod error;
pub mod event;
pub mod rxe_v1;
pub mod status;
pub mod verbs;
pub mod wire;

pub use config::DeviceConfig;
pub use control::{ControlRequest, ControlResponse, Opcode, PageList, RegMr, ResponseBody};
pub use doorbell::DoorbellArea;
pub use error::DecodeError;
pub use event::{Event, EventType};
pub use status::{Status, StatusError};

/// Little-endian integer types used by every wire struct.
pub use zerocopy::little_endian::{U16 as Le16, U32 as Le32, U64 as Le64};

/// VIRTIO device ID of vrdma (the ID reserved for RDMA devices).
pub const VIRTIO_ID_RDMA: u16 = 42;
/// PCI vendor ID of every virtio-pci device.
pub const PCI_VENDOR_ID: u16 = 0x1af4;
/// PCI device ID of a modern (non-transitional) virtio-pci device with ID 42: 0x1040 + 42.
pub const PCI_DEVICE_ID: u16 = 0x1040 + VIRTIO_ID_RDMA;

/// Virtqueue indices.
pub mod queue {
    /// Control requests: driver to device, each chain = request then response.
    pub const CONTROLQ: u16 = 0;
    /// Events: driver supplies device-writable buffers, device returns events.
    pub const EVENTQ: u16 = 1;
    /// Send doorbells: its notification is the doorbell; which QPs rang is read from the
    /// doorbell area ([`crate::doorbell`]). The driver posts no buffers on it.
    pub const DOORBELLQ: u16 = 2;
    /// Number of virtqueues (QEMU property `num_vqs`).
    pub const NUM_QUEUES: u16 = 3;
}

/// Feature bits (device-specific bits 0..=23, plus the generic bits the spec refers to).
pub mod features {
    /// Queue buffers use ring format "rxe v1" (see [`crate::rxe_v1`]).
    pub const VRDMA_F_RING_RXE_V1: u64 = 1 << 0;
    /// Shared receive queues (CREATE_SRQ, MODIFY_SRQ, QUERY_SRQ, DESTROY_SRQ, QPs with an SRQ).
    pub const VRDMA_F_SRQ: u64 = 1 << 1;
    /// Unreliable-datagram QPs and address handles (CREATE_AH, DESTROY_AH).
    pub const VRDMA_F_UD: u64 = 1 << 2;
    /// The device may poll the doorbell area and says so in its `polling` word; drivers then
    /// skip doorbell notifications while it is set ([`crate::doorbell`]).
    pub const VRDMA_F_DOORBELL_POLL: u64 = 1 << 3;
    /// Unreliable-connected QPs (CREATE_QP with `qp_type` UC).
    pub const VRDMA_F_UC: u64 = 1 << 4;
    /// Memory windows: ALLOC_MW, DEALLOC_MW, MRs with `MW_BIND` access, and the bind and
    /// invalidate work requests on the data path (spec §12 says when a device may offer it).
    pub const VRDMA_F_MW: u64 = 1 << 5;
    /// UD QPs post through a staging ring that the device copies, checks and forwards to the
    /// host send queue; their WQEs name address handles by handle (spec §9.6).
    pub const VRDMA_F_UD_STAGED_SQ: u64 = 1 << 6;
    /// The connection manager: CM ids run on the host's rdma_cm, bound to the guest's own
    /// addresses (spec §7.5).
    pub const VRDMA_F_CM: u64 = 1 << 7;
    /// REG_MR_EXTENTS: MRs registered from guest-physical extents (runs of pages) rather than
    /// a list of every page (spec §7.4).
    pub const VRDMA_F_MR_EXTENTS: u64 = 1 << 16;
    /// The device may give RC and UC QPs staging rings instead of host queue buffers (when
    /// the front-end cannot take another mapping), marked [`crate::wire::ring_flags::STAGED`];
    /// the driver rings the QP's doorbell after posting receives to a staged receive queue
    /// (spec §9.7).
    pub const VRDMA_F_STAGED_RINGS: u64 = 1 << 17;
    /// The device may give a CQ a staging ring instead of the host's buffer (when the
    /// front-end cannot take another mapping), marked [`crate::wire::ring_flags::STAGED`]: it
    /// copies the host's completions into it; the driver polls it as any CQ (spec §9.8).
    pub const VRDMA_F_STAGED_CQS: u64 = 1 << 18;
    /// Each directly mapped send queue's description names the QP's handle in the host verbs
    /// context ([`crate::wire::ring_flags::HOST_KICK`]), so that a driver whose front-end holds
    /// that context (the process transport) starts the host's send processing itself instead
    /// of ringing (spec §5.3, [`crate::rxe_v1::kick`]).
    pub const VRDMA_F_HOST_KICK: u64 = 1 << 19;
    /// On-demand paging: REG_MR, REG_MR_EXTENTS and REREG_MR take the `ON_DEMAND` access
    /// flag, which the host registers as an ODP MR (its pages are not pinned on the host), and
    /// the configuration space's `odp_*_caps` say which operations may use such an MR on which
    /// transport (spec §7.4).
    pub const VRDMA_F_ODP: u64 = 1 << 20;
    /// CM_ACCEPT may ask the device to move the id's QP through INIT, RTR and RTS itself
    /// ([`crate::cm::cm_conn_flags::MOVE_QP`]), as librdmacm moves it before it accepts a
    /// request or establishes after a reply: one command instead of seven (spec §7.5).
    pub const VRDMA_F_CM_MOVES_QP: u64 = 1 << 21;
    /// A CM_EVENT notice placed into an event buffer of at least
    /// [`crate::cm::CM_EVENT_INLINE_SIZE`] bytes carries the oldest undelivered CM event whole
    /// after it, which CM_GET_EVENT then no longer answers (spec §7.5).
    pub const VRDMA_F_CM_EVENT_INLINE: u64 = 1 << 22;
    /// Mask of all device-specific bits defined by this version.
    pub const VRDMA_F_ALL: u64 = VRDMA_F_RING_RXE_V1
        | VRDMA_F_SRQ
        | VRDMA_F_UD
        | VRDMA_F_DOORBELL_POLL
        | VRDMA_F_UC
        | VRDMA_F_MW
        | VRDMA_F_UD_STAGED_SQ
        | VRDMA_F_CM
        | VRDMA_F_MR_EXTENTS
        | VRDMA_F_STAGED_RINGS
        | VRDMA_F_STAGED_CQS
        | VRDMA_F_HOST_KICK
        | VRDMA_F_ODP
        | VRDMA_F_CM_MOVES_QP
        | VRDMA_F_CM_EVENT_INLINE;
    /// Mask of the device-specific feature range (bits 0..=23) in which every `VRDMA_F_*` bit
    /// lives; the generic virtio bits lie above it.
    pub const DEVICE_SPECIFIC_MASK: u64 = (1 << 24) - 1;
    /// Mask of the bits that select a ring format; exactly one is offered.
    pub const RING_FORMAT_MASK: u64 = VRDMA_F_RING_RXE_V1;
    /// VIRTIO_F_RING_INDIRECT_DESC (28): the device accepts indirect descriptor tables.
    pub const VIRTIO_F_RING_INDIRECT_DESC: u64 = 1 << 28;
    /// VIRTIO_F_RING_EVENT_IDX (29).
    pub const VIRTIO_F_RING_EVENT_IDX: u64 = 1 << 29;
    /// VIRTIO_F_VERSION_1 (32): mandatory.
    pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;
    /// VIRTIO_F_ACCESS_PLATFORM (33): never offered; addresses are guest-physical.
    pub const VIRTIO_F_ACCESS_PLATFORM: u64 = 1 << 33;
}

/// Shared-memory region facts.
pub mod shm {
    /// VIRTIO shared-memory region ID of the queue region.
    pub const QUEUE_REGION_ID: u8 = 0;
    /// vhost-user protocol feature bit `VHOST_USER_PROTOCOL_F_SHMEM` (bit 22).
    pub const VHOST_USER_PROTOCOL_F_SHMEM: u64 = 1 << 22;
    /// vhost-user protocol feature bit `VHOST_USER_PROTOCOL_F_CONFIG` (bit 9).
    pub const VHOST_USER_PROTOCOL_F_CONFIG: u64 = 1 << 9;
    /// `VHOST_USER_GET_SHMEM_CONFIG` front-end request number.
    pub const VHOST_USER_GET_SHMEM_CONFIG: u32 = 44;
    /// `VHOST_USER_BACKEND_SHMEM_MAP` back-end request number.
    pub const VHOST_USER_BACKEND_SHMEM_MAP: u32 = 9;
    /// `VHOST_USER_BACKEND_SHMEM_UNMAP` back-end request number.
    pub const VHOST_USER_BACKEND_SHMEM_UNMAP: u32 = 10;
    /// `VHOST_USER_FLAG_MAP_RW`: map the fd read/write (queue buffers need it).
    pub const VHOST_USER_FLAG_MAP_RW: u64 = 1 << 0;
    /// PCI BAR QEMU's `vhost-user-test-device-pci` uses for shared memory (drivers must
    /// still locate it through the shared-memory capability).
    pub const QEMU_SHM_BAR: u8 = 4;
    /// `VIRTIO_PCI_CAP_SHARED_MEMORY_CFG` capability type.
    pub const VIRTIO_PCI_CAP_SHARED_MEMORY_CFG: u8 = 8;
}

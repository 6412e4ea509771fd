//! The object-safe host-device traits: what the rest of the backend uses of the host's RDMA
//! device, so that a test can put a fake device behind them.

use std::os::fd::BorrowedFd;

use vrdma_spec::config::OdpCaps;
use vrdma_spec::verbs::{MwType, QpAttrMask};
use vrdma_spec::wire::{GidEntry, QpAttr};

use super::cm::HostCm;
use super::error::Result;
use super::sysfs::DeviceInfo;
use super::types::*;
use super::uverbs::{QueryDeviceResp, QueryPortResp};

/// Where a port's GID entries are read from: the device itself (sysfs, a file per slot) or one
/// of its open contexts (one uverbs call for the whole table, [`ContextGids`]).
pub trait GidSource {
    /// The populated GID entries of a port with their indices, by index.
    fn gid_table(&self, port: u8) -> Result<Vec<(u32, GidEntry)>>;

    /// GID entry `index` of a port, `None` if that slot is empty. Implementations that can
    /// read one entry should: commands look up single entries on hot control paths (every
    /// address vector names its source GID).
    fn gid_entry(&self, port: u8, index: u32) -> Result<Option<GidEntry>> {
        Ok(self
            .gid_table(port)?
            .into_iter()
            .find_map(|(i, entry)| (i == index).then_some(entry)))
    }
}

/// A host RDMA device the backend can serve guests from.
pub trait HostDevice: GidSource + Send + Sync {
    /// What sysfs says about the device.
    fn info(&self) -> &DeviceInfo;

    /// The ring format of queue buffers from this device
    /// (`vrdma_spec::config::ring_format`): it tells the guest which native WQE/CQE layout to
    /// write and read.
    fn ring_format(&self) -> u32;

    /// Whether packets to `gid` stay on this host (an address of one of its interfaces, a
    /// loopback or multicast address): rxe then delivers them itself, by QP number alone.
    /// Asked at every path a guest sets up: a device keeps the host's addresses
    /// ([`super::local_addresses::HostAddresses`]) rather than list them each time.
    fn delivers_locally(&self, gid: &[u8; 16]) -> Result<bool>;

    /// Opens a fresh context: one per guest connection. Dropping it releases every kernel
    /// object created through it.
    fn open_context(&self) -> Result<Box<dyn HostContext>>;

    /// The interface index of the netdev behind `port` (RoCE), `None` if it has none: the
    /// scope of the port's link-local addresses.
    fn netdev_ifindex(&self, _port: u8) -> Option<u32> {
        None
    }

    /// Opens the host's connection manager for one guest (one per guest connection, like
    /// its context); `None` when the host has none, and the device does not offer
    /// `VRDMA_F_CM`.
    fn open_cm(&self) -> Result<Option<Box<dyn HostCm>>> {
        Ok(None)
    }
}

/// The GID table through an open context of `device` where the context can read it whole
/// (`UVERBS_METHOD_QUERY_GID_TABLE`), single entries where it can read them one by one
/// (`UVERBS_METHOD_QUERY_GID_ENTRY`), else through the device (sysfs).
pub struct ContextGids<'a> {
    pub device: &'a dyn HostDevice,
    pub context: &'a dyn HostContext,
}

impl GidSource for ContextGids<'_> {
    fn gid_table(&self, port: u8) -> Result<Vec<(u32, GidEntry)>> {
        match self.context.gid_table(port)? {
            Some(table) => Ok(table),
            None => self.device.gid_table(port),
        }
    }

    fn gid_entry(&self, port: u8, index: u32) -> Result<Option<GidEntry>> {
        match self.context.gid_entry(port, index)? {
            Some(entry) => Ok(entry),
            None => self.device.gid_entry(port, index),
        }
    }
}

/// One guest's context on the host device: its kernel objects and its event sources.
///
/// Queue placement. rxe allocates queue buffers in the kernel; creation returns a
/// [`QueueBuffer`] (offset and length on [`HostContext::queue_fd`]) that the frontend maps once
/// and exposes to the guest, and a send needs [`HostContext::kick_send`]. A hardware provider
/// such as mlx5 places queues differently: its buffers live in memory the creator supplies
/// (guest RAM, registered through a parent-domain style allocator) and its doorbell is a UAR
/// page the guest writes directly. Such a provider would extend the creation requests with the
/// guest buffer to use, return a doorbell-page descriptor alongside (or instead of) the
/// [`QueueBuffer`], and report a different [`HostDevice::ring_format`]; callers already treat
/// buffers as opaque (fd, offset, len) triples and the kick as optional per format.
pub trait HostContext: Send + Sync {
    /// The fd whose mmap yields queue buffers (rxe: the uverbs cmd fd), to pass with SHMEM_MAP.
    fn queue_fd(&self) -> BorrowedFd<'_>;

    /// The uverbs command fd. Only this process may write commands to it (the kernel refuses
    /// writes from other credentials); others may only mmap it.
    fn cmd_fd(&self) -> BorrowedFd<'_>;

    /// The async event fd (readable when [`HostContext::read_async_event`] has something).
    fn async_fd(&self) -> BorrowedFd<'_>;

    /// The populated GID entries of `port` with their indices, by index, read in one call;
    /// `None` when this context cannot (the caller reads them through the device).
    fn gid_table(&self, _port: u8) -> Result<Option<Vec<(u32, GidEntry)>>> {
        Ok(None)
    }

    /// GID entry `index` of `port` read in one call (`Some(None)`: the slot is empty); `None`
    /// when this context cannot (the caller reads it through the device).
    fn gid_entry(&self, _port: u8, _index: u32) -> Result<Option<Option<GidEntry>>> {
        Ok(None)
    }

    /// The context's completion channel fd (readable when
    /// [`HostContext::read_comp_event`] has something).
    fn comp_channel_fd(&self) -> BorrowedFd<'_>;

    /// Number of completion vectors CQs may use.
    fn num_comp_vectors(&self) -> u32;

    /// Device attributes, as the kernel reports them (`ib_uverbs_query_device_resp`): the
    /// host's limits, before any guest's quota.
    fn query_device(&self) -> Result<QueryDeviceResp>;

    /// Whether the device registers on-demand-paging MRs (`IB_ODP_SUPPORT`), and for what;
    /// `None` when it does not.
    fn odp_caps(&self) -> Result<Option<OdpCaps>> {
        Ok(None)
    }

    /// Whether the device's on-demand paging serves an MR registered at an iova other than
    /// its address, as every MR of a guest is (the guest's iova over a window of this
    /// process).
    fn odp_serves_any_iova(&self) -> bool {
        true
    }

    /// Attributes of a port (numbered from 1), as the kernel reports them
    /// (`ib_uverbs_query_port_resp`).
    fn query_port(&self, port: u8) -> Result<QueryPortResp>;

    /// Allocates a protection domain.
    fn alloc_pd(&self) -> Result<PdHandle>;

    /// Frees a protection domain (fails while objects use it).
    fn dealloc_pd(&self, pd: PdHandle) -> Result<()>;

    /// Registers `[start, start + length)` of this process with the device, addressed by the
    /// peer and the guest at `iova`.
    fn reg_mr(&self, init: &MrInit) -> Result<Mr>;

    /// Deregisters an MR (fails while memory windows are bound to it).
    fn dereg_mr(&self, mr: MrHandle) -> Result<()>;

    /// Allocates a memory window of `mw_type` in `pd`. Binds happen on the data path.
    fn alloc_mw(&self, pd: PdHandle, mw_type: MwType) -> Result<Mw>;

    /// Frees a memory window (bound or not).
    fn dealloc_mw(&self, mw: MwHandle) -> Result<()>;

    /// Creates a CQ.
    fn create_cq(&self, init: &CqInit) -> Result<Cq>;

    /// Destroys a CQ (fails while QPs use it).
    fn destroy_cq(&self, cq: CqHandle) -> Result<()>;

    /// Gives a CQ a new buffer of at least `cqe` entries, carrying over the completions it
    /// holds (rxe: EINVAL when `cqe` is below their number). From then on the host writes
    /// completions to the new buffer only.
    fn resize_cq(&self, cq: CqHandle, cqe: u32) -> Result<CqResize>;

    /// Arms a CQ: its next (solicited) completion raises one completion event.
    fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<()>;

    /// Creates a QP.
    fn create_qp(&self, init: &QpInit) -> Result<Qp>;

    /// Changes QP attributes / state (legacy attribute set, `mask` selects fields).
    fn modify_qp(&self, qp: QpHandle, attr: &QpAttr, mask: QpAttrMask) -> Result<()>;

    /// Reads QP attributes.
    fn query_qp(&self, qp: QpHandle, mask: QpAttrMask) -> Result<QpInfo>;

    /// Destroys a QP.
    fn destroy_qp(&self, qp: QpHandle) -> Result<()>;

    /// Creates an SRQ.
    fn create_srq(&self, init: &SrqInit) -> Result<Srq>;

    /// Changes SRQ size or limit; a resize returns the new buffer to map (the old one is freed
    /// when unmapped).
    fn modify_srq(&self, srq: SrqHandle, modify: &SrqModify) -> Result<Option<QueueBuffer>>;

    /// Destroys an SRQ (fails while QPs use it).
    fn destroy_srq(&self, srq: SrqHandle) -> Result<()>;

    /// Creates an address handle for UD sends.
    fn create_ah(&self, init: &AhInit) -> Result<Ah>;

    /// Destroys an address handle.
    fn destroy_ah(&self, ah: AhHandle) -> Result<()>;

    /// Tells the device that new WQEs sit in the QP's send queue (rxe: an empty POST_SEND,
    /// which runs the requester). Allocation-free: called once per doorbell.
    fn kick_send(&self, qp: QpHandle) -> Result<()>;

    /// Next pending async event, without blocking.
    fn read_async_event(&self) -> Result<Option<AsyncEvent>>;

    /// Next pending completion event, without blocking.
    fn read_comp_event(&self) -> Result<Option<CompEvent>>;
}

//! The device context: configuration, limits, control commands, doorbell area and events.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use log::debug;
use parking_lot::Mutex;
use vrdma_spec::config::{ring_format, OdpCaps, CONFIG_SIZE};
use vrdma_spec::control::{ControlRequest, ControlResponse, Opcode, ResponseBody, HEADER_SIZE};
use vrdma_spec::features;
use vrdma_spec::wire::{
    DeviceAttr, GidEntry, PortAttr, QueryPortReq, QueryTableReq, SetDoorbellAreaReq,
    GID_TABLE_BATCH, GID_TABLE_END,
};
use vrdma_spec::{DeviceConfig, Le32, Le64};

use super::command::unexpected_body;
use super::doorbell::DoorbellRegion;
use super::error::{ProtocolError, Result, VerbsError};
use super::event::{DeviceEvent, EventDispatch, Wanted};
use super::gid_cache::{GidCache, GidTable};
use crate::dma::DmaBuffer;
use crate::transport::agent::AgentTransport;
use crate::transport::pci::{PciOptions, PciTransport, SysfsPciFunction};
use crate::transport::process::{ProcessOptions, ProcessTransport};
use crate::transport::{SharedMemory, Transport, TransportError};

/// Host page sizes (the configuration's `shm_page_shift`, the placement granularity in the
/// queue region) this library accepts: 4 KiB .. 1 GiB. A limit of this library on the host,
/// not the REG_MR `page_shift` range of the control protocol.
const SUPPORTED_SHM_PAGE_SHIFTS: std::ops::RangeInclusive<u32> = 12..=30;

/// An open vrdma device: the `ibv_context` of this library.
///
/// Cheap to clone; every object created from it keeps it alive.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

/// Shared state of a context.
pub(crate) struct ContextInner {
    // Declared (so dropped) first: when this is the last reference to the transport, closing
    // it ends the device's use of the doorbell area before the area's memory is freed.
    channel: CommandSender,
    config: DeviceConfig,
    features: u64,
    device_attr: DeviceAttr,
    pub(crate) doorbell: DoorbellRegion,
    pub(crate) events: EventDispatch,
    /// Dropped by the events read through `events` that make it out of date.
    gid_cache: GidCache,
}

/// The transport, and the control commands sent over it.
struct CommandSender {
    transport: Arc<dyn Transport>,
    buffers: Mutex<CommandBuffers>,
}

/// Encoding buffers reused by every command, so that a command allocates only when it is
/// larger than every earlier one.
#[derive(Default)]
struct CommandBuffers {
    request: Vec<u8>,
    response: Vec<u8>,
}

impl Context {
    /// Opens the device behind `transport`: checks its configuration, reads its attributes,
    /// and registers this context's doorbell area.
    pub fn open(transport: Arc<dyn Transport>) -> Result<Context> {
        let raw = transport.device_config();
        let config = DeviceConfig::decode(&raw[..raw.len().min(CONFIG_SIZE)])
            .map_err(ProtocolError::Config)?;
        let shift = config.shm_page_shift.get();
        if !SUPPORTED_SHM_PAGE_SHIFTS.contains(&shift) {
            return Err(ProtocolError::ConfigValue {
                field: "shm_page_shift",
                value: shift.into(),
            }
            .into());
        }
        let features = transport.device_features();
        let format = config.ring_format.get();
        let expected = if features & features::VRDMA_F_RING_RXE_V1 != 0 {
            ring_format::RXE_V1
        } else {
            ring_format::NONE
        };
        if format != expected {
            return Err(ProtocolError::ConfigValue {
                field: "ring_format",
                value: format.into(),
            }
            .into());
        }
        let channel = CommandSender {
            transport,
            buffers: Mutex::new(CommandBuffers::default()),
        };
        let ResponseBody::QueryDevice(attr) = channel.execute(&ControlRequest::QueryDevice)? else {
            return Err(unexpected_body(Opcode::QueryDevice));
        };
        let device_may_poll = features & features::VRDMA_F_DOORBELL_POLL != 0;
        let slots = config.doorbell_slots.get();
        let doorbell = match DoorbellRegion::registered(&channel.transport, slots, device_may_poll)?
        {
            Some(registered) => registered,
            None => {
                let doorbell =
                    DoorbellRegion::new(channel.transport.dma(), slots, device_may_poll)?;
                channel.execute(&ControlRequest::SetDoorbellArea(SetDoorbellAreaReq {
                    gpa: Le64::new(doorbell.gpa()),
                    slots: Le32::new(doorbell.slots()),
                    reserved: Le32::ZERO,
                }))?;
                doorbell
            }
        };
        let inner = ContextInner {
            channel,
            config,
            features,
            device_attr: attr,
            doorbell,
            events: EventDispatch::new(config.epoch.get()),
            gid_cache: GidCache::default(),
        };
        debug!(
            "vrdma context: {} port(s), ring format {format}, {} doorbell slots, fw {}",
            inner.config.num_ports.get(),
            inner.doorbell.slots(),
            inner.device_attr.fw_ver()
        );
        Ok(Context {
            inner: Arc::new(inner),
        })
    }

    /// Connects to a vrdma backend at `socket_path` as a process-mode frontend (default
    /// options) and opens the device.
    pub fn connect_process(socket_path: impl AsRef<Path>) -> Result<Context> {
        let transport = ProcessTransport::connect(socket_path, ProcessOptions::default())?;
        Context::open(Arc::new(transport))
    }

    /// Connects through the guest agent listening at `agent_socket` and opens the device.
    pub fn connect_agent(agent_socket: impl AsRef<Path>) -> Result<Context> {
        let transport = AgentTransport::connect(agent_socket)?;
        Context::open(Arc::new(transport))
    }

    /// Opens the vrdma PCI device of this guest at `address` (`dddd:bb:dd.f`), or the first
    /// one found, through sysfs (needs root and reserved hugepages; see
    /// [`SysfsPciFunction`]), with default options.
    pub fn open_pci(address: Option<&str>) -> Result<Context> {
        let function = SysfsPciFunction::open(address).map_err(|e| TransportError::Io {
            what: "opening the vrdma PCI device",
            source: std::io::Error::other(e),
        })?;
        let transport = PciTransport::open(Arc::new(function), PciOptions::default())?;
        Context::open(Arc::new(transport))
    }

    /// The transport under this context.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.inner.channel.transport
    }

    /// The device configuration read at open.
    pub fn config(&self) -> &DeviceConfig {
        &self.inner.config
    }

    /// Device-specific feature bits negotiated with the device.
    pub fn features(&self) -> u64 {
        self.inner.features
    }

    /// What on-demand-paging MRs (`AccessFlags::ON_DEMAND`) serve on each transport; `None`
    /// when the device does not register them (`VRDMA_F_ODP` not negotiated).
    pub fn odp_caps(&self) -> Option<OdpCaps> {
        (self.inner.features & features::VRDMA_F_ODP != 0).then(|| self.inner.config.odp_caps())
    }

    /// Device attributes and this guest's limits, as read at open.
    pub fn query_device(&self) -> &DeviceAttr {
        &self.inner.device_attr
    }

    /// Attributes of port `port` (1-based).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        let req = ControlRequest::QueryPort(QueryPortReq {
            port_num: Le32::new(port.into()),
            reserved: Le32::ZERO,
        });
        match self.inner.execute(&req)? {
            ResponseBody::QueryPort(attr) => Ok(attr),
            _ => Err(unexpected_body(Opcode::QueryPort)),
        }
    }

    /// GID `index` of port `port`, asked of the device (one QUERY_GID); `None` for an empty
    /// table entry. A returned entry is valid and its `gid_type()` is a
    /// [`vrdma_spec::verbs::GidType`]. [`Self::gid_table`] answers repeated queries without
    /// a command each.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Option<GidEntry>> {
        let req = ControlRequest::QueryGid(QueryTableReq {
            port_num: Le32::new(port.into()),
            index: Le32::new(index),
        });
        let ResponseBody::QueryGid(entry) = self.inner.execute(&req)? else {
            return Err(unexpected_body(Opcode::QueryGid));
        };
        if !entry.is_valid() {
            return Ok(None);
        }
        // A valid entry's type is checked here, once: users may rely on `gid_type()` being `Ok`.
        entry.gid_type().map_err(|v| ProtocolError::ResponseValue {
            opcode: Opcode::QueryGid,
            field: "gid_type",
            value: v.into(),
        })?;
        Ok(Some(entry))
    }

    /// The GID table of port `port` from this context's cache, read from the device (see
    /// [`Self::read_gid_table`]) when none is kept: when it was never read, when an event read
    /// since (GID_CHANGE, PORT_ACTIVE, PORT_ERR of the port; DEVICE_FATAL, EVENTS_LOST) made
    /// it out of date, or when it is older than the cache's lifetime
    /// ([`Self::set_gid_cache_lifetime`], default [`super::DEFAULT_GID_CACHE_LIFETIME`]).
    /// Design and guarantees: `verbs/gid_cache.rs`.
    pub fn gid_table(&self, port: u8) -> Result<Arc<GidTable>> {
        self.inner
            .gid_cache
            .table(port, || self.read_gid_table(port))
    }

    /// Sets how long [`Self::gid_table`] keeps a table that no event made out of date: the
    /// staleness bound of programs that never read events. Zero reads the device every time.
    pub fn set_gid_cache_lifetime(&self, lifetime: Duration) {
        self.inner.gid_cache.set_lifetime(lifetime);
    }

    /// The GID table of port `port` as the device has it now: its length (QUERY_PORT's
    /// `gid_tbl_len`) and its populated entries ([`Self::query_gid_table`]).
    pub fn read_gid_table(&self, port: u8) -> Result<GidTable> {
        let len = self.query_port(port)?.gid_tbl_len.get();
        // A port without GID indices has no table to ask for (the device refuses index 0).
        let populated = if len == 0 {
            Vec::new()
        } else {
            self.query_gid_table(port)?
        };
        if let Some((index, _)) = populated.iter().find(|(index, _)| *index >= len) {
            return Err(ProtocolError::ResponseValue {
                opcode: Opcode::QueryGidTable,
                field: "index",
                value: (*index).into(),
            }
            .into());
        }
        Ok(GidTable::new(len, populated))
    }

    /// The populated GID entries of port `port` with their indices, by increasing index
    /// (QUERY_GID_TABLE: one command per [`GID_TABLE_BATCH`] entries instead of one per index).
    /// Every entry is valid and its `gid_type()` is a [`vrdma_spec::verbs::GidType`].
    pub fn query_gid_table(&self, port: u8) -> Result<Vec<(u32, GidEntry)>> {
        let mut table = Vec::new();
        let mut next = 0;
        loop {
            let req = ControlRequest::QueryGidTable(QueryTableReq {
                port_num: Le32::new(port.into()),
                index: Le32::new(next),
            });
            let ResponseBody::QueryGidTable(batch) = self.inner.execute(&req)? else {
                return Err(unexpected_body(Opcode::QueryGidTable));
            };
            let bad = |field, value: u32| ProtocolError::ResponseValue {
                opcode: Opcode::QueryGidTable,
                field,
                value: value.into(),
            };
            let count = batch.count.get();
            let entries = batch
                .entries
                .get(..count as usize)
                .ok_or(bad("count", count))?;
            for e in entries {
                let index = e.index.get();
                // Increasing indices at or after the request's: also what makes the loop end.
                if index < next || table.last().is_some_and(|(last, _)| *last >= index) {
                    return Err(bad("index", index).into());
                }
                let entry = e.entry();
                if !entry.is_valid() {
                    return Err(bad("flags", entry.flags.get()).into());
                }
                entry.gid_type().map_err(|v| bad("gid_type", v))?;
                table.push((index, entry));
            }
            let after = batch.next_index.get();
            if after == GID_TABLE_END {
                return Ok(table);
            }
            // A device that does not advance would make this loop forever.
            if after <= next || count as usize != GID_TABLE_BATCH {
                return Err(bad("next_index", after).into());
            }
            next = after;
        }
    }

    /// P_Key `index` of port `port`.
    pub fn query_pkey(&self, port: u8, index: u32) -> Result<u16> {
        let req = ControlRequest::QueryPkey(QueryTableReq {
            port_num: Le32::new(port.into()),
            index: Le32::new(index),
        });
        match self.inner.execute(&req)? {
            ResponseBody::QueryPkey(entry) => Ok(entry.pkey.get()),
            _ => Err(unexpected_body(Opcode::QueryPkey)),
        }
    }

    /// A zeroed buffer of at least `len` bytes in memory the device can reach, page aligned:
    /// what [`Pd::register`](super::Pd::register) registers.
    pub fn alloc_buffer(&self, len: usize) -> Result<DmaBuffer> {
        self.alloc_buffer_aligned(len, crate::dma::PAGE_SIZE)
    }

    /// Like [`alloc_buffer`](Self::alloc_buffer), aligned to `align` (a power of two), e.g.
    /// to the huge pages guest RAM is made of, so that the buffer starts on one.
    pub fn alloc_buffer_aligned(&self, len: usize, align: usize) -> Result<DmaBuffer> {
        Ok(self.inner.transport().dma().alloc(len, align)?)
    }

    /// Fails if the device went away (the backend died, in process mode) or announced that
    /// this context's objects are lost (DEVICE_FATAL, as a VM's device does when its
    /// back-end was replaced, spec §11.5), without waiting: for programs that poll their
    /// CQs, which then simply stay empty. Events read meanwhile are kept for their waiters
    /// ([`next_event`](Self::next_event), [`Cq::wait_event`](super::Cq::wait_event)).
    pub fn check_alive(&self) -> Result<()> {
        self.inner.transport().check_alive()?;
        match self.inner.lost_state()? {
            Some(epoch) => Err(VerbsError::DeviceLost { epoch }),
            None => Ok(()),
        }
    }

    /// Waits up to `timeout` (`None`: forever) for the next device event; `Ok(None)` if none
    /// came. Completion events taken here are not seen by [`Cq::wait_event`](super::Cq::wait_event).
    pub fn next_event(&self, timeout: Option<Duration>) -> Result<Option<DeviceEvent>> {
        self.inner.wait_event(Wanted::Any, timeout)
    }
}

impl CommandSender {
    /// Executes one control command and returns the body of its success response.
    fn execute(&self, request: &ControlRequest<'_>) -> Result<ResponseBody> {
        let opcode = request.opcode();
        let mut guard = self.buffers.lock();
        let buffers = &mut *guard;
        buffers.request.clear();
        request.encode_into(&mut buffers.request);
        buffers.response.clear();
        buffers
            .response
            .resize(HEADER_SIZE + opcode.response_body_len(), 0);
        let used = self
            .transport
            .round_trip(&buffers.request, &mut buffers.response)?;
        let bytes = buffers
            .response
            .get(..used)
            .ok_or(ProtocolError::ResponseValue {
                opcode,
                field: "used length",
                value: used as u64,
            })?;
        decode_response(opcode, bytes)
    }

    /// Executes independent commands as one batch ([`Transport::round_trip_batch`]): one
    /// round trip where the transport can. The outer error is the transport's (nothing is
    /// known of the commands' outcome); each command's own result is in the vector.
    fn execute_batch(&self, requests: &[ControlRequest<'_>]) -> Result<Vec<Result<ResponseBody>>> {
        let encoded: Vec<Vec<u8>> = requests.iter().map(ControlRequest::to_vec).collect();
        let mut responses: Vec<Vec<u8>> = requests
            .iter()
            .map(|r| vec![0u8; HEADER_SIZE + r.opcode().response_body_len()])
            .collect();
        let mut commands: Vec<(&[u8], &mut [u8])> = encoded
            .iter()
            .map(Vec::as_slice)
            .zip(responses.iter_mut().map(Vec::as_mut_slice))
            .collect();
        let used = self.transport.round_trip_batch(&mut commands)?;
        Ok(requests
            .iter()
            .zip(&responses)
            .zip(used)
            .map(|((request, response), used)| {
                let opcode = request.opcode();
                let bytes = response.get(..used).ok_or(ProtocolError::ResponseValue {
                    opcode,
                    field: "used length",
                    value: used as u64,
                })?;
                decode_response(opcode, bytes)
            })
            .collect())
    }
}

/// A command's answer: its success body, or its status as an error.
fn decode_response(opcode: Opcode, bytes: &[u8]) -> Result<ResponseBody> {
    match ControlResponse::decode(opcode, bytes)
        .map_err(|source| ProtocolError::Response { opcode, source })?
    {
        ControlResponse::Ok(body) => Ok(body),
        ControlResponse::Err(source) => Err(VerbsError::Status { opcode, source }),
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("features", &format_args!("{:#x}", self.inner.features))
            .field("doorbell_slots", &self.inner.doorbell.slots())
            .finish_non_exhaustive()
    }
}

impl ContextInner {
    /// Executes one control command and returns the body of its success response.
    pub(crate) fn execute(&self, request: &ControlRequest<'_>) -> Result<ResponseBody> {
        self.channel.execute(request)
    }

    /// Executes a command whose success carries no body.
    pub(crate) fn execute_empty(&self, request: &ControlRequest<'_>) -> Result<()> {
        self.execute(request).map(drop)
    }

    /// Executes independent commands in one batch (see [`CommandSender::execute_batch`]).
    pub(crate) fn execute_batch(
        &self,
        requests: &[ControlRequest<'_>],
    ) -> Result<Vec<Result<ResponseBody>>> {
        self.channel.execute_batch(requests)
    }

    pub(crate) fn transport(&self) -> &dyn Transport {
        self.channel.transport.as_ref()
    }

    /// Waits for an event (see [`EventDispatch::wait`]), dropping the cached GID tables it
    /// makes out of date as it is read; all of them if the event queue fails (the device may
    /// be gone: queries must ask it again, and fail if so).
    pub(crate) fn wait_event(
        &self,
        wanted: Wanted,
        timeout: Option<Duration>,
    ) -> Result<Option<DeviceEvent>> {
        let read = self
            .events
            .wait(self.transport(), wanted, timeout, &|event| {
                self.gid_cache.observe(event)
            });
        if read.is_err() {
            self.gid_cache.invalidate_all();
        }
        read
    }

    /// The epoch of a DEVICE_FATAL that announced the loss of this context's objects.
    pub(crate) fn lost_state(&self) -> Result<Option<u32>> {
        self.events
            .lost_state(self.transport(), &|event| self.gid_cache.observe(event))
    }

    pub(crate) fn shared_memory(&self) -> SharedMemory {
        self.transport().shared_memory()
    }

    pub(crate) fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// Device-specific feature bits negotiated with the device.
    pub(crate) fn features(&self) -> u64 {
        self.features
    }

    pub(crate) fn device_attr(&self) -> &DeviceAttr {
        &self.device_attr
    }

    /// Whether memory windows (`VRDMA_F_MW`) were negotiated.
    pub(crate) fn has_memory_windows(&self) -> bool {
        self.features & features::VRDMA_F_MW != 0
    }

    /// Whether UD sends go through staging rings (`VRDMA_F_UD_STAGED_SQ`): their WQEs then
    /// name address handles by handle (spec §9.6).
    pub(crate) fn has_staged_ud(&self) -> bool {
        self.features & features::VRDMA_F_UD_STAGED_SQ != 0
    }

    /// Whether send queues may name their host kick (`VRDMA_F_HOST_KICK`, spec §5.3).
    pub(crate) fn has_host_kick(&self) -> bool {
        self.features & features::VRDMA_F_HOST_KICK != 0
    }

    /// Whether the data path (ring format rxe v1) was negotiated.
    pub(crate) fn has_rxe_v1(&self) -> bool {
        self.features & features::VRDMA_F_RING_RXE_V1 != 0
    }
}

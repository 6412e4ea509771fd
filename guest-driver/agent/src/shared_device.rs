//! VM mode: the agent drives the vrdma PCI function itself and shares that one device among
//! every process it serves.
//!
//! The device has one handle namespace per guest, so the agent keeps the processes apart:
//! - **objects**: [`Ownership`] records who created each object and refuses a command that
//!   names another process's (`BAD_HANDLE`, as for a handle that does not exist), charges
//!   per-process quotas, and destroys a process's objects when it goes;
//! - **memory**: each process gets its own memfd ([`ProcessMemory`]), which it names by
//!   process addresses; the agent refuses a registration naming anything else
//!   (`translate::ProcessRam`), pins the pages a registration names for as long as it lives (charged
//!   to the process's user, [`PinBudget`]) and rewrites it into their guest-physical
//!   addresses;
//! - **events**: each event goes to the process owning its CQ, QP, SRQ or MR; port and device
//!   events go to all;
//! - **the connection manager**: CM ids are objects like the others; the agent fetches the
//!   device's CM events itself and answers each process's CM_GET_EVENT from its own events
//!   ([`CmEvents`]).
//!
//! What processes share, and so can disturb for each other (see the README): the queue region
//! (the BAR every process maps: a process can write any process's rings) and the doorbell
//! area (a process can ring any QP, or punch the area's page out of everyone's mappings).
//! Memory windows (their keys are device-wide in rxe) are not served here.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use log::{debug, error, info, warn};
use parking_lot::Mutex;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vrdma::dma::{RamPages, GUEST_RAM_BASE};
use vrdma::transport::agent::protocol::{
    event_socket_pair, Frame, Outcome, ProtocolError, SharedDevice as SharedPart, Welcome,
};
use vrdma::transport::pci::{PciOptions, PciTransport, SysfsPciFunction};
use vrdma::transport::{Transport, TransportError};
use vrdma_spec::cm::CM_EVENT_NONE;
use vrdma_spec::config::CONFIG_SIZE;
use vrdma_spec::control::{CmRequest, CmResponseBody, HEADER_SIZE, MAX_CM_RESPONSE_SIZE};
use vrdma_spec::event::{Subject, EVENT_SIZE};
use vrdma_spec::features::{VRDMA_F_CM, VRDMA_F_CM_EVENT_INLINE, VRDMA_F_MR_EXTENTS, VRDMA_F_MW};
use vrdma_spec::wire::SetDoorbellAreaReq;
use vrdma_spec::{
    ControlRequest, ControlResponse, DeviceConfig, Event, EventType, Le32, Le64, Opcode,
    ResponseBody,
};

use crate::doorbell_pacing::DoorbellPacing;
use crate::pinned::{PinnedMemory, ProcessMemory, RegistrationPin};
use crate::session::{receive_hello, Peer, SessionError, POLL_SLICE};
use vrdma_guestd::cm_events::{self, CmEvents, Routed};
use vrdma_guestd::ownership::{
    self, ClientId, CommandPlan, ObjectKind, Ownership, Quotas, Refusal,
};
use vrdma_guestd::pin_budget::{PinBudget, PinLimits};

/// Size of a hugepage, the granule of the doorbell area's memory (physically contiguous).
const HUGEPAGE: usize = 2 << 20;

/// Features the agent does not serve to its processes (see the module documentation).
const NOT_SERVED: u64 = VRDMA_F_MW;

/// What the shared device is opened with.
#[derive(Clone, Debug)]
pub struct SharedOptions {
    /// PCI address of the vrdma function, or the first one found.
    pub address: Option<String>,
    /// Registrable memory of each process, in bytes (pinned where registrations cover it).
    pub process_ram_size: usize,
    /// Per-process object limits.
    pub quotas: Quotas,
    /// How much the agent pins for registrations, per user and in all.
    pub pin_limits: PinLimits,
    /// The least time between two notifications of the doorbell queue.
    pub doorbell_min_interval: Duration,
}

/// The device and everything the agent keeps about the processes sharing it.
pub struct SharedDevice {
    device: PciTransport,
    /// The function's sysfs directory.
    function_dir: PathBuf,
    ownership: Mutex<Ownership>,
    /// Every process's undelivered CM events (locked after `ownership` where both are).
    cm_events: Mutex<CmEvents>,
    /// Each served process's end of its event socket, and how many events it missed.
    listeners: Mutex<HashMap<ClientId, EventListener>>,
    next_client: AtomicU64,
    /// The BAR holding the queue region, opened read-write, and the region's offset in it.
    queue_region: File,
    queue_region_offset: u64,
    doorbell_area: PinnedMemory,
    doorbell_area_len: u64,
    /// Processes write it to have the agent notify the doorbell queue.
    doorbell_kick: EventFd,
    doorbell_min_interval: Duration,
    features: u64,
    config: Vec<u8>,
    max_mr_pages: u32,
    process_ram_size: usize,
    pin_budget: Arc<PinBudget>,
    /// Pinned ranges a process may have at once: one per MR of its quota (a registration
    /// takes one per run of consecutive pages, per GiB), at most io_uring's table size.
    pin_entries: u32,
}

/// The most entries an io_uring buffer table has (`IORING_MAX_REG_BUFFERS`).
const MAX_PIN_ENTRIES: u32 = 1 << 14;

/// One served process's memory and the pins of its live MRs.
struct ProcessPins {
    memory: ProcessMemory,
    /// Per MR handle, the pins its pages hold (more than one after a failed REREG_MR, whose
    /// new pages the device may have been given).
    by_mr: HashMap<u32, Vec<RegistrationPin>>,
}

/// Decodes and plans a process's request, or says why VM mode does not forward it: what
/// [`ownership::decode`] refuses, and memory windows — rxe's memory keys are device-wide and
/// BIND_MW is posted on the data path, which the agent never sees, so a process's window could
/// be bound over another process's MR.
fn served(request: &[u8]) -> Result<(CommandPlan, ControlRequest<'_>), Refusal> {
    let req = ownership::decode(request)?;
    if req.opcode() == Opcode::AllocMw {
        return Err(Refusal::Unsupported(Opcode::AllocMw));
    }
    Ok((ownership::plan_of(&req)?, req))
}

struct EventListener {
    socket: OwnedFd,
    lost: u32,
}

impl SharedDevice {
    /// Opens the PCI function, registers the doorbell area every process shares, and starts
    /// the threads that relay doorbells and route events.
    pub fn open(options: &SharedOptions) -> Result<Arc<Self>, String> {
        let function = SysfsPciFunction::open(options.address.as_deref())
            .map_err(|e| format!("cannot open the vrdma PCI device: {e}"))?;
        let address = function.address().to_owned();
        // The agent fetches every CM event itself (CM_GET_EVENT) and routes it to its owner.
        let pci_options = PciOptions {
            device_features: PciOptions::default().device_features & !VRDMA_F_CM_EVENT_INLINE,
            ..PciOptions::default()
        };
        let device = PciTransport::open(Arc::new(function), pci_options)
            .map_err(|e| format!("cannot start the vrdma PCI device {address}: {e}"))?;
        let region = device
            .device()
            .capabilities()
            .shared_memory
            .ok_or("the vrdma device has no queue region")?;
        let resource = format!("/sys/bus/pci/devices/{address}/resource{}", region.bar);
        let queue_region = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&resource)
            .map_err(|e| format!("{resource}: {e}"))?;
        let config_bytes = device.device_config().to_vec();
        let config = DeviceConfig::decode(&config_bytes[..config_bytes.len().min(CONFIG_SIZE)])
            .map_err(|e| format!("device configuration: {e}"))?;
        let slots = config.doorbell_slots.get();
        let area_len = vrdma_spec::doorbell::area_bytes(slots);
        let doorbell_area =
            PinnedMemory::new(area_len.next_multiple_of(HUGEPAGE), RamPages::Huge2M)
                .map_err(|e| format!("the doorbell area (hugepages): {e}"))?;
        let gpa = doorbell_area
            .contiguous_address()
            .ok_or("the doorbell area is not physically contiguous")?;
        let request = ControlRequest::SetDoorbellArea(SetDoorbellAreaReq {
            gpa: Le64::new(gpa),
            slots: Le32::new(slots),
            reserved: Le32::ZERO,
        })
        .to_vec();
        let mut response = [0u8; MAX_CM_RESPONSE_SIZE];
        let used = device
            .round_trip(&request, &mut response)
            .map_err(|e| format!("SET_DOORBELL_AREA: {e}"))?;
        ControlResponse::decode(Opcode::SetDoorbellArea, &response[..used])
            .map_err(|e| e.to_string())
            .and_then(|r| r.into_result().map(drop).map_err(|e| e.to_string()))
            .map_err(|e| format!("SET_DOORBELL_AREA: {e}"))?;
        let doorbell_kick = EventFd::new(EFD_NONBLOCK).map_err(|e| format!("eventfd: {e}"))?;
        let shared = Arc::new(SharedDevice {
            function_dir: PathBuf::from(format!("/sys/bus/pci/devices/{address}")),
            features: device.device_features() & !NOT_SERVED,
            config: config_bytes,
            max_mr_pages: config.max_mr_pages.get(),
            device,
            ownership: Mutex::new(Ownership::new(options.quotas)),
            cm_events: Mutex::new(CmEvents::new(CmEvents::limit_for(options.quotas.cm_ids))),
            listeners: Mutex::new(HashMap::new()),
            next_client: AtomicU64::new(1),
            queue_region,
            queue_region_offset: region.offset,
            // All of it: a hugetlb file is mapped in whole hugepages.
            doorbell_area_len: doorbell_area.ram().len() as u64,
            doorbell_area,
            doorbell_kick,
            doorbell_min_interval: options.doorbell_min_interval,
            process_ram_size: options.process_ram_size,
            pin_budget: PinBudget::new(options.pin_limits),
            pin_entries: options.quotas.mrs.clamp(1, MAX_PIN_ENTRIES),
        });
        info!("vrdma PCI device {address}: shared by every process (queue region {resource})");
        for (name, job) in [
            ("doorbells", Self::relay_doorbells as fn(&SharedDevice)),
            ("events", Self::route_events),
        ] {
            let shared = shared.clone();
            thread::Builder::new()
                .name(name.into())
                .spawn(move || job(&shared))
                .map_err(|e| format!("cannot start the {name} thread: {e}"))?;
        }
        Ok(shared)
    }

    /// The PCI function's sysfs directory.
    pub fn function_dir(&self) -> &Path {
        &self.function_dir
    }

    /// Serves one process until it goes, then destroys what it left and unpins its memory.
    pub fn serve(&self, socket: UnixStream, peer: Peer) {
        let client = self.next_client.fetch_add(1, Ordering::Relaxed);
        match self.serve_inner(&socket, peer, client) {
            Ok(()) => info!("process {} (uid {}) left", peer.pid, peer.uid),
            Err(e) => info!("process {} (uid {}) dropped: {e}", peer.pid, peer.uid),
        }
    }

    fn serve_inner(
        &self,
        socket: &UnixStream,
        peer: Peer,
        client: ClientId,
    ) -> Result<(), SessionError> {
        receive_hello(socket)?;
        let memory = match ProcessMemory::new(
            self.process_ram_size,
            GUEST_RAM_BASE,
            peer.uid,
            self.pin_budget.clone(),
            self.pin_entries,
        ) {
            Ok(memory) => memory,
            Err(e) => {
                let why = format!("no memory for this process: {e}");
                let _ = Frame::Refused(why.clone()).send(socket);
                return Err(SessionError::Refused(why));
            }
        };
        let (ours, theirs) = event_socket_pair()?;
        // SAFETY: the eventfd lives as long as `self`; the borrow only lasts for the clone.
        let kick = unsafe { BorrowedFd::borrow_raw(self.doorbell_kick.as_raw_fd()) };
        let welcome = Welcome {
            device_features: self.features,
            config: self.config.clone(),
            shm_size: self.device.shared_memory().len() as u64,
            ram_gpa: GUEST_RAM_BASE,
            ram_len: memory.ram().len() as u64,
            ram: memory.ram().fd().try_clone_to_owned()?,
            doorbell_kick: kick.try_clone_to_owned()?,
            events: theirs,
            shared: Some(SharedPart {
                queue_region_offset: self.queue_region_offset,
                queue_region: self.queue_region.as_fd().try_clone_to_owned()?,
                doorbell_area_len: self.doorbell_area_len,
                doorbell_area: self.doorbell_area.ram().fd().try_clone_to_owned()?,
            }),
        };
        Frame::Welcome(welcome).send(socket)?;
        self.listeners.lock().insert(
            client,
            EventListener {
                socket: ours,
                lost: 0,
            },
        );
        info!("process {} (uid {}) connected", peer.pid, peer.uid);
        let mut pins = ProcessPins {
            memory,
            by_mr: HashMap::new(),
        };
        let result = self.run_commands(socket, client, &mut pins);
        // Its events end with it; then its objects, then its memory.
        self.listeners.lock().remove(&client);
        for mr in self.release(client, peer) {
            // The device may still write into the MR's pages: they stay pinned (and so never
            // reused), and charged, for the agent's life rather than reach someone else.
            if let Some(kept) = pins.by_mr.remove(&mr) {
                let bytes: u64 = kept.iter().map(RegistrationPin::bytes).sum();
                warn!(
                    "process {}: MR {mr:#x} stays pinned ({bytes} bytes)",
                    peer.pid
                );
                std::mem::forget(kept);
            }
        }
        result
    }

    fn run_commands(
        &self,
        socket: &UnixStream,
        client: ClientId,
        pins: &mut ProcessPins,
    ) -> Result<(), SessionError> {
        let extents = self.device.device_features() & VRDMA_F_MR_EXTENTS != 0;
        let mut response = vec![0u8; MAX_CM_RESPONSE_SIZE];
        loop {
            let request = match Frame::receive(socket) {
                Ok(Frame::Execute { request, .. }) => request,
                Ok(_) => return Err(ProtocolError::Malformed("expected a command").into()),
                Err(ProtocolError::Closed) => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            let (outcome, answer) =
                match self.execute(client, pins, &request, extents, &mut response) {
                    Ok(answer) => (Outcome::Answered, answer),
                    Err(TransportError::Disconnected) => (Outcome::Disconnected, Vec::new()),
                    Err(e) => (Outcome::Failed(e.to_string()), Vec::new()),
                };
            Frame::Executed {
                outcome,
                response: answer,
                changes: Vec::new(),
            }
            .send(socket)?;
        }
    }

    /// One command of `client`: checked, its memory pinned and rewritten to guest-physical
    /// addresses, executed, recorded. A refusal is an answer with the status the device gives
    /// for the same defect.
    fn execute(
        &self,
        client: ClientId,
        pins: &mut ProcessPins,
        request: &[u8],
        extents: bool,
        response: &mut [u8],
    ) -> Result<Vec<u8>, TransportError> {
        let refuse = |status| Ok(Ownership::refusal_response(status));
        let (plan, decoded) = match served(request) {
            Ok(planned) => planned,
            Err(refusal) => {
                debug!("client {client}: {refusal}");
                return refuse(refusal.status());
            }
        };
        // Pinned before the ownership lock is taken: pinning a large MR takes long, and other
        // processes' commands do not wait for it.
        let registration = match pins.memory.process_ram().registration(&decoded) {
            Ok(registration) => registration,
            Err(status) => return refuse(status),
        };
        let pinned = match &registration {
            Some(registration) => match pins.memory.pin(&registration.runs()) {
                Ok(pin) => {
                    match registration.rewrite(|a| pin.guest_page(a), extents, self.max_mr_pages) {
                        Ok(rewritten) => Some((pin, rewritten)),
                        Err(status) => return refuse(status),
                    }
                }
                Err(e) => {
                    debug!("client {client}: {}: {e}", plan.opcode.name());
                    return refuse(e.status());
                }
            },
            None => None,
        };
        let to_device = pinned
            .as_ref()
            .map_or(request, |(_, bytes)| bytes.as_slice());
        let cm = match &decoded {
            ControlRequest::Cm(CmRequest::GetEvent) => return Ok(self.next_cm_event(client)),
            ControlRequest::Cm(cm) => Some(cm),
            _ => None,
        };
        // The lock is not held while the device executes, so that no process's command (a
        // large registration takes long) holds up the others' checks or the routing of
        // events. That is safe because only this process's own thread destroys its objects:
        // what it names stays its own until its command is recorded. A handle it destroys
        // may be reused by another process's create before this record; `record` then leaves
        // the new owner's entry alone.
        {
            let ownership = self.ownership.lock();
            if let Err(status) = ownership.check(client, &plan) {
                return refuse(status);
            }
        }
        if cm.is_some_and(CmRequest::makes_events) {
            if let Err(status) = self.cm_events.lock().admit(client) {
                return refuse(status);
            }
        }
        let used = self.device.round_trip(to_device, response)?;
        let answer = &response[..used.min(response.len())];
        self.ownership.lock().record(client, &plan, answer);
        pins.record(&decoded, &plan, answer, pinned.map(|(pin, _)| pin));
        match cm {
            Some(CmRequest::DestroyId(r)) if ownership::succeeded(plan.opcode, answer) => {
                Ok(self.cm_id_destroyed(client, r.handle.get()))
            }
            _ => Ok(answer.to_vec()),
        }
    }

    /// CM_GET_EVENT of `client`: its oldest undelivered event, or none.
    fn next_cm_event(&self, client: ClientId) -> Vec<u8> {
        let event = self.cm_events.lock().next_or_none(client);
        ControlResponse::Ok(ResponseBody::Cm(CmResponseBody::GetEvent(event))).to_vec()
    }

    /// `client` destroyed its CM id `id`: the answer says how many of the id's events the
    /// process received, and connect requests to it that it never saw end (their new ids are
    /// destroyed, which rejects the peers).
    fn cm_id_destroyed(&self, client: ClientId, id: u32) -> Vec<u8> {
        let (delivered, orphans) = self.cm_events.lock().destroyed(client, id);
        for orphan in orphans {
            self.ownership.lock().disown(ObjectKind::CmId, orphan);
            if let Err(e) = self.destroy_on_device(ObjectKind::CmId, orphan) {
                warn!("client {client}: destroying the unseen connect request {orphan}: {e}");
            }
        }
        ControlResponse::Ok(ResponseBody::Cm(CmResponseBody::DestroyId(
            vrdma_spec::cm::CmDestroyIdResp {
                events_delivered: Le32::new(delivered),
                reserved: Le32::ZERO,
            },
        )))
        .to_vec()
    }

    /// Destroys `handle` of `kind` on the device (for the agent itself, never a process).
    fn destroy_on_device(&self, kind: ObjectKind, handle: u32) -> Result<(), String> {
        let request = Ownership::destroy_request(kind, handle);
        let opcode = ownership::plan(&request)
            .map(|p| p.opcode)
            .map_err(|e| e.to_string())?;
        let mut response = [0u8; HEADER_SIZE + 64];
        let used = self
            .device
            .round_trip(&request, &mut response)
            .map_err(|e| e.to_string())?;
        ControlResponse::decode(opcode, &response[..used])
            .map_err(|e| e.to_string())?
            .into_result()
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// Fetches every CM event the device holds and queues each for the process owning its id;
    /// then tells those processes. No lock is held while the device answers.
    fn fetch_cm_events(&self) {
        let request = ControlRequest::Cm(CmRequest::GetEvent).to_vec();
        let mut response = vec![0u8; MAX_CM_RESPONSE_SIZE];
        let mut told = Vec::new();
        {
            loop {
                let decoded = self
                    .device
                    .round_trip(&request, &mut response)
                    .map_err(|e| e.to_string())
                    .and_then(|used| {
                        ControlResponse::decode(Opcode::CmGetEvent, &response[..used])
                            .map_err(|e| e.to_string())
                    });
                let event = match decoded {
                    Ok(ControlResponse::Ok(ResponseBody::Cm(CmResponseBody::GetEvent(e)))) => e,
                    Ok(other) => {
                        warn!("CM_GET_EVENT answered {other:?}");
                        break;
                    }
                    Err(e) => {
                        warn!("CM_GET_EVENT: {e}");
                        break;
                    }
                };
                if event.event.get() == CM_EVENT_NONE {
                    break;
                }
                let routed = {
                    let mut ownership = self.ownership.lock();
                    let routed = self.cm_events.lock().route(&mut ownership, event);
                    if let Routed::Refused(id) = routed {
                        ownership.disown(ObjectKind::CmId, id);
                    }
                    routed
                };
                match routed {
                    Routed::Queued(client) => told.push((client, cm_events::notice(&event))),
                    Routed::Refused(id) => {
                        debug!("connect request {id} refused (no listener, or past a bound)");
                        if let Err(e) = self.destroy_on_device(ObjectKind::CmId, id) {
                            warn!("destroying the refused connect request {id}: {e}");
                        }
                    }
                    Routed::Dropped => debug!(
                        "CM event {} of id {} nobody owns dropped",
                        event.event.get(),
                        event.id.get()
                    ),
                }
            }
        }
        let mut listeners = self.listeners.lock();
        for (client, notice) in told {
            if let Some(listener) = listeners.get_mut(&client) {
                listener.deliver(&notice);
            }
        }
    }

    /// Destroys every object `client` left, in dependency order; the MRs that could not be.
    /// The objects stay recorded as the process's (so nobody else can name them) until all
    /// were tried, but the lock is taken only to read and to forget them: the other
    /// processes' commands and events go on meanwhile.
    fn release(&self, client: ClientId, peer: Peer) -> Vec<u32> {
        let left = {
            let ownership = self.ownership.lock();
            if ownership.counts(client).iter().any(|&(_, n)| n > 0) {
                debug!("process {} left {:?}", peer.pid, ownership.counts(client));
            }
            ownership.release_order(client)
        };
        let mut kept_mrs = Vec::new();
        for &(kind, handle) in &left {
            if let Err(e) = self.destroy_on_device(kind, handle) {
                warn!("process {}: destroying {kind:?} {handle}: {e}", peer.pid);
                if kind == ObjectKind::Mr {
                    kept_mrs.push(handle);
                }
            }
        }
        self.ownership.lock().forget_client(client);
        self.cm_events.lock().forget(client);
        if !left.is_empty() {
            info!(
                "process {}: released {} objects it left",
                peer.pid,
                left.len()
            );
        }
        kept_mrs
    }

    /// Notifies the doorbell queue for every process that asked (one register write for any
    /// number of asks since the last), at most once per `--doorbell-min-interval-us`
    /// ([`DoorbellPacing`]).
    fn relay_doorbells(&self) {
        // Every notified send of every process waits for this thread: it runs at the highest
        // nice level, so that busy-polling applications do not keep it waiting for a time
        // slice. (Not a real-time class, and paced: a process that writes the eventfd without
        // end must not be able to take a CPU from everyone.)
        // SAFETY: gettid has no preconditions; setpriority changes this thread only.
        let rc = unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, -20)
        };
        if rc != 0 {
            warn!(
                "cannot raise the doorbell thread's priority: {}",
                std::io::Error::last_os_error()
            );
        }
        // The pacing's sleeps are tens of µs: the default timer slack (50 µs) would double them.
        // SAFETY: PR_SET_TIMERSLACK changes this thread's slack only.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong) };
        let mut pacing = DoorbellPacing::new(self.doorbell_min_interval);
        loop {
            let mut pollfd = libc::pollfd {
                fd: self.doorbell_kick.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd on the stack.
            if unsafe { libc::poll(&mut pollfd, 1, -1) } < 0 {
                continue;
            }
            let wait = pacing.wait(Instant::now());
            if !wait.is_zero() {
                thread::sleep(wait);
            }
            // Read after the wait: the asks that came meanwhile are served by this one.
            if self.doorbell_kick.read().is_err() {
                continue;
            }
            if let Err(e) = self.device.notify_doorbell() {
                error!("cannot notify the device's doorbell queue: {e}");
            }
            pacing.notified(Instant::now());
        }
    }

    /// Sends each device event to the process it concerns.
    fn route_events(&self) {
        let mut bytes = [0u8; 64];
        loop {
            let len = match self.device.next_event(&mut bytes, Some(POLL_SLICE)) {
                Ok(None) => continue,
                Ok(Some(len)) => len.min(bytes.len()),
                Err(e) => {
                    error!("the device's event queue failed: {e}");
                    std::process::exit(1);
                }
            };
            let Ok(event) = Event::decode(&bytes[..len]) else {
                debug!("event not understood: {:?}", &bytes[..len]);
                continue;
            };
            let owner_kind = match event.event_type.subject() {
                Subject::Cq => Some(ObjectKind::Cq),
                Subject::Qp => Some(ObjectKind::Qp),
                Subject::Srq => Some(ObjectKind::Srq),
                Subject::Mr => Some(ObjectKind::Mr),
                Subject::Port | Subject::Device => None,
                Subject::CmId => {
                    self.fetch_cm_events();
                    continue;
                }
            };
            if event.event_type == EventType::EventsLost
                && self.device.device_features() & VRDMA_F_CM != 0
            {
                // CM_EVENT notices may be among the lost: the events wait on the device.
                self.fetch_cm_events();
            }
            let owner = owner_kind.map(|kind| self.ownership.lock().owner(kind, event.handle));
            let mut listeners = self.listeners.lock();
            for (client, listener) in listeners.iter_mut() {
                if owner.is_some_and(|owner| owner != Some(*client)) {
                    continue;
                }
                listener.deliver(&event);
            }
            drop(listeners);
            if event.event_type == EventType::DeviceFatal {
                // Every object of every process is gone: the processes learn it from the
                // event and from their sockets closing; the service manager restarts the agent.
                error!("the device lost its state (DEVICE_FATAL); the agent stops");
                std::process::exit(1);
            }
        }
    }
}

impl ProcessPins {
    /// Keeps or releases the pins of a registration command the device answered `answer`:
    /// `pin` is what the command's memory was pinned with.
    fn record(
        &mut self,
        request: &ControlRequest<'_>,
        plan: &CommandPlan,
        answer: &[u8],
        pin: Option<RegistrationPin>,
    ) {
        let succeeded = ownership::succeeded(plan.opcode, answer);
        match (request, pin) {
            (ControlRequest::RegMr(_) | ControlRequest::RegMrExtents(_), Some(pin))
                if succeeded =>
            {
                match ownership::created_handle(ObjectKind::Mr, plan.opcode, answer) {
                    Some(mr) => self.by_mr.entry(mr).or_default().push(pin),
                    // Registered, but which MR is unknown: keep the pages pinned.
                    None => std::mem::forget(pin),
                }
            }
            (ControlRequest::ReregMr(m), Some(pin)) => {
                let pins = self.by_mr.entry(m.req.mr.get()).or_default();
                if succeeded {
                    // The old pages are no longer the MR's.
                    pins.clear();
                }
                pins.push(pin);
            }
            (ControlRequest::DeregMr(_), None) if succeeded => {
                if let Some((ObjectKind::Mr, mr)) = plan.destroys {
                    self.by_mr.remove(&mr);
                }
            }
            // A registration the device refused: its pin goes.
            _ => {}
        }
    }
}

impl EventListener {
    /// Sends `event` without waiting: a process that does not read its events loses them
    /// (and later gets an EVENTS_LOST with their number) rather than holding up the others.
    fn deliver(&mut self, event: &Event) {
        if self.lost > 0 {
            let lost = Event {
                event_type: EventType::EventsLost,
                handle: 0,
                detail: self.lost,
            };
            if !self.send(&lost) {
                self.lost = self.lost.saturating_add(1);
                return;
            }
            self.lost = 0;
        }
        if !self.send(event) {
            self.lost = self.lost.saturating_add(1);
        }
    }

    fn send(&self, event: &Event) -> bool {
        let bytes: [u8; EVENT_SIZE] = event.to_bytes();
        // SAFETY: sends a local buffer on a socket we own, without blocking.
        let sent = unsafe {
            libc::send(
                self.socket.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        sent == bytes.len() as isize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(cq: u32) -> Event {
        Event {
            event_type: EventType::Completion,
            handle: cq,
            detail: 0,
        }
    }

    fn receive(socket: &OwnedFd) -> Option<Event> {
        let mut bytes = [0u8; 64];
        // SAFETY: receives into a local buffer of that length, without blocking.
        let got = unsafe {
            libc::recv(
                socket.as_raw_fd(),
                bytes.as_mut_ptr().cast(),
                bytes.len(),
                libc::MSG_DONTWAIT,
            )
        };
        (got > 0).then(|| Event::decode(&bytes[..got as usize]).unwrap())
    }

    #[test]
    fn memory_windows_are_not_served_and_the_connection_manager_is() {
        let alloc_mw = ControlRequest::AllocMw(vrdma_spec::wire::AllocMwReq {
            pd: Le32::new(1),
            mw_type: Le32::new(1),
        });
        assert_eq!(
            served(&alloc_mw.to_vec()).map(|(plan, _)| plan.opcode),
            Err(Refusal::Unsupported(Opcode::AllocMw))
        );
        assert_eq!(NOT_SERVED & VRDMA_F_CM, 0);
        let get_event = ControlRequest::Cm(CmRequest::GetEvent);
        let bytes = get_event.to_vec();
        let (plan, req) = served(&bytes).unwrap();
        assert_eq!((plan.opcode, req), (Opcode::CmGetEvent, get_event));
        let alloc_pd = ControlRequest::AllocPd.to_vec();
        let (plan, req) = served(&alloc_pd).unwrap();
        assert_eq!(
            (plan.opcode, req),
            (Opcode::AllocPd, ControlRequest::AllocPd)
        );
    }

    #[test]
    fn a_process_that_does_not_read_loses_events_and_is_told_how_many() {
        let (ours, theirs) = event_socket_pair().unwrap();
        let mut listener = EventListener {
            socket: ours,
            lost: 0,
        };
        // Deliver until the socket is full; nothing blocks.
        let mut sent = 0u32;
        while listener.lost == 0 {
            listener.deliver(&completion(sent + 1));
            sent += 1;
            assert!(sent < 1_000_000, "the socket never filled");
        }
        for _ in 0..4 {
            listener.deliver(&completion(7));
        }
        assert_eq!(listener.lost, 5);
        // The process reads everything that fit, in order.
        let mut delivered = 0u32;
        while let Some(event) = receive(&theirs) {
            delivered += 1;
            assert_eq!(event, completion(delivered));
        }
        assert_eq!(delivered, sent - 1);
        // The next event comes after the count of those it missed.
        listener.deliver(&completion(9));
        assert_eq!(
            receive(&theirs),
            Some(Event {
                event_type: EventType::EventsLost,
                handle: 0,
                detail: 5,
            })
        );
        assert_eq!(receive(&theirs), Some(completion(9)));
        assert_eq!(listener.lost, 0);
    }
}

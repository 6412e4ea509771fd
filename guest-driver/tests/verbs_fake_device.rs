//! The verbs API against a fake vrdma device: a `Transport` that decodes every command with the
//! spec crate and answers it from its own state, places rxe v1 queue buffers (with correct
//! headers) in a shared-memory region it maps and unmaps per object (`mprotect`, so a use after
//! DESTROY crashes the test), and plays a tiny loopback Soft-RoCE "kernel" that drains the
//! doorbell area and executes SEND, RDMA WRITE and RDMA READ between its QPs through the
//! registered page lists, writing native CQEs.

use std::collections::{HashMap, VecDeque};
use std::mem::size_of;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use vrdma::dma::{DmaBuffer, GuestRam, GUEST_RAM_BASE, PAGE_SIZE};
use vrdma::spec::config::{ring_format, DeviceConfig, MAGIC};
use vrdma::spec::control::{ControlRequest, ControlResponse, Opcode, ResponseBody};
use vrdma::spec::event::{Event, EventType};
use vrdma::spec::rxe_v1::{
    num_slots_for, recv_wqe_size, send_wqe_size, IbUverbsWc, RxeAv, RxeRecvWqe, RxeSendWqe, RxeSge,
};
use vrdma::spec::verbs::{self as sv, check_modify_qp, qp_attr, QpState, QpType as SpecQpType};
use vrdma::spec::wire::*;
use vrdma::spec::{features, DoorbellArea, Le16, Le32, Le64, Status, StatusError};
use vrdma::transport::{DmaMemory, SharedMemory, Transport, TransportError};
use vrdma::verbs::{
    AccessFlags, Ah, AhAttr, ConnectOptions, Context, Cq, DeviceEvent, Gid, GidType, GlobalRoute,
    Mr, Mtu, Pd, PostError, PostSendError, ProtocolError, Qp, QpAttr, QpAttrMask, QpCaps,
    QpInitAttr, QpType, RecvWr, RemoteQp, SendFlags, SendWr, Sge, VerbsError, WcFlags, WcOpcode,
    WcStatus, WorkCompletion, WrOpcode,
};
use zerocopy::{FromZeros, IntoBytes};

const SHM_SIZE: usize = 4 << 20;
const RAM_SIZE: usize = 16 << 20;
const DOORBELL_SLOTS: u32 = 64;
const MAX_MR_PAGES: u32 = 1024;
const MAX_QP_WR: u32 = 256;
const MAX_SGE: u32 = 4;
const MAX_INLINE: u32 = 128;
const MAX_QP_RD_ATOM: u32 = 8;
const MAX_QP_INIT_RD_ATOM: u32 = 4;
const LOCAL_GID: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
const WAIT: Duration = Duration::from_secs(10);

// ------------------------------------------------------------------------------------------
// The fake transport.

/// Guest RAM of the fake: allocations and translations from a memfd, like the process
/// transport.
struct FakeDma(Arc<GuestRam>);

impl DmaMemory for FakeDma {
    fn alloc(&self, len: usize, align: usize) -> Result<DmaBuffer, TransportError> {
        Ok(self.0.alloc(len, align)?)
    }

    fn translate(&self, addr: *const u8, len: usize) -> Result<Vec<u64>, TransportError> {
        Ok(self.0.translate(addr, len)?)
    }
}

/// The shared-memory region: reserved inaccessible, made accessible extent by extent.
struct Region {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: a mapping owned by the region for its whole life; accesses go through raw pointers
// and atomics under the fake's own protocol.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    fn new(len: usize) -> Region {
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        Region {
            base: NonNull::new(addr.cast()).unwrap(),
            len,
        }
    }

    /// SHMEM_MAP of a zeroed extent.
    fn map(&self, offset: usize, len: usize) -> *mut u8 {
        assert!(offset + len <= self.len);
        // SAFETY: the extent lies in our reservation.
        let ptr = unsafe { self.base.as_ptr().add(offset) };
        // SAFETY: changes the protection of pages of our own mapping.
        let rc = unsafe { libc::mprotect(ptr.cast(), len, libc::PROT_READ | libc::PROT_WRITE) };
        assert_eq!(rc, 0);
        // SAFETY: just made writable; nobody else uses the extent yet.
        unsafe { ptr.write_bytes(0, len) };
        ptr
    }

    /// SHMEM_UNMAP: later accesses fault.
    fn unmap(&self, offset: usize, len: usize) {
        // SAFETY: the extent lies in our reservation.
        let ptr = unsafe { self.base.as_ptr().add(offset) };
        // SAFETY: changes the protection of pages of our own mapping.
        let rc = unsafe { libc::mprotect(ptr.cast(), len, libc::PROT_NONE) };
        assert_eq!(rc, 0);
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the reservation made in `new`.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// A misbehaviour to apply to the next response.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    /// Answer the next command of this opcode with this error, without executing it.
    Fail(Opcode, StatusError),
    /// Cut the next success response of this opcode by one byte.
    Truncate(Opcode),
    /// Describe the next created ring beyond the end of the region.
    RingOutsideRegion,
    /// Write a wrong `index_mask` into the next created ring's header.
    RingHeaderMismatch,
}

struct FakeTransport {
    config: DeviceConfig,
    features: u64,
    dma: FakeDma,
    region: Region,
    device: Mutex<Device>,
    notifications: AtomicUsize,
    events: Mutex<VecDeque<Event>>,
    event_posted: Condvar,
}

impl FakeTransport {
    fn new() -> Arc<FakeTransport> {
        Self::with(
            config(),
            features::VRDMA_F_RING_RXE_V1 | features::VRDMA_F_UD,
        )
    }

    fn with(config: DeviceConfig, features: u64) -> Arc<FakeTransport> {
        let ram = GuestRam::new(RAM_SIZE).unwrap();
        Arc::new(FakeTransport {
            config,
            features,
            dma: FakeDma(ram.clone()),
            region: Region::new(SHM_SIZE),
            device: Mutex::new(Device::new(ram)),
            notifications: AtomicUsize::new(0),
            events: Mutex::new(VecDeque::new()),
            event_posted: Condvar::new(),
        })
    }

    fn device(&self) -> MutexGuard<'_, Device> {
        self.device.lock().unwrap()
    }

    fn notifications(&self) -> usize {
        self.notifications.load(Ordering::SeqCst)
    }

    fn inject(&self, fault: Fault) {
        self.device().fault = Some(fault);
    }

    fn post_event(&self, event: Event) {
        self.events.lock().unwrap().push_back(event);
        self.event_posted.notify_all();
    }

    /// The "kernel": drains the doorbell area and processes the send queues it names.
    fn run_kernel(&self) -> usize {
        let events = self.device().run_kernel();
        let n = events.len();
        for e in events {
            self.post_event(e);
        }
        n
    }
}

impl Transport for FakeTransport {
    fn device_features(&self) -> u64 {
        self.features
    }

    fn device_config(&self) -> &[u8] {
        self.config.as_wire()
    }

    fn execute(&self, request: &[u8], response: &mut [u8]) -> Result<usize, TransportError> {
        let answer = match ControlRequest::decode(request) {
            Ok(req) => self.device().execute(request, &req, &self.region),
            Err(e) => ControlResponse::from(e).to_vec(),
        };
        if answer.len() > response.len() {
            return Err(TransportError::DeviceFailure(
                "response buffer too small".into(),
            ));
        }
        response[..answer.len()].copy_from_slice(&answer);
        Ok(answer.len())
    }

    fn notify_doorbell(&self) -> Result<(), TransportError> {
        self.notifications.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn next_event(
        &self,
        out: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<Option<usize>, TransportError> {
        let mut events = self.events.lock().unwrap();
        loop {
            if let Some(event) = events.pop_front() {
                let bytes = event.to_bytes();
                let n = bytes.len().min(out.len());
                out[..n].copy_from_slice(&bytes[..n]);
                return Ok(Some(n));
            }
            match timeout {
                None => events = self.event_posted.wait(events).unwrap(),
                Some(t) => {
                    let (guard, result) = self.event_posted.wait_timeout(events, t).unwrap();
                    events = guard;
                    if result.timed_out() && events.is_empty() {
                        return Ok(None);
                    }
                }
            }
        }
    }

    fn event_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    fn shared_memory(&self) -> SharedMemory {
        SharedMemory::new(Some(self.region.base), self.region.len)
    }

    fn dma(&self) -> &dyn DmaMemory {
        &self.dma
    }
}

fn config() -> DeviceConfig {
    DeviceConfig {
        magic: Le32::new(MAGIC),
        version_major: Le16::new(1),
        version_minor: Le16::new(0),
        ring_format: Le32::new(ring_format::RXE_V1),
        num_ports: Le32::new(1),
        shm_size: Le64::new(SHM_SIZE as u64),
        shm_id: Le32::ZERO,
        shm_page_shift: Le32::new(12),
        max_request_size: Le32::new(8 + 32 + 8 * MAX_MR_PAGES),
        max_response_size: Le32::new(200),
        max_mr_pages: Le32::new(MAX_MR_PAGES),
        doorbell_slots: Le32::new(DOORBELL_SLOTS),
        epoch: Le32::ZERO,
        reserved: [0; 12],
    }
}

// ------------------------------------------------------------------------------------------
// The fake device's state.

/// The kernel's view of one queue buffer in the region.
#[derive(Clone, Copy)]
struct Ring {
    offset: usize,
    map_len: usize,
    base: *mut u8,
    mask: u32,
    log2: u32,
}

impl Ring {
    fn word(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: header words lie in the mapped extent (mapped while the object lives), are
        // aligned, and both sides access them atomically.
        unsafe { AtomicU32::from_ptr(self.base.add(offset).cast()) }
    }

    fn producer(&self) -> &AtomicU32 {
        self.word(128)
    }

    fn consumer(&self) -> &AtomicU32 {
        self.word(256)
    }

    fn slot(&self, index: u32) -> *mut u8 {
        // SAFETY: a masked index names a slot inside the extent.
        unsafe {
            self.base
                .add(384 + (((index & self.mask) as usize) << self.log2))
        }
    }

    fn desc(&self) -> RingDesc {
        RingDesc {
            shm_offset: Le64::new(self.offset as u64),
            map_len: Le32::new(self.map_len as u32),
            num_slots: Le32::new(self.mask + 1),
            log2_slot_size: Le32::new(self.log2),
            format: Le32::new(ring_format::RXE_V1),
            db_offset: Le64::ZERO,
            db_len: Le32::ZERO,
            reserved: Le32::ZERO,
        }
    }

    /// Next entry the consumer (the kernel, for SQ/RQ) would take, if any.
    fn peek(&self) -> Option<u32> {
        let c = self.consumer().load(Ordering::Relaxed) & self.mask;
        (self.producer().load(Ordering::Acquire) & self.mask != c).then_some(c)
    }

    fn pop(&self, index: u32) {
        self.consumer()
            .store((index + 1) & self.mask, Ordering::Release);
    }
}

struct FakeMr {
    pd: u32,
    lkey: u32,
    rkey: u32,
    iova: u64,
    len: u64,
    access: u32,
    pages: Vec<u64>,
}

struct FakeCq {
    ring: Ring,
    armed: bool,
}

struct FakeQp {
    pd: u32,
    qpn: u32,
    qp_type: SpecQpType,
    state: QpState,
    send_cq: u32,
    recv_cq: u32,
    sq_sig_all: bool,
    doorbell_index: u32,
    sq: Ring,
    rq: Ring,
    dest_qpn: u32,
    attr: QpAttrWire,
}

type QpAttrWire = vrdma::spec::wire::QpAttr;

struct Device {
    ram: Arc<GuestRam>,
    log: Vec<(Opcode, Vec<u8>)>,
    fault: Option<Fault>,
    next_handle: u32,
    next_key: u32,
    pds: Vec<u32>,
    mrs: HashMap<u32, FakeMr>,
    cqs: HashMap<u32, FakeCq>,
    qps: HashMap<u32, FakeQp>,
    ahs: HashMap<u32, (u32, u32)>,
    doorbell: Option<u64>,
    doorbell_head: u32,
    region_pages: Vec<bool>,
}

// SAFETY: the raw pointers are into the region and guest RAM, both owned by the transport that
// owns this device; every access happens under the device mutex or atomically.
unsafe impl Send for Device {}

type Answer = Result<ResponseBody, Status>;

impl Device {
    fn new(ram: Arc<GuestRam>) -> Device {
        Device {
            ram,
            log: Vec::new(),
            fault: None,
            next_handle: 0x10,
            next_key: 0x1000,
            pds: Vec::new(),
            mrs: HashMap::new(),
            cqs: HashMap::new(),
            qps: HashMap::new(),
            ahs: HashMap::new(),
            doorbell: None,
            doorbell_head: 0,
            region_pages: vec![false; SHM_SIZE / PAGE_SIZE],
        }
    }

    fn handle(&mut self) -> u32 {
        self.next_handle += 1;
        self.next_handle
    }

    fn ops(&self) -> Vec<Opcode> {
        self.log.iter().map(|(op, _)| *op).collect()
    }

    fn is_empty(&self) -> bool {
        self.pds.is_empty()
            && self.mrs.is_empty()
            && self.cqs.is_empty()
            && self.qps.is_empty()
            && self.ahs.is_empty()
            && self.region_pages.iter().all(|used| !used)
    }

    fn execute(&mut self, raw: &[u8], req: &ControlRequest<'_>, region: &Region) -> Vec<u8> {
        let op = req.opcode();
        self.log.push((op, raw.to_vec()));
        let mut truncate = false;
        match self.fault {
            Some(Fault::Fail(o, e)) if o == op => {
                self.fault = None;
                return ControlResponse::Err(e).to_vec();
            }
            Some(Fault::Truncate(o)) if o == op => {
                self.fault = None;
                truncate = true;
            }
            _ => {}
        }
        let answer = self.answer(req, region);
        let mut bytes = match answer {
            Ok(body) => ControlResponse::Ok(body).to_vec(),
            Err(status) => ControlResponse::Err(StatusError::new(status)).to_vec(),
        };
        if truncate {
            bytes.pop();
        }
        bytes
    }

    fn answer(&mut self, req: &ControlRequest<'_>, region: &Region) -> Answer {
        use ControlRequest as R;
        match req {
            R::QueryDevice => Ok(ResponseBody::QueryDevice(device_attr())),
            R::QueryPort(r) => {
                port(r.port_num.get())?;
                Ok(ResponseBody::QueryPort(port_attr()))
            }
            R::QueryGid(r) => {
                port(r.port_num.get())?;
                let (gid, flags) = match r.index.get() {
                    0 => (LOCAL_GID, GID_FLAG_VALID),
                    1 => ([0; 16], 0),
                    _ => return Err(Status::Invalid),
                };
                Ok(ResponseBody::QueryGid(GidEntry {
                    gid,
                    gid_type: Le32::new(GidType::RoceV2 as u32),
                    flags: Le32::new(flags),
                }))
            }
            R::QueryPkey(r) => {
                port(r.port_num.get())?;
                if r.index.get() != 0 {
                    return Err(Status::Invalid);
                }
                Ok(ResponseBody::QueryPkey(PkeyEntry {
                    pkey: Le16::new(0xffff),
                    reserved: [0; 6],
                }))
            }
            R::DiscardState => {
                self.pds.clear();
                self.mrs.clear();
                self.cqs.clear();
                self.qps.clear();
                self.ahs.clear();
                self.doorbell = None;
                self.region_pages.iter_mut().for_each(|page| *page = false);
                Ok(ResponseBody::Empty)
            }
            R::SetDoorbellArea(r) => {
                if r.slots.get() != DOORBELL_SLOTS {
                    return Err(Status::Invalid);
                }
                if !self.qps.is_empty() {
                    return Err(Status::Busy);
                }
                self.ram_range(r.gpa.get(), sv_area_bytes())?;
                self.doorbell = Some(r.gpa.get());
                Ok(ResponseBody::Empty)
            }
            R::AllocPd => {
                let pd = self.handle();
                self.pds.push(pd);
                Ok(ResponseBody::AllocPd(HandleResp {
                    handle: Le32::new(pd),
                    reserved: Le32::ZERO,
                }))
            }
            R::DeallocPd(r) => {
                let pd = r.handle.get();
                let pos = self
                    .pds
                    .iter()
                    .position(|p| *p == pd)
                    .ok_or(Status::BadHandle)?;
                let used = self.mrs.values().any(|m| m.pd == pd)
                    || self.qps.values().any(|q| q.pd == pd)
                    || self.ahs.values().any(|a| a.0 == pd);
                if used {
                    return Err(Status::Busy);
                }
                self.pds.remove(pos);
                Ok(ResponseBody::Empty)
            }
            R::RegMr(m) => {
                let pd = m.req.pd.get();
                if !self.pds.contains(&pd) {
                    return Err(Status::BadHandle);
                }
                let pages: Vec<u64> = m.pages.iter().collect();
                for &page in &pages {
                    self.ram_range(page, PAGE_SIZE)?;
                }
                let handle = self.handle();
                self.next_key += 0x100;
                let (lkey, rkey) = (self.next_key, self.next_key + 1);
                self.mrs.insert(
                    handle,
                    FakeMr {
                        pd,
                        lkey,
                        rkey,
                        iova: m.req.iova.get(),
                        len: m.req.length.get(),
                        access: m.req.access.get(),
                        pages,
                    },
                );
                Ok(ResponseBody::RegMr(RegMrResp {
                    mr: Le32::new(handle),
                    lkey: Le32::new(lkey),
                    rkey: Le32::new(rkey),
                    reserved: Le32::ZERO,
                }))
            }
            R::DeregMr(r) => {
                self.mrs.remove(&r.handle.get()).ok_or(Status::BadHandle)?;
                Ok(ResponseBody::Empty)
            }
            R::CreateCq(r) => {
                let cqe = r.cqe.get();
                if cqe > 4096 {
                    return Err(Status::Invalid);
                }
                let slots = num_slots_for(cqe).ok_or(Status::Invalid)?;
                let ring = self.create_ring(region, slots, size_of::<IbUverbsWc>())?;
                let handle = self.handle();
                self.cqs.insert(handle, FakeCq { ring, armed: false });
                Ok(ResponseBody::CreateCq(CreateCqResp {
                    cq: Le32::new(handle),
                    cqe: Le32::new(slots - 1),
                    ring: self.describe(&ring),
                }))
            }
            R::DestroyCq(r) => {
                let cq = r.handle.get();
                if self
                    .qps
                    .values()
                    .any(|q| q.send_cq == cq || q.recv_cq == cq)
                {
                    return Err(Status::Busy);
                }
                let cq = self.cqs.remove(&cq).ok_or(Status::BadHandle)?;
                self.destroy_ring(region, &cq.ring);
                Ok(ResponseBody::Empty)
            }
            R::ArmCq(r) => {
                let cq = self.cqs.get_mut(&r.cq.get()).ok_or(Status::BadHandle)?;
                cq.armed = true;
                Ok(ResponseBody::Empty)
            }
            R::CreateQp(r) => self.create_qp(r, region),
            R::ModifyQp(r) => {
                let qp = self.qps.get_mut(&r.qp.get()).ok_or(Status::BadHandle)?;
                let mask = r.attr_mask.get();
                let next = if mask & qp_attr::STATE != 0 {
                    QpState::try_from(r.attr.qp_state.get()).map_err(|_| Status::Invalid)?
                } else {
                    qp.state
                };
                let claimed = (mask & qp_attr::CUR_STATE != 0)
                    .then(|| QpState::try_from(r.attr.cur_qp_state.get()).ok())
                    .flatten();
                check_modify_qp(qp.qp_type, qp.state, mask, next, claimed)?;
                if mask & qp_attr::DEST_QPN != 0 {
                    qp.dest_qpn = r.attr.dest_qp_num.get();
                }
                qp.state = next;
                qp.attr = r.attr;
                Ok(ResponseBody::Empty)
            }
            R::QueryQp(r) => {
                let qp = self.qps.get(&r.qp.get()).ok_or(Status::BadHandle)?;
                let mut attr = qp.attr;
                attr.qp_state = Le32::new(qp.state as u32);
                attr.dest_qp_num = Le32::new(qp.dest_qpn);
                Ok(ResponseBody::QueryQp(QueryQpResp {
                    attr_mask: Le32::new(qp_attr::STATE | qp_attr::DEST_QPN),
                    reserved: Le32::ZERO,
                    attr,
                }))
            }
            R::DestroyQp(r) => {
                let qp = self.qps.remove(&r.handle.get()).ok_or(Status::BadHandle)?;
                self.destroy_ring(region, &qp.sq);
                self.destroy_ring(region, &qp.rq);
                Ok(ResponseBody::Empty)
            }
            R::CreateAh(r) => {
                let pd = r.pd.get();
                if !self.pds.contains(&pd) {
                    return Err(Status::BadHandle);
                }
                let handle = self.handle();
                let ah_num = self.ahs.len() as u32 + 1;
                self.ahs.insert(handle, (pd, ah_num));
                Ok(ResponseBody::CreateAh(CreateAhResp {
                    ah: Le32::new(handle),
                    ah_num: Le32::new(ah_num),
                    av: RxeAv {
                        port_num: r.ah_attr.port_num,
                        network_type: 2,
                        dmac: [2, 0, 0, 0, 0, 1],
                        dgid: r.ah_attr.dgid,
                        flow_label: r.ah_attr.flow_label,
                        sgid_index: r.ah_attr.sgid_index,
                        hop_limit: r.ah_attr.hop_limit,
                        traffic_class: r.ah_attr.traffic_class,
                        pad: 0,
                        sgid_addr: [0; 28],
                        dgid_addr: [0; 28],
                    },
                }))
            }
            R::DestroyAh(r) => {
                self.ahs.remove(&r.handle.get()).ok_or(Status::BadHandle)?;
                Ok(ResponseBody::Empty)
            }
            R::CreateSrq(_) | R::ModifySrq(_) | R::QuerySrq(_) | R::DestroySrq(_) => {
                Err(Status::Unsupported)
            }
        }
    }

    fn create_qp(&mut self, r: &CreateQpReq, region: &Region) -> Answer {
        let qp_type = SpecQpType::try_from(r.qp_type).map_err(|_| Status::Invalid)?;
        if self.doorbell.is_none() {
            return Err(Status::BadState);
        }
        let pd = r.pd.get();
        if !self.pds.contains(&pd)
            || !self.cqs.contains_key(&r.send_cq.get())
            || !self.cqs.contains_key(&r.recv_cq.get())
        {
            return Err(Status::BadHandle);
        }
        let (send_wr, recv_wr) = (r.max_send_wr.get(), r.max_recv_wr.get());
        let (send_sge, recv_sge) = (r.max_send_sge.get(), r.max_recv_sge.get());
        let inline = r.max_inline_data.get();
        if send_wr > MAX_QP_WR
            || recv_wr > MAX_QP_WR
            || send_sge > MAX_SGE
            || recv_sge > MAX_SGE
            || inline > MAX_INLINE
        {
            return Err(Status::Invalid);
        }
        let doorbell_index = (0..DOORBELL_SLOTS)
            .find(|i| self.qps.values().all(|q| q.doorbell_index != *i))
            .ok_or(Status::Quota)?;
        let sq_slots = num_slots_for(send_wr.max(1)).ok_or(Status::Invalid)?;
        let rq_slots = num_slots_for(recv_wr.max(1)).ok_or(Status::Invalid)?;
        let sq = self.create_ring(region, sq_slots, send_wqe_size(send_sge, inline))?;
        let rq = match self.create_ring(region, rq_slots, recv_wqe_size(recv_sge)) {
            Ok(rq) => rq,
            Err(e) => {
                self.destroy_ring(region, &sq);
                return Err(e);
            }
        };
        let handle = self.handle();
        let qpn = 0x100 + handle;
        self.qps.insert(
            handle,
            FakeQp {
                pd,
                qpn,
                qp_type,
                state: QpState::Reset,
                send_cq: r.send_cq.get(),
                recv_cq: r.recv_cq.get(),
                sq_sig_all: r.sq_sig_all != 0,
                doorbell_index,
                sq,
                rq,
                dest_qpn: 0,
                attr: QpAttr::default().to_wire(),
            },
        );
        Ok(ResponseBody::CreateQp(CreateQpResp {
            qp: Le32::new(handle),
            qpn: Le32::new(qpn),
            max_send_wr: Le32::new(sq_slots - 1),
            max_recv_wr: Le32::new(rq_slots - 1),
            max_send_sge: Le32::new(send_sge),
            max_recv_sge: Le32::new(recv_sge),
            max_inline_data: Le32::new(inline),
            doorbell_index: Le32::new(doorbell_index),
            sq: self.describe(&sq),
            rq: self.describe(&rq),
        }))
    }

    /// Places a ring of `slots` slots for entries of `entry` bytes, as rxe sizes it.
    fn create_ring(&mut self, region: &Region, slots: u32, entry: usize) -> Result<Ring, Status> {
        let log2 = entry.next_power_of_two().max(64).trailing_zeros();
        let len = 384 + ((slots as usize) << log2);
        let pages = len.div_ceil(PAGE_SIZE);
        let first = (0..=self.region_pages.len() - pages)
            .find(|&p| self.region_pages[p..p + pages].iter().all(|used| !used))
            .ok_or(Status::NoMemory)?;
        self.region_pages[first..first + pages].fill(true);
        let (offset, map_len) = (first * PAGE_SIZE, pages * PAGE_SIZE);
        let base = region.map(offset, map_len);
        let mask = if self.fault == Some(Fault::RingHeaderMismatch) {
            self.fault = None;
            slots * 2 - 1
        } else {
            slots - 1
        };
        // SAFETY: the header words lie at the start of the extent just mapped.
        unsafe {
            base.cast::<u32>().write(log2);
            base.cast::<u32>().add(1).write(mask);
        }
        Ok(Ring {
            offset,
            map_len,
            base,
            mask: slots - 1,
            log2,
        })
    }

    fn describe(&mut self, ring: &Ring) -> RingDesc {
        let mut desc = ring.desc();
        if self.fault == Some(Fault::RingOutsideRegion) {
            self.fault = None;
            desc.shm_offset = Le64::new(SHM_SIZE as u64);
        }
        desc
    }

    fn destroy_ring(&mut self, region: &Region, ring: &Ring) {
        region.unmap(ring.offset, ring.map_len);
        let first = ring.offset / PAGE_SIZE;
        self.region_pages[first..first + ring.map_len / PAGE_SIZE].fill(false);
    }

    /// Host address of `len` guest-physical bytes at `gpa`, if they are guest RAM.
    fn ram_range(&self, gpa: u64, len: usize) -> Result<*mut u8, Status> {
        let offset = gpa.checked_sub(GUEST_RAM_BASE).ok_or(Status::BadAddress)? as usize;
        if offset + len > self.ram.len() {
            return Err(Status::BadAddress);
        }
        // SAFETY: inside the guest RAM mapping (checked).
        Ok(unsafe { self.ram.host_base().add(offset) })
    }

    // --------------------------------------------------------------------------------------
    // The loopback "kernel".

    fn run_kernel(&mut self) -> Vec<Event> {
        let Some(gpa) = self.doorbell else {
            return Vec::new();
        };
        let area_ptr = self.ram_range(gpa, sv_area_bytes()).unwrap();
        // SAFETY: the registered area lies in guest RAM (checked at registration), is 4-byte
        // aligned, and both sides use it only atomically.
        let words = unsafe {
            std::slice::from_raw_parts(area_ptr.cast::<AtomicU32>(), sv_area_bytes() / 4)
        };
        let area = DoorbellArea::new(words, DOORBELL_SLOTS).unwrap();
        let mut kicked = Vec::new();
        area.drain(&mut self.doorbell_head, |index| kicked.push(index));
        let mut events = Vec::new();
        for index in kicked {
            let qp = self
                .qps
                .iter()
                .find(|(_, q)| q.doorbell_index == index)
                .map(|(h, _)| *h);
            if let Some(qp) = qp {
                self.process_send_queue(qp, &mut events);
            }
        }
        events
    }

    fn process_send_queue(&mut self, handle: u32, events: &mut Vec<Event>) {
        let qp = &self.qps[&handle];
        if qp.state != QpState::Rts {
            return;
        }
        let (sq, qpn, send_cq, sig_all) = (qp.sq, qp.qpn, qp.send_cq, qp.sq_sig_all);
        while let Some(index) = sq.peek() {
            // SAFETY: a posted slot, owned by the kernel until the consumer passes it.
            let wqe = unsafe { sq.slot(index).cast::<RxeSendWqe>().read() };
            let (status, opcode, byte_len) = self.execute_wqe(handle, &sq, index, &wqe, events);
            sq.pop(index);
            let signaled = wqe.wr.send_flags.get() & sv::send_flags::SIGNALED != 0;
            if signaled || sig_all || status != sv::wc_status::SUCCESS {
                let wc = IbUverbsWc {
                    wr_id: wqe.wr.wr_id,
                    status: Le32::new(status),
                    opcode: Le32::new(opcode),
                    byte_len: Le32::new(byte_len),
                    qp_num: Le32::new(qpn),
                    port_num: 1,
                    ..IbUverbsWc::new_zeroed()
                };
                self.push_cqe(send_cq, wc, events);
            }
        }
    }

    /// Executes one send WQE; returns the completion's status, opcode and length.
    fn execute_wqe(
        &mut self,
        handle: u32,
        sq: &Ring,
        index: u32,
        wqe: &RxeSendWqe,
        events: &mut Vec<Event>,
    ) -> (u32, u32, u32) {
        use sv::{wc_opcode, wc_status, wr_opcode};
        let qp = &self.qps[&handle];
        let pd = qp.pd;
        let dest_qpn = if qp.qp_type == SpecQpType::Ud {
            wqe.wr.wr.ud().remote_qpn.get()
        } else {
            qp.dest_qpn
        };
        let len = wqe.dma.length.get();
        let local = local_payload(sq, index, wqe);
        match wqe.wr.opcode.get() {
            wr_opcode::SEND | wr_opcode::SEND_WITH_IMM => {
                let Some(payload) = self.gather(pd, &local) else {
                    return (wc_status::LOC_PROT_ERR, wc_opcode::SEND, 0);
                };
                let imm = (wqe.wr.opcode.get() == wr_opcode::SEND_WITH_IMM)
                    .then_some(u32::from_ne_bytes(wqe.wr.ex));
                let src_qpn = self.qps[&handle].qpn;
                let status = self.deliver(dest_qpn, src_qpn, &payload, imm, events);
                (status, wc_opcode::SEND, len)
            }
            wr_opcode::RDMA_WRITE => {
                let Some(payload) = self.gather(pd, &local) else {
                    return (wc_status::LOC_PROT_ERR, wc_opcode::RDMA_WRITE, 0);
                };
                let rdma = wqe.wr.wr.rdma();
                let (rkey, remote_addr) = (rdma.rkey.get(), rdma.remote_addr.get());
                match self.remote(dest_qpn, rkey, remote_addr, len, sv::access::REMOTE_WRITE) {
                    Some(mr) => {
                        self.copy_to_mr(mr, remote_addr, &payload);
                        (wc_status::SUCCESS, wc_opcode::RDMA_WRITE, len)
                    }
                    None => (wc_status::REM_ACCESS_ERR, wc_opcode::RDMA_WRITE, 0),
                }
            }
            wr_opcode::RDMA_READ => {
                let rdma = wqe.wr.wr.rdma();
                let (rkey, remote_addr) = (rdma.rkey.get(), rdma.remote_addr.get());
                let Some(mr) =
                    self.remote(dest_qpn, rkey, remote_addr, len, sv::access::REMOTE_READ)
                else {
                    return (wc_status::REM_ACCESS_ERR, wc_opcode::RDMA_READ, 0);
                };
                let data = self.copy_from_mr(mr, remote_addr, len as usize);
                let Local::Sges(sges) = &local else {
                    return (wc_status::LOC_QP_OP_ERR, wc_opcode::RDMA_READ, 0);
                };
                if self.scatter(pd, sges, &data).is_none() {
                    return (wc_status::LOC_PROT_ERR, wc_opcode::RDMA_READ, 0);
                }
                (wc_status::SUCCESS, wc_opcode::RDMA_READ, len)
            }
            _ => (wc_status::LOC_QP_OP_ERR, wc_opcode::SEND, 0),
        }
    }

    /// The payload of a send or write: inline bytes or the bytes under the SGEs.
    fn gather(&self, pd: u32, local: &Local) -> Option<Vec<u8>> {
        match local {
            Local::Inline(bytes) => Some(bytes.clone()),
            Local::Sges(sges) => {
                let mut out = Vec::new();
                for sge in sges {
                    let (lkey, addr, length) = (sge.lkey.get(), sge.addr.get(), sge.length.get());
                    let mr = self.local_mr(pd, lkey, addr, length, 0)?;
                    out.extend(self.copy_from_mr(mr, addr, length as usize));
                }
                Some(out)
            }
        }
    }

    /// Writes `data` over the SGEs (which need local write access); `None` on a protection
    /// error, `Some(false)` if the SGEs are too short.
    fn scatter(&self, pd: u32, sges: &[RxeSge], data: &[u8]) -> Option<bool> {
        let mut rest = data;
        for sge in sges {
            let (lkey, addr, length) = (sge.lkey.get(), sge.addr.get(), sge.length.get());
            let n = rest.len().min(length as usize);
            let mr = self.local_mr(pd, lkey, addr, length, sv::access::LOCAL_WRITE)?;
            self.copy_to_mr(mr, addr, &rest[..n]);
            rest = &rest[n..];
        }
        Some(rest.is_empty())
    }

    /// The MR of `pd` with local key `lkey` covering `[addr, addr + len)` with `access`.
    fn local_mr(&self, pd: u32, lkey: u32, addr: u64, len: u32, access: u32) -> Option<&FakeMr> {
        self.mrs.values().find(|m| {
            m.pd == pd
                && m.lkey == lkey
                && m.access & access == access
                && addr >= m.iova
                && addr + u64::from(len) <= m.iova + m.len
        })
    }

    /// The MR a remote access through QP `qpn` with `rkey` reaches.
    fn remote(&self, qpn: u32, rkey: u32, addr: u64, len: u32, access: u32) -> Option<&FakeMr> {
        let pd = self.qps.values().find(|q| q.qpn == qpn)?.pd;
        self.mrs.values().find(|m| {
            m.pd == pd
                && m.rkey == rkey
                && m.access & access == access
                && addr >= m.iova
                && addr + u64::from(len) <= m.iova + m.len
        })
    }

    /// Host address of MR byte `iova`, through the page list as the device maps it.
    fn mr_byte(&self, mr: &FakeMr, iova: u64) -> (*mut u8, usize) {
        let page_size = PAGE_SIZE as u64;
        let offset = (mr.iova % page_size) + (iova - mr.iova);
        let page = mr.pages[(offset / page_size) as usize];
        let in_page = (offset % page_size) as usize;
        let host = self.ram_range(page, PAGE_SIZE).unwrap();
        // SAFETY: inside the page just translated.
        (unsafe { host.add(in_page) }, PAGE_SIZE - in_page)
    }

    fn copy_to_mr(&self, mr: &FakeMr, mut iova: u64, mut data: &[u8]) {
        while !data.is_empty() {
            let (host, room) = self.mr_byte(mr, iova);
            let n = room.min(data.len());
            // SAFETY: `n` bytes inside one registered guest page; the "NIC" writes guest
            // memory the application handed to it, as DMA would.
            unsafe { std::ptr::copy(data.as_ptr(), host, n) };
            data = &data[n..];
            iova += n as u64;
        }
    }

    fn copy_from_mr(&self, mr: &FakeMr, mut iova: u64, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let (host, room) = self.mr_byte(mr, iova);
            let n = room.min(len - out.len());
            // SAFETY: `n` readable bytes inside one registered guest page.
            out.extend_from_slice(unsafe { std::slice::from_raw_parts(host, n) });
            iova += n as u64;
        }
        out
    }

    /// A received message: consumes a receive WQE of QP `qpn` and completes it.
    fn deliver(
        &mut self,
        qpn: u32,
        src_qp: u32,
        payload: &[u8],
        imm: Option<u32>,
        events: &mut Vec<Event>,
    ) -> u32 {
        use sv::wc_status;
        let Some(dest) = self.qps.values().find(|q| q.qpn == qpn) else {
            return wc_status::RETRY_EXC_ERR;
        };
        if !matches!(dest.state, QpState::Rtr | QpState::Rts) {
            return wc_status::RETRY_EXC_ERR;
        }
        let (rq, pd, recv_cq) = (dest.rq, dest.pd, dest.recv_cq);
        let Some(index) = rq.peek() else {
            return wc_status::RNR_RETRY_EXC_ERR;
        };
        // SAFETY: a posted receive slot, owned by the kernel until the consumer passes it.
        let wqe = unsafe { rq.slot(index).cast::<RxeRecvWqe>().read() };
        let n = (wqe.dma.num_sge.get() as usize).min(MAX_SGE as usize);
        // SAFETY: `n` SGEs follow the receive WQE inside its slot.
        let first = unsafe { rq.slot(index).add(size_of::<RxeRecvWqe>()).cast::<RxeSge>() };
        // SAFETY: as above; SGEs are plain data.
        let sges: Vec<RxeSge> = (0..n).map(|i| unsafe { first.add(i).read() }).collect();
        rq.pop(index);
        let status = match self.scatter(pd, &sges, payload) {
            Some(true) => wc_status::SUCCESS,
            Some(false) => wc_status::LOC_LEN_ERR,
            None => wc_status::LOC_PROT_ERR,
        };
        let wc = IbUverbsWc {
            wr_id: wqe.wr_id,
            status: Le32::new(status),
            opcode: Le32::new(sv::wc_opcode::RECV),
            byte_len: Le32::new(payload.len() as u32),
            ex: imm.unwrap_or(0).to_ne_bytes(),
            qp_num: Le32::new(qpn),
            src_qp: Le32::new(src_qp),
            wc_flags: Le32::new(if imm.is_some() {
                sv::wc_flags::WITH_IMM
            } else {
                0
            }),
            port_num: 1,
            ..IbUverbsWc::new_zeroed()
        };
        self.push_cqe(recv_cq, wc, events);
        if status == wc_status::SUCCESS {
            wc_status::SUCCESS
        } else {
            wc_status::REM_OP_ERR
        }
    }

    fn push_cqe(&mut self, handle: u32, wc: IbUverbsWc, events: &mut Vec<Event>) {
        let cq = self.cqs.get_mut(&handle).unwrap();
        let ring = cq.ring;
        let p = ring.producer().load(Ordering::Relaxed) & ring.mask;
        let c = ring.consumer().load(Ordering::Acquire) & ring.mask;
        if (p + 1) & ring.mask == c {
            events.push(event(EventType::CqErr, handle));
            return;
        }
        // SAFETY: the producer slot of a CQ that is not full belongs to the kernel.
        unsafe { ring.slot(p).cast::<IbUverbsWc>().write(wc) };
        ring.producer()
            .store((p + 1) & ring.mask, Ordering::Release);
        if std::mem::take(&mut cq.armed) {
            events.push(event(EventType::Completion, handle));
        }
    }
}

/// What a send WQE carries locally.
enum Local {
    Inline(Vec<u8>),
    Sges(Vec<RxeSge>),
}

fn local_payload(sq: &Ring, index: u32, wqe: &RxeSendWqe) -> Local {
    // SAFETY: the payload area follows the WQE inside its slot.
    let payload = unsafe { sq.slot(index).add(size_of::<RxeSendWqe>()) };
    if wqe.wr.send_flags.get() & sv::send_flags::INLINE != 0 {
        let len = (wqe.dma.length.get() as usize).min(MAX_INLINE as usize);
        // SAFETY: at most MAX_INLINE bytes, which the slot holds.
        return Local::Inline(unsafe { std::slice::from_raw_parts(payload, len) }.to_vec());
    }
    let n = (wqe.dma.num_sge.get() as usize).min(MAX_SGE as usize);
    let first = payload.cast::<RxeSge>();
    // SAFETY: at most MAX_SGE SGEs, which the slot holds; SGEs are plain data.
    Local::Sges((0..n).map(|i| unsafe { first.add(i).read() }).collect())
}

fn event(event_type: EventType, handle: u32) -> Event {
    Event {
        event_type,
        handle,
        detail: 0,
    }
}

fn sv_area_bytes() -> usize {
    vrdma::spec::doorbell::area_bytes(DOORBELL_SLOTS)
}

fn port(port: u32) -> Result<(), Status> {
    if port == 1 {
        Ok(())
    } else {
        Err(Status::Invalid)
    }
}

fn device_attr() -> DeviceAttr {
    let mut fw_ver = [0u8; 64];
    fw_ver[..8].copy_from_slice(b"fake 1.0");
    let n = Le32::new;
    DeviceAttr {
        fw_ver,
        node_guid: [1; 8],
        sys_image_guid: [2; 8],
        max_mr_size: Le64::new(1 << 32),
        page_size_cap: Le64::new(0xffff_f000),
        max_mr_bytes: Le64::new(RAM_SIZE as u64),
        vendor_id: n(0xffffff),
        vendor_part_id: n(0),
        hw_ver: n(0),
        device_cap_flags: n(0),
        max_qp: n(DOORBELL_SLOTS),
        max_qp_wr: n(MAX_QP_WR),
        max_sge: n(MAX_SGE),
        max_sge_rd: n(MAX_SGE),
        max_cq: n(64),
        max_cqe: n(4096),
        max_mr: n(64),
        max_pd: n(16),
        max_qp_rd_atom: n(MAX_QP_RD_ATOM),
        max_qp_init_rd_atom: n(MAX_QP_INIT_RD_ATOM),
        max_res_rd_atom: n(0),
        atomic_cap: n(0),
        max_ah: n(16),
        max_srq: n(0),
        max_srq_wr: n(0),
        max_srq_sge: n(0),
        max_inline_data: n(MAX_INLINE),
        max_pkeys: Le16::new(1),
        local_ca_ack_delay: 15,
        phys_port_cnt: 1,
    }
}

fn port_attr() -> PortAttr {
    let n = Le32::new;
    PortAttr {
        state: n(sv::port_state::ACTIVE),
        max_mtu: n(5),
        active_mtu: n(3),
        gid_tbl_len: n(2),
        port_cap_flags: n(0),
        max_msg_sz: n(1 << 31),
        bad_pkey_cntr: n(0),
        qkey_viol_cntr: n(0),
        pkey_tbl_len: Le16::new(1),
        lid: Le16::ZERO,
        sm_lid: Le16::ZERO,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        active_width: 1,
        active_speed: 1,
        phys_state: 5,
        link_layer: 2,
        flags: 0,
        port_cap_flags2: Le16::ZERO,
        reserved: Le16::ZERO,
        active_speed_ex: n(0),
    }
}

// ------------------------------------------------------------------------------------------
// Helpers.

fn open() -> (Arc<FakeTransport>, Context) {
    let transport = FakeTransport::new();
    let ctx = Context::open(transport.clone()).unwrap();
    (transport, ctx)
}

fn rc_caps() -> QpCaps {
    QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    }
}

fn create_qp(pd: &Pd, cq: &Cq, qp_type: QpType) -> Qp {
    let init = QpInitAttr {
        qp_type,
        send_cq: cq,
        recv_cq: cq,
        caps: rc_caps(),
        sq_sig_all: false,
    };
    Qp::new(pd, &init).unwrap()
}

fn remote(qp: &Qp, psn: u32) -> RemoteQp {
    RemoteQp {
        qpn: qp.qpn(),
        psn,
        gid: Gid(LOCAL_GID),
        lid: 0,
    }
}

/// Two RC QPs of one context connected to each other, each with its own CQ.
fn connected_pair(pd: &Pd, cq_a: &Cq, cq_b: &Cq) -> (Qp, Qp) {
    let a = create_qp(pd, cq_a, QpType::Rc);
    let b = create_qp(pd, cq_b, QpType::Rc);
    let opts_a = ConnectOptions {
        sq_psn: 100,
        ..ConnectOptions::default()
    };
    let opts_b = ConnectOptions {
        sq_psn: 200,
        ..ConnectOptions::default()
    };
    a.connect(&remote(&b, 200), &opts_a).unwrap();
    b.connect(&remote(&a, 100), &opts_b).unwrap();
    (a, b)
}

fn filled(ctx: &Context, bytes: &[u8]) -> DmaBuffer {
    let mut buf = ctx.alloc_buffer(bytes.len()).unwrap();
    buf.as_mut_slice().copy_from_slice(bytes);
    buf
}

fn post(qp: &Qp, wrs: &[SendWr<'_>]) -> Result<(), PostSendError> {
    // SAFETY: inline SGEs in these tests point into live local buffers.
    unsafe { qp.post_send(wrs) }
}

fn poll_all(cq: &Cq) -> Vec<WorkCompletion> {
    let mut out = [WorkCompletion::default(); 16];
    let n = cq.poll(&mut out);
    out[..n].to_vec()
}

fn modify_requests(t: &FakeTransport) -> Vec<ModifyQpReq> {
    t.device()
        .log
        .iter()
        .filter_map(|(_, raw)| match ControlRequest::decode(raw) {
            Ok(ControlRequest::ModifyQp(r)) => Some(r),
            _ => None,
        })
        .collect()
}

fn status_of(e: &VerbsError) -> Option<Status> {
    e.status()
}

// ------------------------------------------------------------------------------------------
// Tests.

#[test]
fn open_reads_the_device_and_registers_a_zeroed_doorbell_area() {
    let (t, ctx) = open();
    assert_eq!(
        t.device().ops(),
        [Opcode::QueryDevice, Opcode::SetDoorbellArea]
    );
    let attr = ctx.query_device();
    assert_eq!(attr.fw_ver, "fake 1.0");
    assert_eq!(attr.max_qp_wr, MAX_QP_WR);
    assert_eq!(attr.max_inline_data, MAX_INLINE);
    assert_eq!(attr.phys_port_cnt, 1);

    let raw = t.device().log[1].1.clone();
    let Ok(ControlRequest::SetDoorbellArea(r)) = ControlRequest::decode(&raw) else {
        panic!("not SET_DOORBELL_AREA");
    };
    assert_eq!(r.slots.get(), DOORBELL_SLOTS);
    let host = t.device().ram_range(r.gpa.get(), sv_area_bytes()).unwrap();
    // SAFETY: the registered area lies in guest RAM (checked by `ram_range`).
    let area = unsafe { std::slice::from_raw_parts(host, sv_area_bytes()) };
    assert!(area.iter().all(|&b| b == 0));
}

#[test]
fn open_refuses_devices_it_cannot_drive() {
    let rxe = features::VRDMA_F_RING_RXE_V1;
    let mut bad_magic = config();
    bad_magic.magic = Le32::new(0x1234);
    let mut major_2 = config();
    major_2.version_major = Le16::new(2);
    let mut bad_slots = config();
    bad_slots.doorbell_slots = Le32::new(48);
    let mut bad_page = config();
    bad_page.shm_page_shift = Le32::new(40);
    let cases = [
        (bad_magic, rxe),
        (major_2, rxe),
        (bad_slots, rxe),
        (bad_page, rxe),
        // The configuration says rxe v1 but the format bit was not negotiated.
        (config(), 0),
    ];
    for (cfg, features) in cases {
        let t = FakeTransport::with(cfg, features);
        let err = Context::open(t.clone()).expect_err("open must fail");
        assert!(matches!(err, VerbsError::Protocol(_)), "{err}");
        assert!(t.device().is_empty());
    }

    // No ring format at all: control verbs work, queues are refused without a command.
    let mut none = config();
    none.ring_format = Le32::new(ring_format::NONE);
    let t = FakeTransport::with(none, 0);
    let ctx = Context::open(t.clone()).unwrap();
    let _pd = ctx.alloc_pd().unwrap();
    assert!(matches!(Cq::new(&ctx, 4), Err(VerbsError::Unsupported(_))));
    assert!(!t.device().ops().contains(&Opcode::CreateCq));
}

#[test]
fn queries_return_typed_attributes() {
    let (_t, ctx) = open();
    let port = ctx.query_port(1).unwrap();
    assert!(port.is_active());
    assert_eq!(port.active_mtu(), Some(Mtu::Mtu1024));
    assert_eq!(port.link_layer, 2);
    assert_eq!(port.gid_tbl_len, 2);

    let gid = ctx.query_gid(1, 0).unwrap().unwrap();
    assert_eq!(gid.gid, Gid(LOCAL_GID));
    assert_eq!(gid.gid.to_string(), "fe80::1");
    assert_eq!(gid.gid_type, GidType::RoceV2);
    assert_eq!(ctx.query_gid(1, 1).unwrap(), None, "empty entry");
    assert_eq!(ctx.query_pkey(1, 0).unwrap(), 0xffff);

    let err = ctx.query_port(2).unwrap_err();
    assert_eq!(status_of(&err), Some(Status::Invalid));
    assert!(err.to_string().contains("QUERY_PORT"), "{err}");
    assert_eq!(
        status_of(&ctx.query_gid(1, 7).unwrap_err()),
        Some(Status::Invalid)
    );
}

#[test]
fn objects_are_destroyed_in_dependency_order_whatever_the_drop_order() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let buf = ctx.alloc_buffer(3 * PAGE_SIZE + 100).unwrap();
    let mr = pd.register(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    let cq = Cq::new(&ctx, 8).unwrap();
    let qp = create_qp(&pd, &cq, QpType::Rc);
    let ah = Ah::new(
        &pd,
        &AhAttr {
            grh: Some(GlobalRoute {
                dgid: Gid(LOCAL_GID),
                ..GlobalRoute::default()
            }),
            port_num: 1,
            ..AhAttr::default()
        },
    )
    .unwrap();
    assert_eq!(
        mr.addr(),
        buf.as_ptr() as u64,
        "iova is the process address"
    );
    assert_eq!(mr.len(), buf.len());
    {
        let dev = t.device();
        let fake = dev.mrs.values().next().unwrap();
        assert_eq!(fake.iova, buf.as_ptr() as u64);
        assert_eq!(fake.pages.len(), 4);
        assert_eq!((fake.lkey, fake.rkey), (mr.lkey(), mr.rkey()));
    }
    t.device().log.clear();

    // The application drops the PD and the CQ first; the device must still see the QP go
    // before its CQ and everything go before the PD.
    drop(pd);
    drop(cq);
    assert!(t.device().log.is_empty(), "nothing destroyed while in use");
    drop(ah);
    drop(qp);
    assert_eq!(
        t.device().ops(),
        [Opcode::DestroyAh, Opcode::DestroyQp, Opcode::DestroyCq]
    );
    drop(mr);
    assert_eq!(t.device().ops()[3..], [Opcode::DeregMr, Opcode::DeallocPd]);
    assert!(t.device().is_empty(), "no leak on the device");
    drop(ctx);
}

#[test]
fn connect_sends_the_rc_transitions_with_their_masks_and_values() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let cq = Cq::new(&ctx, 8).unwrap();
    let qp = create_qp(&pd, &cq, QpType::Rc);
    let peer = RemoteQp {
        qpn: 0x1234,
        psn: 0xabcdef,
        gid: Gid([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]),
        lid: 0,
    };
    let opts = ConnectOptions {
        sgid_index: 1,
        path_mtu: Mtu::Mtu4096,
        sq_psn: 0x42,
        ..ConnectOptions::default()
    };
    qp.connect(&peer, &opts).unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Rts);

    let m = modify_requests(&t);
    assert_eq!(m.len(), 3);
    use qp_attr::*;
    assert_eq!(
        m[0].attr_mask.get(),
        STATE | PKEY_INDEX | PORT | ACCESS_FLAGS
    );
    assert_eq!(m[0].attr.qp_state.get(), QpState::Init as u32);
    assert_eq!(m[0].attr.port_num, 1);
    assert_eq!(m[0].attr.qp_access_flags.get(), 0x7);

    assert_eq!(
        m[1].attr_mask.get(),
        STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER
    );
    let rtr = &m[1].attr;
    assert_eq!(rtr.qp_state.get(), QpState::Rtr as u32);
    assert_eq!(rtr.path_mtu.get(), 5);
    assert_eq!(rtr.dest_qp_num.get(), 0x1234);
    assert_eq!(rtr.rq_psn.get(), 0xabcdef);
    assert_eq!(
        rtr.max_dest_rd_atomic as u32, MAX_QP_RD_ATOM,
        "device limit < 16"
    );
    assert_eq!(rtr.min_rnr_timer, 12);
    assert_eq!(rtr.ah_attr.is_global, 1);
    assert_eq!(rtr.ah_attr.dgid, peer.gid.0);
    assert_eq!(rtr.ah_attr.sgid_index, 1);
    assert_eq!(rtr.ah_attr.hop_limit, 64);
    assert_eq!(rtr.ah_attr.port_num, 1);

    assert_eq!(
        m[2].attr_mask.get(),
        STATE | SQ_PSN | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_QP_RD_ATOMIC
    );
    let rts = &m[2].attr;
    assert_eq!(rts.qp_state.get(), QpState::Rts as u32);
    assert_eq!(rts.sq_psn.get(), 0x42);
    assert_eq!((rts.timeout, rts.retry_cnt, rts.rnr_retry), (14, 7, 7));
    assert_eq!(rts.max_rd_atomic as u32, MAX_QP_INIT_RD_ATOM);

    qp.to_error().unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Err);
    qp.reset().unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Reset);
    let (attr, valid) = qp.query(QpAttrMask::STATE | QpAttrMask::DEST_QPN).unwrap();
    assert!(valid.contains(QpAttrMask::DEST_QPN));
    assert_eq!(attr.dest_qp_num, 0x1234);
}

#[test]
fn illegal_transitions_and_masks_surface_the_device_status() {
    let (_t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let cq = Cq::new(&ctx, 8).unwrap();
    let qp = create_qp(&pd, &cq, QpType::Rc);
    let opts = ConnectOptions::default();
    let err = qp.to_rtr(&remote(&qp, 0), &opts).unwrap_err();
    assert_eq!(status_of(&err), Some(Status::BadState), "RESET -> RTR");
    assert!(err.to_string().starts_with("MODIFY_QP failed"), "{err}");

    // RESET -> INIT without the access flags RC requires.
    let attr = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    let err = qp
        .modify(
            &attr,
            QpAttrMask::STATE | QpAttrMask::PORT | QpAttrMask::PKEY_INDEX,
        )
        .unwrap_err();
    assert_eq!(status_of(&err), Some(Status::Invalid));
    assert!(matches!(
        qp.ud_to_rts(1, 1, 0),
        Err(VerbsError::InvalidArgument(_))
    ));
}

#[test]
fn send_write_and_read_round_trip_through_the_kernel() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (Cq::new(&ctx, 16).unwrap(), Cq::new(&ctx, 16).unwrap());
    let (a, b) = connected_pair(&pd, &cq_a, &cq_b);

    let message: Vec<u8> = (0..6000u32).map(|i| (i * 7) as u8).collect();
    let src = filled(&ctx, &message);
    let src_mr = pd.register(&src, AccessFlags::empty()).unwrap();
    let dst = ctx.alloc_buffer(8192).unwrap();
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let dst_mr = pd.register(&dst, rw).unwrap();

    // SEND with immediate data, split over two SGEs, into a posted receive at offset 100.
    let recv_sge = [dst_mr.sge(100, 7000).unwrap()];
    b.post_recv(&[RecvWr {
        wr_id: 77,
        sg_list: &recv_sge,
    }])
    .unwrap();
    let sges = [
        src_mr.sge(0, 2000).unwrap(),
        src_mr.sge(2000, 4000).unwrap(),
    ];
    post(
        &a,
        &[SendWr {
            wr_id: 1,
            opcode: WrOpcode::SendWithImm,
            flags: SendFlags::SIGNALED,
            sg_list: &sges,
            imm_data: 0xdead_beef_u32.to_be(),
            ..SendWr::default()
        }],
    )
    .unwrap();
    assert!(poll_all(&cq_a).is_empty(), "nothing before the kernel ran");
    t.run_kernel();
    let sent = poll_all(&cq_a);
    assert_eq!(sent.len(), 1);
    assert_eq!((sent[0].wr_id, sent[0].status), (1, WcStatus::Success));
    assert_eq!(sent[0].opcode, WcOpcode::Send);
    assert_eq!(sent[0].qp_num, a.qpn());
    let got = poll_all(&cq_b);
    assert_eq!(got.len(), 1);
    let wc = got[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (77, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!(wc.byte_len, 6000);
    assert_eq!((wc.qp_num, wc.src_qp), (b.qpn(), a.qpn()));
    assert!(wc.wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(u32::from_be(wc.imm_data), 0xdead_beef);
    assert_eq!(&dst.as_slice()[100..6100], &message[..]);

    // Inline RDMA WRITE (no MR needed locally) to the peer's region, then an RDMA READ back
    // into the source-side region.
    let inline = *b"written inline!";
    let inline_sge = [Sge {
        addr: inline.as_ptr() as u64,
        length: inline.len() as u32,
        lkey: 0,
    }];
    post(
        &a,
        &[SendWr {
            wr_id: 2,
            opcode: WrOpcode::RdmaWrite,
            flags: SendFlags::SIGNALED | SendFlags::INLINE,
            sg_list: &inline_sge,
            remote_addr: dst_mr.addr() + 8000,
            rkey: dst_mr.rkey(),
            ..SendWr::default()
        }],
    )
    .unwrap();
    let back = ctx.alloc_buffer(64).unwrap();
    let back_mr = pd.register(&back, AccessFlags::LOCAL_WRITE).unwrap();
    let back_sge = [back_mr.sge(0, inline.len()).unwrap()];
    post(
        &b,
        &[SendWr {
            wr_id: 3,
            opcode: WrOpcode::RdmaRead,
            flags: SendFlags::SIGNALED,
            sg_list: &back_sge,
            remote_addr: src_mr.addr() + 10,
            rkey: src_mr.rkey(),
            ..SendWr::default()
        }],
    )
    .unwrap();
    t.run_kernel();
    assert_eq!(&dst.as_slice()[8000..8000 + inline.len()], &inline);
    assert_eq!(poll_all(&cq_a)[0].opcode, WcOpcode::RdmaWrite);
    let read = poll_all(&cq_b);
    // The source region was registered without remote read: the peer is refused.
    assert_eq!(read[0].status, WcStatus::RemAccessErr);
    assert!(back.as_slice().iter().all(|&x| x == 0));

    // An unknown lkey is a local protection error, reported in the completion.
    let bad = [Sge {
        lkey: 0xbad,
        ..src_mr.sge(0, 8).unwrap()
    }];
    post(
        &a,
        &[SendWr {
            wr_id: 4,
            opcode: WrOpcode::RdmaWrite,
            sg_list: &bad,
            remote_addr: dst_mr.addr(),
            rkey: dst_mr.rkey(),
            ..SendWr::default()
        }],
    )
    .unwrap();
    t.run_kernel();
    let wc = poll_all(&cq_a);
    assert_eq!((wc[0].wr_id, wc[0].status), (4, WcStatus::LocProtErr));
}

#[test]
fn the_doorbell_notifies_only_when_the_qp_is_not_already_queued() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let cq = Cq::new(&ctx, 32).unwrap();
    let (a, b) = connected_pair(&pd, &cq, &cq);
    let dst = ctx.alloc_buffer(64).unwrap();
    let dst_mr = pd
        .register(&dst, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let byte = [0x5au8];
    let sge = [Sge {
        addr: byte.as_ptr() as u64,
        length: 1,
        lkey: 0,
    }];
    let write = |wr_id| SendWr {
        wr_id,
        opcode: WrOpcode::RdmaWrite,
        flags: SendFlags::SIGNALED | SendFlags::INLINE,
        sg_list: &sge,
        remote_addr: dst_mr.addr() + wr_id,
        rkey: dst_mr.rkey(),
        ..SendWr::default()
    };

    assert_eq!(t.notifications(), 0);
    post(&a, &[write(0), write(1)]).unwrap();
    assert_eq!(t.notifications(), 1, "one notification for a batch");
    post(&a, &[write(2)]).unwrap();
    assert_eq!(t.notifications(), 1, "still queued: no second notification");
    post(&b, &[]).unwrap();
    assert_eq!(t.notifications(), 1, "nothing posted: no ring");
    t.run_kernel();
    assert_eq!(
        poll_all(&cq).len(),
        3,
        "the queued QP was kicked once for all three"
    );
    assert_eq!(&dst.as_slice()[..3], &[0x5a; 3]);

    post(&a, &[write(3)]).unwrap();
    post(&b, &[write(4)]).unwrap();
    assert_eq!(t.notifications(), 3, "drained: each QP rings again");
    t.run_kernel();
    assert_eq!(poll_all(&cq).len(), 2);
}

#[test]
fn refused_requests_are_reported_after_ringing_for_the_posted_ones() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let cq = Cq::new(&ctx, 32).unwrap();
    let (a, _b) = connected_pair(&pd, &cq, &cq);
    let buf = ctx.alloc_buffer(64).unwrap();
    let mr = pd.register(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    let one = [mr.sge(0, 8).unwrap()];
    let three = [one[0]; 3];
    let wr = |sg_list| SendWr {
        opcode: WrOpcode::Send,
        sg_list,
        ..SendWr::default()
    };
    let err = post(&a, &[wr(&one), wr(&three), wr(&one)]).unwrap_err();
    assert!(matches!(
        err,
        PostSendError::Refused {
            index: 1,
            error: PostError::TooManySges { num: 3, max: 2 }
        }
    ));
    assert_eq!(err.posted(), 1);
    assert_eq!(t.notifications(), 1, "the posted request was rung");

    let err = post(&a, &[wr(&three)]).unwrap_err();
    assert_eq!(err.posted(), 0);
    assert_eq!(t.notifications(), 1);

    // Receives go straight to the RQ; a full queue is refused without the device.
    let caps = a.caps();
    let recv = [RecvWr {
        wr_id: 0,
        sg_list: &one,
    }];
    for _ in 0..caps.max_recv_wr {
        a.post_recv(&recv).unwrap();
    }
    assert_eq!(a.post_recv(&recv), Err((0, PostError::QueueFull)));
}

#[test]
fn device_failures_map_to_verbs_errors_and_leave_nothing_behind() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();

    t.inject(Fault::Fail(
        Opcode::CreateCq,
        StatusError::new(Status::Quota),
    ));
    let err = Cq::new(&ctx, 8).unwrap_err();
    assert!(matches!(
        &err,
        VerbsError::Status { opcode: Opcode::CreateCq, source } if source.status() == Status::Quota
    ));

    t.inject(Fault::Fail(Opcode::AllocPd, StatusError::device_error(12)));
    let err = ctx.alloc_pd().unwrap_err();
    assert!(err.to_string().contains("ALLOC_PD"), "{err}");
    assert!(err.to_string().contains("errno 12"), "{err}");

    t.inject(Fault::Truncate(Opcode::QueryPort));
    let err = ctx.query_port(1).unwrap_err();
    assert!(
        matches!(
            err,
            VerbsError::Protocol(ProtocolError::Response {
                opcode: Opcode::QueryPort,
                ..
            })
        ),
        "{err}"
    );

    // Bad ring descriptions: refused, and the half-created object is destroyed.
    t.device().log.clear();
    t.inject(Fault::RingOutsideRegion);
    let err = Cq::new(&ctx, 8).unwrap_err();
    assert!(
        matches!(err, VerbsError::Protocol(ProtocolError::Ring(_))),
        "{err}"
    );
    assert_eq!(t.device().ops(), [Opcode::CreateCq, Opcode::DestroyCq]);

    let cq = Cq::new(&ctx, 8).unwrap();
    t.device().log.clear();
    t.inject(Fault::RingHeaderMismatch);
    let init = QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: &cq,
        recv_cq: &cq,
        caps: rc_caps(),
        sq_sig_all: false,
    };
    let err = Qp::new(&pd, &init).unwrap_err();
    assert!(
        matches!(err, VerbsError::Protocol(ProtocolError::Queue(_))),
        "{err}"
    );
    assert_eq!(t.device().ops(), [Opcode::CreateQp, Opcode::DestroyQp]);

    // Caps beyond the device's limits: the device says INVALID.
    let big = QpInitAttr {
        caps: QpCaps {
            max_send_sge: MAX_SGE + 1,
            ..rc_caps()
        },
        ..init
    };
    assert_eq!(
        status_of(&Qp::new(&pd, &big).unwrap_err()),
        Some(Status::Invalid)
    );
    // Registering memory that is not DMA memory fails before any command.
    let stack = [0u8; 64];
    // SAFETY: refused before registration; nothing keeps the address.
    let err = unsafe { pd.register_raw(stack.as_ptr(), stack.len(), AccessFlags::empty()) };
    assert!(matches!(err, Err(VerbsError::Transport(_))));
    assert!(matches!(
        Cq::new(&ctx, 0),
        Err(VerbsError::InvalidArgument(_))
    ));

    drop(cq);
    drop(pd);
    assert!(t.device().is_empty());
}

#[test]
fn completion_events_reach_the_waiter_of_their_cq() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (Cq::new(&ctx, 16).unwrap(), Cq::new(&ctx, 16).unwrap());
    let (a, b) = connected_pair(&pd, &cq_a, &cq_b);
    let buf = ctx.alloc_buffer(64).unwrap();
    let mr = pd.register(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    let sge = [mr.sge(0, 16).unwrap()];

    assert!(!cq_a.wait_event(Some(Duration::from_millis(20))).unwrap());
    cq_a.arm(false).unwrap();
    cq_b.arm(false).unwrap();
    b.post_recv(&[RecvWr {
        wr_id: 9,
        sg_list: &sge,
    }])
    .unwrap();
    post(
        &a,
        &[SendWr {
            wr_id: 8,
            opcode: WrOpcode::Send,
            flags: SendFlags::SIGNALED,
            sg_list: &sge,
            ..SendWr::default()
        }],
    )
    .unwrap();
    // An asynchronous event and an event of an unknown CQ arrive first.
    t.post_event(event(EventType::QpFatal, a.handle()));
    t.post_event(event(EventType::Completion, 0x7777));
    assert_eq!(t.run_kernel(), 2, "both armed CQs fired");

    // B's waiter reads past A's completion and the QP event, which stay for their waiters.
    assert!(cq_b.wait_event(Some(WAIT)).unwrap());
    assert!(cq_a.wait_event(Some(WAIT)).unwrap());
    assert_eq!(
        ctx.next_event(Some(WAIT)).unwrap(),
        Some(DeviceEvent::QpFatal { qp: a.handle() })
    );
    assert_eq!(
        ctx.next_event(Some(Duration::from_millis(20))).unwrap(),
        None
    );
    assert!(
        !cq_a.wait_event(Some(Duration::from_millis(20))).unwrap(),
        "one event per arm"
    );
    assert_eq!(poll_all(&cq_a)[0].wr_id, 8);
    assert_eq!(poll_all(&cq_b)[0].wr_id, 9);

    // Two threads wait on two CQs at once; events arrive in the "wrong" order.
    cq_a.arm(false).unwrap();
    cq_b.arm(true).unwrap();
    std::thread::scope(|s| {
        let wa = s.spawn(|| cq_a.wait_event(Some(WAIT)).unwrap());
        let wb = s.spawn(|| cq_b.wait_event(Some(WAIT)).unwrap());
        std::thread::sleep(Duration::from_millis(50));
        t.post_event(event(EventType::Completion, cq_b.handle()));
        t.post_event(event(EventType::Completion, cq_a.handle()));
        assert!(wa.join().unwrap());
        assert!(wb.join().unwrap());
    });
    let armed =
        t.device()
            .log
            .iter()
            .rev()
            .find_map(|(_, raw)| match ControlRequest::decode(raw) {
                Ok(ControlRequest::ArmCq(r)) => Some(r),
                _ => None,
            });
    assert_eq!(armed.unwrap().flags.get(), sv::arm_flags::SOLICITED_ONLY);
}

#[test]
fn ud_sends_name_the_address_handle() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let cq = Cq::new(&ctx, 16).unwrap();
    let (a, b) = (
        create_qp(&pd, &cq, QpType::Ud),
        create_qp(&pd, &cq, QpType::Ud),
    );
    a.ud_to_rts(1, 0x1111_1111, 0).unwrap();
    b.ud_to_rts(1, 0x1111_1111, 0).unwrap();
    assert!(matches!(
        a.to_init(1, AccessFlags::empty()),
        Err(VerbsError::InvalidArgument(_))
    ));
    let masks: Vec<u32> = modify_requests(&t)
        .iter()
        .map(|m| m.attr_mask.get())
        .collect();
    use qp_attr::*;
    assert_eq!(
        masks[..3],
        [STATE | PKEY_INDEX | PORT | QKEY, STATE, STATE | SQ_PSN]
    );

    let ah = Ah::new(
        &pd,
        &AhAttr {
            grh: Some(GlobalRoute {
                dgid: Gid(LOCAL_GID),
                hop_limit: 1,
                ..GlobalRoute::default()
            }),
            port_num: 1,
            ..AhAttr::default()
        },
    )
    .unwrap();
    assert_ne!(ah.rxe().ah_num, 0);
    assert_eq!(&ah.rxe().av.as_bytes()[8..24], &LOCAL_GID);

    let buf = ctx.alloc_buffer(256).unwrap();
    let mr = pd.register(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    let recv = [mr.sge(0, 128).unwrap()];
    b.post_recv(&[RecvWr {
        wr_id: 5,
        sg_list: &recv,
    }])
    .unwrap();
    let payload = *b"datagram";
    let sge = [Sge {
        addr: payload.as_ptr() as u64,
        length: payload.len() as u32,
        lkey: 0,
    }];
    post(
        &a,
        &[SendWr {
            wr_id: 6,
            opcode: WrOpcode::Send,
            flags: SendFlags::SIGNALED | SendFlags::INLINE,
            sg_list: &sge,
            ud: Some(ah.dest(b.qpn(), 0x1111_1111)),
            ..SendWr::default()
        }],
    )
    .unwrap();
    t.run_kernel();
    let wcs = poll_all(&cq);
    assert_eq!(wcs.len(), 2);
    assert!(wcs.iter().all(|wc| wc.status == WcStatus::Success));
    assert_eq!(&buf.as_slice()[..8], b"datagram");
}

#[test]
fn mr_sges_stay_inside_the_region() {
    let (_t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let buf = ctx.alloc_buffer(100).unwrap();
    let mr: Mr<'_> = pd.register(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(mr.sge(90, 10).unwrap().addr, mr.addr() + 90);
    assert!(mr.sge(90, 11).is_none());
    assert!(mr.sge(usize::MAX, 2).is_none());
    assert!(matches!(
        pd.register(&buf, AccessFlags::REMOTE_WRITE),
        Err(VerbsError::InvalidArgument(_))
    ));
    let owned = pd
        .register_owned(ctx.alloc_buffer(10).unwrap(), AccessFlags::empty())
        .unwrap();
    assert_eq!(owned.buffer().unwrap().as_ptr() as u64, owned.addr());
}

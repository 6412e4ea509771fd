//! The per-guest device (`GuestDevice`) driven through the `DeviceHandler` API on a host without
//! RDMA: a fake host device counts live objects and hands out queue buffers from a memfd; a
//! fake frontend serves SHMEM_MAP/UNMAP on a real backend channel and checks the placement
//! rules QEMU enforces (in bounds, no overlap, exact unmap).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use vhost::vhost_user::message::VhostUserMMap;
use vhost::vhost_user::{Backend, FrontendReqHandler, VhostUserFrontendReqHandler};
use vhost_user_backend::VhostUserBackend;
use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap,
};
use vrdma_backend::guest::device::{GuestDevice, GuestDeviceFactory};
use vrdma_backend::guest::options::DeviceOptions;
use vrdma_backend::host::{self, *};
use vrdma_backend::resources::Quotas;
use vrdma_backend::vhost_device::guest_context::GuestContext;
use vrdma_backend::vhost_device::handler::{CommandRejection, DeviceHandler};
use vrdma_backend::vhost_device::VhostUserDevice;
use vrdma_spec::config::{ring_format, DeviceConfig};
use vrdma_spec::control::{encode_page_list, HEADER_SIZE, MAX_RESPONSE_SIZE};
use vrdma_spec::doorbell::{area_bytes, HEAD_WORD, RING_WORD, TAIL_WORD};
use vrdma_spec::features::*;
use vrdma_spec::verbs::{access, qp_attr};
use vrdma_spec::wire::{self, *};
use vrdma_spec::{
    rxe_v1, ControlRequest, ControlResponse, Le16, Le32, Le64, Opcode, RegMr, ResponseBody, Status,
};
use zerocopy::FromZeros;

const PAGE: u64 = 4096;
/// Guest RAM: one region, not at 0, so that low addresses are outside it.
const RAM_BASE: u64 = 0x10_0000;
const RAM_SIZE: u64 = 16 << 20;
const SHM_SIZE: u64 = 1 << 20;
const GID0: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

// ------------------------------------------------------------------ fake host device

#[derive(Default)]
struct World {
    next_handle: u32,
    next_offset: u64,
    pds: BTreeMap<u32, ()>,
    mrs: BTreeMap<u32, MrInit>,
    cqs: BTreeMap<u32, u64>,
    qps: BTreeMap<u32, (u32, u64)>,
    srqs: BTreeMap<u32, u64>,
    ahs: BTreeMap<u32, ()>,
    kicks: Vec<u32>,
    armed: Vec<(u32, bool)>,
    modified: Vec<(u32, QpAttrMask, host::QpState)>,
    qp_state: HashMap<u32, host::QpState>,
    comp_events: VecDeque<CompEvent>,
    async_events: VecDeque<AsyncEvent>,
    fail_next: Option<&'static str>,
}

impl World {
    fn handle(&mut self) -> u32 {
        self.next_handle += 1;
        self.next_handle
    }

    fn fail(&mut self, op: &'static str) -> host::Result<()> {
        if self.fail_next == Some(op) {
            self.fail_next = None;
            return Err(DeviceError::Command {
                command: op,
                errno: libc::EINVAL,
            });
        }
        Ok(())
    }

    /// A queue buffer the way rxe sizes it.
    fn buffer(&mut self, slots: u32, entry_bytes: usize) -> QueueBuffer {
        let elem = entry_bytes.next_power_of_two().max(64) as u64;
        let len = (384 + u64::from(slots) * elem).next_multiple_of(PAGE);
        let offset = self.next_offset;
        self.next_offset += len;
        QueueBuffer {
            offset,
            len: len as usize,
        }
    }

    fn live(&self) -> usize {
        self.pds.len()
            + self.mrs.len()
            + self.cqs.len()
            + self.qps.len()
            + self.srqs.len()
            + self.ahs.len()
    }
}

type Shared = Arc<Mutex<World>>;

fn world(shared: &Shared) -> std::sync::MutexGuard<'_, World> {
    shared.lock().unwrap()
}

struct FakeDevice {
    info: DeviceInfo,
    world: Shared,
}

impl FakeDevice {
    fn new() -> Arc<FakeDevice> {
        Arc::new(FakeDevice {
            info: DeviceInfo {
                name: "fake0".into(),
                driver: "fake".into(),
                uverbs_path: PathBuf::from("/dev/null"),
                fw_ver: "1.2.3".into(),
                ports: vec![PortInfo {
                    port: 1,
                    state: PortState::Active,
                    link_layer: "Ethernet".into(),
                }],
            },
            world: Shared::default(),
        })
    }
}

impl HostDevice for FakeDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn ring_format(&self) -> u32 {
        ring_format::RXE_V1
    }

    fn gid_table(&self, port: u8) -> host::Result<Vec<host::GidEntry>> {
        assert_eq!(port, 1, "the guest's port 1 is host port 1");
        Ok(vec![host::GidEntry {
            index: 0,
            gid: GID0,
            gid_type: Some(GidType::RoceV2),
        }])
    }

    fn open_context(&self) -> host::Result<Box<dyn HostContext>> {
        Ok(Box::new(FakeContext {
            world: Arc::clone(&self.world),
            queue_file: memfd(64 << 20),
            comp: UnixStream::pair().unwrap().0,
            async_fd: UnixStream::pair().unwrap().0,
        }))
    }
}

struct FakeContext {
    world: Shared,
    queue_file: File,
    comp: UnixStream,
    async_fd: UnixStream,
}

fn device_attr() -> host::DeviceAttr {
    host::DeviceAttr {
        max_mr_size: u64::MAX,
        page_size_cap: 0xffff_f000,
        vendor_id: 0xffffff,
        max_qp: 1 << 16,
        max_qp_wr: 1 << 14,
        device_cap_flags: 0xffff_ffff,
        max_sge: 32,
        max_sge_rd: 32,
        max_cq: 1 << 16,
        max_cqe: 1 << 15,
        max_mr: 1 << 18,
        max_pd: 1 << 16,
        max_qp_rd_atom: 128,
        max_res_rd_atom: 1 << 16,
        max_qp_init_rd_atom: 128,
        max_ah: 1 << 15,
        max_srq: 1 << 10,
        max_srq_wr: 1 << 14,
        max_srq_sge: 27,
        max_pkeys: 64,
        phys_port_cnt: 1,
        ..Default::default()
    }
}

impl HostContext for FakeContext {
    fn queue_fd(&self) -> BorrowedFd<'_> {
        self.queue_file.as_fd()
    }
    fn cmd_fd(&self) -> BorrowedFd<'_> {
        self.queue_file.as_fd()
    }
    fn async_fd(&self) -> BorrowedFd<'_> {
        self.async_fd.as_fd()
    }
    fn comp_channel_fd(&self) -> BorrowedFd<'_> {
        self.comp.as_fd()
    }
    fn num_comp_vectors(&self) -> u32 {
        1
    }
    fn query_device(&self) -> host::Result<host::DeviceAttr> {
        Ok(device_attr())
    }
    fn query_port(&self, port: u8) -> host::Result<host::PortAttr> {
        assert_eq!(port, 1);
        Ok(host::PortAttr {
            state: 4,
            max_mtu: 5,
            active_mtu: 3,
            gid_tbl_len: 16,
            pkey_tbl_len: 1,
            link_layer: 2,
            ..Default::default()
        })
    }
    fn alloc_pd(&self) -> host::Result<PdHandle> {
        let mut w = world(&self.world);
        w.fail("ALLOC_PD")?;
        let h = w.handle();
        w.pds.insert(h, ());
        Ok(PdHandle(h))
    }
    fn dealloc_pd(&self, pd: PdHandle) -> host::Result<()> {
        let mut w = world(&self.world);
        w.fail("DEALLOC_PD")?;
        assert!(
            !w.mrs.values().any(|m| m.pd == pd),
            "PD freed while an MR uses it"
        );
        w.pds.remove(&pd.0).map(|_| ()).ok_or(DeviceError::Command {
            command: "DEALLOC_PD",
            errno: libc::EINVAL,
        })
    }
    fn reg_mr(&self, init: &MrInit) -> host::Result<Mr> {
        let mut w = world(&self.world);
        w.fail("REG_MR")?;
        assert!(w.pds.contains_key(&init.pd.0));
        assert_eq!(init.start % PAGE, init.iova % PAGE, "same in-page offset");
        let h = w.handle();
        w.mrs.insert(h, *init);
        Ok(Mr {
            handle: MrHandle(h),
            lkey: h << 8,
            rkey: (h << 8) | 1,
        })
    }
    fn dereg_mr(&self, mr: MrHandle) -> host::Result<()> {
        let mut w = world(&self.world);
        w.fail("DEREG_MR")?;
        w.mrs.remove(&mr.0).map(|_| ()).ok_or(DeviceError::Command {
            command: "DEREG_MR",
            errno: libc::EINVAL,
        })
    }
    fn create_cq(&self, init: &CqInit) -> host::Result<Cq> {
        let mut w = world(&self.world);
        w.fail("CREATE_CQ")?;
        assert!(init.use_comp_channel);
        let slots = (init.cqe + 1).next_power_of_two();
        let buffer = w.buffer(slots, 72);
        let h = w.handle();
        w.cqs.insert(h, init.user_handle);
        Ok(Cq {
            handle: CqHandle(h),
            cqe: slots - 1,
            buffer,
        })
    }
    fn destroy_cq(&self, cq: CqHandle) -> host::Result<()> {
        let mut w = world(&self.world);
        w.fail("DESTROY_CQ")?;
        w.cqs.remove(&cq.0).map(|_| ()).ok_or(DeviceError::Command {
            command: "DESTROY_CQ",
            errno: libc::EINVAL,
        })
    }
    fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> host::Result<()> {
        world(&self.world).armed.push((cq.0, solicited_only));
        Ok(())
    }
    fn create_qp(&self, init: &QpInit) -> host::Result<Qp> {
        let mut w = world(&self.world);
        w.fail("CREATE_QP")?;
        let c = init.caps;
        let send_slots = (c.max_send_wr + 1).next_power_of_two();
        let wqe = (c.max_send_sge * 16).max(c.max_inline_data);
        let sq = w.buffer(send_slots, rxe_v1::send_wqe_size(wqe / 16, wqe));
        let (rq, max_recv_wr) = match init.srq {
            Some(_) => (None, 0),
            None => {
                let slots = (c.max_recv_wr + 1).next_power_of_two();
                (
                    Some(w.buffer(slots, rxe_v1::recv_wqe_size(c.max_recv_sge))),
                    slots - 1,
                )
            }
        };
        let h = w.handle();
        let qpn = 0x100 + h;
        w.qps.insert(h, (qpn, init.user_handle));
        w.qp_state.insert(h, host::QpState::Reset);
        Ok(Qp {
            handle: QpHandle(h),
            qpn,
            caps: QpCaps {
                max_send_wr: send_slots - 1,
                max_recv_wr,
                max_send_sge: wqe / 16,
                max_recv_sge: c.max_recv_sge,
                max_inline_data: wqe,
            },
            sq,
            rq,
        })
    }
    fn modify_qp(&self, qp: QpHandle, attr: &host::QpAttr, mask: QpAttrMask) -> host::Result<()> {
        let mut w = world(&self.world);
        w.fail("MODIFY_QP")?;
        if mask.contains(QpAttrMask::STATE) {
            w.qp_state.insert(qp.0, attr.qp_state);
        }
        w.modified.push((qp.0, mask, attr.qp_state));
        Ok(())
    }
    fn query_qp(&self, qp: QpHandle, _mask: QpAttrMask) -> host::Result<QpInfo> {
        let w = world(&self.world);
        let state = *w.qp_state.get(&qp.0).ok_or(DeviceError::Command {
            command: "QUERY_QP",
            errno: libc::EINVAL,
        })?;
        Ok(QpInfo {
            attr: host::QpAttr {
                qp_state: state,
                port_num: 1,
                ..Default::default()
            },
            caps: QpCaps {
                max_send_wr: 15,
                ..Default::default()
            },
            sq_sig_all: false,
        })
    }
    fn destroy_qp(&self, qp: QpHandle) -> host::Result<()> {
        let mut w = world(&self.world);
        w.fail("DESTROY_QP")?;
        w.qp_state.remove(&qp.0);
        w.qps.remove(&qp.0).map(|_| ()).ok_or(DeviceError::Command {
            command: "DESTROY_QP",
            errno: libc::EINVAL,
        })
    }
    fn create_srq(&self, init: &SrqInit) -> host::Result<Srq> {
        let mut w = world(&self.world);
        w.fail("CREATE_SRQ")?;
        let slots = (init.max_wr + 1).next_power_of_two();
        let buffer = w.buffer(slots, rxe_v1::recv_wqe_size(init.max_sge));
        let h = w.handle();
        w.srqs.insert(h, init.user_handle);
        Ok(Srq {
            handle: SrqHandle(h),
            max_wr: slots - 1,
            max_sge: init.max_sge,
            srq_num: 0x200 + h,
            buffer,
        })
    }
    fn modify_srq(&self, _srq: SrqHandle, _m: &SrqModify) -> host::Result<Option<QueueBuffer>> {
        Ok(None)
    }
    fn destroy_srq(&self, srq: SrqHandle) -> host::Result<()> {
        let mut w = world(&self.world);
        w.fail("DESTROY_SRQ")?;
        w.srqs
            .remove(&srq.0)
            .map(|_| ())
            .ok_or(DeviceError::Command {
                command: "DESTROY_SRQ",
                errno: libc::EINVAL,
            })
    }
    fn create_ah(&self, init: &AhInit) -> host::Result<Ah> {
        let mut w = world(&self.world);
        w.fail("CREATE_AH")?;
        assert_eq!(init.attr.port_num, 1);
        let h = w.handle();
        w.ahs.insert(h, ());
        Ok(Ah {
            handle: AhHandle(h),
            ah_num: h,
        })
    }
    fn destroy_ah(&self, ah: AhHandle) -> host::Result<()> {
        let mut w = world(&self.world);
        w.ahs.remove(&ah.0).map(|_| ()).ok_or(DeviceError::Command {
            command: "DESTROY_AH",
            errno: libc::EINVAL,
        })
    }
    fn kick_send(&self, qp: QpHandle) -> host::Result<()> {
        world(&self.world).kicks.push(qp.0);
        Ok(())
    }
    fn read_async_event(&self) -> host::Result<Option<AsyncEvent>> {
        Ok(world(&self.world).async_events.pop_front())
    }
    fn read_comp_event(&self) -> host::Result<Option<CompEvent>> {
        Ok(world(&self.world).comp_events.pop_front())
    }
}

fn memfd(size: u64) -> File {
    // SAFETY: memfd_create only reads the NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"vrdma-test".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
    // SAFETY: memfd_create just returned this fd and nothing else owns it.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.set_len(size).unwrap();
    file
}

// ------------------------------------------------------------------ fake frontend

/// Serves SHMEM_MAP/UNMAP like QEMU: in bounds, no overlap, unmap of exact extents.
#[derive(Default)]
struct FakeFrontend {
    maps: Mutex<BTreeMap<u64, u64>>,
    refuse: AtomicBool,
}

impl VhostUserFrontendReqHandler for FakeFrontend {
    fn shmem_map(&self, req: &VhostUserMMap, _fd: &dyn AsRawFd) -> io::Result<u64> {
        let (offset, len) = (req.shm_offset, req.len);
        let mut maps = self.maps.lock().unwrap();
        let overlaps = maps
            .iter()
            .any(|(&o, &l)| offset < o + l && o < offset + len);
        if self.refuse.load(Ordering::SeqCst)
            || len == 0
            || offset + len > SHM_SIZE
            || overlaps
            || req.flags != 1
        {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        maps.insert(offset, len);
        Ok(0)
    }

    fn shmem_unmap(&self, req: &VhostUserMMap) -> io::Result<u64> {
        let (offset, len) = (req.shm_offset, req.len);
        let mut maps = self.maps.lock().unwrap();
        match maps.get(&offset) {
            Some(&mapped) if mapped == len => {
                maps.remove(&offset);
                Ok(0)
            }
            _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }
}

impl FakeFrontend {
    fn mapped(&self) -> Vec<(u64, u64)> {
        self.maps
            .lock()
            .unwrap()
            .iter()
            .map(|(&o, &l)| (o, l))
            .collect()
    }
}

fn serve_backend_channel(frontend: Arc<FakeFrontend>) -> Backend {
    let mut handler = FrontendReqHandler::new(frontend).unwrap();
    handler.set_reply_ack_flag(true);
    // SAFETY: duplicates an fd the handler owns; the copy is owned by the stream built below.
    let fd = unsafe { libc::fcntl(handler.get_tx_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    assert!(fd >= 0);
    // SAFETY: `fd` was just duplicated and has no other owner.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    // A refused request is answered and serving goes on; a broken socket ends it.
    std::thread::spawn(move || {
        while let Ok(_) | Err(vhost::vhost_user::Error::ReqHandlerError(_)) =
            handler.handle_request()
        {}
    });
    let backend = Backend::from_stream(stream);
    backend.set_reply_ack_flag(true);
    backend.set_shmem_flag(true);
    backend
}

// ------------------------------------------------------------------ harness

struct Guest {
    backend: VhostUserDevice<GuestDevice>,
    frontend: Arc<FakeFrontend>,
    memory: GuestMemoryAtomic<GuestMemoryMmap>,
    ram: File,
}

fn options() -> DeviceOptions {
    DeviceOptions {
        shm_size: SHM_SIZE,
        max_mr_pages: 64,
        quotas: Quotas {
            pds: 4,
            mrs: 4,
            mr_bytes: 64 * PAGE,
            cqs: 4,
            qps: 3,
            srqs: 2,
            ahs: 2,
        },
        ..DeviceOptions::default()
    }
}

fn guest_memory(ram: &File) -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges_with_files([(
        GuestAddress(RAM_BASE),
        RAM_SIZE as usize,
        Some(FileOffset::new(ram.try_clone().unwrap(), 0)),
    )])
    .unwrap()
}

impl Guest {
    fn from_factory(factory: &GuestDeviceFactory, features: u64) -> Guest {
        let ram = memfd(RAM_SIZE);
        let memory = GuestMemoryAtomic::new(guest_memory(&ram));
        let device = factory.create().unwrap();
        device.features_acked(VIRTIO_F_VERSION_1 | features);
        let backend = VhostUserDevice::new(Arc::new(device), memory.clone()).unwrap();
        let frontend = Arc::new(FakeFrontend::default());
        backend.set_backend_req_fd(serve_backend_channel(Arc::clone(&frontend)));
        Guest {
            backend,
            frontend,
            memory,
            ram,
        }
    }

    fn new(device: &Arc<FakeDevice>, options: DeviceOptions, features: u64) -> Guest {
        let factory = GuestDeviceFactory::new(device.clone(), options).unwrap();
        Guest::from_factory(&factory, features)
    }

    fn dev(&self) -> &GuestDevice {
        self.backend.handler()
    }

    fn ctx(&self) -> &GuestContext {
        self.backend.context()
    }

    fn raw(&self, request: &[u8], capacity: usize) -> Vec<u8> {
        let mut response = Vec::new();
        if request.len() > self.dev().max_request_size() {
            let rejection = CommandRejection::RequestTooLarge {
                len: request.len(),
                max: self.dev().max_request_size(),
            };
            self.dev()
                .reject_command(self.ctx(), rejection, &mut response);
        } else {
            self.dev()
                .handle_command(self.ctx(), request, capacity, &mut response);
        }
        assert!(response.len() <= capacity.max(HEADER_SIZE));
        response
    }

    fn run(&self, request: ControlRequest<'_>) -> ControlResponse {
        let bytes = self.raw(&request.to_vec(), MAX_RESPONSE_SIZE);
        ControlResponse::decode(request.opcode(), &bytes).unwrap()
    }

    fn ok(&self, request: ControlRequest<'_>) -> ResponseBody {
        match self.run(request) {
            ControlResponse::Ok(body) => body,
            ControlResponse::Err(e) => panic!("{:?} failed: {e}", request.opcode()),
        }
    }

    fn status(&self, request: ControlRequest<'_>) -> Status {
        match self.run(request) {
            ControlResponse::Ok(_) => Status::Ok,
            ControlResponse::Err(e) => e.status(),
        }
    }

    fn alloc_pd(&self) -> u32 {
        match self.ok(ControlRequest::AllocPd) {
            ResponseBody::AllocPd(r) => r.handle.get(),
            other => panic!("{other:?}"),
        }
    }

    fn create_cq(&self, cqe: u32) -> CreateCqResp {
        match self.ok(ControlRequest::CreateCq(CreateCqReq {
            cqe: Le32::new(cqe),
            reserved: Le32::ZERO,
        })) {
            ResponseBody::CreateCq(r) => r,
            other => panic!("{other:?}"),
        }
    }

    fn set_doorbell_area(&self, gpa: u64) -> Status {
        self.status(ControlRequest::SetDoorbellArea(SetDoorbellAreaReq {
            gpa: Le64::new(gpa),
            slots: Le32::new(self.dev().options().doorbell_slots()),
            reserved: Le32::ZERO,
        }))
    }

    fn create_qp(&self, req: CreateQpReq) -> Result<CreateQpResp, Status> {
        match self.run(ControlRequest::CreateQp(req)) {
            ControlResponse::Ok(ResponseBody::CreateQp(r)) => Ok(r),
            ControlResponse::Ok(other) => panic!("{other:?}"),
            ControlResponse::Err(e) => Err(e.status()),
        }
    }

    fn config(&self) -> DeviceConfig {
        DeviceConfig::decode(&self.dev().config_space()).unwrap()
    }
}

fn handle(h: u32) -> HandleReq {
    HandleReq {
        handle: Le32::new(h),
        reserved: Le32::ZERO,
    }
}

fn qp_req(pd: u32, cq: u32, srq: u32) -> CreateQpReq {
    CreateQpReq {
        pd: Le32::new(pd),
        send_cq: Le32::new(cq),
        recv_cq: Le32::new(cq),
        srq: Le32::new(srq),
        max_send_wr: Le32::new(16),
        max_recv_wr: Le32::new(if srq == 0 { 16 } else { 0 }),
        max_send_sge: Le32::new(2),
        max_recv_sge: Le32::new(if srq == 0 { 2 } else { 0 }),
        max_inline_data: Le32::new(64),
        qp_type: 2,
        sq_sig_all: 0,
        reserved: Le16::ZERO,
    }
}

fn reg_mr_req(pd: u32, iova: u64, length: u64, access: u32, npages: u32) -> RegMrReq {
    RegMrReq {
        pd: Le32::new(pd),
        access: Le32::new(access),
        iova: Le64::new(iova),
        length: Le64::new(length),
        page_shift: Le32::new(12),
        npages: Le32::new(npages),
    }
}

/// REG_MR of `pages` (GPAs) covering `length` bytes from iova `iova`.
fn reg_mr(guest: &Guest, pd: u32, iova: u64, length: u64, pages: &[u64]) -> ControlResponse {
    let mut list = Vec::new();
    encode_page_list(pages.iter().copied(), &mut list);
    let req = reg_mr_req(pd, iova, length, access::LOCAL_WRITE, pages.len() as u32);
    guest.run(ControlRequest::RegMr(RegMr::new(req, &list)))
}

const ALL_FEATURES: u64 = VRDMA_F_RING_RXE_V1 | VRDMA_F_SRQ | VRDMA_F_UD;

// ------------------------------------------------------------------ tests

#[test]
fn configuration_space_and_features() {
    let fake = FakeDevice::new();
    let guest = Guest::new(&fake, options(), ALL_FEATURES);
    let dev = guest.dev();
    assert_eq!(dev.device_features(), VRDMA_F_RING_RXE_V1 | VRDMA_F_SRQ);
    let config = guest.config();
    assert_eq!(config.ring_format.get(), ring_format::RXE_V1);
    assert_eq!(config.num_ports.get(), 1);
    assert_eq!(config.shm_size.get(), SHM_SIZE);
    assert_eq!(config.shm_page_shift.get(), 12);
    assert_eq!(config.doorbell_slots.get(), 4, "QP quota 3 rounded up");
    assert_eq!(config.max_mr_pages.get(), 64);
    assert_eq!(config.max_request_size.get(), 8 + 32 + 8 * 64);
    assert_eq!(config.max_response_size.get(), 200);
    assert_eq!(dev.shmem_size(), SHM_SIZE);
    assert_eq!(dev.watched_fds().len(), 2);

    // A driver without a ring format sees format 0 and cannot create queues.
    dev.features_acked(VIRTIO_F_VERSION_1);
    assert_eq!(guest.config().ring_format.get(), ring_format::NONE);
    let cq = CreateCqReq {
        cqe: Le32::new(8),
        reserved: Le32::ZERO,
    };
    assert_eq!(
        guest.status(ControlRequest::CreateCq(cq)),
        Status::Unsupported
    );
    // A driver that did not accept VERSION_1 gets nothing done.
    dev.features_acked(ALL_FEATURES);
    assert_eq!(guest.status(ControlRequest::AllocPd), Status::Unsupported);
    assert_eq!(world(&fake.world).live(), 0);

    let ud = DeviceOptions {
        allow_ud: true,
        ..options()
    };
    let guest = Guest::new(&fake, ud, ALL_FEATURES);
    assert_eq!(guest.dev().device_features(), ALL_FEATURES);
}

#[test]
fn queries() {
    let fake = FakeDevice::new();
    let guest = Guest::new(&fake, options(), VRDMA_F_RING_RXE_V1);
    let ResponseBody::QueryDevice(attr) = guest.ok(ControlRequest::QueryDevice) else {
        panic!()
    };
    assert_eq!(attr.max_qp.get(), 3, "capped by the quota");
    assert_eq!(attr.max_pd.get(), 4);
    assert_eq!(attr.max_srq.get(), 0, "SRQ not negotiated");
    assert_eq!(attr.max_ah.get(), 0, "UD not negotiated");
    assert_eq!(attr.max_mr_bytes.get(), 64 * PAGE);
    assert_eq!(attr.max_mr_size.get(), 64 * PAGE);
    assert_eq!(attr.max_inline_data.get(), 32 * 16);
    assert_eq!(attr.phys_port_cnt, 1);
    assert_eq!(&attr.fw_ver[..6], b"1.2.3\0");
    assert_eq!(
        attr.device_cap_flags.get() & (1 << 17),
        0,
        "no memory windows"
    );

    let port = |n| QueryPortReq {
        port_num: Le32::new(n),
        reserved: Le32::ZERO,
    };
    let ResponseBody::QueryPort(p) = guest.ok(ControlRequest::QueryPort(port(1))) else {
        panic!()
    };
    assert_eq!(
        (p.state.get(), p.gid_tbl_len.get(), p.link_layer),
        (4, 16, 2)
    );
    assert_eq!(
        guest.status(ControlRequest::QueryPort(port(2))),
        Status::Invalid
    );
    assert_eq!(
        guest.status(ControlRequest::QueryPort(port(0))),
        Status::Invalid
    );

    let table = |port, index| QueryTableReq {
        port_num: Le32::new(port),
        index: Le32::new(index),
    };
    let ResponseBody::QueryGid(g) = guest.ok(ControlRequest::QueryGid(table(1, 0))) else {
        panic!()
    };
    assert_eq!(
        (g.gid, g.gid_type.get(), g.flags.get()),
        (GID0, 2, GID_FLAG_VALID)
    );
    let ResponseBody::QueryGid(g) = guest.ok(ControlRequest::QueryGid(table(1, 5))) else {
        panic!()
    };
    assert_eq!(
        (g.gid, g.flags.get()),
        ([0; 16], 0),
        "empty entry, not an error"
    );
    assert_eq!(
        guest.status(ControlRequest::QueryGid(table(1, 16))),
        Status::Invalid
    );
    assert_eq!(
        guest.status(ControlRequest::QueryGid(table(2, 0))),
        Status::Invalid
    );
    let ResponseBody::QueryPkey(k) = guest.ok(ControlRequest::QueryPkey(table(1, 0))) else {
        panic!()
    };
    assert_eq!(k.pkey.get(), 0xffff);
    assert_eq!(
        guest.status(ControlRequest::QueryPkey(table(1, 1))),
        Status::Invalid
    );
}

#[test]
fn pd_and_mr_lifecycle_with_references() {
    let fake = FakeDevice::new();
    let guest = Guest::new(&fake, options(), VRDMA_F_RING_RXE_V1);
    let pd = guest.alloc_pd();
    // Two pages, the MR starting 0x10 bytes into the first, pages out of order.
    let pages = [RAM_BASE + 5 * PAGE, RAM_BASE + 2 * PAGE];
    let ControlResponse::Ok(ResponseBody::RegMr(mr)) =
        reg_mr(&guest, pd, 0x7000_0010, PAGE + 8, &pages)
    else {
        panic!("REG_MR failed")
    };
    {
        let w = world(&fake.world);
        let init = w.mrs.values().next().unwrap();
        assert_eq!((init.iova, init.length), (0x7000_0010, PAGE + 8));
        // The window maps the guest's pages: what the guest wrote is at `start`.
        drop(w);
    }
    guest
        .memory
        .memory()
        .write_obj(0xfeed_f00d_u32, GuestAddress(RAM_BASE + 5 * PAGE + 0x10))
        .unwrap();
    guest
        .memory
        .memory()
        .write_obj(0xabad_cafe_u32, GuestAddress(RAM_BASE + 2 * PAGE))
        .unwrap();
    let start = world(&fake.world).mrs.values().next().unwrap().start;
    let read = |at: u64| {
        let mut word = [0u8; 4];
        let file = File::open("/proc/self/mem").unwrap();
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut word, at).unwrap();
        u32::from_ne_bytes(word)
    };
    assert_eq!(read(start), 0xfeed_f00d);
    assert_eq!(read(start + PAGE - 0x10), 0xabad_cafe);

    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::Busy
    );
    assert_eq!(
        guest.status(ControlRequest::DeregMr(handle(mr.mr.get()))),
        Status::Ok
    );
    assert_eq!(
        guest.status(ControlRequest::DeregMr(handle(mr.mr.get()))),
        Status::BadHandle
    );
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::Ok
    );
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::BadHandle
    );
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(0))),
        Status::BadHandle
    );
    assert_eq!(world(&fake.world).live(), 0);
}

#[test]
fn reg_mr_validation() {
    let fake = FakeDevice::new();
    let guest = Guest::new(&fake, options(), VRDMA_F_RING_RXE_V1);
    let pd = guest.alloc_pd();
    let status = |r: ControlResponse| match r {
        ControlResponse::Ok(_) => Status::Ok,
        ControlResponse::Err(e) => e.status(),
    };
    // Outside RAM, crossing its end, absurd addresses.
    assert_eq!(
        status(reg_mr(&guest, pd, 0, PAGE, &[0])),
        Status::BadAddress
    );
    let last = RAM_BASE + RAM_SIZE - PAGE;
    assert_eq!(
        status(reg_mr(&guest, pd, 0, 2 * PAGE, &[last, last + PAGE])),
        Status::BadAddress
    );
    let top = u64::MAX - PAGE + 1;
    assert_eq!(status(reg_mr(&guest, pd, 0, PAGE, &[top])), Status::Invalid);
    // Unaligned page, wrong page count, bad access, bad page shift.
    assert_eq!(
        status(reg_mr(&guest, pd, 0, PAGE, &[RAM_BASE + 8])),
        Status::Invalid
    );
    assert_eq!(
        status(reg_mr(&guest, pd, 0, PAGE, &[RAM_BASE, RAM_BASE])),
        Status::Invalid
    );
    let mut list = Vec::new();
    encode_page_list([RAM_BASE], &mut list);
    let bad_access = reg_mr_req(pd, 0, PAGE, access::REMOTE_WRITE, 1);
    assert_eq!(
        guest.status(ControlRequest::RegMr(RegMr::new(bad_access, &list))),
        Status::Invalid
    );
    let mut bad_shift = reg_mr_req(pd, 0, PAGE, access::LOCAL_WRITE, 1);
    bad_shift.page_shift = Le32::new(31);
    assert_eq!(
        guest.status(ControlRequest::RegMr(RegMr::new(bad_shift, &list))),
        Status::Invalid
    );
    // More pages than max_mr_pages.
    let many: Vec<u64> = (0..65).map(|i| RAM_BASE + i * PAGE).collect();
    assert_eq!(
        status(reg_mr(&guest, pd, 0, 65 * PAGE, &many)),
        Status::Invalid
    );
    // Foreign PD.
    assert_eq!(
        status(reg_mr(&guest, pd + 1, 0, PAGE, &[RAM_BASE])),
        Status::BadHandle
    );
    // Byte quota: 64 pages in all.
    let big: Vec<u64> = (0..40).map(|i| RAM_BASE + i * PAGE).collect();
    assert_eq!(status(reg_mr(&guest, pd, 0, 40 * PAGE, &big)), Status::Ok);
    assert_eq!(
        status(reg_mr(&guest, pd, 0, 40 * PAGE, &big)),
        Status::Quota
    );
    // Count quota: 4 MRs.
    for _ in 0..3 {
        assert_eq!(status(reg_mr(&guest, pd, 0, PAGE, &[RAM_BASE])), Status::Ok);
    }
    assert_eq!(
        status(reg_mr(&guest, pd, 0, PAGE, &[RAM_BASE])),
        Status::Quota
    );
    // A host failure is DEVICE_ERROR with the errno, and leaves nothing behind.
    let live = world(&fake.world).live();
    world(&fake.world).fail_next = Some("ALLOC_PD");
    match guest.run(ControlRequest::AllocPd) {
        ControlResponse::Err(e) => {
            assert_eq!(
                (e.status(), e.detail()),
                (Status::DeviceError, libc::EINVAL as u32)
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(world(&fake.world).live(), live);
    assert_eq!(guest.dev().object_counts().mrs, 4);
}

#[test]
fn queues_are_mapped_described_and_unmapped() {
    let fake = FakeDevice::new();
    let guest = Guest::new(&fake, options(), ALL_FEATURES);
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(100);
    assert_eq!(cq.cqe.get(), 127);
    cq.ring.check_rxe_v1(SHM_SIZE, PAGE).unwrap();
    assert_eq!(
        (cq.ring.num_slots.get(), cq.ring.log2_slot_size.get()),
        (128, 7)
    );
    assert_eq!(
        guest.frontend.mapped(),
        vec![(cq.ring.shm_offset.get(), u64::from(cq.ring.map_len.get()))]
    );
    let cqh = cq.cq.get();
    let too_deep = CreateCqReq {
        cqe: Le32::new((1 << 15) + 1),
        reserved: Le32::ZERO,
    };
    assert_eq!(
        guest.status(ControlRequest::CreateCq(too_deep)),
        Status::Invalid
    );

    // No QP before the doorbell area.
    assert_eq!(guest.create_qp(qp_req(pd, cqh, 0)), Err(Status::BadState));
    assert_eq!(guest.set_doorbell_area(0), Status::BadAddress);
    assert_eq!(
        guest.set_doorbell_area(RAM_BASE + RAM_SIZE),
        Status::BadAddress
    );
    assert_eq!(guest.set_doorbell_area(RAM_BASE + 8), Status::Invalid);
    let wrong_slots = SetDoorbellAreaReq {
        gpa: Le64::new(RAM_BASE),
        slots: Le32::new(8),
        reserved: Le32::ZERO,
    };
    assert_eq!(
        guest.status(ControlRequest::SetDoorbellArea(wrong_slots)),
        Status::Invalid
    );
    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);

    // Bad caps and handles.
    let mut deep = qp_req(pd, cqh, 0);
    deep.max_send_wr = Le32::new((1 << 14) + 1);
    assert_eq!(guest.create_qp(deep), Err(Status::Invalid));
    let mut sges = qp_req(pd, cqh, 0);
    sges.max_recv_sge = Le32::new(33);
    assert_eq!(guest.create_qp(sges), Err(Status::Invalid));
    assert_eq!(
        guest.create_qp(qp_req(pd, pd ^ 0x100, 0)),
        Err(Status::BadHandle)
    );
    assert_eq!(
        guest.create_qp(qp_req(cqh + 1, cqh, 0)),
        Err(Status::BadHandle)
    );

    let qp = guest.create_qp(qp_req(pd, cqh, 0)).unwrap();
    assert!(qp.doorbell_index.get() < 4);
    assert_eq!(qp.max_send_wr.get(), 31);
    qp.sq.check_rxe_v1(SHM_SIZE, PAGE).unwrap();
    qp.rq.check_rxe_v1(SHM_SIZE, PAGE).unwrap();
    // 2 SGEs or 64 inline bytes: 208 + 64 -> 512-byte slots.
    assert_eq!(qp.sq.log2_slot_size.get(), 9);
    assert_eq!(qp.rq.log2_slot_size.get(), 7);
    assert_eq!(guest.frontend.mapped().len(), 3);
    assert_eq!(guest.set_doorbell_area(RAM_BASE + PAGE), Status::Busy);

    // SRQ and a QP on it: no RQ.
    let srq_req = CreateSrqReq {
        pd: Le32::new(pd),
        max_wr: Le32::new(8),
        max_sge: Le32::new(1),
        srq_limit: Le32::new(15),
    };
    assert_eq!(
        guest.status(ControlRequest::CreateSrq(srq_req)),
        Status::Invalid
    );
    let srq_req = CreateSrqReq {
        srq_limit: Le32::new(2),
        ..srq_req
    };
    let ResponseBody::CreateSrq(srq) = guest.ok(ControlRequest::CreateSrq(srq_req)) else {
        panic!()
    };
    srq.ring.check_rxe_v1(SHM_SIZE, PAGE).unwrap();
    let srqh = srq.srq.get();
    let qp2 = guest.create_qp(qp_req(pd, cqh, srqh)).unwrap();
    assert_eq!(qp2.rq, RingDesc::new_zeroed());
    assert_ne!(qp2.doorbell_index.get(), qp.doorbell_index.get());
    let ResponseBody::QuerySrq(q) = guest.ok(ControlRequest::QuerySrq(handle(srqh))) else {
        panic!()
    };
    assert_eq!(
        (q.max_wr.get(), q.max_sge.get(), q.srq_limit.get()),
        (15, 1, 2)
    );
    let modify = |mask, limit| ModifySrqReq {
        srq: Le32::new(srqh),
        attr_mask: Le32::new(mask),
        max_wr: Le32::ZERO,
        srq_limit: Le32::new(limit),
    };
    assert_eq!(
        guest.status(ControlRequest::ModifySrq(modify(1, 0))),
        Status::Unsupported
    );
    assert_eq!(
        guest.status(ControlRequest::ModifySrq(modify(2, 15))),
        Status::Invalid
    );
    assert_eq!(
        guest.status(ControlRequest::ModifySrq(modify(2, 4))),
        Status::Ok
    );

    // Dependents keep their objects alive.
    assert_eq!(
        guest.status(ControlRequest::DestroyCq(handle(cqh))),
        Status::Busy
    );
    assert_eq!(
        guest.status(ControlRequest::DestroySrq(handle(srqh))),
        Status::Busy
    );
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::Busy
    );

    // State machine.
    let qph = qp.qp.get();
    let modify_qp = |mask: u32, state: u32| {
        let mut attr = wire::QpAttr::new_zeroed();
        attr.qp_state = Le32::new(state);
        attr.port_num = 1;
        attr.qp_access_flags = Le32::new(access::LOCAL_WRITE);
        ControlRequest::ModifyQp(ModifyQpReq {
            qp: Le32::new(qph),
            attr_mask: Le32::new(mask),
            attr,
        })
    };
    let init_mask = qp_attr::STATE | qp_attr::PKEY_INDEX | qp_attr::PORT | qp_attr::ACCESS_FLAGS;
    assert_eq!(guest.status(modify_qp(qp_attr::STATE, 3)), Status::BadState);
    assert_eq!(
        guest.status(modify_qp(qp_attr::STATE, 1)),
        Status::Invalid,
        "missing attrs"
    );
    assert_eq!(
        guest.status(modify_qp(init_mask | qp_attr::CAP, 1)),
        Status::Unsupported
    );
    assert_eq!(guest.status(modify_qp(init_mask, 1)), Status::Ok);
    assert_eq!(
        world(&fake.world).modified.last().map(|m| m.2),
        Some(host::QpState::Init)
    );
    let mut bad_pkey = modify_qp(init_mask, 1);
    if let ControlRequest::ModifyQp(r) = &mut bad_pkey {
        r.attr.pkey_index = Le16::new(1);
    }
    assert_eq!(guest.status(bad_pkey), Status::Invalid);
    let ResponseBody::QueryQp(q) = guest.ok(ControlRequest::QueryQp(QueryQpReq {
        qp: Le32::new(qph),
        attr_mask: Le32::new(qp_attr::STATE),
    })) else {
        panic!()
    };
    assert_eq!((q.attr.qp_state.get(), q.attr.port_num), (1, 1));
    assert_ne!(q.attr_mask.get() & qp_attr::STATE, 0);

    // Arming.
    let arm = ArmCqReq {
        cq: Le32::new(cqh),
        flags: Le32::new(1),
    };
    assert_eq!(guest.status(ControlRequest::ArmCq(arm)), Status::Ok);
    assert_eq!(world(&fake.world).armed.len(), 1);
    assert!(world(&fake.world).armed[0].1);

    // Teardown in order; every extent is unmapped.
    for qp in [qph, qp2.qp.get()] {
        assert_eq!(
            guest.status(ControlRequest::DestroyQp(handle(qp))),
            Status::Ok
        );
    }
    assert_eq!(
        guest.status(ControlRequest::DestroySrq(handle(srqh))),
        Status::Ok
    );
    assert_eq!(
        guest.status(ControlRequest::DestroyCq(handle(cqh))),
        Status::Ok
    );
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::Ok
    );
    assert_eq!(guest.frontend.mapped(), vec![]);
    assert_eq!(world(&fake.world).live(), 0);
    assert!(guest.dev().object_counts().is_empty());
}

#[test]
fn address_handles_need_ud_and_a_valid_vector() {
    let fake = FakeDevice::new();
    let ud = DeviceOptions {
        allow_ud: true,
        ..options()
    };
    let guest = Guest::new(&fake, ud, ALL_FEATURES);
    let pd = guest.alloc_pd();
    let ah = |sgid_index, is_global| {
        ControlRequest::CreateAh(CreateAhReq {
            pd: Le32::new(pd),
            reserved: Le32::ZERO,
            ah_attr: wire::AhAttr {
                dgid: GID0,
                flow_label: Le32::ZERO,
                sgid_index,
                hop_limit: 64,
                traffic_class: 0,
                sl: 0,
                dlid: Le16::ZERO,
                src_path_bits: 0,
                static_rate: 0,
                is_global,
                port_num: 1,
                reserved: Le16::ZERO,
            },
        })
    };
    assert_eq!(guest.status(ah(1, 1)), Status::Invalid, "empty GID entry");
    assert_eq!(guest.status(ah(0, 0)), Status::Invalid, "RoCE needs a GRH");
    let ResponseBody::CreateAh(resp) = guest.ok(ah(0, 1)) else {
        panic!()
    };
    assert_ne!(resp.ah_num.get(), 0);
    assert_eq!(
        (resp.av.port_num, resp.av.network_type, resp.av.dgid),
        (1, 2, GID0)
    );
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::Busy
    );
    assert_eq!(
        guest.status(ControlRequest::DestroyAh(handle(resp.ah.get()))),
        Status::Ok
    );
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::Ok
    );

    // Without UD negotiated.
    guest
        .dev()
        .features_acked(VIRTIO_F_VERSION_1 | VRDMA_F_RING_RXE_V1);
    let pd = guest.alloc_pd();
    let mut req = ah(0, 1);
    if let ControlRequest::CreateAh(r) = &mut req {
        r.pd = Le32::new(pd);
    }
    assert_eq!(guest.status(req), Status::Unsupported);
    let cq = guest.create_cq(4).cq.get();
    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);
    let mut ud_qp = qp_req(pd, cq, 0);
    ud_qp.qp_type = 4;
    assert_eq!(guest.create_qp(ud_qp), Err(Status::Unsupported));
    assert_eq!(
        guest.create_qp(qp_req(pd, cq, 1)),
        Err(Status::Unsupported),
        "SRQ"
    );
}

#[test]
fn doorbells_kick_exactly_the_rung_qps() {
    let fake = FakeDevice::new();
    let guest = Guest::new(&fake, options(), VRDMA_F_RING_RXE_V1);
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(16).cq.get();
    let area = RAM_BASE + 8 * PAGE;
    assert_eq!(guest.set_doorbell_area(area), Status::Ok);
    let qps: Vec<CreateQpResp> = (0..3)
        .map(|_| guest.create_qp(qp_req(pd, cq, 0)).unwrap())
        .collect();
    let host_of = |qpn: u32| {
        let w = world(&fake.world);
        *w.qps.iter().find(|(_, v)| v.0 == qpn).unwrap().0
    };
    let memory = guest.memory.memory();
    let slots = guest.dev().options().doorbell_slots();
    let word = |i: usize| GuestAddress(area + 4 * i as u64);
    let mut tail = 0u32;
    let mut ring = |index: u32| {
        memory
            .write_obj(1u32, word(RING_WORD + slots as usize + index as usize))
            .unwrap();
        memory
            .write_obj(index + 1, word(RING_WORD + (tail % slots) as usize))
            .unwrap();
        tail += 1;
        memory.write_obj(tail, word(TAIL_WORD)).unwrap();
    };
    let (a, c) = (&qps[0], &qps[2]);
    ring(c.doorbell_index.get());
    ring(a.doorbell_index.get());
    // An index of no QP and one beyond the area are dropped.
    ring(3);
    guest.dev().doorbell(guest.ctx(), &[]);
    let kicks = world(&fake.world).kicks.clone();
    assert_eq!(kicks, vec![host_of(c.qpn.get()), host_of(a.qpn.get())]);
    let head: u32 = memory.read_obj(word(HEAD_WORD)).unwrap();
    assert_eq!(head, 3);
    let pending: u32 = memory
        .read_obj(word(
            RING_WORD + slots as usize + a.doorbell_index.get() as usize,
        ))
        .unwrap();
    assert_eq!(pending, 0, "pending cleared");

    // A notification with nothing queued (and doorbellq bytes) kicks nothing.
    world(&fake.world).kicks.clear();
    guest.dev().doorbell(guest.ctx(), b"ignored");
    assert!(world(&fake.world).kicks.is_empty());

    // A destroyed QP's doorbell kicks nothing.
    assert_eq!(
        guest.status(ControlRequest::DestroyQp(handle(a.qp.get()))),
        Status::Ok
    );
    ring(a.doorbell_index.get());
    guest.dev().doorbell(guest.ctx(), &[]);
    assert!(world(&fake.world).kicks.is_empty());

    // Garbage in the whole area costs one lap and kicks only live QPs.
    for i in 0..area_bytes(slots) / 4 {
        memory.write_obj(0xffff_ffffu32, word(i)).unwrap();
    }
    guest.dev().doorbell(guest.ctx(), &[]);
    assert!(world(&fake.world).kicks.is_empty());
}

#[test]
fn quotas_at_the_limit() {
    let fake = FakeDevice::new();
    let guest = Guest::new(&fake, options(), ALL_FEATURES);
    let pds: Vec<u32> = (0..4).map(|_| guest.alloc_pd()).collect();
    assert_eq!(guest.status(ControlRequest::AllocPd), Status::Quota);
    let cqs: Vec<u32> = (0..4).map(|_| guest.create_cq(2).cq.get()).collect();
    let cq = CreateCqReq {
        cqe: Le32::new(2),
        reserved: Le32::ZERO,
    };
    assert_eq!(guest.status(ControlRequest::CreateCq(cq)), Status::Quota);
    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);
    for _ in 0..3 {
        guest.create_qp(qp_req(pds[0], cqs[0], 0)).unwrap();
    }
    assert_eq!(
        guest.create_qp(qp_req(pds[0], cqs[0], 0)),
        Err(Status::Quota)
    );
    let live = world(&fake.world).live();
    assert_eq!(live, 4 + 4 + 3);
    // Freeing one makes room again.
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pds[3]))),
        Status::Ok
    );
    guest.alloc_pd();
}

#[test]
fn queue_region_exhaustion_and_map_failures_leave_nothing() {
    let fake = FakeDevice::new();
    let small = DeviceOptions {
        shm_size: 4 * PAGE,
        ..options()
    };
    let guest = Guest::new(&fake, small, VRDMA_F_RING_RXE_V1);
    // 1023 CQEs of 128 bytes: 33 pages, more than the region.
    let cq = CreateCqReq {
        cqe: Le32::new(1000),
        reserved: Le32::ZERO,
    };
    assert_eq!(guest.status(ControlRequest::CreateCq(cq)), Status::NoMemory);
    assert_eq!(world(&fake.world).live(), 0, "host CQ destroyed again");

    guest.frontend.refuse.store(true, Ordering::SeqCst);
    let cq = CreateCqReq {
        cqe: Le32::new(4),
        reserved: Le32::ZERO,
    };
    match guest.run(ControlRequest::CreateCq(cq)) {
        ControlResponse::Err(e) => assert_eq!(e.status(), Status::DeviceError),
        other => panic!("{other:?}"),
    }
    assert_eq!(world(&fake.world).live(), 0);
    assert!(guest.dev().object_counts().is_empty());
    guest.frontend.refuse.store(false, Ordering::SeqCst);
    let created = guest.create_cq(4);
    assert_eq!(
        created.ring.shm_offset.get(),
        0,
        "the failed extent was freed"
    );
}

#[test]
fn malformed_input_is_answered_and_never_stops_the_device() {
    let fake = FakeDevice::new();
    let guest = Guest::new(&fake, options(), ALL_FEATURES);
    let status_of = |bytes: &[u8]| -> (u32, usize) {
        let r = guest.raw(bytes, MAX_RESPONSE_SIZE);
        assert!(r.len() >= HEADER_SIZE, "{bytes:?}");
        (u32::from_le_bytes(r[..4].try_into().unwrap()), r.len())
    };
    let invalid = Status::Invalid as u32;
    assert_eq!(status_of(&[]), (invalid, 8));
    assert_eq!(status_of(&[1, 0, 0]), (invalid, 8));
    assert_eq!(
        status_of(&[0x99, 0x99, 0, 0, 0, 0, 0, 0]).0,
        Status::Unsupported as u32
    );
    assert_eq!(status_of(&[0x10, 0, 1, 0, 0, 0, 0, 0]).0, invalid, "flags");
    assert_eq!(
        status_of(&[0x10, 0, 0, 0, 0, 0, 0, 1]).0,
        invalid,
        "reserved"
    );
    assert_eq!(
        status_of(&[0x10, 0, 0, 0, 0, 0, 0, 0, 0]).0,
        invalid,
        "trailing"
    );
    // Oversized request (the plumbing rejects it unread).
    let huge = vec![0u8; guest.dev().max_request_size() + 1];
    assert_eq!(status_of(&huge).0, invalid);
    // A response buffer too small for the success body: not executed.
    let alloc = ControlRequest::AllocPd.to_vec();
    let r = guest.raw(&alloc, HEADER_SIZE + 4);
    assert_eq!(u32::from_le_bytes(r[..4].try_into().unwrap()), invalid);
    assert_eq!(world(&fake.world).pds.len(), 0);
    // No room for even a status: nothing written, nothing done.
    assert!(guest.raw(&alloc, 4).is_empty());
    assert_eq!(world(&fake.world).pds.len(), 0);

    // Random bodies behind every opcode, from a fixed seed.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(4).cq.get();
    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);
    for round in 0..4000 {
        let op = Opcode::ALL[(next() % Opcode::ALL.len() as u64) as usize];
        let len = if round % 2 == 0 {
            op.request_body_len()
        } else {
            (next() % 200) as usize
        };
        let mut request = vec![0u8; HEADER_SIZE + len];
        request[..2].copy_from_slice(&(op as u16).to_le_bytes());
        for chunk in request[HEADER_SIZE..].chunks_mut(4) {
            // Mostly small numbers and live handles, so that decoding often succeeds.
            let v: u32 = match next() % 4 {
                0 => (next() % 8) as u32,
                1 => pd,
                2 => cq,
                _ => next() as u32,
            };
            let bytes = v.to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        let response = guest.raw(&request, MAX_RESPONSE_SIZE);
        let status = u32::from_le_bytes(response[..4].try_into().unwrap());
        assert!(Status::try_from(status).is_ok());
    }
    // Still serving, and every extent it placed is mapped exactly once.
    guest.ok(ControlRequest::QueryDevice);
    let counts = guest.dev().object_counts();
    assert_eq!(counts.shm_extents, guest.frontend.mapped().len());
    guest.dev().reset();
    assert_eq!(world(&fake.world).live(), 0);
}

#[test]
fn reset_releases_everything_and_bumps_the_epoch() {
    let fake = FakeDevice::new();
    let guest = Guest::new(&fake, options(), ALL_FEATURES);
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(8).cq.get();
    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);
    let qp = guest.create_qp(qp_req(pd, cq, 0)).unwrap();
    assert!(matches!(
        reg_mr(&guest, pd, 0x1000, PAGE, &[RAM_BASE + PAGE]),
        ControlResponse::Ok(_)
    ));
    let epoch = guest.config().epoch.get();
    assert_eq!(world(&fake.world).live(), 4);

    guest.dev().reset();
    // As QEMU does on a device reset.
    guest.frontend.maps.lock().unwrap().clear();
    assert_eq!(world(&fake.world).live(), 0);
    assert!(guest.dev().object_counts().is_empty());
    assert_eq!(guest.config().epoch.get(), epoch + 1);
    // Reset again: nothing to drop, nothing changes.
    guest.dev().reset();
    assert_eq!(guest.config().epoch.get(), epoch + 1);

    // The driver renegotiates; old handles are unknown; DEVICE_FATAL is owed.
    guest
        .dev()
        .features_acked(VIRTIO_F_VERSION_1 | ALL_FEATURES);
    assert_eq!(guest.ctx().events().len(), 0);
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::BadHandle
    );
    assert_eq!(guest.ctx().events().len(), 1);
    assert_eq!(guest.create_qp(qp_req(pd, cq, 0)), Err(Status::BadHandle));
    let qph = qp.qp.get();
    assert_eq!(
        guest.status(ControlRequest::DestroyQp(handle(qph))),
        Status::BadHandle
    );
    // The doorbell area went too.
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(8).cq.get();
    assert_eq!(guest.create_qp(qp_req(pd, cq, 0)), Err(Status::BadState));
    // The whole region is free again.
    assert_eq!(guest.create_cq(8).ring.shm_offset.get() % PAGE, 0);

    // Dropping the device releases what is left.
    drop(guest);
    assert_eq!(world(&fake.world).live(), 0);
}

#[test]
fn discard_state_releases_everything_and_unmaps_the_queues_itself() {
    let fake = FakeDevice::new();
    let guest = Guest::new(&fake, options(), ALL_FEATURES);
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(8).cq.get();
    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);
    guest.create_qp(qp_req(pd, cq, 0)).unwrap();
    let epoch = guest.config().epoch.get();
    assert!(!guest.frontend.mapped().is_empty());

    assert_eq!(guest.status(ControlRequest::DiscardState), Status::Ok);
    // Unlike a reset, the device removed its mappings itself (QEMU 11.1.3 crashes when it
    // removes live mappings during a reset).
    assert!(guest.frontend.mapped().is_empty());
    assert_eq!(world(&fake.world).live(), 0);
    assert!(guest.dev().object_counts().is_empty());
    assert_eq!(guest.config().epoch.get(), epoch + 1);
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::BadHandle
    );
    // The driver asked: no DEVICE_FATAL is owed.
    assert_eq!(guest.ctx().events().len(), 0);
    // Nothing left: a second discard changes nothing.
    assert_eq!(guest.status(ControlRequest::DiscardState), Status::Ok);
    assert_eq!(guest.config().epoch.get(), epoch + 1);
}

#[test]
fn guests_of_one_factory_cannot_see_each_other() {
    let fake = FakeDevice::new();
    let factory = GuestDeviceFactory::new(fake.clone(), options()).unwrap();
    let a = Guest::from_factory(&factory, ALL_FEATURES);
    let b = Guest::from_factory(&factory, ALL_FEATURES);
    assert_ne!(a.dev().id(), b.dev().id());
    let pd_a = a.alloc_pd();
    let cq_a = a.create_cq(4).cq.get();
    assert_eq!(
        b.status(ControlRequest::DeallocPd(handle(pd_a))),
        Status::BadHandle
    );
    assert_eq!(
        b.status(ControlRequest::DestroyCq(handle(cq_a))),
        Status::BadHandle
    );
    // B's objects may carry the same values; they are B's.
    let pd_b = b.alloc_pd();
    assert_eq!(
        b.status(ControlRequest::DeallocPd(handle(pd_b))),
        Status::Ok
    );
    assert_eq!(world(&fake.world).pds.len(), 1, "A's PD is untouched");
    // Each guest has its own queue region.
    assert_eq!(b.create_cq(4).ring.shm_offset.get(), 0);
    assert_eq!(a.frontend.mapped().len(), 1);
    assert_eq!(b.frontend.mapped().len(), 1);
    drop(b);
    assert_eq!(
        world(&fake.world).cqs.len(),
        1,
        "only B's objects went with B"
    );
    assert_eq!(
        a.status(ControlRequest::DestroyCq(handle(cq_a))),
        Status::Ok
    );
}

#[test]
fn host_events_become_guest_events() {
    let fake = FakeDevice::new();
    let guest = Guest::new(&fake, options(), ALL_FEATURES);
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(4).cq.get();
    let cq2 = guest.create_cq(4).cq.get();
    let user_handle = |i: usize| *world(&fake.world).cqs.values().nth(i).unwrap();
    let (uh1, uh2) = (user_handle(0), user_handle(1));
    world(&fake.world).comp_events.extend([
        CompEvent {
            cq_user_handle: uh1,
        },
        CompEvent {
            cq_user_handle: 0xdead,
        },
    ]);
    guest.dev().fd_ready(guest.ctx(), 0);
    assert_eq!(guest.ctx().events().len(), 1, "unknown CQ dropped");
    assert!(world(&fake.world).comp_events.is_empty());

    // Events of a destroyed object are not delivered.
    assert_eq!(
        guest.status(ControlRequest::DestroyCq(handle(cq2))),
        Status::Ok
    );
    world(&fake.world).comp_events.push_back(CompEvent {
        cq_user_handle: uh2,
    });
    guest.dev().fd_ready(guest.ctx(), 0);
    assert_eq!(guest.ctx().events().len(), 1);

    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);
    guest.create_qp(qp_req(pd, cq, 0)).unwrap();
    let qp_user = world(&fake.world).qps.values().next().unwrap().1;
    world(&fake.world).async_events.extend([
        AsyncEvent {
            kind: AsyncEventKind::QpFatal,
            element: qp_user,
        },
        AsyncEvent {
            kind: AsyncEventKind::PortActive,
            element: 1,
        },
        AsyncEvent {
            kind: AsyncEventKind::PortActive,
            element: 7,
        },
        AsyncEvent {
            kind: AsyncEventKind::LidChange,
            element: 1,
        },
        // A CQ event naming a QP's user handle is not a CQ event.
        AsyncEvent {
            kind: AsyncEventKind::CqErr,
            element: qp_user,
        },
    ]);
    guest.dev().fd_ready(guest.ctx(), 1);
    assert_eq!(guest.ctx().events().len(), 3);

    // A fatal host error discards everything and refuses commands until reset.
    world(&fake.world).async_events.push_back(AsyncEvent {
        kind: AsyncEventKind::DeviceFatal,
        element: 1,
    });
    guest.dev().fd_ready(guest.ctx(), 1);
    assert_eq!(guest.ctx().events().len(), 4, "DEVICE_FATAL");
    assert_eq!(world(&fake.world).live(), 0);
    match guest.run(ControlRequest::AllocPd) {
        ControlResponse::Err(e) => {
            assert_eq!(
                (e.status(), e.detail()),
                (Status::DeviceError, libc::ENODEV as u32)
            )
        }
        other => panic!("{other:?}"),
    }
    guest.dev().reset();
    guest
        .dev()
        .features_acked(VIRTIO_F_VERSION_1 | ALL_FEATURES);
    guest.alloc_pd();
}

#[test]
fn memory_changes_revoke_unbacked_mrs() {
    let fake = FakeDevice::new();
    let guest = Guest::new(&fake, options(), ALL_FEATURES);
    let pd = guest.alloc_pd();
    let ControlResponse::Ok(ResponseBody::RegMr(mr)) =
        reg_mr(&guest, pd, 0x1000, PAGE, &[RAM_BASE + 3 * PAGE])
    else {
        panic!()
    };
    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);

    // The same table again (QEMU re-sends it on unrelated changes): nothing happens.
    guest
        .memory
        .lock()
        .unwrap()
        .replace(guest_memory(&guest.ram));
    guest.dev().memory_changed(guest.ctx());
    assert_eq!(world(&fake.world).mrs.len(), 1);
    assert_eq!(guest.ctx().events().len(), 0);

    // The region is replaced by other memory: the MR is revoked.
    let other = memfd(RAM_SIZE);
    guest.memory.lock().unwrap().replace(guest_memory(&other));
    guest.dev().memory_changed(guest.ctx());
    assert_eq!(world(&fake.world).mrs.len(), 0);
    assert_eq!(guest.ctx().events().len(), 1, "MR_REVOKED");
    // The PD is free of it, the handle still deregisters once.
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::Ok
    );
    assert_eq!(
        guest.status(ControlRequest::DeregMr(handle(mr.mr.get()))),
        Status::Ok
    );
    assert_eq!(
        guest.status(ControlRequest::DeregMr(handle(mr.mr.get()))),
        Status::BadHandle
    );
    // The doorbell area was re-located in the new memory.
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(4).cq.get();
    assert!(guest.create_qp(qp_req(pd, cq, 0)).is_ok());
}

#[test]
fn factory_options_are_validated() {
    let fake = FakeDevice::new();
    let bad = |options: DeviceOptions| GuestDeviceFactory::new(fake.clone(), options).is_err();
    assert!(bad(DeviceOptions {
        shm_size: 3 * PAGE,
        ..options()
    }));
    assert!(bad(DeviceOptions {
        host_port: 2,
        ..options()
    }));
    assert!(bad(DeviceOptions {
        max_mr_pages: 0,
        ..options()
    }));
    let mut too_many = options();
    too_many.quotas.qps = (1 << 16) + 1;
    assert!(bad(too_many));
}

#[test]
fn the_daemon_reports_a_missing_rdma_stack_in_one_line() {
    let run = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_vrdma-backend"))
            .args(args)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(!output.status.success(), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("vrdma-backend: "), "{stderr}");
        stderr
    };
    let socket = std::env::temp_dir().join(format!("vrdma-cli-{}.sock", std::process::id()));
    let socket = socket.to_str().unwrap();
    let missing = run(&["--socket", socket, "--device", "no-such-rdma-device"]);
    if std::path::Path::new("/sys/class/infiniband").exists() {
        assert!(missing.contains("no RDMA device named"), "{missing}");
    } else {
        assert!(
            missing.contains("no RDMA subsystem in this kernel"),
            "{missing}"
        );
        let default = run(&["--socket", socket]);
        assert!(
            default.contains("no RDMA subsystem in this kernel"),
            "{default}"
        );
    }
    let bad_size = run(&["--socket", socket, "--shm-size", "12345"]);
    assert!(bad_size.contains("queue region size"), "{bad_size}");
    assert!(!std::path::Path::new(socket).exists());
}

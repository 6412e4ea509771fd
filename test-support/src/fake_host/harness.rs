//! A harness that runs one guest's real device (`GuestDevice` inside `VhuVrdma`) over
//! the fake host device and the fake frontend, and the control requests tests send it.

use std::fs::File;
use std::sync::Arc;

use vm_memory::{FileOffset, GuestAddress, GuestMemoryAtomic, GuestMemoryMmap};
use vrdma_backend::guest::options::DeviceOptions;
use vrdma_backend::guest_device::{GuestDevice, GuestDeviceFactory};
use vrdma_backend::identity::endpoints::LocalEndpoints;
use vrdma_backend::memory::budget::{HostBudget, HostBudgetLimits};
use vrdma_backend::resources::quotas::Quotas;
use vrdma_backend::vhost_device::guest_io::GuestIo;
use vrdma_backend::vhost_device::handler::{CommandRejection, DeviceHandler};
use vrdma_backend::vhost_device::VhuVrdma;
use vrdma_spec::config::DeviceConfig;
use vrdma_spec::control::{
    encode_extent_list, encode_page_list, RegMrExtents, HEADER_SIZE, MAX_CM_RESPONSE_SIZE,
};
use vrdma_spec::features::*;
use vrdma_spec::verbs::{AccessFlags, Mtu, QpAttrMask, QpState};
use vrdma_spec::wire::*;
use vrdma_spec::{ControlRequest, ControlResponse, Le16, Le32, Le64, RegMr, ResponseBody, Status};
use zerocopy::FromZeros;

use super::device::{memfd, FakeDevice, PAGE};
use super::frontend::{serve_backend_channel, BackendChannel, FakeFrontend};

/// Guest RAM: one region, not at 0, so that low addresses are outside it.
pub const RAM_BASE: u64 = 0x10_0000;
/// Size of guest RAM.
pub const RAM_SIZE: u64 = 16 << 20;
/// Size of the queue region of [`test_options`], and of the frontend's region.
pub const SHM_SIZE: u64 = 1 << 20;

/// One guest's device as the daemon builds it (a `GuestDevice` inside the vhost-user device),
/// over the [`FakeDevice`], with guest RAM in a memfd and a
/// [`FakeFrontend`] on the backend request channel. Commands are handed to the device the way
/// the control queue would.
pub struct TestGuest {
    /// The vhost-user device serving the guest.
    pub backend: VhuVrdma<GuestDevice>,
    /// The frontend serving SHMEM_MAP/UNMAP.
    pub frontend: Arc<FakeFrontend>,
    /// Guest RAM as the vhost-user device sees it (replace it to change the memory table).
    pub memory: GuestMemoryAtomic<GuestMemoryMmap>,
    /// The file behind guest RAM.
    pub ram: File,
    /// The frontend's side of the backend request channel (last: dropped after the device).
    _channel: BackendChannel,
}

/// Small options: a 1 MiB queue region, 64-page MRs, a few objects of each kind.
pub fn test_options() -> DeviceOptions {
    DeviceOptions {
        shm_size: SHM_SIZE,
        max_mr_pages: 64,
        quotas: Quotas {
            pds: 4,
            mrs: 4,
            mr_bytes: 64 * PAGE,
            mappings: 1024,
            cqs: 4,
            qps: 3,
            srqs: 2,
            ahs: 2,
            mws: 2,
            cm_ids: 4,
        },
        ..DeviceOptions::default()
    }
}

/// Guest RAM: [`RAM_SIZE`] bytes of `ram` at [`RAM_BASE`].
pub fn guest_memory(ram: &File) -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges_with_files([(
        GuestAddress(RAM_BASE),
        RAM_SIZE as usize,
        Some(FileOffset::new(ram.try_clone().unwrap(), 0)),
    )])
    .unwrap()
}

impl TestGuest {
    /// A new guest of `factory` whose driver accepted `features` (and VIRTIO_F_VERSION_1).
    pub fn from_factory(factory: &GuestDeviceFactory, features: u64) -> TestGuest {
        let ram = memfd(RAM_SIZE);
        let memory = GuestMemoryAtomic::new(guest_memory(&ram));
        let device = factory.create().unwrap();
        device.features_acked(VIRTIO_F_VERSION_1 | features);
        // QEMU's region is as large as the device's configuration says.
        let frontend = Arc::new(FakeFrontend::new(device.options().shm_size));
        let backend = VhuVrdma::new(Arc::new(device), memory.clone()).unwrap();
        let (channel, serving) = serve_backend_channel(Arc::clone(&frontend));
        backend.context().shmem().set_channel(channel);
        TestGuest {
            backend,
            frontend,
            memory,
            ram,
            _channel: serving,
        }
    }

    /// The first guest of a factory over `device` with `options`.
    pub fn new(device: &Arc<FakeDevice>, options: DeviceOptions, features: u64) -> TestGuest {
        let factory = GuestDeviceFactory::new(device.clone(), options).unwrap();
        TestGuest::from_factory(&factory, features)
    }

    /// The guest's device.
    pub fn dev(&self) -> &GuestDevice {
        self.backend.handler()
    }

    /// What the device reaches of the guest.
    pub fn guest_io(&self) -> &GuestIo {
        self.backend.context()
    }

    /// Runs request bytes with `capacity` writable response bytes, as the control queue would (too large a request is rejected unread); returns the response bytes.
    pub fn raw(&self, request: &[u8], capacity: usize) -> Vec<u8> {
        let mut response = Vec::new();
        if request.len() > self.dev().max_request_size() {
            let rejection = CommandRejection::RequestTooLarge {
                len: request.len(),
                max: self.dev().max_request_size(),
            };
            self.dev()
                .reject_command(self.guest_io(), rejection, &mut response);
        } else {
            self.dev()
                .handle_command(self.guest_io(), request, capacity, &mut response);
        }
        assert!(response.len() <= capacity.max(HEADER_SIZE));
        response
    }

    /// Runs a request and decodes its response (with room for the largest answer, CM_GET_EVENT's).
    pub fn run(&self, request: ControlRequest<'_>) -> ControlResponse {
        let bytes = self.raw(&request.to_vec(), MAX_CM_RESPONSE_SIZE);
        ControlResponse::decode(request.opcode(), &bytes).unwrap()
    }

    /// Runs a request that must succeed; returns its body.
    pub fn ok(&self, request: ControlRequest<'_>) -> ResponseBody {
        match self.run(request) {
            ControlResponse::Ok(body) => body,
            ControlResponse::Err(e) => panic!("{:?} failed: {e}", request.opcode()),
        }
    }

    /// Runs a request; returns its status.
    pub fn status(&self, request: ControlRequest<'_>) -> Status {
        match self.run(request) {
            ControlResponse::Ok(_) => Status::Ok,
            ControlResponse::Err(e) => e.status(),
        }
    }

    /// ALLOC_PD; returns the handle.
    pub fn alloc_pd(&self) -> u32 {
        match self.ok(ControlRequest::AllocPd) {
            ResponseBody::AllocPd(r) => r.handle.get(),
            other => panic!("{other:?}"),
        }
    }

    /// CREATE_CQ of `cqe` entries, which must succeed.
    pub fn create_cq(&self, cqe: u32) -> CreateCqResp {
        match self.ok(ControlRequest::CreateCq(CreateCqReq {
            cqe: Le32::new(cqe),
            reserved: Le32::ZERO,
        })) {
            ResponseBody::CreateCq(r) => r,
            other => panic!("{other:?}"),
        }
    }

    /// SET_DOORBELL_AREA at `gpa` with the configured slot count.
    pub fn set_doorbell_area(&self, gpa: u64) -> Status {
        self.status(ControlRequest::SetDoorbellArea(SetDoorbellAreaReq {
            gpa: Le64::new(gpa),
            slots: Le32::new(self.dev().options().doorbell_slots()),
            reserved: Le32::ZERO,
        }))
    }

    /// Queues doorbell `index` in the area at `area` and notifies, as a driver does (spec
    /// §5.3); `tail` is the driver's count of entries ever queued.
    pub fn ring_doorbell(&self, area: u64, index: u32, tail: &mut u32) {
        use vm_memory::{Bytes, GuestAddressSpace};
        use vrdma_spec::doorbell::{RING_WORD, TAIL_WORD};
        let memory = self.memory.memory();
        let slots = self.dev().options().doorbell_slots();
        let word = |i: usize| GuestAddress(area + 4 * i as u64);
        memory
            .write_obj(1u32, word(RING_WORD + slots as usize + index as usize))
            .unwrap();
        memory
            .write_obj(index + 1, word(RING_WORD + (*tail % slots) as usize))
            .unwrap();
        *tail += 1;
        memory.write_obj(*tail, word(TAIL_WORD)).unwrap();
        self.dev().doorbell(self.guest_io(), &[]);
    }

    /// CREATE_QP; the response or the failure status.
    pub fn create_qp(&self, req: CreateQpReq) -> Result<CreateQpResp, Status> {
        match self.run(ControlRequest::CreateQp(req)) {
            ControlResponse::Ok(ResponseBody::CreateQp(r)) => Ok(r),
            ControlResponse::Ok(other) => panic!("{other:?}"),
            ControlResponse::Err(e) => Err(e.status()),
        }
    }

    /// The decoded configuration space.
    pub fn config(&self) -> DeviceConfig {
        DeviceConfig::decode(&self.dev().config_space()).unwrap()
    }
}

/// The queue-region extent `(offset, length)` a ring occupies, as the fake frontend lists its
/// mappings.
pub fn extent(ring: &RingDesc) -> (u64, u64) {
    (ring.shm_offset.get(), u64::from(ring.map_len.get()))
}

/// A request naming handle `h`.
pub fn handle(h: u32) -> HandleReq {
    HandleReq {
        handle: Le32::new(h),
        reserved: Le32::ZERO,
    }
}

/// CREATE_QP of an RC QP on `pd` with `cq` for both queues and SRQ `srq` (0 for none).
/// A RoCE address vector on port 1 from guest GID `sgid_index` to `dgid` (GRH, hop limit 64,
/// traffic class and SL 0).
pub fn roce_av(sgid_index: u8, dgid: [u8; 16]) -> AhAttr {
    AhAttr {
        dgid,
        flow_label: Le32::ZERO,
        sgid_index,
        hop_limit: 64,
        traffic_class: 0,
        sl: 0,
        dlid: Le16::ZERO,
        src_path_bits: 0,
        static_rate: 0,
        is_global: 1,
        port_num: 1,
        reserved: Le16::ZERO,
    }
}

pub fn qp_req(pd: u32, cq: u32, srq: u32) -> CreateQpReq {
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

/// The fixed part of a REG_MR in 4 KiB pages.
pub fn reg_mr_req(pd: u32, iova: u64, length: u64, access: u32, npages: u32) -> RegMrReq {
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
pub fn reg_mr(
    guest: &TestGuest,
    pd: u32,
    iova: u64,
    length: u64,
    pages: &[u64],
) -> ControlResponse {
    let mut list = Vec::new();
    encode_page_list(pages.iter().copied(), &mut list);
    let req = reg_mr_req(
        pd,
        iova,
        length,
        AccessFlags::LOCAL_WRITE.bits(),
        pages.len() as u32,
    );
    guest.run(ControlRequest::RegMr(RegMr::new(req, &list)))
}

/// REG_MR_EXTENTS of `extents` (GPA, length) covering `length` bytes from iova `iova`.
pub fn reg_mr_extents(
    guest: &TestGuest,
    pd: u32,
    iova: u64,
    length: u64,
    extents: &[(u64, u64)],
) -> ControlResponse {
    let mut list = Vec::new();
    encode_extent_list(extents.iter().copied(), &mut list);
    let req = reg_mr_req(
        pd,
        iova,
        length,
        AccessFlags::LOCAL_WRITE.bits(),
        extents.len() as u32,
    );
    guest.run(ControlRequest::RegMrExtents(RegMrExtents::new(req, &list)))
}

/// Every feature the fake device offers or a test may accept.
pub const ALL_FEATURES: u64 = VRDMA_F_RING_RXE_V1
    | VRDMA_F_SRQ
    | VRDMA_F_UD
    | VRDMA_F_UC
    | VRDMA_F_UD_STAGED_SQ
    | VRDMA_F_MR_EXTENTS
    | VRDMA_F_STAGED_RINGS
    | VRDMA_F_STAGED_CQS
    | VRDMA_F_HOST_KICK
    | VRDMA_F_ODP;

/// Guests of one daemon on one fake device: one host budget and one table of tenant endpoints
/// for all of them, as `vrdma-backend` serves every socket.
pub struct TestDaemon {
    /// The device every guest's host context is on.
    pub fake: Arc<FakeDevice>,
    budget: Arc<HostBudget>,
    endpoints: Arc<LocalEndpoints>,
}

impl TestDaemon {
    /// A daemon on `fake` with this host's budget limits.
    pub fn new(fake: &Arc<FakeDevice>) -> TestDaemon {
        TestDaemon {
            fake: Arc::clone(fake),
            budget: Arc::new(HostBudget::new(HostBudgetLimits::for_this_host())),
            endpoints: LocalEndpoints::new(),
        }
    }

    /// A new guest of the daemon with `options`, its driver having accepted `features`.
    pub fn guest(&self, options: DeviceOptions, features: u64) -> TestGuest {
        let factory = GuestDeviceFactory::with_daemon(
            self.fake.clone(),
            options,
            Arc::clone(&self.budget),
            Arc::clone(&self.endpoints),
        )
        .expect("valid options");
        TestGuest::from_factory(&factory, features)
    }
}

/// INIT→RTR of RC QP `qp` towards QP number `dest_qpn` at `dgid`, from the guest's GID
/// `sgid_index` (path MTU 1024, one responder resource).
pub fn rc_to_rtr(qp: u32, sgid_index: u8, dgid: [u8; 16], dest_qpn: u32) -> ModifyQpReq {
    let mut attr = QpAttr::new_zeroed()
        .with_qp_state(QpState::Rtr)
        .with_path_mtu(Mtu::Mtu1024);
    attr.dest_qp_num = Le32::new(dest_qpn);
    attr.rq_psn = Le32::new(7);
    attr.min_rnr_timer = 12;
    attr.max_dest_rd_atomic = 1;
    attr.ah_attr = roce_av(sgid_index, dgid);
    type M = QpAttrMask;
    let mask = M::STATE
        | M::AV
        | M::PATH_MTU
        | M::DEST_QPN
        | M::RQ_PSN
        | M::MAX_DEST_RD_ATOMIC
        | M::MIN_RNR_TIMER;
    ModifyQpReq {
        qp: Le32::new(qp),
        attr_mask: Le32::new(mask.bits()),
        attr,
    }
}

impl TestGuest {
    /// Moves UD QP `qp` from RESET through INIT and RTR to RTS, as a driver does (port 1,
    /// P_Key index 0).
    pub fn ud_to_rts(&self, qp: u32, qkey: u32) {
        let mut init = QpAttr::new_zeroed().with_qp_state(QpState::Init);
        init.port_num = 1;
        init.qkey = Le32::new(qkey);
        let mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY;
        self.modify_ok(qp, init, mask);
        self.ud_to_rts_from_init(qp);
    }

    /// Moves UD QP `qp` from INIT through RTR to RTS.
    pub fn ud_to_rts_from_init(&self, qp: u32) {
        let mut rts = QpAttr::new_zeroed().with_qp_state(QpState::Rts);
        rts.sq_psn = Le32::new(1);
        let rtr = QpAttr::new_zeroed().with_qp_state(QpState::Rtr);
        self.modify_ok(qp, rtr, QpAttrMask::STATE);
        self.modify_ok(qp, rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN);
    }

    fn modify_ok(&self, qp: u32, attr: QpAttr, mask: QpAttrMask) {
        let request = ModifyQpReq {
            qp: Le32::new(qp),
            attr_mask: Le32::new(mask.bits()),
            attr,
        };
        assert_eq!(self.status(ControlRequest::ModifyQp(request)), Status::Ok);
    }
}

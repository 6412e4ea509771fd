//! Enforced UD sends (spec §9.6) on the per-guest device over the fake host device: the
//! staging ring CREATE_QP describes, the doorbell pump's copy into the host send queue, what it
//! refuses, and what a reset releases.

use std::mem::size_of;
use std::os::unix::fs::FileExt;

use vrdma_backend::datapath::staging::NEUTRALISED_AH_NUM;
use vrdma_backend::guest::options::DeviceOptions;
use vrdma_backend::vhost_device::handler::DeviceHandler;
use vrdma_spec::features::*;
use vrdma_spec::rxe_v1::{header, RxeAv, RxeSendWqe, RxeSendWrUnion, RxeSge, RxeUdWr};
use vrdma_spec::verbs::{QpAttrMask, QpState, SendFlags, WrOpcode};
use vrdma_spec::wire::*;
use vrdma_spec::{ControlRequest, Le32, Le64, ResponseBody, Status};
use vrdma_test_support::fake_host::device::*;
use vrdma_test_support::fake_host::harness::*;
use vrdma_test_support::fake_host::world::HostQueue;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

const STAGED: u64 = ALL_FEATURES;
/// What a driver without enforced UD sends accepts.
const UNSTAGED: u64 = ALL_FEATURES & !VRDMA_F_UD_STAGED_SQ;
const AREA: u64 = RAM_BASE + 8 * PAGE;

fn ud_options() -> DeviceOptions {
    DeviceOptions {
        allow_ud: true,
        ..test_options()
    }
}

fn ud_qp_req(pd: u32, cq: u32) -> CreateQpReq {
    CreateQpReq {
        qp_type: 4,
        ..qp_req(pd, cq, 0)
    }
}

fn create_ah(guest: &TestGuest, pd: u32) -> u32 {
    let req = ControlRequest::CreateAh(CreateAhReq {
        pd: Le32::new(pd),
        reserved: Le32::ZERO,
        ah_attr: roce_av(0, GID0),
    });
    match guest.ok(req) {
        ResponseBody::CreateAh(r) => r.ah.get(),
        other => panic!("{other:?}"),
    }
}

/// A guest with a staged UD QP: the guest, its QP, the host QP handle, the PD and an AH.
struct Setup {
    fake: std::sync::Arc<FakeDevice>,
    guest: TestGuest,
    qp: CreateQpResp,
    host_qp: u32,
    pd: u32,
    ah: u32,
    tail: u32,
}

impl Setup {
    fn new() -> Setup {
        let fake = FakeDevice::new();
        let guest = TestGuest::new(&fake, ud_options(), STAGED);
        let pd = guest.alloc_pd();
        let cq = guest.create_cq(16).cq.get();
        assert_eq!(guest.set_doorbell_area(AREA), Status::Ok);
        let qp = guest.create_qp(ud_qp_req(pd, cq)).unwrap();
        let host_qp = fake.world().qp_by_qpn(qp.qpn.get()).unwrap();
        let ah = create_ah(&guest, pd);
        guest.ud_to_rts(qp.qp.get(), 0x1111_1111);
        Setup {
            fake,
            guest,
            qp,
            host_qp,
            pd,
            ah,
            tail: 0,
        }
    }

    fn staging_offset(&self, at: usize) -> u64 {
        self.qp.sq.shm_offset.get() + at as u64
    }

    fn slot(&self, index: u32) -> usize {
        self.qp.sq.rxe_v1_geometry().unwrap().slot_offset(index)
    }

    /// Writes `wqe` and `sges` into staging slot `index`, as the guest's driver would.
    fn stage(&self, index: u32, wqe: &RxeSendWqe, sges: &[RxeSge]) {
        let mut bytes = wqe.as_bytes().to_vec();
        bytes.extend_from_slice(sges.as_bytes());
        self.guest
            .frontend
            .write(self.staging_offset(self.slot(index)), &bytes);
    }

    fn staging_word(&self, at: usize) -> u32 {
        let bytes = self.guest.frontend.read(self.staging_offset(at), 4);
        u32::from_le_bytes(bytes.try_into().unwrap())
    }

    fn set_staging_producer(&self, value: u32) {
        self.guest.frontend.write(
            self.staging_offset(header::PRODUCER_INDEX),
            &value.to_le_bytes(),
        );
    }

    fn host_read(&self, at: usize, len: usize) -> Vec<u8> {
        self.fake
            .world()
            .read_queue(self.host_qp, HostQueue::Send, at, len)
    }

    fn host_word(&self, at: usize) -> u32 {
        self.fake
            .world()
            .queue_word(self.host_qp, HostQueue::Send, at)
    }

    fn host_wqe(&self, index: u32) -> (RxeSendWqe, RxeSge) {
        let bytes = self.host_read(self.slot(index), size_of::<RxeSendWqe>() + 16);
        let (wqe, rest) = RxeSendWqe::read_from_prefix(&bytes).unwrap();
        (wqe, RxeSge::read_from_bytes(rest).unwrap())
    }

    /// Queues the QP's doorbell and notifies, as the driver would.
    fn ring(&mut self) {
        let index = self.qp.doorbell_index.get();
        self.guest.ring_doorbell(AREA, index, &mut self.tail);
    }

    fn moved_to_error(&self) -> bool {
        self.fake
            .world()
            .modified
            .contains(&(self.host_qp, QpAttrMask::STATE, QpState::Err))
    }
}

/// A UD SEND of 100 bytes through AH handle `ah`, with a junk embedded address vector.
fn send(wr_id: u64, ah: u32) -> (RxeSendWqe, Vec<RxeSge>) {
    let mut wqe = RxeSendWqe::new_zeroed();
    wqe.wr.wr_id = Le64::new(wr_id);
    wqe.wr.opcode = Le32::new(WrOpcode::Send as u32);
    wqe.wr.send_flags = Le32::new(SendFlags::SIGNALED.bits());
    wqe.wr.wr = RxeSendWrUnion::from_ud(RxeUdWr {
        remote_qpn: Le32::new(0x123),
        remote_qkey: Le32::new(0x1111),
        ah_num: Le32::new(ah),
        av: RxeAv {
            network_type: 1,
            sgid_addr: [0x5a; 28],
            ..RxeAv::new_zeroed()
        },
        ..RxeUdWr::new_zeroed()
    });
    wqe.dma.length = Le32::new(100);
    wqe.dma.resid = Le32::new(100);
    wqe.dma.num_sge = Le32::new(1);
    let sge = RxeSge {
        addr: Le64::new(0x4000),
        length: Le32::new(100),
        lkey: Le32::new(0x77),
    };
    (wqe, vec![sge])
}

#[test]
fn ud_qps_need_the_staged_send_queue_unless_unenforced_ud_is_allowed() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, ud_options(), UNSTAGED);
    assert_eq!(
        guest.dev().device_features() & (VRDMA_F_UD | VRDMA_F_UD_STAGED_SQ),
        VRDMA_F_UD | VRDMA_F_UD_STAGED_SQ
    );
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(16).cq.get();
    assert_eq!(guest.set_doorbell_area(AREA), Status::Ok);
    assert_eq!(guest.create_qp(ud_qp_req(pd, cq)), Err(Status::Unsupported));
    // RC QPs are not concerned.
    guest.create_qp(qp_req(pd, cq, 0)).unwrap();

    let legacy = DeviceOptions {
        allow_unenforced_ud: true,
        ..ud_options()
    };
    let guest = TestGuest::new(&fake, legacy, UNSTAGED);
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(16).cq.get();
    assert_eq!(guest.set_doorbell_area(AREA), Status::Ok);
    let qp = guest.create_qp(ud_qp_req(pd, cq)).unwrap();
    // The host buffer itself, as before.
    let host_qp = fake.world().qp_by_qpn(qp.qpn.get()).unwrap();
    let mapped = guest.frontend.mapped_file(qp.sq.shm_offset.get());
    let w = fake.world();
    let (queue_file, _) = &w.send_queues[&host_qp];
    assert!(same_inode(&mapped, queue_file));
}

fn same_inode(a: &std::fs::File, b: &std::fs::File) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (a, b) = (a.metadata().unwrap(), b.metadata().unwrap());
    (a.dev(), a.ino()) == (b.dev(), b.ino())
}

#[test]
fn the_staging_ring_is_described_as_the_send_queue() {
    let s = Setup::new();
    let sq = s.qp.sq;
    let geometry = sq.check_rxe_v1(SHM_SIZE, PAGE).unwrap();
    // Its header matches the description, so the driver's cross-check holds.
    geometry
        .check_header(
            s.staging_word(header::LOG2_ELEM_SIZE),
            s.staging_word(header::INDEX_MASK),
        )
        .unwrap();
    // What the frontend maps there is the staging file, not the host buffer, and the device
    // keeps it out of guest memory.
    let mapped = s.guest.frontend.mapped_file(sq.shm_offset.get());
    let w = s.fake.world();
    let (queue_file, _) = &w.send_queues[&s.host_qp];
    assert!(!same_inode(&mapped, queue_file));
    assert!(s.guest.dev().is_device_mapping(&mapped));
    // The RQ is the host's, mapped as for any QP.
    assert_eq!(s.guest.frontend.mapped().len(), 3, "CQ, staging ring, RQ");
}

#[test]
fn a_good_wqe_arrives_with_the_host_ah_num_and_no_embedded_vector() {
    let mut s = Setup::new();
    let (wqe, sges) = send(7, s.ah);
    s.stage(0, &wqe, &sges);
    s.set_staging_producer(1);
    s.ring();
    let (host, sge) = s.host_wqe(0);
    let host_ah = *s.fake.world().ahs.keys().next().unwrap();
    assert_eq!(host.wr.wr_id.get(), 7);
    assert_eq!(host.wr.opcode.get(), WrOpcode::Send as u32);
    let ud = host.wr.wr.ud();
    assert_eq!(
        ud.ah_num.get(),
        host_ah,
        "the host's ah_num, not the handle"
    );
    assert_eq!(ud.av, RxeAv::new_zeroed());
    assert_eq!((ud.remote_qpn.get(), ud.remote_qkey.get()), (0x123, 0x1111));
    assert_eq!(host.dma.length.get(), 100);
    assert_eq!(sge, sges[0]);
    assert_eq!(s.host_word(header::PRODUCER_INDEX), 1);
    assert_eq!(s.staging_word(header::CONSUMER_INDEX), 1);
    assert_eq!(s.fake.world().kicks, vec![s.host_qp]);
    assert!(!s.moved_to_error());
}

/// Stages `wqe` alone on a fresh QP, rings, and checks that what reached the host slot is the
/// neutralised WQE (same `wr_id`, nothing else of the guest's) and that the QP went to ERR.
fn assert_refused(edit: impl FnOnce(&Setup, &mut RxeSendWqe, &mut Vec<RxeSge>)) {
    let mut s = Setup::new();
    let (mut wqe, mut sges) = send(9, s.ah);
    edit(&s, &mut wqe, &mut sges);
    s.stage(0, &wqe, &sges);
    s.set_staging_producer(1);
    s.ring();
    let (host, sge) = s.host_wqe(0);
    assert_eq!(host.wr.wr_id.get(), 9);
    assert_eq!(host.wr.opcode.get(), WrOpcode::Send as u32);
    let ud = host.wr.wr.ud();
    assert_eq!(ud.ah_num.get(), NEUTRALISED_AH_NUM);
    assert_eq!(ud.av, RxeAv::new_zeroed());
    assert_eq!(ud.remote_qpn.get(), 0);
    assert_eq!((host.dma.length.get(), host.dma.num_sge.get()), (0, 0));
    assert_eq!(sge, RxeSge::new_zeroed(), "no SGE reaches the host");
    assert!(s.moved_to_error());
    // The slot was consumed: the guest sees its error completion, not a stuck ring.
    assert_eq!(s.staging_word(header::CONSUMER_INDEX), 1);
}

#[test]
fn ah_num_zero_is_refused() {
    assert_refused(|_, wqe, _| {
        let mut ud = wqe.wr.wr.ud();
        ud.ah_num = Le32::ZERO;
        wqe.wr.wr = RxeSendWrUnion::from_ud(ud);
    });
}

#[test]
fn a_host_ah_num_or_unknown_handle_is_refused() {
    assert_refused(|s, wqe, _| {
        let mut ud = wqe.wr.wr.ud();
        let host_ah = *s.fake.world().ahs.keys().next().unwrap();
        assert_ne!(host_ah, s.ah);
        ud.ah_num = Le32::new(host_ah);
        wqe.wr.wr = RxeSendWrUnion::from_ud(ud);
    });
}

#[test]
fn another_guests_ah_handle_is_refused() {
    assert_refused(|s, wqe, _| {
        let other = TestGuest::new(&s.fake, ud_options(), STAGED);
        let pd = other.alloc_pd();
        let _first = create_ah(&other, pd);
        let theirs = create_ah(&other, pd);
        assert_ne!(theirs, s.ah);
        let mut ud = wqe.wr.wr.ud();
        ud.ah_num = Le32::new(theirs);
        wqe.wr.wr = RxeSendWrUnion::from_ud(ud);
    });
}

#[test]
fn an_ah_of_another_pd_is_refused() {
    assert_refused(|s, wqe, _| {
        let pd = s.guest.alloc_pd();
        assert_ne!(pd, s.pd);
        let elsewhere = create_ah(&s.guest, pd);
        let mut ud = wqe.wr.wr.ud();
        ud.ah_num = Le32::new(elsewhere);
        wqe.wr.wr = RxeSendWrUnion::from_ud(ud);
    });
}

#[test]
fn a_destroyed_ah_is_refused() {
    assert_refused(|s, _, _| {
        assert_eq!(
            s.guest.status(ControlRequest::DestroyAh(handle(s.ah))),
            Status::Ok
        );
    });
}

#[test]
fn non_ud_opcodes_and_bad_shapes_are_refused() {
    assert_refused(|_, wqe, _| wqe.wr.opcode = Le32::new(WrOpcode::RdmaWrite as u32));
    assert_refused(|_, wqe, _| wqe.wr.opcode = Le32::new(WrOpcode::SendWithInv as u32));
    assert_refused(|_, wqe, _| wqe.wr.send_flags = Le32::new(1 << 7));
    assert_refused(|_, wqe, _| wqe.dma.num_sge = Le32::new(33));
    assert_refused(|_, wqe, _| wqe.dma.length = Le32::new(99));
    assert_refused(|_, wqe, _| {
        wqe.wr.send_flags = Le32::new(SendFlags::INLINE.bits());
        wqe.dma.length = Le32::new(4096);
        wqe.dma.resid = Le32::new(4096);
    });
}

#[test]
fn after_a_refusal_later_wqes_are_still_checked_and_forwarded() {
    let mut s = Setup::new();
    let (bad, sges) = send(1, 0);
    let (good, _) = send(2, s.ah);
    s.stage(0, &bad, &sges);
    s.stage(1, &good, &sges);
    s.set_staging_producer(2);
    s.ring();
    assert_eq!(s.host_wqe(0).0.wr.wr.ud().ah_num.get(), NEUTRALISED_AH_NUM);
    assert_ne!(s.host_wqe(1).0.wr.wr.ud().ah_num.get(), NEUTRALISED_AH_NUM);
    assert_eq!(s.host_word(header::PRODUCER_INDEX), 2);
    assert!(s.moved_to_error());
}

#[test]
fn an_impossible_producer_index_stops_the_qp() {
    let mut s = Setup::new();
    let (wqe, sges) = send(1, s.ah);
    s.stage(0, &wqe, &sges);
    s.set_staging_producer(s.qp.sq.num_slots.get());
    s.ring();
    assert_eq!(s.host_word(header::PRODUCER_INDEX), 0, "nothing copied");
    assert!(s.moved_to_error());
    assert!(s.fake.world().kicks.is_empty());
    // Its doorbells are ignored from then on, even with a valid index.
    s.set_staging_producer(1);
    s.ring();
    assert_eq!(s.host_word(header::PRODUCER_INDEX), 0);
    assert!(s.fake.world().kicks.is_empty());
}

#[test]
fn copies_stop_at_the_host_rings_free_space() {
    let mut s = Setup::new();
    let mask = s.qp.sq.num_slots.get() - 1;
    let (wqe, sges) = send(1, s.ah);
    for index in 0..=mask {
        s.stage(index, &wqe, &sges);
    }
    // A full ring's worth: all of it fits (the kernel consumed nothing yet).
    s.set_staging_producer(mask);
    s.ring();
    assert_eq!(s.host_word(header::PRODUCER_INDEX), mask);
    // One more (the driver lapping the host's consumer index) waits.
    s.set_staging_producer(0);
    s.ring();
    assert_eq!(s.host_word(header::PRODUCER_INDEX), mask);
    assert_eq!(s.staging_word(header::CONSUMER_INDEX), mask);
    assert!(!s.moved_to_error());
}

#[test]
fn destroy_and_discard_release_the_staging_ring() {
    let s = Setup::new();
    let staging = s.guest.frontend.mapped_file(s.qp.sq.shm_offset.get());
    let offset = s.qp.sq.shm_offset.get();
    let (wqe, sges) = send(1, s.ah);
    s.stage(0, &wqe, &sges);
    assert_eq!(
        s.guest
            .status(ControlRequest::DestroyQp(handle(s.qp.qp.get()))),
        Status::Ok
    );
    assert_eq!(s.guest.frontend.mapped().len(), 1, "only the CQ is left");
    // The staging pages went back (they read as zero).
    let mut head = [0u8; 8];
    staging.read_exact_at(&mut head, offset).unwrap();
    assert_eq!(head, [0; 8]);
    assert!(s.fake.world().send_queues.is_empty());

    // A discard releases a live one too, and a new QP gets a fresh ring.
    let cq = s.guest.create_cq(4).cq.get();
    let qp = s.guest.create_qp(ud_qp_req(s.pd, cq)).unwrap();
    assert_eq!(s.guest.status(ControlRequest::DiscardState), Status::Ok);
    assert_eq!(s.guest.frontend.mapped(), vec![]);
    staging
        .read_exact_at(&mut head, qp.sq.shm_offset.get())
        .unwrap();
    assert_eq!(head, [0; 8]);
    assert_eq!(s.fake.world().live(), 0);
}

/// A UD QP's staged send queue waits in its chunk while the receive queue, mapped directly,
/// is placed; when the front-end refuses that mapping, the staging ring goes too (its chunk
/// unmapped once empty) and the host QP is destroyed.
#[test]
fn a_refused_receive_queue_mapping_releases_the_staged_send_queue() {
    let s = Setup::new();
    let cq = s.guest.create_cq(4).cq.get();
    let before = (s.fake.world().live(), s.guest.frontend.mapped());
    // A second staged ring goes in the first one's chunk: nothing new to map before the RQ.
    s.guest.frontend.set_refusing(true);
    assert_eq!(
        s.guest.create_qp(ud_qp_req(s.pd, cq)),
        Err(Status::DeviceError)
    );
    assert_eq!((s.fake.world().live(), s.guest.frontend.mapped()), before);
    s.guest.frontend.set_refusing(false);
    let qp = s.guest.create_qp(ud_qp_req(s.pd, cq)).unwrap();
    let (first, second) = (s.qp.sq.shm_offset.get(), qp.sq.shm_offset.get());
    let ring = u64::from(s.qp.sq.map_len.get());
    assert_eq!(
        second,
        first + ring,
        "the refused QP's staging place was given back"
    );

    // Alone in its chunk, the staging ring's chunk is unmapped with it.
    assert_eq!(
        s.guest
            .status(ControlRequest::DestroyQp(handle(s.qp.qp.get()))),
        Status::Ok
    );
    assert_eq!(
        s.guest
            .status(ControlRequest::DestroyQp(handle(qp.qp.get()))),
        Status::Ok
    );
    let cq_rings = s.guest.frontend.mapped().len();
    s.guest.frontend.set_refusing(true);
    assert_eq!(
        s.guest.create_qp(ud_qp_req(s.pd, cq)),
        Err(Status::DeviceError)
    );
    assert_eq!(s.guest.frontend.mapped().len(), cq_rings);
}

#[test]
fn wqes_wait_in_the_staging_ring_until_the_qp_sends_and_are_checked_then() {
    // rxe keeps WQEs given to a QP in INIT and sends them once it is in RTS: checked when
    // posted, they would leave with whatever their AH names by then. Held in the staging
    // ring, they are checked when the QP starts sending.
    let mut s = Setup::new();
    let modify = |state: QpState, mask: QpAttrMask| {
        let mut attr = QpAttr::new_zeroed().with_qp_state(state);
        attr.port_num = 1;
        attr.qkey = Le32::new(0x1111_1111);
        ModifyQpReq {
            qp: s.qp.qp,
            attr_mask: Le32::new(mask.bits()),
            attr,
        }
    };
    type M = QpAttrMask;
    let reset = modify(QpState::Reset, M::STATE);
    let init = modify(QpState::Init, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY);
    for request in [reset, init] {
        assert_eq!(
            s.guest.status(ControlRequest::ModifyQp(request)),
            Status::Ok
        );
    }
    let (wqe, sges) = send(11, s.ah);
    s.stage(0, &wqe, &sges);
    s.set_staging_producer(1);
    s.fake.world().kicks.clear();
    s.ring();
    assert_eq!(
        s.host_word(header::PRODUCER_INDEX),
        0,
        "nothing forwarded in INIT"
    );
    assert_eq!(s.staging_word(header::CONSUMER_INDEX), 0);
    assert!(s.fake.world().kicks.is_empty());
    // The AH goes while the WQE waits; the QP then moves to RTS: the WQE is checked now.
    assert_eq!(
        s.guest.status(ControlRequest::DestroyAh(handle(s.ah))),
        Status::Ok
    );
    s.guest.ud_to_rts_from_init(s.qp.qp.get());
    let (host, _) = s.host_wqe(0);
    assert_eq!(host.wr.wr_id.get(), 11);
    assert_eq!(host.wr.wr.ud().ah_num.get(), NEUTRALISED_AH_NUM);
    assert!(s.moved_to_error());
    assert_eq!(s.staging_word(header::CONSUMER_INDEX), 1);
}

#[test]
fn a_destroyed_ah_stays_on_the_host_until_the_sends_forwarded_before_are_consumed() {
    // The host would give a destroyed AH's number to the next AH, which a WQE forwarded
    // through the old one (checked against its destination) would then be sent through.
    let mut s = Setup::new();
    let (wqe, sges) = send(7, s.ah);
    s.stage(0, &wqe, &sges);
    s.set_staging_producer(1);
    s.ring();
    assert_eq!(s.host_word(header::PRODUCER_INDEX), 1);
    assert_eq!(
        s.guest.status(ControlRequest::DestroyAh(handle(s.ah))),
        Status::Ok
    );
    assert_eq!(
        s.fake.world().ahs.len(),
        1,
        "held while the WQE is not consumed"
    );
    assert_eq!(
        s.guest.status(ControlRequest::DestroyAh(handle(s.ah))),
        Status::BadHandle,
        "the guest's handle is gone at once"
    );
    // The kernel sends it (its consumer index passes it); the next command lets the AH go.
    s.fake
        .world()
        .set_queue_word(s.host_qp, HostQueue::Send, header::CONSUMER_INDEX, 1);
    assert_eq!(s.guest.status(ControlRequest::QueryDevice), Status::Ok);
    assert!(s.fake.world().ahs.is_empty());
    // With nothing in flight an AH goes at once.
    let ah = create_ah(&s.guest, s.pd);
    assert_eq!(
        s.guest.status(ControlRequest::DestroyAh(handle(ah))),
        Status::Ok
    );
    assert!(s.fake.world().ahs.is_empty());
    // A discard destroys what still lingers.
    let ah = create_ah(&s.guest, s.pd);
    let (wqe, sges) = send(8, ah);
    s.stage(1, &wqe, &sges);
    s.set_staging_producer(2);
    s.ring();
    assert_eq!(
        s.guest.status(ControlRequest::DestroyAh(handle(ah))),
        Status::Ok
    );
    assert_eq!(s.fake.world().ahs.len(), 1);
    assert_eq!(s.guest.status(ControlRequest::DiscardState), Status::Ok);
    assert!(s.fake.world().ahs.is_empty());
}

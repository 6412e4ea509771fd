//! Staging rings of RC and UC QPs (spec §9.7) against the fake host device: when they are
//! given, what the device copies into the host queues on a doorbell, and that they let a guest
//! behind a slot-counting front-end have many more QPs than it has mappings.

use std::mem::size_of;

use vhost::vhost_user::VhostUserProtocolFeatures as Protocol;
use vrdma_backend::control::staged_rings::staging_reserve;
use vrdma_backend::guest::options::{DeviceOptions, StagedRings};
use vrdma_backend::resources::quotas::Quotas;
use vrdma_backend::vhost_device::handler::DeviceHandler;
use vrdma_backend::vhost_device::shmem::SLOT_COUNTING_FRONTEND_MAPPINGS as LIMIT;
use vrdma_spec::features::*;
use vrdma_spec::rxe_v1::{self, header, RxeRecvWqe, RxeSendWqe, RxeSge};
use vrdma_spec::verbs::{QpState, SendFlags, WrOpcode};
use vrdma_spec::wire::*;
use vrdma_spec::{ControlRequest, Le32, Le64, Status};
use vrdma_test_support::fake_host::device::*;
use vrdma_test_support::fake_host::harness::*;
use vrdma_test_support::fake_host::world::HostQueue;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

const AREA: u64 = RAM_BASE + 8 * PAGE;

fn staged_options(policy: StagedRings) -> DeviceOptions {
    DeviceOptions {
        staged_rings: policy,
        ..test_options()
    }
}

/// A guest with one RC QP whose queues are staged.
struct Setup {
    fake: std::sync::Arc<FakeDevice>,
    guest: TestGuest,
    qp: CreateQpResp,
    host_qp: u32,
    tail: u32,
}

impl Setup {
    fn new() -> Setup {
        let fake = FakeDevice::new();
        let guest = TestGuest::new(&fake, staged_options(StagedRings::Always), ALL_FEATURES);
        let pd = guest.alloc_pd();
        let cq = guest.create_cq(16).cq.get();
        assert_eq!(guest.set_doorbell_area(AREA), Status::Ok);
        let qp = guest.create_qp(qp_req(pd, cq, 0)).unwrap();
        let host_qp = fake.world().qp_by_qpn(qp.qpn.get()).unwrap();
        fake.world().qp_state.insert(host_qp, QpState::Rts);
        Setup {
            fake,
            guest,
            qp,
            host_qp,
            tail: 0,
        }
    }

    fn write(&self, ring: &RingDesc, at: usize, bytes: &[u8]) {
        self.guest
            .frontend
            .write(ring.shm_offset.get() + at as u64, bytes);
    }

    fn staging_word(&self, ring: &RingDesc, at: usize) -> u32 {
        let bytes = self
            .guest
            .frontend
            .read(ring.shm_offset.get() + at as u64, 4);
        u32::from_le_bytes(bytes.try_into().unwrap())
    }

    fn slot(ring: &RingDesc, index: u32) -> usize {
        ring.rxe_v1_geometry().unwrap().slot_offset(index)
    }

    fn host_word(&self, queue: HostQueue, at: usize) -> u32 {
        self.fake.world().queue_word(self.host_qp, queue, at)
    }

    fn host_read(&self, queue: HostQueue, at: usize, len: usize) -> Vec<u8> {
        self.fake.world().read_queue(self.host_qp, queue, at, len)
    }

    /// Queues the QP's doorbell and notifies, as the driver would.
    fn ring(&mut self) {
        let index = self.qp.doorbell_index.get();
        self.guest.ring_doorbell(AREA, index, &mut self.tail);
    }

    fn kicks(&self) -> usize {
        self.fake.world().kicks_of(self.host_qp)
    }
}

fn rdma_write(wr_id: u64) -> (RxeSendWqe, RxeSge) {
    let mut wqe = RxeSendWqe::new_zeroed();
    wqe.wr.wr_id = Le64::new(wr_id);
    wqe.wr.opcode = Le32::new(WrOpcode::RdmaWrite as u32);
    wqe.wr.send_flags = Le32::new(SendFlags::SIGNALED.bits());
    wqe.dma.length = Le32::new(100);
    wqe.dma.resid = Le32::new(100);
    wqe.dma.num_sge = Le32::new(1);
    // Fields librxe initialises and rxe reads (the remote address of an RDMA WQE).
    wqe.state = Le32::new(rxe_v1::WQE_STATE_POSTED);
    wqe.iova = Le64::new(0x9000);
    let sge = RxeSge {
        addr: Le64::new(0x4000),
        length: Le32::new(100),
        lkey: Le32::new(0x77),
    };
    (wqe, sge)
}

#[test]
fn staged_queues_are_described_as_staging_rings_and_forwarded_on_a_doorbell() {
    let mut s = Setup::new();
    let (sq, rq) = (s.qp.sq, s.qp.rq);
    assert_eq!(sq.flags.get(), ring_flags::STAGED);
    assert_eq!(rq.flags.get(), ring_flags::STAGED);
    // Both rings start empty with the host queues' geometry, and share one mapping.
    assert_eq!(
        s.staging_word(&sq, header::INDEX_MASK),
        sq.num_slots.get() - 1
    );
    assert_eq!(
        s.staging_word(&rq, header::INDEX_MASK),
        rq.num_slots.get() - 1
    );
    assert_eq!(
        s.guest.dev().object_counts().shm_extents,
        2,
        "the CQ and one chunk"
    );

    let (wqe, sge) = rdma_write(7);
    let mut bytes = wqe.as_bytes().to_vec();
    bytes.extend_from_slice(sge.as_bytes());
    s.write(&sq, Setup::slot(&sq, 0), &bytes);
    s.write(&sq, header::PRODUCER_INDEX, &1u32.to_le_bytes());
    let mut recv = RxeRecvWqe::new_zeroed();
    recv.wr_id = Le64::new(9);
    recv.dma.num_sge = Le32::new(1);
    recv.dma.length = Le32::new(100);
    recv.dma.resid = Le32::new(100);
    let mut recv_bytes = recv.as_bytes().to_vec();
    recv_bytes.extend_from_slice(sge.as_bytes());
    s.write(&rq, Setup::slot(&rq, 0), &recv_bytes);
    s.write(&rq, header::PRODUCER_INDEX, &1u32.to_le_bytes());
    assert_eq!(
        s.host_word(HostQueue::Send, header::PRODUCER_INDEX),
        0,
        "nothing before the doorbell"
    );
    assert_eq!(s.host_word(HostQueue::Recv, header::PRODUCER_INDEX), 0);

    s.ring();
    // The send: copied as written with its SGE, indices published, kicked.
    assert_eq!(s.host_word(HostQueue::Send, header::PRODUCER_INDEX), 1);
    assert_eq!(s.staging_word(&sq, header::CONSUMER_INDEX), 1);
    let host = s.host_read(
        HostQueue::Send,
        Setup::slot(&sq, 0),
        size_of::<RxeSendWqe>() + 16,
    );
    let (copied, rest) = RxeSendWqe::read_from_prefix(&host).unwrap();
    assert_eq!(copied.wr.wr_id.get(), 7);
    assert_eq!(copied.wr.opcode.get(), WrOpcode::RdmaWrite as u32);
    assert_eq!(copied, wqe);
    assert_eq!(RxeSge::read_from_bytes(rest).unwrap(), sge);
    assert_eq!(s.kicks(), 1);
    // The receive: copied as written.
    assert_eq!(s.host_word(HostQueue::Recv, header::PRODUCER_INDEX), 1);
    assert_eq!(s.staging_word(&rq, header::CONSUMER_INDEX), 1);
    let host = s.host_read(HostQueue::Recv, Setup::slot(&rq, 0), recv_bytes.len());
    assert_eq!(host, recv_bytes);

    // A receive alone is forwarded on the next doorbell too; nothing is sent twice.
    s.write(&rq, Setup::slot(&rq, 1), &recv_bytes);
    s.write(&rq, header::PRODUCER_INDEX, &2u32.to_le_bytes());
    s.ring();
    assert_eq!(s.host_word(HostQueue::Recv, header::PRODUCER_INDEX), 2);
    assert_eq!(s.host_word(HostQueue::Send, header::PRODUCER_INDEX), 1);

    // An impossible index stops the ring and moves the QP to ERR.
    s.write(&sq, header::PRODUCER_INDEX, &u32::MAX.to_le_bytes());
    s.ring();
    assert_eq!(s.host_word(HostQueue::Send, header::PRODUCER_INDEX), 1);
    assert!(s
        .fake
        .world()
        .modified
        .iter()
        .any(|&(qp, _, state)| qp == s.host_qp && state == QpState::Err));

    // Destroying the QP gives the chunk back.
    let qp = s.qp.qp.get();
    assert_eq!(
        s.guest.status(ControlRequest::DestroyQp(handle(qp))),
        Status::Ok
    );
    assert_eq!(s.guest.dev().object_counts().shm_extents, 1, "only the CQ");
}

#[test]
fn wqes_that_find_the_host_queue_full_are_forwarded_by_the_retry_timer() {
    /// Index of the retry timer among the device's watched fds.
    const RETRY_TIMER: usize = 2;
    let mut s = Setup::new();
    let sq = s.qp.sq;
    let mask = sq.num_slots.get() - 1;
    // The driver fills its staging ring; the host takes all of it, retiring nothing yet.
    s.write(&sq, header::PRODUCER_INDEX, &mask.to_le_bytes());
    s.ring();
    assert_eq!(s.host_word(HostQueue::Send, header::PRODUCER_INDEX), mask);
    assert_eq!(s.staging_word(&sq, header::CONSUMER_INDEX), mask);
    // One more: the staging ring has room (the device copied everything), the host does not.
    s.write(&sq, header::PRODUCER_INDEX, &0u32.to_le_bytes());
    s.ring();
    assert_eq!(
        s.host_word(HostQueue::Send, header::PRODUCER_INDEX),
        mask,
        "waits"
    );
    // Nothing retired: the retry moves nothing.
    s.guest.dev().fd_ready(s.guest.guest_io(), RETRY_TIMER);
    assert_eq!(s.host_word(HostQueue::Send, header::PRODUCER_INDEX), mask);
    // The kernel retires the first WQE; the next retry forwards the waiting one, kicked.
    s.fake
        .world()
        .set_queue_word(s.host_qp, HostQueue::Send, header::CONSUMER_INDEX, 1);
    let kicks = s.kicks();
    s.guest.dev().fd_ready(s.guest.guest_io(), RETRY_TIMER);
    assert_eq!(s.host_word(HostQueue::Send, header::PRODUCER_INDEX), 0);
    assert_eq!(s.staging_word(&sq, header::CONSUMER_INDEX), 0);
    assert_eq!(s.kicks(), kicks + 1);
    // Nothing waits any more: a retry does nothing.
    s.guest.dev().fd_ready(s.guest.guest_io(), RETRY_TIMER);
    assert_eq!(s.kicks(), kicks + 1);
}

#[test]
fn connected_queues_are_direct_without_the_feature_or_with_policy_never() {
    for (policy, features) in [
        (StagedRings::Always, ALL_FEATURES & !VRDMA_F_STAGED_RINGS),
        (StagedRings::Never, ALL_FEATURES),
        (StagedRings::Auto, ALL_FEATURES),
    ] {
        let fake = FakeDevice::new();
        let guest = TestGuest::new(&fake, staged_options(policy), features);
        let pd = guest.alloc_pd();
        let cq = guest.create_cq(16).cq.get();
        assert_eq!(guest.set_doorbell_area(AREA), Status::Ok);
        let qp = guest.create_qp(qp_req(pd, cq, 0)).unwrap();
        let staged = ring_flags::STAGED;
        assert_eq!(qp.sq.flags.get() & staged, 0, "{policy:?}");
        assert_eq!(qp.rq.flags.get(), 0, "{policy:?}");
        assert!(
            qp.sq.host_kick_handle().is_some(),
            "a direct send queue is kicked"
        );
        assert_eq!(
            guest.dev().device_features() & VRDMA_F_STAGED_RINGS != 0,
            policy != StagedRings::Never
        );
    }
}

#[test]
fn behind_a_slot_counting_front_end_qps_past_its_mappings_are_staged() {
    let fake = FakeDevice::new();
    let qps = 2 * LIMIT as u32;
    let options = DeviceOptions {
        shm_size: 64 << 20,
        quotas: Quotas {
            qps,
            cqs: 4,
            // Each staged queue is a mapping of the daemon's (its host buffer).
            mappings: 2 * qps,
            ..test_options().quotas
        },
        ..staged_options(StagedRings::Auto)
    };
    let guest = TestGuest::new(&fake, options, ALL_FEATURES);
    guest
        .dev()
        .frontend_protocol_features((Protocol::CONFIGURE_MEM_SLOTS | Protocol::SHMEM).bits());
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(16).cq.get();
    assert_eq!(guest.set_doorbell_area(AREA), Status::Ok);
    let mut direct = 0;
    let mut last = None;
    for n in 0..qps {
        let qp = guest
            .create_qp(qp_req(pd, cq, 0))
            .unwrap_or_else(|status| panic!("QP {n}: {status:?}"));
        if qp.sq.flags.get() & ring_flags::STAGED == 0 {
            assert_eq!(last, None, "direct QPs come first");
            direct += 1;
        } else {
            last = Some(qp);
        }
    }
    // Direct QPs (two mappings each) until the reserve is reached, then staged ones.
    assert_eq!(direct, (LIMIT - 1 - staging_reserve(LIMIT)) as u32 / 2);
    let extents = guest.dev().object_counts().shm_extents;
    assert!(extents <= LIMIT, "{extents} mappings");
    // The quota, not the front-end, ends it, with a clean status; a CQ still fits.
    assert_eq!(guest.create_qp(qp_req(pd, cq, 0)), Err(Status::Quota));
    guest.create_cq(16);
    let last = last.unwrap();
    assert_eq!(
        guest.status(ControlRequest::DestroyQp(handle(last.qp.get()))),
        Status::Ok
    );
}

//! Staged CQs (spec §9.8) against the fake host device: when a CQ gets a staging ring, the
//! device's copy of host completions into it on the host's completion events and on ARM_CQ,
//! the guest's event only when it armed, a full guest ring, and many more CQs than a
//! slot-counting front-end has mappings.

use vhost::vhost_user::VhostUserProtocolFeatures as Protocol;
use vrdma_backend::control::staged_rings::cq_staging_reserve;
use vrdma_backend::guest::options::{DeviceOptions, StagedRings};
use vrdma_backend::host::CompEvent;
use vrdma_backend::resources::quotas::Quotas;
use vrdma_backend::vhost_device::handler::DeviceHandler;
use vrdma_backend::vhost_device::shmem::SLOT_COUNTING_FRONTEND_MAPPINGS as LIMIT;
use vrdma_spec::features::*;
use vrdma_spec::rxe_v1::{header, RingGeometry};
use vrdma_spec::verbs::arm_flags;
use vrdma_spec::wire::*;
use vrdma_spec::{ControlRequest, Le32, ResponseBody, Status};
use vrdma_test_support::fake_host::device::*;
use vrdma_test_support::fake_host::harness::*;
use vrdma_test_support::fake_host::world::HostQueue;

/// Index of the completion channel among the device's watched fds.
const COMP_CHANNEL: usize = 0;

fn options(policy: StagedRings) -> DeviceOptions {
    DeviceOptions {
        staged_cqs: policy,
        ..test_options()
    }
}

/// A guest with one staged CQ.
struct Setup {
    fake: std::sync::Arc<FakeDevice>,
    guest: TestGuest,
    cq: CreateCqResp,
    host_cq: u32,
}

impl Setup {
    fn new(cqe: u32) -> Setup {
        let fake = FakeDevice::new();
        let guest = TestGuest::new(&fake, options(StagedRings::Always), ALL_FEATURES);
        let cq = guest.create_cq(cqe);
        let host_cq = *fake.world().cqs.keys().next_back().unwrap();
        Setup {
            fake,
            guest,
            cq,
            host_cq,
        }
    }

    fn geometry(&self) -> RingGeometry {
        self.cq.ring.rxe_v1_geometry().unwrap()
    }

    /// The kernel completes work request `wr_id`; false if the host CQ was full.
    fn complete(&self, wr_id: u64) -> bool {
        self.fake
            .world()
            .post_completion(self.host_cq, &wr_id.to_le_bytes())
    }

    /// The host's completion event for the CQ, handled by the device.
    fn host_event(&self) {
        let user_handle = self.fake.world().cqs[&self.host_cq];
        self.fake.world().comp_events.push_back(CompEvent {
            cq_user_handle: user_handle,
        });
        self.guest
            .dev()
            .fd_ready(self.guest.guest_io(), COMP_CHANNEL);
    }

    fn staging_word(&self, at: usize) -> u32 {
        let bytes = self
            .guest
            .frontend
            .read(self.cq.ring.shm_offset.get() + at as u64, 4);
        u32::from_le_bytes(bytes.try_into().unwrap())
    }

    fn set_guest_consumer(&self, index: u32) {
        self.guest.frontend.write(
            self.cq.ring.shm_offset.get() + header::CONSUMER_INDEX as u64,
            &index.to_le_bytes(),
        );
    }

    /// The `wr_id` in staging slot `index`.
    fn staged_wr_id(&self, index: u32) -> u64 {
        let ring = &self.cq.ring;
        let at = self.geometry().slot_offset(index);
        let bytes = self
            .guest
            .frontend
            .read(ring.shm_offset.get() + at as u64, 8);
        u64::from_le_bytes(bytes.try_into().unwrap())
    }

    fn host_word(&self, at: usize) -> u32 {
        self.fake
            .world()
            .queue_word(self.host_cq, HostQueue::Completion, at)
    }

    fn arm(&self, flags: u32) -> Status {
        self.guest.status(ControlRequest::ArmCq(ArmCqReq {
            cq: self.cq.cq,
            flags: Le32::new(flags),
        }))
    }

    /// Times the device armed the host CQ.
    fn host_arms(&self) -> usize {
        let host_cq = self.host_cq;
        let world = self.fake.world();
        world.armed.iter().filter(|(cq, _)| *cq == host_cq).count()
    }

    fn guest_events(&self) -> usize {
        self.guest.guest_io().events().len()
    }
}

#[test]
fn host_completions_are_copied_on_the_host_event_and_the_guest_is_woken_only_when_armed() {
    let s = Setup::new(8);
    assert_eq!(s.cq.ring.flags.get(), ring_flags::STAGED);
    assert_eq!(s.cq.ring.num_slots.get(), s.cq.cqe.get() + 1);
    assert_eq!(s.host_arms(), 1, "armed by the device at creation");
    // A staging ring starts empty.
    assert_eq!(s.staging_word(header::PRODUCER_INDEX), 0);
    assert_eq!(
        s.staging_word(header::INDEX_MASK),
        s.geometry().index_mask()
    );

    for wr_id in [11, 12, 13] {
        assert!(s.complete(wr_id));
    }
    assert_eq!(
        s.staging_word(header::PRODUCER_INDEX),
        0,
        "not before the event"
    );
    s.host_event();
    assert_eq!(s.staging_word(header::PRODUCER_INDEX), 3);
    assert_eq!(
        (0..3).map(|i| s.staged_wr_id(i)).collect::<Vec<_>>(),
        [11, 12, 13]
    );
    assert_eq!(
        s.host_word(header::CONSUMER_INDEX),
        3,
        "host slots given back"
    );
    assert_eq!(s.host_arms(), 2, "re-armed on the event");
    assert_eq!(s.guest_events(), 0, "the guest did not arm");

    // The guest arms (solicited-only counts as any): the next completion wakes it, once.
    assert_eq!(s.arm(arm_flags::SOLICITED_ONLY), Status::Ok);
    assert_eq!(s.host_arms(), 2, "the guest's arm stays the device's");
    assert!(s.complete(14));
    s.host_event();
    assert_eq!(s.staging_word(header::PRODUCER_INDEX), 4);
    assert_eq!(s.staged_wr_id(3), 14);
    assert_eq!(s.guest_events(), 1);
    let mut queued = Vec::new();
    s.guest.guest_io().events().discard_where(|bytes| {
        queued.push(vrdma_spec::Event::decode(bytes).unwrap());
        true
    });
    assert_eq!(queued.len(), 1);
    assert_eq!(queued[0].event_type, vrdma_spec::EventType::Completion);
    assert_eq!(queued[0].handle, s.cq.cq.get());
    assert!(s.complete(15));
    s.host_event();
    assert_eq!(s.guest_events(), 0, "one event per arm");
    // A spurious host event (nothing new) wakes nobody.
    assert_eq!(s.arm(0), Status::Ok);
    s.host_event();
    assert_eq!(s.guest_events(), 0);
    assert_eq!(s.staging_word(header::PRODUCER_INDEX), 5);
}

#[test]
fn arm_cq_copies_what_the_host_holds_before_it_answers() {
    let s = Setup::new(8);
    assert!(s.complete(21));
    assert!(s.complete(22));
    // No event yet (the device's worker has not run): the guest's poll after arming must
    // still see both, as it would in a host CQ.
    assert_eq!(s.arm(0), Status::Ok);
    assert_eq!(s.staging_word(header::PRODUCER_INDEX), 2);
    assert_eq!((s.staged_wr_id(0), s.staged_wr_id(1)), (21, 22));
    assert_eq!(
        s.guest_events(),
        0,
        "copied before the arm: no event for them"
    );
    // The host event for them then finds nothing new.
    s.host_event();
    assert_eq!(s.guest_events(), 0);
}

#[test]
fn completions_the_guest_has_no_room_for_wait_in_the_host_cq() {
    let s = Setup::new(3);
    let mask = s.geometry().index_mask();
    assert_eq!(mask, 3, "a CQ of three");
    for wr_id in 1..=3 {
        assert!(s.complete(wr_id));
    }
    s.host_event();
    assert_eq!(s.staging_word(header::PRODUCER_INDEX), 3);
    // The guest polls nothing; the host completes two more (it has room again).
    assert!(s.complete(4) && s.complete(5));
    s.host_event();
    assert_eq!(
        s.staging_word(header::PRODUCER_INDEX),
        3,
        "the guest's ring is full"
    );
    assert_eq!(
        s.host_word(header::CONSUMER_INDEX),
        3,
        "they stay the host's"
    );
    // The guest polls two; its next ARM_CQ brings the rest.
    s.set_guest_consumer(2);
    assert_eq!(s.arm(0), Status::Ok);
    assert_eq!(s.staging_word(header::PRODUCER_INDEX), 1);
    assert_eq!((s.staged_wr_id(3), s.staged_wr_id(0)), (4, 5));
    assert_eq!(s.host_word(header::CONSUMER_INDEX), 1);
    // A consumer index beyond the ring is masked: it costs the guest only its own
    // completions, and the device goes on.
    s.set_guest_consumer(0xffff_fff2);
    assert!(s.complete(6));
    s.host_event();
    assert_eq!(
        s.staging_word(header::PRODUCER_INDEX),
        1,
        "(1 + 1) & 3 == 0xffff_fff2 & 3: full"
    );
    s.set_guest_consumer(1);
    s.host_event();
    assert_eq!(s.staging_word(header::PRODUCER_INDEX), 2);
    assert_eq!(s.staged_wr_id(1), 6);
}

#[test]
fn a_resized_staged_cq_keeps_every_completion_in_order() {
    let mut s = Setup::new(8);
    let old = s.cq.ring;
    for wr_id in [1, 2, 3] {
        assert!(s.complete(wr_id));
    }
    s.host_event();
    // The guest polled the first; two more wait in the host CQ, not copied yet; armed.
    s.set_guest_consumer(1);
    assert!(s.complete(4) && s.complete(5));
    assert_eq!(s.arm(0), Status::Ok);
    assert!(s.complete(6));
    let resize = |cqe: u32| {
        ControlRequest::ResizeCq(ResizeCqReq {
            cq: s.cq.cq,
            cqe: Le32::new(cqe),
        })
    };
    // Five are held (2 and 3 in the guest's ring, 4 and 5 copied by the arm, 6 in the
    // host's): fewer entries are refused, and nothing changes.
    assert_eq!(s.guest.status(resize(4)), Status::Invalid);
    assert!(s.fake.world().resized.is_empty());
    let resized = match s.guest.ok(resize(5)) {
        ResponseBody::ResizeCq(r) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(resized.cqe.get(), 7);
    assert_eq!(resized.ring.flags.get(), ring_flags::STAGED);
    assert_ne!(resized.ring.shm_offset, old.shm_offset);
    s.cq.ring = resized.ring;
    // The guest goes on from index 0 of the new ring: 2..=6, in order.
    assert_eq!(s.staging_word(header::CONSUMER_INDEX), 0);
    assert_eq!(s.staging_word(header::PRODUCER_INDEX), 5);
    assert_eq!(
        (0..5).map(|i| s.staged_wr_id(i)).collect::<Vec<_>>(),
        [2, 3, 4, 5, 6]
    );
    // The old ring's place was given back; the arm held across the resize.
    assert_eq!(s.guest.dev().object_counts().shm_extents, 1, "one chunk");
    s.host_cq = *s.fake.world().cqs.keys().next_back().unwrap();
    assert!(s.complete(7));
    s.host_event();
    assert_eq!(s.staged_wr_id(5), 7);
    assert_eq!(s.guest_events(), 1);
}

#[test]
fn a_destroyed_staged_cq_gives_its_place_back() {
    let s = Setup::new(8);
    assert!(s.complete(1));
    s.host_event();
    assert_eq!(s.guest.dev().object_counts().shm_extents, 1, "its chunk");
    assert_eq!(
        s.guest
            .status(ControlRequest::DestroyCq(handle(s.cq.cq.get()))),
        Status::Ok
    );
    assert_eq!(
        s.guest.dev().object_counts().shm_extents,
        0,
        "the chunk unmapped"
    );
    // The next staged CQ takes the same place, emptied.
    let next = s.guest.create_cq(8);
    assert_eq!(next.ring.shm_offset, s.cq.ring.shm_offset);
    assert_eq!(s.staging_word(header::PRODUCER_INDEX), 0);
    assert_eq!(
        s.staged_wr_id(0),
        0,
        "no completion of the destroyed CQ is left"
    );
}

#[test]
fn cqs_are_direct_without_the_feature_or_with_policy_never() {
    for (policy, features) in [
        (StagedRings::Always, ALL_FEATURES & !VRDMA_F_STAGED_CQS),
        (StagedRings::Never, ALL_FEATURES),
        (StagedRings::Auto, ALL_FEATURES),
    ] {
        let fake = FakeDevice::new();
        let guest = TestGuest::new(&fake, options(policy), features);
        let cq = guest.create_cq(16);
        assert_eq!(cq.ring.flags.get(), 0, "{policy:?}");
        assert!(
            fake.world().armed.is_empty(),
            "a direct CQ is armed by its guest"
        );
        assert_eq!(
            guest.dev().device_features() & VRDMA_F_STAGED_CQS != 0,
            policy != StagedRings::Never
        );
    }
}

#[test]
fn behind_a_slot_counting_front_end_cqs_past_its_mappings_are_staged() {
    let cqs = 2 * LIMIT as u32;
    let guest_options = |policy| DeviceOptions {
        shm_size: 64 << 20,
        quotas: Quotas {
            cqs,
            ..test_options().quotas
        },
        ..options(policy)
    };
    // Without staged CQs the front-end's mappings end them, with QUOTA.
    let fake = FakeDevice::new();
    let never = TestGuest::new(&fake, guest_options(StagedRings::Never), ALL_FEATURES);
    never
        .dev()
        .frontend_protocol_features((Protocol::CONFIGURE_MEM_SLOTS | Protocol::SHMEM).bits());
    let mut direct_only = 0;
    let refused = loop {
        let status = never.status(ControlRequest::CreateCq(CreateCqReq {
            cqe: Le32::new(16),
            reserved: Le32::ZERO,
        }));
        if status != Status::Ok {
            break status;
        }
        direct_only += 1;
    };
    assert_eq!((direct_only, refused), (LIMIT, Status::Quota));

    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, guest_options(StagedRings::Auto), ALL_FEATURES);
    guest
        .dev()
        .frontend_protocol_features((Protocol::CONFIGURE_MEM_SLOTS | Protocol::SHMEM).bits());
    let mut direct = 0;
    for n in 0..cqs {
        let cq = guest.create_cq(16);
        if cq.ring.flags.get() == 0 {
            assert_eq!(direct, n, "direct CQs come first");
            direct += 1;
        }
    }
    // Direct CQs until the reserve is reached, then staged ones in shared chunks.
    assert_eq!(direct as usize, LIMIT - 1 - cq_staging_reserve(LIMIT) + 1);
    let extents = guest.dev().object_counts().shm_extents;
    assert!(extents <= LIMIT, "{extents} mappings");
    assert_eq!(
        guest.status(ControlRequest::CreateCq(CreateCqReq {
            cqe: Le32::new(16),
            reserved: Le32::ZERO,
        })),
        Status::Quota,
        "the CQ quota"
    );
}

//! Which QPs a connection may be aimed at (spec §12.1): through a tenant's address only that
//! tenant's QPs, through the host's own addresses only QPs of no tenant, anything on another
//! machine. rxe delivers a packet to one of the host's own addresses by QP number alone, so
//! without this a guest could aim a QP at its own address and a neighbour's QP number.
//!
//! Three guests of one daemon over the fake host device: tenants A and B with addresses of
//! their own, and C without addresses (it shares the host's identity).

use std::sync::Arc;

use vrdma_backend::guest::options::DeviceOptions;
use vrdma_backend::identity::{GuestAddress, GuestIdentity, TrafficPolicy};
use vrdma_backend::resources::quotas::Quotas;
use vrdma_spec::verbs::{AccessFlags, QpAttrMask, QpState};
use vrdma_spec::wire::{self, ModifyQpReq};
use vrdma_spec::{ControlRequest, Le32, Status};
use vrdma_test_support::fake_host::device::*;
use vrdma_test_support::fake_host::harness::*;
use zerocopy::FromZeros;

type M = QpAttrMask;

const A: &str = "fd00::a:1";
const B: &str = "fd00::b:1";
/// An address of another machine.
const REMOTE: &str = "fd00::99:1";

fn gid(text: &str) -> [u8; 16] {
    text.parse::<GuestAddress>().unwrap().gid()
}

struct Daemon {
    fake: Arc<FakeDevice>,
    a: TestGuest,
    b: TestGuest,
    c: TestGuest,
}

/// One daemon (one budget, one table of tenant endpoints) serving A, B and C.
fn daemon() -> Daemon {
    let fake = FakeDevice::new();
    for address in [A, B] {
        fake.world()
            .add_address_gids(&address.parse::<GuestAddress>().unwrap());
    }
    let daemon = TestDaemon::new(&fake);
    let guest = |name: &str, addresses: &[&str]| {
        let base = test_options();
        let options = DeviceOptions {
            // Room for every QP a test makes (each with its own PD and CQ).
            quotas: Quotas {
                pds: 16,
                cqs: 16,
                qps: 15,
                ..base.quotas
            },
            identity: GuestIdentity {
                name: name.into(),
                addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
                policy: TrafficPolicy::default(),
            },
            ..base
        };
        let guest = daemon.guest(options, ALL_FEATURES);
        assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);
        guest
    };
    Daemon {
        a: guest("a", &[A]),
        b: guest("b", &[B]),
        c: guest("c", &[]),
        fake,
    }
}

/// A new RC QP of `guest` in INIT: its handle and QP number.
fn rc_qp(guest: &TestGuest) -> (u32, u32) {
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(8).cq.get();
    let qp = guest.create_qp(qp_req(pd, cq, 0)).unwrap();
    let mut attr = wire::QpAttr::new_zeroed().with_qp_state(QpState::Init);
    attr.port_num = 1;
    attr.qp_access_flags = Le32::new(AccessFlags::LOCAL_WRITE.bits());
    assert_eq!(
        guest.status(ControlRequest::ModifyQp(ModifyQpReq {
            qp: qp.qp,
            attr_mask: Le32::new((M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS).bits()),
            attr,
        })),
        Status::Ok
    );
    (qp.qp.get(), qp.qpn.get())
}

/// INIT→RTR of `qp` towards QP number `dest_qpn` at `dgid`, from the guest's GID 0.
fn to_rtr(guest: &TestGuest, qp: u32, dgid: [u8; 16], dest_qpn: u32) -> Status {
    guest.status(ControlRequest::ModifyQp(rc_to_rtr(qp, 0, dgid, dest_qpn)))
}

#[test]
fn a_tenant_reaches_a_neighbours_qp_only_through_the_neighbours_address() {
    let d = daemon();
    let (_, b_qpn) = rc_qp(&d.b);
    let (_, a_qpn) = rc_qp(&d.a);
    // A aims at B's QP through its own address: rxe would deliver it by number. Refused.
    let (qp, _) = rc_qp(&d.a);
    assert_eq!(to_rtr(&d.a, qp, gid(A), b_qpn), Status::Invalid);
    // ... and through the host's own address (GID 0, no tenant's).
    assert_eq!(to_rtr(&d.a, qp, GID0, b_qpn), Status::Invalid);
    // Through B's address: ordinary traffic between tenants.
    assert_eq!(to_rtr(&d.a, qp, gid(B), b_qpn), Status::Ok);
    // A's own QP through its own address (loopback within the tenant).
    let (qp, _) = rc_qp(&d.a);
    assert_eq!(to_rtr(&d.a, qp, gid(A), a_qpn), Status::Ok);
    // B's address does not lead to A's QP.
    let (qp, _) = rc_qp(&d.b);
    assert_eq!(to_rtr(&d.b, qp, gid(B), a_qpn), Status::Invalid);
    // Another machine's QP numbers are not ours to judge.
    assert_eq!(to_rtr(&d.b, qp, gid(REMOTE), a_qpn), Status::Ok);
    // Refusals created nothing on the host: the QP was never moved.
    assert!(d.fake.world().qps.len() >= 5);
}

#[test]
fn a_guest_without_addresses_is_the_hosts_and_reaches_no_tenants_qp_through_host_addresses() {
    let d = daemon();
    let (_, a_qpn) = rc_qp(&d.a);
    let (_, c_qpn) = rc_qp(&d.c);
    let (qp, _) = rc_qp(&d.c);
    assert_eq!(to_rtr(&d.c, qp, GID0, a_qpn), Status::Invalid);
    assert_eq!(to_rtr(&d.c, qp, gid(A), a_qpn), Status::Ok);
    // C's QPs are the host's: reachable through the host's address, also from a tenant.
    let (qp, _) = rc_qp(&d.c);
    assert_eq!(to_rtr(&d.c, qp, GID0, c_qpn), Status::Ok);
    let (qp, _) = rc_qp(&d.a);
    assert_eq!(to_rtr(&d.a, qp, gid(A), c_qpn), Status::Invalid);
    assert_eq!(to_rtr(&d.a, qp, GID0, c_qpn), Status::Ok);
}

#[test]
fn a_destroyed_qp_number_belongs_to_no_tenant_again() {
    let d = daemon();
    let (b_qp, b_qpn) = rc_qp(&d.b);
    let (qp, _) = rc_qp(&d.c);
    assert_eq!(to_rtr(&d.c, qp, GID0, b_qpn), Status::Invalid);
    d.b.ok(ControlRequest::DestroyQp(handle(b_qp)));
    assert_eq!(to_rtr(&d.c, qp, GID0, b_qpn), Status::Ok);
    // And at B's address nothing of B's is left.
    let (qp, _) = rc_qp(&d.a);
    assert_eq!(to_rtr(&d.a, qp, gid(B), b_qpn), Status::Invalid);
}

#[test]
fn a_discarded_guest_gives_its_qp_numbers_back() {
    let d = daemon();
    let (_, b_qpn) = rc_qp(&d.b);
    let (qp, _) = rc_qp(&d.c);
    assert_eq!(to_rtr(&d.c, qp, GID0, b_qpn), Status::Invalid);
    d.b.ok(ControlRequest::DiscardState);
    assert_eq!(to_rtr(&d.c, qp, GID0, b_qpn), Status::Ok);
}

/// RTR→RTS of `qp` with an alternate path towards `alt_dgid` (from the guest's GID 0).
fn to_rts_with_alternate(guest: &TestGuest, qp: u32, alt_dgid: [u8; 16]) -> Status {
    let mut attr = wire::QpAttr::new_zeroed().with_qp_state(QpState::Rts);
    attr.timeout = 14;
    attr.retry_cnt = 7;
    attr.rnr_retry = 7;
    attr.max_rd_atomic = 1;
    attr.alt_ah_attr = roce_av(0, alt_dgid);
    attr.alt_port_num = 1;
    attr.alt_timeout = 14;
    let mask = M::STATE
        | M::TIMEOUT
        | M::RETRY_CNT
        | M::RNR_RETRY
        | M::SQ_PSN
        | M::MAX_QP_RD_ATOMIC
        | M::ALT_PATH;
    guest.status(ControlRequest::ModifyQp(ModifyQpReq {
        qp: Le32::new(qp),
        attr_mask: Le32::new(mask.bits()),
        attr,
    }))
}

#[test]
fn the_alternate_path_is_held_to_the_same_rule() {
    let d = daemon();
    let (_, b_qpn) = rc_qp(&d.b);
    let (qp, _) = rc_qp(&d.a);
    assert_eq!(to_rtr(&d.a, qp, gid(B), b_qpn), Status::Ok);
    // The destination QP number is the host QP's (the command does not repeat it): through
    // the host's or A's own address it is not reachable.
    assert_eq!(to_rts_with_alternate(&d.a, qp, GID0), Status::Invalid);
    assert_eq!(to_rts_with_alternate(&d.a, qp, gid(A)), Status::Invalid);
    assert_eq!(to_rts_with_alternate(&d.a, qp, gid(B)), Status::Ok);
}

#[test]
fn a_reset_qp_is_not_held_to_the_alternate_path_of_its_last_connection() {
    // rxe keeps a QP's alternate path across RESET. A reconnection that sets no alternate
    // path must be judged by the paths it sets, not by the old connection's alternate.
    let d = daemon();
    let (_, b_qpn) = rc_qp(&d.b);
    let (qp, _) = rc_qp(&d.a);
    assert_eq!(to_rtr(&d.a, qp, gid(B), b_qpn), Status::Ok);
    assert_eq!(to_rts_with_alternate(&d.a, qp, gid(B)), Status::Ok);
    let reset = wire::QpAttr::new_zeroed().with_qp_state(QpState::Reset);
    assert_eq!(
        d.a.status(ControlRequest::ModifyQp(ModifyQpReq {
            qp: Le32::new(qp),
            attr_mask: Le32::new(M::STATE.bits()),
            attr: reset,
        })),
        Status::Ok
    );
    let mut init = wire::QpAttr::new_zeroed().with_qp_state(QpState::Init);
    init.port_num = 1;
    init.qp_access_flags = Le32::new(AccessFlags::LOCAL_WRITE.bits());
    assert_eq!(
        d.a.status(ControlRequest::ModifyQp(ModifyQpReq {
            qp: Le32::new(qp),
            attr_mask: Le32::new((M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS).bits()),
            attr: init,
        })),
        Status::Ok
    );
    // Another machine's QP 0x99: B's address (the stale alternate) does not lead to it, and
    // it need not.
    assert_eq!(to_rtr(&d.a, qp, gid(REMOTE), 0x99), Status::Ok);
    // An alternate path set again is checked again.
    assert_eq!(to_rts_with_alternate(&d.a, qp, gid(B)), Status::Invalid);
}

/// Makes the host's GID entry of `from` hold `to` when the next `command` begins: the host's
/// table changing between the device's check of a source index and the host command.
fn swap_gid_on(d: &Daemon, command: &'static str, from: [u8; 16], to: [u8; 16]) {
    d.fake.world().before_next = Some((
        command,
        Box::new(move |world| {
            for (_, entry) in &mut world.extra_gids {
                if entry.gid == from {
                    entry.gid = to;
                }
            }
        }),
    ));
}

#[test]
fn a_source_entry_that_changes_under_the_host_command_fails_it() {
    // The kernel resolves a source GID index when the command runs: an entry that moved
    // after the device checked it would make A's AH or QP send from B's address.
    let d = daemon();
    let pd = d.a.alloc_pd();
    let create_ah = ControlRequest::CreateAh(wire::CreateAhReq {
        pd: Le32::new(pd),
        reserved: Le32::ZERO,
        ah_attr: roce_av(0, gid(REMOTE)),
    });
    let ahs = d.fake.world().ahs.len();
    swap_gid_on(&d, "CREATE_AH", gid(A), gid(B));
    assert_eq!(d.a.status(create_ah), Status::Invalid);
    assert_eq!(
        d.fake.world().ahs.len(),
        ahs,
        "the host AH is destroyed again"
    );
    // The same under MODIFY_QP: the command fails and the QP is in ERR, sending nothing.
    let moved = d
        .fake
        .world()
        .extra_gids
        .iter()
        .filter(|(_, entry)| entry.gid == gid(B))
        .map(|(index, _)| *index)
        .min()
        .unwrap();
    let restore = |world: &mut vrdma_test_support::fake_host::world::World| {
        for (index, entry) in &mut world.extra_gids {
            if *index == moved {
                entry.gid = gid(A);
            }
        }
    };
    restore(&mut d.fake.world());
    let (qp, _) = rc_qp(&d.a);
    swap_gid_on(&d, "MODIFY_QP", gid(A), gid(B));
    assert_eq!(to_rtr(&d.a, qp, gid(REMOTE), 0x99), Status::Invalid);
    let host_qp = *d.fake.world().qps.keys().next_back().unwrap();
    assert_eq!(d.fake.world().qp_state[&host_qp], QpState::Err);
}

//! Guests with a network identity (spec §12): each sees a virtual GID table of its own
//! addresses from index 0, every source address it names (MODIFY_QP primary and alternate
//! path, CREATE_AH) is translated to the host's entry or refused, its traffic class, SL and
//! destinations are checked against its policy, and queries show its own GUID and no
//! host-wide counters. Also the provisioning of addresses on the netdev.
//!
//! The real per-guest device driven on a host without RDMA, over the fake host device of
//! `vrdma_test_support::fake_host`, whose GID table fills as the kernel's does when its netdev
//! gets an address.

use std::time::Duration;

use vrdma_backend::guest::options::{DeviceOptions, GuestError};
use vrdma_backend::guest_device::GuestDeviceFactory;
use vrdma_backend::identity::policy::{ValueSet, MAX_SERVICE_LEVEL, MAX_TRAFFIC_CLASS};
use vrdma_backend::identity::provision::{provision, ProvisionError};
use vrdma_backend::identity::{GuestAddress, GuestIdentity, TrafficPolicy};
use vrdma_spec::verbs::{AccessFlags, GidType, Mtu, QpAttrMask, QpState};
use vrdma_spec::wire::{self, *};
use vrdma_spec::{ControlRequest, Le32, ResponseBody, Status};
use vrdma_test_support::fake_host::device::*;
use vrdma_test_support::fake_host::harness::*;
use zerocopy::FromZeros;

type M = QpAttrMask;

fn address(text: &str) -> GuestAddress {
    text.parse().unwrap()
}

fn gid_of(text: &str) -> [u8; 16] {
    address(text).gid()
}

/// Test options for guest `name` with `addresses` and `policy`, UD allowed.
fn identified(name: &str, addresses: &[&str], policy: TrafficPolicy) -> DeviceOptions {
    DeviceOptions {
        allow_ud: true,
        identity: GuestIdentity {
            name: name.into(),
            addresses: addresses.iter().map(|a| address(a)).collect(),
            policy,
        },
        ..test_options()
    }
}

/// A fake device like rxe (RoCE v2 entries only) whose netdev holds `addresses` (their GIDs
/// after [`GID0`]'s, in order).
fn device_with(addresses: &[&str]) -> std::sync::Arc<FakeDevice> {
    let fake = FakeDevice::new();
    for a in addresses {
        fake.world().add_address_gids(&address(a));
    }
    fake
}

/// As [`device_with`], for a port with RoCE v1 and v2 entries.
fn two_type_device_with(addresses: &[&str]) -> std::sync::Arc<FakeDevice> {
    let fake = FakeDevice::new();
    fake.world().both_roce_types = true;
    fake.world()
        .extra_gids
        .push((1, GidEntry::valid(GID0, GidType::RoceV1)));
    for a in addresses {
        fake.world().add_address_gids(&address(a));
    }
    fake
}

fn query_gid(guest: &TestGuest, index: u32) -> Result<GidEntry, Status> {
    match guest.run(ControlRequest::QueryGid(QueryTableReq {
        port_num: Le32::new(1),
        index: Le32::new(index),
    })) {
        vrdma_spec::ControlResponse::Ok(ResponseBody::QueryGid(g)) => Ok(g),
        vrdma_spec::ControlResponse::Ok(other) => panic!("{other:?}"),
        vrdma_spec::ControlResponse::Err(e) => Err(e.status()),
    }
}

fn gid_table(guest: &TestGuest) -> (Vec<(u32, [u8; 16], u32)>, u32) {
    let ResponseBody::QueryGidTable(t) = guest.ok(ControlRequest::QueryGidTable(QueryTableReq {
        port_num: Le32::new(1),
        index: Le32::new(0),
    })) else {
        panic!()
    };
    let entries = t.entries[..t.count.get() as usize]
        .iter()
        .map(|e| (e.index.get(), e.entry().gid, e.entry().gid_type.get()))
        .collect();
    (entries, t.next_index.get())
}

fn port_attr(guest: &TestGuest) -> PortAttr {
    let ResponseBody::QueryPort(p) = guest.ok(ControlRequest::QueryPort(QueryPortReq {
        port_num: Le32::new(1),
        reserved: Le32::ZERO,
    })) else {
        panic!()
    };
    p
}

fn device_attr(guest: &TestGuest) -> DeviceAttr {
    let ResponseBody::QueryDevice(d) = guest.ok(ControlRequest::QueryDevice) else {
        panic!()
    };
    d
}

#[test]
fn two_guests_see_only_their_own_tables_from_index_0() {
    // Guest B's address came first, so guest A's entries are not at the host's low indices.
    let fake = device_with(&["192.0.2.20", "fd00::a:1"]);
    let a = TestGuest::new(
        &fake,
        identified("tenant-a", &["fd00::a:1/64"], TrafficPolicy::default()),
        ALL_FEATURES,
    );
    let b = TestGuest::new(
        &fake,
        identified("tenant-b", &["192.0.2.20"], TrafficPolicy::default()),
        ALL_FEATURES,
    );
    for (guest, gid) in [(&a, gid_of("fd00::a:1")), (&b, gid_of("192.0.2.20"))] {
        // rxe's ports have RoCE v2 entries only: one slot per address.
        assert_eq!(port_attr(guest).gid_tbl_len.get(), 1);
        assert_eq!(
            query_gid(guest, 0),
            Ok(GidEntry::valid(gid, GidType::RoceV2))
        );
        assert_eq!(query_gid(guest, 1), Err(Status::Invalid));
        assert_eq!(gid_table(guest), (vec![(0, gid, 2)], GID_TABLE_END));
    }
    // Each is a node of its own, neither the host nor the other.
    let (ga, gb) = (device_attr(&a), device_attr(&b));
    assert_ne!(ga.node_guid, gb.node_guid);
    assert_eq!(ga.node_guid, ga.sys_image_guid);
    assert_eq!(ga.node_guid[0] & 0x03, 0x02, "locally administered");
    assert_eq!(
        ga.node_guid,
        GuestIdentity {
            name: "tenant-a".into(),
            ..GuestIdentity::default()
        }
        .guid()
    );

    // A guest's entry that leaves the host table reads as empty; its index does not move.
    fake.world().remove_address_gids(&address("fd00::a:1"));
    assert_eq!(query_gid(&a, 0), Ok(GidEntry::EMPTY));
    assert_eq!(gid_table(&a), (vec![], GID_TABLE_END));
    assert_eq!(port_attr(&a).gid_tbl_len.get(), 1);
    fake.world().add_address_gids(&address("fd00::a:1"));
    assert_eq!(
        query_gid(&a, 0),
        Ok(GidEntry::valid(gid_of("fd00::a:1"), GidType::RoceV2))
    );

    // A guest without addresses of a daemon without tenants sees the whole host table.
    let open = TestGuest::new(&fake, test_options(), ALL_FEATURES);
    assert_eq!(port_attr(&open).gid_tbl_len.get(), 16);
    assert_eq!(gid_table(&open).0.len(), 3);
    assert_eq!(
        device_attr(&open).node_guid,
        [0; 8],
        "the host's (the fake's is 0)"
    );
}

#[test]
fn a_port_with_both_roce_types_gives_two_slots_per_address() {
    let fake = two_type_device_with(&["fd00::b:1", "fd00::a:1", "10.0.0.1"]);
    let a = TestGuest::new(
        &fake,
        identified("a", &["fd00::a:1", "10.0.0.1"], TrafficPolicy::default()),
        ALL_FEATURES,
    );
    assert_eq!(port_attr(&a).gid_tbl_len.get(), 4);
    let (v6, v4) = (gid_of("fd00::a:1"), gid_of("10.0.0.1"));
    assert_eq!(
        gid_table(&a),
        (
            vec![(0, v6, 1), (1, v6, 2), (2, v4, 1), (3, v4, 2)],
            GID_TABLE_END
        )
    );
}

#[test]
fn host_wide_counters_are_never_shown() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), ALL_FEATURES);
    let p = port_attr(&guest);
    assert_eq!((p.bad_pkey_cntr.get(), p.qkey_viol_cntr.get()), (0, 0));
}

/// An address vector from guest GID `sgid_index` to `dgid`.
fn av(sgid_index: u8, dgid: [u8; 16]) -> wire::AhAttr {
    roce_av(sgid_index, dgid)
}

fn create_ah(guest: &TestGuest, pd: u32, attr: wire::AhAttr) -> Result<CreateAhResp, Status> {
    match guest.run(ControlRequest::CreateAh(CreateAhReq {
        pd: Le32::new(pd),
        reserved: Le32::ZERO,
        ah_attr: attr,
    })) {
        vrdma_spec::ControlResponse::Ok(ResponseBody::CreateAh(r)) => Ok(r),
        vrdma_spec::ControlResponse::Ok(other) => panic!("{other:?}"),
        vrdma_spec::ControlResponse::Err(e) => Err(e.status()),
    }
}

/// Host index of (`gid`, `gid_type`) in the fake's table.
fn host_index(fake: &FakeDevice, gid: [u8; 16], gid_type: GidType) -> u8 {
    let wanted = GidEntry::valid(gid, gid_type);
    fake.world()
        .extra_gids
        .iter()
        .find(|(_, e)| *e == wanted)
        .map(|(i, _)| *i as u8)
        .unwrap()
}

const PEER: &str = "fd00::b:9";

/// A guest without addresses beside a tenant of the same daemon: the tenant's entries read as
/// empty at their host indices and cannot be sent from (a host guest must not spoof a tenant;
/// found by the handler fuzzer).
#[test]
fn a_guest_sharing_the_hosts_identity_cannot_use_a_tenants_address() {
    let fake = device_with(&["fd00::a:1", "fd00::99:1"]);
    let daemon = TestDaemon::new(&fake);
    let tenant = daemon.guest(
        identified("a", &["fd00::a:1"], TrafficPolicy::default()),
        ALL_FEATURES,
    );
    let open = daemon.guest(test_options(), ALL_FEATURES);
    let tenant_index = host_index(&fake, gid_of("fd00::a:1"), GidType::RoceV2);
    let other_index = host_index(&fake, gid_of("fd00::99:1"), GidType::RoceV2);
    assert_eq!(query_gid(&open, tenant_index.into()), Ok(GidEntry::EMPTY));
    assert_eq!(
        query_gid(&open, other_index.into()),
        Ok(GidEntry::valid(gid_of("fd00::99:1"), GidType::RoceV2))
    );
    let table: Vec<[u8; 16]> = gid_table(&open).0.iter().map(|e| e.1).collect();
    assert_eq!(table, [GID0, gid_of("fd00::99:1")]);
    assert_eq!(
        port_attr(&open).gid_tbl_len.get(),
        16,
        "indices stay the host's"
    );
    let pd = open.alloc_pd();
    let peer = gid_of(PEER);
    assert_eq!(
        create_ah(&open, pd, av(tenant_index, peer)),
        Err(Status::Invalid)
    );
    let resp = create_ah(&open, pd, av(other_index, peer)).unwrap();
    assert_eq!(
        fake.world().ah_attrs[&resp.ah_num.get()].sgid_index,
        other_index
    );
    // The tenant itself still sends from its address.
    let pd = tenant.alloc_pd();
    create_ah(&tenant, pd, av(0, peer)).unwrap();
}

#[test]
fn address_handles_use_only_the_guests_own_sources() {
    let fake = two_type_device_with(&["fd00::b:1", "fd00::a:1", "10.0.0.1"]);
    let a = TestGuest::new(
        &fake,
        identified("a", &["fd00::a:1", "10.0.0.1"], TrafficPolicy::default()),
        ALL_FEATURES,
    );
    let pd = a.alloc_pd();
    let peer = gid_of(PEER);
    // Its four entries translate to the host's.
    for (index, gid, gid_type) in [
        (0, gid_of("fd00::a:1"), GidType::RoceV1),
        (1, gid_of("fd00::a:1"), GidType::RoceV2),
        (2, gid_of("10.0.0.1"), GidType::RoceV1),
        (3, gid_of("10.0.0.1"), GidType::RoceV2),
    ] {
        let resp = create_ah(&a, pd, av(index, peer)).unwrap();
        let host = fake.world().ah_attrs[&(resp.ah_num.get())];
        assert_eq!(host.sgid_index, host_index(&fake, gid, gid_type), "{index}");
        // The guest sees its own index and address in the returned AV.
        assert_eq!(resp.av.sgid_index, index);
        let family = u16::from_ne_bytes([resp.av.sgid_addr[0], resp.av.sgid_addr[1]]);
        if index < 2 {
            assert_eq!(family, libc::AF_INET6 as u16);
            assert_eq!(&resp.av.sgid_addr[8..24], &gid);
        } else {
            assert_eq!(family, libc::AF_INET as u16);
            assert_eq!(&resp.av.sgid_addr[4..8], &[10, 0, 0, 1]);
        }
        a.ok(ControlRequest::DestroyAh(handle(resp.ah.get())));
    }
    // Beyond its table: the host's and the other guest's entries cannot be named.
    for index in [4, 5, 6, 255] {
        assert_eq!(create_ah(&a, pd, av(index, peer)), Err(Status::Invalid));
    }
    // Host indices move (another address leaves, its slots are reused): still its own.
    fake.world().remove_address_gids(&address("fd00::b:1"));
    fake.world().remove_address_gids(&address("fd00::a:1"));
    fake.world().add_address_gids(&address("fd00::a:1"));
    let resp = create_ah(&a, pd, av(1, peer)).unwrap();
    let host = fake.world().ah_attrs[&(resp.ah_num.get())];
    assert_eq!(
        host.sgid_index,
        host_index(&fake, gid_of("fd00::a:1"), GidType::RoceV2)
    );
    a.ok(ControlRequest::DestroyAh(handle(resp.ah.get())));
    // An entry gone from the host table cannot be used.
    fake.world().remove_address_gids(&address("10.0.0.1"));
    assert_eq!(create_ah(&a, pd, av(3, peer)), Err(Status::Invalid));
    assert!(fake.world().ahs.is_empty());
}

/// RESET→INIT→RTR of an RC QP with `primary` and, if given, an alternate path.
fn connect(
    guest: &TestGuest,
    qp: u32,
    primary: wire::AhAttr,
    alternate: Option<wire::AhAttr>,
) -> Status {
    let mut attr = wire::QpAttr::new_zeroed().with_qp_state(QpState::Init);
    attr.port_num = 1;
    attr.qp_access_flags = Le32::new(AccessFlags::LOCAL_WRITE.bits());
    let init = ControlRequest::ModifyQp(ModifyQpReq {
        qp: Le32::new(qp),
        attr_mask: Le32::new((M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS).bits()),
        attr,
    });
    // RESET→INIT, or INIT→INIT after an earlier refused attempt.
    assert_eq!(guest.status(init), Status::Ok);
    let mut attr = wire::QpAttr::new_zeroed()
        .with_qp_state(QpState::Rtr)
        .with_path_mtu(Mtu::Mtu1024);
    attr.dest_qp_num = Le32::new(0x123);
    attr.rq_psn = Le32::new(7);
    attr.min_rnr_timer = 12;
    attr.max_dest_rd_atomic = 1;
    attr.ah_attr = primary;
    let mut mask = M::STATE
        | M::AV
        | M::PATH_MTU
        | M::DEST_QPN
        | M::RQ_PSN
        | M::MAX_DEST_RD_ATOMIC
        | M::MIN_RNR_TIMER;
    if let Some(alt) = alternate {
        attr.alt_ah_attr = alt;
        attr.alt_port_num = 1;
        attr.alt_timeout = 14;
        mask |= M::ALT_PATH;
    }
    guest.status(ControlRequest::ModifyQp(ModifyQpReq {
        qp: Le32::new(qp),
        attr_mask: Le32::new(mask.bits()),
        attr,
    }))
}

fn new_rc_qp(guest: &TestGuest) -> u32 {
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(8).cq.get();
    guest.create_qp(qp_req(pd, cq, 0)).unwrap().qp.get()
}

fn query_paths(guest: &TestGuest, qp: u32) -> (wire::AhAttr, wire::AhAttr) {
    let ResponseBody::QueryQp(q) = guest.ok(ControlRequest::QueryQp(QueryQpReq {
        qp: Le32::new(qp),
        attr_mask: Le32::new((M::AV | M::ALT_PATH).bits()),
    })) else {
        panic!()
    };
    (q.attr.ah_attr, q.attr.alt_ah_attr)
}

#[test]
fn qp_paths_use_only_the_guests_own_sources_and_query_back_in_its_terms() {
    let fake = two_type_device_with(&["fd00::b:1", "fd00::a:1", "fd00::a:2"]);
    let a = TestGuest::new(
        &fake,
        identified("a", &["fd00::a:1", "fd00::a:2"], TrafficPolicy::default()),
        ALL_FEATURES,
    );
    assert_eq!(a.set_doorbell_area(RAM_BASE), Status::Ok);
    let qp = new_rc_qp(&a);
    let host_qp = *fake.world().qps.keys().next().unwrap();
    let peer = gid_of(PEER);
    // The primary or the alternate path naming a slot beyond the guest's table.
    assert_eq!(connect(&a, qp, av(4, peer), None), Status::Invalid);
    assert_eq!(
        connect(&a, qp, av(1, peer), Some(av(4, peer))),
        Status::Invalid
    );
    // Only the INIT transitions reached the host.
    assert!(fake.world().modified.iter().all(|m| m.2 == QpState::Init));
    assert_eq!(connect(&a, qp, av(1, peer), Some(av(2, peer))), Status::Ok);
    let (primary, alternate) = fake.world().qp_paths[&host_qp];
    assert_eq!(
        primary.sgid_index,
        host_index(&fake, gid_of("fd00::a:1"), GidType::RoceV2)
    );
    assert_eq!(
        alternate.sgid_index,
        host_index(&fake, gid_of("fd00::a:2"), GidType::RoceV1)
    );
    let (primary, alternate) = query_paths(&a, qp);
    assert_eq!((primary.sgid_index, primary.port_num), (1, 1));
    assert_eq!((alternate.sgid_index, alternate.port_num), (2, 1));
    assert_eq!(primary.dgid, peer);
    // A source entry that left the host table (its index taken by another address) is not
    // reported as the guest's: the path reads as index 0, never the other entry's index.
    fake.world().remove_address_gids(&address("fd00::a:2"));
    fake.world().add_address_gids(&address("fd00::c:1"));
    let (_, alternate) = query_paths(&a, qp);
    assert_eq!(alternate.sgid_index, 0);
}

#[test]
fn a_guest_without_addresses_is_still_held_to_its_policy() {
    let fake = FakeDevice::new();
    let policy = TrafficPolicy {
        destinations: Some(vec!["fd00::b:0/112".parse().unwrap()]),
        ..TrafficPolicy::default()
    };
    let guest = TestGuest::new(&fake, identified("open", &[], policy), ALL_FEATURES);
    let pd = guest.alloc_pd();
    // The host's table as before: GID 0 is the host's.
    assert!(create_ah(&guest, pd, av(0, gid_of(PEER))).is_ok());
    assert_eq!(
        create_ah(&guest, pd, av(0, gid_of("fd00::c:1"))),
        Err(Status::Invalid)
    );
}

#[test]
fn traffic_class_sl_and_destinations_follow_the_policy() {
    let policy = TrafficPolicy {
        traffic_classes: ValueSet::of([0, 106], MAX_TRAFFIC_CLASS, "tc").unwrap(),
        service_levels: ValueSet::of([0, 3], MAX_SERVICE_LEVEL, "sl").unwrap(),
        destinations: Some(vec![
            "fd00::b:0/112".parse().unwrap(),
            "10.1.0.0/16".parse().unwrap(),
        ]),
    };
    let fake = device_with(&["fd00::a:1"]);
    let a = TestGuest::new(&fake, identified("a", &["fd00::a:1"], policy), ALL_FEATURES);
    let pd = a.alloc_pd();
    let peer = gid_of(PEER);
    let with = |tc: u8, sl: u8, dgid: [u8; 16]| wire::AhAttr {
        traffic_class: tc,
        sl,
        ..av(0, dgid)
    };
    for (attr, allowed) in [
        (with(0, 0, peer), true),
        (with(106, 3, gid_of("10.1.2.3")), true),
        (with(1, 0, peer), false),
        (with(0, 1, peer), false),
        (with(0, 0, gid_of("fd00::c:1")), false),
        (with(0, 0, gid_of("10.2.0.1")), false),
    ] {
        let result = create_ah(&a, pd, attr);
        assert_eq!(result.is_ok(), allowed, "{attr:?}");
        if let Ok(resp) = result {
            a.ok(ControlRequest::DestroyAh(handle(resp.ah.get())));
        } else {
            assert_eq!(result, Err(Status::Invalid));
        }
    }
    assert!(fake.world().ahs.is_empty());

    assert_eq!(a.set_doorbell_area(RAM_BASE), Status::Ok);
    let qp = new_rc_qp(&a);
    assert_eq!(connect(&a, qp, with(1, 0, peer), None), Status::Invalid);
    assert_eq!(
        connect(
            &a,
            qp,
            with(0, 0, peer),
            Some(with(0, 0, gid_of("fd00::c:1")))
        ),
        Status::Invalid
    );
    assert_eq!(
        connect(&a, qp, with(0, 0, peer), Some(with(0, 3, peer))),
        Status::Ok
    );
}

#[test]
fn addresses_need_a_roce_port_and_a_valid_identity() {
    let fake = FakeDevice::new();
    let mut options = identified("a", &["fd00::a:1"], TrafficPolicy::default());
    options.identity.name = "bad name".into();
    assert!(matches!(
        GuestDeviceFactory::new(fake.clone(), options),
        Err(GuestError::Identity(_))
    ));
    let mut options = identified(
        "a",
        &["fd00::a:1", "fd00::a:1/64"],
        TrafficPolicy::default(),
    );
    let e = GuestDeviceFactory::new(fake.clone(), options.clone())
        .err()
        .unwrap();
    assert_eq!(
        e.to_string(),
        "guest identity: address fd00::a:1 is given twice"
    );
    options.identity.addresses.pop();
    assert!(GuestDeviceFactory::new(fake, options).is_ok());
}

#[test]
fn provisioning_adds_waits_for_gids_and_removes_only_what_it_added() {
    let fake = FakeDevice::new();
    let existing = address("fd00::e:1/64");
    fake.world().netdev_addresses.push(existing);
    fake.world().add_address_gids(&existing);
    let new = [address("fd00::a:1/64"), address("192.0.2.7/24"), existing];
    let added = provision(&*fake, &*fake, 1, &new, Duration::from_secs(1)).unwrap();
    assert_eq!(added.added(), &new[..2]);
    // One RoCE v2 entry per address, as on rxe.
    assert_eq!(fake.world().extra_gids.len(), 3);
    added.release(&*fake);
    assert_eq!(fake.world().netdev_addresses, vec![existing]);
    assert_eq!(
        fake.world().extra_gids.len(),
        1,
        "the existing address's GID stays"
    );

    // GID entries that never come: a clear error after the bound, and nothing left behind.
    fake.world().no_gids_for_new_addresses = true;
    let e = provision(&*fake, &*fake, 1, &new[..1], Duration::from_millis(60)).unwrap_err();
    assert!(matches!(e, ProvisionError::GidTimeout { .. }));
    assert!(
        e.to_string().starts_with(
            "fd00::a:1/64 is on fakeeth0 but the GID table of port 1 has no RoCE v2 entry"
        ),
        "{e}"
    );
    assert_eq!(fake.world().netdev_addresses, vec![existing]);

    // A refused second address removes the first again.
    fake.world().no_gids_for_new_addresses = false;
    fake.world().refuse_address = Some(new[1].ip);
    let e = provision(&*fake, &*fake, 1, &new, Duration::from_secs(1)).unwrap_err();
    assert!(matches!(e, ProvisionError::Netlink { .. }), "{e}");
    assert_eq!(fake.world().netdev_addresses, vec![existing]);
    assert_eq!(fake.world().extra_gids.len(), 1);

    // A port with v1 and v2 entries: both must come.
    fake.world().refuse_address = None;
    fake.world().both_roce_types = true;
    fake.world()
        .extra_gids
        .push((9, GidEntry::valid(GID0, GidType::RoceV1)));
    let added = provision(&*fake, &*fake, 1, &new[..1], Duration::from_secs(1)).unwrap();
    let a = new[0].gid();
    let types: Vec<_> = fake
        .world()
        .extra_gids
        .iter()
        .filter(|(_, e)| e.gid == a)
        .map(|(_, e)| e.gid_type().unwrap())
        .collect();
    assert_eq!(types, [GidType::RoceV1, GidType::RoceV2]);
    added.release(&*fake);
}

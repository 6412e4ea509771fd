//! The connection manager through the device (spec §7.5), over the fake host CM of
//! `vrdma_test_support::fake_host::cm`: two guests of one daemon connect an RC QP pair the way
//! librdmacm does (resolve, connect with private data, QP states from CM_INIT_QP_ATTR,
//! accept, establish, disconnect), in the guests' own terms; ids stay confined to each guest's
//! addresses, QPs and handles; requests over a listener's backlog are rejected; destroying an
//! id or discarding the device leaves nothing on the host.

use vrdma_backend::identity::{GuestAddress, GuestIdentity};
use vrdma_backend::vhost_device::handler::DeviceHandler;
use vrdma_spec::cm::*;
use vrdma_spec::config::DeviceConfig;
use vrdma_spec::control::MAX_CM_RESPONSE_SIZE;
use vrdma_spec::event::Event;
use vrdma_spec::features::*;
use vrdma_spec::verbs::{AccessFlags, QpState};
use vrdma_spec::{ControlRequest, EventType, Status};
use vrdma_test_support::fake_host::cm::{FAKE_NETDEV_IFINDEX, REJECT_NO_LISTENER};
use vrdma_test_support::fake_host::cm_steps::*;
use vrdma_test_support::fake_host::device::*;
use vrdma_test_support::fake_host::harness::*;

const FEATURES: u64 = VRDMA_F_CM | VRDMA_F_UC | VRDMA_F_RING_RXE_V1;
const RC: u16 = cm_port_space::TCP;
const PORT: u16 = 7471;

/// The CM_EVENT notifications on the guest's event queue, in order: (id, event).
fn notifications(guest: &TestGuest) -> Vec<(u32, u32)> {
    let mut seen = Vec::new();
    guest.guest_io().events().discard_where(|bytes| {
        let e = Event::decode(bytes).unwrap();
        if e.event_type == EventType::CmEvent {
            seen.push((e.handle, e.detail));
        }
        true
    });
    seen
}

/// One daemon serving tenants `a` (fd00::a:1) and `b` (fd00::b:1), whose addresses the fake
/// port has.
fn two_tenants(fake: &std::sync::Arc<FakeDevice>) -> (TestDaemon, TestGuest, TestGuest) {
    let daemon = TestDaemon::new(fake);
    let tenant = |name: &str, address: &str| {
        fake.world()
            .add_address_gids(&address.parse::<GuestAddress>().unwrap());
        let mut options = test_options();
        options.identity = GuestIdentity {
            name: name.into(),
            addresses: vec![address.parse().unwrap()],
            ..GuestIdentity::default()
        };
        daemon.guest(options, FEATURES)
    };
    let a = tenant("a", "fd00::a:1");
    let b = tenant("b", "fd00::b:1");
    (daemon, a, b)
}

fn addr_of(a: &CmAddr) -> std::net::SocketAddr {
    a.socket_addr().expect("an address")
}

#[test]
fn the_device_offers_the_cm_only_with_a_host_cm() {
    let without = TestGuest::new(&FakeDevice::new(), test_options(), 0);
    assert_eq!(without.dev().device_features() & VRDMA_F_CM, 0);
    assert_eq!(without.config().max_response_size.get(), 200);
    // Without negotiation every CM command is refused before anything else.
    assert_eq!(
        without.status(ControlRequest::Cm(vrdma_spec::control::CmRequest::GetEvent)),
        Status::Unsupported
    );
    let with = TestGuest::new(&fake_with_cm(), test_options(), FEATURES);
    assert_ne!(with.dev().device_features() & VRDMA_F_CM, 0);
    let config: DeviceConfig = with.config();
    assert_eq!(
        config.max_response_size.get() as usize,
        MAX_CM_RESPONSE_SIZE
    );
    assert_eq!(get_event(&with).event.get(), CM_EVENT_NONE);
}

#[test]
fn two_guests_connect_an_rc_pair_the_way_librdmacm_does() {
    let fake = fake_with_cm();
    let daemon = TestDaemon::new(&fake);
    let server = daemon.guest(test_options(), FEATURES);
    let client = daemon.guest(test_options(), FEATURES);
    let host_addr = "[fe80::1%3]";

    // Passive side: bind the host's link-local address (the guest's scope id 3 is its own).
    let listener = create_id(&server, RC);
    assert_eq!(
        bind(&server, listener, &format!("{host_addr}:{PORT}")),
        Status::Ok
    );
    let bound = fake.world().cm.ids.values().find_map(|e| e.src).unwrap();
    assert_eq!(
        bound,
        format!("[fe80::1%{FAKE_NETDEV_IFINDEX}]:{PORT}")
            .parse()
            .unwrap()
    );
    assert_eq!(listen(&server, listener, 4), Status::Ok);

    // Active side: resolve (the device picks the source), route, QP to INIT, connect.
    let id = create_id(&client, RC);
    assert_eq!(
        resolve_addr(&client, id, None, &format!("[fe80::1%5]:{PORT}")),
        Status::Ok
    );
    let e = expect_cm_event(&client, cm_event::ADDR_RESOLVED);
    assert_eq!(e.id.get(), id);
    assert_eq!(
        addr_of(&e.dst),
        format!("[fe80::1%5]:{PORT}").parse().unwrap(),
        "guest scope"
    );
    assert_eq!(resolve_route(&client, id), Status::Ok);
    expect_cm_event(&client, cm_event::ROUTE_RESOLVED);
    let (client_qp, client_qpn) = rc_qp(&client);
    cm_modify(&client, id, client_qp, QpState::Init);
    assert_eq!(
        connect(&client, id, client_qp, b"hello from the client"),
        Status::Ok
    );

    // The request: a new id of the server's, the client's QP number and private data.
    let request = expect_cm_event(&server, cm_event::CONNECT_REQUEST);
    let conn = request.id.get();
    assert_ne!(conn, listener);
    assert_eq!(request.listen_id.get(), listener);
    assert_eq!(request.qp_num.get(), client_qpn);
    assert_eq!(
        &request.private_data[..usize::from(request.private_data_len)],
        b"hello from the client"
    );
    assert_eq!(
        addr_of(&request.src),
        format!("[fe80::1%3]:{PORT}").parse().unwrap()
    );
    assert_eq!(
        notifications(&server),
        vec![(listener, cm_event::CONNECT_REQUEST)]
    );

    // The server's QP through INIT (rxe's FLUSH bits dropped), RTR, RTS; then accept.
    let (server_qp, server_qpn) = rc_qp(&server);
    let init = init_qp_attr(&server, conn, QpState::Init);
    assert_eq!(
        init.attr.qp_access_flags.get(),
        (AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC).bits()
    );
    assert_eq!(init.attr.port_num, 1);
    cm_modify(&server, conn, server_qp, QpState::Init);
    let rtr = init_qp_attr(&server, conn, QpState::Rtr);
    assert_eq!(rtr.attr.dest_qp_num.get(), client_qpn);
    assert_eq!(
        rtr.attr.ah_attr.sgid_index, 0,
        "the guest's index of fe80::1"
    );
    assert_eq!(rtr.attr.ah_attr.port_num, 1);
    cm_modify(&server, conn, server_qp, QpState::Rtr);
    cm_modify(&server, conn, server_qp, QpState::Rts);
    assert_eq!(accept(&server, conn, server_qp, b"welcome"), Status::Ok);

    // The reply: the client moves its QP and establishes.
    let reply = expect_cm_event(&client, cm_event::CONNECT_RESPONSE);
    assert_eq!(reply.qp_num.get(), server_qpn);
    assert_eq!(
        &reply.private_data[..usize::from(reply.private_data_len)],
        b"welcome"
    );
    cm_modify(&client, id, client_qp, QpState::Rtr);
    cm_modify(&client, id, client_qp, QpState::Rts);
    assert_eq!(accept(&client, id, 0, b""), Status::Ok);
    expect_cm_event(&server, cm_event::ESTABLISHED);

    // Each host QP was aimed at the other's number.
    let w = fake.world();
    let dest = |qpn: u32| {
        w.connections
            .iter()
            .rev()
            .find(|c| c.dest_qpn == qpn)
            .is_some()
    };
    assert!(dest(client_qpn) && dest(server_qpn));
    drop(w);

    // Disconnect: the peer hears it, then the initiator once the peer answers.
    assert_eq!(disconnect(&client, id), Status::Ok);
    expect_cm_event(&server, cm_event::DISCONNECTED);
    assert_eq!(disconnect(&server, conn), Status::Ok);
    expect_cm_event(&client, cm_event::DISCONNECTED);

    // Destroy answers the events delivered: the listener's request, the connection's two;
    // the client's four.
    assert_eq!(destroy_id(&server, conn), 2);
    assert_eq!(destroy_id(&server, listener), 1);
    assert_eq!(destroy_id(&client, id), 4);
    assert!(fake.world().cm.ids.is_empty());
    assert!(fake.world().cm.foreign_ids.is_empty());
}

#[test]
fn a_connect_nobody_listens_for_is_rejected_with_the_reason() {
    let fake = fake_with_cm();
    let client = TestGuest::new(&fake, test_options(), FEATURES);
    let id = create_id(&client, RC);
    resolve(&client, id, "[fe80::1%2]:9");
    let (qp, _) = rc_qp(&client);
    assert_eq!(connect(&client, id, qp, b""), Status::Ok);
    let e = next_cm_event(&client);
    assert_eq!(e.event.get(), cm_event::REJECTED);
    assert_eq!(e.status.get() as i32, REJECT_NO_LISTENER);
}

#[test]
fn ids_stay_on_the_guests_own_addresses_qps_and_handles() {
    let fake = fake_with_cm();
    let (_daemon, a, b) = two_tenants(&fake);

    let id = create_id(&a, RC);
    // Another tenant's address, or the host's: refused; a wildcard is the tenant's own.
    assert_eq!(bind(&a, id, "[fd00::b:1]:7000"), Status::Invalid);
    assert_eq!(bind(&a, id, "[fe80::1%1]:7000"), Status::Invalid);
    assert_eq!(bind(&a, id, "[::]:7000"), Status::Ok);
    assert_eq!(
        addr_of(&query_addr(&a, id).src),
        "[fd00::a:1]:7000".parse().unwrap()
    );
    // The same address and port again: busy.
    let again = create_id(&a, RC);
    assert_eq!(bind(&a, again, "[fd00::a:1]:7000"), Status::Busy);

    // Listening needs an explicit bind (the host would bind the wildcard).
    let unbound = create_id(&b, RC);
    assert_eq!(listen(&b, unbound, 1), Status::BadState);

    // One guest's handles mean nothing in another's namespace: b has one id, a two.
    assert_ne!(again, unbound);
    assert_eq!(
        b.status(ControlRequest::Cm(
            vrdma_spec::control::CmRequest::Disconnect(handle(again))
        )),
        Status::BadHandle
    );

    // A resolution without a source binds the tenant's own address.
    let active = create_id(&b, RC);
    assert_eq!(
        resolve_addr(&b, active, Some("[fd00::a:1]:0"), "[fd00::a:1]:7000"),
        Status::Invalid
    );
    assert_eq!(
        resolve_addr(&b, active, None, "[fd00::a:1]:7000"),
        Status::Ok
    );
    assert_eq!(
        addr_of(&expect_cm_event(&b, cm_event::ADDR_RESOLVED).src).ip(),
        "fd00::b:1".parse::<std::net::IpAddr>().unwrap()
    );
    assert_eq!(resolve_route(&b, active), Status::Ok);
    expect_cm_event(&b, cm_event::ROUTE_RESOLVED);

    // A CONNECT names the guest's own QP of the id's type, connected through no other id.
    let (qp, _) = rc_qp(&b);
    assert_eq!(
        connect(&b, active, qp ^ 0x0100_0000, b""),
        Status::BadHandle
    );
    let pd = b.alloc_pd();
    let cq = b.create_cq(8).cq.get();
    let mut uc = qp_req(pd, cq, 0);
    uc.qp_type = 3;
    let uc_qp = b.create_qp(uc).unwrap().qp.get();
    assert_eq!(
        connect(&b, active, uc_qp, b""),
        Status::Invalid,
        "a UC QP on an RC id"
    );
    let second = create_id(&b, RC);
    assert_eq!(connect(&b, active, qp, b""), Status::Ok);
    assert_eq!(connect(&b, second, qp, b""), Status::Busy);
    assert!(fake.world().cm.foreign_ids.is_empty());
}

#[test]
fn requests_over_the_backlog_are_rejected_and_destroy_and_discard_release_ids() {
    let fake = fake_with_cm();
    let daemon = TestDaemon::new(&fake);
    let server = daemon.guest(test_options(), FEATURES);
    let client = daemon.guest(test_options(), FEATURES);
    let listener = create_id(&server, RC);
    assert_eq!(
        bind(&server, listener, &format!("[fe80::1%1]:{PORT}")),
        Status::Ok
    );
    assert_eq!(listen(&server, listener, 1), Status::Ok);

    let mut outcomes = Vec::new();
    for _ in 0..2 {
        let id = create_id(&client, RC);
        resolve(&client, id, &format!("[fe80::1%1]:{PORT}"));
        let (qp, _) = rc_qp(&client);
        assert_eq!(connect(&client, id, qp, b""), Status::Ok);
        // The server's device pumps; the first request waits in the backlog of 1.
        server.dev().fd_ready(
            server.guest_io(),
            vrdma_backend::guest_device::cm_events::CM_FD,
        );
        outcomes.push(id);
    }
    // The second was refused: its host id destroyed, the client rejected.
    let e = next_cm_event(&client);
    assert_eq!(
        (e.id.get(), e.event.get()),
        (outcomes[1], cm_event::REJECTED)
    );
    assert_eq!(
        server.dev().object_counts().cm_ids,
        2,
        "listener and one request"
    );

    // Destroying the listener destroys the request the guest never saw, and its events.
    assert_eq!(destroy_id(&server, listener), 0);
    assert_eq!(get_event(&server).event.get(), CM_EVENT_NONE);
    assert!(
        notifications(&server).is_empty(),
        "no notification outlives its id"
    );
    assert_eq!(server.dev().object_counts().cm_ids, 0);
    assert_eq!(next_cm_event(&client).event.get(), cm_event::REJECTED);

    // A discard (here DISCARD_STATE) destroys every id on the host.
    let before = fake.world().cm.ids.len();
    assert_eq!(before, 2, "the client's two ids");
    assert_eq!(client.status(ControlRequest::DiscardState), Status::Ok);
    assert!(fake.world().cm.ids.is_empty());
    assert_eq!(client.dev().object_counts().cm_ids, 0);
}

#[test]
fn the_id_quota_holds() {
    let fake = fake_with_cm();
    let guest = TestGuest::new(&fake, test_options(), FEATURES);
    let limit = test_options().quotas.cm_ids;
    for _ in 0..limit {
        create_id(&guest, cm_port_space::UDP);
    }
    assert_eq!(
        guest.status(ControlRequest::Cm(
            vrdma_spec::control::CmRequest::CreateId(CmCreateIdReq {
                port_space: vrdma_spec::Le16::new(RC),
                reserved: [0; 6],
            })
        )),
        Status::Quota
    );
    drop(guest);
    assert!(
        fake.world().cm.ids.is_empty(),
        "closing the guest's CM destroys its ids"
    );
}

#[test]
fn only_an_active_id_establishes_without_a_qp_and_the_host_guest_binds_only_the_ports_addresses() {
    let fake = fake_with_cm();
    let daemon = TestDaemon::new(&fake);
    let server = daemon.guest(test_options(), FEATURES);
    let client = daemon.guest(test_options(), FEATURES);
    let listener = create_id(&server, RC);
    // 192.0.2.1 is no address of the port (its GID table holds fe80::1 only).
    assert_eq!(bind(&server, listener, "192.0.2.1:7000"), Status::Invalid);
    assert_eq!(bind(&server, listener, "[fe80::1%1]:7000"), Status::Ok);
    assert_eq!(listen(&server, listener, 2), Status::Ok);
    let id = create_id(&client, RC);
    assert_eq!(
        accept(&client, id, 0, b""),
        Status::BadState,
        "no request sent"
    );
    resolve(&client, id, "[fe80::1%1]:7000");
    let (qp, _) = rc_qp(&client);
    assert_eq!(connect(&client, id, qp, b""), Status::Ok);
    let conn = expect_cm_event(&server, cm_event::CONNECT_REQUEST).id.get();
    // The passive side must name its QP: accepting without one would send QP number 0.
    assert_eq!(accept(&server, conn, 0, b""), Status::BadState);
}

#[test]
fn a_request_destroyed_before_delivery_gives_its_backlog_slot_back() {
    let fake = fake_with_cm();
    let daemon = TestDaemon::new(&fake);
    let server = daemon.guest(test_options(), FEATURES);
    let client = daemon.guest(test_options(), FEATURES);
    let listener = create_id(&server, RC);
    assert_eq!(bind(&server, listener, "[fe80::1%1]:7001"), Status::Ok);
    assert_eq!(listen(&server, listener, 1), Status::Ok);
    let (qp, _) = rc_qp(&client);
    let connect_once = || {
        let id = create_id(&client, RC);
        resolve(&client, id, "[fe80::1%1]:7001");
        assert_eq!(connect(&client, id, qp, b""), Status::Ok);
        server.dev().fd_ready(
            server.guest_io(),
            vrdma_backend::guest_device::cm_events::CM_FD,
        );
        id
    };
    let first = connect_once();
    // The request's id is the listener's next handle; destroyed before CM_GET_EVENT.
    let request = listener + 1;
    assert_eq!(destroy_id(&server, request), 0);
    assert_eq!(next_cm_event(&client).event.get(), cm_event::REJECTED);
    assert_eq!(destroy_id(&client, first), 3);
    // The backlog of 1 has room again: the next request reaches the server.
    connect_once();
    expect_cm_event(&server, cm_event::CONNECT_REQUEST);
}

#[test]
fn commands_that_make_events_wait_for_undelivered_ones() {
    let fake = fake_with_cm();
    let guest = TestGuest::new(&fake, test_options(), FEATURES);
    let id = create_id(&guest, RC);
    let limit = 64;
    for _ in 0..limit {
        assert_eq!(resolve_addr(&guest, id, None, "[fe80::1%1]:9"), Status::Ok);
        guest.dev().fd_ready(
            guest.guest_io(),
            vrdma_backend::guest_device::cm_events::CM_FD,
        );
    }
    assert_eq!(
        resolve_addr(&guest, id, None, "[fe80::1%1]:9"),
        Status::Busy
    );
    // Fetching one makes room; commands that make no events never wait.
    assert_eq!(get_event(&guest).event.get(), cm_event::ADDR_RESOLVED);
    assert_eq!(resolve_addr(&guest, id, None, "[fe80::1%1]:9"), Status::Ok);
    assert_eq!(
        query_addr(&guest, id).dst.socket_addr().map(|a| a.port()),
        Some(9)
    );
}

/// Loopback is the tenant itself (spec §7.5): a bind of 127.0.0.1 listens on the tenant's own
/// address (here its only one, IPv6), a connection to 127.0.0.1 reaches it, and another
/// tenant aiming at that address is rejected by the device without the listener seeing it.
#[test]
fn loopback_is_the_tenant_itself_and_its_listeners_hear_only_it() {
    let fake = fake_with_cm();
    let (_daemon, a, b) = two_tenants(&fake);
    let listener = create_id(&a, RC);
    assert_eq!(bind(&a, listener, &format!("127.0.0.1:{PORT}")), Status::Ok);
    assert_eq!(
        addr_of(&query_addr(&a, listener).src),
        format!("[fd00::a:1]:{PORT}").parse().unwrap()
    );
    assert_eq!(listen(&a, listener, 4), Status::Ok);

    // Another tenant aims at a's address: the device rejects it, a never hears of it.
    let stranger = create_id(&b, RC);
    resolve(&b, stranger, &format!("[fd00::a:1]:{PORT}"));
    let (qp, _) = rc_qp(&b);
    assert_eq!(connect(&b, stranger, qp, b""), Status::Ok);
    a.dev()
        .fd_ready(a.guest_io(), vrdma_backend::guest_device::cm_events::CM_FD);
    assert_eq!(next_cm_event(&b).event.get(), cm_event::REJECTED);
    assert_eq!(get_event(&a).event.get(), CM_EVENT_NONE);
    assert_eq!(a.dev().object_counts().cm_ids, 1, "the listener alone");

    // a connects to loopback: from its own address to its own listener.
    let active = create_id(&a, RC);
    assert_eq!(
        resolve_addr(&a, active, None, &format!("127.0.0.1:{PORT}")),
        Status::Ok
    );
    let resolved = expect_cm_event(&a, cm_event::ADDR_RESOLVED);
    assert_eq!(
        (addr_of(&resolved.src).ip(), addr_of(&resolved.dst)),
        (
            "fd00::a:1".parse().unwrap(),
            format!("[fd00::a:1]:{PORT}").parse().unwrap()
        )
    );
    assert_eq!(resolve_route(&a, active), Status::Ok);
    expect_cm_event(&a, cm_event::ROUTE_RESOLVED);
    let (qp, _) = rc_qp(&a);
    assert_eq!(connect(&a, active, qp, b""), Status::Ok);
    let request = expect_cm_event(&a, cm_event::CONNECT_REQUEST);
    assert_eq!(request.listen_id.get(), listener);
}

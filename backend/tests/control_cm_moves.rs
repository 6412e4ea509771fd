//! The device moves a connection's QP (`VRDMA_F_CM_MOVES_QP`, spec §7.5), over the fake host
//! CM: inside CM_ACCEPT (INIT, RTR and RTS before the accept or the establishing reply) and
//! one step at a time with CM_MOVE_QP, each step the guest's own MODIFY_QP with its checks.

use vrdma_backend::vhost_device::handler::DeviceHandler;
use vrdma_spec::cm::*;
use vrdma_spec::features::*;
use vrdma_spec::verbs::QpState;
use vrdma_spec::Status;
use vrdma_test_support::fake_host::cm_steps::*;
use vrdma_test_support::fake_host::harness::*;

const FEATURES: u64 = VRDMA_F_CM | VRDMA_F_UC | VRDMA_F_RING_RXE_V1;
const PORT: u16 = 7473;

/// With `VRDMA_F_CM_MOVES_QP` one CM_ACCEPT moves the QP as librdmacm would: the server's
/// from RESET through INIT, RTR and RTS before its accept (its depths from the accept's
/// parameters), the client's after the reply (0xff: the host's depths); both end in RTS,
/// aimed at each other, and the connection is established.
#[test]
fn one_accept_moves_the_qp_through_init_rtr_and_rts_when_asked() {
    let fake = fake_with_cm();
    let daemon = TestDaemon::new(&fake);
    let features = FEATURES | VRDMA_F_CM_MOVES_QP;
    let server = daemon.guest(test_options(), features);
    let client = daemon.guest(test_options(), features);
    assert_ne!(server.dev().device_features() & VRDMA_F_CM_MOVES_QP, 0);
    let id = listener_and_routed_id(&server, &client, PORT);
    let (client_qp, client_qpn) = rc_qp(&client);
    cm_modify(&client, id, client_qp, QpState::Init);
    assert_eq!(connect(&client, id, client_qp, b"hi"), Status::Ok);

    let conn = expect_cm_event(&server, cm_event::CONNECT_REQUEST).id.get();
    let (server_qp, server_qpn) = rc_qp(&server);
    assert_eq!(
        qp_state_and_depths(&server, server_qp).0,
        QpState::Reset as u32
    );
    assert_eq!(accept_moving(&server, conn, server_qp, (3, 2)), Status::Ok);
    assert_eq!(
        qp_state_and_depths(&server, server_qp),
        (QpState::Rts as u32, (2, 3))
    );

    let reply = expect_cm_event(&client, cm_event::CONNECT_RESPONSE);
    assert_eq!(reply.qp_num.get(), server_qpn);
    assert_eq!(accept_moving(&client, id, 0, (0xff, 0xff)), Status::Ok);
    assert_eq!(
        qp_state_and_depths(&client, client_qp).0,
        QpState::Rts as u32
    );
    expect_cm_event(&server, cm_event::ESTABLISHED);
    let w = fake.world();
    for qpn in [client_qpn, server_qpn] {
        assert!(w.connections.iter().any(|c| c.dest_qpn == qpn), "{qpn}");
    }
}

/// The flag is the device's to offer: a guest that did not negotiate it is refused before
/// anything moves or reaches the peer; so is a move of a QP whose own MODIFY_QP would be
/// refused (here: a QP of the id's type is RC only, and the client's QP is not the id's to
/// establish before a reply).
#[test]
fn a_move_the_guest_may_not_make_sends_nothing() {
    let fake = fake_with_cm();
    let daemon = TestDaemon::new(&fake);
    let server = daemon.guest(test_options(), FEATURES);
    let client = daemon.guest(test_options(), FEATURES | VRDMA_F_CM_MOVES_QP);
    assert_eq!(
        server.dev().device_features() & VRDMA_F_CM_MOVES_QP,
        VRDMA_F_CM_MOVES_QP
    );
    let id = listener_and_routed_id(&server, &client, PORT);
    let (client_qp, _) = rc_qp(&client);
    // Before any reply the client's id has nothing to establish.
    assert_eq!(accept_moving(&client, id, 0, (1, 1)), Status::BadState);
    cm_modify(&client, id, client_qp, QpState::Init);
    assert_eq!(connect(&client, id, client_qp, b"hi"), Status::Ok);

    let conn = expect_cm_event(&server, cm_event::CONNECT_REQUEST).id.get();
    let (server_qp, _) = rc_qp(&server);
    // The server did not accept the feature.
    assert_ne!(accept_moving(&server, conn, server_qp, (1, 1)), Status::Ok);
    assert_eq!(
        qp_state_and_depths(&server, server_qp).0,
        QpState::Reset as u32
    );
    assert_eq!(
        get_event(&client).event.get(),
        CM_EVENT_NONE,
        "nothing reached the peer"
    );
}

/// CM_MOVE_QP is one CM_INIT_QP_ATTR and MODIFY_QP pair in one command: the client's QP goes
/// to INIT before its connect and to RTR and RTS after the reply (its depths from the command
/// unless 0xff), then establishes; the connection comes up as with the pairs.
#[test]
fn a_qp_moves_one_step_per_command() {
    let fake = fake_with_cm();
    let daemon = TestDaemon::new(&fake);
    let features = FEATURES | VRDMA_F_CM_MOVES_QP;
    let server = daemon.guest(test_options(), features);
    let client = daemon.guest(test_options(), features);
    let id = listener_and_routed_id(&server, &client, PORT);
    let (client_qp, client_qpn) = rc_qp(&client);
    let ff = (0xff, 0xff);
    assert_eq!(
        move_qp(&client, id, client_qp, QpState::Init, ff),
        Status::Ok
    );
    assert_eq!(
        qp_state_and_depths(&client, client_qp).0,
        QpState::Init as u32
    );
    assert_eq!(connect(&client, id, client_qp, b"hi"), Status::Ok);

    let conn = expect_cm_event(&server, cm_event::CONNECT_REQUEST).id.get();
    let (server_qp, server_qpn) = rc_qp(&server);
    assert_eq!(accept_moving(&server, conn, server_qp, ff), Status::Ok);

    expect_cm_event(&client, cm_event::CONNECT_RESPONSE);
    assert_eq!(
        move_qp(&client, id, client_qp, QpState::Rtr, (3, 0xff)),
        Status::Ok
    );
    assert_eq!(
        move_qp(&client, id, client_qp, QpState::Rts, (0xff, 2)),
        Status::Ok
    );
    assert_eq!(
        qp_state_and_depths(&client, client_qp),
        (QpState::Rts as u32, (2, 3))
    );
    assert_eq!(accept(&client, id, 0, b""), Status::Ok);
    expect_cm_event(&server, cm_event::ESTABLISHED);
    let w = fake.world();
    for qpn in [client_qpn, server_qpn] {
        assert!(w.connections.iter().any(|c| c.dest_qpn == qpn), "{qpn}");
    }
}

/// A move is the guest's MODIFY_QP with the device's attributes and nothing more: without the
/// feature it is refused, an id or QP the guest does not have is a bad handle, and a step the QP's state
/// does not allow (RTS from RESET) is refused with the QP left where it was.
#[test]
fn a_move_is_refused_where_the_guests_own_modify_would_be() {
    let fake = fake_with_cm();
    let daemon = TestDaemon::new(&fake);
    let server = daemon.guest(test_options(), FEATURES | VRDMA_F_CM_MOVES_QP);
    let client = daemon.guest(test_options(), FEATURES);
    let id = listener_and_routed_id(&server, &client, PORT);
    let (client_qp, _) = rc_qp(&client);
    let ff = (0xff, 0xff);
    assert_eq!(
        move_qp(&client, id, client_qp, QpState::Init, ff),
        Status::Unsupported
    );
    assert_eq!(
        qp_state_and_depths(&client, client_qp).0,
        QpState::Reset as u32
    );

    let own = create_id(&server, cm_port_space::TCP);
    assert_eq!(
        bind(&server, own, &format!("[fe80::1%3]:{}", PORT + 1)),
        Status::Ok
    );
    let (server_qp, _) = rc_qp(&server);
    // Handles the guest does not have: an unknown id, an unknown QP.
    let unknown = 0x7777;
    assert_eq!(
        move_qp(&server, unknown, server_qp, QpState::Init, ff),
        Status::BadHandle
    );
    assert_eq!(
        move_qp(&server, own, unknown, QpState::Init, ff),
        Status::BadHandle
    );
    assert_eq!(
        move_qp(&server, own, server_qp, QpState::Rts, ff),
        Status::BadState
    );
    assert_eq!(
        qp_state_and_depths(&server, server_qp).0,
        QpState::Reset as u32
    );
    assert_eq!(
        move_qp(&server, own, server_qp, QpState::Init, ff),
        Status::Ok
    );
}

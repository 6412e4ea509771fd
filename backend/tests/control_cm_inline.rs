//! CM events carried whole in the event queue (spec §7.5, `VRDMA_F_CM_EVENT_INLINE`): a
//! CM_EVENT notice placed into a large enough event buffer brings the oldest waiting event
//! along, counted as delivered; a short buffer, or a driver that did not accept the
//! feature, gets the bare notice and CM_GET_EVENT the event, as before.

use vrdma_backend::vhost_device::handler::DeviceHandler;
use vrdma_spec::cm::*;
use vrdma_spec::event::{Event, EVENT_SIZE};
use vrdma_spec::features::*;
use vrdma_spec::{EventType, Status};
use vrdma_test_support::fake_host::cm_steps::*;
use vrdma_test_support::fake_host::harness::*;
use zerocopy::FromBytes;

const FEATURES: u64 = VRDMA_F_CM | VRDMA_F_UC | VRDMA_F_RING_RXE_V1;
const PORT: u16 = 7481;
/// The event buffers a driver with the feature posts.
const LARGE: usize = 512;

/// A server and a client of one daemon, the server's driver having accepted `server_features`;
/// the client has sent a connect request with `private_data` to the server's listener.
fn requested(server_features: u64, private_data: &[u8]) -> (TestDaemon, TestGuest, TestGuest) {
    let daemon = TestDaemon::new(&fake_with_cm());
    let server = daemon.guest(test_options(), server_features);
    let client = daemon.guest(test_options(), FEATURES);
    let id = listener_and_routed_id(&server, &client, PORT);
    let (qp, _) = rc_qp(&client);
    assert_eq!(connect(&client, id, qp, private_data), Status::Ok);
    (daemon, server, client)
}

/// The notice and the event a placement into `capacity` bytes wrote, if it carried one.
fn placed(guest: &TestGuest, notice: &[u8], capacity: usize) -> Option<(Event, CmEventResp)> {
    let bytes = guest.dev().expand_event(notice, capacity)?;
    assert_eq!(bytes.len(), CM_EVENT_INLINE_SIZE);
    assert!(bytes.len() <= capacity);
    let header = Event::decode(&bytes[..EVENT_SIZE]).unwrap();
    let body = CmEventResp::read_from_bytes(&bytes[EVENT_SIZE..]).unwrap();
    Some((header, body))
}

#[test]
fn a_connect_request_travels_whole_and_counts_as_delivered_on_its_listener() {
    let (_daemon, server, _client) = requested(FEATURES | VRDMA_F_CM_EVENT_INLINE, b"hello");
    assert_ne!(server.dev().device_features() & VRDMA_F_CM_EVENT_INLINE, 0);
    let notice = next_cm_notice(&server);
    let (header, body) = placed(&server, &notice, LARGE).expect("the event carried whole");
    assert_eq!(body.event.get(), cm_event::CONNECT_REQUEST);
    let listener = body.listen_id.get();
    assert_ne!(listener, 0);
    assert_eq!(&body.private_data[..5], b"hello");
    // The notice names what it carries.
    assert_eq!(header.event_type, EventType::CmEvent);
    assert_eq!(
        (header.handle, header.detail),
        (listener, cm_event::CONNECT_REQUEST)
    );
    // Delivered once: CM_GET_EVENT has nothing more, a second notice carries nothing.
    assert_eq!(get_event(&server).event.get(), CM_EVENT_NONE);
    assert!(server.dev().expand_event(&notice, LARGE).is_none());
    // Counted on the listener, as CM_GET_EVENT counts it (rdma_destroy_id waits for that
    // many acknowledgements); the request's new id is the guest's.
    assert_eq!(destroy_id(&server, body.id.get()), 0);
    assert_eq!(destroy_id(&server, listener), 1);
}

#[test]
fn a_short_buffer_or_a_driver_without_the_feature_gets_the_bare_notice() {
    for (features, capacity) in [
        (FEATURES | VRDMA_F_CM_EVENT_INLINE, CM_EVENT_INLINE_SIZE - 1),
        (FEATURES, LARGE),
    ] {
        let (_daemon, server, _client) = requested(features, b"hi");
        let notice = next_cm_notice(&server);
        assert!(placed(&server, &notice, capacity).is_none());
        // The event waits for CM_GET_EVENT, and counts when that delivers it.
        let event = get_event(&server);
        assert_eq!(event.event.get(), cm_event::CONNECT_REQUEST);
        assert_eq!(destroy_id(&server, event.id.get()), 0);
        assert_eq!(destroy_id(&server, event.listen_id.get()), 1);
    }
}

#[test]
fn a_notice_carries_the_oldest_waiting_event_even_when_an_earlier_notice_was_lost() {
    let (_daemon, server, client) = requested(FEATURES | VRDMA_F_CM_EVENT_INLINE, b"one");
    // The first notice is lost (taken off the queue, never placed); a second request comes.
    let lost = next_cm_notice(&server);
    let id = routed_id(&client, PORT);
    let (qp, _) = rc_qp(&client);
    assert_eq!(connect(&client, id, qp, b"two"), Status::Ok);
    let second = next_cm_notice(&server);
    let (_, first_body) = placed(&server, &second, LARGE).unwrap();
    assert_eq!(&first_body.private_data[..3], b"one");
    // The lost notice's turn: the next event.
    let (_, second_body) = placed(&server, &lost, LARGE).unwrap();
    assert_eq!(&second_body.private_data[..3], b"two");
}

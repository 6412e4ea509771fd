//! The keeper between a scripted front-end and scripted daemons: a daemon lost and another
//! taking over, seen from both sides.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

use vhost::vhost_user::message::{BackendReq, FrontendReq, VhostUserProtocolFeatures};

use super::*;
use crate::mappings::Mapping;
use crate::message::{FLAG_REPLY, FLAG_VERSION};
use crate::resume::{Resume, RESUME};
use crate::setup::tests::{eventfd, request, value_answer, vring_state};

/// Long enough never to end a correct run; a broken one fails instead of hanging.
const STALL: Duration = Duration::from_secs(20);

fn receive(socket: &UnixStream) -> Message {
    socket.set_read_timeout(Some(STALL)).unwrap();
    Message::receive(socket).unwrap().expect("a message")
}

fn expect(socket: &UnixStream, r: FrontendReq) -> Message {
    let message = receive(socket);
    assert_eq!(message.request(), r as u32, "expected {r:?}");
    message
}

fn ack(socket: &UnixStream, request: u32) {
    Message::reply(request, 0).send(socket).unwrap();
}

fn answer(socket: &UnixStream, r: FrontendReq, value: u64) {
    value_answer(r, value).send(socket).unwrap();
}

const FEATURES: u64 = 0b1011;
const PROTOCOL: u64 = VhostUserProtocolFeatures::REPLY_ACK.bits()
    | VhostUserProtocolFeatures::BACKEND_REQ.bits()
    | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS.bits();

/// The daemon's side of a front-end's set-up, as the keeper relays it; returns the daemon's
/// back-end channel.
fn first_daemon_set_up(daemon: &UnixStream) -> UnixStream {
    expect(daemon, FrontendReq::GET_FEATURES);
    answer(daemon, FrontendReq::GET_FEATURES, FEATURES);
    expect(daemon, FrontendReq::SET_OWNER);
    expect(daemon, FrontendReq::GET_PROTOCOL_FEATURES);
    answer(daemon, FrontendReq::GET_PROTOCOL_FEATURES, PROTOCOL);
    expect(daemon, FrontendReq::SET_PROTOCOL_FEATURES);
    let mut channel_request = expect(daemon, FrontendReq::SET_BACKEND_REQ_FD);
    ack(daemon, channel_request.request());
    let channel = UnixStream::from(channel_request.fds.pop().expect("a channel"));
    expect(daemon, FrontendReq::SET_FEATURES);
    let config = expect(daemon, FrontendReq::GET_CONFIG);
    let mut reply = config.payload[..12].to_vec();
    reply.extend([7u8; 8]);
    Message::new(config.request(), FLAG_VERSION | FLAG_REPLY, reply, vec![])
        .send(daemon)
        .unwrap();
    let kick = expect(daemon, FrontendReq::SET_VRING_KICK);
    ack(daemon, kick.request());
    channel
}

/// The front-end's set-up: features, a back-end channel, a configuration read, a vring's kick.
fn front_end_set_up(frontend: &UnixStream, kick: OwnedFd) -> UnixStream {
    let call = |message: Message| {
        message.send(frontend).unwrap();
        receive(frontend)
    };
    let features = call(request(FrontendReq::GET_FEATURES, 0, vec![], vec![]));
    assert_eq!(payload_u64(&features.payload, 0), Some(FEATURES));
    request(FrontendReq::SET_OWNER, 0, vec![], vec![])
        .send(frontend)
        .unwrap();
    call(request(
        FrontendReq::GET_PROTOCOL_FEATURES,
        0,
        vec![],
        vec![],
    ));
    request(
        FrontendReq::SET_PROTOCOL_FEATURES,
        0,
        PROTOCOL.to_le_bytes().to_vec(),
        vec![],
    )
    .send(frontend)
    .unwrap();
    let (ours, theirs) = UnixStream::pair().unwrap();
    call(request(
        FrontendReq::SET_BACKEND_REQ_FD,
        FLAG_NEED_REPLY,
        vec![],
        vec![theirs.into()],
    ));
    request(
        FrontendReq::SET_FEATURES,
        0,
        FEATURES.to_le_bytes().to_vec(),
        vec![],
    )
    .send(frontend)
    .unwrap();
    let config = call(request(
        FrontendReq::GET_CONFIG,
        0,
        [0u32, 8, 0].iter().flat_map(|v| v.to_le_bytes()).collect(),
        vec![],
    ));
    assert_eq!(&config.payload[12..], &[7u8; 8]);
    call(request(
        FrontendReq::SET_VRING_KICK,
        FLAG_NEED_REPLY,
        0u64.to_le_bytes().to_vec(),
        vec![kick],
    ));
    ours
}

#[test]
fn a_lost_daemon_leaves_the_front_end_served_and_the_next_one_takes_over() {
    let dir = std::env::temp_dir().join(format!("vrdma-keeper-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("daemon.sock");
    let _ = std::fs::remove_file(&path);
    let first = UnixListener::bind(&path).unwrap();
    let (frontend, keeper_end) = UnixStream::pair().unwrap();
    let socket = DaemonSocket {
        path: path.clone(),
        retry: Duration::from_millis(5),
        replay_timeout: STALL,
    };
    let keeper = std::thread::spawn(move || serve(keeper_end, &socket));

    let kick = eventfd();
    let mut kick_reader = std::fs::File::from(kick.try_clone().unwrap());
    let daemon_thread = std::thread::spawn(move || {
        let (daemon, _) = first.accept().unwrap();
        let channel = first_daemon_set_up(&daemon);
        // A queue mapping, accepted by the front-end.
        let mut map = Mapping {
            shmid: 0,
            offset: 0x2000,
            len: 0x1000,
        }
        .unmap(true);
        map.header[0..4].copy_from_slice(&(BackendReq::SHMEM_MAP as u32).to_le_bytes());
        map.send(&channel).unwrap();
        let answer = receive(&channel);
        assert_eq!(payload_u64(&answer.payload, 0), Some(0));
        // Then the daemon dies, with a request of the front-end unanswered.
        expect(&daemon, FrontendReq::GET_FEATURES);
    });
    let frontend_channel = front_end_set_up(&frontend, kick);
    let map = receive(&frontend_channel);
    assert_eq!(map.request(), BackendReq::SHMEM_MAP as u32);
    Message::reply(map.request(), 0)
        .send(&frontend_channel)
        .unwrap();
    // The request the daemon dies with is answered by the keeper.
    request(FrontendReq::GET_FEATURES, 0, vec![], vec![])
        .send(&frontend)
        .unwrap();
    daemon_thread.join().unwrap();
    let features = receive(&frontend);
    assert_eq!(payload_u64(&features.payload, 0), Some(FEATURES));

    // The dead daemon's mapping is removed, its answer taken by the keeper.
    let unmap = receive(&frontend_channel);
    assert_eq!(unmap.request(), BackendReq::SHMEM_UNMAP as u32);
    assert!(wants_reply(&unmap));
    assert_eq!(
        &unmap.payload[16..32],
        &[0x2000u64.to_le_bytes(), 0x1000u64.to_le_bytes()].concat()[..]
    );
    Message::reply(unmap.request(), 0)
        .send(&frontend_channel)
        .unwrap();

    // Without a daemon: configuration reads and acknowledgements still answered.
    let config = request(
        FrontendReq::GET_CONFIG,
        0,
        [0u32, 8, 0].iter().flat_map(|v| v.to_le_bytes()).collect(),
        vec![],
    );
    config.send(&frontend).unwrap();
    assert_eq!(&receive(&frontend).payload[12..], &[7u8; 8]);
    request(
        FrontendReq::SET_VRING_ENABLE,
        FLAG_NEED_REPLY,
        vring_state(0, 1),
        vec![],
    )
    .send(&frontend)
    .unwrap();
    assert_eq!(payload_u64(&receive(&frontend).payload, 0), Some(0));

    // The next daemon is given the set-up, told it resumes, and its vring is kicked.
    std::fs::remove_file(&path).unwrap();
    let second = UnixListener::bind(&path).unwrap();
    let (daemon, _) = second.accept().unwrap();
    let features = expect(&daemon, FrontendReq::GET_FEATURES);
    assert!(features.payload.is_empty());
    answer(&daemon, FrontendReq::GET_FEATURES, FEATURES | 0b10000);
    expect(&daemon, FrontendReq::SET_OWNER);
    expect(&daemon, FrontendReq::GET_PROTOCOL_FEATURES);
    answer(&daemon, FrontendReq::GET_PROTOCOL_FEATURES, PROTOCOL);
    let set = expect(&daemon, FrontendReq::SET_PROTOCOL_FEATURES);
    assert_eq!(payload_u64(&set.payload, 0), Some(PROTOCOL));
    let resume = receive(&daemon);
    assert_eq!(resume.request(), RESUME);
    assert_eq!(
        Resume::parse(&resume.payload),
        Some(Resume {
            losses: 1,
            last_config: vec![7; 8]
        })
    );
    ack(&daemon, RESUME);
    let mut channel_request = expect(&daemon, FrontendReq::SET_BACKEND_REQ_FD);
    ack(&daemon, channel_request.request());
    let channel = UnixStream::from(channel_request.fds.pop().unwrap());
    expect(&daemon, FrontendReq::SET_FEATURES);
    let kick = expect(&daemon, FrontendReq::SET_VRING_KICK);
    assert_eq!(kick.fds.len(), 1);
    ack(&daemon, kick.request());
    let enable = expect(&daemon, FrontendReq::SET_VRING_ENABLE);
    ack(&daemon, enable.request());
    let mut kicked = [0u8; 8];
    kick_reader.read_exact(&mut kicked).unwrap();
    assert_eq!(u64::from_ne_bytes(kicked), 1);

    // From now on the new daemon answers, and its back-end requests reach the front-end.
    request(FrontendReq::GET_QUEUE_NUM, 0, vec![], vec![])
        .send(&frontend)
        .unwrap();
    expect(&daemon, FrontendReq::GET_QUEUE_NUM);
    answer(&daemon, FrontendReq::GET_QUEUE_NUM, 3);
    assert_eq!(payload_u64(&receive(&frontend).payload, 0), Some(3));
    Message::new(
        BackendReq::CONFIG_CHANGE_MSG as u32,
        FLAG_VERSION,
        vec![],
        vec![],
    )
    .send(&channel)
    .unwrap();
    assert_eq!(
        receive(&frontend_channel).request(),
        BackendReq::CONFIG_CHANGE_MSG as u32
    );

    // The front-end goes: so does the keeper's connection to the daemon.
    drop(frontend);
    keeper.join().unwrap();
    assert!(Message::receive(&daemon).unwrap().is_none());
    std::fs::remove_dir_all(&dir).unwrap();
}

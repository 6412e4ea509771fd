//! The `vrdma-keeper` binary as an operator runs it: QEMU's socket on one side, a daemon's on
//! the other, the daemon replaced underneath.

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use vhost::vhost_user::message::{FrontendReq, VhostUserProtocolFeatures};
use vrdma_keeper::message::{
    payload_u64, wants_reply, Message, FLAG_NEED_REPLY, FLAG_REPLY, FLAG_VERSION,
};
use vrdma_keeper::resume::{Resume, RESUME};

/// Long enough never to end a correct run; a broken one fails instead of hanging.
const STALL: Duration = Duration::from_secs(20);
const FEATURES: u64 = 0b1011;
const PROTOCOL: u64 = VhostUserProtocolFeatures::REPLY_ACK.bits();

/// The keeper's process, killed when the test ends however it ends.
struct KeeperProcess(Child);

impl Drop for KeeperProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn receive(socket: &UnixStream) -> Message {
    socket.set_read_timeout(Some(STALL)).unwrap();
    Message::receive(socket).unwrap().expect("a message")
}

fn expect(socket: &UnixStream, r: FrontendReq) -> Message {
    let message = receive(socket);
    assert_eq!(message.request(), r as u32, "expected {r:?}");
    message
}

fn send(socket: &UnixStream, r: FrontendReq, flags: u32, payload: Vec<u8>) {
    Message::new(r as u32, FLAG_VERSION | flags, payload, vec![])
        .send(socket)
        .unwrap();
}

fn answer(socket: &UnixStream, r: FrontendReq, value: u64) {
    Message::new(
        r as u32,
        FLAG_VERSION | FLAG_REPLY,
        value.to_le_bytes().to_vec(),
        vec![],
    )
    .send(socket)
    .unwrap();
}

/// Connects to `path` once the keeper listens there.
fn connect(path: &Path, keeper: &mut KeeperProcess) -> UnixStream {
    let deadline = std::time::Instant::now() + STALL;
    loop {
        if let Ok(stream) = UnixStream::connect(path) {
            return stream;
        }
        assert!(
            keeper.0.try_wait().unwrap().is_none(),
            "vrdma-keeper exited"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "vrdma-keeper does not listen"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The daemon's side of the set-up the front-end makes in [`front_end_set_up`].
fn daemon_set_up(daemon: &UnixStream, resumes: Option<Resume>) {
    expect(daemon, FrontendReq::GET_FEATURES);
    answer(daemon, FrontendReq::GET_FEATURES, FEATURES);
    expect(daemon, FrontendReq::SET_OWNER);
    expect(daemon, FrontendReq::GET_PROTOCOL_FEATURES);
    answer(daemon, FrontendReq::GET_PROTOCOL_FEATURES, PROTOCOL);
    let set = expect(daemon, FrontendReq::SET_PROTOCOL_FEATURES);
    assert_eq!(payload_u64(&set.payload, 0), Some(PROTOCOL));
    if let Some(expected) = resumes {
        let resume = receive(daemon);
        assert_eq!(resume.request(), RESUME);
        assert_eq!(Resume::parse(&resume.payload), Some(expected));
        Message::reply(RESUME, 0).send(daemon).unwrap();
    }
    let features = expect(daemon, FrontendReq::SET_FEATURES);
    assert_eq!(payload_u64(&features.payload, 0), Some(FEATURES));
    if wants_reply(&features) {
        Message::reply(features.request(), 0).send(daemon).unwrap();
    }
}

fn front_end_set_up(frontend: &UnixStream) {
    send(frontend, FrontendReq::GET_FEATURES, 0, vec![]);
    assert_eq!(payload_u64(&receive(frontend).payload, 0), Some(FEATURES));
    send(frontend, FrontendReq::SET_OWNER, 0, vec![]);
    send(frontend, FrontendReq::GET_PROTOCOL_FEATURES, 0, vec![]);
    assert_eq!(payload_u64(&receive(frontend).payload, 0), Some(PROTOCOL));
    send(
        frontend,
        FrontendReq::SET_PROTOCOL_FEATURES,
        0,
        PROTOCOL.to_le_bytes().to_vec(),
    );
    send(
        frontend,
        FrontendReq::SET_FEATURES,
        FLAG_NEED_REPLY,
        FEATURES.to_le_bytes().to_vec(),
    );
    assert_eq!(payload_u64(&receive(frontend).payload, 0), Some(0));
}

fn listen(path: &PathBuf) -> UnixListener {
    let _ = std::fs::remove_file(path);
    UnixListener::bind(path).unwrap()
}

#[test]
fn the_keeper_binary_keeps_the_front_end_across_a_daemon_replaced() {
    let dir = std::env::temp_dir().join(format!("vrdma-keeper-binary-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let vm_socket = dir.join("vm.sock");
    let daemon_socket = dir.join("vm.daemon.sock");
    // A stale socket file where the keeper is to listen is replaced.
    std::fs::write(&vm_socket, b"stale").unwrap();
    let first = listen(&daemon_socket);
    let mut keeper = KeeperProcess(
        Command::new(env!("CARGO_BIN_EXE_vrdma-keeper"))
            .arg("--socket")
            .arg(&vm_socket)
            .arg("--backend")
            .arg(&daemon_socket)
            .args(["--retry-ms", "5"])
            .spawn()
            .unwrap(),
    );
    let frontend = connect(&vm_socket, &mut keeper);

    let daemon_thread = std::thread::spawn(move || {
        let (daemon, _) = first.accept().unwrap();
        // The socket is closed before the daemon dies, as a dying daemon's is.
        drop(first);
        daemon_set_up(&daemon, None);
        // Then dies with a request of the front-end unanswered.
        expect(&daemon, FrontendReq::GET_FEATURES);
    });
    front_end_set_up(&frontend);
    send(&frontend, FrontendReq::GET_FEATURES, 0, vec![]);
    daemon_thread.join().unwrap();
    // The keeper answers the request the daemon died with, from what it learned.
    assert_eq!(payload_u64(&receive(&frontend).payload, 0), Some(FEATURES));

    // The next daemon is given the set-up and told that it resumes after one loss.
    let second = listen(&daemon_socket);
    let (daemon, _) = second.accept().unwrap();
    daemon_set_up(
        &daemon,
        Some(Resume {
            losses: 1,
            last_config: vec![],
        }),
    );

    // From now on the new daemon answers the front-end.
    send(&frontend, FrontendReq::GET_QUEUE_NUM, 0, vec![]);
    expect(&daemon, FrontendReq::GET_QUEUE_NUM);
    answer(&daemon, FrontendReq::GET_QUEUE_NUM, 3);
    assert_eq!(payload_u64(&receive(&frontend).payload, 0), Some(3));

    // The front-end goes: so does the keeper's connection to the daemon, and the keeper
    // waits for the next front-end.
    drop(frontend);
    assert!(Message::receive(&daemon).unwrap().is_none());
    let next = connect(&vm_socket, &mut keeper);
    drop(next);
    assert!(
        keeper.0.try_wait().unwrap().is_none(),
        "vrdma-keeper exited"
    );
    drop(keeper);
    std::fs::remove_dir_all(&dir).unwrap();
}

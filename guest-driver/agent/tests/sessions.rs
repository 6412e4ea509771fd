//! The agent between application processes and a vhost-user backend (the small test device
//! of `vrdma_test_support::echo_device`, no RDMA needed): commands, forwarded queue-buffer
//! mappings and events reach the process; each process has a session of its own, released
//! when it goes; the per-user limit and the memory check refuse with their reasons.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use vrdma::transport::agent::AgentTransport;
use vrdma::transport::Transport;
use vrdma_spec::control::{encode_page_list, ControlRequest, ControlResponse, RegMr};
use vrdma_spec::wire::RegMrReq;
use vrdma_spec::{Le32, Le64, Status};
use vrdma_test_support::echo_device::{self, *};
use zerocopy::FromZeros;

/// A running vrdma-guestd in front of `server`, killed when dropped.
struct Agent {
    child: Child,
    socket: PathBuf,
}

impl Agent {
    fn start(server: &Server, name: &str, extra: &[&str]) -> Agent {
        let socket = std::env::temp_dir()
            .join(format!("vrdma-guestd-{}-{name}", std::process::id()))
            .join("agent.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_vrdma-guestd"))
            .arg("--backend")
            .arg(&server.path)
            .arg("--socket")
            .arg(&socket)
            .args(["--guest-ram-mib", "16"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("vrdma-guestd starts");
        let agent = Agent { child, socket };
        wait_until("the agent's socket", || agent.socket.exists());
        agent
    }

    fn connect(&self) -> AgentTransport {
        AgentTransport::connect(&self.socket).expect("the agent serves this process")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(dir) = self.socket.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[test]
fn commands_mappings_and_events_reach_the_process() {
    let server = Server::start("agent-reach");
    let agent = Agent::start(&server, "reach", &[]);
    let process = agent.connect();
    assert!(process.device_config().starts_with(CONFIG));
    assert_eq!(
        echo_device::command(&process, &[ECHO_REVERSED, 1, 2, 3], 256),
        [3, 2, 1]
    );

    // The device maps its pages while it runs the command; the process sees them as soon as
    // the answer is back, at the offset the device chose.
    let offset = 2 * PAGE as u64;
    assert_eq!(
        echo_device::command(&process, &with_offset(MAP_HOST_PAGES, offset), 256),
        [OK]
    );
    let window = process.shared_memory();
    let text = b"written by the host";
    let mapped = window.range(offset as usize, text.len()).expect("mapped");
    // SAFETY: the device's pages, mapped readable by the command just answered.
    let seen = unsafe { std::slice::from_raw_parts(mapped.as_ptr(), text.len()) };
    assert_eq!(seen, text);
    assert_eq!(
        echo_device::command(&process, &with_offset(UNMAP_HOST_PAGES, offset), 256),
        [OK]
    );

    let mut request = vec![EMIT_EVENT];
    request.extend_from_slice(b"an event");
    assert_eq!(echo_device::command(&process, &request, 256), [OK]);
    let mut event = [0u8; 64];
    let got = process.next_event(&mut event, Some(WAIT)).unwrap();
    assert_eq!(got.map(|len| &event[..len]), Some(&b"an event"[..]));
    assert!(process.check_alive().is_ok());
}

#[test]
fn each_process_has_a_session_of_its_own_released_when_it_goes() {
    let server = Server::start("agent-sessions");
    let agent = Agent::start(&server, "sessions", &[]);
    let who = |p: &AgentTransport| {
        let id = echo_device::command(p, &[WHO_AM_I], 256);
        u64::from_le_bytes(id.try_into().unwrap()) as usize
    };
    let (a, b) = (agent.connect(), agent.connect());
    let (id_a, id_b) = (who(&a), who(&b));
    assert_ne!(id_a, id_b);
    drop(a);
    // The agent closes a's session: its device is reset, b's is not.
    wait_until("a's session to end", || {
        server
            .device(id_a)
            .resets
            .load(std::sync::atomic::Ordering::SeqCst)
            > 0
    });
    assert_eq!(
        server
            .device(id_b)
            .resets
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    assert_eq!(
        echo_device::command(&b, &[ECHO_REVERSED, 7, 8], 256),
        [8, 7]
    );
}

#[test]
fn a_user_over_its_limit_is_refused_with_the_reason() {
    let server = Server::start("agent-limit");
    let agent = Agent::start(&server, "limit", &["--max-processes-per-user", "1"]);
    let first = agent.connect();
    let refused = AgentTransport::connect(&agent.socket)
        .map(drop)
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("already has its maximum of 1 processes"),
        "{refused}"
    );
    drop(first);
    // Once the first one's session is over, the user may come again.
    wait_until("the user's place to free up", || {
        AgentTransport::connect(&agent.socket).is_ok()
    });
}

#[test]
fn memory_outside_the_process_ram_is_refused_before_the_device() {
    let server = Server::start("agent-memory");
    let agent = Agent::start(&server, "memory", &[]);
    let process = agent.connect();
    let own = process.guest_ram().guest_base();
    for (gpa, status) in [
        (own, None),
        (own - 4096, Some(Status::BadAddress)),
        (0, Some(Status::BadAddress)),
    ] {
        let mut req = RegMrReq::new_zeroed();
        req.pd = Le32::new(1);
        req.length = Le64::new(4096);
        req.page_shift = Le32::new(12);
        req.npages = Le32::new(1);
        let mut list = Vec::new();
        encode_page_list([gpa], &mut list);
        let request = ControlRequest::RegMr(RegMr::new(req, &list)).to_vec();
        let answer = echo_device::command(&process, &request, 256);
        match status {
            // The test device does not know REG_MR: it answered, so the agent let it through.
            None => assert_eq!(answer, [FAILED], "{gpa:#x}"),
            Some(status) => {
                let decoded = ControlResponse::decode(vrdma_spec::Opcode::RegMr, &answer)
                    .unwrap()
                    .into_result()
                    .unwrap_err();
                assert_eq!(decoded.status(), status, "{gpa:#x}");
            }
        }
    }
}

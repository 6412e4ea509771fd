//! The agent transport against a fake agent on a real socket: what the welcome hands over is
//! usable, a command's mappings are made before its answer returns, events arrive, and an
//! agent that goes away is noticed.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::time::Duration;

use vmm_sys_util::eventfd::EventFd;

use super::protocol::{event_socket_pair, Frame, Outcome, Welcome, PROTOCOL_VERSION};
use super::*;
use crate::dma::{MemfdRam, RamPages, PAGE_SIZE};
use crate::transport::shmem_window::WindowChange;

const RAM_GPA: u64 = 8 << 30;
const RAM_LEN: usize = 16 * PAGE_SIZE;
const SHM_SIZE: u64 = 1 << 20;
const ANSWER: [u8; 8] = [1, 2, 3, 4, 5, 6, 7, 8];

/// A memfd of `pages` pages whose first byte of each page is `fill`.
fn queue_buffer(pages: usize, fill: u8) -> OwnedFd {
    let mut file: std::fs::File = MemfdRam::create_at(pages * PAGE_SIZE, RamPages::Small, 0)
        .unwrap()
        .fd()
        .try_clone_to_owned()
        .unwrap()
        .into();
    for page in 0..pages {
        std::io::Seek::seek(
            &mut file,
            std::io::SeekFrom::Start((page * PAGE_SIZE) as u64),
        )
        .unwrap();
        file.write_all(&[fill]).unwrap();
    }
    file.into()
}

/// A welcome of `ram` at [`RAM_GPA`], `kick` and the process's end of the event socket.
fn welcome(
    ram: &MemfdRam,
    kick: &EventFd,
    events: OwnedFd,
    shared: Option<protocol::SharedDevice>,
) -> Welcome {
    Welcome {
        device_features: 0,
        config: vec![0; 16],
        shm_size: SHM_SIZE,
        ram_gpa: RAM_GPA,
        ram_len: RAM_LEN as u64,
        ram: ram.fd().try_clone_to_owned().unwrap(),
        // SAFETY: the eventfd is open for this call; it is only duplicated.
        doorbell_kick: unsafe { std::os::fd::BorrowedFd::borrow_raw(kick.as_raw_fd()) }
            .try_clone_to_owned()
            .unwrap(),
        events,
        shared,
    }
}

/// The fake agent: welcomes one process, answers one command with [`ANSWER`] and a mapping,
/// sends one event, counts the doorbell kicks it gets, then leaves.
fn fake_agent(listener: UnixListener, kick: EventFd) -> u64 {
    let (socket, _) = listener.accept().unwrap();
    assert!(matches!(
        Frame::receive(&socket).unwrap(),
        Frame::Hello {
            version: PROTOCOL_VERSION
        }
    ));
    let ram = MemfdRam::create_at(RAM_LEN, RamPages::Small, RAM_GPA).unwrap();
    let (events, theirs) = event_socket_pair().unwrap();
    Frame::Welcome(Welcome {
        device_features: 0xabc,
        config: vec![7; 16],
        ..welcome(&ram, &kick, theirs, None)
    })
    .send(&socket)
    .unwrap();
    let Frame::Execute { request, .. } = Frame::receive(&socket).unwrap() else {
        panic!("expected a command");
    };
    assert_eq!(request, b"request");
    Frame::Executed {
        outcome: Outcome::Answered,
        response: ANSWER.to_vec(),
        changes: vec![WindowChange::Map {
            offset: 0x4000,
            len: 2 * PAGE_SIZE as u64,
            fd_offset: 0,
            writable: true,
            fd: queue_buffer(2, 0x5a),
        }],
    }
    .send(&socket)
    .unwrap();
    // SAFETY: sends 16 bytes of a local array on a socket we own.
    let sent = unsafe { libc::send(events.as_raw_fd(), [9u8; 16].as_ptr().cast(), 16, 0) };
    assert_eq!(sent, 16);
    // The process rings twice, then closes its side of the command socket's conversation
    // by asking one more command, which the agent leaves unanswered by going away.
    let _ = Frame::receive(&socket);
    kick.read().unwrap()
}

#[test]
fn a_process_gets_its_device_from_the_agent_and_notices_it_leave() {
    let dir = std::env::temp_dir().join(format!("vrdma-agent-transport-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("agent.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let kick = EventFd::new(0).unwrap();
    let agent = std::thread::spawn(move || fake_agent(listener, kick));

    let transport = AgentTransport::connect(&path).unwrap();
    assert_eq!(transport.device_features(), 0xabc);
    assert_eq!(transport.device_config(), &[7; 16]);
    assert_eq!(transport.guest_ram().guest_base(), RAM_GPA);
    let buffer = transport.dma().alloc(PAGE_SIZE, PAGE_SIZE).unwrap();
    let pages = transport
        .dma()
        .translate(buffer.as_ptr(), PAGE_SIZE)
        .unwrap();
    assert!(pages[0] >= RAM_GPA && pages[0] < RAM_GPA + RAM_LEN as u64);

    let mut response = [0u8; 64];
    assert_eq!(transport.round_trip(b"request", &mut response).unwrap(), 8);
    assert_eq!(response[..8], ANSWER);
    // The mapping came with the answer: both pages of the buffer are there.
    let window = transport.shared_memory();
    assert_eq!(window.len() as u64, SHM_SIZE);
    for page in 0..2 {
        let byte = window.range(0x4000 + page * PAGE_SIZE, 1).unwrap();
        // SAFETY: the page was mapped by `execute`, readable.
        assert_eq!(unsafe { byte.as_ptr().read_volatile() }, 0x5a);
    }

    let mut event = [0u8; 16];
    let got = transport.next_event(&mut event, Some(Duration::from_secs(10)));
    assert_eq!(got.unwrap(), Some(16));
    assert_eq!(event, [9; 16]);
    transport.notify_doorbell().unwrap();
    transport.notify_doorbell().unwrap();
    assert!(transport.check_alive().is_ok());

    // One more command: the agent takes it and goes away without answering.
    let gone = transport.round_trip(b"again", &mut response);
    assert!(
        matches!(gone, Err(TransportError::Disconnected)),
        "{gone:?}"
    );
    assert_eq!(agent.join().unwrap(), 2);
    assert!(matches!(
        transport.check_alive(),
        Err(TransportError::Disconnected)
    ));
    let ended = transport.next_event(&mut event, Some(Duration::from_secs(10)));
    assert!(
        matches!(ended, Err(TransportError::Disconnected)),
        "{ended:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_device_gone_behind_the_agent_is_noticed_without_a_command() {
    let dir = std::env::temp_dir().join(format!("vrdma-agent-gone-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("agent.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let (closed_tx, closed_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let agent = std::thread::spawn(move || {
        let (socket, _) = listener.accept().unwrap();
        let _ = Frame::receive(&socket);
        let ram = MemfdRam::create_at(RAM_LEN, RamPages::Small, RAM_GPA).unwrap();
        let (events, theirs) = event_socket_pair().unwrap();
        let kick = EventFd::new(0).unwrap();
        Frame::Welcome(welcome(&ram, &kick, theirs, None))
            .send(&socket)
            .unwrap();
        // An event pending is not the end; then the agent closes the events (its device
        // went) and keeps the command socket open.
        // SAFETY: sends 16 bytes of a local array on a socket we own.
        unsafe { libc::send(events.as_raw_fd(), [1u8; 16].as_ptr().cast(), 16, 0) };
        closed_rx.recv().unwrap();
        drop(events);
        done_rx.recv().unwrap();
        drop(socket);
    });
    let transport = AgentTransport::connect(&path).unwrap();
    let mut event = [0u8; 16];
    // Wait for the pending event to arrive (a readable socket), then check: still alive.
    let mut pollfd = libc::pollfd {
        fd: transport.event_fd().unwrap().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd on the stack.
    assert_eq!(unsafe { libc::poll(&mut pollfd, 1, 10_000) }, 1);
    assert!(
        transport.check_alive().is_ok(),
        "a pending event is not an end"
    );
    assert_eq!(transport.next_event(&mut event, None).unwrap(), Some(16));
    closed_tx.send(()).unwrap();
    let ended = transport.next_event(&mut event, Some(Duration::from_secs(10)));
    assert!(
        matches!(ended, Err(TransportError::Disconnected)),
        "{ended:?}"
    );
    assert!(matches!(
        transport.check_alive(),
        Err(TransportError::Disconnected)
    ));
    done_tx.send(()).unwrap();
    agent.join().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_refusal_reaches_the_process_with_its_reason() {
    let dir = std::env::temp_dir().join(format!("vrdma-agent-refusal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("agent.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let agent = std::thread::spawn(move || {
        let (socket, _) = listener.accept().unwrap();
        let _ = Frame::receive(&socket);
        Frame::Refused("too many".into()).send(&socket).unwrap();
    });
    let refused = AgentTransport::connect(&path).map(drop).unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("refused this process: too many"),
        "{refused}"
    );
    agent.join().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The fake agent of a shared device: welcomes one process with the queue region and the
/// doorbell area as files (memfds standing in for the BAR and the agent's hugepage), then
/// waits for it to go.
fn fake_shared_agent(listener: UnixListener, region: OwnedFd, area: OwnedFd) {
    let (socket, _) = listener.accept().unwrap();
    assert!(matches!(
        Frame::receive(&socket).unwrap(),
        Frame::Hello { .. }
    ));
    let ram = MemfdRam::create_at(RAM_LEN, RamPages::Small, RAM_GPA).unwrap();
    let (_events, theirs) = event_socket_pair().unwrap();
    let kick = EventFd::new(0).unwrap();
    let shared = protocol::SharedDevice {
        queue_region_offset: 2 * PAGE_SIZE as u64,
        queue_region: region,
        doorbell_area_len: 2 * PAGE_SIZE as u64,
        doorbell_area: area,
    };
    Frame::Welcome(welcome(&ram, &kick, theirs, Some(shared)))
        .send(&socket)
        .unwrap();
    assert!(matches!(
        Frame::receive(&socket),
        Err(ProtocolError::Closed)
    ));
}

#[test]
fn a_process_of_a_shared_device_maps_the_whole_queue_region_and_the_registered_doorbells() {
    let dir = std::env::temp_dir().join(format!("vrdma-agent-shared-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("agent.sock");
    let listener = UnixListener::bind(&path).unwrap();
    // The "BAR": the region starts two pages in; its first page is marked.
    let bar = MemfdRam::create_at(SHM_SIZE as usize + 2 * PAGE_SIZE, RamPages::Small, 0).unwrap();
    // SAFETY: the first byte of the region's first page, inside the memfd's mapping.
    unsafe { bar.host_base().add(2 * PAGE_SIZE).write(0x42) };
    let area = MemfdRam::create_at(2 * PAGE_SIZE, RamPages::Small, 0).unwrap();
    let (region_fd, area_fd) = (
        bar.fd().try_clone_to_owned().unwrap(),
        area.fd().try_clone_to_owned().unwrap(),
    );
    let agent = std::thread::spawn(move || fake_shared_agent(listener, region_fd, area_fd));

    let transport = AgentTransport::connect(&path).unwrap();
    let region = transport.shared_memory();
    assert_eq!(region.len() as u64, SHM_SIZE);
    let base = region.base().expect("mapped");
    // SAFETY: inside the mapped region.
    assert_eq!(unsafe { base.as_ptr().read_volatile() }, 0x42);
    // SAFETY: the last byte of the mapped region; the agent's file sees it.
    unsafe {
        base.as_ptr()
            .add(SHM_SIZE as usize - 1)
            .write_volatile(0x17)
    };
    // SAFETY: the same byte through the file's other mapping.
    let seen = unsafe {
        bar.host_base()
            .add(2 * PAGE_SIZE + SHM_SIZE as usize - 1)
            .read_volatile()
    };
    assert_eq!(seen, 0x17);
    let (doorbells, len) = transport
        .registered_doorbell_area()
        .expect("the agent's doorbell area");
    assert_eq!(len, 2 * PAGE_SIZE);
    // SAFETY: the first word of the mapped area; the agent's file sees it.
    unsafe { doorbells.as_ptr().write_volatile(0x99) };
    // SAFETY: the same byte through the file's other mapping.
    let seen = unsafe { area.host_base().read_volatile() };
    assert_eq!(seen, 0x99);
    drop(transport);
    agent.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

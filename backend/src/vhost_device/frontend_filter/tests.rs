//! The relay's rules on socket pairs: what passes, what is absorbed, and how it ends.

use super::*;
use crate::vhost_device::message::{header_word, MAX_PAYLOAD};
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::FileTypeExt;

fn message(request: u32, flags: u32, payload: Vec<u8>, fds: Vec<OwnedFd>) -> Message {
    let mut header = [0u8; HEADER_SIZE];
    header[0..4].copy_from_slice(&request.to_le_bytes());
    header[4..8].copy_from_slice(&(FLAG_VERSION | flags).to_le_bytes());
    header[8..12].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    Message {
        header,
        payload,
        fds,
    }
}

fn single(gpa: u64, size: u64) -> Vec<u8> {
    [0, gpa, size, 0x7f00_0000_0000, 0]
        .iter()
        .flat_map(|v: &u64| v.to_le_bytes())
        .collect()
}

fn memfd() -> OwnedFd {
    let file = tempfile();
    file.into()
}

fn tempfile() -> File {
    let path = std::env::temp_dir().join(format!(
        "vrdma-filter-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    file
}

/// "Device mappings" in these tests are descriptors of character devices (/dev/null).
fn char_device_test() -> DeviceMappingTest {
    Arc::new(|file: &File| {
        file.metadata()
            .is_ok_and(|m| m.file_type().is_char_device())
    })
}

fn device_fd() -> OwnedFd {
    File::open("/dev/null").unwrap().into()
}

struct Harness {
    frontend: UnixStream,
    daemon: UnixStream,
    threads: FilterThreads,
}

fn harness() -> Harness {
    harness_telling(Arc::new(|_| {}))
}

fn harness_telling(on_protocol_features: ProtocolFeaturesHook) -> Harness {
    harness_with(on_protocol_features, Arc::new(|_| {}))
}

fn harness_with(on_protocol_features: ProtocolFeaturesHook, on_resume: ResumeHook) -> Harness {
    let (frontend, frontend_far) = UnixStream::pair().unwrap();
    let (daemon, daemon_far) = UnixStream::pair().unwrap();
    let threads = start(
        frontend_far,
        daemon_far,
        FilterHooks {
            is_device_mapping: char_device_test(),
            on_protocol_features,
            on_backend_channel: Arc::new(|_, _| {}),
            on_resume,
        },
    )
    .unwrap();
    Harness {
        frontend,
        daemon,
        threads,
    }
}

#[test]
fn acknowledged_protocol_features_are_told_and_passed_on() {
    let told = Arc::new(Mutex::new(Vec::new()));
    let seen = told.clone();
    let h = harness_telling(Arc::new(move |features| seen.lock().push(features)));
    let acked: u64 = 1 << 15 | 1 << 3;
    message(
        SET_PROTOCOL_FEATURES,
        0,
        acked.to_le_bytes().to_vec(),
        vec![],
    )
    .send(&h.frontend)
    .unwrap();
    let got = Message::receive(&h.daemon).unwrap().unwrap();
    assert_eq!(got.request(), SET_PROTOCOL_FEATURES);
    assert_eq!(got.payload, acked.to_le_bytes());
    assert_eq!(*told.lock(), [acked]);
}

#[test]
fn guest_ram_passes_and_device_mappings_are_refused_here() {
    let h = harness();
    // Guest RAM: forwarded with its descriptor.
    message(
        ADD_MEM_REG,
        FLAG_NEED_REPLY,
        single(0, 1 << 20),
        vec![memfd()],
    )
    .send(&h.frontend)
    .unwrap();
    let got = Message::receive(&h.daemon).unwrap().unwrap();
    assert_eq!(got.request(), ADD_MEM_REG);
    assert_eq!(got.fds.len(), 1);
    assert_eq!(single_region(&got.payload), Some((0, 1 << 20)));

    // A device mapping: refused by the filter (so that QEMU does not record it), never
    // seen by the daemon.
    message(
        ADD_MEM_REG,
        FLAG_NEED_REPLY,
        single(0xf800_0000, 0x1000),
        vec![device_fd()],
    )
    .send(&h.frontend)
    .unwrap();
    let refusal = Message::receive(&h.frontend).unwrap().unwrap();
    assert_eq!(refusal.request(), ADD_MEM_REG);
    assert_eq!(refusal.flags(), FLAG_VERSION | FLAG_REPLY);
    assert_eq!(refusal.payload, 1u64.to_le_bytes());

    // A removal of guest RAM goes through.
    message(REM_MEM_REG, 0, single(0, 1 << 20), vec![])
        .send(&h.frontend)
        .unwrap();
    let got = Message::receive(&h.daemon).unwrap().unwrap();
    assert_eq!(got.request(), REM_MEM_REG);

    // Replies of the daemon reach the front-end unchanged.
    Message::ack(REM_MEM_REG).send(&h.daemon).unwrap();
    let reply = Message::receive(&h.frontend).unwrap().unwrap();
    assert_eq!(reply.request(), REM_MEM_REG);

    // Without NEED_REPLY, nothing is answered: the next thing the front-end reads is the
    // daemon's reply to a later message. The mapping is remembered, and its removal is
    // answered here too.
    message(
        ADD_MEM_REG,
        0,
        single(0xf900_0000, 0x1000),
        vec![device_fd()],
    )
    .send(&h.frontend)
    .unwrap();
    message(
        REM_MEM_REG,
        FLAG_NEED_REPLY,
        single(0xf900_0000, 0x1000),
        vec![],
    )
    .send(&h.frontend)
    .unwrap();
    let ack = Message::receive(&h.frontend).unwrap().unwrap();
    assert_eq!(ack.request(), REM_MEM_REG);
    assert_eq!(ack.payload, 0u64.to_le_bytes());
    message(1, FLAG_NEED_REPLY, vec![], vec![])
        .send(&h.frontend)
        .unwrap();
    assert_eq!(Message::receive(&h.daemon).unwrap().unwrap().request(), 1);
    Message::ack(1).send(&h.daemon).unwrap();
    assert_eq!(Message::receive(&h.frontend).unwrap().unwrap().request(), 1);

    drop(h.frontend);
    assert!(Message::receive(&h.daemon).unwrap().is_none());
    h.threads.join();
}

#[test]
fn a_whole_memory_table_loses_only_the_device_mappings() {
    let h = harness();
    let mut payload = Vec::new();
    payload.extend_from_slice(&3u32.to_le_bytes());
    payload.extend_from_slice(&0u32.to_le_bytes());
    for (gpa, size) in [
        (0u64, 1u64 << 30),
        (0xf800_0000, 0x2000),
        (1 << 32, 1 << 30),
    ] {
        for v in [gpa, size, 0x7f00_0000_0000, 0] {
            payload.extend_from_slice(&v.to_le_bytes());
        }
    }
    message(
        SET_MEM_TABLE,
        0,
        payload,
        vec![memfd(), device_fd(), memfd()],
    )
    .send(&h.frontend)
    .unwrap();
    let got = Message::receive(&h.daemon).unwrap().unwrap();
    assert_eq!(got.request(), SET_MEM_TABLE);
    assert_eq!(got.fds.len(), 2);
    assert_eq!(header_word(&got.header, 8) as usize, got.payload.len());
    assert_eq!(got.payload.len(), TABLE_HEADER_SIZE + 2 * TABLE_REGION_SIZE);
    assert_eq!(&got.payload[0..4], &2u32.to_le_bytes());
    assert_eq!(payload_u64(&got.payload, 8), Some(0));
    assert_eq!(payload_u64(&got.payload, 8 + 32), Some(1 << 32));
    for fd in &got.fds {
        assert!(!File::from(fd.as_fd().try_clone_to_owned().unwrap())
            .metadata()
            .unwrap()
            .file_type()
            .is_char_device());
    }
    // The absorbed region of the table is answered on removal.
    message(
        REM_MEM_REG,
        FLAG_NEED_REPLY,
        single(0xf800_0000, 0x2000),
        vec![],
    )
    .send(&h.frontend)
    .unwrap();
    assert_eq!(
        Message::receive(&h.frontend).unwrap().unwrap().request(),
        REM_MEM_REG
    );
    drop(h.daemon);
    assert!(Message::receive(&h.frontend).unwrap().is_none());
    h.threads.join();
}

#[test]
fn oversized_or_truncated_messages_end_the_relay_without_panicking() {
    let h = harness();
    let mut header = [0u8; HEADER_SIZE];
    header[8..12].copy_from_slice(&(MAX_PAYLOAD as u32 + 1).to_le_bytes());
    let mut frontend = &h.frontend;
    frontend.write_all(&header).unwrap();
    assert!(Message::receive(&h.daemon).unwrap().is_none());
    h.threads.join();

    let h = harness();
    let mut frontend = &h.frontend;
    frontend.write_all(&[1, 0, 0]).unwrap();
    drop(h.frontend);
    assert!(Message::receive(&h.daemon).unwrap().is_none());
    h.threads.join();
}

/// VHOST_USER_GET_FEATURES: a message the filter passes untouched.
const GET_FEATURES: u32 = 1;

extern "C" fn ignore_signal(_: libc::c_int) {}

/// The relay threads of this process (of any test), and whether each is blocked in
/// `recvmsg` right now.
fn relay_threads() -> Vec<(libc::pid_t, bool)> {
    let mut threads = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("vrdma-vu-") {
            continue;
        }
        let syscall = std::fs::read_to_string(task.path().join("syscall")).unwrap_or_default();
        let number = syscall
            .split(' ')
            .next()
            .and_then(|n| n.parse::<i64>().ok());
        let tid = task.file_name().to_string_lossy().parse().unwrap();
        threads.push((tid, number == Some(libc::SYS_recvmsg)));
    }
    threads
}

/// A signal whose handler does not ask for restarted calls interrupts the relay while it waits
/// for the next message: it goes on relaying (it used to end the connection, as libFuzzer's
/// periodic SIGALRM showed).
#[test]
fn a_signal_does_not_end_the_relay() {
    // SAFETY: a handler that does nothing, installed without SA_RESTART so that blocking
    // socket calls fail with EINTR; no other test uses SIGUSR2.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = ignore_signal as extern "C" fn(libc::c_int) as usize;
        assert_eq!(
            libc::sigaction(libc::SIGUSR2, &action, std::ptr::null_mut()),
            0
        );
    }
    // This harness's relay threads are the ones that were not there before it (threads of
    // tests running beside it that start meanwhile are signalled too: harmless).
    let before: Vec<libc::pid_t> = relay_threads().iter().map(|&(tid, _)| tid).collect();
    let h = harness();
    // Both wait in recvmsg (they block there until a message comes).
    let ours = loop {
        let ours: Vec<(libc::pid_t, bool)> = relay_threads()
            .into_iter()
            .filter(|(tid, _)| !before.contains(tid))
            .collect();
        if ours.len() >= 2 && ours.iter().all(|&(_, waiting)| waiting) {
            break ours;
        }
        std::thread::yield_now();
    };
    for (tid, _) in ours {
        // SAFETY: signals a thread of this process; the handler above does nothing.
        unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGUSR2) };
    }
    message(GET_FEATURES, 0, Vec::new(), Vec::new())
        .send(&h.frontend)
        .unwrap();
    let forwarded = Message::receive(&h.daemon)
        .unwrap()
        .expect("the relay still runs");
    assert_eq!(forwarded.request(), GET_FEATURES);
    forwarded.send(&h.daemon).unwrap();
    let reply = Message::receive(&h.frontend)
        .unwrap()
        .expect("the reply relay still runs");
    assert_eq!(reply.request(), GET_FEATURES);
}

#[test]
fn the_keepers_resume_is_answered_and_told_never_passed_on() {
    let told = Arc::new(Mutex::new(Vec::new()));
    let seen = told.clone();
    let harness = harness_with(
        Arc::new(|_| {}),
        Arc::new(move |resume| seen.lock().push(resume)),
    );
    let resume = vrdma_keeper::resume::Resume {
        losses: 2,
        last_config: vec![9; 4],
    };
    resume.to_message().send(&harness.frontend).unwrap();
    let ack = Message::receive(&harness.frontend).unwrap().unwrap();
    assert_eq!(ack.request(), vrdma_keeper::resume::RESUME);
    assert_eq!(payload_u64(&ack.payload, 0), Some(0));
    assert_eq!(*told.lock(), vec![resume]);
    // Too short to read: answered, not told.
    Message::new(
        vrdma_keeper::resume::RESUME,
        FLAG_VERSION | FLAG_NEED_REPLY,
        vec![1],
        vec![],
    )
    .send(&harness.frontend)
    .unwrap();
    assert!(Message::receive(&harness.frontend).unwrap().is_some());
    assert_eq!(told.lock().len(), 1);
    // Nothing reached the daemon.
    harness.daemon.set_nonblocking(true).unwrap();
    assert!(Message::receive(&harness.daemon).is_err());
}

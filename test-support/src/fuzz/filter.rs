//! Message streams through the vhost-user frontend filter (`vrdma_backend::vhost_device::frontend_filter`),
//! the relay between QEMU and the daemon that keeps the device's own mappings out of the guest
//! memory table.
//!
//! [`run_filter_sequence`] decodes its input into vhost-user messages (memory-table requests
//! with guest-RAM and device descriptors, matching and stray removals, other requests, now
//! and then a malformed one or a garbage tail), sends them through a running filter, and
//! compares what reaches the daemon and what is answered to the front-end with a model of the
//! filter's rules: the device's own regions never reach the daemon in a well-formed memory
//! table, everything else passes unchanged and in order, and every request that asked for an
//! answer the filter gave gets exactly one.

use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use vmm_sys_util::sock_ctrl_msg::ScmSocket;
use vrdma_backend::vhost_device::frontend_filter::{self, DeviceMappingTest, FilterHooks};

use super::bytes::ByteReader;
use crate::fake_host::device::memfd;

const SET_MEM_TABLE: u32 = 5;
const SET_PROTOCOL_FEATURES: u32 = 16;
const SET_BACKEND_REQ_FD: u32 = 21;
/// `VHOST_USER_PROTOCOL_F_BACKEND_REQ`.
const PROTOCOL_F_BACKEND_REQ: u64 = 1 << 5;
const ADD_MEM_REG: u32 = 37;
const REM_MEM_REG: u32 = 38;
const FLAG_VERSION: u32 = 0x1;
const FLAG_REPLY: u32 = 0x4;
const FLAG_NEED_REPLY: u32 = 0x8;
const HEADER: usize = 12;
/// Messages one input sends at most.
pub const MAX_MESSAGES: usize = 24;

/// What a descriptor attached to a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fd {
    /// Guest RAM (a memfd).
    Ram,
    /// One of the device's own mappings (a character device, as a uverbs fd is).
    Device,
}

/// One message as sent or as received.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Message {
    header: [u8; HEADER],
    payload: Vec<u8>,
    fds: Vec<Fd>,
}

impl Message {
    fn new(request: u32, flags: u32, payload: Vec<u8>, fds: Vec<Fd>) -> Message {
        let mut header = [0u8; HEADER];
        header[0..4].copy_from_slice(&request.to_le_bytes());
        header[4..8].copy_from_slice(&flags.to_le_bytes());
        header[8..12].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        Message {
            header,
            payload,
            fds,
        }
    }

    fn word(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.header[at..at + 4].try_into().unwrap())
    }

    fn wants_reply(&self) -> bool {
        self.word(4) & FLAG_NEED_REPLY != 0
    }

    /// The filter's REPLY_ACK answer to `request`.
    fn reply(request: u32, status: u64) -> Message {
        Message::new(
            request,
            FLAG_VERSION | FLAG_REPLY,
            status.to_le_bytes().to_vec(),
            Vec::new(),
        )
    }
}

fn u64_at(payload: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        payload.get(at..at + 8)?.try_into().ok()?,
    ))
}

/// A guest address and size from a small set, so that removals often match additions.
fn region(r: &mut ByteReader<'_>) -> (u64, u64) {
    if r.chance(90) {
        (
            u64::from(r.below(4)) << 30,
            r.pick(&[0x1000, 0x2000, 1 << 30]),
        )
    } else {
        (r.u64(), r.u64())
    }
}

fn single_region(r: &mut ByteReader<'_>) -> Vec<u8> {
    let (gpa, size) = region(r);
    let mut payload: Vec<u8> = [0, gpa, size, 0x7f00_0000_0000, 0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    if r.chance(10) {
        payload.truncate(r.below(40) as usize);
    }
    payload
}

fn fds(r: &mut ByteReader<'_>, n: usize) -> Vec<Fd> {
    (0..n)
        .map(|_| if r.chance(50) { Fd::Ram } else { Fd::Device })
        .collect()
}

/// One message from the input.
fn message(r: &mut ByteReader<'_>) -> Message {
    let mut flags = FLAG_VERSION;
    if r.chance(50) {
        flags |= FLAG_NEED_REPLY;
    }
    if r.chance(5) {
        flags = r.u32();
    }
    match r.below(10) {
        0..=2 => {
            let n = if r.chance(90) { 1 } else { r.below(4) as usize };
            let payload = single_region(r);
            Message::new(ADD_MEM_REG, flags, payload, fds(r, n))
        }
        3..=4 => {
            let n = if r.chance(90) { 0 } else { 1 };
            let payload = single_region(r);
            Message::new(REM_MEM_REG, flags, payload, fds(r, n))
        }
        5 => {
            let count = r.below(9);
            let mut payload = Vec::new();
            let claimed = if r.chance(90) { count } else { r.u32() % 12 };
            payload.extend_from_slice(&claimed.to_le_bytes());
            payload.extend_from_slice(&r.u32().to_le_bytes());
            for _ in 0..count {
                let (gpa, size) = region(r);
                for v in [gpa, size, 0x7f00_0000_0000, r.u64() & 0xffff_f000] {
                    payload.extend_from_slice(&v.to_le_bytes());
                }
            }
            if r.chance(10) {
                payload.truncate(r.below(payload.len() as u32 + 1) as usize);
            }
            if r.chance(5) {
                payload.extend(r.bytes(16));
            }
            let n = if r.chance(90) {
                count as usize
            } else {
                r.below(10) as usize
            };
            Message::new(SET_MEM_TABLE, flags, payload, fds(r, n))
        }
        6 => {
            let mut features = r.u64();
            if r.chance(70) {
                features |= PROTOCOL_F_BACKEND_REQ;
            }
            let mut payload = features.to_le_bytes().to_vec();
            if r.chance(10) {
                payload.truncate(r.below(8) as usize);
            }
            Message::new(SET_PROTOCOL_FEATURES, flags, payload, Vec::new())
        }
        7 => {
            let n = if r.chance(80) { 1 } else { r.below(3) as usize };
            let payload = r.bytes(8);
            Message::new(SET_BACKEND_REQ_FD, flags, payload, fds(r, n))
        }
        _ => {
            let request = r.below(45);
            let payload = r.bytes(64);
            let n = if r.chance(80) { 0 } else { r.below(3) as usize };
            Message::new(request, flags, payload, fds(r, n))
        }
    }
}

/// The model of the filter: what reaches the daemon, and what the front-end is answered.
#[derive(Default)]
struct Model {
    absorbed: HashSet<(u64, u64)>,
    /// Features of the last well-formed SET_PROTOCOL_FEATURES.
    acked_protocol_features: u64,
    /// Back-end request channels handed to the device: (descriptor kind, features then).
    channels: Vec<(Fd, u64)>,
    to_daemon: Vec<Message>,
    to_frontend: Vec<Message>,
}

impl Model {
    fn judge(&mut self, m: &Message) {
        let request = m.word(0);
        let single = || {
            Some((u64_at(&m.payload, 8)?, u64_at(&m.payload, 16)?))
                .filter(|_| m.payload.len() >= 40)
        };
        match request {
            ADD_MEM_REG if single().is_some() && m.fds == [Fd::Device] => {
                if m.wants_reply() {
                    self.to_frontend.push(Message::reply(request, 1));
                } else {
                    self.absorbed.insert(single().unwrap());
                }
            }
            REM_MEM_REG if single().is_some_and(|region| self.absorbed.remove(&region)) => {
                if m.wants_reply() {
                    self.to_frontend.push(Message::reply(request, 0));
                }
            }
            SET_MEM_TABLE if m.payload.len() >= 4 => {
                let count = u32::from_le_bytes(m.payload[0..4].try_into().unwrap()) as usize;
                let needed = 8 + count * 32;
                if count != m.fds.len() || m.payload.len() < needed {
                    self.to_daemon.push(m.clone());
                    return;
                }
                self.absorbed.clear();
                let mut regions = Vec::new();
                let mut fds = Vec::new();
                for (i, &fd) in m.fds.iter().enumerate() {
                    let region = &m.payload[8 + 32 * i..8 + 32 * (i + 1)];
                    if fd == Fd::Device {
                        self.absorbed
                            .insert((u64_at(region, 0).unwrap(), u64_at(region, 8).unwrap()));
                    } else {
                        regions.extend_from_slice(region);
                        fds.push(fd);
                    }
                }
                let mut payload = (fds.len() as u32).to_le_bytes().to_vec();
                payload.extend_from_slice(&m.payload[4..8]);
                payload.extend_from_slice(&regions);
                let mut forwarded = Message::new(request, m.word(4), payload, fds);
                forwarded.header[0..8].copy_from_slice(&m.header[0..8]);
                self.to_daemon.push(forwarded);
            }
            SET_PROTOCOL_FEATURES => {
                if let Some(features) = u64_at(&m.payload, 0) {
                    self.acked_protocol_features = features;
                }
                self.to_daemon.push(m.clone());
            }
            SET_BACKEND_REQ_FD
                if m.fds.len() == 1
                    && self.acked_protocol_features & PROTOCOL_F_BACKEND_REQ != 0 =>
            {
                self.channels.push((m.fds[0], self.acked_protocol_features));
                if m.wants_reply() {
                    self.to_frontend.push(Message::reply(request, 0));
                }
            }
            _ => self.to_daemon.push(m.clone()),
        }
    }
}

/// The descriptors a message carries, opened from the two files of a run.
struct Files {
    ram: File,
    device: File,
}

impl Files {
    fn raw(&self, fd: Fd) -> RawFd {
        match fd {
            Fd::Ram => self.ram.as_raw_fd(),
            Fd::Device => self.device.as_raw_fd(),
        }
    }
}

fn send(socket: &UnixStream, files: &Files, m: &Message) {
    let mut bytes = m.header.to_vec();
    bytes.extend_from_slice(&m.payload);
    let fds: Vec<RawFd> = m.fds.iter().map(|&fd| files.raw(fd)).collect();
    // libFuzzer's SIGALRM interrupts blocking calls of any thread (no SA_RESTART).
    let sent = loop {
        match socket.send_with_fds(&[bytes.as_slice()], &fds) {
            Err(e) if e.errno() == libc::EINTR => continue,
            sent => break sent.expect("sendmsg to the filter"),
        }
    };
    let mut writer = socket;
    writer
        .write_all(&bytes[sent..])
        .expect("write to the filter");
}

fn classify(fd: OwnedFd) -> Fd {
    let file = File::from(fd);
    match file.metadata() {
        Ok(m) if m.file_type().is_char_device() => Fd::Device,
        _ => Fd::Ram,
    }
}

/// Reads messages until the peer closes.
fn receive_all(socket: &UnixStream) -> Vec<Message> {
    let mut messages = Vec::new();
    loop {
        let mut header = [0u8; HEADER];
        let mut raw = [-1 as RawFd; 64];
        let mut iov = [libc::iovec {
            iov_base: header.as_mut_ptr().cast(),
            iov_len: HEADER,
        }];
        // SAFETY: the iovec points at `header`, which outlives the call and takes any bytes.
        let (read, count) = match unsafe { socket.recv_with_fds(&mut iov, &mut raw) } {
            Ok(got) => got,
            // A signal (libFuzzer's periodic SIGALRM, without SA_RESTART) is not the end of
            // the stream: an early return here once lost every message still to come.
            Err(e) if e.errno() == libc::EINTR => continue,
            Err(_) => return messages,
        };
        // SAFETY: recvmsg just installed these descriptors in this process; nobody owns them.
        let fds: Vec<Fd> = raw[..count]
            .iter()
            .map(|&fd| classify(unsafe { OwnedFd::from_raw_fd(fd) }))
            .collect();
        let mut reader = socket;
        if read == 0 || reader.read_exact(&mut header[read..]).is_err() {
            return messages;
        }
        let size = u32::from_le_bytes(header[8..12].try_into().unwrap()) as usize;
        let mut payload = vec![0u8; size];
        if reader.read_exact(&mut payload).is_err() {
            return messages;
        }
        messages.push(Message {
            header,
            payload,
            fds,
        });
    }
}

/// Sends the messages `data` encodes through a filter; panics when what came out differs from
/// the model or a device descriptor reached the daemon in a well-formed memory-table request.
pub fn run_filter_sequence(data: &[u8]) {
    let mut r = ByteReader::new(data);
    let (frontend, frontend_far) = UnixStream::pair().expect("socketpair");
    let (daemon, daemon_far) = UnixStream::pair().expect("socketpair");
    let is_device: DeviceMappingTest = Arc::new(|file: &File| {
        file.metadata()
            .is_ok_and(|m| m.file_type().is_char_device())
    });
    let channels = Arc::new(Mutex::new(Vec::new()));
    let handed = channels.clone();
    let threads = frontend_filter::start(
        frontend_far,
        daemon_far,
        FilterHooks {
            is_device_mapping: is_device.clone(),
            on_protocol_features: Arc::new(|_| {}),
            on_backend_channel: Arc::new(move |socket, acked| {
                let kind = if is_device(&File::from(OwnedFd::from(socket))) {
                    Fd::Device
                } else {
                    Fd::Ram
                };
                handed.lock().expect("channels").push((kind, acked));
            }),
            // Requests are drawn below 45: the keeper's RESUME never comes.
            on_resume: Arc::new(|_| {}),
        },
    )
    .expect("filter");
    let files = Files {
        ram: memfd(4096),
        device: File::open("/dev/null").expect("/dev/null"),
    };
    let mut model = Model::default();
    let mut garbage = false;
    for _ in 0..MAX_MESSAGES {
        if r.is_empty() {
            break;
        }
        if r.chance(2) {
            // Bytes that are not a message: from here on only the safety rules are checked.
            let mut writer = &frontend;
            writer.write_all(&r.bytes(40)).expect("write");
            garbage = true;
            break;
        }
        let m = message(&mut r);
        model.judge(&m);
        send(&frontend, &files, &m);
    }
    frontend.shutdown(Shutdown::Write).expect("shutdown");
    let to_daemon = receive_all(&daemon);
    drop(daemon);
    let to_frontend = receive_all(&frontend);
    threads.join();

    for m in &to_daemon {
        check_no_device_region(m);
    }
    if garbage {
        assert!(to_daemon.len() >= model.to_daemon.len());
        assert_eq!(to_daemon[..model.to_daemon.len()], model.to_daemon[..]);
        assert_eq!(to_frontend, model.to_frontend);
    } else {
        assert_eq!(to_daemon, model.to_daemon, "messages reaching the daemon");
        assert_eq!(to_frontend, model.to_frontend, "answers to the front-end");
        assert_eq!(
            *channels.lock().expect("channels"),
            model.channels,
            "back-end channels handed to the device"
        );
    }
}

/// A well-formed memory-table request that reached the daemon carries no device descriptor.
fn check_no_device_region(m: &Message) {
    let request = m.word(0);
    let well_formed = match request {
        ADD_MEM_REG => m.payload.len() >= 40 && m.fds.len() == 1,
        SET_MEM_TABLE => {
            m.payload.len() >= 8 && {
                let count = u32::from_le_bytes(m.payload[0..4].try_into().unwrap()) as usize;
                count == m.fds.len() && m.payload.len() >= 8 + 32 * count
            }
        }
        _ => false,
    };
    assert!(
        !(well_formed && m.fds.contains(&Fd::Device)),
        "a device mapping reached the daemon as guest memory: {m:?}"
    );
}

#[cfg(test)]
mod tests {
    use super::super::bytes::fixed_seed_inputs;
    use super::*;

    #[test]
    fn fixed_seed_streams_match_the_model() {
        for input in fixed_seed_inputs(0x5eed_0002, 400, 512) {
            run_filter_sequence(&input);
        }
    }

    /// Every input the fuzzer reported (`test-support/fuzz-regressions/`), run again.
    #[test]
    fn past_findings_match_the_model() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fuzz-regressions/frontend_filter"
        );
        let mut found = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            for _ in 0..50 {
                run_filter_sequence(&std::fs::read(&path).unwrap());
            }
            found += 1;
        }
        assert!(found > 0, "no inputs in {dir}");
    }

    extern "C" fn ignore_signal(_: libc::c_int) {}

    /// The run survives signals that interrupt its blocking calls, as libFuzzer's periodic
    /// SIGALRM (installed without `SA_RESTART`) does: once a signal made the harness stop
    /// reading at the first interrupted `recvmsg`, a "finding" that was none.
    #[test]
    fn interrupting_signals_change_nothing() {
        use std::sync::atomic::{AtomicBool, Ordering};
        // SAFETY: a handler that does nothing, without SA_RESTART; nothing else in this test
        // binary uses SIGUSR2.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = ignore_signal as extern "C" fn(libc::c_int) as usize;
            assert_eq!(
                libc::sigaction(libc::SIGUSR2, &action, std::ptr::null_mut()),
                0
            );
        }
        // SAFETY: plain system calls without arguments.
        let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
        let stop = Arc::new(AtomicBool::new(false));
        let storm = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: signals this test's thread, whose handler does nothing.
                    unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, libc::SIGUSR2) };
                    std::thread::sleep(std::time::Duration::from_micros(20));
                }
            })
        };
        for input in fixed_seed_inputs(0x5eed_0003, 300, 512) {
            run_filter_sequence(&input);
        }
        stop.store(true, Ordering::Relaxed);
        storm.join().unwrap();
    }
}

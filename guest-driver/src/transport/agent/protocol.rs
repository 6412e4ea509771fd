//! What an application process and the guest agent say to each other on the agent's socket.
//!
//! A stream socket carries frames: a header (`kind`, payload length; little-endian u32 each)
//! and the payload, sent in one `sendmsg` with the frame's descriptors (SCM_RIGHTS) attached
//! to its first byte. The application speaks first ([`Frame::Hello`]); from then on every
//! frame it sends is a [`Frame::Execute`] and the agent answers each with one
//! [`Frame::Executed`]. Device events come on a second socket (SOCK_SEQPACKET, one 16-byte
//! event per packet) that the agent hands over with its welcome.
//!
//! Both sides decode every frame defensively: lengths are bounded, counts checked against the
//! payload and the descriptors that came with it.

use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use super::scm;

use crate::transport::shmem_window::WindowChange;

/// Version of this protocol; an agent refuses another.
pub const PROTOCOL_VERSION: u32 = 2;

/// Largest payload either side accepts (a REG_MR page list of 1 GiB is 2 MiB).
pub const MAX_PAYLOAD: usize = 8 << 20;

/// Most descriptors one frame carries (the window changes of one command).
pub const MAX_FDS: usize = 32;

const HELLO: u32 = 1;
const WELCOME: u32 = 2;
const REFUSED: u32 = 3;
const EXECUTE: u32 = 4;
const EXECUTED: u32 = 5;
const WELCOME_SHARED: u32 = 6;

/// What became of a command the agent was asked to execute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The device answered: `used` bytes of response.
    Answered,
    /// The device is gone (its back-end disconnected).
    Disconnected,
    /// The agent could not execute the command (its text says why).
    Failed(String),
}

/// What an application learns when the agent accepts it.
#[derive(Debug)]
pub struct Welcome {
    /// Device-specific feature bits both sides agreed on.
    pub device_features: u64,
    /// The device's configuration space.
    pub config: Vec<u8>,
    /// Size of shared-memory region 0.
    pub shm_size: u64,
    /// Guest-physical address of this process's own guest RAM.
    pub ram_gpa: u64,
    /// Its size.
    pub ram_len: u64,
    /// This process's guest RAM (a sealed memfd).
    pub ram: OwnedFd,
    /// The doorbell queue's kick eventfd.
    pub doorbell_kick: OwnedFd,
    /// The socket events arrive on.
    pub events: OwnedFd,
    /// Set when the agent shares one device among all its processes (VM mode): how the
    /// process reaches what it does not own alone.
    pub shared: Option<SharedDevice>,
}

/// What a process of an agent that shares one device (a PCI function, VM mode) maps besides
/// its own RAM: the device's queue region and the doorbell area the agent registered. In this
/// mode `ram_gpa` is a *process address* of the RAM, not a guest-physical one: the agent
/// translates every address the process names into the guest-physical pages it pinned.
#[derive(Debug)]
pub struct SharedDevice {
    /// Offset of the queue region (shared-memory region 0) in `queue_region`.
    pub queue_region_offset: u64,
    /// The queue region's BAR (its sysfs resource file, opened read-write by the agent).
    pub queue_region: OwnedFd,
    /// Length of the doorbell area at offset 0 of `doorbell_area`.
    pub doorbell_area_len: u64,
    /// The doorbell area (a memfd), already registered with the device.
    pub doorbell_area: OwnedFd,
}

/// One frame.
#[derive(Debug)]
pub enum Frame {
    /// Application → agent, first: the protocol version it speaks.
    Hello {
        /// [`PROTOCOL_VERSION`].
        version: u32,
    },
    /// Agent → application: accepted.
    Welcome(Welcome),
    /// Agent → application: not accepted (why).
    Refused(String),
    /// Application → agent: a control command.
    Execute {
        /// Bytes of response the application can take.
        response_capacity: u32,
        /// The request.
        request: Vec<u8>,
    },
    /// Agent → application: the command's outcome, its response and the changes of the
    /// shared-memory window it caused (each mapping with its file).
    Executed {
        /// What happened.
        outcome: Outcome,
        /// The response (empty unless answered).
        response: Vec<u8>,
        /// Window changes, in the order the device made them.
        changes: Vec<WindowChange>,
    },
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The socket failed.
    #[error("agent socket: {0}")]
    Io(#[from] io::Error),
    /// The peer closed the connection.
    #[error("the peer closed the connection")]
    Closed,
    /// The frame is malformed.
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
}

/// A welcome's fixed part: the configuration's length, then features, shared-memory size,
/// RAM address and RAM size.
const WELCOME_FIXED: usize = 4 + 8 * 4;
/// What a welcome for a shared device adds at its end: the queue region's offset and the
/// doorbell area's length.
const SHARED_TRAILER: usize = 8 * 2;
const CHANGE_SIZE: usize = 4 + 4 + 8 * 3;
const MAP: u32 = 1;
const UNMAP: u32 = 2;

impl Frame {
    /// Writes the frame, with its descriptors, in one `sendmsg`.
    pub fn send(&self, socket: &UnixStream) -> Result<(), ProtocolError> {
        let mut payload = Vec::new();
        let mut fds: Vec<RawFd> = Vec::new();
        let kind = match self {
            Frame::Hello { version } => {
                payload.extend_from_slice(&version.to_le_bytes());
                HELLO
            }
            Frame::Welcome(w) => {
                payload.extend_from_slice(&(w.config.len() as u32).to_le_bytes());
                for value in [w.device_features, w.shm_size, w.ram_gpa, w.ram_len] {
                    payload.extend_from_slice(&value.to_le_bytes());
                }
                payload.extend_from_slice(&w.config);
                fds.extend([&w.ram, &w.doorbell_kick, &w.events].map(|fd| fd.as_raw_fd()));
                match &w.shared {
                    None => WELCOME,
                    Some(shared) => {
                        for value in [shared.queue_region_offset, shared.doorbell_area_len] {
                            payload.extend_from_slice(&value.to_le_bytes());
                        }
                        fds.extend(
                            [&shared.queue_region, &shared.doorbell_area].map(|fd| fd.as_raw_fd()),
                        );
                        WELCOME_SHARED
                    }
                }
            }
            Frame::Refused(why) => {
                payload.extend_from_slice(why.as_bytes());
                REFUSED
            }
            Frame::Execute {
                response_capacity,
                request,
            } => {
                payload.extend_from_slice(&response_capacity.to_le_bytes());
                payload.extend_from_slice(request);
                EXECUTE
            }
            Frame::Executed {
                outcome,
                response,
                changes,
            } => {
                let (code, text) = match outcome {
                    Outcome::Answered => (0u32, ""),
                    Outcome::Disconnected => (1, ""),
                    Outcome::Failed(text) => (2, text.as_str()),
                };
                payload.extend_from_slice(&code.to_le_bytes());
                payload.extend_from_slice(&(changes.len() as u32).to_le_bytes());
                payload.extend_from_slice(&(text.len() as u32).to_le_bytes());
                for change in changes {
                    let (tag, writable, offset, len, fd_offset) = match change {
                        WindowChange::Map {
                            offset,
                            len,
                            fd_offset,
                            writable,
                            fd,
                        } => {
                            fds.push(fd.as_raw_fd());
                            (MAP, u32::from(*writable), *offset, *len, *fd_offset)
                        }
                        WindowChange::Unmap { offset, len } => (UNMAP, 0, *offset, *len, 0),
                    };
                    payload.extend_from_slice(&tag.to_le_bytes());
                    payload.extend_from_slice(&writable.to_le_bytes());
                    for value in [offset, len, fd_offset] {
                        payload.extend_from_slice(&value.to_le_bytes());
                    }
                }
                payload.extend_from_slice(text.as_bytes());
                payload.extend_from_slice(response);
                EXECUTED
            }
        };
        if payload.len() > MAX_PAYLOAD || fds.len() > MAX_FDS {
            return Err(ProtocolError::Malformed("frame too large"));
        }
        let mut frame = Vec::with_capacity(8 + payload.len());
        frame.extend_from_slice(&kind.to_le_bytes());
        frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        frame.extend_from_slice(&payload);
        scm::send(socket, &frame, &fds)?;
        Ok(())
    }

    /// Reads one frame.
    pub fn receive(socket: &UnixStream) -> Result<Frame, ProtocolError> {
        let mut header = [0u8; 8];
        let mut fds = Vec::new();
        let got = scm::receive(socket, &mut header, &mut fds)?;
        if got == 0 {
            return Err(ProtocolError::Closed);
        }
        (&*socket).read_exact(&mut header[got..]).map_err(eof)?;
        let kind = u32_at(&header, 0);
        let len = u32_at(&header, 4) as usize;
        if len > MAX_PAYLOAD {
            return Err(ProtocolError::Malformed("payload too large"));
        }
        let mut payload = vec![0u8; len];
        (&*socket).read_exact(&mut payload).map_err(eof)?;
        Frame::decode(kind, payload, fds)
    }

    /// Decodes a frame of `kind` with `payload` and the descriptors that came with it (each
    /// must be used: a frame with descriptors left over is malformed).
    pub fn decode(
        kind: u32,
        mut payload: Vec<u8>,
        mut fds: Vec<OwnedFd>,
    ) -> Result<Frame, ProtocolError> {
        if payload.len() > MAX_PAYLOAD || fds.len() > MAX_FDS {
            return Err(ProtocolError::Malformed("frame too large"));
        }
        let mut take_fd = || {
            if fds.is_empty() {
                Err(ProtocolError::Malformed("descriptor missing"))
            } else {
                Ok(fds.remove(0))
            }
        };
        let frame = match kind {
            HELLO => Frame::Hello {
                version: u32_at(exact(&payload, 4)?, 0),
            },
            WELCOME | WELCOME_SHARED => {
                let trailer = if kind == WELCOME_SHARED {
                    SHARED_TRAILER
                } else {
                    0
                };
                let fixed = at_least(&payload, WELCOME_FIXED + trailer)?;
                let config_len = u32_at(fixed, 0) as usize;
                let config_end = payload.len() - trailer;
                let config = payload[WELCOME_FIXED..config_end]
                    .get(..config_len)
                    .filter(|c| c.len() == config_end - WELCOME_FIXED)
                    .ok_or(ProtocolError::Malformed("welcome length"))?
                    .to_vec();
                let word = |i: usize| u64_at(fixed, 4 + 8 * i);
                let (ram, doorbell_kick, events) = (take_fd()?, take_fd()?, take_fd()?);
                let shared = if kind == WELCOME_SHARED {
                    let tail = &payload[config_end..];
                    Some(SharedDevice {
                        queue_region_offset: u64_at(tail, 0),
                        doorbell_area_len: u64_at(tail, 8),
                        queue_region: take_fd()?,
                        doorbell_area: take_fd()?,
                    })
                } else {
                    None
                };
                Frame::Welcome(Welcome {
                    device_features: word(0),
                    shm_size: word(1),
                    ram_gpa: word(2),
                    ram_len: word(3),
                    config,
                    ram,
                    doorbell_kick,
                    events,
                    shared,
                })
            }
            REFUSED => Frame::Refused(String::from_utf8_lossy(&payload).into_owned()),
            EXECUTE => {
                let response_capacity = u32_at(at_least(&payload, 4)?, 0);
                Frame::Execute {
                    response_capacity,
                    request: payload.split_off(4),
                }
            }
            EXECUTED => {
                let fixed = at_least(&payload, 12)?;
                let count = u32_at(fixed, 4) as usize;
                let text_len = u32_at(fixed, 8) as usize;
                let changes_end = count
                    .checked_mul(CHANGE_SIZE)
                    .and_then(|n| n.checked_add(12))
                    .filter(|&end| end <= payload.len())
                    .ok_or(ProtocolError::Malformed("change count"))?;
                let text_end = changes_end
                    .checked_add(text_len)
                    .filter(|&end| end <= payload.len())
                    .ok_or(ProtocolError::Malformed("text length"))?;
                let mut changes = Vec::with_capacity(count);
                for record in payload[12..changes_end].chunks_exact(CHANGE_SIZE) {
                    let (offset, len) = (u64_at(record, 8), u64_at(record, 16));
                    changes.push(match u32_at(record, 0) {
                        MAP => WindowChange::Map {
                            offset,
                            len,
                            fd_offset: u64_at(record, 24),
                            writable: u32_at(record, 4) != 0,
                            fd: take_fd()?,
                        },
                        UNMAP => WindowChange::Unmap { offset, len },
                        _ => return Err(ProtocolError::Malformed("change kind")),
                    });
                }
                let text = String::from_utf8_lossy(&payload[changes_end..text_end]).into_owned();
                let outcome = match u32_at(fixed, 0) {
                    0 => Outcome::Answered,
                    1 => Outcome::Disconnected,
                    2 => Outcome::Failed(text),
                    _ => return Err(ProtocolError::Malformed("outcome")),
                };
                Frame::Executed {
                    outcome,
                    response: payload[text_end..].to_vec(),
                    changes,
                }
            }
            _ => return Err(ProtocolError::Malformed("frame kind")),
        };
        if !fds.is_empty() {
            return Err(ProtocolError::Malformed("unexpected descriptors"));
        }
        Ok(frame)
    }
}

/// The connected pair of sockets events travel on (SOCK_SEQPACKET: one event per packet,
/// and an end of stream when the agent closes its end).
pub fn event_socket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1; 2];
    // SAFETY: socketpair fills two descriptors into the array on success.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn eof(e: io::Error) -> ProtocolError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        ProtocolError::Closed
    } else {
        ProtocolError::Io(e)
    }
}

fn exact(payload: &[u8], len: usize) -> Result<&[u8], ProtocolError> {
    if payload.len() == len {
        Ok(payload)
    } else {
        Err(ProtocolError::Malformed("payload length"))
    }
}

fn at_least(payload: &[u8], len: usize) -> Result<&[u8], ProtocolError> {
    payload
        .get(..len)
        .ok_or(ProtocolError::Malformed("payload too short"))
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn null_fd() -> OwnedFd {
        let file = std::fs::File::open("/dev/null").unwrap();
        file.into()
    }

    #[test]
    fn every_frame_crosses_the_socket_with_its_descriptors() {
        let (a, b) = UnixStream::pair().unwrap();
        Frame::Hello { version: 7 }.send(&a).unwrap();
        assert!(matches!(
            Frame::receive(&b).unwrap(),
            Frame::Hello { version: 7 }
        ));

        let welcome = Welcome {
            device_features: 0x1234,
            config: vec![1, 2, 3],
            shm_size: 1 << 30,
            ram_gpa: 5 << 30,
            ram_len: 64 << 20,
            ram: null_fd(),
            doorbell_kick: null_fd(),
            events: null_fd(),
            shared: None,
        };
        Frame::Welcome(welcome).send(&b).unwrap();
        let Frame::Welcome(got) = Frame::receive(&a).unwrap() else {
            panic!("not a welcome");
        };
        assert_eq!(
            (got.device_features, got.config.clone(), got.shm_size),
            (0x1234, vec![1, 2, 3], 1 << 30)
        );
        assert_eq!((got.ram_gpa, got.ram_len), (5 << 30, 64 << 20));
        let fds = [&got.ram, &got.doorbell_kick, &got.events];
        assert!(fds.iter().all(|fd| fd.as_fd().as_raw_fd() >= 0));
        // Received descriptors are close-on-exec from the start.
        for fd in fds {
            // SAFETY: F_GETFD on a descriptor we own.
            let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
            assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        }

        // A welcome of a shared device carries its queue region and doorbell area too.
        let shared = Welcome {
            device_features: 1,
            config: vec![7; 64],
            shm_size: 1 << 21,
            ram_gpa: 1 << 30,
            ram_len: 1 << 20,
            ram: null_fd(),
            doorbell_kick: null_fd(),
            events: null_fd(),
            shared: Some(SharedDevice {
                queue_region_offset: 0x4000,
                queue_region: null_fd(),
                doorbell_area_len: 0x2080,
                doorbell_area: null_fd(),
            }),
        };
        Frame::Welcome(shared).send(&b).unwrap();
        let Frame::Welcome(got) = Frame::receive(&a).unwrap() else {
            panic!("not a welcome");
        };
        assert_eq!((got.config, got.ram_len), (vec![7; 64], 1 << 20));
        let shared = got.shared.expect("the shared part");
        assert_eq!(
            (shared.queue_region_offset, shared.doorbell_area_len),
            (0x4000, 0x2080)
        );

        // Larger than the socket buffer: the receiver reads while the sender still sends.
        let request = vec![9u8; 3 << 20];
        let sent = request.clone();
        let sender = std::thread::spawn(move || {
            Frame::Execute {
                response_capacity: 512,
                request: sent,
            }
            .send(&a)
            .unwrap();
            a
        });
        let Frame::Execute {
            response_capacity,
            request: got,
        } = Frame::receive(&b).unwrap()
        else {
            panic!("not an execute");
        };
        let a = sender.join().unwrap();
        assert_eq!((response_capacity, got == request), (512, true));

        let changes = vec![
            WindowChange::Map {
                offset: 0x1000,
                len: 0x2000,
                fd_offset: 0x3000,
                writable: true,
                fd: null_fd(),
            },
            WindowChange::Unmap {
                offset: 0x5000,
                len: 0x1000,
            },
        ];
        Frame::Executed {
            outcome: Outcome::Failed("no".into()),
            response: vec![4, 5],
            changes,
        }
        .send(&b)
        .unwrap();
        let Frame::Executed {
            outcome,
            response,
            changes,
        } = Frame::receive(&a).unwrap()
        else {
            panic!("not executed");
        };
        assert_eq!(
            (outcome, response),
            (Outcome::Failed("no".into()), vec![4, 5])
        );
        assert!(matches!(
            changes[..],
            [
                WindowChange::Map {
                    offset: 0x1000,
                    len: 0x2000,
                    fd_offset: 0x3000,
                    writable: true,
                    ..
                },
                WindowChange::Unmap {
                    offset: 0x5000,
                    len: 0x1000
                }
            ]
        ));
    }

    #[test]
    fn malformed_frames_are_refused_not_trusted() {
        let cases: [(&[u8], &str); 4] = [
            (&[9, 0, 0, 0, 0, 0, 0, 0], "frame kind"),
            (&[1, 0, 0, 0, 2, 0, 0, 0, 1, 2], "payload length"),
            // A welcome whose descriptors are missing.
            (&[2, 0, 0, 0, 36, 0, 0, 0], ""),
            // An executed frame announcing more changes than it holds.
            (
                &[5, 0, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0],
                "change count",
            ),
        ];
        for (bytes, expected) in cases {
            let (a, b) = UnixStream::pair().unwrap();
            io::Write::write_all(&mut &a, bytes).unwrap();
            if bytes.len() == 8 && bytes[4] == 36 {
                io::Write::write_all(&mut &a, &[0u8; 36]).unwrap();
            }
            match Frame::receive(&b) {
                Err(ProtocolError::Malformed(what)) if expected.is_empty() => {
                    assert!(what.contains("descriptor"), "{what}")
                }
                Err(ProtocolError::Malformed(what)) => assert_eq!(what, expected),
                other => panic!("{bytes:?}: {other:?}"),
            }
        }
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        assert!(matches!(Frame::receive(&b), Err(ProtocolError::Closed)));
    }
}

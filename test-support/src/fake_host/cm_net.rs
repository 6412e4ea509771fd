//! The fake connection manager's state ([`CmNet`]): every id of every file (guest context) of
//! one fake device and their queued events, with the kernel's id, port and teardown rules;
//! `super::cm` drives it as the backend's `HostCm`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use vrdma_host::cm::*;
use vrdma_host::{self as host, DeviceError};
use vrdma_spec::cm::cm_event;

/// Where the fake's ephemeral ports start.
const FIRST_EPHEMERAL_PORT: u16 = 40_000;
/// The Q_Key of datagram ids (`RDMA_UDP_QKEY`).
pub const UDP_QKEY: u32 = 0x0123_4567;
/// The status of REJECTED after the peer's CM_REJECT (`IB_CM_REJ_CONSUMER_DEFINED`).
pub const REJECT_CONSUMER_DEFINED: i32 = 28;
/// The status of REJECTED without a listener (`IB_CM_REJ_INVALID_SERVICE_ID`).
pub const REJECT_NO_LISTENER: i32 = 8;

/// One id of the fake CM.
#[derive(Debug, Clone)]
pub struct FakeCmId {
    /// The file (guest context) it belongs to.
    pub file: u64,
    /// Its `uid` (0 for a connect request's id until it is accepted).
    pub uid: u64,
    /// Its port space.
    pub port_space: u16,
    /// Its bound source.
    pub src: Option<SocketAddr>,
    /// Its resolved destination.
    pub dst: Option<SocketAddr>,
    /// Whether the route was resolved.
    pub routed: bool,
    /// Whether it listens.
    pub listening: bool,
    /// The other end of its connection.
    pub peer: Option<u32>,
    /// The QP number it gave CONNECT or ACCEPT.
    pub qp_num: u32,
    /// The peer's QP number and initiator depth, once known.
    pub peer_qp: Option<(u32, u8)>,
    /// It heard DISCONNECTED (or REJECTED): the connection is over for it.
    pub heard_end: bool,
    /// It sent its disconnect.
    pub sent_disconnect: bool,
    /// Options set, in order.
    pub options: Vec<CmOption>,
}

/// The ids of every file of one fake device, and their events.
#[derive(Default)]
pub struct CmNet {
    /// Whether the device has a CM at all (tests turn it on before opening guests).
    pub enabled: bool,
    next_id: u32,
    next_file: u64,
    next_port: u16,
    /// Every live id by number.
    pub ids: BTreeMap<u32, FakeCmId>,
    files: HashMap<u64, FileQueue>,
    /// Ids named by a file they do not belong to (must stay empty).
    pub foreign_ids: Vec<(u64, u32)>,
    /// Every address an id was bound to, with the id's file, in order: by CM_BIND, or by the
    /// host itself for an address resolution or a listen without one. An id may be bound
    /// and destroyed between two looks at [`ids`](Self::ids); audits of the addresses guests
    /// use (the handler fuzzer's) take this log instead.
    pub binds: Vec<(u64, SocketAddr)>,
}

struct FileQueue {
    events: VecDeque<CmEvent>,
    ready: Arc<OwnedFd>,
}

pub(super) fn errno(command: &'static str, errno: i32) -> DeviceError {
    DeviceError::Command { command, errno }
}

pub(super) fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

impl CmNet {
    pub(super) fn new_id(&mut self) -> u32 {
        self.next_id += 1;
        self.next_id
    }

    pub(super) fn open_file(&mut self) -> (u64, Arc<OwnedFd>) {
        self.next_file += 1;
        // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(fd >= 0, "eventfd: {}", std::io::Error::last_os_error());
        // SAFETY: a new fd nobody else owns.
        let ready = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        self.files.insert(
            self.next_file,
            FileQueue {
                events: VecDeque::new(),
                ready: Arc::clone(&ready),
            },
        );
        (self.next_file, ready)
    }

    /// The number of the last file opened (0: none yet). Files are numbered from 1 in the
    /// order guests' devices open them, so a test that creates one guest at a time learns
    /// each guest's file here.
    pub fn last_file(&self) -> u64 {
        self.next_file
    }

    /// Whether `file` is open (its guest context has not closed it).
    pub fn is_open(&self, file: u64) -> bool {
        self.files.contains_key(&file)
    }

    /// The ids whose CONNECT_REQUEST still waits in `file`'s queue: the fake made them for the
    /// file's listener, and the guest's device learns of them only when it reads the event.
    pub fn queued_requests(&self, file: u64) -> Vec<u32> {
        self.files.get(&file).map_or_else(Vec::new, |q| {
            q.events
                .iter()
                .filter(|e| e.event == cm_event::CONNECT_REQUEST)
                .map(|e| e.id.0)
                .collect()
        })
    }

    pub(super) fn close_file(&mut self, file: u64) {
        let ids: Vec<u32> = self
            .ids
            .iter()
            .filter(|(_, e)| e.file == file)
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            self.destroy(id);
        }
        self.files.remove(&file);
    }

    /// The id `id` of `file`; EINVAL for another file's (recorded) or an unknown one.
    pub(super) fn own(
        &mut self,
        file: u64,
        id: CmId,
        command: &'static str,
    ) -> host::Result<&mut FakeCmId> {
        match self.ids.get(&id.0) {
            Some(e) if e.file == file => Ok(self.ids.get_mut(&id.0).expect("present")),
            Some(_) => {
                self.foreign_ids.push((file, id.0));
                Err(errno(command, libc::EINVAL))
            }
            None => Err(errno(command, libc::EINVAL)),
        }
    }

    pub(super) fn push(&mut self, id: u32, event: u32, status: i32, params: EventParams) {
        let Some(e) = self.ids.get(&id) else { return };
        let (file, uid) = (e.file, e.uid);
        if uid == 0 {
            // As ucma: the events of a connect request's id not accepted yet are dropped.
            return;
        }
        self.push_to(file, uid, id, event, status, params);
    }

    pub(super) fn push_to(
        &mut self,
        file: u64,
        uid: u64,
        id: u32,
        event: u32,
        status: i32,
        params: EventParams,
    ) {
        let Some(q) = self.files.get_mut(&file) else {
            return;
        };
        q.events.push_back(CmEvent {
            uid,
            id: CmId(id),
            event,
            status,
            params,
        });
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to an eventfd we own.
        unsafe { libc::write(q.ready.as_raw_fd(), one.as_ptr().cast(), 8) };
    }

    pub(super) fn pop(&mut self, file: u64) -> Option<CmEvent> {
        let q = self.files.get_mut(&file)?;
        let event = q.events.pop_front();
        if q.events.is_empty() {
            let mut count = [0u8; 8];
            // SAFETY: reads 8 bytes into a live buffer from a non-blocking eventfd we own.
            unsafe { libc::read(q.ready.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
        }
        event
    }

    pub(super) fn ephemeral_port(&mut self) -> u16 {
        self.next_port = self.next_port.max(FIRST_EPHEMERAL_PORT).wrapping_add(1);
        self.next_port
    }

    pub(super) fn port_taken(&self, port_space: u16, addr: &SocketAddr) -> bool {
        self.ids.values().any(|e| {
            e.port_space == port_space
                && e.src.is_some_and(|s| {
                    s.port() == addr.port()
                        && (s.ip() == addr.ip()
                            || s.ip().is_unspecified()
                            || addr.ip().is_unspecified())
                })
        })
    }

    /// Removes an id: its queued events go, its connection ends (or its request is
    /// rejected), a listener's undelivered requests are destroyed.
    pub(super) fn destroy(&mut self, id: u32) {
        let Some(e) = self.ids.remove(&id) else {
            return;
        };
        if let Some(q) = self.files.get_mut(&e.file) {
            let mut orphans = Vec::new();
            q.events.retain(|ev| {
                if ev.event == cm_event::CONNECT_REQUEST && ev.uid == e.uid && e.listening {
                    orphans.push(ev.id.0);
                    return false;
                }
                ev.id.0 != id
            });
            for orphan in orphans {
                self.destroy(orphan);
            }
        }
        if let Some(peer) = e.peer {
            let Some(p) = self.ids.get_mut(&peer) else {
                return;
            };
            p.peer = None;
            if p.heard_end {
                return;
            }
            p.heard_end = true;
            let event = if e.peer_qp.is_some() && p.peer_qp.is_some() {
                cm_event::DISCONNECTED
            } else {
                cm_event::REJECTED
            };
            let status = if event == cm_event::REJECTED {
                REJECT_CONSUMER_DEFINED
            } else {
                0
            };
            self.push(peer, event, status, EventParams::NONE);
        }
    }
}

//! The state of the fake host device ([`World`]): every live object by handle, what the
//! guest's device asked of it, the events tests hand out, and the knobs tests turn.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;

use vrdma_backend::identity::GuestAddress;
use vrdma_host::{self as host, *};
use vrdma_spec::rxe_v1::RingGeometry;
use vrdma_spec::verbs::{MwType, QpAttrMask, QpState, QpType};
use vrdma_spec::wire::{AhAttr, GidEntry};

use super::cm_net::CmNet;
use super::ownership::Ownership;

/// The one GID of the fake port (index 0, RoCE v2).
pub const GID0: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

/// Bytes of a page.
pub const PAGE: u64 = 4096;
/// Size of each context's queue file (sparse: only the buffers used take memory). Buffer
/// offsets are handed out once per world and never reused.
pub const QUEUE_FILE_SIZE: u64 = 1 << 30;

/// What the fake device holds, shared by the device and every context it opened: the live
/// objects by handle, what the guest's device asked of it, the events to hand out, and the next
/// operation to fail.
/// A change a test makes to the world when a command begins ([`World::before_next`]).
pub type WorldHook = Box<dyn FnOnce(&mut World) + Send>;

#[derive(Default)]
pub struct World {
    next_handle: u32,
    /// Offset of the next queue buffer on the contexts' queue fd.
    next_offset: u64,
    /// Live PDs.
    pub pds: BTreeMap<u32, ()>,
    /// Live MRs and how they were registered.
    pub mrs: BTreeMap<u32, MrInit>,
    /// Live CQs and their `user_handle`s.
    pub cqs: BTreeMap<u32, u64>,
    /// Completions each CQ holds, as a test sets them: a resize below this count fails with
    /// EINVAL, as rxe's does (the fake writes no CQEs itself).
    pub cq_pending: BTreeMap<u32, u32>,
    /// RESIZE_CQs: CQ and the capacity it got, in order.
    pub resized: Vec<(u32, u32)>,
    /// Live QPs: QP number and `user_handle`.
    pub qps: BTreeMap<u32, (u32, u64)>,
    /// Send queue buffer of every live QP: its context's queue file and the buffer there.
    pub send_queues: HashMap<u32, (File, QueueBuffer)>,
    /// Receive-queue buffer of each QP with one (its file and place in it).
    pub recv_queues: HashMap<u32, (File, QueueBuffer)>,
    /// Buffer of every live CQ (its context's queue file and the buffer there).
    pub cq_queues: HashMap<u32, (File, QueueBuffer)>,
    /// The geometry of every live CQ's buffer.
    pub cq_geometry: HashMap<u32, RingGeometry>,
    /// The geometry of every live QP's send queue.
    pub send_geometry: HashMap<u32, RingGeometry>,
    /// The PD of every live QP and AH.
    pub pd_of: HashMap<u32, u32>,
    /// Live SRQs and their `user_handle`s.
    pub srqs: BTreeMap<u32, u64>,
    /// SGEs per receive of every live SRQ (its buffer's entry size).
    pub srq_max_sge: HashMap<u32, u32>,
    /// Receives each SRQ holds, as a test sets them: a resize below this count fails with
    /// EINVAL, as rxe's does.
    pub srq_pending: BTreeMap<u32, u32>,
    /// Resizes of SRQs (MODIFY_SRQ with a `max_wr`): SRQ and the capacity it got, in order.
    pub srq_resized: Vec<(u32, u32)>,
    /// Live AHs.
    pub ahs: BTreeMap<u32, ()>,
    /// Live MWs: their PD and type.
    pub mws: BTreeMap<u32, (PdHandle, MwType)>,
    /// QPs kicked (`kick_send`), in order.
    pub kicks: Vec<u32>,
    /// CQs armed, with `solicited_only`, in order.
    pub armed: Vec<(u32, bool)>,
    /// MODIFY_QPs: QP, mask and the state asked for, in order.
    pub modified: Vec<(u32, QpAttrMask, QpState)>,
    /// Current state of each live QP.
    pub qp_state: HashMap<u32, QpState>,
    /// Transport type of each live QP, as CREATE_QP asked for it.
    pub qp_types: HashMap<u32, QpType>,
    /// Completion events `read_comp_event` hands out.
    pub comp_events: VecDeque<CompEvent>,
    /// Async events `read_async_event` hands out.
    pub async_events: VecDeque<AsyncEvent>,
    /// GID entries of port 1 besides [`GID0`] at index 0 (indices below 16, the port's
    /// `gid_tbl_len`, or beyond it to test filtering).
    pub extra_gids: Vec<(u32, GidEntry)>,
    /// The next call of this command (`"ALLOC_PD"`, `"CREATE_QP"`, ...) fails with EINVAL.
    pub fail_next: Option<&'static str>,
    /// Runs on the world when the next call of this command begins (something changing on the
    /// host between the daemon's checks and its command).
    pub before_next: Option<(&'static str, WorldHook)>,
    /// The addresses of the fake port's netdev (`NetdevAddresses`, in `super::netdev`).
    pub netdev_addresses: Vec<GuestAddress>,
    /// Whether an address added to the netdev gets its GID entries, as the kernel gives them
    /// (turn off to see the daemon's wait time out).
    pub no_gids_for_new_addresses: bool,
    /// Whether the port has RoCE v1 entries besides v2 ones (rxe has only v2): an address
    /// added to the netdev then gets both (a test adds [`GID0`]'s v1 entry itself).
    pub both_roce_types: bool,
    /// The device has no on-demand paging (an rxe built without it): it reports none and
    /// refuses ON_DEMAND registrations (EOPNOTSUPP).
    pub no_odp: bool,
    /// The device's on-demand paging serves only MRs whose iova is their address (as rxe's).
    pub odp_at_address_only: bool,
    /// The netdev refuses to take this address (EPERM).
    pub refuse_address: Option<std::net::IpAddr>,
    /// The primary and alternate path each QP was last given (MODIFY_QP AV / ALT_PATH, in
    /// the host's terms), returned by QUERY_QP.
    pub qp_paths: HashMap<u32, (AhAttr, AhAttr)>,
    /// The attributes each live AH was created with (host terms).
    pub ah_attrs: BTreeMap<u32, AhAttr>,
    /// The destination QP number each QP was last given (MODIFY_QP DEST_QPN), returned by
    /// QUERY_QP.
    pub qp_dest: HashMap<u32, u32>,
    /// The read/atomic depths each QP was last given (MODIFY_QP `MAX_QP_RD_ATOMIC`,
    /// `MAX_DEST_RD_ATOMIC`), returned by QUERY_QP: (initiator, responder).
    pub qp_rd_atomic: HashMap<u32, (u8, u8)>,
    /// Every address vector a context gave the device (CREATE_AH, MODIFY_QP AV and ALT_PATH),
    /// in order, for audits of the source addresses guests use.
    pub paths_given: Vec<(u64, AhAttr)>,
    /// Every connection a context set up (a successful MODIFY_QP of an RC or UC QP with AV
    /// DEST_QPN or ALT_PATH), in order.
    pub connections: Vec<Connection>,
    /// Which context owns each object, and the commands that named another's.
    pub ownership: Ownership,
    /// The connection manager's ids of every context (off unless a test turns it on).
    pub cm: CmNet,
    /// QUERY_PORTs the contexts made.
    pub port_queries: usize,
}

/// One of a host QP's queues, or a CQ's buffer (see [`World::read_queue`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostQueue {
    Send,
    Recv,
    /// The buffer of the CQ whose handle is given in place of a QP's.
    Completion,
}

/// A connection the fake device was asked to set up: see [`World::connections`].
#[derive(Debug, Clone, Copy)]
pub struct Connection {
    /// The context that owns the QP.
    pub context: u64,
    /// The QP (host handle).
    pub qp: u32,
    /// Destination GIDs of its primary and alternate path (zero where never set).
    pub dgids: [[u8; 16]; 2],
    /// Its destination QP number.
    pub dest_qpn: u32,
}

impl World {
    pub(super) fn handle(&mut self) -> u32 {
        self.next_handle += 1;
        self.next_handle
    }

    pub(super) fn fail(&mut self, op: &'static str) -> host::Result<()> {
        if let Some((_, hook)) = self.before_next.take_if(|(next, _)| *next == op) {
            hook(self);
        }
        if self.fail_next == Some(op) {
            self.fail_next = None;
            return Err(DeviceError::Command {
                command: op,
                errno: libc::EINVAL,
            });
        }
        Ok(())
    }

    /// A queue buffer the way rxe sizes it, at the next free offset of the contexts' queue
    /// files; ENOMEM when it would not fit in [`QUEUE_FILE_SIZE`] (a mapping past the end of
    /// the file would fault on first access, which no real queue buffer does).
    pub(super) fn buffer(&mut self, slots: u32, entry_bytes: usize) -> host::Result<QueueBuffer> {
        let elem = entry_bytes.next_power_of_two().max(64) as u64;
        let len = (384 + u64::from(slots) * elem).next_multiple_of(PAGE);
        let offset = self.next_offset;
        if offset + len > QUEUE_FILE_SIZE {
            return Err(DeviceError::Command {
                command: "queue buffer",
                errno: libc::ENOMEM,
            });
        }
        self.next_offset += len;
        Ok(QueueBuffer {
            offset,
            len: len as usize,
        })
    }

    /// The host handle of the live QP numbered `qpn`.
    pub fn qp_by_qpn(&self, qpn: u32) -> Option<u32> {
        self.qps
            .iter()
            .find(|(_, (number, _))| *number == qpn)
            .map(|(&handle, _)| handle)
    }

    /// The buffer of `qp`'s send or receive queue (panics if it has none: a test's mistake).
    fn queue(&self, qp: u32, queue: HostQueue) -> &(File, QueueBuffer) {
        let queues = match queue {
            HostQueue::Send => &self.send_queues,
            HostQueue::Recv => &self.recv_queues,
            HostQueue::Completion => &self.cq_queues,
        };
        queues
            .get(&qp)
            .unwrap_or_else(|| panic!("host QP {qp} has no {queue:?} queue"))
    }

    /// `len` bytes at `at` in `qp`'s host queue, as the kernel would read them.
    pub fn read_queue(&self, qp: u32, queue: HostQueue, at: usize, len: usize) -> Vec<u8> {
        let (file, buffer) = self.queue(qp, queue);
        let mut bytes = vec![0; len];
        file.read_exact_at(&mut bytes, buffer.offset + at as u64)
            .expect("reading a host queue");
        bytes
    }

    /// The little-endian word at `at` in `qp`'s host queue (an index of its header).
    pub fn queue_word(&self, qp: u32, queue: HostQueue, at: usize) -> u32 {
        let bytes = self.read_queue(qp, queue, at, 4);
        u32::from_le_bytes(bytes.try_into().expect("four bytes"))
    }

    /// Writes the word at `at` in `qp`'s host queue, as the kernel does (its consumer index).
    pub fn set_queue_word(&self, qp: u32, queue: HostQueue, at: usize, value: u32) {
        let (file, buffer) = self.queue(qp, queue);
        file.write_all_at(&value.to_le_bytes(), buffer.offset + at as u64)
            .expect("writing a host queue");
    }

    /// Writes `bytes` at `at` in `owner`'s host queue (a CQE, as the kernel does).
    pub fn write_queue(&self, owner: u32, queue: HostQueue, at: usize, bytes: &[u8]) {
        let (file, buffer) = self.queue(owner, queue);
        file.write_all_at(bytes, buffer.offset + at as u64)
            .expect("writing a host queue");
    }

    /// Posts a completion (`cqe`, at most a slot) to host CQ `cq` as rxe does: the slot at its
    /// producer index, then the index advanced. Returns false, posting nothing, if the CQ is
    /// full (the kernel would report an overflow).
    pub fn post_completion(&self, cq: u32, cqe: &[u8]) -> bool {
        use vrdma_spec::rxe_v1::header;
        let ring = self.cq_geometry[&cq];
        let cqe = &cqe[..cqe.len().min(ring.slot_size())];
        let producer = self.queue_word(cq, HostQueue::Completion, header::PRODUCER_INDEX);
        let consumer = self.queue_word(cq, HostQueue::Completion, header::CONSUMER_INDEX);
        if ring.next(producer) == ring.mask(consumer) {
            return false;
        }
        self.write_queue(cq, HostQueue::Completion, ring.slot_offset(producer), cqe);
        self.set_queue_word(
            cq,
            HostQueue::Completion,
            header::PRODUCER_INDEX,
            ring.next(producer),
        );
        true
    }

    /// The slots of the completions host CQ `cq` holds (between its consumer and producer
    /// indices), oldest first.
    pub fn completions_held(&self, cq: u32) -> Vec<Vec<u8>> {
        use vrdma_spec::rxe_v1::header;
        let ring = self.cq_geometry[&cq];
        let producer =
            ring.mask(self.queue_word(cq, HostQueue::Completion, header::PRODUCER_INDEX));
        let mut consumer =
            ring.mask(self.queue_word(cq, HostQueue::Completion, header::CONSUMER_INDEX));
        let mut held = Vec::new();
        while consumer != producer {
            let at = ring.slot_offset(consumer);
            held.push(self.read_queue(cq, HostQueue::Completion, at, ring.slot_size()));
            consumer = ring.next(consumer);
        }
        held
    }

    /// How many times `qp` was kicked.
    pub fn kicks_of(&self, qp: u32) -> usize {
        self.kicks.iter().filter(|&&kicked| kicked == qp).count()
    }

    /// Number of live host objects of every kind.
    pub fn live(&self) -> usize {
        self.pds.len()
            + self.mrs.len()
            + self.cqs.len()
            + self.qps.len()
            + self.srqs.len()
            + self.ahs.len()
            + self.mws.len()
    }
}

//! The host's connection manager as the backend uses it on a guest's behalf: one [`HostCm`]
//! per guest context (rxe: an open `/dev/infiniband/rdma_cm`, [`super::ucma`]), object-safe so a
//! test can put a fake behind it. Its types are the host's: socket addresses as the host's
//! network sees them (link-local ones scoped to the host's netdev), GID indices and ports of
//! the host device. The guest's terms are the control layer's business.

use std::net::SocketAddr;
use std::os::fd::BorrowedFd;

use vrdma_spec::cm::CM_MAX_PRIVATE_DATA;
use vrdma_spec::verbs::{QpAttrMask, QpState};
use vrdma_spec::wire::{AhAttr, QpAttr};

use super::error::Result;

/// An id of one [`HostCm`] (the kernel's number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CmId(pub u32);

/// Private data of a CM message: at most 255 bytes (its length travels in a byte).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PrivateData {
    len: u8,
    bytes: [u8; CM_MAX_PRIVATE_DATA],
}

impl PrivateData {
    /// No private data.
    pub const EMPTY: PrivateData = PrivateData {
        len: 0,
        bytes: [0; CM_MAX_PRIVATE_DATA],
    };

    /// The first 255 bytes of `data` at most.
    pub fn new(data: &[u8]) -> PrivateData {
        let len = data.len().min(CM_MAX_PRIVATE_DATA - 1);
        let mut bytes = [0; CM_MAX_PRIVATE_DATA];
        bytes[..len].copy_from_slice(&data[..len]);
        PrivateData {
            len: len as u8,
            bytes,
        }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// How many bytes.
    pub fn len(&self) -> u8 {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// All 256 bytes, zero past the length (the layout every ABI carries).
    pub fn padded(&self) -> &[u8; CM_MAX_PRIVATE_DATA] {
        &self.bytes
    }
}

impl std::fmt::Debug for PrivateData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PrivateData({} bytes)", self.len)
    }
}

/// Connection parameters of CONNECT and ACCEPT, and of a peer in a connection event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnParams {
    /// The host QP number of the connection's QP (sent to the peer, which aims at it).
    pub qp_num: u32,
    /// Whether that QP receives through an SRQ.
    pub srq: bool,
    /// RDMA reads/atomics the peer may have outstanding towards this side.
    pub responder_resources: u8,
    /// RDMA reads/atomics this side may have outstanding.
    pub initiator_depth: u8,
    /// Flow control (0 or 1).
    pub flow_control: u8,
    /// Transport retries.
    pub retry_count: u8,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// For the peer.
    pub private_data: PrivateData,
}

impl ConnParams {
    /// All zero.
    pub const NONE: ConnParams = ConnParams {
        qp_num: 0,
        srq: false,
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: 0,
        retry_count: 0,
        rnr_retry_count: 0,
        private_data: PrivateData::EMPTY,
    };
}

/// What a datagram (UD) id learns of its peer: its QP, Q_Key and address vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdPeer {
    /// The peer's QP number.
    pub qp_num: u32,
    /// The peer's Q_Key.
    pub qkey: u32,
    /// The address vector towards it (host GID index and port).
    pub ah_attr: AhAttr,
    /// The peer's private data.
    pub private_data: PrivateData,
}

impl UdPeer {
    /// All zero.
    pub const NONE: UdPeer = UdPeer {
        qp_num: 0,
        qkey: 0,
        ah_attr: AhAttr {
            dgid: [0; 16],
            flow_label: vrdma_spec::Le32::ZERO,
            sgid_index: 0,
            hop_limit: 0,
            traffic_class: 0,
            sl: 0,
            dlid: vrdma_spec::Le16::ZERO,
            src_path_bits: 0,
            static_rate: 0,
            is_global: 0,
            port_num: 0,
            reserved: vrdma_spec::Le16::ZERO,
        },
        private_data: PrivateData::EMPTY,
    };
}

/// What an event says of the peer, read both ways the kernel's union can be read: `conn`
/// applies to connected (RC) ids, `ud` to datagram (UD) ids; which one follows from the id's
/// port space, which the caller knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventParams {
    /// As connection parameters.
    pub conn: ConnParams,
    /// As a datagram peer.
    pub ud: UdPeer,
}

impl EventParams {
    /// No parameters (events that carry none).
    pub const NONE: EventParams = EventParams {
        conn: ConnParams::NONE,
        ud: UdPeer::NONE,
    };
}

/// One event of a [`HostCm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmEvent {
    /// The `uid` the id was created (or accepted) with; a connect request carries its
    /// listener's.
    pub uid: u64,
    /// The id (a connect request: the new id the host made for it).
    pub id: CmId,
    /// The rdma_cm event number (`vrdma_spec::cm::cm_event`).
    pub event: u32,
    /// 0, a negative errno, or a reject's reason.
    pub status: i32,
    /// The peer's parameters.
    pub params: EventParams,
}

/// The addresses of an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmAddresses {
    /// Its source, `None` while unbound (or of a family that is not IP).
    pub src: Option<SocketAddr>,
    /// Its destination, `None` while unresolved.
    pub dst: Option<SocketAddr>,
}

/// An option of an id, with its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmOption {
    /// The type of service (traffic class) of the id's connection.
    Tos(u8),
    /// Reuse of a bound address.
    ReuseAddr(bool),
    /// IPv6 ids bind IPv6 only.
    AfOnly(bool),
    /// The QP's local ACK timeout.
    AckTimeout(u8),
}

/// The host's connection manager for one guest: its ids and their events.
///
/// Ids are the host's numbers of this instance; another's are refused, and dropping it
/// destroys every id it holds, connections and pending requests included.
pub trait HostCm: Send + Sync {
    /// Readable while [`HostCm::get_event`] has something.
    fn event_fd(&self) -> BorrowedFd<'_>;

    /// A new id in port space `port_space` (`vrdma_spec::cm::cm_port_space`); `uid` (not 0)
    /// comes back in its events.
    fn create_id(&self, uid: u64, port_space: u16) -> Result<CmId>;

    /// Destroys an id with its connection; its queued events go with it.
    fn destroy_id(&self, id: CmId) -> Result<()>;

    /// Binds an id to a host address.
    fn bind(&self, id: CmId, addr: &SocketAddr) -> Result<()>;

    /// Starts resolving `dst` from `src` (`None`: the host's route picks); ADDR_RESOLVED or
    /// ADDR_ERROR follows.
    fn resolve_addr(
        &self,
        id: CmId,
        src: Option<&SocketAddr>,
        dst: &SocketAddr,
        timeout_ms: u32,
    ) -> Result<()>;

    /// Starts resolving the route; ROUTE_RESOLVED or ROUTE_ERROR follows.
    fn resolve_route(&self, id: CmId, timeout_ms: u32) -> Result<()>;

    /// The id's addresses.
    fn query_addr(&self, id: CmId) -> Result<CmAddresses>;

    /// Listens on the id's bound address.
    fn listen(&self, id: CmId, backlog: u32) -> Result<()>;

    /// Sends a connect request.
    fn connect(&self, id: CmId, params: &ConnParams) -> Result<()>;

    /// Accepts a connect request with `params` (the id takes `uid`), or with `None` accepts
    /// the peer's reply and establishes the connection.
    fn accept(&self, id: CmId, uid: u64, params: Option<&ConnParams>) -> Result<()>;

    /// Rejects a connect request (or reply).
    fn reject(&self, id: CmId, reason: u8, private_data: &PrivateData) -> Result<()>;

    /// Disconnects.
    fn disconnect(&self, id: CmId) -> Result<()>;

    /// The attributes and mask that move the id's QP to `state`, in host terms; mask bits the
    /// spec does not know stay set for the caller to judge.
    fn init_qp_attr(&self, id: CmId, state: QpState) -> Result<(QpAttr, QpAttrMask)>;

    /// The next event of any id, `None` when none is queued.
    fn get_event(&self) -> Result<Option<CmEvent>>;

    /// Sets an option of the id.
    fn set_option(&self, id: CmId, option: CmOption) -> Result<()>;

    /// Tells the CM of a QP event (`IBV_EVENT_COMM_EST` is the one it acts on).
    fn notify(&self, id: CmId, event: u32) -> Result<()>;
}

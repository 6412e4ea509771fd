//! Wire structs of the connection manager's commands (spec §7.5, `VRDMA_F_CM`), beside the
//! other commands' in [`crate::wire`].

use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};

use crate::wire::{AhAttr, QpAttr};
use crate::{Le16, Le32};

/// Bytes of private data a CM message may carry at most (the kernel's `RDMA_MAX_PRIVATE_DATA`;
/// the CM's per-message limits are smaller).
pub const CM_MAX_PRIVATE_DATA: usize = 256;

/// `cm_addr.family` values.
pub mod cm_family {
    /// No address (a resolution whose source the device picks).
    pub const NONE: u16 = 0;
    /// IPv4 (`addr` holds `::ffff:a.b.c.d`).
    pub const INET: u16 = 2;
    /// IPv6.
    pub const INET6: u16 = 10;
}

/// Linux's `sockaddr_in`/`sockaddr_in6` in a `sockaddr_storage`, the one conversion from and to
/// socket addresses for both sides: the back-end's kernel ABI (`__kernel_sockaddr_storage`)
/// and the guest library's C API (`struct sockaddr`) carry the same bytes. Families are
/// [`cm_family`]'s numbers, which are Linux's `AF_INET` and `AF_INET6`.
pub mod sockaddr {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

    use crate::cm::cm_family;

    /// `sizeof(struct sockaddr_storage)`.
    pub const STORAGE_SIZE: usize = 128;
    /// `sizeof(struct sockaddr_in)`.
    pub const IN_SIZE: usize = 16;
    /// `sizeof(struct sockaddr_in6)`.
    pub const IN6_SIZE: usize = 28;

    /// `addr` as a `sockaddr_in`/`sockaddr_in6` at the start of a storage, with its size.
    pub fn encode(addr: &SocketAddr) -> ([u8; STORAGE_SIZE], usize) {
        let mut storage = [0u8; STORAGE_SIZE];
        let size = match addr {
            SocketAddr::V4(v4) => {
                storage[0..2].copy_from_slice(&cm_family::INET.to_ne_bytes());
                storage[2..4].copy_from_slice(&v4.port().to_be_bytes());
                storage[4..8].copy_from_slice(&v4.ip().octets());
                IN_SIZE
            }
            SocketAddr::V6(v6) => {
                storage[0..2].copy_from_slice(&cm_family::INET6.to_ne_bytes());
                storage[2..4].copy_from_slice(&v6.port().to_be_bytes());
                storage[4..8].copy_from_slice(&v6.flowinfo().to_be_bytes());
                storage[8..24].copy_from_slice(&v6.ip().octets());
                storage[24..28].copy_from_slice(&v6.scope_id().to_ne_bytes());
                IN6_SIZE
            }
        };
        (storage, size)
    }

    /// The address in `bytes` (`len` of them valid; at least the family's size); `None` for
    /// another family (AF_IB) or too few bytes.
    pub fn decode(bytes: &[u8], len: usize) -> Option<SocketAddr> {
        let bytes = bytes.get(..len)?;
        let family = u16::from_ne_bytes([*bytes.first()?, *bytes.get(1)?]);
        let word = |at: usize| -> Option<[u8; 4]> { bytes.get(at..at + 4)?.try_into().ok() };
        let port = u16::from_be_bytes([*bytes.get(2)?, *bytes.get(3)?]);
        match family {
            cm_family::INET if len >= IN_SIZE => {
                Some(SocketAddrV4::new(Ipv4Addr::from(word(4)?), port).into())
            }
            cm_family::INET6 if len >= IN6_SIZE => {
                let ip: [u8; 16] = bytes[8..24].try_into().ok()?;
                Some(
                    SocketAddrV6::new(
                        Ipv6Addr::from(ip),
                        port,
                        u32::from_be_bytes(word(4)?),
                        u32::from_ne_bytes(word(24)?),
                    )
                    .into(),
                )
            }
            _ => None,
        }
    }
}

/// Port spaces of CM_CREATE_ID.
pub mod cm_port_space {
    /// Connected (RC) ids, the kernel's `RDMA_PS_TCP`.
    pub const TCP: u16 = 0x0106;
    /// Datagram (UD) ids, the kernel's `RDMA_PS_UDP`.
    pub const UDP: u16 = 0x0111;
}

/// CM_SET_OPTION names (the kernel's `RDMA_OPTION_ID_*`).
pub mod cm_option {
    /// Type of service (a traffic class, 0..=255).
    pub const TOS: u32 = 0;
    /// Reuse of a bound address (0 or 1).
    pub const REUSEADDR: u32 = 1;
    /// IPv6 ids bind IPv6 only (0 or 1).
    pub const AFONLY: u32 = 2;
    /// The QP's local ACK timeout (0..=31).
    pub const ACK_TIMEOUT: u32 = 3;
    /// The last name defined.
    pub const LAST: u32 = ACK_TIMEOUT;
}

/// rdma_cm event numbers (`CmEventResp::event`, the `detail` of a CM_EVENT): the kernel's and
/// librdmacm's `enum rdma_cm_event_type`.
pub mod cm_event {
    /// An address resolution finished.
    pub const ADDR_RESOLVED: u32 = 0;
    /// An address resolution failed.
    pub const ADDR_ERROR: u32 = 1;
    /// A route resolution finished.
    pub const ROUTE_RESOLVED: u32 = 2;
    /// A route resolution failed.
    pub const ROUTE_ERROR: u32 = 3;
    /// A peer asks to connect (on a listener; the event names a new id).
    pub const CONNECT_REQUEST: u32 = 4;
    /// The peer accepted; move the QP to RTS and establish (CM_ACCEPT without a QP).
    pub const CONNECT_RESPONSE: u32 = 5;
    /// The connection could not be set up.
    pub const CONNECT_ERROR: u32 = 6;
    /// The peer is unreachable.
    pub const UNREACHABLE: u32 = 7;
    /// The peer rejected (status: the reject reason).
    pub const REJECTED: u32 = 8;
    /// The connection is up.
    pub const ESTABLISHED: u32 = 9;
    /// The connection is down.
    pub const DISCONNECTED: u32 = 10;
    /// The device went away.
    pub const DEVICE_REMOVAL: u32 = 11;
    /// A multicast join finished (not produced: no joins on the wire).
    pub const MULTICAST_JOIN: u32 = 12;
    /// A multicast join failed (not produced).
    pub const MULTICAST_ERROR: u32 = 13;
    /// The id's address changed.
    pub const ADDR_CHANGE: u32 = 14;
    /// The connection left time-wait: its QP may be reused.
    pub const TIMEWAIT_EXIT: u32 = 15;
}

/// A read/atomic depth in `cm_conn_param` or CM_MOVE_QP that leaves the host CM's value
/// (librdmacm's `RDMA_MAX_RESP_RES` and `RDMA_MAX_INIT_DEPTH`).
pub const CM_HOST_DEPTH: u8 = 0xff;

/// `CmEventResp::event` when no event is pending.
pub const CM_EVENT_NONE: u32 = u32::MAX;
/// The last rdma_cm event number (`TIMEWAIT_EXIT`).
pub const CM_EVENT_LAST: u32 = cm_event::TIMEWAIT_EXIT;

/// Bytes of a CM_EVENT notice that carries its event whole (`VRDMA_F_CM_EVENT_INLINE`): the
/// 16-byte notice, then the [`CmEventResp`] CM_GET_EVENT would have answered.
pub const CM_EVENT_INLINE_SIZE: usize =
    crate::event::EVENT_SIZE + std::mem::size_of::<CmEventResp>();

wire_struct! {
    /// A socket address (`cm_addr`, 32 bytes).
    pub struct CmAddr {
        /// [`cm_family`].
        pub family: Le16,
        /// Port (host order on the wire, like every field).
        pub port: Le16,
        /// IPv6 flow label.
        pub flowinfo: Le32,
        /// The address, IPv4 mapped.
        pub addr: [u8; 16],
        /// The guest's interface number of a link-local address (opaque to the device).
        pub scope_id: Le32,
        /// Zero.
        pub reserved: Le32,
    }
}
assert_layout!(CmAddr, 32, family @ 0, port @ 2, flowinfo @ 4, addr @ 8, scope_id @ 24,
    reserved @ 28);

impl CmAddr {
    /// No address.
    pub const NONE: CmAddr = CmAddr {
        family: Le16::ZERO,
        port: Le16::ZERO,
        flowinfo: Le32::ZERO,
        addr: [0; 16],
        scope_id: Le32::ZERO,
        reserved: Le32::ZERO,
    };

    /// `addr` on the wire: IPv4 mapped, an IPv6 flow label and scope id kept.
    pub fn from_socket_addr(addr: &SocketAddr) -> CmAddr {
        let (family, ip, flowinfo, scope_id) = match addr {
            SocketAddr::V4(v4) => (cm_family::INET, v4.ip().to_ipv6_mapped(), 0, 0),
            SocketAddr::V6(v6) => (cm_family::INET6, *v6.ip(), v6.flowinfo(), v6.scope_id()),
        };
        CmAddr {
            family: Le16::new(family),
            port: Le16::new(addr.port()),
            flowinfo: Le32::new(flowinfo),
            addr: ip.octets(),
            scope_id: Le32::new(scope_id),
            reserved: Le32::ZERO,
        }
    }

    /// The socket address, `None` for the `NONE` family (or another the wire does not know).
    /// An IPv4 family gives the IPv4 address of `::ffff:a.b.c.d`; a decoded request was
    /// checked to carry one (`check_cm_addr`).
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        let ip = Ipv6Addr::from(self.addr);
        let port = self.port.get();
        match self.family.get() {
            cm_family::INET => Some(SocketAddr::new(ip.to_canonical(), port)),
            cm_family::INET6 => {
                Some(SocketAddrV6::new(ip, port, self.flowinfo.get(), self.scope_id.get()).into())
            }
            _ => None,
        }
    }
}

wire_struct! {
    /// CM_CREATE_ID body.
    pub struct CmCreateIdReq {
        /// [`cm_port_space`].
        pub port_space: Le16,
        /// Zero.
        pub reserved: [u8; 6],
    }
}
assert_layout!(CmCreateIdReq, 8, port_space @ 0, reserved @ 2);

wire_struct! {
    /// CM_DESTROY_ID response body.
    pub struct CmDestroyIdResp {
        /// Events of the id delivered to the driver by CM_GET_EVENT.
        pub events_delivered: Le32,
        /// Zero.
        pub reserved: Le32,
    }
}
assert_layout!(CmDestroyIdResp, 8, events_delivered @ 0, reserved @ 4);

wire_struct! {
    /// CM_BIND body.
    pub struct CmBindReq {
        /// Id handle.
        pub id: Le32,
        /// Zero.
        pub reserved: Le32,
        /// The address (the guest's; see spec §7.5 for the wildcard).
        pub addr: CmAddr,
    }
}
assert_layout!(CmBindReq, 40, id @ 0, reserved @ 4, addr @ 8);

wire_struct! {
    /// CM_RESOLVE_ADDR body.
    pub struct CmResolveAddrReq {
        /// Id handle.
        pub id: Le32,
        /// How long the resolution may take.
        pub timeout_ms: Le32,
        /// Source (family `NONE`: the device picks the guest's).
        pub src: CmAddr,
        /// Destination.
        pub dst: CmAddr,
    }
}
assert_layout!(CmResolveAddrReq, 72, id @ 0, timeout_ms @ 4, src @ 8, dst @ 40);

wire_struct! {
    /// CM_RESOLVE_ROUTE body.
    pub struct CmResolveRouteReq {
        /// Id handle.
        pub id: Le32,
        /// How long the resolution may take.
        pub timeout_ms: Le32,
    }
}
assert_layout!(CmResolveRouteReq, 8, id @ 0, timeout_ms @ 4);

wire_struct! {
    /// CM_LISTEN body.
    pub struct CmListenReq {
        /// Id handle (bound by CM_BIND).
        pub id: Le32,
        /// Connect requests that may wait for CM_GET_EVENT (the device caps it).
        pub backlog: Le32,
    }
}
assert_layout!(CmListenReq, 8, id @ 0, backlog @ 4);

wire_struct! {
    /// Connection parameters of CM_CONNECT and CM_ACCEPT (`cm_conn_param`).
    pub struct CmConnParam {
        /// Bytes of `private_data` used.
        pub private_data_len: u8,
        /// RDMA reads/atomics the peer may have outstanding towards this side.
        pub responder_resources: u8,
        /// RDMA reads/atomics this side may have outstanding.
        pub initiator_depth: u8,
        /// Flow control (0 or 1).
        pub flow_control: u8,
        /// Transport retries (0..=7).
        pub retry_count: u8,
        /// RNR retries (0..=7, 7: infinite).
        pub rnr_retry_count: u8,
        /// [`cm_conn_flags`].
        pub flags: u8,
        /// Zero.
        pub reserved: u8,
        /// Private data for the peer.
        pub private_data: [u8; CM_MAX_PRIVATE_DATA],
    }
}
assert_layout!(CmConnParam, 264, private_data_len @ 0, responder_resources @ 1,
    initiator_depth @ 2, flow_control @ 3, retry_count @ 4, rnr_retry_count @ 5,
    flags @ 6, reserved @ 7, private_data @ 8);

/// Flags of a `cm_conn_param`.
pub mod cm_conn_flags {
    /// CM_ACCEPT of an RC id, with `VRDMA_F_CM_MOVES_QP`: before anything goes to the peer the
    /// device moves the QP (the one named; without one, the QP of the id's CM_CONNECT) to
    /// INIT, RTR and RTS with the attributes CM_INIT_QP_ATTR answers, RTR's
    /// `max_dest_rd_atomic` set to the parameters' `responder_resources` and RTS's
    /// `max_rd_atomic` to their `initiator_depth` unless 0xff, each step a MODIFY_QP of the
    /// guest's (spec §7.5).
    pub const MOVE_QP: u8 = 1;
    /// Every flag defined.
    pub const ALL: u8 = MOVE_QP;
}

wire_struct! {
    /// CM_CONNECT and CM_ACCEPT body.
    pub struct CmConnReq {
        /// Id handle.
        pub id: Le32,
        /// The guest's QP the connection is for (CM_ACCEPT: 0 establishes after a reply).
        pub qp: Le32,
        /// The parameters.
        pub param: CmConnParam,
    }
}
assert_layout!(CmConnReq, 272, id @ 0, qp @ 4, param @ 8);

wire_struct! {
    /// CM_REJECT body.
    pub struct CmRejectReq {
        /// Id handle.
        pub id: Le32,
        /// 0 or 28 (consumer-defined) or 35 (vendor option not supported).
        pub reason: u8,
        /// Bytes of `private_data` used.
        pub private_data_len: u8,
        /// Zero.
        pub reserved: [u8; 2],
        /// Private data for the peer.
        pub private_data: [u8; CM_MAX_PRIVATE_DATA],
    }
}
assert_layout!(CmRejectReq, 264, id @ 0, reason @ 4, private_data_len @ 5, reserved @ 6,
    private_data @ 8);

wire_struct! {
    /// CM_INIT_QP_ATTR body.
    pub struct CmInitQpAttrReq {
        /// Id handle.
        pub id: Le32,
        /// The state to move the id's QP to ([`crate::verbs::QpState`]).
        pub qp_state: Le32,
    }
}
assert_layout!(CmInitQpAttrReq, 8, id @ 0, qp_state @ 4);

wire_struct! {
    /// CM_MOVE_QP body: one step of what CM_INIT_QP_ATTR and MODIFY_QP do, in one command.
    pub struct CmMoveQpReq {
        /// Id handle.
        pub id: Le32,
        /// The guest's QP handle.
        pub qp: Le32,
        /// INIT, RTR or RTS ([`crate::verbs::QpState`]).
        pub qp_state: Le32,
        /// RTR's `max_dest_rd_atomic`; [`CM_HOST_DEPTH`]: the host CM's.
        pub responder_resources: u8,
        /// RTS's `max_rd_atomic`; [`CM_HOST_DEPTH`]: the host CM's.
        pub initiator_depth: u8,
        /// Zero.
        pub reserved: Le16,
    }
}
assert_layout!(CmMoveQpReq, 16, id @ 0, qp @ 4, qp_state @ 8, responder_resources @ 12,
    initiator_depth @ 13, reserved @ 14);

wire_struct! {
    /// CM_INIT_QP_ATTR response body: what MODIFY_QP takes, in the guest's terms.
    pub struct CmInitQpAttrResp {
        /// [`crate::verbs::QpAttrMask`] bits.
        pub attr_mask: Le32,
        /// Zero.
        pub reserved: Le32,
        /// The attributes.
        pub attr: QpAttr,
    }
}
assert_layout!(CmInitQpAttrResp, 152, attr_mask @ 0, reserved @ 4, attr @ 8);

wire_struct! {
    /// CM_GET_EVENT response body (`cm_event`).
    pub struct CmEventResp {
        /// The id the event is about (a connect request: the new id).
        pub id: Le32,
        /// A connect request's listener; else zero.
        pub listen_id: Le32,
        /// The rdma_cm event number (0..=[`CM_EVENT_LAST`]), or [`CM_EVENT_NONE`].
        pub event: Le32,
        /// 0, a negative errno (two's complement), or a reject's reason.
        pub status: Le32,
        /// The peer's QP number (connection and UD events).
        pub qp_num: Le32,
        /// The peer's Q_Key (UD events).
        pub qkey: Le32,
        /// Bytes of `private_data` used.
        pub private_data_len: u8,
        /// The peer's `responder_resources` (connection events).
        pub responder_resources: u8,
        /// The peer's `initiator_depth`.
        pub initiator_depth: u8,
        /// The peer's flow control.
        pub flow_control: u8,
        /// The peer's retry count.
        pub retry_count: u8,
        /// The peer's RNR retry count.
        pub rnr_retry_count: u8,
        /// Whether the peer's QP uses an SRQ.
        pub srq: u8,
        /// Zero.
        pub reserved: u8,
        /// The peer's address vector (UD events), in the guest's terms.
        pub ah_attr: AhAttr,
        /// The id's source address.
        pub src: CmAddr,
        /// The id's destination address.
        pub dst: CmAddr,
        /// The peer's private data.
        pub private_data: [u8; CM_MAX_PRIVATE_DATA],
    }
}
assert_layout!(CmEventResp, 384, id @ 0, listen_id @ 4, event @ 8, status @ 12, qp_num @ 16,
    qkey @ 20, private_data_len @ 24, responder_resources @ 25, initiator_depth @ 26,
    flow_control @ 27, retry_count @ 28, rnr_retry_count @ 29, srq @ 30, reserved @ 31,
    ah_attr @ 32, src @ 64, dst @ 96, private_data @ 128);

wire_struct! {
    /// CM_SET_OPTION body.
    pub struct CmSetOptionReq {
        /// Id handle.
        pub id: Le32,
        /// [`cm_option`].
        pub name: Le32,
        /// The value.
        pub value: Le32,
        /// Zero.
        pub reserved: Le32,
    }
}
assert_layout!(CmSetOptionReq, 16, id @ 0, name @ 4, value @ 8, reserved @ 12);

wire_struct! {
    /// CM_NOTIFY body.
    pub struct CmNotifyReq {
        /// Id handle.
        pub id: Le32,
        /// The QP event to tell the CM of (`IBV_EVENT_COMM_EST` is the one it acts on).
        pub event: Le32,
    }
}
assert_layout!(CmNotifyReq, 8, id @ 0, event @ 4);

wire_struct! {
    /// CM_QUERY_ADDR response body.
    pub struct CmQueryAddrResp {
        /// The id's source address.
        pub src: CmAddr,
        /// The id's destination address.
        pub dst: CmAddr,
        /// The guest's node GUID (the one QUERY_DEVICE reports).
        pub node_guid: [u8; 8],
        /// The guest's port (1).
        pub port_num: u8,
        /// Zero.
        pub reserved: u8,
        /// P_Key.
        pub pkey: Le16,
        /// Zero.
        pub reserved2: Le32,
    }
}
assert_layout!(CmQueryAddrResp, 80, src @ 0, dst @ 32, node_guid @ 64, port_num @ 72,
    reserved @ 73, pkey @ 74, reserved2 @ 76);

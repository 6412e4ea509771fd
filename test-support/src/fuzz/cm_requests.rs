//! Connection-manager requests built from fuzz input (spec §7.5): addresses from a small set
//! around the run's guests (their own, each other's, the host's `fe80::1`, wildcards,
//! loopback, link-local with any scope id, IPv4 and IPv4-mapped forms) and a few ports, so
//! that a listener and a connect from the other guest meet often; the other fields mostly
//! valid and now and then anything. Bodies are the spec's wire structs (`vrdma_spec::cm`).

use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};

use vrdma_spec::cm::*;
use vrdma_spec::{Le16, Le32, Opcode};
use zerocopy::{FromZeros, IntoBytes};

use super::bytes::ByteReader;
use super::requests::request;

/// Ports ids bind and aim at: the two the fuzzer's listeners use (the first twice as often),
/// and a privileged one.
pub const PORTS: [u16; 4] = [7471, 7471, 7472, 80];

/// Addresses worth naming besides the guests' own: the host's, wildcards, loopback,
/// multicast, an unused link-local one, IPv4 and IPv4-mapped, another machine's, and both
/// guests' addresses whether or not they are tenants in the run.
const OTHERS: [&str; 12] = [
    "fe80::1",
    "::",
    "0.0.0.0",
    "::1",
    "127.0.0.1",
    "ff02::1",
    "fe80::a:1",
    "::ffff:192.0.2.1",
    "192.0.2.1",
    "fd00::99:1",
    "fd00::a:1",
    "fd00::b:1",
];

/// The two addresses a guest's CM requests aim at most: its own (what it may bind) and the
/// other guest's (where the other's listeners are).
#[derive(Debug, Clone, Copy)]
pub struct CmAims {
    /// The address this guest may bind: its own as a tenant, else the host's.
    pub own: IpAddr,
    /// The other guest's.
    pub peer: IpAddr,
}

/// A port: mostly one of [`PORTS`], sometimes 0 (the host picks) or anything.
pub fn port(r: &mut ByteReader<'_>) -> u16 {
    match r.below(10) {
        0..=6 => r.pick(&PORTS),
        7 => 0,
        _ => r.u16(),
    }
}

/// A scope id for a link-local address: the guest's interface numbers are its own business
/// (the device rescopes to the RDMA netdev), so any value goes.
fn scope(r: &mut ByteReader<'_>) -> u32 {
    match r.below(6) {
        0 => 0,
        1..=3 => 1 + r.below(8),
        _ => r.u32(),
    }
}

/// `ip` and `port` on the wire: an IPv6 link-local address with a scope id, an IPv4 address as
/// IPv4 or (sometimes) IPv4-mapped IPv6, and now and then a broken family or field.
pub fn wire(r: &mut ByteReader<'_>, ip: IpAddr, port: u16) -> CmAddr {
    let addr: SocketAddr = match ip {
        IpAddr::V4(v4) if r.chance(25) => SocketAddrV6::new(v4.to_ipv6_mapped(), port, 0, 0).into(),
        IpAddr::V4(v4) => SocketAddr::new(v4.into(), port),
        IpAddr::V6(v6) => {
            let scope = if v6.is_unicast_link_local() || r.chance(3) {
                scope(r)
            } else {
                0
            };
            SocketAddrV6::new(v6, port, 0, scope).into()
        }
    };
    let mut wire = CmAddr::from_socket_addr(&addr);
    if r.chance(3) {
        let any = r.u16();
        wire.family = Le16::new(r.pick(&[0, 1, 27, any]));
    }
    if r.chance(3) {
        wire.flowinfo = Le32::new(r.u32());
    }
    if r.chance(2) {
        wire.reserved = Le32::new(r.u32());
    }
    wire
}

/// An address: `first` most often, then `second`, then one of the others or any bytes.
pub fn address(r: &mut ByteReader<'_>, first: IpAddr, second: IpAddr) -> CmAddr {
    let ip = match r.below(20) {
        0..=7 => first,
        8..=11 => second,
        12..=18 => r.pick(&OTHERS).parse::<IpAddr>().expect("a valid address"),
        _ => {
            let mut bytes = [0u8; 16];
            bytes.iter_mut().for_each(|b| *b = r.u8());
            Ipv6Addr::from(bytes).into()
        }
    };
    let port = port(r);
    wire(r, ip, port)
}

/// CM_CREATE_ID: mostly RC, sometimes UD, now and then another port space.
pub fn create_id(r: &mut ByteReader<'_>) -> Vec<u8> {
    let port_space = match r.below(20) {
        0..=13 => cm_port_space::TCP,
        14..=18 => cm_port_space::UDP,
        _ => r.u16(),
    };
    let mut body = CmCreateIdReq {
        port_space: Le16::new(port_space),
        reserved: [0; 6],
    };
    if r.chance(2) {
        body.reserved[0] = 1;
    }
    request(Opcode::CmCreateId, body.as_bytes())
}

/// CM_BIND of `id` to `addr`.
pub fn bind(id: u32, addr: CmAddr) -> Vec<u8> {
    let body = CmBindReq {
        id: Le32::new(id),
        reserved: Le32::ZERO,
        addr,
    };
    request(Opcode::CmBind, body.as_bytes())
}

/// A timeout: mostly a usual one.
fn timeout(r: &mut ByteReader<'_>) -> Le32 {
    Le32::new(if r.chance(90) { 2000 } else { r.u32() })
}

/// CM_RESOLVE_ADDR of `id` from `src` (`None`: the device picks) to `dst`.
pub fn resolve_addr(r: &mut ByteReader<'_>, id: u32, src: Option<CmAddr>, dst: CmAddr) -> Vec<u8> {
    let body = CmResolveAddrReq {
        id: Le32::new(id),
        timeout_ms: timeout(r),
        src: src.unwrap_or(CmAddr::NONE),
        dst,
    };
    request(Opcode::CmResolveAddr, body.as_bytes())
}

/// CM_RESOLVE_ROUTE of `id`.
pub fn resolve_route(r: &mut ByteReader<'_>, id: u32) -> Vec<u8> {
    let body = CmResolveRouteReq {
        id: Le32::new(id),
        timeout_ms: timeout(r),
    };
    request(Opcode::CmResolveRoute, body.as_bytes())
}

/// CM_LISTEN on `id`: small backlogs, 0 and the cap, and anything.
pub fn listen(r: &mut ByteReader<'_>, id: u32) -> Vec<u8> {
    let backlog = match r.below(8) {
        0..=4 => 1 + r.below(4),
        5 => r.pick(&[0, 128, 129]),
        _ => r.u32(),
    };
    let body = CmListenReq {
        id: Le32::new(id),
        backlog: Le32::new(backlog),
    };
    request(Opcode::CmListen, body.as_bytes())
}

/// Private data: mostly short (a request carries 56 bytes at most), sometimes up to the
/// wire's 255.
fn private_data(r: &mut ByteReader<'_>, into: &mut [u8; CM_MAX_PRIVATE_DATA]) -> u8 {
    let len = match r.below(10) {
        0..=3 => 0,
        4..=7 => r.below(57) as u8,
        _ => r.u8(),
    };
    for b in &mut into[..usize::from(len.min(16))] {
        *b = r.u8();
    }
    len
}

/// CM_CONNECT or CM_ACCEPT (`op`) of `id` with `qp` (CM_ACCEPT: 0 establishes after a reply).
pub fn conn(r: &mut ByteReader<'_>, op: Opcode, id: u32, qp: u32) -> Vec<u8> {
    let mut body = CmConnReq::new_zeroed();
    body.id = Le32::new(id);
    body.qp = Le32::new(qp);
    let p = &mut body.param;
    p.private_data_len = private_data(r, &mut p.private_data);
    let valid = r.chance(95);
    let small = |r: &mut ByteReader<'_>, max: u32| {
        if valid {
            r.below(max + 1) as u8
        } else {
            r.u8()
        }
    };
    p.responder_resources = small(r, 2);
    p.initiator_depth = small(r, 2);
    p.flow_control = small(r, 1);
    p.retry_count = small(r, 7);
    p.rnr_retry_count = small(r, 7);
    // The device moving the QP itself (an accept's own; on a connect the decoder refuses it),
    // or any flags.
    if (op == Opcode::CmAccept || !valid) && r.chance(30) {
        p.flags = if valid {
            cm_conn_flags::MOVE_QP
        } else {
            r.u8()
        };
    }
    if !valid && r.chance(30) {
        p.reserved = 1;
    }
    request(op, body.as_bytes())
}

/// CM_REJECT of `id`: a reason the wire allows, mostly, and private data.
pub fn reject(r: &mut ByteReader<'_>, id: u32) -> Vec<u8> {
    let mut body = CmRejectReq::new_zeroed();
    body.id = Le32::new(id);
    body.reason = if r.chance(90) {
        r.pick(&vrdma_spec::control::CM_REJECT_REASONS)
    } else {
        r.u8()
    };
    body.private_data_len = private_data(r, &mut body.private_data);
    request(Opcode::CmReject, body.as_bytes())
}

/// CM_INIT_QP_ATTR of `id`: mostly INIT, RTR or RTS.
pub fn init_qp_attr(r: &mut ByteReader<'_>, id: u32) -> Vec<u8> {
    let state = match r.below(10) {
        0..=7 => 1 + r.below(3),
        8 => r.below(7),
        _ => r.u32(),
    };
    let body = CmInitQpAttrReq {
        id: Le32::new(id),
        qp_state: Le32::new(state),
    };
    request(Opcode::CmInitQpAttr, body.as_bytes())
}

/// CM_MOVE_QP of `qp` through `id` to `state` (when `None`: mostly INIT, RTR or RTS), with
/// depths mostly the host's or small, and sometimes a reserved field set.
pub fn move_qp(r: &mut ByteReader<'_>, id: u32, qp: u32, state: Option<u32>) -> Vec<u8> {
    let state = state.unwrap_or_else(|| match r.below(10) {
        0..=7 => 1 + r.below(3),
        8 => r.below(7),
        _ => r.u32(),
    });
    let mut depth = || if r.chance(50) { 0xff } else { r.u8() % 20 };
    let (responder_resources, initiator_depth) = (depth(), depth());
    let body = CmMoveQpReq {
        id: Le32::new(id),
        qp: Le32::new(qp),
        qp_state: Le32::new(state),
        responder_resources,
        initiator_depth,
        reserved: Le16::new(if r.chance(3) { 1 } else { 0 }),
    };
    request(Opcode::CmMoveQp, body.as_bytes())
}

/// CM_SET_OPTION on `id`: the four names with values mostly in range.
pub fn set_option(r: &mut ByteReader<'_>, id: u32) -> Vec<u8> {
    let name = if r.chance(90) {
        r.below(cm_option::LAST + 1)
    } else {
        r.u32()
    };
    let value = match (name, r.chance(90)) {
        (cm_option::TOS, true) => r.pick(&[0, 32, 106, 255]),
        (cm_option::REUSEADDR | cm_option::AFONLY, true) => r.below(2),
        (cm_option::ACK_TIMEOUT, true) => r.below(32),
        _ => r.u32(),
    };
    let body = CmSetOptionReq {
        id: Le32::new(id),
        name: Le32::new(name),
        value: Le32::new(value),
        reserved: Le32::ZERO,
    };
    request(Opcode::CmSetOption, body.as_bytes())
}

/// CM_NOTIFY of `id`: COMM_EST mostly.
pub fn notify(r: &mut ByteReader<'_>, id: u32) -> Vec<u8> {
    let event = if r.chance(80) { 6 } else { r.u32() };
    let body = CmNotifyReq {
        id: Le32::new(id),
        event: Le32::new(event),
    };
    request(Opcode::CmNotify, body.as_bytes())
}

//! Connection-manager commands as a guest's driver sends them (spec §7.5), for tests that
//! drive a [`TestGuest`] over the fake CM or a real rdma_cm: each step checks its status and
//! answers the body, and [`next_cm_event`] runs the device's CM event pump (as the fast
//! worker would when the host's CM fd polls readable) until CM_GET_EVENT has something.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use vrdma_backend::guest_device::cm_events::CM_FD;
use vrdma_backend::vhost_device::handler::DeviceHandler;
use vrdma_spec::cm::*;
use vrdma_spec::control::{CmRequest, CmResponseBody};
use vrdma_spec::verbs::{QpAttrMask, QpState};
use vrdma_spec::wire::{HandleReq, ModifyQpReq, QueryQpReq};
use vrdma_spec::{ControlRequest, Event, EventType, Le16, Le32, ResponseBody, Status};
use zerocopy::FromZeros;

use super::device::FakeDevice;
use super::harness::{handle, qp_req, TestGuest, RAM_BASE};

/// How long [`next_cm_event`] waits for a real CM at most.
pub const CM_EVENT_LIMIT: Duration = Duration::from_secs(20);

fn cm(request: CmRequest) -> ControlRequest<'static> {
    ControlRequest::Cm(request)
}

/// CM_CREATE_ID in `port_space`: the id's handle.
pub fn create_id(guest: &TestGuest, port_space: u16) -> u32 {
    match guest.ok(cm(CmRequest::CreateId(CmCreateIdReq {
        port_space: Le16::new(port_space),
        reserved: [0; 6],
    }))) {
        ResponseBody::Cm(CmResponseBody::CreateId(h)) => h.handle.get(),
        other => panic!("CM_CREATE_ID answered {other:?}"),
    }
}

/// CM_DESTROY_ID: the events delivered.
pub fn destroy_id(guest: &TestGuest, id: u32) -> u32 {
    match guest.ok(cm(CmRequest::DestroyId(handle(id)))) {
        ResponseBody::Cm(CmResponseBody::DestroyId(r)) => r.events_delivered.get(),
        other => panic!("CM_DESTROY_ID answered {other:?}"),
    }
}

/// CM_BIND's status.
pub fn bind(guest: &TestGuest, id: u32, addr: &str) -> Status {
    let addr: SocketAddr = addr.parse().unwrap();
    guest.status(cm(CmRequest::Bind(CmBindReq {
        id: Le32::new(id),
        reserved: Le32::ZERO,
        addr: CmAddr::from_socket_addr(&addr),
    })))
}

/// CM_RESOLVE_ADDR's status, from `src` (`None`: the device picks) to `dst`.
pub fn resolve_addr(guest: &TestGuest, id: u32, src: Option<&str>, dst: &str) -> Status {
    let wire = |a: &str| CmAddr::from_socket_addr(&a.parse().unwrap());
    guest.status(cm(CmRequest::ResolveAddr(CmResolveAddrReq {
        id: Le32::new(id),
        timeout_ms: Le32::new(2000),
        src: src.map_or(CmAddr::NONE, wire),
        dst: wire(dst),
    })))
}

/// CM_RESOLVE_ROUTE's status.
pub fn resolve_route(guest: &TestGuest, id: u32) -> Status {
    guest.status(cm(CmRequest::ResolveRoute(CmResolveRouteReq {
        id: Le32::new(id),
        timeout_ms: Le32::new(2000),
    })))
}

/// CM_LISTEN's status.
pub fn listen(guest: &TestGuest, id: u32, backlog: u32) -> Status {
    guest.status(cm(CmRequest::Listen(CmListenReq {
        id: Le32::new(id),
        backlog: Le32::new(backlog),
    })))
}

/// Connection parameters with `private_data`, one read/atomic each way, 7 retries.
pub fn conn_param(private_data: &[u8]) -> CmConnParam {
    let mut p = CmConnParam::new_zeroed();
    p.private_data_len = private_data.len() as u8;
    p.private_data[..private_data.len()].copy_from_slice(private_data);
    p.responder_resources = 1;
    p.initiator_depth = 1;
    p.retry_count = 7;
    p.rnr_retry_count = 7;
    p
}

/// CM_CONNECT's status.
pub fn connect(guest: &TestGuest, id: u32, qp: u32, private_data: &[u8]) -> Status {
    guest.status(cm(CmRequest::Connect(CmConnReq {
        id: Le32::new(id),
        qp: Le32::new(qp),
        param: conn_param(private_data),
    })))
}

/// CM_ACCEPT's status (`qp` 0: the establishing accept after a reply).
pub fn accept(guest: &TestGuest, id: u32, qp: u32, private_data: &[u8]) -> Status {
    guest.status(cm(CmRequest::Accept(CmConnReq {
        id: Le32::new(id),
        qp: Le32::new(qp),
        param: conn_param(private_data),
    })))
}

/// CM_ACCEPT's status with [`cm_conn_flags::MOVE_QP`]: the device moves the QP (`qp`, or
/// with 0 the QP of the id's connect) through INIT, RTR and RTS first; `depths` are the
/// parameters' responder resources and initiator depth (0xff: the host's).
pub fn accept_moving(guest: &TestGuest, id: u32, qp: u32, depths: (u8, u8)) -> Status {
    let mut param = conn_param(b"");
    param.flags = cm_conn_flags::MOVE_QP;
    (param.responder_resources, param.initiator_depth) = depths;
    guest.status(cm(CmRequest::Accept(CmConnReq {
        id: Le32::new(id),
        qp: Le32::new(qp),
        param,
    })))
}

/// CM_MOVE_QP's status: `qp` moved to `state` through `id`; `depths` are RTR's responder
/// resources and RTS's initiator depth (0xff: the host's).
pub fn move_qp(guest: &TestGuest, id: u32, qp: u32, state: QpState, depths: (u8, u8)) -> Status {
    guest.status(cm(CmRequest::MoveQp(CmMoveQpReq {
        id: Le32::new(id),
        qp: Le32::new(qp),
        qp_state: Le32::new(state as u32),
        responder_resources: depths.0,
        initiator_depth: depths.1,
        reserved: Le16::ZERO,
    })))
}

/// CM_REJECT's status (consumer-defined reason).
pub fn reject(guest: &TestGuest, id: u32, private_data: &[u8]) -> Status {
    let mut r = CmRejectReq::new_zeroed();
    r.id = Le32::new(id);
    r.private_data_len = private_data.len() as u8;
    r.private_data[..private_data.len()].copy_from_slice(private_data);
    guest.status(cm(CmRequest::Reject(r)))
}

/// CM_DISCONNECT's status.
pub fn disconnect(guest: &TestGuest, id: u32) -> Status {
    guest.status(cm(CmRequest::Disconnect(handle(id))))
}

/// CM_QUERY_ADDR's answer.
pub fn query_addr(guest: &TestGuest, id: u32) -> CmQueryAddrResp {
    match guest.ok(cm(CmRequest::QueryAddr(HandleReq {
        handle: Le32::new(id),
        reserved: Le32::ZERO,
    }))) {
        ResponseBody::Cm(CmResponseBody::QueryAddr(r)) => r,
        other => panic!("CM_QUERY_ADDR answered {other:?}"),
    }
}

/// CM_INIT_QP_ATTR's answer.
pub fn init_qp_attr(guest: &TestGuest, id: u32, state: QpState) -> CmInitQpAttrResp {
    match guest.ok(cm(CmRequest::InitQpAttr(CmInitQpAttrReq {
        id: Le32::new(id),
        qp_state: Le32::new(state as u32),
    }))) {
        ResponseBody::Cm(CmResponseBody::InitQpAttr(r)) => r,
        other => panic!("CM_INIT_QP_ATTR answered {other:?}"),
    }
}

/// Moves `qp` to `state` with what CM_INIT_QP_ATTR of `id` computes, as librdmacm does.
pub fn cm_modify(guest: &TestGuest, id: u32, qp: u32, state: QpState) {
    let a = init_qp_attr(guest, id, state);
    let status = guest.status(ControlRequest::ModifyQp(ModifyQpReq {
        qp: Le32::new(qp),
        attr_mask: a.attr_mask,
        attr: a.attr,
    }));
    assert_eq!(
        status,
        Status::Ok,
        "MODIFY_QP to {state:?} with mask {:?}",
        QpAttrMask::from_bits_retain(a.attr_mask.get())
    );
}

/// CM_GET_EVENT once, without pumping.
pub fn get_event(guest: &TestGuest) -> CmEventResp {
    match guest.ok(cm(CmRequest::GetEvent)) {
        ResponseBody::Cm(CmResponseBody::GetEvent(e)) => e,
        other => panic!("CM_GET_EVENT answered {other:?}"),
    }
}

fn cm_fd(guest: &TestGuest) -> RawFd {
    guest.dev().watched_fds()[CM_FD]
}

/// The next CM event of `guest`: pumps the host's events into the device as its worker
/// would, waiting for the host CM's fd up to [`CM_EVENT_LIMIT`].
pub fn next_cm_event(guest: &TestGuest) -> CmEventResp {
    pump_cm_until(guest, || {
        let e = get_event(guest);
        (e.event.get() != CM_EVENT_NONE).then_some(e)
    })
}

/// The next CM_EVENT notice on `guest`'s event queue, taken off it (the event itself waits
/// in the device): pumps the host's events as [`next_cm_event`] does.
pub fn next_cm_notice(guest: &TestGuest) -> Vec<u8> {
    pump_cm_until(guest, || take_cm_notice(guest))
}

/// The oldest CM_EVENT notice on `guest`'s event queue, taken off it, if one waits.
pub fn take_cm_notice(guest: &TestGuest) -> Option<Vec<u8>> {
    let mut notice = None;
    guest.guest_io().events().discard_where(|bytes| {
        let is_cm = Event::decode(bytes).is_ok_and(|e| e.event_type == EventType::CmEvent);
        if is_cm && notice.is_none() {
            notice = Some(bytes.to_vec());
            return true;
        }
        false
    });
    notice
}

/// Pumps the host's CM events into the device as its worker would until `found` finds
/// something, waiting for the host CM's fd up to [`CM_EVENT_LIMIT`].
fn pump_cm_until<T>(guest: &TestGuest, mut found: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + CM_EVENT_LIMIT;
    loop {
        guest.dev().fd_ready(guest.guest_io(), CM_FD);
        if let Some(thing) = found() {
            return thing;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no CM event within {CM_EVENT_LIMIT:?}");
        let mut pfd = libc::pollfd {
            fd: cm_fd(guest),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(1000) as i32) };
    }
}

/// The next CM event, which must be `event` with status 0.
pub fn expect_cm_event(guest: &TestGuest, event: u32) -> CmEventResp {
    let e = next_cm_event(guest);
    assert_eq!(
        (e.event.get(), e.status.get() as i32),
        (event, 0),
        "expected CM event {event}"
    );
    e
}

/// Resolves `id`'s address (the device picks the source) and route to `dst`, waiting for
/// both events, as an active side does before it connects.
pub fn resolve(guest: &TestGuest, id: u32, dst: &str) {
    assert_eq!(
        resolve_addr(guest, id, None, dst),
        Status::Ok,
        "CM_RESOLVE_ADDR"
    );
    expect_cm_event(guest, cm_event::ADDR_RESOLVED);
    assert_eq!(resolve_route(guest, id), Status::Ok, "CM_RESOLVE_ROUTE");
    expect_cm_event(guest, cm_event::ROUTE_RESOLVED);
}

/// A fake host device whose CM is enabled.
pub fn fake_with_cm() -> std::sync::Arc<FakeDevice> {
    let fake = FakeDevice::new();
    fake.world().cm.enabled = true;
    fake
}

/// Guest RAM-free objects for one RC QP: PD, CQ, QP; returns (qp handle, host qpn).
pub fn rc_qp(guest: &TestGuest) -> (u32, u32) {
    if guest.dev().object_counts().pds == 0 {
        assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);
    }
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(16).cq.get();
    let qp = guest.create_qp(qp_req(pd, cq, 0)).unwrap();
    (qp.qp.get(), qp.qpn.get())
}

/// The server listening on the host's link-local address and `port`, and the client's RC id
/// routed to it; returns the client's id.
pub fn listener_and_routed_id(server: &TestGuest, client: &TestGuest, port: u16) -> u32 {
    let listener = create_id(server, cm_port_space::TCP);
    assert_eq!(
        bind(server, listener, &format!("[fe80::1%3]:{port}")),
        Status::Ok
    );
    assert_eq!(listen(server, listener, 4), Status::Ok);
    routed_id(client, port)
}

/// A new RC id of the client routed to the host's link-local address and `port`.
pub fn routed_id(client: &TestGuest, port: u16) -> u32 {
    let id = create_id(client, cm_port_space::TCP);
    assert_eq!(
        resolve_addr(client, id, None, &format!("[fe80::1%5]:{port}")),
        Status::Ok
    );
    expect_cm_event(client, cm_event::ADDR_RESOLVED);
    assert_eq!(resolve_route(client, id), Status::Ok);
    expect_cm_event(client, cm_event::ROUTE_RESOLVED);
    id
}

/// The QP's state and read/atomic depths (initiator, responder) as QUERY_QP answers them.
pub fn qp_state_and_depths(guest: &TestGuest, qp: u32) -> (u32, (u8, u8)) {
    let request = ControlRequest::QueryQp(QueryQpReq {
        qp: Le32::new(qp),
        attr_mask: Le32::new(QpAttrMask::STATE.bits()),
    });
    match guest.ok(request) {
        ResponseBody::QueryQp(r) => (
            r.attr.qp_state.get(),
            (r.attr.max_rd_atomic, r.attr.max_dest_rd_atomic),
        ),
        other => panic!("QUERY_QP answered {other:?}"),
    }
}

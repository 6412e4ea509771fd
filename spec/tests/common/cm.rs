//! Fixtures of the connection manager's commands: one valid request per CM opcode and the
//! success bodies of those that have one.

use vrdma_spec::cm::*;
use vrdma_spec::control::{CmRequest, CmResponseBody};
use vrdma_spec::wire::*;
use vrdma_spec::{ControlRequest, Le16, Le32, Opcode, ResponseBody};
use zerocopy::FromZeros;

use super::h;

/// `fe80::a:1` port 18515, scope 2.
pub fn link_local() -> CmAddr {
    let mut a = CmAddr::NONE;
    a.family = Le16::new(cm_family::INET6);
    a.port = Le16::new(18515);
    a.addr = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xa, 0, 1];
    a.scope_id = Le32::new(2);
    a
}

/// `192.0.2.7` port 4000, mapped.
pub fn ipv4() -> CmAddr {
    let mut a = CmAddr::NONE;
    a.family = Le16::new(cm_family::INET);
    a.port = Le16::new(4000);
    a.addr[10..].copy_from_slice(&[0xff, 0xff, 192, 0, 2, 7]);
    a
}

pub fn conn_req(qp: u32) -> CmConnReq {
    let mut r = CmConnReq::new_zeroed();
    r.id = Le32::new(3);
    r.qp = Le32::new(qp);
    r.param.private_data_len = 5;
    r.param.private_data[..5].copy_from_slice(b"hello");
    r.param.responder_resources = 1;
    r.param.initiator_depth = 1;
    r.param.retry_count = 7;
    r.param.rnr_retry_count = 7;
    r
}

/// One valid request per CM opcode, in opcode order.
pub fn cm_requests() -> Vec<ControlRequest<'static>> {
    let mut reject = CmRejectReq::new_zeroed();
    reject.id = Le32::new(3);
    reject.private_data_len = 2;
    reject.private_data[..2].copy_from_slice(b"no");
    [
        CmRequest::CreateId(CmCreateIdReq {
            port_space: Le16::new(cm_port_space::TCP),
            reserved: [0; 6],
        }),
        CmRequest::DestroyId(h(3)),
        CmRequest::Bind(CmBindReq {
            id: Le32::new(3),
            reserved: Le32::ZERO,
            addr: link_local(),
        }),
        CmRequest::ResolveAddr(CmResolveAddrReq {
            id: Le32::new(3),
            timeout_ms: Le32::new(2000),
            src: CmAddr::NONE,
            dst: ipv4(),
        }),
        CmRequest::ResolveRoute(CmResolveRouteReq {
            id: Le32::new(3),
            timeout_ms: Le32::new(2000),
        }),
        CmRequest::Listen(CmListenReq {
            id: Le32::new(3),
            backlog: Le32::new(8),
        }),
        CmRequest::Connect(conn_req(4)),
        CmRequest::Accept(conn_req(0)),
        CmRequest::Reject(reject),
        CmRequest::Disconnect(h(3)),
        CmRequest::InitQpAttr(CmInitQpAttrReq {
            id: Le32::new(3),
            qp_state: Le32::new(2),
        }),
        CmRequest::GetEvent,
        CmRequest::SetOption(CmSetOptionReq {
            id: Le32::new(3),
            name: Le32::new(cm_option::TOS),
            value: Le32::new(32),
            reserved: Le32::ZERO,
        }),
        CmRequest::Notify(CmNotifyReq {
            id: Le32::new(3),
            event: Le32::new(3),
        }),
        CmRequest::QueryAddr(h(3)),
        move_qp(2),
    ]
    .into_iter()
    .map(ControlRequest::Cm)
    .collect()
}

/// The success body of CM opcode `op`, if it has one.
pub fn cm_body_for(op: Opcode) -> Option<ResponseBody> {
    let body = match op {
        Opcode::CmCreateId => CmResponseBody::CreateId(HandleResp {
            handle: Le32::new(3),
            reserved: Le32::ZERO,
        }),
        Opcode::CmDestroyId => CmResponseBody::DestroyId(CmDestroyIdResp {
            events_delivered: Le32::new(4),
            reserved: Le32::ZERO,
        }),
        Opcode::CmInitQpAttr => {
            let mut r = CmInitQpAttrResp::new_zeroed();
            r.attr_mask = Le32::new(0x39);
            CmResponseBody::InitQpAttr(r)
        }
        Opcode::CmGetEvent => {
            let mut e = CmEventResp::new_zeroed();
            e.id = Le32::new(5);
            e.listen_id = Le32::new(3);
            e.event = Le32::new(4);
            e.private_data_len = 56;
            e.src = link_local();
            e.dst = link_local();
            CmResponseBody::GetEvent(e)
        }
        Opcode::CmQueryAddr => {
            let mut r = CmQueryAddrResp::new_zeroed();
            r.src = link_local();
            r.port_num = 1;
            r.pkey = Le16::new(0xffff);
            CmResponseBody::QueryAddr(r)
        }
        _ => return None,
    };
    Some(ResponseBody::Cm(body))
}

/// CM_MOVE_QP of QP 5 through id 3 to `state`, the host's depths.
pub fn move_qp(state: u32) -> CmRequest {
    CmRequest::MoveQp(CmMoveQpReq {
        id: Le32::new(3),
        qp: Le32::new(5),
        qp_state: Le32::new(state),
        responder_resources: 0xff,
        initiator_depth: 4,
        reserved: Le16::ZERO,
    })
}

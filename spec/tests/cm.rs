//! The connection manager's request decoder (spec §7.5): what it refuses before any device
//! state is consulted.

mod common;

use common::*;
use vrdma_spec::cm::*;
use vrdma_spec::control::CmRequest;
use vrdma_spec::error::DecodeError;
use vrdma_spec::wire::HandleReq;
use vrdma_spec::{ControlRequest, Le16, Le32};
use zerocopy::FromZeros;

fn decode(request: CmRequest) -> Result<ControlRequest<'static>, DecodeError> {
    let bytes: &'static [u8] = ControlRequest::Cm(request).to_vec().leak();
    ControlRequest::decode(bytes)
}

fn refused(request: CmRequest) -> DecodeError {
    decode(request).expect_err("refused")
}

#[test]
fn every_fixture_decodes_to_itself() {
    for request in cm_requests() {
        let bytes = request.to_vec();
        assert_eq!(ControlRequest::decode(&bytes).unwrap(), request);
    }
}

#[test]
fn ids_live_in_the_connected_or_the_datagram_port_space() {
    for ps in [0, 0x0002, 0x013f, 0xffff] {
        let e = refused(CmRequest::CreateId(CmCreateIdReq {
            port_space: Le16::new(ps),
            reserved: [0; 6],
        }));
        assert!(matches!(
            e,
            DecodeError::InvalidValue {
                field: "port_space",
                ..
            }
        ));
    }
    let e = refused(CmRequest::CreateId(CmCreateIdReq {
        port_space: Le16::new(cm_port_space::UDP),
        reserved: [0, 0, 0, 1, 0, 0],
    }));
    assert_eq!(e, DecodeError::Reserved("reserved"));
}

#[test]
fn addresses_are_ipv4_mapped_or_ipv6_and_none_only_as_a_source() {
    let bind = |addr: CmAddr| {
        CmRequest::Bind(CmBindReq {
            id: Le32::new(3),
            reserved: Le32::ZERO,
            addr,
        })
    };
    decode(bind(ipv4())).unwrap();
    let mut unmapped = ipv4();
    unmapped.addr[10] = 0;
    assert!(matches!(
        refused(bind(unmapped)),
        DecodeError::InvalidValue { .. }
    ));
    let mut scoped_v4 = ipv4();
    scoped_v4.scope_id = Le32::new(1);
    assert_eq!(
        refused(bind(scoped_v4)),
        DecodeError::Reserved("addr.scope_id")
    );
    let mut ib = link_local();
    ib.family = Le16::new(27);
    assert!(matches!(
        refused(bind(ib)),
        DecodeError::InvalidValue {
            field: "addr.family",
            value: 27
        }
    ));
    assert!(refused(bind(CmAddr::NONE)).status() == vrdma_spec::Status::Invalid);
    let mut reserved = link_local();
    reserved.reserved = Le32::new(1);
    assert_eq!(
        refused(bind(reserved)),
        DecodeError::Reserved("addr.reserved")
    );
    // A resolution may leave the source to the device, but then all of it is zero.
    let resolve = |src: CmAddr| {
        CmRequest::ResolveAddr(CmResolveAddrReq {
            id: Le32::new(3),
            timeout_ms: Le32::new(100),
            src,
            dst: link_local(),
        })
    };
    decode(resolve(CmAddr::NONE)).unwrap();
    let mut junk = CmAddr::NONE;
    junk.port = Le16::new(1);
    assert_eq!(refused(resolve(junk)), DecodeError::Reserved("addr"));
}

#[test]
fn connection_parameters_are_within_the_cms_ranges() {
    let mut r = conn_req(4);
    r.param.retry_count = 8;
    assert!(matches!(
        refused(CmRequest::Connect(r)),
        DecodeError::InvalidValue {
            field: "retry_count",
            ..
        }
    ));
    let mut r = conn_req(4);
    r.param.flow_control = 2;
    assert!(matches!(
        refused(CmRequest::Connect(r)),
        DecodeError::InvalidValue { .. }
    ));
    let mut r = conn_req(4);
    r.param.reserved = 1;
    assert_eq!(
        refused(CmRequest::Connect(r)),
        DecodeError::Reserved("param.reserved")
    );
    // MOVE_QP is an accept's; undefined flags are reserved; an accept that moves its QP needs
    // the device's moves.
    let mut r = conn_req(4);
    r.param.flags = cm_conn_flags::MOVE_QP;
    assert!(matches!(
        refused(CmRequest::Connect(r)),
        DecodeError::InvalidValue {
            field: "param.flags",
            ..
        }
    ));
    let accept = decode(CmRequest::Accept(r)).unwrap();
    assert_eq!(
        accept.required_features() & vrdma_spec::features::VRDMA_F_CM_MOVES_QP,
        vrdma_spec::features::VRDMA_F_CM_MOVES_QP
    );
    let plain = decode(CmRequest::Accept(conn_req(4))).unwrap();
    assert_eq!(
        plain.required_features() & vrdma_spec::features::VRDMA_F_CM_MOVES_QP,
        0
    );
    r.param.flags = 2;
    assert_eq!(
        refused(CmRequest::Accept(r)),
        DecodeError::Reserved("param.flags")
    );
    // A connect names its QP; an accept without one establishes after a reply.
    assert!(matches!(
        refused(CmRequest::Connect(conn_req(0))),
        DecodeError::InvalidValue { field: "qp", .. }
    ));
    decode(CmRequest::Accept(conn_req(0))).unwrap();
}

#[test]
fn rejects_options_and_states_are_checked() {
    // The reasons the kernel's rdma_cm takes (0 meaning consumer-defined, 28, 35); no other.
    let mut reject = CmRejectReq::new_zeroed();
    for reason in [0, 28, 35] {
        reject.reason = reason;
        decode(CmRequest::Reject(reject)).unwrap();
    }
    reject.reason = 8;
    assert!(matches!(
        refused(CmRequest::Reject(reject)),
        DecodeError::InvalidValue {
            field: "reason",
            ..
        }
    ));
    let option = |name: u32, value: u32| {
        CmRequest::SetOption(CmSetOptionReq {
            id: Le32::new(3),
            name: Le32::new(name),
            value: Le32::new(value),
            reserved: Le32::ZERO,
        })
    };
    decode(option(cm_option::TOS, 255)).unwrap();
    decode(option(cm_option::ACK_TIMEOUT, 31)).unwrap();
    for (name, value) in [
        (cm_option::TOS, 256),
        (cm_option::REUSEADDR, 2),
        (cm_option::AFONLY, 2),
        (cm_option::ACK_TIMEOUT, 32),
        (cm_option::LAST + 1, 0),
    ] {
        assert!(matches!(
            refused(option(name, value)),
            DecodeError::InvalidValue { .. }
        ));
    }
    assert!(matches!(
        refused(CmRequest::InitQpAttr(CmInitQpAttrReq {
            id: Le32::new(3),
            qp_state: Le32::new(7),
        })),
        DecodeError::InvalidValue {
            field: "qp_state",
            ..
        }
    ));
    // A move goes to INIT, RTR or RTS: RESET, SQD, SQE, ERR and unknown states are refused.
    for state in [0, 4, 5, 6, 7] {
        assert!(matches!(
            refused(move_qp(state)),
            DecodeError::InvalidValue {
                field: "qp_state",
                ..
            }
        ));
    }
    let CmRequest::MoveQp(mut r) = move_qp(3) else {
        unreachable!()
    };
    r.reserved = Le16::new(1);
    assert_eq!(
        refused(CmRequest::MoveQp(r)),
        DecodeError::Reserved("reserved")
    );
    let mut handle = HandleReq::new_zeroed();
    handle.reserved = Le32::new(1);
    assert_eq!(
        refused(CmRequest::Disconnect(handle)),
        DecodeError::Reserved("reserved")
    );
}

#[test]
fn cm_commands_need_the_feature() {
    use vrdma_spec::features::{VRDMA_F_CM, VRDMA_F_CM_MOVES_QP};
    for request in cm_requests() {
        let ControlRequest::Cm(cm) = &request else {
            unreachable!("CM fixtures are CM requests")
        };
        let expected = match cm {
            // The device's own moves need their feature too.
            CmRequest::MoveQp(_) => VRDMA_F_CM | VRDMA_F_CM_MOVES_QP,
            _ => VRDMA_F_CM,
        };
        assert_eq!(request.required_features(), expected, "{request:?}");
    }
}

#[test]
fn socket_addresses_round_trip_through_cm_addr() {
    use std::net::SocketAddr;
    for text in ["192.0.2.7:4791", "[fe80::a:1%3]:18515", "[2001:db8::1]:1"] {
        let addr: SocketAddr = text.parse().unwrap();
        let wire = CmAddr::from_socket_addr(&addr);
        vrdma_spec::control::check_cm_addr(&wire, false).unwrap();
        assert_eq!(wire.socket_addr(), Some(addr), "{text}");
    }
    let v4 = CmAddr::from_socket_addr(&"192.0.2.7:9".parse().unwrap());
    assert_eq!(v4.family.get(), cm_family::INET);
    assert_eq!(&v4.addr[10..], &[0xff, 0xff, 192, 0, 2, 7]);
    assert_eq!(CmAddr::NONE.socket_addr(), None);
}

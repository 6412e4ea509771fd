//! The connection manager's kernel ABI (ucma) against a real rdma_rxe device, run inside the
//! test VM (`vrdma-vm test backend-device`; ignored elsewhere):
//!
//! an RC connection over rxe's loopback between two QPs of one uverbs context, each side on its
//! own rdma_cm file as the backend will hold one per guest: BIND + LISTEN on one side,
//! RESOLVE_ADDR/RESOLVE_ROUTE + CONNECT on the other, the QPs moved through the states
//! INIT_QP_ATTR computes (converted by `rxe_convert::qp_attr_from_cm`, applied with the
//! backend's own MODIFY_QP), private data both ways, ACCEPT, the establishing ACCEPT, DISCONNECT
//! on both sides; and a connect to a port where nobody listens. Then the same through the
//! device: two guests' `GuestDevice`s over rxe0 run the CM commands of spec §7.5 and move their
//! QPs with the attributes CM_INIT_QP_ATTR answers in their terms.

use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use vrdma_backend::guest_device::GuestDeviceFactory;
use vrdma_backend::host::rxe_convert::qp_attr_from_cm;
use vrdma_backend::host::ucma::abi::{event, port_space, ConnParam, EventResp};
use vrdma_backend::host::ucma::file::{copy_private_data, decode_sockaddr, event_conn_param};
use vrdma_backend::host::ucma::{CmFile, CmId, CM_DEVICE_PATH};
use vrdma_backend::host::*;
use vrdma_backend::vhost_device::handler::DeviceHandler;
use vrdma_spec::attr::qp::QpCaps;
use vrdma_spec::verbs::{AccessFlags, QpAttrMask, QpState, QpType};
use vrdma_test_support::fake_host::cm_steps as steps;
use vrdma_test_support::fake_host::harness::{qp_req, test_options, TestGuest, RAM_BASE};
use zerocopy::FromZeros;

const EVENT_LIMIT: Duration = Duration::from_secs(20);
const PORT: u16 = 18_515;
/// RC in `rdma_ucm_create_id.qp_type` (`IB_QPT_RC`).
const RC: u8 = 2;

/// The next event of `file`, waiting up to [`EVENT_LIMIT`].
fn next_event(file: &CmFile) -> EventResp {
    let mut pfd = libc::pollfd {
        fd: file.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let ready = unsafe { libc::poll(&mut pfd, 1, EVENT_LIMIT.as_millis() as i32) };
    assert_eq!(ready, 1, "no rdma_cm event within {EVENT_LIMIT:?}");
    file.get_event().unwrap().expect("an event once readable")
}

/// Waits for `expected` about uid `uid`; returns it.
fn expect_event(file: &CmFile, uid: u64, expected: u32) -> EventResp {
    let e = next_event(file);
    assert_eq!(
        (e.uid, e.event, e.status),
        (uid, expected, 0),
        "event {} status {} (expected {expected})",
        e.event,
        e.status as i32
    );
    e
}

/// Moves `qp` to `state` with the attributes the CM computes for id `id`.
fn cm_modify(
    ctx: &dyn HostContext,
    file: &CmFile,
    id: CmId,
    qp: QpHandle,
    state: QpState,
) -> QpAttrMask {
    let resp = file.init_qp_attr(id, state).unwrap();
    let (attr, mask) = qp_attr_from_cm(&resp);
    println!(
        "INIT_QP_ATTR({state:?}): mask {:#x}, access {:#x}",
        mask.bits(),
        resp.qp_access_flags
    );
    // rxe adds its FLUSH access bits (0x300) to the remote ones: MODIFY_QP takes them.
    ctx.modify_qp(qp, &attr, mask).unwrap();
    mask
}

fn conn_param(qp_num: u32, private_data: &[u8], valid: bool) -> ConnParam {
    let mut p = ConnParam::new_zeroed();
    p.qp_num = qp_num;
    p.private_data_len = copy_private_data(&mut p.private_data, private_data);
    p.responder_resources = 1;
    p.initiator_depth = 1;
    p.retry_count = 7;
    p.rnr_retry_count = 7;
    p.valid = u8::from(valid);
    p
}

/// rxe0's IPv6 link-local address (GID 0) with its netdev's interface index as scope.
fn link_local(device: &RxeDevice, port: u16) -> SocketAddr {
    let gid = device.gid_table(1).unwrap()[0].1.gid;
    assert_eq!(&gid[..2], &[0xfe, 0x80], "GID 0 is the link-local address");
    let ndev =
        std::fs::read_to_string("/sys/class/infiniband/rxe0/ports/1/gid_attrs/ndevs/0").unwrap();
    let name = std::ffi::CString::new(ndev.trim()).unwrap();
    // SAFETY: a NUL-terminated interface name.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert_ne!(index, 0, "netdev {ndev:?}");
    SocketAddrV6::new(Ipv6Addr::from(gid), port, 0, index).into()
}

#[test]
#[ignore = "needs rdma_rxe and rdma_cm: run in the VM"]
fn an_rc_connection_through_the_kernels_connection_manager() {
    let device = RxeDevice::find_system(Some("rxe0")).unwrap();
    let boxed = device.open_context().unwrap();
    let ctx: &dyn HostContext = boxed.as_ref();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx
        .create_cq(&CqInit {
            cqe: 8,
            comp_vector: 0,
            use_comp_channel: false,
            user_handle: 1,
        })
        .unwrap();
    let qp = |user_handle| {
        ctx.create_qp(&QpInit {
            qp_type: QpType::Rc,
            pd,
            send_cq: cq.handle,
            recv_cq: cq.handle,
            srq: None,
            caps: QpCaps {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
            user_handle,
        })
        .unwrap()
    };
    let (server_qp, client_qp) = (qp(2), qp(3));
    let address = link_local(&device, PORT);
    println!("listening at {address}");

    // Passive side: its own file, an id bound to the address and listening.
    let server = CmFile::open(Path::new(CM_DEVICE_PATH)).unwrap();
    let listener = server.create_id(1, port_space::TCP, RC).unwrap();
    server.bind(listener, &address).unwrap();
    let bound = server.query_addr(listener).unwrap();
    assert_eq!(
        decode_sockaddr(&bound.src_addr, bound.src_size),
        Some(address)
    );
    println!(
        "bound: node_guid {:#x}, port {}",
        u64::from_be(bound.node_guid),
        bound.port_num
    );
    assert_eq!(bound.port_num, 1);
    server.listen(listener, 4).unwrap();

    // Active side: resolve, route, INIT, connect with private data.
    let client = CmFile::open(Path::new(CM_DEVICE_PATH)).unwrap();
    let active = client.create_id(10, port_space::TCP, RC).unwrap();
    client.resolve_addr(active, None, &address, 2000).unwrap();
    expect_event(&client, 10, event::ADDR_RESOLVED);
    client.resolve_route(active, 2000).unwrap();
    expect_event(&client, 10, event::ROUTE_RESOLVED);
    let mask = cm_modify(ctx, &client, active, client_qp.handle, QpState::Init);
    assert!(mask.contains(QpAttrMask::STATE | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS));
    client
        .connect(
            active,
            &conn_param(client_qp.qpn, b"hello from the client", true),
        )
        .unwrap();

    // The request reaches the listener with a new id and the client's private data (the CM's
    // own header stripped, the REQ's space after it zero-filled).
    let request = expect_event(&server, 1, event::CONNECT_REQUEST);
    let passive = CmId(request.id);
    assert_ne!(passive, listener);
    let param = event_conn_param(&request);
    assert_eq!(&param.private_data[..21], b"hello from the client");
    assert_eq!(
        param.private_data_len, 56,
        "REQ private data (92) less the CM header (36)"
    );
    cm_modify(ctx, &server, passive, server_qp.handle, QpState::Init);
    let rtr = server.init_qp_attr(passive, QpState::Rtr).unwrap();
    assert_eq!(
        rtr.dest_qp_num, client_qp.qpn,
        "the REQ carried the client's QP number"
    );
    cm_modify(ctx, &server, passive, server_qp.handle, QpState::Rtr);
    cm_modify(ctx, &server, passive, server_qp.handle, QpState::Rts);
    server
        .accept(
            passive,
            20,
            &conn_param(server_qp.qpn, b"hello from the server", true),
        )
        .unwrap();

    // The reply: the client moves its QP (no kernel QP: CONNECT_RESPONSE, not ESTABLISHED),
    // then establishes (ACCEPT without parameters sends the RTU).
    let response = expect_event(&client, 10, event::CONNECT_RESPONSE);
    let param = event_conn_param(&response);
    assert_eq!(&param.private_data[..21], b"hello from the server");
    cm_modify(ctx, &client, active, client_qp.handle, QpState::Init);
    let rtr = client.init_qp_attr(active, QpState::Rtr).unwrap();
    assert_eq!(rtr.dest_qp_num, server_qp.qpn);
    cm_modify(ctx, &client, active, client_qp.handle, QpState::Rtr);
    cm_modify(ctx, &client, active, client_qp.handle, QpState::Rts);
    client.accept(active, 0, &ConnParam::new_zeroed()).unwrap();
    let established = expect_event(&server, 20, event::ESTABLISHED);
    assert_eq!(CmId(established.id), passive);
    for qp in [&server_qp, &client_qp] {
        let info = ctx.query_qp(qp.handle, QpAttrMask::STATE).unwrap();
        assert_eq!(info.attr.qp_state(), Ok(QpState::Rts));
    }
    let access = client
        .init_qp_attr(active, QpState::Init)
        .unwrap()
        .qp_access_flags;
    assert_ne!(access & AccessFlags::REMOTE_WRITE.bits(), 0);

    // Disconnect: the peer hears of it and answers with its own DISCONNECT (the DREP), which
    // completes the initiator's (as librdmacm applications do on the event).
    client.disconnect(active).unwrap();
    expect_event(&server, 20, event::DISCONNECTED);
    server.disconnect(passive).unwrap();
    expect_event(&client, 10, event::DISCONNECTED);

    // Nobody listens one port up: the connect is refused.
    let lonely = client.create_id(11, port_space::TCP, RC).unwrap();
    let nowhere = link_local(&device, PORT + 1);
    client.resolve_addr(lonely, None, &nowhere, 2000).unwrap();
    expect_event(&client, 11, event::ADDR_RESOLVED);
    client.resolve_route(lonely, 2000).unwrap();
    expect_event(&client, 11, event::ROUTE_RESOLVED);
    let third = qp(4);
    cm_modify(ctx, &client, lonely, third.handle, QpState::Init);
    client
        .connect(lonely, &conn_param(third.qpn, b"anyone?", true))
        .unwrap();
    // The peer's CM answers the REQ with a REJ, reason 8: no listener for the service ID.
    let refused = next_event(&client);
    assert_eq!(
        (refused.uid, refused.event, refused.status),
        (11, event::REJECTED, 8)
    );

    // Ids go with their files; the kernel counts the events each id reported.
    assert!(client.destroy_id(active).unwrap() >= 4);
    client.destroy_id(lonely).unwrap();
    server.destroy_id(passive).unwrap();
    server.destroy_id(listener).unwrap();
    for qp in [server_qp, client_qp, third] {
        ctx.destroy_qp(qp.handle).unwrap();
    }
    ctx.destroy_cq(cq.handle).unwrap();
    ctx.dealloc_pd(pd).unwrap();
}

/// rxe0's link-local address as a guest names it: its own scope id, which means nothing on
/// the host (the device scopes link-local addresses to the RDMA netdev).
fn guest_link_local(device: &RxeDevice, guest_scope: u32, port: u16) -> String {
    let SocketAddr::V6(host) = link_local(device, port) else {
        unreachable!("link-local addresses are IPv6")
    };
    format!("[{}%{guest_scope}]:{port}", host.ip())
}

/// One RC QP of a guest (doorbell area, PD, CQ, QP): its handle and host QP number.
fn guest_rc_qp(guest: &TestGuest) -> (u32, u32) {
    if guest.dev().object_counts().pds == 0 {
        assert_eq!(guest.set_doorbell_area(RAM_BASE), vrdma_spec::Status::Ok);
    }
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(16).cq.get();
    let qp = guest.create_qp(qp_req(pd, cq, 0)).unwrap();
    (qp.qp.get(), qp.qpn.get())
}

#[test]
#[ignore = "needs rdma_rxe and rdma_cm: run in the VM"]
fn two_guests_connect_through_the_device_on_rxe() {
    use vrdma_spec::cm::{cm_event, cm_port_space};
    use vrdma_spec::features::{VRDMA_F_CM, VRDMA_F_RING_RXE_V1};
    use vrdma_spec::Status;

    let device = RxeDevice::find_system(Some("rxe0")).unwrap();
    let guest = || {
        let factory = GuestDeviceFactory::new(Arc::new(device.clone()), test_options()).unwrap();
        TestGuest::from_factory(&factory, VRDMA_F_CM | VRDMA_F_RING_RXE_V1)
    };
    let (server, client) = (guest(), guest());
    assert_ne!(
        server.dev().device_features() & VRDMA_F_CM,
        0,
        "rdma_ucm is loaded"
    );
    let port = PORT + 1;

    let listener = steps::create_id(&server, cm_port_space::TCP);
    assert_eq!(
        steps::bind(&server, listener, &guest_link_local(&device, 3, port)),
        Status::Ok
    );
    assert_eq!(steps::listen(&server, listener, 4), Status::Ok);

    let id = steps::create_id(&client, cm_port_space::TCP);
    let target = guest_link_local(&device, 5, port);
    assert_eq!(steps::resolve_addr(&client, id, None, &target), Status::Ok);
    let resolved = steps::expect_cm_event(&client, cm_event::ADDR_RESOLVED);
    assert_eq!(
        resolved.dst.socket_addr().unwrap().to_string(),
        target,
        "the guest's scope"
    );
    assert_eq!(steps::resolve_route(&client, id), Status::Ok);
    steps::expect_cm_event(&client, cm_event::ROUTE_RESOLVED);
    let (client_qp, client_qpn) = guest_rc_qp(&client);
    steps::cm_modify(&client, id, client_qp, QpState::Init);
    assert_eq!(
        steps::connect(&client, id, client_qp, b"vrdma client"),
        Status::Ok
    );

    let request = steps::expect_cm_event(&server, cm_event::CONNECT_REQUEST);
    let conn = request.id.get();
    assert_eq!(request.listen_id.get(), listener);
    assert_eq!(request.qp_num.get(), client_qpn);
    let data = &request.private_data[..usize::from(request.private_data_len)];
    assert!(data.starts_with(b"vrdma client"), "{data:?}");
    let (server_qp, server_qpn) = guest_rc_qp(&server);
    // rxe adds FLUSH access bits here (0x30e); the device answers the guest's 0xe.
    let init = steps::init_qp_attr(&server, conn, QpState::Init);
    println!(
        "INIT after a request: mask {:#x}, access {:#x}",
        init.attr_mask.get(),
        init.attr.qp_access_flags.get()
    );
    assert_eq!(init.attr.qp_access_flags.get() & !0xf, 0);
    for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
        steps::cm_modify(&server, conn, server_qp, state);
    }
    assert_eq!(
        steps::accept(&server, conn, server_qp, b"vrdma server"),
        Status::Ok
    );

    let reply = steps::expect_cm_event(&client, cm_event::CONNECT_RESPONSE);
    assert_eq!(reply.qp_num.get(), server_qpn);
    let data = &reply.private_data[..usize::from(reply.private_data_len)];
    assert!(data.starts_with(b"vrdma server"), "{data:?}");
    for state in [QpState::Rtr, QpState::Rts] {
        steps::cm_modify(&client, id, client_qp, state);
    }
    assert_eq!(steps::accept(&client, id, 0, b""), Status::Ok);
    steps::expect_cm_event(&server, cm_event::ESTABLISHED);

    assert_eq!(steps::disconnect(&client, id), Status::Ok);
    steps::expect_cm_event(&server, cm_event::DISCONNECTED);
    assert_eq!(steps::disconnect(&server, conn), Status::Ok);
    steps::expect_cm_event(&client, cm_event::DISCONNECTED);
    assert_eq!(steps::destroy_id(&server, conn), 2);
    assert_eq!(steps::destroy_id(&server, listener), 1);
    assert_eq!(steps::destroy_id(&client, id), 4);

    // Nobody listens on the next port: rejected with reason 8.
    let lonely = steps::create_id(&client, cm_port_space::TCP);
    let nowhere = guest_link_local(&device, 5, port + 1);
    assert_eq!(
        steps::resolve_addr(&client, lonely, None, &nowhere),
        Status::Ok
    );
    steps::expect_cm_event(&client, cm_event::ADDR_RESOLVED);
    assert_eq!(steps::resolve_route(&client, lonely), Status::Ok);
    steps::expect_cm_event(&client, cm_event::ROUTE_RESOLVED);
    let (qp2, _) = guest_rc_qp(&client);
    steps::cm_modify(&client, lonely, qp2, QpState::Init);
    assert_eq!(steps::connect(&client, lonely, qp2, b""), Status::Ok);
    let e = steps::next_cm_event(&client);
    assert_eq!((e.event.get(), e.status.get()), (cm_event::REJECTED, 8));
    // A guest's ids go with its device: the kernel holds none of them afterwards.
    drop(client);
    drop(server);
}

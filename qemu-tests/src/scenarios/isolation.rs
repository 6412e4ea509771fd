//! Two guests on one backend, or two application processes of one guest agent, cannot reach
//! each other's objects or memory.
//!
//! Speaks raw control commands through the process (or agent) transport, as a hostile guest
//! would, so the checks do not depend on what the verbs layer allows.

use std::path::Path;

use vrdma::transport::agent::AgentTransport;
use vrdma::transport::process::{ProcessOptions, ProcessTransport};
use vrdma::transport::Transport;
use vrdma_spec::cm::{cm_family, cm_port_space, CmAddr, CmBindReq, CmCreateIdReq, CmListenReq};
use vrdma_spec::control::{
    encode_page_list, CmRequest, CmResponseBody, ControlRequest, ControlResponse, RegMr,
    ResponseBody,
};
use vrdma_spec::features::VRDMA_F_CM;
use vrdma_spec::wire::{HandleReq, QueryTableReq, RegMrReq};
use vrdma_spec::{verbs, Le16, Le32, Le64, Status, StatusError};

use crate::error::{Error, Result};

/// One raw command; `Err` carries the device's status.
pub(crate) fn command(
    transport: &dyn Transport,
    request: ControlRequest<'_>,
) -> Result<Result<ResponseBody, StatusError>> {
    let mut response = [0u8; 512];
    let len = transport
        .round_trip(&request.to_vec(), &mut response)
        .map_err(|e| Error::Scenario(format!("{:?}: transport: {e}", request.opcode())))?;
    let decoded = ControlResponse::decode(request.opcode(), &response[..len])
        .map_err(|e| Error::Scenario(format!("{:?}: malformed response: {e}", request.opcode())))?;
    Ok(decoded.into_result())
}

fn expect_ok(
    what: &str,
    transport: &dyn Transport,
    request: ControlRequest<'_>,
) -> Result<ResponseBody> {
    command(transport, request)?
        .map_err(|e| Error::Scenario(format!("{what}: expected success, got {e}")))
}

fn expect_status(
    what: &str,
    transport: &dyn Transport,
    request: ControlRequest<'_>,
    status: Status,
) -> Result<()> {
    match command(transport, request)? {
        Err(e) if e.status() == status => {
            println!("  ok: {what} -> {status:?}");
            Ok(())
        }
        Err(e) => Err(Error::Scenario(format!(
            "{what}: expected {status:?}, got {e}"
        ))),
        Ok(body) => Err(Error::Scenario(format!(
            "{what}: expected {status:?}, but it succeeded: {body:?}"
        ))),
    }
}

fn handle(handle: u32) -> HandleReq {
    HandleReq {
        handle: Le32::new(handle),
        reserved: Le32::ZERO,
    }
}

pub(crate) fn alloc_pd(what: &str, transport: &dyn Transport) -> Result<u32> {
    match expect_ok(what, transport, ControlRequest::AllocPd)? {
        ResponseBody::AllocPd(r) => Ok(r.handle.get()),
        other => Err(Error::Scenario(format!(
            "{what}: unexpected body {other:?}"
        ))),
    }
}

pub(crate) fn reg_mr_request(pd: u32, iova: u64, pages: &[u64]) -> (RegMrReq, Vec<u8>) {
    let req = RegMrReq {
        pd: Le32::new(pd),
        access: Le32::new(verbs::AccessFlags::LOCAL_WRITE.bits()),
        iova: Le64::new(iova),
        length: Le64::new(4096 * pages.len() as u64),
        page_shift: Le32::new(12),
        npages: Le32::new(pages.len() as u32),
    };
    let mut list = Vec::new();
    encode_page_list(pages.iter().copied(), &mut list);
    (req, list)
}

/// Runs the isolation checks between two guests of the backend listening on `socket`.
pub fn run(socket: &Path) -> Result<()> {
    let connect = || {
        ProcessTransport::connect(socket, ProcessOptions::default())
            .map_err(|e| Error::Scenario(format!("connecting to {}: {e}", socket.display())))
    };
    let ram_start = vrdma::dma::GUEST_RAM_BASE;
    let ram_end = ram_start + ProcessOptions::default().guest_ram_size as u64;
    check_pair(&connect()?, &connect()?, (ram_start, ram_end))
}

/// Runs the isolation checks between two processes of the guest agent listening on `socket`.
pub fn run_through_agent(socket: &Path) -> Result<()> {
    let connect = || {
        AgentTransport::connect(socket)
            .map_err(|e| Error::Scenario(format!("connecting to {}: {e}", socket.display())))
    };
    let (a, b) = (connect()?, connect()?);
    let ram = b.guest_ram();
    let ram_start = ram.guest_base();
    check_pair(&a, &b, (ram_start, ram_start + ram.len() as u64))
}

/// A and B must not reach each other's objects; B must not register memory outside its
/// guest RAM, `[start, end)` of `ram`. (Through the agent, the session's own region lies
/// below the process's: the page below it is the agent's.)
fn check_pair(a: &dyn Transport, b: &dyn Transport, ram: (u64, u64)) -> Result<()> {
    let (ram_start, ram_end) = ram;
    // Handles are per guest: while B holds nothing, nothing A holds can be named by B; once B
    // has objects of its own, equal handle values name B's objects, never A's.
    let pd_a = alloc_pd("guest A: ALLOC_PD", a)?;
    let buffer = a
        .dma()
        .alloc(4096, 4096)
        .map_err(|e| Error::Scenario(format!("guest A: DMA buffer: {e}")))?;
    let pages = a
        .dma()
        .translate(buffer.as_ptr(), 4096)
        .map_err(|e| Error::Scenario(format!("guest A: translate: {e}")))?;
    let iova = buffer.as_ptr() as u64;
    let (req, list) = reg_mr_request(pd_a, iova, &pages);
    let mr_a = match expect_ok(
        "guest A: REG_MR of its own page",
        a,
        ControlRequest::RegMr(RegMr::new(req, &list)),
    )? {
        ResponseBody::RegMr(r) => r.mr.get(),
        other => {
            return Err(Error::Scenario(format!(
                "REG_MR: unexpected body {other:?}"
            )))
        }
    };
    println!("  ok: guest A registers a page of its own RAM");
    expect_status(
        "guest B deallocates guest A's PD",
        b,
        ControlRequest::DeallocPd(handle(pd_a)),
        Status::BadHandle,
    )?;
    expect_status(
        "guest B deregisters guest A's MR",
        b,
        ControlRequest::DeregMr(handle(mr_a)),
        Status::BadHandle,
    )?;
    let (req, list) = reg_mr_request(pd_a, iova, &pages);
    expect_status(
        "guest B registers memory in guest A's PD",
        b,
        ControlRequest::RegMr(RegMr::new(req, &list)),
        Status::BadHandle,
    )?;

    // Guest-physical addresses outside B's RAM: far beyond it, straddling its end, below it.
    let pd_b = alloc_pd("guest B: ALLOC_PD", b)?;
    for (what, gpa) in [
        (
            "guest B registers a page far outside its RAM",
            0x7fff_0000_0000,
        ),
        ("guest B registers the page after its RAM", ram_end),
        ("guest B registers the page below its RAM", ram_start - 4096),
        ("guest B registers a page at address 0", 0),
    ] {
        let (req, list) = reg_mr_request(pd_b, 0x10_0000, &[gpa]);
        expect_status(
            what,
            b,
            ControlRequest::RegMr(RegMr::new(req, &list)),
            Status::BadAddress,
        )?;
    }

    // A's objects are intact after everything B tried.
    expect_ok(
        "guest A: DEREG_MR",
        a,
        ControlRequest::DeregMr(handle(mr_a)),
    )?;
    expect_ok(
        "guest A: DEALLOC_PD",
        a,
        ControlRequest::DeallocPd(handle(pd_a)),
    )?;
    expect_status(
        "guest A reuses its stale PD handle",
        a,
        ControlRequest::DeallocPd(handle(pd_a)),
        Status::BadHandle,
    )?;
    expect_ok("guest A: QUERY_DEVICE", a, ControlRequest::QueryDevice)?;
    expect_ok(
        "guest B: DEALLOC_PD",
        b,
        ControlRequest::DeallocPd(handle(pd_b)),
    )?;
    println!("  ok: guest A's objects survived, both guests still served");
    if a.device_features() & VRDMA_F_CM != 0 {
        check_cm_ids(a, b)?;
    }
    Ok(())
}

/// The port of the CM checks.
const CM_CHECK_PORT: u16 = 7699;

/// B cannot name A's connection-manager id, nor bind the address and port A bound.
fn check_cm_ids(a: &dyn Transport, b: &dyn Transport) -> Result<()> {
    let create_id = || {
        ControlRequest::Cm(CmRequest::CreateId(CmCreateIdReq {
            port_space: Le16::new(cm_port_space::TCP),
            reserved: [0; 6],
        }))
    };
    let cm_id = |what: &str, t: &dyn Transport| match expect_ok(what, t, create_id())? {
        ResponseBody::Cm(CmResponseBody::CreateId(r)) => Ok(r.handle.get()),
        other => Err(Error::Scenario(format!(
            "{what}: unexpected body {other:?}"
        ))),
    };
    // GID 0 of rxe0 is its IPv6 link-local address, an address of the host's that a guest
    // without addresses of its own may bind.
    let gid = match expect_ok(
        "guest A: QUERY_GID 0",
        a,
        ControlRequest::QueryGid(QueryTableReq {
            port_num: Le32::new(1),
            index: Le32::new(0),
        }),
    )? {
        ResponseBody::QueryGid(g) => g.gid,
        other => {
            return Err(Error::Scenario(format!(
                "QUERY_GID: unexpected body {other:?}"
            )))
        }
    };
    let mut addr = CmAddr::NONE;
    addr.family = Le16::new(cm_family::INET6);
    addr.port = Le16::new(CM_CHECK_PORT);
    addr.addr = gid;
    addr.scope_id = Le32::new(1);
    let bind = |id: u32| {
        ControlRequest::Cm(CmRequest::Bind(CmBindReq {
            id: Le32::new(id),
            reserved: Le32::ZERO,
            addr,
        }))
    };
    let id_a = cm_id("guest A: CM_CREATE_ID", a)?;
    expect_ok("guest A: CM_BIND", a, bind(id_a))?;
    println!("  ok: guest A binds a CM id to port {CM_CHECK_PORT}");
    expect_status(
        "guest B listens on guest A's CM id",
        b,
        ControlRequest::Cm(CmRequest::Listen(CmListenReq {
            id: Le32::new(id_a),
            backlog: Le32::new(1),
        })),
        Status::BadHandle,
    )?;
    expect_status(
        "guest B destroys guest A's CM id",
        b,
        ControlRequest::Cm(CmRequest::DestroyId(handle(id_a))),
        Status::BadHandle,
    )?;
    let id_b = cm_id("guest B: CM_CREATE_ID", b)?;
    expect_status(
        "guest B binds the address and port guest A bound",
        b,
        bind(id_b),
        Status::Busy,
    )?;
    expect_ok(
        "guest A: CM_LISTEN",
        a,
        ControlRequest::Cm(CmRequest::Listen(CmListenReq {
            id: Le32::new(id_a),
            backlog: Le32::new(1),
        })),
    )?;
    for (what, t, id) in [("guest B", b, id_b), ("guest A", a, id_a)] {
        expect_ok(
            &format!("{what}: CM_DESTROY_ID"),
            t,
            ControlRequest::Cm(CmRequest::DestroyId(handle(id))),
        )?;
    }
    println!("  ok: guest A's CM id survived what guest B tried");
    Ok(())
}

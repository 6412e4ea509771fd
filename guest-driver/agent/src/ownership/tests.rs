//! Tests of the ownership table, with requests and responses built by the spec's encoders.

use std::collections::{HashMap, HashSet};

use vrdma_spec::cm::*;
use vrdma_spec::control::{
    encode_extent_list, encode_page_list, rereg_flags, RegMrExtents, ReregMr,
};
use vrdma_spec::verbs::srq_attr;
use vrdma_spec::wire::*;
use vrdma_spec::RegMr;
use zerocopy::FromZeros;

use super::*;
use ObjectKind::*;

// ------------------------------------------------------------------ request builders

fn hreq(h: u32) -> HandleReq {
    HandleReq {
        handle: h.into(),
        reserved: 0.into(),
    }
}

fn table_req() -> QueryTableReq {
    QueryTableReq {
        port_num: 1.into(),
        index: 0.into(),
    }
}

fn reg_mr_req(pd: u32, length: u64, page_shift: u32, npages: u32) -> RegMrReq {
    RegMrReq {
        pd: pd.into(),
        access: 0.into(),
        iova: 0.into(),
        length: length.into(),
        page_shift: page_shift.into(),
        npages: npages.into(),
    }
}

fn reg_mr(pd: u32, pages: &[u64]) -> Vec<u8> {
    let mut list = Vec::new();
    encode_page_list(pages.iter().copied(), &mut list);
    let req = reg_mr_req(pd, 4096 * pages.len() as u64, 12, pages.len() as u32);
    ControlRequest::RegMr(RegMr::new(req, &list)).to_vec()
}

fn rereg_mr(mr: u32, flags: u32, pd: u32, pages: &[u64]) -> Vec<u8> {
    let mut req = ReregMrReq::new_zeroed();
    req.mr = mr.into();
    req.flags = flags.into();
    req.pd = pd.into();
    let mut list = Vec::new();
    if flags & rereg_flags::CHANGE_TRANSLATION != 0 {
        encode_page_list(pages.iter().copied(), &mut list);
        req.length = (4096 * pages.len() as u64).into();
        req.page_shift = 12.into();
        req.npages = (pages.len() as u32).into();
    }
    ControlRequest::ReregMr(ReregMr::new(req, &list)).to_vec()
}

fn create_qp(pd: u32, send_cq: u32, recv_cq: u32, srq: u32) -> Vec<u8> {
    let mut r = CreateQpReq::new_zeroed();
    r.pd = pd.into();
    r.send_cq = send_cq.into();
    r.recv_cq = recv_cq.into();
    r.srq = srq.into();
    r.qp_type = 2; // RC
    ControlRequest::CreateQp(r).to_vec()
}

fn create_srq(pd: u32) -> Vec<u8> {
    ControlRequest::CreateSrq(CreateSrqReq {
        pd: pd.into(),
        max_wr: 1.into(),
        max_sge: 1.into(),
        srq_limit: 0.into(),
    })
    .to_vec()
}

fn create_ah(pd: u32) -> Vec<u8> {
    let mut r = CreateAhReq::new_zeroed();
    r.pd = pd.into();
    r.ah_attr.port_num = 1;
    ControlRequest::CreateAh(r).to_vec()
}

fn alloc_mw(pd: u32) -> Vec<u8> {
    ControlRequest::AllocMw(AllocMwReq {
        pd: pd.into(),
        mw_type: 2.into(),
    })
    .to_vec()
}

fn create_cq() -> Vec<u8> {
    ControlRequest::CreateCq(CreateCqReq {
        cqe: 1.into(),
        reserved: 0.into(),
    })
    .to_vec()
}

fn create_cm_id() -> Vec<u8> {
    ControlRequest::Cm(CmRequest::CreateId(CmCreateIdReq {
        port_space: cm_port_space::TCP.into(),
        reserved: [0; 6],
    }))
    .to_vec()
}

fn alloc_pd() -> Vec<u8> {
    ControlRequest::AllocPd.to_vec()
}

// ----------------------------------------------------------------- response builders

/// The success response creating `handle` of `kind`.
fn created(kind: ObjectKind, handle: u32) -> Vec<u8> {
    let h = handle.into();
    let body = match kind {
        Pd => ResponseBody::AllocPd(HandleResp {
            handle: h,
            reserved: 0.into(),
        }),
        Mr => ResponseBody::RegMr(RegMrResp {
            mr: h,
            ..RegMrResp::new_zeroed()
        }),
        Mw => ResponseBody::AllocMw(AllocMwResp {
            mw: h,
            rkey: 0.into(),
        }),
        Cq => ResponseBody::CreateCq(CreateCqResp {
            cq: h,
            ..CreateCqResp::new_zeroed()
        }),
        Qp => ResponseBody::CreateQp(CreateQpResp {
            qp: h,
            ..CreateQpResp::new_zeroed()
        }),
        Srq => ResponseBody::CreateSrq(CreateSrqResp {
            srq: h,
            ..CreateSrqResp::new_zeroed()
        }),
        Ah => ResponseBody::CreateAh(CreateAhResp {
            ah: h,
            ..CreateAhResp::new_zeroed()
        }),
        CmId => ResponseBody::Cm(CmResponseBody::CreateId(HandleResp {
            handle: h,
            reserved: 0.into(),
        })),
    };
    ControlResponse::Ok(body).to_vec()
}

/// The success response destroying an object of `kind`.
fn destroyed(kind: ObjectKind) -> Vec<u8> {
    match kind {
        CmId => ControlResponse::Ok(ResponseBody::Cm(CmResponseBody::DestroyId(
            CmDestroyIdResp {
                events_delivered: 0.into(),
                reserved: 0.into(),
            },
        )))
        .to_vec(),
        _ => ok_empty(),
    }
}

fn ok_empty() -> Vec<u8> {
    ControlResponse::Ok(ResponseBody::Empty).to_vec()
}

/// Plans, checks and (if allowed) records one command answered with `response`.
fn run(own: &mut Ownership, client: ClientId, req: &[u8], response: &[u8]) -> Result<(), Status> {
    let plan = plan(req).map_err(|r| r.status())?;
    own.check(client, &plan)?;
    own.record(client, &plan, response);
    Ok(())
}

/// Creates an object for `client` with the request `req`, answered with `handle`.
fn make(own: &mut Ownership, client: ClientId, req: &[u8], kind: ObjectKind, handle: u32) {
    run(own, client, req, &created(kind, handle)).expect("create allowed");
    assert_eq!(own.owner(kind, handle), Some(client));
}

// ---------------------------------------------------------------------------- tests

/// What a plan is expected to say: names, creates, destroys.
type Expected = (
    Vec<(ObjectKind, u32)>,
    Option<ObjectKind>,
    Option<(ObjectKind, u32)>,
);

/// One valid request of every opcode a client may send, with its expected plan.
fn table() -> Vec<(Vec<u8>, Expected)> {
    let port = QueryPortReq {
        port_num: 1.into(),
        reserved: 0.into(),
    };
    let mut modify = ModifyQpReq::new_zeroed();
    modify.qp = 31.into();
    let mut extents = Vec::new();
    encode_extent_list([(0x40_0000, 0x2000)], &mut extents);
    let reg_ext =
        ControlRequest::RegMrExtents(RegMrExtents::new(reg_mr_req(13, 0x2000, 12, 1), &extents));
    let d = |kind, h| (vec![(kind, h)], None, Some((kind, h)));
    let n = |kind, h| (vec![(kind, h)], None, None);
    vec![
        (ControlRequest::QueryDevice.to_vec(), (vec![], None, None)),
        (
            ControlRequest::QueryPort(port).to_vec(),
            (vec![], None, None),
        ),
        (
            ControlRequest::QueryGid(table_req()).to_vec(),
            (vec![], None, None),
        ),
        (
            ControlRequest::QueryPkey(table_req()).to_vec(),
            (vec![], None, None),
        ),
        (
            ControlRequest::QueryGidTable(table_req()).to_vec(),
            (vec![], None, None),
        ),
        (alloc_pd(), (vec![], Some(Pd), None)),
        (ControlRequest::DeallocPd(hreq(11)).to_vec(), d(Pd, 11)),
        (reg_mr(12, &[0x1000]), (vec![(Pd, 12)], Some(Mr), None)),
        (ControlRequest::DeregMr(hreq(14)).to_vec(), d(Mr, 14)),
        (
            rereg_mr(15, rereg_flags::CHANGE_PD, 16, &[]),
            (vec![(Mr, 15), (Pd, 16)], None, None),
        ),
        (reg_ext.to_vec(), (vec![(Pd, 13)], Some(Mr), None)),
        (alloc_mw(17), (vec![(Pd, 17)], Some(Mw), None)),
        (ControlRequest::DeallocMw(hreq(18)).to_vec(), d(Mw, 18)),
        (create_cq(), (vec![], Some(Cq), None)),
        (ControlRequest::DestroyCq(hreq(21)).to_vec(), d(Cq, 21)),
        (
            ControlRequest::ArmCq(ArmCqReq {
                cq: 22.into(),
                flags: 0.into(),
            })
            .to_vec(),
            n(Cq, 22),
        ),
        (
            ControlRequest::ResizeCq(ResizeCqReq {
                cq: 23.into(),
                cqe: 1.into(),
            })
            .to_vec(),
            n(Cq, 23),
        ),
        (
            create_qp(1, 2, 3, 4),
            (vec![(Pd, 1), (Cq, 2), (Cq, 3), (Srq, 4)], Some(Qp), None),
        ),
        (ControlRequest::ModifyQp(modify).to_vec(), n(Qp, 31)),
        (
            ControlRequest::QueryQp(QueryQpReq {
                qp: 32.into(),
                attr_mask: 0.into(),
            })
            .to_vec(),
            n(Qp, 32),
        ),
        (ControlRequest::DestroyQp(hreq(33)).to_vec(), d(Qp, 33)),
        (create_srq(41), (vec![(Pd, 41)], Some(Srq), None)),
        (
            ControlRequest::ModifySrq(ModifySrqReq {
                srq: 42.into(),
                attr_mask: srq_attr::LIMIT.into(),
                max_wr: 0.into(),
                srq_limit: 1.into(),
            })
            .to_vec(),
            n(Srq, 42),
        ),
        (ControlRequest::QuerySrq(hreq(43)).to_vec(), n(Srq, 43)),
        (ControlRequest::DestroySrq(hreq(44)).to_vec(), d(Srq, 44)),
        (
            ControlRequest::ResizeSrq(ResizeSrqReq {
                srq: 45.into(),
                max_wr: 64.into(),
            })
            .to_vec(),
            n(Srq, 45),
        ),
        (create_ah(51), (vec![(Pd, 51)], Some(Ah), None)),
        (ControlRequest::DestroyAh(hreq(52)).to_vec(), d(Ah, 52)),
    ]
    .into_iter()
    .chain(cm_table())
    .collect()
}

/// A `cm_addr` of `fe80::1`, port 7600.
fn link_local() -> CmAddr {
    let mut a = CmAddr::NONE;
    a.family = cm_family::INET6.into();
    a.port = 7600.into();
    a.addr[..2].copy_from_slice(&[0xfe, 0x80]);
    a.addr[15] = 1;
    a
}

fn conn(id: u32, qp: u32) -> CmConnReq {
    let mut r = CmConnReq::new_zeroed();
    r.id = id.into();
    r.qp = qp.into();
    r
}

/// One valid request of every connection-manager opcode, with its expected plan.
fn cm_table() -> Vec<(Vec<u8>, Expected)> {
    let n = |h| (vec![(CmId, h)], None, None);
    let mut reject = CmRejectReq::new_zeroed();
    reject.id = 68.into();
    [
        (
            CmRequest::DestroyId(hreq(61)),
            (vec![(CmId, 61)], None, Some((CmId, 61))),
        ),
        (
            CmRequest::Bind(CmBindReq {
                id: 62.into(),
                reserved: 0.into(),
                addr: link_local(),
            }),
            n(62),
        ),
        (
            CmRequest::ResolveAddr(CmResolveAddrReq {
                id: 63.into(),
                timeout_ms: 1000.into(),
                src: CmAddr::NONE,
                dst: link_local(),
            }),
            n(63),
        ),
        (
            CmRequest::ResolveRoute(CmResolveRouteReq {
                id: 64.into(),
                timeout_ms: 1000.into(),
            }),
            n(64),
        ),
        (
            CmRequest::Listen(CmListenReq {
                id: 65.into(),
                backlog: 8.into(),
            }),
            n(65),
        ),
        (
            CmRequest::Connect(conn(66, 71)),
            (vec![(CmId, 66), (Qp, 71)], None, None),
        ),
        (
            CmRequest::Accept(conn(67, 72)),
            (vec![(CmId, 67), (Qp, 72)], None, None),
        ),
        (CmRequest::Reject(reject), n(68)),
        (CmRequest::Disconnect(hreq(69)), n(69)),
        (
            CmRequest::InitQpAttr(CmInitQpAttrReq {
                id: 70.into(),
                qp_state: 1.into(),
            }),
            n(70),
        ),
        (CmRequest::GetEvent, (vec![], None, None)),
        (
            CmRequest::SetOption(CmSetOptionReq {
                id: 73.into(),
                name: cm_option::REUSEADDR.into(),
                value: 1.into(),
                reserved: 0.into(),
            }),
            n(73),
        ),
        (
            CmRequest::Notify(CmNotifyReq {
                id: 74.into(),
                event: 3.into(),
            }),
            n(74),
        ),
        (CmRequest::QueryAddr(hreq(75)), n(75)),
        (
            CmRequest::MoveQp(CmMoveQpReq {
                id: 76.into(),
                qp: 77.into(),
                qp_state: 2.into(),
                responder_resources: CM_HOST_DEPTH,
                initiator_depth: 1,
                reserved: 0.into(),
            }),
            (vec![(CmId, 76), (Qp, 77)], None, None),
        ),
    ]
    .into_iter()
    .map(|(req, expected)| (ControlRequest::Cm(req).to_vec(), expected))
    .chain([(create_cm_id(), (vec![], Some(CmId), None))])
    .collect()
}

#[test]
fn accepting_without_a_qp_names_only_the_id() {
    let p = plan(&ControlRequest::Cm(CmRequest::Accept(conn(67, 0))).to_vec()).unwrap();
    assert_eq!(p.names, vec![(CmId, 67)]);
}

#[test]
fn every_client_opcode_is_planned() {
    let mut seen = HashSet::new();
    for (req, (names, creates, destroys)) in table() {
        let p = plan(&req).unwrap_or_else(|e| panic!("{req:02x?}: {e}"));
        assert_eq!(p.names, names, "{}", p.opcode.name());
        assert_eq!(p.creates, creates, "{}", p.opcode.name());
        assert_eq!(p.destroys, destroys, "{}", p.opcode.name());
        assert!(seen.insert(p.opcode), "{} twice", p.opcode.name());
    }
    let client_ops: HashSet<Opcode> = Opcode::ALL
        .into_iter()
        .filter(|op| !matches!(op, Opcode::SetDoorbellArea | Opcode::DiscardState))
        .collect();
    assert_eq!(seen, client_ops);
}

#[test]
fn create_qp_without_srq_names_no_srq() {
    let p = plan(&create_qp(1, 2, 2, 0)).unwrap();
    assert_eq!(p.names, vec![(Pd, 1), (Cq, 2), (Cq, 2)]);
}

#[test]
fn agent_only_and_malformed_requests_are_refused() {
    let doorbell = ControlRequest::SetDoorbellArea(SetDoorbellAreaReq {
        gpa: 0x1000.into(),
        slots: 64.into(),
        reserved: 0.into(),
    });
    assert_eq!(ControlRequest::decode(&doorbell.to_vec()), Ok(doorbell));
    for req in [doorbell.to_vec(), ControlRequest::DiscardState.to_vec()] {
        let refusal = plan(&req).unwrap_err();
        assert!(matches!(refusal, Refusal::AgentOnly(_)), "{refusal:?}");
        assert_eq!(refusal.status(), Status::Invalid);
    }
    let unknown = plan(&[0xff, 0x00, 0, 0, 0, 0, 0, 0]).unwrap_err();
    assert_eq!(
        unknown,
        Refusal::Malformed(DecodeError::UnknownOpcode(0xff))
    );
    assert_eq!(unknown.status(), Status::Unsupported);
    let short = plan(&ControlRequest::DeallocPd(hreq(1)).to_vec()[..12]).unwrap_err();
    assert!(matches!(
        short,
        Refusal::Malformed(DecodeError::Short { .. })
    ));
    assert_eq!(short.status(), Status::Invalid);
    for status in [
        Status::Invalid,
        Status::Unsupported,
        Status::BadHandle,
        Status::Quota,
    ] {
        let bytes = Ownership::refusal_response(status);
        let decoded = ControlResponse::decode(Opcode::AllocPd, &bytes);
        assert_eq!(decoded, Ok(ControlResponse::Err(StatusError::new(status))));
    }
}

#[test]
fn created_handle_reads_only_successes_of_the_right_kind() {
    for kind in ObjectKind::ALL {
        let (req, ..) = table()
            .into_iter()
            .find(|(_, expected)| expected.1 == Some(kind))
            .expect("a create per kind");
        let op = plan(&req).unwrap().opcode;
        assert_eq!(
            created_handle(kind, op, &created(kind, 0x0100_0007)),
            Some(0x0100_0007)
        );
        assert!(succeeded(op, &created(kind, 7)));
        assert_eq!(created_handle(kind, op, &created(kind, 0)), None);
        let refusal = Ownership::refusal_response(Status::Quota);
        assert_eq!(created_handle(kind, op, &refusal), None);
        assert!(!succeeded(op, &refusal));
        let other = if kind == Pd { Cq } else { Pd };
        assert_eq!(created_handle(other, op, &created(kind, 7)), None);
        assert_eq!(created_handle(kind, op, &created(kind, 7)[..12]), None);
    }
    assert!(succeeded(Opcode::DestroyQp, &ok_empty()));
    assert!(!succeeded(Opcode::DestroyQp, &created(Pd, 1)));
}

#[test]
fn other_clients_handles_look_unknown_and_reused_values_change_owner() {
    let mut own = Ownership::new(Quotas::default());
    make(&mut own, 1, &alloc_pd(), Pd, 5);
    make(&mut own, 1, &create_cq(), Cq, 6);
    make(&mut own, 1, &create_qp(5, 6, 6, 0), Qp, 7);
    make(&mut own, 2, &alloc_pd(), Pd, 8);
    make(&mut own, 2, &create_cq(), Cq, 9);

    let query = |qp: u32| {
        ControlRequest::QueryQp(QueryQpReq {
            qp: qp.into(),
            attr_mask: 0.into(),
        })
        .to_vec()
    };
    let destroy_qp = ControlRequest::DestroyQp(hreq(7)).to_vec();
    assert_eq!(
        run(&mut own, 2, &query(7), &ok_empty()),
        Err(Status::BadHandle)
    );
    assert_eq!(
        run(&mut own, 2, &destroy_qp, &ok_empty()),
        Err(Status::BadHandle)
    );
    // One foreign handle among own ones is enough.
    assert_eq!(
        own.check(2, &plan(&create_qp(8, 9, 6, 0)).unwrap()),
        Err(Status::BadHandle)
    );
    assert_eq!(
        own.check(2, &plan(&create_qp(5, 9, 9, 0)).unwrap()),
        Err(Status::BadHandle)
    );
    assert_eq!(own.check(2, &plan(&create_qp(8, 9, 9, 0)).unwrap()), Ok(()));
    assert_eq!(own.check(1, &plan(&query(7)).unwrap()), Ok(()));
    assert_eq!(own.owner(Qp, 7), Some(1));

    // A failed destroy keeps the QP; a successful one releases it.
    let busy = Ownership::refusal_response(Status::Busy);
    assert_eq!(run(&mut own, 1, &destroy_qp, &busy), Ok(()));
    assert_eq!(own.owner(Qp, 7), Some(1));
    assert_eq!(run(&mut own, 1, &destroy_qp, &ok_empty()), Ok(()));
    assert_eq!(own.owner(Qp, 7), None);
    assert_eq!(
        run(&mut own, 1, &query(7), &ok_empty()),
        Err(Status::BadHandle)
    );

    make(&mut own, 2, &create_qp(8, 9, 9, 0), Qp, 7);
    assert_eq!(own.check(2, &plan(&query(7)).unwrap()), Ok(()));
    assert_eq!(
        own.check(1, &plan(&query(7)).unwrap()),
        Err(Status::BadHandle)
    );
    // Same value, other namespace: client 1's PD 5 is not client 2's QP.
    assert_eq!(own.owner(Pd, 5), Some(1));
    assert!(own.counts(1).contains(&(Qp, 0)));
    assert!(own.counts(2).contains(&(Qp, 1)));
}

#[test]
fn a_reissued_handle_still_in_the_table_changes_owner() {
    let mut own = Ownership::new(Quotas::default());
    make(&mut own, 1, &alloc_pd(), Pd, 3);
    make(&mut own, 2, &alloc_pd(), Pd, 3);
    assert!(own.counts(1).contains(&(Pd, 0)));
    assert!(own.counts(2).contains(&(Pd, 1)));
    assert_eq!(own.release_order(1), vec![]);
}

#[test]
fn a_destroy_recorded_after_the_handle_was_reused_leaves_the_new_owner() {
    // Client 1 destroys its PD 3 on the device; before it records that, the device gives
    // 3 to client 2's new PD, and client 2 records first.
    let mut own = Ownership::new(Quotas::default());
    make(&mut own, 1, &alloc_pd(), Pd, 3);
    let destroy = plan(&ControlRequest::DeallocPd(hreq(3)).to_vec()).unwrap();
    assert_eq!(own.check(1, &destroy), Ok(()));
    make(&mut own, 2, &alloc_pd(), Pd, 3);
    own.record(1, &destroy, &ok_empty());
    assert_eq!(own.owner(Pd, 3), Some(2));
    assert!(own.counts(1).contains(&(Pd, 0)));
    assert!(own.counts(2).contains(&(Pd, 1)));
    // And a process that leaves forgets only its own entries.
    make(&mut own, 1, &alloc_pd(), Pd, 4);
    assert_eq!(own.forget_client(1), 1);
    assert_eq!(own.owner(Pd, 3), Some(2));
}

#[test]
fn quotas_are_per_client_and_per_kind() {
    let quotas = Quotas {
        qps: 2,
        ..Quotas::default()
    };
    assert_eq!(quotas.limit(Qp), 2);
    assert_eq!(Quotas::default().limit(Pd), 64);
    let mut own = Ownership::new(quotas);
    make(&mut own, 1, &alloc_pd(), Pd, 1);
    make(&mut own, 1, &create_cq(), Cq, 1);
    make(&mut own, 1, &create_qp(1, 1, 1, 0), Qp, 1);
    make(&mut own, 1, &create_qp(1, 1, 1, 0), Qp, 2);
    let third = create_qp(1, 1, 1, 0);
    assert_eq!(
        run(&mut own, 1, &third, &created(Qp, 3)),
        Err(Status::Quota)
    );
    assert_eq!(own.owner(Qp, 3), None);
    // Other kinds and other clients are unaffected.
    make(&mut own, 1, &create_cq(), Cq, 2);
    make(&mut own, 2, &alloc_pd(), Pd, 2);
    make(&mut own, 2, &create_cq(), Cq, 3);
    make(&mut own, 2, &create_qp(2, 3, 3, 0), Qp, 4);
    // A destroy frees one.
    run(&mut own, 1, &Ownership::destroy_request(Qp, 1), &ok_empty()).unwrap();
    make(&mut own, 1, &third, Qp, 3);
    assert_eq!(
        run(&mut own, 1, &third, &created(Qp, 5)),
        Err(Status::Quota)
    );
    let zero = Ownership::new(Quotas {
        pds: 0,
        ..Quotas::default()
    });
    assert_eq!(
        zero.check(9, &plan(&alloc_pd()).unwrap()),
        Err(Status::Quota)
    );
}

/// A device model of the `BUSY` rules of spec §7.4 (and DEREG_MR of an MR a window is bound
/// to, which rxe refuses): an object cannot go while a live object refers to it.
#[derive(Default)]
struct Device {
    refs: HashMap<(ObjectKind, u32), Vec<(ObjectKind, u32)>>,
}

impl Device {
    fn execute(&mut self, req: &[u8]) -> Vec<u8> {
        let p = plan(req).expect("agent requests decode");
        let target = p.destroys.expect("a destroy");
        if self.refs.values().any(|r| r.contains(&target)) {
            return Ownership::refusal_response(Status::Busy);
        }
        match self.refs.remove(&target) {
            Some(_) => destroyed(target.0),
            None => Ownership::refusal_response(Status::BadHandle),
        }
    }
}

/// Client 1 with one object of each kind, all referring to what they depend on, and the
/// device model holding them; client 2 with a PD.
fn populated() -> (Ownership, Device) {
    let mut own = Ownership::new(Quotas::default());
    let mut dev = Device::default();
    let mut add = |own: &mut Ownership, client, req: Vec<u8>, kind, h, extra: &[_]| {
        make(own, client, &req, kind, h);
        let mut refs = plan(&req).unwrap().names;
        refs.extend_from_slice(extra);
        dev.refs.insert((kind, h), refs);
    };
    add(&mut own, 1, alloc_pd(), Pd, 1, &[]);
    add(&mut own, 1, reg_mr(1, &[0x1000]), Mr, 2, &[]);
    add(&mut own, 1, create_cq(), Cq, 3, &[]);
    add(&mut own, 1, create_cq(), Cq, 4, &[]);
    add(&mut own, 1, create_srq(1), Srq, 5, &[]);
    add(&mut own, 1, create_qp(1, 3, 4, 5), Qp, 6, &[]);
    add(&mut own, 1, create_ah(1), Ah, 7, &[]);
    // A type-2 window bound to the MR through the QP holds both.
    add(&mut own, 1, alloc_mw(1), Mw, 8, &[(Mr, 2), (Qp, 6)]);
    // A CM id that connected the QP holds it.
    add(&mut own, 1, create_cm_id(), CmId, 10, &[(Qp, 6)]);
    add(&mut own, 2, alloc_pd(), Pd, 9, &[]);
    (own, dev)
}

#[test]
fn release_order_destroys_dependents_first() {
    let (mut own, mut dev) = populated();
    let order = own.release_order(1);
    assert_eq!(
        order,
        vec![
            (CmId, 10),
            (Mw, 8),
            (Qp, 6),
            (Srq, 5),
            (Cq, 3),
            (Cq, 4),
            (Ah, 7),
            (Mr, 2),
            (Pd, 1)
        ]
    );
    for (kind, h) in order {
        let req = Ownership::destroy_request(kind, h);
        let p = plan(&req).unwrap();
        assert_eq!(p.destroys, Some((kind, h)));
        assert_eq!(own.check(1, &p), Ok(()));
        let response = dev.execute(&req);
        assert_eq!(response, destroyed(kind), "destroying {kind:?} {h}");
        own.record(1, &p, &response);
    }
    assert_eq!(own.release_order(1), vec![]);
    assert!(own.counts(1).iter().all(|&(_, n)| n == 0));
    assert_eq!(own.forget_client(1), 0);
    assert_eq!(own.owner(Pd, 9), Some(2));
}

#[test]
fn the_device_model_refuses_a_wrong_order() {
    let (mut own, mut dev) = populated();
    let mut busy = 0;
    for (kind, h) in own.release_order(1).into_iter().rev() {
        let req = Ownership::destroy_request(kind, h);
        let response = dev.execute(&req);
        busy += usize::from(response != destroyed(kind));
        own.record(1, &plan(&req).unwrap(), &response);
    }
    assert_eq!(busy, 6, "PD, MR, CQs, SRQ and QP are busy in reverse order");
    assert_eq!(
        own.release_order(1),
        vec![(Qp, 6), (Srq, 5), (Cq, 3), (Cq, 4), (Mr, 2), (Pd, 1)]
    );
    assert_eq!(own.forget_client(1), 6);
    assert_eq!(own.release_order(1), vec![]);
    assert_eq!(own.owner(Pd, 1), None);
    assert_eq!(own.owner(Pd, 9), Some(2));
}

#[test]
fn guest_ranges_of_memory_registrations() {
    let p = plan(&reg_mr(1, &[0x10000, 0x11000, 0x30000, 0x20000])).unwrap();
    assert_eq!(
        p.guest_ranges,
        vec![(0x10000, 0x2000), (0x30000, 0x1000), (0x20000, 0x1000)]
    );

    // Page size from page_shift: one 2 MiB page.
    let mut list = Vec::new();
    encode_page_list([0x4020_0000], &mut list);
    let huge = RegMr::new(reg_mr_req(1, 0x1000, 21, 1), &list);
    let p = plan(&ControlRequest::RegMr(huge).to_vec()).unwrap();
    assert_eq!(p.guest_ranges, vec![(0x4020_0000, 0x20_0000)]);

    let mut extents = Vec::new();
    encode_extent_list([(0x80_0000, 0x3000), (0x10_0000, 0x1000)], &mut extents);
    let req = RegMrExtents::new(reg_mr_req(1, 0x4000, 12, 2), &extents);
    let p = plan(&ControlRequest::RegMrExtents(req).to_vec()).unwrap();
    assert_eq!(
        p.guest_ranges,
        vec![(0x80_0000, 0x3000), (0x10_0000, 0x1000)]
    );

    let both = rereg_flags::CHANGE_TRANSLATION | rereg_flags::CHANGE_PD;
    let p = plan(&rereg_mr(2, both, 3, &[0x5000, 0x7000])).unwrap();
    assert_eq!(p.names, vec![(Mr, 2), (Pd, 3)]);
    assert_eq!(p.guest_ranges, vec![(0x5000, 0x1000), (0x7000, 0x1000)]);
    let p = plan(&rereg_mr(2, rereg_flags::CHANGE_TRANSLATION, 0, &[0x5000])).unwrap();
    assert_eq!(p.names, vec![(Mr, 2)]);
    assert_eq!(p.guest_ranges, vec![(0x5000, 0x1000)]);
    let p = plan(&rereg_mr(2, rereg_flags::CHANGE_PD, 3, &[])).unwrap();
    assert_eq!(p.guest_ranges, vec![]);
    for (req, ..) in table() {
        let p = plan(&req).unwrap();
        let maps = matches!(p.opcode, Opcode::RegMr | Opcode::RegMrExtents);
        assert_eq!(!p.guest_ranges.is_empty(), maps, "{}", p.opcode.name());
    }
}

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Feeds one input through everything that takes untrusted bytes.
fn exercise(own: &mut Ownership, bytes: &[u8], response: &[u8]) {
    if let Ok(p) = plan(bytes) {
        let _ = own.check(1, &p);
        own.record(1, &p, response);
    }
    for op in Opcode::ALL {
        let _ = succeeded(op, response);
        for kind in ObjectKind::ALL {
            let _ = created_handle(kind, op, response);
        }
    }
}

#[test]
fn garbage_never_panics() {
    let mut own = Ownership::new(Quotas::default());
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..5000 {
        let len = (xorshift(&mut seed) % 320) as usize;
        let mut bytes: Vec<u8> = (0..len).map(|_| xorshift(&mut seed) as u8).collect();
        if i % 2 == 0 && len >= 8 {
            // A valid header, so that the body decoders see the garbage too.
            let op = Opcode::ALL[(xorshift(&mut seed) % 44) as usize];
            bytes[..2].copy_from_slice(&(op as u16).to_le_bytes());
            bytes[2..8].fill(0);
        }
        let mut response = bytes.clone();
        if i % 3 == 0 && response.len() >= 8 {
            response[..8].fill(0); // status OK
        }
        exercise(&mut own, &bytes, &response);
    }
    for (req, ..) in table() {
        for cut in 0..req.len() {
            assert!(
                plan(&req[..cut]).is_err(),
                "{:02x?} cut at {cut}",
                &req[..8]
            );
            exercise(&mut own, &req[..cut], &req[..cut]);
        }
        let mut longer = req.clone();
        longer.push(0);
        assert!(plan(&longer).is_err());
    }
}

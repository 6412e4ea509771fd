//! Malformed input is rejected with the right error and status.

mod common;

use common::*;
use vrdma_spec::verbs::{AccessFlags, QpAttrMask};
use vrdma_spec::wire::*;
use vrdma_spec::{
    ControlRequest, ControlResponse, DecodeError, Event, Le32, Le64, Opcode, RegMr, Status,
};
use zerocopy::IntoBytes;

fn enc(r: ControlRequest<'_>) -> Vec<u8> {
    r.to_vec()
}

fn reg_mr_bytes(req: RegMrReq, pages: &[u64]) -> Vec<u8> {
    let mut list = Vec::new();
    vrdma_spec::control::encode_page_list(pages.iter().copied(), &mut list);
    enc(ControlRequest::RegMr(RegMr::new(req, &list)))
}

#[test]
fn short_and_empty_inputs() {
    assert!(matches!(
        ControlRequest::decode(&[]),
        Err(DecodeError::Short { needed: 8, got: 0 })
    ));
    assert!(matches!(
        ControlRequest::decode(&[1, 0, 0]),
        Err(DecodeError::Short { .. })
    ));
    let pages = page_list();
    for req in all_requests(&pages) {
        let bytes = req.to_vec();
        for cut in 0..bytes.len() {
            let e = ControlRequest::decode(&bytes[..cut]).unwrap_err();
            assert_eq!(
                e.status(),
                Status::Invalid,
                "{:?} cut {cut}: {e}",
                req.opcode()
            );
            if cut >= 8 {
                assert!(matches!(e, DecodeError::Short { .. }), "{e}");
            }
        }
    }
}

#[test]
fn trailing_bytes_rejected() {
    let pages = page_list();
    for req in all_requests(&pages) {
        let mut bytes = req.to_vec();
        bytes.push(0);
        let e = ControlRequest::decode(&bytes).unwrap_err();
        assert!(
            matches!(e, DecodeError::Trailing { .. }),
            "{:?}: {e}",
            req.opcode()
        );
        assert_eq!(e.status(), Status::Invalid);
    }
}

#[test]
fn unknown_opcode_is_unsupported() {
    for op in [0u16, 0x0f, 0x12, 0x27, 0x26, 0x3f, 0x44, 0x62, 0xffff] {
        let mut b = vec![0u8; 8];
        b[..2].copy_from_slice(&op.to_le_bytes());
        let e = ControlRequest::decode(&b).unwrap_err();
        assert_eq!(e, DecodeError::UnknownOpcode(op));
        assert_eq!(e.status(), Status::Unsupported);
        assert_eq!(
            ControlResponse::from(e).into_result().unwrap_err().status(),
            Status::Unsupported
        );
    }
}

#[test]
fn reserved_header_fields() {
    let mut b = ControlRequest::AllocPd.to_vec();
    b[2] = 1;
    assert_eq!(
        ControlRequest::decode(&b),
        Err(DecodeError::Reserved("flags"))
    );
    let mut b = ControlRequest::AllocPd.to_vec();
    b[7] = 0x80;
    assert_eq!(
        ControlRequest::decode(&b),
        Err(DecodeError::Reserved("reserved"))
    );
    let mut b = enc(ControlRequest::DestroyQp(h(3)));
    b[12] = 1;
    assert_eq!(
        ControlRequest::decode(&b),
        Err(DecodeError::Reserved("reserved"))
    );
}

#[test]
fn reg_mr_validation() {
    let good = reg_mr_req();
    let pages = [0x1000_0000u64, 0x2000_3000, 0x7fff_f000];
    assert!(ControlRequest::decode(&reg_mr_bytes(good, &pages)).is_ok());

    // page_shift out of range
    for shift in [0u32, 11, 31, 64, u32::MAX] {
        let mut r = good;
        r.page_shift = Le32::new(shift);
        assert_eq!(
            ControlRequest::decode(&reg_mr_bytes(r, &pages)),
            Err(DecodeError::PageShift(shift))
        );
    }
    // npages does not cover offset + length exactly
    for (npages, expected) in [(2u32, 3u64), (4, 3), (0, 3)] {
        let mut r = good;
        r.npages = Le32::new(npages);
        let list: Vec<u64> = (0..npages as u64).map(|i| i << 12).collect();
        assert_eq!(
            ControlRequest::decode(&reg_mr_bytes(r, &list)),
            Err(DecodeError::PageCount {
                expected,
                got: npages
            })
        );
    }
    // one extra byte of length needs a fourth page
    let mut r = good;
    r.length = Le64::new(good.length.get() + 1);
    assert!(matches!(
        ControlRequest::decode(&reg_mr_bytes(r, &pages)),
        Err(DecodeError::PageCount { expected: 4, .. })
    ));
    // zero length
    let mut r = good;
    r.length = Le64::ZERO;
    assert!(matches!(
        ControlRequest::decode(&reg_mr_bytes(r, &pages)),
        Err(DecodeError::InvalidValue {
            field: "length",
            ..
        })
    ));
    // iova + length overflows
    let mut r = good;
    r.iova = Le64::new(u64::MAX - 0xff);
    r.length = Le64::new(0x200);
    r.npages = Le32::new(1);
    assert_eq!(
        ControlRequest::decode(&reg_mr_bytes(r, &[0])),
        Err(DecodeError::Overflow("iova + length"))
    );
    // absurd length: the page count cannot match a u32
    let mut r = good;
    r.length = Le64::new(u64::MAX / 2);
    assert!(matches!(
        ControlRequest::decode(&reg_mr_bytes(r, &pages)),
        Err(DecodeError::PageCount { .. })
    ));
    // misaligned page
    assert!(matches!(
        ControlRequest::decode(&reg_mr_bytes(good, &[0x1000_0000, 0x2000_3008, 0])),
        Err(DecodeError::Misaligned { field: "page", .. })
    ));
    // page at the top of the address space
    assert_eq!(
        ControlRequest::decode(&reg_mr_bytes(good, &[0, !0xfffu64, 0])),
        Err(DecodeError::Overflow("page address + page size"))
    );
    // declared pages missing / extra bytes
    let mut b = reg_mr_bytes(good, &pages);
    b.truncate(b.len() - 8);
    assert!(matches!(
        ControlRequest::decode(&b),
        Err(DecodeError::Short { .. })
    ));
    let mut b = reg_mr_bytes(good, &pages);
    b.extend_from_slice(&[0; 8]);
    assert!(matches!(
        ControlRequest::decode(&b),
        Err(DecodeError::Trailing { .. })
    ));
    // access flags
    for acc in [
        AccessFlags::ZERO_BASED.bits(),
        1 << 31,
        AccessFlags::REMOTE_WRITE.bits(),
    ] {
        let mut r = good;
        r.access = Le32::new(acc);
        assert!(
            matches!(
                ControlRequest::decode(&reg_mr_bytes(r, &pages)),
                Err(DecodeError::InvalidValue {
                    field: "access",
                    ..
                })
            ),
            "{acc:#x}"
        );
    }
    // a 2 MiB page list with 1 GiB pages: one page covers everything
    let mut r = good;
    r.page_shift = Le32::new(30);
    r.iova = Le64::new(0x4000_0000 + 5);
    r.length = Le64::new(100);
    r.npages = Le32::new(1);
    assert!(ControlRequest::decode(&reg_mr_bytes(r, &[0x8000_0000])).is_ok());
    assert!(matches!(
        ControlRequest::decode(&reg_mr_bytes(r, &[0x8000_1000])),
        Err(DecodeError::Misaligned { .. })
    ));
}

#[test]
fn enum_and_range_checks() {
    // CREATE_QP: bad type, bad sq_sig_all, SRQ with receive caps
    for (t, sig, srq, rwr) in [
        (5u8, 0u8, 0u32, 1u32),
        (8, 0, 0, 1),
        (2, 2, 0, 1),
        (2, 0, 5, 1),
        (0, 0, 0, 0),
    ] {
        let mut r = create_qp_req();
        r.qp_type = t;
        r.sq_sig_all = sig;
        r.srq = Le32::new(srq);
        r.max_recv_wr = Le32::new(rwr);
        let e = ControlRequest::decode(&enc(ControlRequest::CreateQp(r))).unwrap_err();
        assert_eq!(e.status(), Status::Invalid, "{e}");
    }
    // MODIFY_QP: reserved mask bits, out-of-range selected fields, unselected ignored
    let base = modify_qp_req();
    let mut r = base;
    r.attr_mask = Le32::new(base.attr_mask.get() | 1 << 22);
    assert!(matches!(
        ControlRequest::decode(&enc(ControlRequest::ModifyQp(r))),
        Err(DecodeError::InvalidValue {
            field: "attr_mask",
            ..
        })
    ));
    let mut r = base;
    r.attr.path_mtu = Le32::new(6);
    assert!(ControlRequest::decode(&enc(ControlRequest::ModifyQp(r))).is_err());
    let mut r = base;
    r.attr.rq_psn = Le32::new(1 << 24);
    assert!(ControlRequest::decode(&enc(ControlRequest::ModifyQp(r))).is_err());
    let mut r = base;
    r.attr.ah_attr.is_global = 2;
    assert!(ControlRequest::decode(&enc(ControlRequest::ModifyQp(r))).is_err());
    let mut r = base;
    r.attr.ah_attr.flow_label = Le32::new(1 << 20);
    assert!(ControlRequest::decode(&enc(ControlRequest::ModifyQp(r))).is_err());
    let mut r = base;
    r.attr.timeout = 200; // TIMEOUT not selected: ignored
    r.attr.qp_access_flags = Le32::new(u32::MAX); // not selected: ignored
    assert!(ControlRequest::decode(&enc(ControlRequest::ModifyQp(r))).is_ok());
    r.attr_mask = Le32::new(r.attr_mask.get() | QpAttrMask::TIMEOUT.bits());
    assert!(ControlRequest::decode(&enc(ControlRequest::ModifyQp(r))).is_err());
    let mut r = base;
    r.attr.reserved1 = Le32::new(1);
    assert!(matches!(
        ControlRequest::decode(&enc(ControlRequest::ModifyQp(r))),
        Err(DecodeError::Reserved(_))
    ));
    // ARM_CQ unknown flags, MODIFY_SRQ masks, CREATE_CQ zero, QUERY_PORT port 0
    let b = enc(ControlRequest::ArmCq(ArmCqReq {
        cq: Le32::new(1),
        flags: Le32::new(2),
    }));
    assert_eq!(
        ControlRequest::decode(&b),
        Err(DecodeError::Reserved("flags"))
    );
    for m in [0u32, 4, 0xffff_ffff] {
        let r = ModifySrqReq {
            srq: Le32::new(1),
            attr_mask: Le32::new(m),
            max_wr: Le32::ZERO,
            srq_limit: Le32::ZERO,
        };
        assert!(ControlRequest::decode(&enc(ControlRequest::ModifySrq(r))).is_err());
    }
    let r = CreateCqReq {
        cqe: Le32::ZERO,
        reserved: Le32::ZERO,
    };
    assert!(ControlRequest::decode(&enc(ControlRequest::CreateCq(r))).is_err());
    let r = ResizeCqReq {
        cq: Le32::new(1),
        cqe: Le32::ZERO,
    };
    assert!(ControlRequest::decode(&enc(ControlRequest::ResizeCq(r))).is_err());
    let r = QueryPortReq {
        port_num: Le32::ZERO,
        reserved: Le32::ZERO,
    };
    assert!(ControlRequest::decode(&enc(ControlRequest::QueryPort(r))).is_err());
    // CREATE_AH: sl and static rate
    let mut a = ah_attr();
    a.sl = 16;
    let r = CreateAhReq {
        pd: Le32::new(1),
        reserved: Le32::ZERO,
        ah_attr: a,
    };
    assert!(ControlRequest::decode(&enc(ControlRequest::CreateAh(r))).is_err());
}

#[test]
fn malformed_responses() {
    let op = Opcode::AllocPd;
    // unknown status
    let mut b = vec![0u8; 8];
    b[0] = 10;
    assert_eq!(
        ControlResponse::decode(op, &b),
        Err(DecodeError::UnknownStatus(10))
    );
    // detail with a status other than DEVICE_ERROR
    let mut b = vec![0u8; 8];
    b[0] = Status::Invalid as u8;
    b[4] = 1;
    assert!(ControlResponse::decode(op, &b).is_err());
    // error with a body
    let mut b = vec![0u8; 16];
    b[0] = Status::Busy as u8;
    assert!(matches!(
        ControlResponse::decode(op, &b),
        Err(DecodeError::Trailing { .. })
    ));
    // OK with a short or long body
    for len in [8usize, 15, 17] {
        let b = vec![0u8; len];
        assert!(ControlResponse::decode(op, &b).is_err(), "{len}");
    }
    // OK for a no-body command with a body
    assert!(ControlResponse::decode(Opcode::DestroyQp, &[0u8; 16]).is_err());
    assert!(ControlResponse::decode(Opcode::DestroyQp, &[0u8; 4]).is_err());
}

#[test]
fn malformed_events_and_doorbells() {
    let good = Event {
        event_type: vrdma_spec::EventType::Completion,
        handle: 3,
        detail: 0,
    }
    .to_bytes();
    assert!(Event::decode(&good[..15]).is_err());
    let mut long = good.to_vec();
    long.push(0);
    assert!(Event::decode(&long).is_err());
    let mut b = good;
    b[0] = 0;
    assert_eq!(Event::decode(&b), Err(DecodeError::UnknownEventType(0)));
    let mut b = good;
    b[0] = 99;
    assert_eq!(Event::decode(&b), Err(DecodeError::UnknownEventType(99)));
    let mut b = good;
    b[4..8].copy_from_slice(&0u32.to_le_bytes());
    assert!(Event::decode(&b).is_err(), "CQ event without handle");
    let mut b = good;
    b[8] = 1;
    assert!(Event::decode(&b).is_err(), "detail on a completion");
    let mut b = good;
    b[12] = 1;
    assert!(Event::decode(&b).is_err(), "reserved");
    let fatal = vrdma_spec::event::EventWire {
        event_type: Le32::new(14),
        handle: Le32::new(1),
        detail: Le32::new(2),
        reserved: Le32::ZERO,
    };
    assert!(
        Event::decode(fatal.as_bytes()).is_err(),
        "device event with handle"
    );
}

#[test]
fn memory_window_requests() {
    // ALLOC_MW: only types 1 and 2 exist.
    for mw_type in [0u32, 3, u32::MAX] {
        let r = AllocMwReq {
            pd: Le32::new(1),
            mw_type: Le32::new(mw_type),
        };
        let e = ControlRequest::decode(&enc(ControlRequest::AllocMw(r))).unwrap_err();
        assert!(
            matches!(
                e,
                DecodeError::InvalidValue {
                    field: "mw_type",
                    ..
                }
            ),
            "{e}"
        );
    }
    // Both commands, and a REG_MR that asks for MW_BIND, need VRDMA_F_MW.
    let r = AllocMwReq {
        pd: Le32::new(1),
        mw_type: Le32::new(1),
    };
    let alloc_bytes = enc(ControlRequest::AllocMw(r));
    let alloc = ControlRequest::decode(&alloc_bytes).unwrap();
    assert_eq!(alloc.required_features(), vrdma_spec::features::VRDMA_F_MW);
    let mut bind = reg_mr_req();
    bind.access = Le32::new((AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND).bits());
    let pages: Vec<u64> = (0..bind.npages.get() as u64)
        .map(|i| 0x10_0000 + i * 4096)
        .collect();
    let bytes = reg_mr_bytes(bind, &pages);
    let decoded = ControlRequest::decode(&bytes).unwrap();
    assert_eq!(
        decoded.required_features(),
        vrdma_spec::features::VRDMA_F_MW
    );
    let plain = reg_mr_bytes(reg_mr_req(), &pages);
    let decoded = ControlRequest::decode(&plain).unwrap();
    assert_eq!(decoded.required_features(), 0);
    // A REG_MR that asks for ON_DEMAND needs VRDMA_F_ODP.
    let mut odp = reg_mr_req();
    odp.access = Le32::new((AccessFlags::LOCAL_WRITE | AccessFlags::ON_DEMAND).bits());
    let odp_bytes = reg_mr_bytes(odp, &pages);
    let decoded = ControlRequest::decode(&odp_bytes).unwrap();
    assert_eq!(
        decoded.required_features(),
        vrdma_spec::features::VRDMA_F_ODP
    );
    // So does a REREG_MR that changes the access to one with MW_BIND.
    let mut rereg = rereg_mr_req();
    rereg.flags = Le32::new(vrdma_spec::control::rereg_flags::CHANGE_ACCESS);
    rereg.pd = Le32::ZERO;
    rereg.iova = Le64::ZERO;
    rereg.length = Le64::ZERO;
    rereg.page_shift = Le32::ZERO;
    rereg.npages = Le32::ZERO;
    rereg.access = Le32::new((AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND).bits());
    let bytes = enc(ControlRequest::ReregMr(vrdma_spec::control::ReregMr::new(
        rereg,
        &[],
    )));
    let decoded = ControlRequest::decode(&bytes).unwrap();
    assert_eq!(
        decoded.required_features(),
        vrdma_spec::features::VRDMA_F_MW
    );
    rereg.access = Le32::new(AccessFlags::LOCAL_WRITE.bits());
    let bytes = enc(ControlRequest::ReregMr(vrdma_spec::control::ReregMr::new(
        rereg,
        &[],
    )));
    assert_eq!(
        ControlRequest::decode(&bytes).unwrap().required_features(),
        0
    );
    // DEALLOC_MW takes the handle body with its reserved word zero.
    let mut b = enc(ControlRequest::DeallocMw(HandleReq {
        handle: Le32::new(1),
        reserved: Le32::ZERO,
    }));
    b[12] = 1;
    assert!(matches!(
        ControlRequest::decode(&b),
        Err(DecodeError::Reserved("reserved"))
    ));
}

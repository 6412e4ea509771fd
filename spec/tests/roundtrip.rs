//! Encode/decode round trips for every request, response, event and doorbell.

mod common;

use common::*;
use vrdma_spec::event::EVENT_SIZE;
use vrdma_spec::{ControlRequest, ControlResponse, Event, EventType, Opcode, Status, StatusError};
use vrdma_spec::{Le32, Le64};
use zerocopy::IntoBytes;

#[test]
fn every_request_round_trips() {
    let pages = page_list();
    let reqs = all_requests(&pages);
    let mut seen: Vec<Opcode> = reqs.iter().map(|r| r.opcode()).collect();
    seen.sort_by_key(|o| *o as u16);
    assert_eq!(seen, Opcode::ALL.to_vec(), "one fixture per opcode");
    for req in reqs {
        let bytes = req.to_vec();
        assert_eq!(bytes.len(), req.encoded_len());
        assert_eq!(&bytes[..2], &(req.opcode() as u16).to_le_bytes());
        let back = ControlRequest::decode(&bytes).unwrap_or_else(|e| panic!("{req:?}: {e}"));
        assert_eq!(back, req);
        assert_eq!(back.to_vec(), bytes, "encoding is canonical");
    }
}

#[test]
fn reg_mr_page_list_is_borrowed_and_iterable() {
    let pages = page_list();
    let req = all_requests(&pages)
        .into_iter()
        .find(|r| r.opcode() == Opcode::RegMr)
        .unwrap();
    let bytes = req.to_vec();
    let ControlRequest::RegMr(m) = ControlRequest::decode(&bytes).unwrap() else {
        panic!("not REG_MR")
    };
    assert_eq!(m.pages.len(), 3);
    assert_eq!(
        m.pages.iter().collect::<Vec<_>>(),
        vec![0x1000_0000, 0x2000_3000, 0x7fff_f000]
    );
    assert_eq!(m.pages.get(1), Some(0x2000_3000));
    assert_eq!(m.pages.get(3), None);
    assert_eq!(m.page_size(), 4096);
    assert_eq!(m.first_page_offset(), 0x100);
}

#[test]
fn every_response_round_trips() {
    for op in Opcode::ALL {
        let body = body_for(op);
        assert!(body.matches(op), "{op:?}");
        assert_eq!(body.as_bytes().len(), op.response_body_len(), "{op:?}");
        let ok = ControlResponse::Ok(body);
        let bytes = ok.to_vec();
        assert_eq!(bytes.len(), 8 + op.response_body_len());
        assert_eq!(ControlResponse::decode(op, &bytes).unwrap(), ok);

        for status in Status::ALL.into_iter().skip(1) {
            let err = if status == Status::DeviceError {
                StatusError::device_error(12)
            } else {
                StatusError::new(status)
            };
            let r = ControlResponse::Err(err);
            let bytes = r.to_vec();
            assert_eq!(bytes.len(), 8);
            let back = ControlResponse::decode(op, &bytes).unwrap();
            assert_eq!(back, r);
            assert_eq!(back.into_result().unwrap_err().status(), status);
        }
    }
}

#[test]
fn every_event_round_trips() {
    for t in EventType::ALL {
        let handle = match t.subject() {
            vrdma_spec::event::Subject::Device => 0,
            _ => 0x0200_0005,
        };
        let detail = if t.has_detail() { 17 } else { 0 };
        let e = Event {
            event_type: t,
            handle,
            detail,
        };
        let b = e.to_bytes();
        assert_eq!(b.len(), EVENT_SIZE);
        assert_eq!(Event::decode(&b).unwrap(), e);
    }
}

#[test]
fn set_doorbell_area_round_trips_and_validates() {
    use vrdma_spec::wire::SetDoorbellAreaReq;
    let req = SetDoorbellAreaReq {
        gpa: Le64::new(0x4000_0000),
        slots: Le32::new(1024),
        reserved: Le32::ZERO,
    };
    let bytes = ControlRequest::SetDoorbellArea(req).to_vec();
    assert_eq!(bytes.len(), 8 + 16);
    assert_eq!(
        ControlRequest::decode(&bytes).unwrap(),
        ControlRequest::SetDoorbellArea(req)
    );
    let misaligned = SetDoorbellAreaReq {
        gpa: Le64::new(0x4000_0040),
        ..req
    };
    assert!(ControlRequest::decode(&ControlRequest::SetDoorbellArea(misaligned).to_vec()).is_err());
    let odd_slots = SetDoorbellAreaReq {
        slots: Le32::new(1000),
        ..req
    };
    assert!(ControlRequest::decode(&ControlRequest::SetDoorbellArea(odd_slots).to_vec()).is_err());
}

#[test]
fn config_round_trips_and_checks_version() {
    use vrdma_spec::config::*;
    use vrdma_spec::DeviceConfig;
    use vrdma_spec::{Le16, Le32, Le64};
    let cfg = DeviceConfig {
        magic: Le32::new(MAGIC),
        version_major: Le16::new(VERSION_MAJOR),
        version_minor: Le16::new(VERSION_MINOR),
        ring_format: Le32::new(ring_format::RXE_V1),
        num_ports: Le32::new(1),
        shm_size: Le64::new(256 << 20),
        shm_id: Le32::new(0),
        shm_page_shift: Le32::new(12),
        max_request_size: Le32::new(40 + 8 * 65536),
        max_response_size: Le32::new(vrdma_spec::control::MAX_RESPONSE_SIZE as u32),
        max_mr_pages: Le32::new(65536),
        doorbell_slots: Le32::new(1024),
        epoch: Le32::new(1),
        odp_rc_caps: Le32::new(0x3f),
        odp_uc_caps: Le32::ZERO,
        odp_ud_caps: Le32::new(0x3),
    };
    assert_eq!(cfg.as_bytes().len(), CONFIG_SIZE);
    assert_eq!(&cfg.as_bytes()[..4], b"vRDM");
    assert_eq!(DeviceConfig::decode(cfg.as_wire()).unwrap(), cfg);
    let mut newer = cfg;
    newer.version_major = Le16::new(2);
    assert_eq!(
        DeviceConfig::decode(newer.as_bytes()),
        Err(vrdma_spec::DecodeError::UnsupportedVersion(2))
    );
    let mut minor = cfg;
    minor.version_minor = Le16::new(7);
    assert!(DeviceConfig::decode(minor.as_bytes()).is_ok());
    assert_eq!(
        cfg.odp_caps(),
        vrdma_spec::config::OdpCaps {
            rc: 0x3f,
            uc: 0,
            ud: 0x3
        }
    );
}

#[test]
fn ids_match_virtio() {
    assert_eq!(vrdma_spec::PCI_DEVICE_ID, 0x106a);
    assert_eq!(vrdma_spec::PCI_VENDOR_ID, 0x1af4);
    assert_eq!(vrdma_spec::VIRTIO_ID_RDMA, 42);
    assert_eq!(vrdma_spec::shm::VHOST_USER_PROTOCOL_F_SHMEM, 0x40_0000);
}

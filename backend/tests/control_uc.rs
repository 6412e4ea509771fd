//! UC queue pairs through the per-guest device: creation behind `VRDMA_F_UC`, the QP quota
//! they share with RC and UD, and MODIFY_QP through INIT, RTR and RTS with UC's attribute
//! masks, refusing RC's acknowledgement attributes before the host sees them.
//!
//! The real per-guest device (`GuestDevice`) driven through the `DeviceHandler` API on a host
//! without RDMA, over the fake host device of `vrdma_test_support::fake_host`.

use vrdma_backend::vhost_device::handler::DeviceHandler;
use vrdma_spec::features::*;
use vrdma_spec::verbs::{AccessFlags, Mtu, QpAttrMask, QpState, QpType};
use vrdma_spec::wire::{self, *};
use vrdma_spec::{ControlRequest, Le32, ResponseBody, Status};
use vrdma_test_support::fake_host::device::*;
use vrdma_test_support::fake_host::harness::*;
use zerocopy::FromZeros;

type M = QpAttrMask;

/// A UC QP on a fresh PD and CQ of `guest`; returns its handle.
fn create_uc_qp(guest: &TestGuest) -> Result<u32, Status> {
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(8).cq.get();
    let mut req = qp_req(pd, cq, 0);
    req.qp_type = QpType::Uc as u8;
    guest.create_qp(req).map(|r| r.qp.get())
}

/// The attributes of a whole UC connection (and RC's extras, for the refusals); `mask`
/// selects what the device applies.
fn modify(qp: u32, next: QpState, mask: QpAttrMask) -> ControlRequest<'static> {
    let mut attr = wire::QpAttr::new_zeroed()
        .with_qp_state(next)
        .with_path_mtu(Mtu::Mtu1024);
    attr.port_num = 1;
    attr.qp_access_flags = Le32::new((AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).bits());
    attr.dest_qp_num = Le32::new(0x123);
    attr.rq_psn = Le32::new(7);
    attr.sq_psn = Le32::new(9);
    attr.timeout = 14;
    attr.retry_cnt = 7;
    attr.rnr_retry = 7;
    attr.min_rnr_timer = 12;
    attr.max_rd_atomic = 1;
    attr.max_dest_rd_atomic = 1;
    attr.ah_attr = roce_av(0, GID0);
    ControlRequest::ModifyQp(ModifyQpReq {
        qp: Le32::new(qp),
        attr_mask: Le32::new((M::STATE | mask).bits()),
        attr,
    })
}

#[test]
fn uc_qps_need_the_feature_and_count_against_the_qp_quota() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), ALL_FEATURES);
    assert_ne!(guest.dev().device_features() & VRDMA_F_UC, 0);
    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);
    let qp = create_uc_qp(&guest).unwrap();
    let host = *fake.world().qps.keys().next().unwrap();
    assert_eq!(fake.world().qp_types[&host], QpType::Uc);
    let ResponseBody::QueryQp(q) = guest.ok(ControlRequest::QueryQp(QueryQpReq {
        qp: Le32::new(qp),
        attr_mask: Le32::new(M::STATE.bits()),
    })) else {
        panic!("QUERY_QP answered with another body")
    };
    assert_eq!(q.attr.qp_state.get(), QpState::Reset as u32);

    // The quota of the test options is 3 QPs, whatever their types.
    let pd = guest.alloc_pd();
    let cq = guest.create_cq(2).cq.get();
    guest.create_qp(qp_req(pd, cq, 0)).unwrap();
    create_uc_qp_on(&guest, pd, cq).unwrap();
    assert_eq!(create_uc_qp_on(&guest, pd, cq), Err(Status::Quota));
    assert_eq!(fake.world().qps.len(), 3);

    // A driver that did not accept VRDMA_F_UC cannot create one.
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), ALL_FEATURES & !VRDMA_F_UC);
    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);
    assert_eq!(create_uc_qp(&guest), Err(Status::Unsupported));
    assert!(fake.world().qps.is_empty());
}

fn create_uc_qp_on(guest: &TestGuest, pd: u32, cq: u32) -> Result<u32, Status> {
    let mut req = qp_req(pd, cq, 0);
    req.qp_type = QpType::Uc as u8;
    guest.create_qp(req).map(|r| r.qp.get())
}

#[test]
fn uc_connects_with_its_masks_and_refuses_rc_only_attributes() {
    use QpState::{Init, Rtr, Rts, Sqd};
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), ALL_FEATURES);
    assert_eq!(guest.set_doorbell_area(RAM_BASE), Status::Ok);
    let qp = create_uc_qp(&guest).unwrap();
    let host = *fake.world().qps.keys().next().unwrap();
    let refused = |next, mask| {
        let before = fake.world().modified.len();
        let status = guest.status(modify(qp, next, mask));
        assert_eq!(fake.world().modified.len(), before, "reached the host");
        status
    };

    // RESET -> INIT: a connected QP's access flags, not a datagram Q_Key.
    let init = M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
    assert_eq!(refused(Init, init | M::QKEY), Status::Invalid);
    assert_eq!(refused(Init, M::PKEY_INDEX | M::PORT), Status::Invalid);
    assert_eq!(guest.status(modify(qp, Init, init)), Status::Ok);

    // INIT -> RTR: path, MTU, destination and receive PSN; no responder resources or RNR
    // timer, which UC does not have.
    let rtr = M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    for rc_only in [M::MAX_DEST_RD_ATOMIC, M::MIN_RNR_TIMER] {
        assert_eq!(refused(Rtr, rtr | rc_only), Status::Invalid, "{rc_only:?}");
    }
    assert_eq!(refused(Rtr, rtr & !M::DEST_QPN), Status::Invalid);
    assert_eq!(refused(Rts, M::SQ_PSN), Status::BadState, "INIT -> RTS");
    assert_eq!(guest.status(modify(qp, Rtr, rtr)), Status::Ok);

    // RTR -> RTS: only the send PSN; none of RC's timeouts, retries or read depth.
    for rc_only in [
        M::TIMEOUT,
        M::RETRY_CNT,
        M::RNR_RETRY,
        M::MAX_QP_RD_ATOMIC,
        M::MIN_RNR_TIMER,
    ] {
        assert_eq!(
            refused(Rts, M::SQ_PSN | rc_only),
            Status::Invalid,
            "{rc_only:?}"
        );
    }
    assert_eq!(refused(Rts, M::empty()), Status::Invalid, "no SQ_PSN");
    assert_eq!(guest.status(modify(qp, Rts, M::SQ_PSN)), Status::Ok);

    // The host saw exactly the three transitions, with UC's masks.
    let modified: Vec<_> = fake.world().modified.clone();
    assert_eq!(
        modified,
        [
            (host, M::STATE | init, Init),
            (host, M::STATE | rtr, Rtr),
            (host, M::STATE | M::SQ_PSN, Rts),
        ]
    );
    assert_eq!(fake.world().qp_state[&host], Rts);

    // RTS -> SQD, then SQD -> SQD may move the path but not the port.
    assert_eq!(
        guest.status(modify(qp, Sqd, M::EN_SQD_ASYNC_NOTIFY)),
        Status::Ok
    );
    assert_eq!(refused(Sqd, M::PORT), Status::Invalid);
    assert_eq!(guest.status(modify(qp, Sqd, M::AV)), Status::Ok);
    assert_eq!(guest.status(modify(qp, Rts, M::empty())), Status::Ok);
    assert_eq!(
        guest.status(ControlRequest::DestroyQp(handle(qp))),
        Status::Ok
    );
    assert!(fake.world().qp_types.is_empty());
}

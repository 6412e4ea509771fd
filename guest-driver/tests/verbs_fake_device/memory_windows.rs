//! Memory windows through the fake's kernel: ALLOC_MW/DEALLOC_MW, a type-1 bind with
//! `Qp::bind_mw`, a type-2 bind with a BIND_MW request, remote WRITE and READ through the
//! window's rkey, LOCAL_INV and SEND_WITH_INV, and the remote access error afterwards.

use vrdma::spec::control::Opcode;
use vrdma::spec::features;
use vrdma::spec::Status;
use vrdma::verbs::{
    AccessFlags, Cq, Mr, MwType, SendFlags, SendWr, Sge, VerbsError, WcFlags, WcOpcode, WcStatus,
    WrOpcode,
};
use vrdma::Context;
use vrdma_test_support::fake_transport::{default_config, FakeTransport, Fault};

use super::helpers::*;

fn window_access() -> AccessFlags {
    AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
}

/// RDMA WRITE of `bytes` (inline) at `addr` through `rkey`; the completion's status.
fn write_through(
    t: &FakeTransport,
    qp: &vrdma::Qp,
    cq: &Cq,
    rkey: u32,
    addr: u64,
    bytes: &[u8],
) -> WcStatus {
    let sge = [Sge {
        addr: bytes.as_ptr() as u64,
        length: bytes.len() as u32,
        lkey: 0,
    }];
    let wr = SendWr {
        wr_id: 7,
        opcode: WrOpcode::RdmaWrite,
        flags: SendFlags::SIGNALED | SendFlags::INLINE,
        sg_list: &sge,
        remote_addr: addr,
        rkey,
        ..SendWr::default()
    };
    post(qp, &[wr]).unwrap();
    t.run_kernel();
    let wcs = poll_all(cq);
    assert_eq!(wcs.len(), 1);
    wcs[0].status
}

/// RDMA READ of `len` bytes at `addr` through `rkey` into `into`; the completion's status.
fn read_through(
    t: &FakeTransport,
    qp: &vrdma::Qp,
    cq: &Cq,
    rkey: u32,
    addr: u64,
    into: &Mr<'_>,
    len: usize,
) -> WcStatus {
    let sge = [into.sge(0, len).unwrap()];
    let wr = SendWr {
        wr_id: 8,
        opcode: WrOpcode::RdmaRead,
        flags: SendFlags::SIGNALED,
        sg_list: &sge,
        remote_addr: addr,
        rkey,
        ..SendWr::default()
    };
    post(qp, &[wr]).unwrap();
    t.run_kernel();
    let wcs = poll_all(cq);
    assert_eq!(wcs.len(), 1);
    wcs[0].status
}

fn one_completion(t: &FakeTransport, cq: &Cq) -> vrdma::verbs::WorkCompletion {
    t.run_kernel();
    let wcs = poll_all(cq);
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    wcs[0]
}

#[test]
fn windows_are_allocated_bound_used_and_invalidated() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (Cq::new(&ctx, 32).unwrap(), Cq::new(&ctx, 32).unwrap());
    let (a, b) = connected_pair(&pd, &cq_a, &cq_b);
    let target = ctx.alloc_buffer(4096).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::MW_BIND;
    let target_mr = pd.register(&target, access).unwrap();
    let scratch = ctx.alloc_buffer(256).unwrap();
    let scratch_mr = pd.register(&scratch, AccessFlags::LOCAL_WRITE).unwrap();
    let base = target_mr.addr();

    // Type 1: bound with Qp::bind_mw on B (the target's side), which moves its key on.
    let mw1 = pd.alloc_mw(MwType::Type1).unwrap();
    let before = mw1.rkey();
    let bind = mw1.bind_info(&target_mr, base, 1024, window_access());
    // Type 1 only, and only under the window's current key.
    let stale = vrdma::verbs::MwBind {
        mw_rkey: before ^ 1,
        ..bind
    };
    assert!(b.bind_mw(&mw1, 1, SendFlags::SIGNALED, stale).is_err());
    let rkey1 = b.bind_mw(&mw1, 1, SendFlags::SIGNALED, bind).unwrap();
    assert_eq!(rkey1, vrdma::verbs::inc_rkey(before));
    assert_eq!(mw1.rkey(), rkey1);
    let wc = one_completion(&t, &cq_b);
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::BindMw)
    );
    let data: Vec<u8> = (0..64u8).collect();
    assert_eq!(
        write_through(&t, &a, &cq_a, rkey1, base + 16, &data),
        WcStatus::Success
    );
    assert_eq!(&target.as_slice()[16..80], &data[..]);
    assert_eq!(
        read_through(&t, &a, &cq_a, rkey1, base + 16, &scratch_mr, 64),
        WcStatus::Success
    );
    assert_eq!(&scratch.as_slice()[..64], &data[..]);
    // Outside the window: refused, although the MR covers it.
    assert_eq!(
        write_through(&t, &a, &cq_a, rkey1, base + 2048, &data),
        WcStatus::RemAccessErr
    );

    // Type 2: bound by a BIND_MW request on B, used by A, invalidated by LOCAL_INV on B.
    let (a, b) = connected_pair(&pd, &cq_a, &cq_b);
    let mw2 = pd.alloc_mw(MwType::Type2).unwrap();
    let bind = mw2.bind_info(&target_mr, base + 1024, 1024, window_access());
    let refused = b.bind_mw(&mw2, 2, SendFlags::SIGNALED, bind);
    assert!(
        refused.is_err(),
        "type 2 windows are bound by work requests"
    );
    post(&b, &[SendWr::bind_mw(2, bind, SendFlags::SIGNALED)]).unwrap();
    let wc = one_completion(&t, &cq_b);
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::BindMw)
    );
    mw2.set_rkey(bind.rkey);
    assert_eq!(
        write_through(&t, &a, &cq_a, mw2.rkey(), base + 1024, &data),
        WcStatus::Success
    );
    assert_eq!(&target.as_slice()[1024..1088], &data[..]);
    post(&b, &[SendWr::local_inv(3, mw2.rkey(), SendFlags::SIGNALED)]).unwrap();
    let wc = one_completion(&t, &cq_b);
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::LocalInv)
    );
    assert_eq!(
        write_through(&t, &a, &cq_a, mw2.rkey(), base + 1024, &data),
        WcStatus::RemAccessErr
    );

    // Bound again under its next key, then invalidated remotely by A's SEND_WITH_INV.
    let (a, b) = connected_pair(&pd, &cq_a, &cq_b);
    let bind = mw2.bind_info(&target_mr, base + 1024, 1024, window_access());
    post(&b, &[SendWr::bind_mw(4, bind, SendFlags::SIGNALED)]).unwrap();
    assert_eq!(one_completion(&t, &cq_b).status, WcStatus::Success);
    mw2.set_rkey(bind.rkey);
    b.post_recv(&[vrdma::verbs::RecvWr {
        wr_id: 5,
        sg_list: &[scratch_mr.sge(0, 64).unwrap()],
    }])
    .unwrap();
    let msg = [0x11u8; 8];
    let sge = [Sge {
        addr: msg.as_ptr() as u64,
        length: 8,
        lkey: 0,
    }];
    let send = SendWr::send_with_inv(6, &sge, mw2.rkey(), SendFlags::SIGNALED | SendFlags::INLINE);
    post(&a, &[send]).unwrap();
    t.run_kernel();
    let sent = poll_all(&cq_a);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].status, WcStatus::Success);
    let received = poll_all(&cq_b);
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].opcode, WcOpcode::Recv);
    assert!(
        received[0].wc_flags.contains(WcFlags::WITH_INV),
        "{:?}",
        received[0].wc_flags
    );
    assert!(!received[0].wc_flags.contains(WcFlags::IP_CSUM_OK));
    assert_eq!(received[0].imm_data, mw2.rkey(), "the invalidated rkey");
    assert_eq!(
        write_through(&t, &a, &cq_a, mw2.rkey(), base + 1024, &data),
        WcStatus::RemAccessErr
    );

    // Type 1 windows cannot be invalidated.
    let (_a, b) = connected_pair(&pd, &cq_a, &cq_b);
    post(&b, &[SendWr::local_inv(9, mw1.rkey(), SendFlags::SIGNALED)]).unwrap();
    assert_ne!(one_completion(&t, &cq_b).status, WcStatus::Success);

    // Windows are freed before their MR (rxe refuses to deregister an MR bound windows use).
    drop((mw1, mw2));
    drop(target_mr);
    assert!(t.device().mws.is_empty());
    assert_eq!(count_ops(&t, Opcode::AllocMw), 2);
    assert_eq!(count_ops(&t, Opcode::DeallocMw), 2);
}

#[test]
fn requests_a_window_bind_cannot_have_are_refused_before_the_ring() {
    let (_t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let cq = Cq::new(&ctx, 32).unwrap();
    let (a, _b) = connected_pair(&pd, &cq, &cq);
    let buf = ctx.alloc_buffer(64).unwrap();
    let mr = pd.register(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    let mw = pd.alloc_mw(MwType::Type2).unwrap();
    let sge = [mr.sge(0, 8).unwrap()];
    let no_bind = SendWr {
        opcode: WrOpcode::BindMw,
        ..SendWr::default()
    };
    let mut bad_access = mw.bind_info(&mr, mr.addr(), 8, AccessFlags::MW_BIND);
    let with_sges = SendWr {
        sg_list: &sge,
        ..SendWr::local_inv(1, mw.rkey(), SendFlags::empty())
    };
    for wr in [
        no_bind,
        SendWr::bind_mw(0, bad_access, SendFlags::empty()),
        with_sges,
    ] {
        let e = post(&a, &[wr]).unwrap_err();
        assert_eq!(e.posted(), 0, "{e}");
    }
    bad_access.access = window_access();
    post(&a, &[SendWr::bind_mw(0, bad_access, SendFlags::empty())]).unwrap();
}

#[test]
fn windows_need_the_feature() {
    let transport = FakeTransport::with(default_config(), features::VRDMA_F_RING_RXE_V1);
    let ctx = Context::open(transport.clone()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    assert!(matches!(
        pd.alloc_mw(MwType::Type1),
        Err(VerbsError::InvalidArgument(_))
    ));
    assert!(!transport.device().ops().contains(&Opcode::AllocMw));
    // The device's answers reach the caller as statuses.
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    t.inject(Fault::Fail(Opcode::AllocMw, Status::Quota.into()));
    let e = pd.alloc_mw(MwType::Type2).unwrap_err();
    assert_eq!(e.status(), Some(Status::Quota));
}

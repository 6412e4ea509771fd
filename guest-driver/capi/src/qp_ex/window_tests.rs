//! Memory-window requests of `ibv_qp_ex` over the fake device's loopback kernel, as an
//! application makes them: a type-2 window allocated through `ibv_context_ops`, bound with
//! `ibv_wr_bind_mw`, written through by the peer, invalidated with `ibv_wr_local_inv` or by the
//! peer's `ibv_wr_send_inv`; every byte of the memory behind the window checked after each
//! step. Without `VRDMA_F_MW` the three operations fail the batch with `EOPNOTSUPP`.

use std::sync::Arc;

use vrdma::spec::features;
use vrdma::verbs::{AccessFlags, RecvWr};
use vrdma::Context;
use vrdma_test_support::fake_transport::{default_config, FakeTransport};

use super::tests::{connect, qp_ex, vqp, Fixture, Ops, RC_ALL};
use super::*;
use crate::sys::{
    ibv_mr, ibv_mw_type_IBV_MW_TYPE_2 as MW_TYPE_2, ibv_qp_type_IBV_QPT_RC,
    ibv_send_flags_IBV_SEND_INLINE as INLINE, ibv_send_flags_IBV_SEND_SIGNALED as SIGNALED, ibv_wc,
    ibv_wc_flags_IBV_WC_WITH_INV as WC_WITH_INV, ibv_wc_opcode_IBV_WC_BIND_MW as WC_BIND_MW,
    ibv_wc_opcode_IBV_WC_LOCAL_INV as WC_LOCAL_INV,
    ibv_wc_opcode_IBV_WC_RDMA_WRITE as WC_RDMA_WRITE, ibv_wc_opcode_IBV_WC_RECV as WC_RECV,
    ibv_wc_opcode_IBV_WC_SEND as WC_SEND, ibv_wc_status_IBV_WC_REM_ACCESS_ERR as REM_ACCESS_ERR,
    ibv_wc_status_IBV_WC_SUCCESS as SUCCESS,
};
use crate::transport::AppTransport;

/// Where the window opens in the target MR, and its length.
const WINDOW_AT: usize = 1024;
const WINDOW_LEN: usize = 1024;

/// The peer's rights through the window.
fn window_access() -> u32 {
    (AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ).bits()
}

impl Ops {
    fn bind_mw(&self, mw: *mut ibv_mw, rkey: u32, info: &ibv_mw_bind_info) {
        // SAFETY: an operation of a live extended QP inside its batch; `mw` is a window of
        // this library and `info` names a live MR (or none).
        unsafe { self.ex().wr_bind_mw.unwrap()(self.0, mw, rkey, info) }
    }
    fn local_inv(&self, rkey: u32) {
        // SAFETY: as above.
        unsafe { self.ex().wr_local_inv.unwrap()(self.0, rkey) }
    }
    fn send_inv(&self, rkey: u32) {
        // SAFETY: as above.
        unsafe { self.ex().wr_send_inv.unwrap()(self.0, rkey) }
    }
    fn rdma_write(&self, rkey: u32, remote_addr: u64) {
        // SAFETY: as above.
        unsafe { self.ex().wr_rdma_write.unwrap()(self.0, rkey, remote_addr) }
    }
    fn inline(&self, bytes: &[u8]) {
        let addr = bytes.as_ptr().cast_mut().cast();
        // SAFETY: as above; the bytes are readable.
        unsafe { self.ex().wr_set_inline_data.unwrap()(self.0, addr, bytes.len() as size_t) }
    }
}

/// A type-2 window of the fixture's PD, through `ibv_context_ops` as the inline
/// `ibv_alloc_mw` calls it.
fn alloc_type2(f: &Fixture) -> *mut ibv_mw {
    // SAFETY: the fixture's live context and PD.
    let mw = unsafe { (*f.ctx).ops.alloc_mw.unwrap()(f.pd, MW_TYPE_2) };
    assert!(!mw.is_null());
    mw
}

fn dealloc(f: &Fixture, mw: *mut ibv_mw) {
    // SAFETY: a window of the fixture, not used afterwards.
    assert_eq!(unsafe { (*f.ctx).ops.dealloc_mw.unwrap()(mw) }, 0);
}

/// The `ibv_mr` an application holds for a registration: what a bind reads of it (the lkey).
fn ibv_mr_of(mr: &vrdma::Mr<'_>) -> ibv_mr {
    // SAFETY: an all-zero ibv_mr (NULL pointers, zero numbers) is a valid value.
    let mut ibv: ibv_mr = unsafe { std::mem::zeroed() };
    ibv.lkey = mr.lkey();
    ibv.rkey = mr.rkey();
    ibv
}

/// Runs the kernel and returns the completions as (wr_id, status, opcode).
fn completions(f: &Fixture) -> Vec<(u64, u32, u32)> {
    f.fake.run_kernel();
    f.poll()
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode))
        .collect()
}

/// Binds `mw` on `binder` over the window of `target` (under `mw->rkey`'s successor) in one
/// batch; the key the window has now, which the application records in `mw->rkey`, as with
/// rxe.
fn bind_window(f: &Fixture, binder: &Ops, mw: *mut ibv_mw, target: &ibv_mr, wr_id: u64) -> u32 {
    // SAFETY: a live window of the fixture.
    let old = unsafe { (*mw).rkey };
    let new = vrdma::provider::inc_rkey(old);
    let info = ibv_mw_bind_info {
        mr: std::ptr::from_ref(target).cast_mut(),
        addr: target_base(target) + WINDOW_AT as u64,
        length: WINDOW_LEN as u64,
        mw_access_flags: window_access(),
    };
    binder.start();
    binder.next(wr_id, SIGNALED);
    binder.bind_mw(mw, new, &info);
    assert_eq!(binder.complete(), 0);
    assert_eq!(completions(f), [(wr_id, SUCCESS, WC_BIND_MW)]);
    // SAFETY: as above.
    let window = unsafe { &mut *mw };
    assert_eq!(
        window.rkey, old,
        "as rxe, ibv_wr_bind_mw leaves mw->rkey to the application"
    );
    window.rkey = new;
    new
}

/// The iova of the MR (the tests register buffers at their own address).
fn target_base(mr: &ibv_mr) -> u64 {
    mr.addr as u64
}

/// The bytes of a target buffer: zeros except `data` at `at`.
fn expected(len: usize, writes: &[(usize, &[u8])]) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    for &(at, data) in writes {
        bytes[at..at + data.len()].copy_from_slice(data);
    }
    bytes
}

/// A type-2 window bound through a batch opens its range to the peer's RDMA WRITEs (inline
/// and from an SGE), nothing outside it; LOCAL_INV through a batch closes it again.
#[test]
fn a_batch_binds_a_type_2_window_and_another_invalidates_it() {
    let f = Fixture::new();
    let rc = || {
        f.create(f.attr(ibv_qp_type_IBV_QPT_RC, Some(RC_ALL)))
            .unwrap()
    };
    let (a, b) = (rc(), rc());
    connect(a, b);
    let vctx = f.vctx();
    let target = vctx.alloc_buffer(4096).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::MW_BIND;
    let target_mr = f.vpd().pd.register(&target, access).unwrap();
    let mut target_ibv = ibv_mr_of(&target_mr);
    target_ibv.addr = target_mr.addr() as *mut c_void;
    let mut source = vctx.alloc_buffer(4096).unwrap();
    let payload: Vec<u8> = (0..96u8).map(|i| i.wrapping_mul(7) ^ 0x5a).collect();
    source.as_mut_slice()[..96].copy_from_slice(&payload);
    let source_mr = f
        .vpd()
        .pd
        .register(&source, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let (on_a, on_b) = (Ops(qp_ex(a)), Ops(qp_ex(b)));
    let mw = alloc_type2(&f);

    let rkey = bind_window(&f, &on_b, mw, &target_ibv, 1);
    let window = target_mr.addr() + WINDOW_AT as u64;
    let inline = *b"sixteen inline b";
    on_a.start();
    on_a.next(2, SIGNALED | INLINE);
    on_a.rdma_write(rkey, window + 16);
    on_a.inline(&inline);
    on_a.next(3, SIGNALED);
    on_a.rdma_write(rkey, window + WINDOW_LEN as u64 - 96);
    on_a.sge(source_mr.sge(0, 96).unwrap());
    assert_eq!(on_a.complete(), 0);
    assert_eq!(
        completions(&f),
        [(2, SUCCESS, WC_RDMA_WRITE), (3, SUCCESS, WC_RDMA_WRITE)]
    );
    let written = expected(
        4096,
        &[
            (WINDOW_AT + 16, &inline),
            (WINDOW_AT + WINDOW_LEN - 96, &payload),
        ],
    );
    assert_eq!(target.as_slice(), &written[..]);

    // LOCAL_INV on B: the key no longer opens anything.
    on_b.start();
    on_b.next(4, SIGNALED);
    on_b.local_inv(rkey);
    assert_eq!(on_b.complete(), 0);
    assert_eq!(completions(&f), [(4, SUCCESS, WC_LOCAL_INV)]);
    on_a.start();
    on_a.next(5, SIGNALED | INLINE);
    on_a.rdma_write(rkey, window + 16);
    on_a.inline(b"too late");
    assert_eq!(on_a.complete(), 0);
    let refused = completions(&f);
    assert_eq!((refused[0].0, refused[0].1), (5, REM_ACCESS_ERR));
    assert_eq!(target.as_slice(), &written[..], "nothing written");

    dealloc(&f, mw);
    drop((target_mr, source_mr));
    f.close(&[a, b]);
}

/// SEND_WITH_INV through a batch delivers its payload and invalidates the responder's
/// window, which the responder's completion reports.
#[test]
fn a_batch_send_with_invalidate_closes_the_peers_window() {
    let f = Fixture::new();
    let rc = || {
        f.create(f.attr(ibv_qp_type_IBV_QPT_RC, Some(RC_ALL)))
            .unwrap()
    };
    let (a, b) = (rc(), rc());
    connect(a, b);
    let vctx = f.vctx();
    let target = vctx.alloc_buffer(4096).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::MW_BIND;
    let target_mr = f.vpd().pd.register(&target, access).unwrap();
    let mut target_ibv = ibv_mr_of(&target_mr);
    target_ibv.addr = target_mr.addr() as *mut c_void;
    let (on_a, on_b) = (Ops(qp_ex(a)), Ops(qp_ex(b)));
    let mw = alloc_type2(&f);
    let rkey = bind_window(&f, &on_b, mw, &target_ibv, 1);

    // B receives into the first 256 bytes of the target (outside the window).
    let recv = [target_mr.sge(0, 256).unwrap()];
    let wr = RecvWr {
        wr_id: 20,
        sg_list: &recv,
    };
    vqp(b).qp.post_recv(&[wr]).unwrap();
    let message: Vec<u8> = (0..48u8).map(|i| 0xff - i).collect();
    on_a.start();
    on_a.next(21, SIGNALED | INLINE);
    on_a.send_inv(rkey);
    on_a.inline(&message);
    assert_eq!(on_a.complete(), 0);
    f.fake.run_kernel();
    let wcs: Vec<ibv_wc> = f.poll();
    let summary: Vec<(u64, u32, u32)> = wcs.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(summary, [(20, SUCCESS, WC_RECV), (21, SUCCESS, WC_SEND)]);
    let received = &wcs[0];
    assert_eq!(received.byte_len, 48);
    assert_ne!(received.wc_flags & WC_WITH_INV, 0);
    // SAFETY: the union's member for a completion with IBV_WC_WITH_INV.
    assert_eq!(unsafe { received.__bindgen_anon_1.invalidated_rkey }, rkey);
    let delivered = expected(4096, &[(0, &message)]);
    assert_eq!(target.as_slice(), &delivered[..]);

    // The window is closed: a WRITE through it fails and changes nothing.
    on_a.start();
    on_a.next(22, SIGNALED | INLINE);
    on_a.rdma_write(rkey, target_mr.addr() + WINDOW_AT as u64);
    on_a.inline(b"closed");
    assert_eq!(on_a.complete(), 0);
    let refused = completions(&f);
    assert_eq!((refused[0].0, refused[0].1), (22, REM_ACCESS_ERR));
    assert_eq!(target.as_slice(), &delivered[..]);

    dealloc(&f, mw);
    drop(target_mr);
    f.close(&[a, b]);
}

/// Malformed window requests fail the batch with EINVAL (nothing posted): a bind with access
/// a window cannot grant, a bind of a range without an MR, a LOCAL_INV with a payload.
#[test]
fn malformed_window_requests_fail_the_batch() {
    let f = Fixture::new();
    let a = f
        .create(f.attr(ibv_qp_type_IBV_QPT_RC, Some(RC_ALL)))
        .unwrap();
    let ops = Ops(qp_ex(a));
    let mw = alloc_type2(&f);
    let vctx = f.vctx();
    let buf = vctx.alloc_buffer(4096).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
    let mr = f.vpd().pd.register(&buf, access).unwrap();
    let ibv = ibv_mr_of(&mr);
    let good = ibv_mw_bind_info {
        mr: std::ptr::from_ref(&ibv).cast_mut(),
        addr: mr.addr(),
        length: 64,
        mw_access_flags: window_access(),
    };
    let mw_bind_right = ibv_mw_bind_info {
        mw_access_flags: AccessFlags::MW_BIND.bits(),
        ..good
    };
    let no_mr = ibv_mw_bind_info {
        mr: std::ptr::null_mut(),
        ..good
    };
    let notified = f.fake.notifications();
    for info in [mw_bind_right, no_mr] {
        ops.start();
        ops.next(1, SIGNALED);
        ops.bind_mw(mw, 0x1234, &info);
        assert_eq!(ops.complete(), libc::EINVAL);
    }
    ops.start();
    ops.next(2, SIGNALED);
    ops.local_inv(0x1234);
    ops.sge(mr.sge(0, 8).unwrap());
    assert_eq!(ops.complete(), libc::EINVAL);
    assert!(completions(&f).is_empty());
    assert_eq!(f.fake.notifications(), notified, "no doorbell");

    dealloc(&f, mw);
    drop(mr);
    f.close(&[a]);
}

/// Without `VRDMA_F_MW` negotiated the three memory-window operations exist (rxe accepts the
/// flags at creation) but fail the batch with EOPNOTSUPP, posting nothing.
#[test]
fn without_memory_windows_the_operations_fail_the_batch() {
    let fake = FakeTransport::with(
        default_config(),
        features::VRDMA_F_RING_RXE_V1 | features::VRDMA_F_UD | features::VRDMA_F_UC,
    );
    let transport = Arc::new(AppTransport::over(fake.clone()));
    let ctx = Context::open(transport.clone() as Arc<dyn vrdma::transport::Transport>).unwrap();
    let raw = crate::device::context_over(crate::device::device(), ctx, transport).unwrap();
    let f = Fixture::over(fake, raw);
    let a = f
        .create(f.attr(ibv_qp_type_IBV_QPT_RC, Some(RC_ALL)))
        .unwrap();
    let ops = Ops(qp_ex(a));
    let notified = f.fake.notifications();
    let calls: [&dyn Fn(); 3] = [
        &|| ops.local_inv(5),
        &|| ops.send_inv(5),
        // SAFETY: as above; the pointers are not looked at.
        &|| unsafe {
            ops.ex().wr_bind_mw.unwrap()(ops.0, std::ptr::null_mut(), 1, std::ptr::null())
        },
    ];
    for call in calls {
        ops.start();
        ops.next(1, SIGNALED);
        call();
        assert_eq!(ops.complete(), libc::EOPNOTSUPP);
    }
    assert!(completions(&f).is_empty());
    assert_eq!(f.fake.notifications(), notified);
    f.close(&[a]);
}

//! Extended QPs over the fake device's loopback kernel, reached as an application does: QPs
//! made through the `verbs_context` in front of the `ibv_context`, requests posted through
//! the `ibv_qp_ex` operations.

use vrdma::verbs::{AccessFlags, RecvWr, WcOpcode};
use vrdma_test_support::fake_transport::{FakeTransport, LOCAL_GID};

use super::*;
use crate::cq_ex::tests::{close, open_fake, verbs_get_ctx};
use crate::datapath::poll_cq;
use crate::objects::VrdmaPd;
use crate::sys::{
    ibv_ah_attr, ibv_cq, ibv_pd, ibv_qp_type_IBV_QPT_RC, ibv_qp_type_IBV_QPT_UD,
    ibv_send_flags_IBV_SEND_INLINE as INLINE, ibv_send_flags_IBV_SEND_IP_CSUM as IP_CSUM,
    ibv_send_flags_IBV_SEND_SIGNALED as SIGNALED, ibv_wc,
};

pub(super) const RC_ALL: u64 = (WITH_SEND
    | WITH_SEND_IMM
    | WITH_WRITE
    | WITH_WRITE_IMM
    | WITH_READ
    | WITH_CMP_SWP
    | WITH_FETCH_ADD
    | WITH_BIND_MW
    | WITH_LOCAL_INV
    | WITH_SEND_INV) as u64;

/// A context over a fake device with a PD and one CQ.
pub(super) struct Fixture {
    pub(super) fake: std::sync::Arc<FakeTransport>,
    pub(super) ctx: *mut ibv_context,
    pub(super) pd: *mut ibv_pd,
    pub(super) cq: *mut ibv_cq,
}

impl Fixture {
    pub(super) fn new() -> Fixture {
        let (fake, ctx) = open_fake();
        Self::over(fake, ctx)
    }

    /// The fixture's objects on `ctx`, a context of this library over `fake`.
    pub(super) fn over(fake: std::sync::Arc<FakeTransport>, ctx: *mut ibv_context) -> Fixture {
        // SAFETY: a live context of this library.
        let pd = unsafe { crate::objects::ibv_alloc_pd(ctx) };
        // SAFETY: as above; no channel.
        let cq = unsafe {
            crate::cq::ibv_create_cq(ctx, 64, std::ptr::null_mut(), std::ptr::null_mut(), 0)
        };
        assert!(!pd.is_null() && !cq.is_null());
        Fixture { fake, ctx, pd, cq }
    }

    pub(super) fn vpd(&self) -> &VrdmaPd {
        // SAFETY: the fixture's live PD.
        unsafe { VrdmaPd::from_ptr(self.pd) }.unwrap()
    }

    /// The library context behind the fixture's `ibv_context` (to allocate buffers).
    pub(super) fn vctx(&self) -> &vrdma::Context {
        // SAFETY: the fixture's live context.
        &unsafe { crate::context::VrdmaContext::from_ptr(self.ctx) }
            .unwrap()
            .ctx
    }

    pub(super) fn attr(&self, qp_type: u32, send_ops: Option<u64>) -> ibv_qp_init_attr_ex {
        // SAFETY: all-zero is a valid ibv_qp_init_attr_ex.
        let mut attr: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        attr.send_cq = self.cq;
        attr.recv_cq = self.cq;
        attr.cap.max_send_wr = 8;
        attr.cap.max_recv_wr = 8;
        attr.cap.max_send_sge = 2;
        attr.cap.max_recv_sge = 2;
        attr.cap.max_inline_data = 64;
        attr.qp_type = qp_type;
        attr.comp_mask = ATTR_PD;
        attr.pd = self.pd;
        if let Some(ops) = send_ops {
            attr.comp_mask |= ATTR_SEND_OPS_FLAGS;
            attr.send_ops_flags = ops;
        }
        attr
    }

    /// `ibv_create_qp_ex` through the context's operation: the QP or the errno.
    pub(super) fn create(&self, mut attr: ibv_qp_init_attr_ex) -> Result<*mut ibv_qp, c_int> {
        let create = verbs_get_ctx(self.ctx).create_qp_ex.unwrap();
        // SAFETY: a live context and a valid attribute structure naming its objects.
        let qp = unsafe { create(self.ctx, &mut attr) };
        if qp.is_null() {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
        }
        Ok(qp)
    }

    pub(super) fn poll(&self) -> Vec<ibv_wc> {
        // SAFETY: all-zero is a valid ibv_wc.
        let mut wcs: [ibv_wc; 32] = unsafe { std::mem::zeroed() };
        // SAFETY: the fixture's CQ; room for 32.
        let n = unsafe { poll_cq(self.cq, 32, wcs.as_mut_ptr()) };
        wcs[..n as usize].to_vec()
    }

    pub(super) fn close(self, qps: &[*mut ibv_qp]) {
        for &qp in qps {
            // SAFETY: QPs of this fixture, not used afterwards.
            assert_eq!(unsafe { crate::qp::ibv_destroy_qp(qp) }, 0);
        }
        // SAFETY: the fixture's objects, not used afterwards.
        unsafe {
            assert_eq!(crate::cq::ibv_destroy_cq(self.cq), 0);
            assert_eq!(crate::objects::ibv_dealloc_pd(self.pd), 0);
        }
        close(self.ctx);
    }
}

pub(super) fn vqp<'a>(qp: *mut ibv_qp) -> &'a VrdmaQp {
    // SAFETY: a live QP of a test.
    unsafe { VrdmaQp::from_ptr(qp) }.unwrap()
}

/// Records RTS in `qp->state`, as ibv_modify_qp does, for QPs moved by the library's helpers.
pub(super) fn set_rts(qp: *mut ibv_qp) {
    // SAFETY: a live QP of a test; nothing else touches the field meanwhile.
    unsafe { (*qp).state = vrdma::verbs::QpState::Rts as u32 };
}

pub(super) fn qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    // SAFETY: a live QP of a test.
    let ex = unsafe { ibv_qp_to_qp_ex(qp) };
    assert_eq!(
        ex.cast(),
        qp,
        "the ibv_qp is the first member of the ibv_qp_ex"
    );
    ex
}

pub(super) fn connect(a: *mut ibv_qp, b: *mut ibv_qp) {
    use vrdma::verbs::{ConnectOptions, Gid, RemoteQp};
    // The helpers below bypass ibv_modify_qp: record the state it would (the send path
    // refuses QPs below RTS, as rxe does).
    for qp in [a, b] {
        set_rts(qp);
    }
    let (a, b) = (&vqp(a).qp, &vqp(b).qp);
    let remote = |qpn, psn| RemoteQp {
        qpn,
        psn,
        gid: Gid(LOCAL_GID),
        lid: 0,
    };
    let opts = |sq_psn| ConnectOptions {
        sq_psn,
        access: AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        ..ConnectOptions::default()
    };
    a.connect(&remote(b.qpn(), 200), &opts(100)).unwrap();
    b.connect(&remote(a.qpn(), 100), &opts(200)).unwrap();
}

/// The operations of an extended QP, called as the inline `ibv_wr_*` of `verbs.h` call them.
pub(super) struct Ops(pub(super) *mut ibv_qp_ex);

impl Ops {
    pub(super) fn ex(&self) -> &ibv_qp_ex {
        // SAFETY: a live extended QP of a test.
        unsafe { &*self.0 }
    }
    pub(super) fn next(&self, wr_id: u64, flags: u32) {
        // SAFETY: a live extended QP of a test, whose fields the application sets between
        // requests.
        unsafe {
            (*self.0).wr_id = wr_id;
            (*self.0).wr_flags = flags;
        }
    }
    pub(super) fn start(&self) {
        // SAFETY: an operation of a live extended QP, called in its documented order (as
        // every operation below).
        unsafe { self.ex().wr_start.unwrap()(self.0) }
    }
    pub(super) fn complete(&self) -> c_int {
        // SAFETY: as above.
        unsafe { self.ex().wr_complete.unwrap()(self.0) }
    }
    fn abort(&self) {
        // SAFETY: as above.
        unsafe { self.ex().wr_abort.unwrap()(self.0) }
    }
    fn send(&self) {
        // SAFETY: as above.
        unsafe { self.ex().wr_send.unwrap()(self.0) }
    }
    pub(super) fn sge(&self, sge: Sge) {
        // SAFETY: as above.
        unsafe { self.ex().wr_set_sge.unwrap()(self.0, sge.lkey, sge.addr, sge.length) }
    }
    fn sge_list(&self, sges: &[Sge]) {
        let list = sges.as_ptr().cast::<ibv_sge>();
        // SAFETY: as above; the list is valid for its length.
        unsafe { self.ex().wr_set_sge_list.unwrap()(self.0, sges.len() as size_t, list) }
    }
}

/// Every opcode of an RC QP in one batch: one doorbell, every byte and atomic result, every
/// completion.
#[test]
fn every_rc_opcode_posts_through_one_batch() {
    let f = Fixture::new();
    let a = f
        .create(f.attr(ibv_qp_type_IBV_QPT_RC, Some(RC_ALL)))
        .unwrap();
    let b = f
        .create(f.attr(ibv_qp_type_IBV_QPT_RC, Some(RC_ALL)))
        .unwrap();
    connect(a, b);
    let vctx = f.vctx();
    let mut src = vctx.alloc_buffer(4096).unwrap();
    for (i, byte) in src.as_mut_slice().iter_mut().enumerate() {
        *byte = (i * 7 + 3) as u8;
    }
    let mut dst = vctx.alloc_buffer(16384).unwrap();
    dst.as_mut_slice()[8192..8200].copy_from_slice(&42u64.to_ne_bytes());
    dst.as_mut_slice()[8200..8208].copy_from_slice(&100u64.to_ne_bytes());
    let local = vctx.alloc_buffer(4096).unwrap();
    let pd = &f.vpd().pd;
    let src_mr = pd.register(&src, AccessFlags::empty()).unwrap();
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let dst_mr = pd.register(&dst, all).unwrap();
    let local_mr = pd.register(&local, AccessFlags::LOCAL_WRITE).unwrap();
    let recv = [
        dst_mr.sge(0, 1000).unwrap(),
        dst_mr.sge(1000, 1000).unwrap(),
    ];
    let recvs: Vec<RecvWr<'_>> = (0..3)
        .map(|i| RecvWr {
            wr_id: 50 + i,
            sg_list: &recv[i as usize % 2..][..1],
        })
        .collect();
    vqp(b).qp.post_recv(&recvs).unwrap();

    let inline_a = *b"inline ";
    let inline_b = *b"bytes in two buffers";
    let ops = Ops(qp_ex(a));
    let notified = f.fake.notifications();
    ops.start();
    // SEND of two SGEs into receive 50 (dst 0..).
    ops.next(1, SIGNALED);
    ops.send();
    ops.sge_list(&[src_mr.sge(0, 100).unwrap(), src_mr.sge(200, 50).unwrap()]);
    // SEND_WITH_IMM of inline data from two buffers into receive 51 (dst 1000..); the
    // inline flag comes with the setter.
    ops.next(2, SIGNALED);
    // SAFETY: operations of the live QP, inside the batch.
    unsafe { ops.ex().wr_send_imm.unwrap()(ops.0, 0xa1b2_c3d4_u32.to_be()) };
    let bufs = [
        ibv_data_buf {
            addr: inline_a.as_ptr().cast_mut().cast(),
            length: inline_a.len() as size_t,
        },
        ibv_data_buf {
            addr: inline_b.as_ptr().cast_mut().cast(),
            length: inline_b.len() as size_t,
        },
    ];
    // SAFETY: as above; the buffers are readable.
    unsafe { ops.ex().wr_set_inline_data_list.unwrap()(ops.0, 2, bufs.as_ptr()) };
    // RDMA WRITE into dst 4096.. .
    ops.next(3, SIGNALED);
    // SAFETY: as above.
    unsafe { ops.ex().wr_rdma_write.unwrap()(ops.0, dst_mr.rkey(), dst_mr.addr() + 4096) };
    ops.sge(src_mr.sge(1000, 512).unwrap());
    // RDMA WRITE_WITH_IMM into dst 6000.., consuming receive 52.
    ops.next(4, SIGNALED);
    // SAFETY: as above.
    unsafe {
        ops.ex().wr_rdma_write_imm.unwrap()(
            ops.0,
            dst_mr.rkey(),
            dst_mr.addr() + 6000,
            7u32.to_be(),
        )
    };
    ops.sge(src_mr.sge(2000, 64).unwrap());
    // RDMA READ of what the first write wrote, into local 0.. .
    ops.next(5, SIGNALED);
    // SAFETY: as above.
    unsafe { ops.ex().wr_rdma_read.unwrap()(ops.0, dst_mr.rkey(), dst_mr.addr() + 4096) };
    ops.sge(local_mr.sge(0, 512).unwrap());
    // Compare and swap 42 -> 7, the original into local 1024.
    ops.next(6, SIGNALED);
    // SAFETY: as above.
    unsafe {
        ops.ex().wr_atomic_cmp_swp.unwrap()(ops.0, dst_mr.rkey(), dst_mr.addr() + 8192, 42, 7)
    };
    ops.sge(local_mr.sge(1024, 8).unwrap());
    // Fetch and add 100 + 5, the original into local 1032; unsignaled.
    ops.next(7, 0);
    // SAFETY: as above.
    unsafe { ops.ex().wr_atomic_fetch_add.unwrap()(ops.0, dst_mr.rkey(), dst_mr.addr() + 8200, 5) };
    ops.sge(local_mr.sge(1032, 8).unwrap());
    assert_eq!(ops.complete(), 0);
    assert_eq!(
        f.fake.notifications(),
        notified + 1,
        "one doorbell for the batch"
    );
    f.fake.run_kernel();

    let wcs = f.poll();
    let summary: Vec<(u64, u32, u32, u32)> = wcs
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect();
    let send = WcOpcode::Send.raw();
    let recv_op = WcOpcode::Recv.raw();
    assert_eq!(
        summary,
        [
            (50, 0, recv_op, 150),
            (1, 0, send, 150),
            (51, 0, recv_op, 27),
            (2, 0, send, 27),
            (3, 0, WcOpcode::RdmaWrite.raw(), 512),
            (52, 0, WcOpcode::RecvRdmaWithImm.raw(), 64),
            (4, 0, WcOpcode::RdmaWrite.raw(), 64),
            (5, 0, WcOpcode::RdmaRead.raw(), 512),
            (6, 0, WcOpcode::CompSwap.raw(), 8),
        ],
    );
    // SAFETY: reading the u32 member of the unions.
    let imms = unsafe { [wcs[2], wcs[5]].map(|w| w.__bindgen_anon_1.imm_data) };
    assert_eq!(imms, [0xa1b2_c3d4_u32.to_be(), 7u32.to_be()]);
    let (s, d, l) = (src.as_slice(), dst.as_slice(), local.as_slice());
    assert_eq!(&d[..100], &s[..100]);
    assert_eq!(&d[100..150], &s[200..250]);
    assert_eq!(&d[1000..1027], b"inline bytes in two buffers");
    assert_eq!(&d[4096..4608], &s[1000..1512]);
    assert_eq!(&d[6000..6064], &s[2000..2064]);
    assert_eq!(&l[..512], &s[1000..1512]);
    assert_eq!(
        &d[8192..8208],
        [7u64.to_ne_bytes(), 105u64.to_ne_bytes()].concat()
    );
    assert_eq!(
        &l[1024..1040],
        [42u64.to_ne_bytes(), 100u64.to_ne_bytes()].concat()
    );

    // Classic verbs work on an extended QP: ibv_post_send.
    let mut sge = ibv_sge {
        addr: src_mr.addr(),
        length: 16,
        lkey: src_mr.lkey(),
    };
    // SAFETY: all-zero is a valid ibv_send_wr.
    let mut wr: crate::sys::ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = 9;
    wr.opcode = WrOpcode::RdmaWrite as u32;
    wr.send_flags = SIGNALED;
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    wr.wr.rdma.remote_addr = dst_mr.addr() + 12000;
    wr.wr.rdma.rkey = dst_mr.rkey();
    let mut bad = std::ptr::null_mut();
    // SAFETY: a valid request on a live QP.
    let posted = unsafe { crate::datapath::post_send(a, &mut wr, &mut bad) };
    assert_eq!(posted, 0);
    f.fake.run_kernel();
    assert_eq!(f.poll()[0].wr_id, 9);
    assert_eq!(&dst.as_slice()[12000..12016], &src.as_slice()[..16]);

    drop((src_mr, dst_mr, local_mr));
    f.close(&[a, b]);
}

/// A refused request fails the whole batch (nothing posted, no doorbell); an aborted batch
/// posts nothing; the QP works afterwards.
#[test]
fn batches_are_all_or_nothing() {
    let f = Fixture::new();
    let a = f
        .create(f.attr(ibv_qp_type_IBV_QPT_RC, Some(RC_ALL)))
        .unwrap();
    let b = f
        .create(f.attr(ibv_qp_type_IBV_QPT_RC, Some(RC_ALL)))
        .unwrap();
    connect(a, b);
    let vctx = f.vctx();
    let buf = vctx.alloc_buffer(4096).unwrap();
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    let mr = f.vpd().pd.register(&buf, rw).unwrap();
    let ops = Ops(qp_ex(a));
    let write = |wr_id| {
        ops.next(wr_id, SIGNALED);
        // SAFETY: an operation of the live QP, inside the batch.
        unsafe { ops.ex().wr_rdma_write.unwrap()(ops.0, mr.rkey(), mr.addr() + 2048) };
        ops.sge(mr.sge(0, 8).unwrap());
    };
    let notified = f.fake.notifications();
    let refused = |build: &dyn Fn()| {
        ops.start();
        write(1);
        build();
        write(2);
        let errno = ops.complete();
        f.fake.run_kernel();
        assert!(f.poll().is_empty(), "nothing of a failed batch is posted");
        errno
    };
    // More SGEs than the QP takes, more inline bytes than it takes: ENOSPC, as rxe.
    let three = [mr.sge(0, 8).unwrap(); 3];
    assert_eq!(
        refused(&|| write_then(&ops, &mr, |o| o.sge_list(&three))),
        libc::ENOSPC
    );
    let big = [0u8; 65];
    let inline_big = |o: &Ops| {
        // SAFETY: an operation of the live QP, inside the batch; the buffer is readable.
        unsafe {
            o.ex().wr_set_inline_data.unwrap()(
                o.0,
                big.as_ptr().cast_mut().cast(),
                big.len() as size_t,
            )
        }
    };
    assert_eq!(refused(&|| write_then(&ops, &mr, inline_big)), libc::ENOSPC);
    // An atomic with a 4-byte result buffer, inline data on a READ, a flag rxe lacks, a setter
    // with no request started: EINVAL or EOPNOTSUPP.
    let short_atomic = || {
        ops.next(3, SIGNALED);
        // SAFETY: as above.
        unsafe { ops.ex().wr_atomic_fetch_add.unwrap()(ops.0, mr.rkey(), mr.addr(), 1) };
        ops.sge(mr.sge(8, 4).unwrap());
    };
    assert_eq!(refused(&short_atomic), libc::EINVAL);
    let inline_read = || {
        ops.next(3, SIGNALED | INLINE);
        // SAFETY: as above.
        unsafe { ops.ex().wr_rdma_read.unwrap()(ops.0, mr.rkey(), mr.addr()) };
    };
    assert_eq!(refused(&inline_read), libc::EINVAL);
    let checksum = || {
        ops.next(3, SIGNALED | IP_CSUM);
        ops.send();
    };
    assert_eq!(refused(&checksum), libc::EOPNOTSUPP);
    // (Memory-window requests: `window_tests`.)
    ops.start();
    ops.sge(mr.sge(0, 8).unwrap());
    write(1);
    assert_eq!(ops.complete(), libc::EINVAL, "a setter before any request");
    assert_eq!(
        f.fake.notifications(),
        notified,
        "no doorbell for a failed batch"
    );

    // Aborted: nothing posted.
    ops.start();
    write(1);
    ops.abort();
    f.fake.run_kernel();
    assert!(f.poll().is_empty());
    // An empty batch completes and rings nothing.
    ops.start();
    assert_eq!(ops.complete(), 0);
    assert_eq!(f.fake.notifications(), notified);

    // A full queue: ENOSPC, nothing posted (8 requests fit a queue of 8 at most).
    let capacity = vqp(a).qp.caps().max_send_wr as u64;
    ops.start();
    for i in 0..=capacity {
        write(100 + i);
    }
    assert_eq!(ops.complete(), libc::ENOSPC);
    f.fake.run_kernel();
    assert!(f.poll().is_empty());

    // The QP is intact: a good batch of several requests posts them all, one doorbell.
    ops.start();
    for i in 0..4 {
        write(10 + i);
    }
    assert_eq!(ops.complete(), 0);
    assert_eq!(f.fake.notifications(), notified + 1);
    f.fake.run_kernel();
    let ids: Vec<u64> = f.poll().iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [10, 11, 12, 13]);

    drop(mr);
    f.close(&[a, b]);
}

/// Starts a SEND and applies `set` to it (through the ops of `ops`).
fn write_then(ops: &Ops, mr: &vrdma::Mr<'_>, set: impl Fn(&Ops)) {
    ops.next(3, SIGNALED);
    ops.send();
    ops.sge(mr.sge(0, 8).unwrap());
    set(ops);
}

/// UD sends take their destination from `ibv_wr_set_ud_addr`; a send without one fails.
#[test]
fn ud_sends_take_the_address_handle_of_this_library() {
    let f = Fixture::new();
    let ud_ops = u64::from(WITH_SEND | WITH_SEND_IMM);
    let a = f
        .create(f.attr(ibv_qp_type_IBV_QPT_UD, Some(ud_ops)))
        .unwrap();
    let b = f
        .create(f.attr(ibv_qp_type_IBV_QPT_UD, Some(ud_ops)))
        .unwrap();
    for qp in [a, b] {
        vqp(qp).qp.ud_to_rts(1, 0x1111, 0).unwrap();
        set_rts(qp);
    }
    // SAFETY: all-zero is a valid ibv_ah_attr.
    let mut ah_attr: ibv_ah_attr = unsafe { std::mem::zeroed() };
    ah_attr.is_global = 1;
    ah_attr.port_num = 1;
    ah_attr.grh.dgid.raw = LOCAL_GID;
    ah_attr.grh.hop_limit = 64;
    // SAFETY: the fixture's PD and a valid attribute structure.
    let ah = unsafe { crate::objects::ibv_create_ah(f.pd, &mut ah_attr) };
    assert!(!ah.is_null());
    let vctx = f.vctx();
    let buf = vctx.alloc_buffer(4096).unwrap();
    let mr = f.vpd().pd.register(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    let recv = [mr.sge(2048, 1024).unwrap()];
    vqp(b)
        .qp
        .post_recv(&[RecvWr {
            wr_id: 70,
            sg_list: &recv,
        }])
        .unwrap();
    let ops = Ops(qp_ex(a));
    assert!(ops.ex().wr_rdma_write.is_none(), "UD QPs only send");
    let b_qpn = vqp(b).qp.qpn();

    // No destination: EINVAL, nothing posted.
    ops.start();
    ops.next(1, SIGNALED);
    ops.send();
    assert_eq!(ops.complete(), libc::EINVAL);

    let payload = *b"datagram";
    ops.start();
    ops.next(2, SIGNALED | INLINE);
    ops.send();
    // SAFETY: operations of the live QP, inside the batch; `ah` is an AH of this library and
    // the payload is readable.
    unsafe {
        ops.ex().wr_set_ud_addr.unwrap()(ops.0, ah, b_qpn, 0x1111);
        ops.ex().wr_set_inline_data.unwrap()(ops.0, payload.as_ptr().cast_mut().cast(), 8);
    }
    assert_eq!(ops.complete(), 0);
    f.fake.run_kernel();
    let wcs: Vec<(u64, u32, u32)> = f
        .poll()
        .iter()
        .map(|w| (w.wr_id, w.status, w.byte_len))
        .collect();
    assert_eq!(wcs, [(70, 0, 8), (2, 0, 8)]);
    assert_eq!(&buf.as_slice()[2048..2056], b"datagram");

    drop(mr);
    // SAFETY: the AH, no longer used.
    assert_eq!(unsafe { crate::objects::ibv_destroy_ah(ah) }, 0);
    f.close(&[a, b]);
}

/// As rxe: below RTS the send queue refuses requests (`ibv_post_send` and `ibv_wr_complete`:
/// EINVAL, from the kernel's doorbell), and in RESET the receive queue does too (the
/// provider's C10-97.2.1 check); INIT takes receives.
#[test]
fn a_qp_below_rts_refuses_sends_and_in_reset_receives() {
    use crate::datapath::{post_recv, post_send};
    use crate::sys::{
        ibv_qp_attr, ibv_qp_attr_mask_IBV_QP_ACCESS_FLAGS as ACCESS,
        ibv_qp_attr_mask_IBV_QP_PKEY_INDEX as PKEY, ibv_qp_attr_mask_IBV_QP_PORT as PORT,
        ibv_qp_attr_mask_IBV_QP_STATE as STATE, ibv_recv_wr, ibv_send_wr,
        ibv_wr_opcode_IBV_WR_SEND,
    };
    let f = Fixture::new();
    let qp = f
        .create(f.attr(ibv_qp_type_IBV_QPT_RC, Some(RC_ALL)))
        .unwrap();
    let ops = Ops(qp_ex(qp));
    let try_send = || {
        // SAFETY: all-zero is a valid ibv_send_wr (no SGE, no next).
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.opcode = ibv_wr_opcode_IBV_WR_SEND;
        let mut bad = std::ptr::null_mut();
        // SAFETY: a live QP, a one-request list, a writable bad_wr.
        unsafe { post_send(qp, &mut wr, &mut bad) }
    };
    let try_recv = || {
        // SAFETY: all-zero is a valid ibv_recv_wr (no SGE, no next).
        let mut wr: ibv_recv_wr = unsafe { std::mem::zeroed() };
        let mut bad = std::ptr::null_mut();
        // SAFETY: as above.
        unsafe { post_recv(qp, &mut wr, &mut bad) }
    };
    let try_batch = || {
        ops.start();
        ops.next(1, SIGNALED);
        ops.send();
        ops.complete()
    };
    // RESET.
    assert_eq!(try_send(), libc::EINVAL);
    assert_eq!(try_batch(), libc::EINVAL);
    assert_eq!(try_recv(), libc::EINVAL);
    // INIT, through ibv_modify_qp (which records the state).
    // SAFETY: all-zero is a valid ibv_qp_attr.
    let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
    attr.qp_state = vrdma::verbs::QpState::Init as u32;
    attr.port_num = 1;
    // SAFETY: a live QP and a valid attribute structure.
    let rc =
        unsafe { crate::qp::ibv_modify_qp(qp, &mut attr, (STATE | PKEY | PORT | ACCESS) as c_int) };
    assert_eq!(rc, 0);
    assert_eq!(try_recv(), 0);
    assert_eq!(try_send(), libc::EINVAL);
    assert_eq!(try_batch(), libc::EINVAL);
    // The refused batch released the send lock: another one can start.
    ops.start();
    ops.abort();
    f.close(&[qp]);
}

/// `ibv_wr_atomic_write` takes its 8 bytes when called and they land whole at the remote
/// address; `ibv_post_send` has no place for them and refuses the opcode; UC QPs lack it.
#[test]
fn atomic_writes_land_eight_bytes_taken_when_posted() {
    use crate::datapath::post_send;
    use crate::sys::{ibv_qp_type_IBV_QPT_UC, ibv_send_wr, ibv_wr_opcode_IBV_WR_ATOMIC_WRITE};
    let f = Fixture::new();
    let uc = f.attr(
        ibv_qp_type_IBV_QPT_UC,
        Some(u64::from(WITH_SEND | WITH_ATOMIC_WRITE)),
    );
    assert_eq!(f.create(uc), Err(libc::EOPNOTSUPP));
    let with_atomic_write = RC_ALL | u64::from(WITH_ATOMIC_WRITE);
    let a = f
        .create(f.attr(ibv_qp_type_IBV_QPT_RC, Some(with_atomic_write)))
        .unwrap();
    let b = f
        .create(f.attr(ibv_qp_type_IBV_QPT_RC, Some(RC_ALL)))
        .unwrap();
    connect(a, b);
    assert!(
        Ops(qp_ex(b)).ex().wr_atomic_write.is_none(),
        "only when asked"
    );
    let vctx = f.vctx();
    let dst = vctx.alloc_buffer(4096).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let dst_mr = f.vpd().pd.register(&dst, access).unwrap();
    let ops = Ops(qp_ex(a));
    let mut operand = *b"atomicwr";
    ops.start();
    ops.next(1, SIGNALED);
    // SAFETY: an operation of the live QP inside the batch; 8 readable bytes.
    unsafe {
        ops.ex().wr_atomic_write.unwrap()(
            ops.0,
            dst_mr.rkey(),
            dst_mr.addr() + 64,
            operand.as_ptr().cast(),
        )
    };
    operand.fill(0);
    assert_eq!(ops.complete(), 0);
    f.fake.run_kernel();
    let wcs = f.poll();
    let summary: Vec<(u64, u32, u32, u32)> = wcs
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect();
    assert_eq!(summary, [(1, 0, WcOpcode::AtomicWrite.raw(), 8)]);
    assert_eq!(&dst.as_slice()[64..72], b"atomicwr");

    // SAFETY: all-zero is a valid ibv_send_wr (no SGE, no next).
    let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.opcode = ibv_wr_opcode_IBV_WR_ATOMIC_WRITE;
    let mut bad = std::ptr::null_mut();
    // SAFETY: a live QP, a one-request list, a writable bad_wr.
    assert_eq!(unsafe { post_send(a, &mut wr, &mut bad) }, libc::EINVAL);
    drop(dst_mr);
    f.close(&[a, b]);
}

/// rdma-core lets a context be closed before its objects (pyverbs' garbage collector does it):
/// destroying them afterwards must not reach into the closed context.
#[test]
fn objects_can_be_destroyed_after_their_context_is_closed() {
    let f = Fixture::new();
    let qp = f
        .create(f.attr(ibv_qp_type_IBV_QPT_RC, Some(RC_ALL)))
        .unwrap();
    close(f.ctx);
    // SAFETY: live objects of the closed context, not used afterwards.
    unsafe {
        assert_eq!(crate::qp::ibv_destroy_qp(qp), 0);
        assert_eq!(crate::cq::ibv_destroy_cq(f.cq), 0);
        assert_eq!(crate::objects::ibv_dealloc_pd(f.pd), 0);
    }
}

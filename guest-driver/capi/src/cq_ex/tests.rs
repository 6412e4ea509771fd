//! Extended CQs over the fake device's loopback kernel, reached as an application does:
//! through the `verbs_context` in front of the `ibv_context` (`verbs_get_ctx`).

use std::sync::Arc;

use vrdma::transport::Transport;
use vrdma::verbs::{
    AccessFlags, ConnectOptions, Gid, QpCaps, QpInitAttr, QpType, RecvWr, RemoteQp, SendFlags,
    SendWr, WcFlags, WcOpcode, WrOpcode,
};
use vrdma::{Context, Qp};
use vrdma_test_support::fake_transport::{FakeTransport, LOCAL_GID};

use super::*;
use crate::context::VrdmaContext;
use crate::sys::{ibv_cq, ibv_wc, verbs_context};
use crate::transport::AppTransport;

/// A context of this library over a fresh fake device, made as `ibv_open_device` makes it.
pub(crate) fn open_fake() -> (Arc<FakeTransport>, *mut ibv_context) {
    let fake = FakeTransport::new();
    let transport = Arc::new(AppTransport::over(fake.clone()));
    let ctx = Context::open(transport.clone() as Arc<dyn Transport>).unwrap();
    let raw = crate::device::context_over(crate::device::device(), ctx, transport).unwrap();
    (fake, raw)
}

/// What the inline `verbs_get_ctx` of `verbs.h` finds in front of `ctx`.
pub(crate) fn verbs_get_ctx<'a>(ctx: *mut ibv_context) -> &'a verbs_context {
    // SAFETY: a live context of the test.
    assert_eq!(unsafe { (*ctx).abi_compat } as usize, usize::MAX);
    let front = std::mem::offset_of!(verbs_context, context);
    // SAFETY: as the C helper: the verbs_context ends with the ibv_context.
    let vctx = unsafe { &*ctx.byte_sub(front).cast::<verbs_context>() };
    assert_eq!(vctx.sz as usize, std::mem::size_of::<verbs_context>());
    vctx
}

pub(crate) fn close(ctx: *mut ibv_context) {
    // SAFETY: made by open_fake, not used afterwards.
    assert_eq!(unsafe { crate::device::ibv_close_device(ctx) }, 0);
}

fn init_attr(wc_flags: u64) -> ibv_cq_init_attr_ex {
    // SAFETY: all-zero is a valid ibv_cq_init_attr_ex.
    let mut attr: ibv_cq_init_attr_ex = unsafe { std::mem::zeroed() };
    attr.cqe = 32;
    attr.wc_flags = wc_flags;
    attr
}

fn connect(a: &Qp, b: &Qp) {
    let remote = |qp: &Qp, psn| RemoteQp {
        qpn: qp.qpn(),
        psn,
        gid: Gid(LOCAL_GID),
        lid: 0,
    };
    let opts = |sq_psn| ConnectOptions {
        sq_psn,
        ..ConnectOptions::default()
    };
    a.connect(&remote(b, 200), &opts(100)).unwrap();
    b.connect(&remote(a, 100), &opts(200)).unwrap();
}

/// One polled completion, every accessor read.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct Read {
    wr_id: u64,
    status: u32,
    opcode: u32,
    vendor_err: u32,
    byte_len: u32,
    imm: u32,
    qp_num: u32,
    src_qp: u32,
    flags: u32,
    slid: u32,
    sl: u8,
    dlid_path_bits: u8,
}

fn read(cq: *mut ibv_cq_ex) -> Read {
    // SAFETY: a live extended CQ with a current completion.
    let ex = unsafe { &*cq };
    // SAFETY: as above; every accessor was asked for at creation.
    unsafe {
        Read {
            wr_id: ex.wr_id,
            status: ex.status,
            opcode: ex.read_opcode.unwrap()(cq),
            vendor_err: ex.read_vendor_err.unwrap()(cq),
            byte_len: ex.read_byte_len.unwrap()(cq),
            imm: ex.read_imm_data.unwrap()(cq),
            qp_num: ex.read_qp_num.unwrap()(cq),
            src_qp: ex.read_src_qp.unwrap()(cq),
            flags: ex.read_wc_flags.unwrap()(cq),
            slid: ex.read_slid.unwrap()(cq),
            sl: ex.read_sl.unwrap()(cq),
            dlid_path_bits: ex.read_dlid_path_bits.unwrap()(cq),
        }
    }
}

/// Polls everything through start/next/end_poll.
fn poll_batch(cq: *mut ibv_cq_ex) -> Vec<Read> {
    // SAFETY: a live extended CQ.
    let ex = unsafe { &*cq };
    let mut out = Vec::new();
    // SAFETY: the poll operations of a live extended CQ, called in their order.
    unsafe {
        if ex.start_poll.unwrap()(cq, std::ptr::null_mut()) == libc::ENOENT {
            return out;
        }
        loop {
            out.push(read(cq));
            match ex.next_poll.unwrap()(cq) {
                0 => {}
                e => {
                    assert_eq!(e, libc::ENOENT);
                    break;
                }
            }
        }
        ex.end_poll.unwrap()(cq);
    }
    out
}

const ALL_FLAGS: u64 = SUPPORTED_WC_FLAGS;

#[test]
fn extended_cq_polls_sends_and_writes_with_immediate_field_by_field() {
    let (fake, ctx) = open_fake();
    let vctx = verbs_get_ctx(ctx);
    let create = vctx.create_cq_ex.unwrap();
    let mut attr = init_attr(ALL_FLAGS);
    // SAFETY: a live context and a valid attribute structure.
    let cq = unsafe { create(ctx, &mut attr) };
    assert!(!cq.is_null());
    // SAFETY: the CQ just made.
    let vcq = unsafe { VrdmaCq::from_ptr(cq.cast()) }.unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { (*cq).context }, ctx);

    // Empty: ENOENT, and no end_poll needed (the lock is free again: a second start works).
    // SAFETY: the poll operations of a live extended CQ.
    unsafe {
        let start = (*cq).start_poll.unwrap();
        assert_eq!(start(cq, std::ptr::null_mut()), libc::ENOENT);
        assert_eq!(start(cq, std::ptr::null_mut()), libc::ENOENT);
        let mut bad = ibv_poll_cq_attr { comp_mask: 1 };
        assert_eq!(start(cq, &mut bad), libc::EINVAL);
    }

    // SAFETY: the live context of this test.
    let vrdma_ctx = &unsafe { VrdmaContext::from_ptr(ctx) }.unwrap().ctx;
    let pd = vrdma_ctx.alloc_pd().unwrap();
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let init = QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: &vcq.cq,
        recv_cq: &vcq.cq,
        caps,
        sq_sig_all: false,
    };
    let (a, b) = (Qp::new(&pd, &init).unwrap(), Qp::new(&pd, &init).unwrap());
    connect(&a, &b);
    let src = vrdma_ctx.alloc_buffer(4096).unwrap();
    let mut src = src;
    for (i, byte) in src.as_mut_slice().iter_mut().enumerate() {
        *byte = (i * 13) as u8;
    }
    let src_mr = pd.register(&src, AccessFlags::empty()).unwrap();
    let dst = vrdma_ctx.alloc_buffer(8192).unwrap();
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let dst_mr = pd.register(&dst, rw).unwrap();

    let recv_sges = [
        dst_mr.sge(0, 1000).unwrap(),
        dst_mr.sge(1000, 1000).unwrap(),
    ];
    b.post_recv(&[
        RecvWr {
            wr_id: 10,
            sg_list: &recv_sges[..1],
        },
        RecvWr {
            wr_id: 11,
            sg_list: &recv_sges[1..],
        },
    ])
    .unwrap();
    let send_sge = [src_mr.sge(0, 300).unwrap()];
    let write_sge = [src_mr.sge(300, 500).unwrap()];
    let wrs = [
        SendWr {
            wr_id: 1,
            opcode: WrOpcode::SendWithImm,
            flags: SendFlags::SIGNALED,
            sg_list: &send_sge,
            imm_data: 0x1234_5678_u32.to_be(),
            ..SendWr::default()
        },
        SendWr {
            wr_id: 2,
            opcode: WrOpcode::RdmaWrite,
            flags: SendFlags::SIGNALED,
            sg_list: &write_sge,
            remote_addr: dst_mr.addr() + 4096,
            rkey: dst_mr.rkey(),
            ..SendWr::default()
        },
        SendWr {
            wr_id: 3,
            opcode: WrOpcode::Send,
            flags: SendFlags::SIGNALED,
            sg_list: &write_sge,
            ..SendWr::default()
        },
    ];
    // SAFETY: the SGEs name registered buffers that outlive the requests.
    unsafe { a.post_send(&wrs) }.unwrap();
    fake.run_kernel();

    let mut polled = poll_batch(cq);
    polled.sort_by_key(|r| r.wr_id);
    let base = Read {
        wr_id: 0,
        status: 0,
        opcode: 0,
        vendor_err: 0,
        byte_len: 0,
        imm: 0,
        qp_num: a.qpn(),
        src_qp: 0,
        flags: 0,
        slid: 0,
        sl: 0,
        dlid_path_bits: 0,
    };
    assert_eq!(polled.len(), 5, "{polled:?}");
    let send = |wr_id, opcode| Read {
        wr_id,
        opcode,
        byte_len: polled.iter().find(|r| r.wr_id == wr_id).unwrap().byte_len,
        ..base
    };
    assert_eq!(polled[0], send(1, WcOpcode::Send.raw()));
    assert_eq!(polled[1], send(2, WcOpcode::RdmaWrite.raw()));
    assert_eq!(polled[2], send(3, WcOpcode::Send.raw()));
    let recv = polled[3];
    assert_eq!(
        recv,
        Read {
            wr_id: 10,
            opcode: WcOpcode::Recv.raw(),
            byte_len: 300,
            imm: 0x1234_5678_u32.to_be(),
            qp_num: b.qpn(),
            src_qp: a.qpn(),
            flags: WcFlags::WITH_IMM.bits(),
            ..base
        }
    );
    assert_eq!(
        polled[4],
        Read {
            wr_id: 11,
            opcode: WcOpcode::Recv.raw(),
            byte_len: 500,
            qp_num: b.qpn(),
            src_qp: a.qpn(),
            ..base
        }
    );
    assert_eq!(&dst.as_slice()[..300], &src.as_slice()[..300]);
    assert_eq!(&dst.as_slice()[4096..4596], &src.as_slice()[300..800]);
    assert_eq!(&dst.as_slice()[1000..1500], &src.as_slice()[300..800]);
    assert!(poll_batch(cq).is_empty(), "everything was consumed");

    // Mixed with ibv_poll_cq: a batch that reads one completion and ends consumes exactly it;
    // the classic poll (on ibv_cq_ex_to_cq, a cast) gets the rest.
    let sends: Vec<SendWr<'_>> = (0..3)
        .map(|i| SendWr {
            wr_id: 100 + i,
            opcode: WrOpcode::RdmaWrite,
            flags: SendFlags::SIGNALED,
            sg_list: &send_sge,
            remote_addr: dst_mr.addr(),
            rkey: dst_mr.rkey(),
            ..SendWr::default()
        })
        .collect();
    // SAFETY: as above.
    unsafe { a.post_send(&sends) }.unwrap();
    fake.run_kernel();
    // SAFETY: the poll operations of a live extended CQ.
    unsafe {
        assert_eq!((*cq).start_poll.unwrap()(cq, std::ptr::null_mut()), 0);
        assert_eq!((*cq).wr_id, 100);
        (*cq).end_poll.unwrap()(cq);
    }
    // SAFETY: all-zero is a valid ibv_wc.
    let mut wcs: [ibv_wc; 4] = unsafe { std::mem::zeroed() };
    let classic: *mut ibv_cq = cq.cast();
    // SAFETY: the classic poll of this library on the same CQ.
    let n = unsafe { crate::datapath::poll_cq(classic, 4, wcs.as_mut_ptr()) };
    assert_eq!(n, 2);
    assert_eq!((wcs[0].wr_id, wcs[1].wr_id), (101, 102));
    assert!(poll_batch(cq).is_empty());

    drop((a, b));
    // SAFETY: the CQ is no longer used; destroyed like any CQ.
    assert_eq!(unsafe { crate::cq::ibv_destroy_cq(classic) }, 0);
    close(ctx);
}

#[test]
fn create_cq_ex_refuses_what_rxe_refuses() {
    let (_fake, ctx) = open_fake();
    let create = verbs_get_ctx(ctx).create_cq_ex.unwrap();
    let errno_of = |mut attr: ibv_cq_init_attr_ex| {
        // SAFETY: a live context and a valid attribute structure.
        let cq = unsafe { create(ctx, &mut attr) };
        assert!(cq.is_null());
        std::io::Error::last_os_error().raw_os_error().unwrap()
    };
    use crate::sys::ibv_create_cq_wc_flags_IBV_WC_EX_WITH_COMPLETION_TIMESTAMP as TS;
    use crate::sys::ibv_create_cq_wc_flags_IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK as WALL;
    assert_eq!(errno_of(init_attr(u64::from(TS))), libc::EOPNOTSUPP);
    assert_eq!(errno_of(init_attr(u64::from(WALL))), libc::EOPNOTSUPP);
    let mut flags = init_attr(0);
    flags.comp_mask = ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_FLAGS;
    flags.flags = 1;
    assert_eq!(errno_of(flags), libc::EOPNOTSUPP);
    let mut unknown = init_attr(0);
    unknown.comp_mask = 1 << 7;
    assert_eq!(errno_of(unknown), libc::EINVAL);
    assert_eq!(errno_of(init_attr(0).tap_cqe(0)), libc::EINVAL);
    // A completion vector the context does not have, as the kernel refuses it (both forms).
    let mut vector = init_attr(0);
    vector.comp_vector = crate::cq::COMP_VECTORS.unsigned_abs();
    assert_eq!(errno_of(vector), libc::EINVAL);
    // SAFETY: a live context; no channel.
    let classic =
        unsafe { crate::cq::ibv_create_cq(ctx, 16, std::ptr::null_mut(), std::ptr::null_mut(), 1) };
    assert!(classic.is_null());

    // Only the accessors asked for are set, as with rdma-core's rxe provider.
    let mut attr = init_attr(u64::from(WITH_BYTE_LEN));
    // SAFETY: as above.
    let cq = unsafe { create(ctx, &mut attr) };
    // SAFETY: the CQ just made.
    let ex = unsafe { &*cq };
    assert!(ex.read_byte_len.is_some() && ex.read_opcode.is_some());
    assert!(ex.read_imm_data.is_none() && ex.read_completion_ts.is_none());
    // SAFETY: destroyed like any CQ.
    assert_eq!(unsafe { crate::cq::ibv_destroy_cq(cq.cast()) }, 0);
    close(ctx);
}

trait TapCqe {
    fn tap_cqe(self, cqe: u32) -> Self;
}

impl TapCqe for ibv_cq_init_attr_ex {
    fn tap_cqe(mut self, cqe: u32) -> Self {
        self.cqe = cqe;
        self
    }
}

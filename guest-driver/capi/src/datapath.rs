//! The data path behind `ibv_context_ops`: what the static inline `ibv_post_send`,
//! `ibv_post_recv`, `ibv_post_srq_recv`, `ibv_poll_cq` and `ibv_req_notify_cq` of
//! `<infiniband/verbs.h>` call.
//!
//! Work requests are translated in fixed-size batches on the stack and posted with the vrdma
//! library's provider; scatter/gather lists are used in place (`ibv_sge` and
//! [`vrdma::provider::Sge`] have the same layout). Nothing here allocates.

use std::ffi::c_int;

use vrdma::provider::{PostError, RecvWr, SendFlags, SendWr, Sge, WorkCompletion};
use vrdma::verbs::PostSendError;
use vrdma::verbs::{QpState, WrOpcode};

use crate::cq::VrdmaCq;
use crate::ffi::{guard, report};
use crate::objects::VrdmaAh;
use crate::qp::VrdmaQp;
use crate::srq::VrdmaSrq;
use crate::sys::{
    ibv_cq, ibv_qp, ibv_qp_type_IBV_QPT_UD, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_srq, ibv_wc,
    ibv_wc__bindgen_ty_1,
};
use crate::windows;

/// Work requests (or completions) handled per provider call.
const BATCH: usize = 16;

// `ibv_sge` lists are handed to the provider as they are.
const _: () = {
    assert!(std::mem::size_of::<ibv_sge>() == std::mem::size_of::<Sge>());
    assert!(std::mem::align_of::<ibv_sge>() == std::mem::align_of::<Sge>());
    assert!(std::mem::offset_of!(ibv_sge, addr) == std::mem::offset_of!(Sge, addr));
    assert!(std::mem::offset_of!(ibv_sge, length) == std::mem::offset_of!(Sge, length));
    assert!(std::mem::offset_of!(ibv_sge, lkey) == std::mem::offset_of!(Sge, lkey));
};

/// The SGEs of a work request.
///
/// # Safety
/// `sg_list` is valid for `num_sge` entries for `'a` (when `num_sge > 0`).
unsafe fn sges<'a>(sg_list: *const ibv_sge, num_sge: c_int) -> Result<&'a [Sge], c_int> {
    match usize::try_from(num_sge) {
        Ok(0) => Ok(&[]),
        Ok(_) if sg_list.is_null() => Err(libc::EINVAL),
        // SAFETY: caller contract; the layouts are identical (checked above).
        Ok(n) => Ok(unsafe { std::slice::from_raw_parts(sg_list.cast::<Sge>(), n) }),
        Err(_) => Err(libc::EINVAL),
    }
}

/// The provider's form of one `ibv_send_wr`; an errno value if it cannot be expressed.
///
/// # Safety
/// `wr` follows the `ibv_post_send` rules: its SGE list is valid, and on UD QPs `wr.ud.ah` is
/// an address handle of this library, all for `'a`.
pub(crate) unsafe fn send_wr<'a>(wr: &'a ibv_send_wr, ud: bool) -> Result<SendWr<'a>, c_int> {
    let opcode = WrOpcode::try_from(wr.opcode).map_err(|_| libc::EINVAL)?;
    if matches!(opcode, WrOpcode::AtomicWrite | WrOpcode::Flush) {
        // `ibv_send_wr` has no place for ATOMIC_WRITE's 8 bytes (rdma-core's rxe would send
        // the first bytes of the SGE list) nor for a FLUSH's type and level: only
        // `ibv_wr_atomic_write` and `ibv_wr_flush` post them.
        return Err(libc::EINVAL);
    }
    let flags = SendFlags::from_bits(wr.send_flags).ok_or(libc::EINVAL)?;
    // SAFETY: caller contract.
    let sg_list = unsafe { sges(wr.sg_list, wr.num_sge) }?;
    let mut out = SendWr {
        wr_id: wr.wr_id,
        opcode,
        flags,
        sg_list,
        // SAFETY: every bit pattern is a valid u32 of the union.
        imm_data: unsafe { wr.__bindgen_anon_1.imm_data },
        ..SendWr::default()
    };
    if opcode.is_atomic() {
        // SAFETY: the union's active member for atomic opcodes; plain integers.
        let atomic = unsafe { wr.wr.atomic };
        out.remote_addr = atomic.remote_addr;
        out.rkey = atomic.rkey;
        out.compare_add = atomic.compare_add;
        out.swap = atomic.swap;
    } else if opcode.is_rdma() {
        // SAFETY: the union's active member for RDMA opcodes; plain integers.
        let rdma = unsafe { wr.wr.rdma };
        out.remote_addr = rdma.remote_addr;
        out.rkey = rdma.rkey;
    } else if opcode == WrOpcode::BindMw {
        // SAFETY: the union's active member for BIND_MW.
        let bind = unsafe { wr.__bindgen_anon_2.bind_mw };
        // SAFETY: caller contract: the window of a BIND_MW is a live `ibv_mw`.
        let mw = unsafe { bind.mw.cast_const().as_ref() }.ok_or(libc::EINVAL)?;
        // SAFETY: caller contract: the MR is NULL or live.
        out.bind = Some(unsafe { windows::bind_of(&bind.bind_info, mw.rkey, bind.rkey) }?);
    }
    if opcode.has_invalidate() {
        // SAFETY: the union's active member for LOCAL_INV and SEND_WITH_INV; a plain u32.
        out.invalidate_rkey = unsafe { wr.__bindgen_anon_1.invalidate_rkey };
    }
    if ud {
        // SAFETY: the union's active member on UD QPs.
        let dest = unsafe { wr.wr.ud };
        // SAFETY: caller contract: an AH of this library, alive for `'a`.
        let ah = unsafe { dest.ah.cast::<VrdmaAh>().as_ref() }.ok_or(libc::EINVAL)?;
        out.ud = Some(ah.ah.dest(dest.remote_qpn, dest.remote_qkey));
    }
    Ok(out)
}

/// Whether the QP's send queue takes requests now. rxe's kernel refuses the doorbell of a QP
/// below RTS (`rxe_post_send`: `qp_state(qp) < IB_QPS_RTS`, `-EINVAL`), so rdma-core's
/// `ibv_post_send` and `ibv_wr_complete` fail with EINVAL in RESET, INIT and RTR; SQD, SQE,
/// ERR (flushing) take them. The state is the one libibverbs keeps in `qp->state` (set by
/// `ibv_modify_qp`, `ibv_query_qp` and this library's rdma_cm moves).
pub(crate) fn send_queue_open(qp: &ibv_qp) -> bool {
    qp.state >= QpState::Rts as u32
}

/// errno of a refused work request, as rdma-core's rxe provider reports it.
fn post_errno(e: &PostError) -> c_int {
    match e {
        PostError::QueueFull => libc::ENOMEM,
        PostError::Doorbell | PostError::QueueLost => libc::EIO,
        _ => libc::EINVAL,
    }
}

/// `ops.post_send`.
///
/// # Safety
/// As `ibv_post_send`: `qp` is a QP of this library, `wr` a valid list, `bad_wr` writable.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    guard("ibv_post_send", libc::EIO, || {
        // SAFETY: caller contract.
        let Some(vqp) = (unsafe { VrdmaQp::from_ptr(qp) }) else {
            return fail_at(bad_wr, wr, libc::EINVAL);
        };
        if !send_queue_open(&vqp.ibv.qp_base) {
            return fail_at(bad_wr, wr, libc::EINVAL);
        }
        let ud = vqp.ibv.qp_base.qp_type == ibv_qp_type_IBV_QPT_UD;
        let post = |batch: &[SendWr<'_>]| {
            // SAFETY: the application's SGEs follow the ibv_post_send rules (inline data
            // readable now, other buffers registered).
            match unsafe { vqp.qp.post_send(batch) } {
                Ok(()) => Ok(()),
                Err(PostSendError::Refused { index, error }) => Err((index, post_errno(&error))),
                Err(e @ PostSendError::Doorbell { .. }) => {
                    log::warn!("vrdma: ibv_post_send: {e}");
                    Err((e.posted().min(batch.len() - 1), libc::EIO))
                }
            }
        };
        // SAFETY: caller contract: each request's SGE list is valid.
        let translate = |w| unsafe { send_wr(w, ud) };
        // SAFETY: caller contract: a valid NULL-terminated list.
        unsafe { post_list(wr, bad_wr, |w| w.next, translate, post) }
    })
}

/// `ops.post_recv`.
///
/// # Safety
/// As `ibv_post_recv`: `qp` is a QP of this library, `wr` a valid list, `bad_wr` writable.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard("ibv_post_recv", libc::EIO, || {
        // SAFETY: caller contract.
        match unsafe { VrdmaQp::from_ptr(qp) } {
            // As rdma-core's rxe provider: a QP attached to an SRQ takes no receives.
            Some(vqp) if !vqp.qp.has_srq() => {
                // As rxe's provider (C10-97.2.1): no receives in RESET.
                if vqp.ibv.qp_base.state == QpState::Reset as u32 {
                    return fail_at(bad_wr, wr, libc::EINVAL);
                }
                // SAFETY: caller contract.
                unsafe { post_recv_list(wr, bad_wr, |batch| vqp.qp.post_recv(batch)) }
            }
            _ => fail_at(bad_wr, wr, libc::EINVAL),
        }
    })
}

/// `ops.post_srq_recv`.
///
/// # Safety
/// As `ibv_post_srq_recv`: `srq` is an SRQ of this library, `wr` a valid list, `bad_wr`
/// writable.
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard("ibv_post_srq_recv", libc::EIO, || {
        // SAFETY: caller contract.
        let Some(vsrq) = (unsafe { VrdmaSrq::from_ptr(srq) }) else {
            return fail_at(bad_wr, wr, libc::EINVAL);
        };
        // SAFETY: caller contract.
        unsafe { post_recv_list(wr, bad_wr, |batch| vsrq.srq.post_recv(batch)) }
    })
}

/// Stores `at` in `*bad_wr` (if not NULL) and returns `errno`.
fn fail_at<W>(bad_wr: *mut *mut W, at: *mut W, errno: c_int) -> c_int {
    if !bad_wr.is_null() {
        // SAFETY: the caller of the ops entry point gives a writable `bad_wr` or NULL.
        unsafe { *bad_wr = at };
    }
    errno
}

/// Translates the receive list `wr` in batches and hands each to `post` (a QP's RQ or an
/// SRQ); 0, or the errno value of the first refused request, stored in `*bad_wr`.
///
/// # Safety
/// As `ibv_post_recv`: `wr` is a valid NULL-terminated list, `bad_wr` NULL or writable.
unsafe fn post_recv_list(
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    post: impl Fn(&[RecvWr<'_>]) -> Result<(), (usize, PostError)>,
) -> c_int {
    let translate = |w: &ibv_recv_wr| {
        // SAFETY: caller contract: the request's SGE list is valid.
        let sg_list = unsafe { sges(w.sg_list, w.num_sge) }?;
        Ok(RecvWr {
            wr_id: w.wr_id,
            sg_list,
        })
    };
    let post = |batch: &[RecvWr<'_>]| post(batch).map_err(|(index, e)| (index, post_errno(&e)));
    // SAFETY: caller contract.
    unsafe { post_list(wr, bad_wr, |w| w.next, translate, post) }
}

/// Walks the NULL-terminated request list `wr`, translates each request and hands them to
/// `post` in batches of at most [`BATCH`] kept on the stack (no allocation per call). Returns
/// 0, or the errno of the first request that was refused (by `translate` or `post`, which
/// names it by its index in the batch), storing that request in `*bad_wr`; requests before it
/// were posted, as `ibv_post_send`/`ibv_post_recv` promise.
///
/// # Safety
/// `wr` is NULL or a valid list whose `next` links end in NULL and which stays valid for
/// `'a`; `bad_wr` is NULL or writable.
unsafe fn post_list<'a, W: 'a, T: Copy + Default>(
    wr: *mut W,
    bad_wr: *mut *mut W,
    next: impl Fn(&W) -> *mut W,
    translate: impl Fn(&'a W) -> Result<T, c_int>,
    post: impl Fn(&[T]) -> Result<(), (usize, c_int)>,
) -> c_int {
    let mut batch = [T::default(); BATCH];
    let mut origin = [std::ptr::null_mut::<W>(); BATCH];
    let mut len = 0;
    let flush = |batch: &[T], origin: &[*mut W]| -> Result<(), c_int> {
        if batch.is_empty() {
            return Ok(());
        }
        post(batch).map_err(|(index, errno)| fail_at(bad_wr, origin[index], errno))
    };
    let mut cur = wr;
    // SAFETY: caller contract: a NULL-terminated list of requests valid for `'a`.
    while let Some(w) = unsafe { cur.as_ref::<'a>() } {
        match translate(w) {
            Ok(translated) => {
                batch[len] = translated;
                origin[len] = cur;
                len += 1;
            }
            Err(errno) => {
                if let Err(errno) = flush(&batch[..len], &origin[..len]) {
                    return errno;
                }
                return fail_at(bad_wr, cur, errno);
            }
        }
        if len == BATCH {
            if let Err(errno) = flush(&batch, &origin) {
                return errno;
            }
            len = 0;
        }
        cur = next(w);
    }
    flush(&batch[..len], &origin[..len]).err().unwrap_or(0)
}

/// The `ibv_wc` of a completion.
pub(crate) fn wc(c: &WorkCompletion) -> ibv_wc {
    ibv_wc {
        wr_id: c.wr_id,
        status: c.status.raw(),
        opcode: c.opcode.raw(),
        vendor_err: c.vendor_err,
        byte_len: c.byte_len,
        __bindgen_anon_1: ibv_wc__bindgen_ty_1 {
            imm_data: c.imm_data,
        },
        qp_num: c.qp_num,
        src_qp: c.src_qp,
        wc_flags: c.wc_flags.bits(),
        pkey_index: c.pkey_index,
        slid: c.slid,
        sl: c.sl,
        dlid_path_bits: c.dlid_path_bits,
    }
}

/// `ops.poll_cq`: the number of completions written, or a negative value on error.
///
/// # Safety
/// As `ibv_poll_cq`: `cq` is a CQ of this library, `out` valid for `num_entries` writes.
pub(crate) unsafe extern "C" fn poll_cq(
    cq: *mut ibv_cq,
    num_entries: c_int,
    out: *mut ibv_wc,
) -> c_int {
    guard("ibv_poll_cq", -1, || {
        // SAFETY: caller contract.
        let Some(vcq) = (unsafe { VrdmaCq::from_ptr(cq) }) else {
            return -1;
        };
        let wanted = usize::try_from(num_entries).unwrap_or(0);
        if wanted > 0 && out.is_null() {
            return -1;
        }
        let mut buf = [WorkCompletion::default(); BATCH];
        let mut total = 0;
        while total < wanted {
            let chunk = (wanted - total).min(BATCH);
            let got = vcq.cq.poll(&mut buf[..chunk]);
            for (i, c) in buf[..got].iter().enumerate() {
                // SAFETY: `total + i < wanted`: inside the caller's array.
                unsafe { out.add(total + i).write(wc(c)) };
            }
            total += got;
            if got < chunk {
                break;
            }
        }
        c_int::try_from(total).unwrap_or(c_int::MAX)
    })
}

/// `ops.req_notify_cq`: 0, or an errno value.
///
/// # Safety
/// `cq` is a CQ of this library.
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard("ibv_req_notify_cq", libc::EIO, || {
        // SAFETY: caller contract.
        let Some(vcq) = (unsafe { VrdmaCq::from_ptr(cq) }) else {
            return libc::EINVAL;
        };
        match vcq.cq.arm(solicited_only != 0) {
            Ok(()) => 0,
            Err(e) => report("ibv_req_notify_cq", &e),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vrdma::provider::WcFlags;
    use vrdma::verbs::{WcOpcode, WcStatus};

    fn zeroed_wr() -> ibv_send_wr {
        // SAFETY: all-zero is a valid ibv_send_wr.
        unsafe { std::mem::zeroed() }
    }

    #[test]
    fn rdma_and_send_requests_translate_field_by_field() {
        let mut sge = [
            ibv_sge {
                addr: 0x1000,
                length: 64,
                lkey: 7,
            },
            ibv_sge {
                addr: 0x2000,
                length: 32,
                lkey: 8,
            },
        ];
        let mut wr = zeroed_wr();
        wr.wr_id = 99;
        wr.opcode = 0; // IBV_WR_RDMA_WRITE
        wr.send_flags = 2; // IBV_SEND_SIGNALED
        wr.sg_list = sge.as_mut_ptr();
        wr.num_sge = 2;
        wr.wr.rdma.remote_addr = 0xdead_0000;
        wr.wr.rdma.rkey = 0x55;
        // SAFETY: the SGE list is valid; RC QP.
        let t = unsafe { send_wr(&wr, false) }.unwrap();
        assert_eq!(t.wr_id, 99);
        assert_eq!(t.opcode, WrOpcode::RdmaWrite);
        assert_eq!(t.flags, SendFlags::SIGNALED);
        assert_eq!((t.remote_addr, t.rkey), (0xdead_0000, 0x55));
        assert_eq!(t.sg_list.len(), 2);
        assert_eq!(
            t.sg_list[1],
            Sge {
                addr: 0x2000,
                length: 32,
                lkey: 8
            }
        );
        assert!(t.ud.is_none());

        wr.opcode = 3; // IBV_WR_SEND_WITH_IMM
        wr.__bindgen_anon_1.imm_data = 0x0102_0304u32.to_be();
        wr.num_sge = 0;
        wr.sg_list = std::ptr::null_mut();
        // SAFETY: no SGEs.
        let t = unsafe { send_wr(&wr, false) }.unwrap();
        assert_eq!(t.imm_data, 0x0102_0304u32.to_be());
        assert_eq!((t.remote_addr, t.rkey), (0, 0));
        assert!(t.sg_list.is_empty());

        wr.opcode = 5; // IBV_WR_ATOMIC_CMP_AND_SWP
        wr.wr.atomic.remote_addr = 0x8000;
        wr.wr.atomic.compare_add = 1;
        wr.wr.atomic.swap = 2;
        wr.wr.atomic.rkey = 3;
        // SAFETY: no SGEs.
        let t = unsafe { send_wr(&wr, false) }.unwrap();
        assert_eq!(
            (t.remote_addr, t.compare_add, t.swap, t.rkey),
            (0x8000, 1, 2, 3)
        );
    }

    /// A request list of `values` for `post_list`.
    struct Request {
        next: *mut Request,
        value: u32,
    }

    fn request_list(values: &[u32]) -> Vec<Request> {
        let mut list: Vec<Request> = values
            .iter()
            .map(|&value| Request {
                next: std::ptr::null_mut(),
                value,
            })
            .collect();
        for i in 1..list.len() {
            let next: *mut Request = &mut list[i];
            list[i - 1].next = next;
        }
        list
    }

    fn post_values(
        list: &mut [Request],
        posted: &std::cell::RefCell<Vec<Vec<u32>>>,
        refuse: Option<u32>,
    ) -> (c_int, *mut Request) {
        let mut bad: *mut Request = std::ptr::null_mut();
        let translate = |r: &Request| {
            if r.value == 0 {
                Err(libc::EINVAL)
            } else {
                Ok(r.value)
            }
        };
        let post = |batch: &[u32]| {
            if let Some(index) = batch.iter().position(|v| Some(*v) == refuse) {
                posted.borrow_mut().push(batch[..index].to_vec());
                return Err((index, libc::ENOMEM));
            }
            posted.borrow_mut().push(batch.to_vec());
            Ok(())
        };
        // SAFETY: `list` is a valid NULL-terminated list that outlives the call.
        let errno = unsafe { post_list(list.as_mut_ptr(), &mut bad, |r| r.next, translate, post) };
        (errno, bad)
    }

    #[test]
    fn request_lists_are_posted_in_batches_and_the_first_refused_one_is_named() {
        let values: Vec<u32> = (1..=(BATCH as u32 * 2 + 3)).collect();
        let mut list = request_list(&values);
        let posted = std::cell::RefCell::new(Vec::new());
        assert_eq!(
            post_values(&mut list, &posted, None),
            (0, std::ptr::null_mut())
        );
        let batches = posted.take();
        assert_eq!(
            batches.iter().map(Vec::len).collect::<Vec<_>>(),
            [BATCH, BATCH, 3]
        );
        assert_eq!(batches.concat(), values);

        // A request that does not translate: those before it are posted, it is named.
        let mut list = request_list(&[1, 2, 0, 4]);
        let (errno, bad) = post_values(&mut list, &posted, None);
        assert_eq!((errno, bad), (libc::EINVAL, &mut list[2] as *mut Request));
        assert_eq!(posted.take(), [vec![1, 2]]);

        // A request the queue refuses is named by its batch index.
        let mut list = request_list(&[1, 2, 3]);
        let (errno, bad) = post_values(&mut list, &posted, Some(2));
        assert_eq!((errno, bad), (libc::ENOMEM, &mut list[1] as *mut Request));
        assert_eq!(posted.take(), [vec![1]]);
    }

    #[test]
    fn unsupported_requests_are_einval() {
        let mut wr = zeroed_wr();
        wr.opcode = 10; // IBV_WR_TSO
                        // SAFETY: no SGEs.
        assert_eq!(unsafe { send_wr(&wr, false) }.unwrap_err(), libc::EINVAL);
        wr.opcode = 8; // IBV_WR_BIND_MW without its window
                       // SAFETY: no SGEs; the NULL window is rejected.
        assert_eq!(unsafe { send_wr(&wr, false) }.unwrap_err(), libc::EINVAL);
        wr.opcode = 2;
        wr.send_flags = 16; // IBV_SEND_IP_CSUM
                            // SAFETY: no SGEs.
        assert_eq!(unsafe { send_wr(&wr, false) }.unwrap_err(), libc::EINVAL);
        wr.send_flags = 0;
        wr.num_sge = -1;
        // SAFETY: rejected before the list is read.
        assert_eq!(unsafe { send_wr(&wr, false) }.unwrap_err(), libc::EINVAL);
        wr.num_sge = 1;
        // SAFETY: a NULL list is rejected before it is read.
        assert_eq!(unsafe { send_wr(&wr, false) }.unwrap_err(), libc::EINVAL);
        wr.num_sge = 0;
        // A UD request without an address handle.
        // SAFETY: no SGEs; the NULL AH is rejected.
        assert_eq!(unsafe { send_wr(&wr, true) }.unwrap_err(), libc::EINVAL);
        assert_eq!(post_errno(&PostError::QueueFull), libc::ENOMEM);
        assert_eq!(post_errno(&PostError::MissingUdDest), libc::EINVAL);
    }

    #[test]
    fn memory_window_requests_carry_their_keys() {
        for opcode in [7, 9] {
            // IBV_WR_LOCAL_INV, IBV_WR_SEND_WITH_INV
            let mut wr = zeroed_wr();
            wr.opcode = opcode;
            wr.__bindgen_anon_1.invalidate_rkey = 0x1234_5678;
            // SAFETY: no SGEs.
            let out = unsafe { send_wr(&wr, false) }.unwrap();
            assert_eq!(out.invalidate_rkey, 0x1234_5678);
            assert_eq!(out.opcode as u32, opcode);
        }
        // SAFETY: all-zero is a valid ibv_mw and ibv_mr (NULL pointers, zero numbers).
        let (mut mw, mut mr): (crate::sys::ibv_mw, crate::sys::ibv_mr) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        mw.rkey = 0x4280;
        mr.lkey = 0x3300;
        let mut wr = zeroed_wr();
        wr.opcode = 8; // IBV_WR_BIND_MW
        wr.__bindgen_anon_2.bind_mw.mw = &mut mw;
        wr.__bindgen_anon_2.bind_mw.rkey = 0x4281;
        wr.__bindgen_anon_2.bind_mw.bind_info.mr = &mut mr;
        wr.__bindgen_anon_2.bind_mw.bind_info.addr = 0x7000;
        wr.__bindgen_anon_2.bind_mw.bind_info.length = 4096;
        wr.__bindgen_anon_2.bind_mw.bind_info.mw_access_flags = 0x2;
        // SAFETY: the window and MR are live locals.
        let bind = unsafe { send_wr(&wr, false) }.unwrap().bind.unwrap();
        assert_eq!(
            (bind.mw_rkey, bind.rkey, bind.mr_lkey),
            (0x4280, 0x4281, 0x3300)
        );
        assert_eq!(
            (bind.addr, bind.length, bind.access.bits()),
            (0x7000, 4096, 0x2)
        );
    }

    #[test]
    fn completions_keep_every_field() {
        let c = WorkCompletion {
            wr_id: 5,
            status: WcStatus::RemAccessErr,
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len: 4096,
            imm_data: 0xaabbccdd,
            qp_num: 17,
            src_qp: 18,
            wc_flags: WcFlags::GRH | WcFlags::WITH_IMM,
            pkey_index: 1,
            slid: 2,
            sl: 3,
            dlid_path_bits: 4,
            port_num: 1,
            vendor_err: 0x99,
        };
        let w = wc(&c);
        assert_eq!((w.wr_id, w.status, w.opcode), (5, 10, 129));
        assert_eq!(
            (w.byte_len, w.qp_num, w.src_qp, w.wc_flags),
            (4096, 17, 18, 3)
        );
        // SAFETY: reading the u32 member of the union.
        assert_eq!(unsafe { w.__bindgen_anon_1.imm_data }, 0xaabbccdd);
        assert_eq!((w.pkey_index, w.slid, w.sl, w.dlid_path_bits), (1, 2, 3, 4));
        assert_eq!(w.vendor_err, 0x99);
    }
}

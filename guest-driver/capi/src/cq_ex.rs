//! Extended completion queues: `verbs_context.create_cq_ex` (behind the inline
//! `ibv_create_cq_ex`) and the poll operations of `ibv_cq_ex` (`ibv_start_poll`,
//! `ibv_next_poll`, `ibv_end_poll` and the `ibv_wc_read_*` accessors).
//!
//! A batch poll holds the CQ's lock from `start_poll` to `end_poll` (as rdma-core's rxe
//! provider does), reads each completion in place from the ring and hands the consumed slots
//! back to the device once, at `end_poll` (Release on the consumer index). Nothing allocates.
//! The CQ is an ordinary [`VrdmaCq`]: `ibv_cq_ex_to_cq`, `ibv_poll_cq`, `ibv_req_notify_cq`,
//! completion channels and `ibv_destroy_cq` work on it as on any CQ.

use std::ffi::{c_int, c_uint};

use vrdma::provider::WorkCompletion;
use vrdma::verbs::CqPollBatch;

use crate::cq::{self, PollState, VrdmaCq};
use crate::ffi::{guard, null_with};
use crate::sys::{
    ibv_context, ibv_cq_ex, ibv_cq_init_attr_ex, ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_FLAGS,
    ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_PD,
    ibv_create_cq_wc_flags_IBV_WC_EX_WITH_BYTE_LEN as WITH_BYTE_LEN,
    ibv_create_cq_wc_flags_IBV_WC_EX_WITH_DLID_PATH_BITS as WITH_DLID_PATH_BITS,
    ibv_create_cq_wc_flags_IBV_WC_EX_WITH_IMM as WITH_IMM,
    ibv_create_cq_wc_flags_IBV_WC_EX_WITH_QP_NUM as WITH_QP_NUM,
    ibv_create_cq_wc_flags_IBV_WC_EX_WITH_SL as WITH_SL,
    ibv_create_cq_wc_flags_IBV_WC_EX_WITH_SLID as WITH_SLID,
    ibv_create_cq_wc_flags_IBV_WC_EX_WITH_SRC_QP as WITH_SRC_QP, ibv_poll_cq_attr, ibv_wc_opcode,
};

#[cfg(test)]
pub(crate) mod tests;

/// The `wc_flags` of `ibv_cq_init_attr_ex` this library fills: those of rdma-core's rxe
/// provider. Completion timestamps (rxe has no clock), CVLAN, flow tag and tag matching:
/// EOPNOTSUPP.
const SUPPORTED_WC_FLAGS: u64 = (WITH_BYTE_LEN
    | WITH_IMM
    | WITH_QP_NUM
    | WITH_SRC_QP
    | WITH_SLID
    | WITH_SL
    | WITH_DLID_PATH_BITS) as u64;

/// The `comp_mask` bits of `ibv_cq_init_attr_ex` rdma-core knows.
const KNOWN_INIT_MASK: u32 = ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_FLAGS
    | ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_PD;

/// `verbs_context.create_cq_ex`: a CQ with the extended poll operations, or NULL and errno:
/// EINVAL for unknown `comp_mask` bits, EOPNOTSUPP for `wc_flags` this library does not fill
/// (see [`SUPPORTED_WC_FLAGS`]), for creation flags (which rxe refuses) and for a parent
/// domain (this library makes none); EINVAL for a `comp_vector` the context lacks.
///
/// # Safety
/// `context` is a context of this library; `attr` is readable; its `channel` is NULL or a
/// channel of the context.
pub(crate) unsafe extern "C" fn create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard("ibv_create_cq_ex", std::ptr::null_mut(), || {
        // SAFETY: caller contract.
        let Some(attr) = (unsafe { attr.as_ref() }) else {
            return null_with("ibv_create_cq_ex", libc::EINVAL);
        };
        if attr.comp_mask & !KNOWN_INIT_MASK != 0 {
            return null_with("ibv_create_cq_ex (comp_mask)", libc::EINVAL);
        }
        let flags = attr.comp_mask & ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_FLAGS != 0;
        if (flags && attr.flags != 0)
            || attr.comp_mask & ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_PD != 0
        {
            return null_with(
                "ibv_create_cq_ex (flags or parent domain)",
                libc::EOPNOTSUPP,
            );
        }
        if attr.wc_flags & !SUPPORTED_WC_FLAGS != 0 {
            return null_with("ibv_create_cq_ex (wc_flags)", libc::EOPNOTSUPP);
        }
        // SAFETY: caller contract.
        let created = unsafe {
            cq::create(
                context,
                attr.cqe,
                attr.comp_vector,
                attr.cq_context,
                attr.channel,
            )
        };
        let raw = match created {
            Ok(raw) => raw,
            Err(errno) => return null_with("ibv_create_cq_ex", errno),
        };
        // SAFETY: the CQ just made; not shared yet.
        let ex = unsafe { &mut (*raw).ibv };
        set_poll_ops(ex, attr.wc_flags);
        raw.cast()
    })
}

/// Sets the operations of an extended CQ: the poll operations and the accessors every CQ has,
/// and the accessors of the fields `wc_flags` asks for (the others stay NULL, as in rdma-core).
fn set_poll_ops(ex: &mut ibv_cq_ex, wc_flags: u64) {
    ex.start_poll = Some(start_poll);
    ex.next_poll = Some(next_poll);
    ex.end_poll = Some(end_poll);
    ex.read_opcode = Some(read_opcode);
    ex.read_vendor_err = Some(read_vendor_err);
    ex.read_wc_flags = Some(read_wc_flags);
    let wanted = |flag: u32| wc_flags & u64::from(flag) != 0;
    if wanted(WITH_BYTE_LEN) {
        ex.read_byte_len = Some(read_byte_len);
    }
    if wanted(WITH_IMM) {
        ex.read_imm_data = Some(read_imm_data);
    }
    if wanted(WITH_QP_NUM) {
        ex.read_qp_num = Some(read_qp_num);
    }
    if wanted(WITH_SRC_QP) {
        ex.read_src_qp = Some(read_src_qp);
    }
    if wanted(WITH_SLID) {
        ex.read_slid = Some(read_slid);
    }
    if wanted(WITH_SL) {
        ex.read_sl = Some(read_sl);
    }
    if wanted(WITH_DLID_PATH_BITS) {
        ex.read_dlid_path_bits = Some(read_dlid_path_bits);
    }
}

/// Makes `wc` the current completion: the accessors read it, and `ibv_cq_ex` shows its
/// `wr_id` and `status`.
///
/// # Safety
/// `cq` is the extended CQ of `state`, polled by the caller's open batch; no reference to
/// its `ibv` part is used afterwards.
unsafe fn set_current(cq: *mut ibv_cq_ex, state: &PollState, wc: WorkCompletion) {
    state.current.set(Some(wc));
    // SAFETY: caller contract; the fields the application reads after each poll call.
    unsafe {
        (&raw mut (*cq).wr_id).write(wc.wr_id);
        (&raw mut (*cq).status).write(wc.status.raw());
    }
}

/// `ibv_start_poll`: locks the CQ and makes the oldest completion current; 0, ENOENT (and the
/// CQ unlocked: no `end_poll` follows) when it is empty, EINVAL for a `comp_mask` in `attr`.
///
/// # Safety
/// `cq` is an extended CQ of this library; `attr` is NULL or readable.
unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    guard("ibv_start_poll", libc::EIO, || {
        // SAFETY: caller contract.
        if unsafe { attr.as_ref() }.is_some_and(|attr| attr.comp_mask != 0) {
            return libc::EINVAL;
        }
        // SAFETY: caller contract.
        let Some(vcq) = (unsafe { VrdmaCq::from_ptr(cq.cast()) }) else {
            return libc::EINVAL;
        };
        let mut batch = vcq.cq.poll_batch();
        let Some(wc) = batch.peek() else {
            return libc::ENOENT;
        };
        // SAFETY: the batch borrows `vcq.cq`, which lives in the same allocation as the
        // state that keeps the batch and outlives it (`PollState` is dropped first; the
        // batch is taken by `end_poll`).
        let batch = unsafe { std::mem::transmute::<CqPollBatch<'_>, CqPollBatch<'static>>(batch) };
        // SAFETY: this caller holds the CQ's lock now (through `batch`): no other batch
        // touches the state (see `PollState`).
        unsafe { *vcq.poll.batch.get() = Some(batch) };
        // SAFETY: the batch is open; `vcq` is not used afterwards.
        unsafe { set_current(cq, &vcq.poll, wc) };
        0
    })
}

/// `ibv_next_poll`: consumes the current completion and makes the next one current; 0, or
/// ENOENT when there is none (the batch stays open until `end_poll`).
///
/// # Safety
/// `cq` is an extended CQ of this library with a batch opened by the caller.
unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    guard("ibv_next_poll", libc::EIO, || {
        // SAFETY: caller contract.
        let Some(vcq) = (unsafe { VrdmaCq::from_ptr(cq.cast()) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the caller holds the batch (caller contract, see `PollState`).
        let Some(batch) = (unsafe { &mut *vcq.poll.batch.get() }).as_mut() else {
            return libc::EINVAL;
        };
        if vcq.poll.current.take().is_some() {
            batch.consume();
        }
        match batch.peek() {
            // SAFETY: the batch is open; `vcq` is not used afterwards.
            Some(wc) => unsafe {
                set_current(cq, &vcq.poll, wc);
                0
            },
            None => libc::ENOENT,
        }
    })
}

/// `ibv_end_poll`: consumes the current completion (if `next_poll` did not report ENOENT),
/// hands the consumed slots back to the device and unlocks the CQ.
///
/// # Safety
/// `cq` is an extended CQ of this library with a batch opened by the caller.
unsafe extern "C" fn end_poll(cq: *mut ibv_cq_ex) {
    guard("ibv_end_poll", (), || {
        // SAFETY: caller contract.
        let Some(vcq) = (unsafe { VrdmaCq::from_ptr(cq.cast()) }) else {
            return;
        };
        // SAFETY: the caller holds the batch (caller contract, see `PollState`).
        let Some(mut batch) = (unsafe { &mut *vcq.poll.batch.get() }).take() else {
            return;
        };
        if vcq.poll.current.take().is_some() {
            batch.consume();
        }
        // Publishes the consumer index (Release) and unlocks.
        drop(batch);
    })
}

/// The current completion of `cq` (a default one if the caller has none: a misuse).
///
/// # Safety
/// `cq` is an extended CQ of this library.
unsafe fn current(cq: *mut ibv_cq_ex) -> WorkCompletion {
    // SAFETY: caller contract.
    let vcq = unsafe { VrdmaCq::from_ptr(cq.cast()) };
    vcq.and_then(|vcq| vcq.poll.current.get())
        .unwrap_or_default()
}

/// `ibv_wc_read_opcode`.
///
/// # Safety
/// `cq` is an extended CQ of this library with a current completion.
unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> ibv_wc_opcode {
    // SAFETY: caller contract.
    unsafe { current(cq) }.opcode.raw()
}

/// `ibv_wc_read_vendor_err`.
///
/// # Safety
/// As [`read_opcode`].
unsafe extern "C" fn read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: caller contract.
    unsafe { current(cq) }.vendor_err
}

/// `ibv_wc_read_byte_len`.
///
/// # Safety
/// As [`read_opcode`].
unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: caller contract.
    unsafe { current(cq) }.byte_len
}

/// `ibv_wc_read_imm_data`: network byte order, as in `ibv_wc`.
///
/// # Safety
/// As [`read_opcode`].
unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: caller contract.
    unsafe { current(cq) }.imm_data
}

/// `ibv_wc_read_qp_num`.
///
/// # Safety
/// As [`read_opcode`].
unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: caller contract.
    unsafe { current(cq) }.qp_num
}

/// `ibv_wc_read_src_qp`.
///
/// # Safety
/// As [`read_opcode`].
unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: caller contract.
    unsafe { current(cq) }.src_qp
}

/// `ibv_wc_read_wc_flags`: the `IBV_WC_*` flags of `ibv_wc.wc_flags`.
///
/// # Safety
/// As [`read_opcode`].
unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> c_uint {
    // SAFETY: caller contract.
    unsafe { current(cq) }.wc_flags.bits()
}

/// `ibv_wc_read_slid`.
///
/// # Safety
/// As [`read_opcode`].
unsafe extern "C" fn read_slid(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: caller contract.
    u32::from(unsafe { current(cq) }.slid)
}

/// `ibv_wc_read_sl`.
///
/// # Safety
/// As [`read_opcode`].
unsafe extern "C" fn read_sl(cq: *mut ibv_cq_ex) -> u8 {
    // SAFETY: caller contract.
    unsafe { current(cq) }.sl
}

/// `ibv_wc_read_dlid_path_bits`.
///
/// # Safety
/// As [`read_opcode`].
unsafe extern "C" fn read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 {
    // SAFETY: caller contract.
    unsafe { current(cq) }.dlid_path_bits
}

//! Extended QPs: `verbs_context.create_qp_ex` (behind the inline `ibv_create_qp_ex`),
//! `ibv_qp_to_qp_ex` and the `ibv_wr_*` operations of `ibv_qp_ex`, with the semantics of
//! rdma-core's rxe provider.
//!
//! `ibv_wr_start` opens a batch on the QP, which holds the QP's send lock until
//! `ibv_wr_complete` or `ibv_wr_abort`. Each opcode call (`ibv_wr_send`, `_rdma_write`...)
//! starts a request in the next free slot of the send ring from `qp_ex->wr_id` and
//! `qp_ex->wr_flags`; the setters (`ibv_wr_set_sge`, `_set_sge_list`, `_set_inline_data`,
//! `_set_inline_data_list`, `_set_ud_addr`) fill it in place. `ibv_wr_complete` publishes the
//! whole batch and rings the doorbell once, or, if a request was refused, publishes nothing
//! and returns the refusal's errno (as rxe: `ENOSPC` for a full queue or a payload larger than
//! the QP's limits, `EINVAL` for a request the QP cannot carry, `EOPNOTSUPP` for an operation
//! this library lacks). The requests are written by the encoder `ibv_post_send` uses
//! ([`vrdma::verbs::SendBatch`]); nothing allocates.
//!
//! `ibv_wr_bind_mw`, `ibv_wr_local_inv` and `ibv_wr_send_inv` are accepted at creation as rxe
//! accepts them; they build memory-window requests when the context negotiated memory
//! windows (`VRDMA_F_MW`), and otherwise fail the batch with `EOPNOTSUPP`. TSO and XRC (and
//! rdma-core's later FLUSH and ATOMIC_WRITE) are refused at creation, as rxe refuses them.

use std::ffi::{c_int, c_void};

use vrdma::provider::{FlushRange, PostError};
use vrdma::spec::features::VRDMA_F_MW;
use vrdma::verbs::{QpType, SendBatch, SendBatchError, SendFlags, SendWr, Sge, WrOpcode};

use crate::context::VrdmaContext;
use crate::ffi::{guard, null_with};
use crate::objects::VrdmaAh;
use crate::qp::{self, VrdmaQp};
use crate::sys::{
    ibv_ah, ibv_context, ibv_data_buf, ibv_mw, ibv_mw_bind_info, ibv_qp, ibv_qp_ex,
    ibv_qp_init_attr, ibv_qp_init_attr_ex, ibv_sge, size_t,
};
use crate::sys::{
    ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP as WITH_CMP_SWP,
    ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD as WITH_FETCH_ADD,
    ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_ATOMIC_WRITE as WITH_ATOMIC_WRITE,
    ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_BIND_MW as WITH_BIND_MW,
    ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_LOCAL_INV as WITH_LOCAL_INV,
    ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_READ as WITH_READ,
    ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_WRITE as WITH_WRITE,
    ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM as WITH_WRITE_IMM,
    ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND as WITH_SEND,
    ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND_WITH_IMM as WITH_SEND_IMM,
    ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND_WITH_INV as WITH_SEND_INV,
    ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_CREATE_FLAGS as ATTR_CREATE_FLAGS,
    ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_PD as ATTR_PD,
    ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_SEND_OPS_FLAGS as ATTR_SEND_OPS_FLAGS,
};
use crate::windows;

#[cfg(test)]
mod create_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod ud_tests;
#[cfg(test)]
mod window_tests;

/// The `comp_mask` bits of `ibv_qp_init_attr_ex` rxe accepts.
const SUPPORTED_INIT_MASK: u32 = ATTR_PD | ATTR_CREATE_FLAGS | ATTR_SEND_OPS_FLAGS;

/// `IBV_QP_EX_WITH_FLUSH` (rdma-core 45+; not in `sys`, generated from rdma-core 44).
const WITH_FLUSH: u64 = 1 << 11;

/// The `send_ops_flags` rxe accepts on each QP type (FLUSH, which rdma-core 44 lacks, is
/// [`WITH_FLUSH`]).
const RC_SEND_OPS: u32 = WITH_WRITE
    | WITH_WRITE_IMM
    | WITH_SEND
    | WITH_SEND_IMM
    | WITH_READ
    | WITH_CMP_SWP
    | WITH_FETCH_ADD
    | WITH_LOCAL_INV
    | WITH_BIND_MW
    | WITH_SEND_INV
    | WITH_ATOMIC_WRITE
    | WITH_FLUSH as u32;
const UC_SEND_OPS: u32 =
    WITH_WRITE | WITH_WRITE_IMM | WITH_SEND | WITH_SEND_IMM | WITH_BIND_MW | WITH_SEND_INV;
const UD_SEND_OPS: u32 = WITH_SEND | WITH_SEND_IMM;

/// `verbs_context.create_qp_ex`: an RC, UC or UD QP whose `ibv_qp_ex` has the operations of
/// `send_ops_flags` (when `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` is given) and the setters, or NULL
/// and errno: as rxe, EOPNOTSUPP for `comp_mask` bits other than PD, CREATE_FLAGS and
/// SEND_OPS_FLAGS, for creation flags and for `send_ops_flags` the QP type lacks (TSO, and
/// RDMA READ and atomics on UC, everything but sends on UD); EINVAL without a PD of the
/// context. Everything else is `ibv_create_qp`'s.
///
/// # Safety
/// `context` is a context of this library; `attr` is valid for reads and writes, and its PD,
/// CQs and SRQ are objects of the context.
pub(crate) unsafe extern "C" fn create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard("ibv_create_qp_ex", std::ptr::null_mut(), || {
        // SAFETY: caller contract.
        let Some(init) = (unsafe { attr.as_ref() }) else {
            return null_with("ibv_create_qp_ex", libc::EINVAL);
        };
        if let Err(errno) = check_init_attr(init) {
            return null_with("ibv_create_qp_ex", errno);
        }
        // SAFETY: caller contract: NULL or a PD of this library.
        let pd_context = unsafe { init.pd.as_ref() }.map(|pd| pd.context);
        if init.comp_mask & ATTR_PD == 0 || pd_context != Some(context) {
            return null_with("ibv_create_qp_ex (PD)", libc::EINVAL);
        }
        // SAFETY: `ibv_qp_init_attr_ex` begins with the fields of `ibv_qp_init_attr` (as
        // rdma-core's own cast in `ibv_create_qp_ex` relies on); caller contract for the rest.
        let raw = match unsafe { qp::create(init.pd, attr.cast::<ibv_qp_init_attr>()) } {
            Ok(raw) => raw,
            Err(errno) => return null_with("ibv_create_qp_ex", errno),
        };
        let send_ops = if init.comp_mask & ATTR_SEND_OPS_FLAGS != 0 {
            init.send_ops_flags
        } else {
            0
        };
        // SAFETY: the QP just made; not shared yet.
        let vqp = unsafe { &mut *raw };
        set_send_ops(&mut vqp.ibv, send_ops);
        if send_ops & WITH_FLUSH != 0 {
            vqp.wr_flush = Some(wr_flush);
        }
        vqp.extended = true;
        raw.cast()
    })
}

/// rxe's checks of an `ibv_qp_init_attr_ex` (`check_qp_init_attr`).
fn check_init_attr(init: &ibv_qp_init_attr_ex) -> Result<(), c_int> {
    if init.comp_mask & !SUPPORTED_INIT_MASK != 0 {
        log::debug!("vrdma: ibv_create_qp_ex: comp_mask {:#x}", init.comp_mask);
        return Err(libc::EOPNOTSUPP);
    }
    if init.comp_mask & ATTR_CREATE_FLAGS != 0 && init.create_flags != 0 {
        log::debug!(
            "vrdma: ibv_create_qp_ex: create_flags {:#x}",
            init.create_flags
        );
        return Err(libc::EOPNOTSUPP);
    }
    if init.comp_mask & ATTR_SEND_OPS_FLAGS != 0 {
        let supported = match QpType::try_from(init.qp_type) {
            Ok(QpType::Rc) => RC_SEND_OPS,
            Ok(QpType::Uc) => UC_SEND_OPS,
            Ok(QpType::Ud) => UD_SEND_OPS,
            Err(_) => 0,
        };
        if init.send_ops_flags & !u64::from(supported) != 0 || supported == 0 {
            log::debug!(
                "vrdma: ibv_create_qp_ex: send_ops_flags {:#x} on QP type {}",
                init.send_ops_flags,
                init.qp_type
            );
            return Err(libc::EOPNOTSUPP);
        }
    }
    Ok(())
}

/// Sets the operations of an extended QP: the opcodes `send_ops` asks for (the others stay
/// NULL, as in rdma-core), the setters and the batch operations.
fn set_send_ops(ex: &mut ibv_qp_ex, send_ops: u64) {
    let wanted = |flag: u32| send_ops & u64::from(flag) != 0;
    if wanted(WITH_CMP_SWP) {
        ex.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    }
    if wanted(WITH_ATOMIC_WRITE) {
        ex.wr_atomic_write = Some(wr_atomic_write);
    }
    if wanted(WITH_FETCH_ADD) {
        ex.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    }
    if wanted(WITH_BIND_MW) {
        ex.wr_bind_mw = Some(wr_bind_mw);
    }
    if wanted(WITH_LOCAL_INV) {
        ex.wr_local_inv = Some(wr_local_inv);
    }
    if wanted(WITH_READ) {
        ex.wr_rdma_read = Some(wr_rdma_read);
    }
    if wanted(WITH_WRITE) {
        ex.wr_rdma_write = Some(wr_rdma_write);
    }
    if wanted(WITH_WRITE_IMM) {
        ex.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    }
    if wanted(WITH_SEND) {
        ex.wr_send = Some(wr_send);
    }
    if wanted(WITH_SEND_IMM) {
        ex.wr_send_imm = Some(wr_send_imm);
    }
    if wanted(WITH_SEND_INV) {
        ex.wr_send_inv = Some(wr_send_inv);
    }
    ex.wr_set_ud_addr = Some(wr_set_ud_addr);
    ex.wr_set_inline_data = Some(wr_set_inline_data);
    ex.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    ex.wr_set_sge = Some(wr_set_sge);
    ex.wr_set_sge_list = Some(wr_set_sge_list);
    ex.wr_start = Some(wr_start);
    ex.wr_complete = Some(wr_complete);
    ex.wr_abort = Some(wr_abort);
}

/// `ibv_qp_to_qp_ex`: the `ibv_qp_ex` of a QP made by `ibv_create_qp_ex`; NULL for one made
/// by `ibv_create_qp`, as rdma-core answers.
///
/// # Safety
/// `qp` is NULL or a QP of this library.
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    guard("ibv_qp_to_qp_ex", std::ptr::null_mut(), || {
        // SAFETY: caller contract.
        match unsafe { VrdmaQp::from_ptr(qp) } {
            // The `ibv_qp` is the first member of the `ibv_qp_ex`.
            Some(vqp) if vqp.extended => qp.cast(),
            _ => std::ptr::null_mut(),
        }
    })
}

/// The errno `ibv_wr_complete` reports for a refused request, as rxe's: `ENOSPC` when the
/// queue or the QP's payload limits are exceeded.
fn batch_errno(e: &SendBatchError) -> c_int {
    match e {
        SendBatchError::Refused { error, .. } => match error {
            PostError::QueueFull
            | PostError::TooManySges { .. }
            | PostError::InlineTooLong { .. } => libc::ENOSPC,
            PostError::Unsupported(_) => libc::EOPNOTSUPP,
            _ => libc::EINVAL,
        },
        SendBatchError::Doorbell { .. } => libc::EIO,
    }
}

/// Runs `f` on the open batch of the extended QP `qp`; nothing when there is none (a call
/// outside `ibv_wr_start` .. `ibv_wr_complete`, a misuse).
///
/// # Safety
/// `qp` is an extended QP of this library; the caller is the thread that opened the batch.
unsafe fn with_batch(qp: *mut ibv_qp_ex, f: impl FnOnce(&mut SendBatch<'static>, &ibv_qp_ex)) {
    // SAFETY: caller contract.
    let Some(vqp) = (unsafe { VrdmaQp::from_ptr(qp.cast()) }) else {
        return;
    };
    // SAFETY: only the thread that opened the batch touches it (see `qp::BatchSlot`).
    match unsafe { &mut *vqp.batch.open.get() } {
        Some(batch) => f(batch, &vqp.ibv),
        None => log::warn!("vrdma: ibv_wr_* call without ibv_wr_start"),
    }
}

/// Starts the next request of the open batch: `opcode` with `qp->wr_id`, `qp->wr_flags` and
/// the operands `fill` sets.
///
/// # Safety
/// As [`with_batch`].
unsafe fn add(qp: *mut ibv_qp_ex, opcode: WrOpcode, fill: impl FnOnce(&mut SendWr<'_>)) {
    // SAFETY: forwarded contract.
    unsafe {
        with_batch(qp, |batch, ex| {
            let Some(flags) = SendFlags::from_bits(ex.wr_flags) else {
                // IBV_SEND_IP_CSUM and unknown bits: rxe has no checksum offload.
                return batch.fail(PostError::Unsupported("send flag"));
            };
            let mut wr = SendWr {
                wr_id: ex.wr_id,
                opcode,
                flags,
                ..SendWr::default()
            };
            fill(&mut wr);
            batch.add(&wr);
        })
    }
}

/// `ibv_wr_start`: opens a batch; the QP's send lock is held until `ibv_wr_complete` or
/// `ibv_wr_abort`.
///
/// # Safety
/// `qp` is an extended QP of this library without an open batch.
unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    guard("ibv_wr_start", (), || {
        // SAFETY: caller contract.
        let Some(vqp) = (unsafe { VrdmaQp::from_ptr(qp.cast()) }) else {
            return;
        };
        let batch = vqp.qp.send_batch();
        // SAFETY: the batch borrows `vqp.qp`, which lives in the same allocation as the slot
        // that keeps the batch and outlives it (the slot is dropped first; `ibv_wr_complete`
        // and `ibv_wr_abort` take the batch out).
        let batch = unsafe { std::mem::transmute::<SendBatch<'_>, SendBatch<'static>>(batch) };
        // SAFETY: this caller holds the QP's send lock now (through `batch`): no other batch
        // touches the slot.
        unsafe { *vqp.batch.open.get() = Some(batch) };
    })
}

/// `ibv_wr_complete`: posts the batch and rings the doorbell once; 0, or the errno of the
/// first refused request (nothing of the batch is posted then). Releases the send lock.
///
/// # Safety
/// `qp` is an extended QP of this library with a batch opened by the caller.
unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    guard("ibv_wr_complete", libc::EIO, || {
        // SAFETY: caller contract.
        let Some(vqp) = (unsafe { VrdmaQp::from_ptr(qp.cast()) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the caller holds the batch (see `qp::BatchSlot`).
        let Some(batch) = (unsafe { &mut *vqp.batch.open.get() }).take() else {
            return libc::EINVAL;
        };
        if batch.error().is_none() && !crate::datapath::send_queue_open(&vqp.ibv.qp_base) {
            // As rxe: a refused request reports its own errno first, else the doorbell fails
            // with EINVAL below RTS. Nothing of the batch is published; dropping it releases
            // the send lock (as `ibv_wr_abort`).
            drop(batch);
            return libc::EINVAL;
        }
        match batch.complete() {
            Ok(_) => 0,
            Err(e) => {
                log::debug!("vrdma: ibv_wr_complete: {e}");
                batch_errno(&e)
            }
        }
    })
}

/// `ibv_wr_abort`: drops the batch (nothing of it is posted) and releases the send lock.
///
/// # Safety
/// As [`wr_complete`].
unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    guard("ibv_wr_abort", (), || {
        // SAFETY: caller contract.
        if let Some(vqp) = unsafe { VrdmaQp::from_ptr(qp.cast()) } {
            // SAFETY: the caller holds the batch (see `qp::BatchSlot`).
            drop(unsafe { &mut *vqp.batch.open.get() }.take());
        }
    })
}

/// `ibv_wr_send`.
///
/// # Safety
/// `qp` is an extended QP of this library with a batch opened by the caller (for every
/// operation below).
unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    // SAFETY: caller contract.
    guard("ibv_wr_send", (), || unsafe {
        add(qp, WrOpcode::Send, |_| {})
    })
}

/// `ibv_wr_send_imm`: `imm_data` in network byte order.
///
/// # Safety
/// As [`wr_send`].
unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm_data: u32) {
    // SAFETY: caller contract.
    guard("ibv_wr_send_imm", (), || unsafe {
        add(qp, WrOpcode::SendWithImm, |wr| wr.imm_data = imm_data)
    })
}

/// `ibv_wr_rdma_write`.
///
/// # Safety
/// As [`wr_send`].
unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: caller contract.
    guard("ibv_wr_rdma_write", (), || unsafe {
        add(qp, WrOpcode::RdmaWrite, |wr| {
            (wr.rkey, wr.remote_addr) = (rkey, remote_addr);
        })
    })
}

/// `ibv_wr_rdma_write_imm`: `imm_data` in network byte order.
///
/// # Safety
/// As [`wr_send`].
unsafe extern "C" fn wr_rdma_write_imm(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm_data: u32,
) {
    // SAFETY: caller contract.
    guard("ibv_wr_rdma_write_imm", (), || unsafe {
        add(qp, WrOpcode::RdmaWriteWithImm, |wr| {
            (wr.rkey, wr.remote_addr, wr.imm_data) = (rkey, remote_addr, imm_data);
        })
    })
}

/// `ibv_wr_rdma_read`.
///
/// # Safety
/// As [`wr_send`].
unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: caller contract.
    guard("ibv_wr_rdma_read", (), || unsafe {
        add(qp, WrOpcode::RdmaRead, |wr| {
            (wr.rkey, wr.remote_addr) = (rkey, remote_addr);
        })
    })
}

/// `ibv_wr_atomic_cmp_swp`: the 8-byte SGE set next receives the original value.
///
/// # Safety
/// As [`wr_send`].
unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    // SAFETY: caller contract.
    guard("ibv_wr_atomic_cmp_swp", (), || unsafe {
        add(qp, WrOpcode::AtomicCmpAndSwp, |wr| {
            (wr.rkey, wr.remote_addr) = (rkey, remote_addr);
            (wr.compare_add, wr.swap) = (compare, swap);
        })
    })
}

/// `ibv_wr_atomic_fetch_add`: the 8-byte SGE set next receives the original value.
///
/// # Safety
/// As [`wr_send`].
unsafe extern "C" fn wr_atomic_fetch_add(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add_: u64,
) {
    // SAFETY: caller contract.
    guard("ibv_wr_atomic_fetch_add", (), || unsafe {
        add(qp, WrOpcode::AtomicFetchAndAdd, |wr| {
            (wr.rkey, wr.remote_addr, wr.compare_add) = (rkey, remote_addr, add_);
        })
    })
}

/// `ibv_wr_atomic_write`: the 8 bytes at `atomic_wr` are copied into the request now and land
/// at `remote_addr` as one write (RC only).
///
/// # Safety
/// As [`wr_send`]; `atomic_wr` points to 8 readable bytes.
unsafe extern "C" fn wr_atomic_write(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    atomic_wr: *const c_void,
) {
    // SAFETY: caller contract.
    guard("ibv_wr_atomic_write", (), || unsafe {
        if atomic_wr.is_null() {
            return with_batch(qp, |batch, _| {
                batch.fail(PostError::Unsupported("NULL atomic write operand"))
            });
        }
        // SAFETY: caller contract: 8 readable bytes, of any alignment.
        let value = u64::from_ne_bytes(atomic_wr.cast::<[u8; 8]>().read_unaligned());
        add(qp, WrOpcode::AtomicWrite, |wr| {
            (wr.rkey, wr.remote_addr, wr.compare_add) = (rkey, remote_addr, value);
        })
    })
}

/// `ibv_wr_flush` (rdma-core 45+, through [`VrdmaQp::wr_flush`]): makes `len` bytes at
/// `remote_addr` (or, with `IBV_FLUSH_MR`, the whole MR) globally visible or persistent at
/// the responder (RC only).
///
/// # Safety
/// As [`wr_send`].
unsafe extern "C" fn wr_flush(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    len: usize,
    flush_type: u8,
    level: u8,
) {
    // SAFETY: caller contract.
    guard("ibv_wr_flush", (), || unsafe {
        add(qp, WrOpcode::Flush, |wr| {
            (wr.rkey, wr.remote_addr) = (rkey, remote_addr);
            wr.flush = FlushRange {
                length: len as u64,
                flush_type,
                level,
            };
        })
    })
}

/// Starts a memory-window request as [`add`] does if the QP's context negotiated memory
/// windows (`VRDMA_F_MW`); otherwise fails the batch with `EOPNOTSUPP` (`what` is the verb).
///
/// # Safety
/// As [`with_batch`].
unsafe fn add_window_request(
    qp: *mut ibv_qp_ex,
    what: &'static str,
    opcode: WrOpcode,
    fill: impl FnOnce(&mut SendWr<'_>),
) {
    // SAFETY: caller contract: a live QP of this library, whose context is live.
    let windows = unsafe { VrdmaQp::from_ptr(qp.cast()) }.is_some_and(|vqp| {
        // SAFETY: as above.
        let context = unsafe { VrdmaContext::of(vqp.ibv.qp_base.context) };
        context.ctx.features() & VRDMA_F_MW != 0
    });
    // SAFETY: forwarded contract.
    unsafe {
        if windows {
            add(qp, opcode, fill);
        } else {
            with_batch(qp, |batch, _| batch.fail(PostError::Unsupported(what)));
        }
    }
}

/// `ibv_wr_bind_mw`: binds the type-2 window `mw` (named by its current `mw->rkey`) onto
/// `info`'s range of `info->mr` under the new key `rkey` (the application's choice, as
/// `ibv_inc_rkey(mw->rkey)`). As rxe, `mw->rkey` is left alone: the window answers to `rkey`
/// once the bind has executed, and the application records the key it chose. A NULL MR is
/// taken only with an empty range; access beyond remote READ/WRITE/ATOMIC and zero-based
/// refuses the request (EINVAL at `ibv_wr_complete`).
///
/// # Safety
/// As [`wr_send`]; `mw` is a window of this library, `info` valid and its MR NULL or live.
unsafe extern "C" fn wr_bind_mw(
    qp: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    // SAFETY: caller contract.
    guard("ibv_wr_bind_mw", (), || unsafe {
        let bind = match (mw.cast_const().as_ref(), info.as_ref()) {
            // SAFETY: caller contract: the MR is NULL or live.
            (Some(mw), Some(info)) => windows::bind_of(info, mw.rkey, rkey).ok(),
            _ => None,
        };
        // Without a bind the request is refused when it completes.
        add_window_request(qp, "ibv_wr_bind_mw", WrOpcode::BindMw, |wr| wr.bind = bind)
    })
}

/// `ibv_wr_local_inv`: invalidates the type-2 window (or fast-registered MR) whose key is
/// `invalidate_rkey`, on this QP's side. Takes no payload.
///
/// # Safety
/// As [`wr_send`].
unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    // SAFETY: caller contract.
    guard("ibv_wr_local_inv", (), || unsafe {
        add_window_request(qp, "ibv_wr_local_inv", WrOpcode::LocalInv, |wr| {
            wr.invalidate_rkey = invalidate_rkey;
        })
    })
}

/// `ibv_wr_send_inv`: a SEND that also invalidates `invalidate_rkey` at the responder (whose
/// completion carries `IBV_WC_WITH_INV` and the key).
///
/// # Safety
/// As [`wr_send`].
unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    // SAFETY: caller contract.
    guard("ibv_wr_send_inv", (), || unsafe {
        add_window_request(qp, "ibv_wr_send_inv", WrOpcode::SendWithInv, |wr| {
            wr.invalidate_rkey = invalidate_rkey;
        })
    })
}

/// `ibv_wr_set_sge`: one SGE as the current request's payload; a zero length leaves the
/// payload empty, as rxe does.
///
/// # Safety
/// As [`wr_send`].
unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    let sge = [Sge { addr, length, lkey }];
    let sges: &[Sge] = if length == 0 { &[] } else { &sge };
    // SAFETY: caller contract.
    guard("ibv_wr_set_sge", (), || unsafe {
        with_batch(qp, |batch, _| batch.set_sges(sges))
    })
}

/// `ibv_wr_set_sge_list`: the SGEs are copied into the request now.
///
/// # Safety
/// As [`wr_send`]; `sg_list` is valid for `num_sge` entries.
unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, num_sge: size_t, sg_list: *const ibv_sge) {
    // SAFETY: caller contract.
    guard("ibv_wr_set_sge_list", (), || unsafe {
        with_batch(qp, |batch, _| match num_sge {
            0 => batch.set_sges(&[]),
            _ if sg_list.is_null() => batch.fail(PostError::Unsupported("NULL SGE list")),
            // SAFETY: caller contract; `ibv_sge` and `Sge` have one layout (asserted in
            // `crate::datapath`).
            n => batch.set_sges(std::slice::from_raw_parts(
                sg_list.cast::<Sge>(),
                n as usize,
            )),
        })
    })
}

/// `ibv_wr_set_inline_data`: the bytes are copied into the request now.
///
/// # Safety
/// As [`wr_send`]; `addr` is readable for `length` bytes.
unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: size_t) {
    let chunk = [(addr.cast_const().cast::<u8>(), length as usize)];
    // SAFETY: caller contract.
    guard("ibv_wr_set_inline_data", (), || unsafe {
        with_batch(qp, |batch, _| batch.set_inline(chunk.iter().copied()))
    })
}

/// `ibv_wr_set_inline_data_list`: the bytes of every buffer, one after the other, are copied
/// into the request now.
///
/// # Safety
/// As [`wr_send`]; `buf_list` is valid for `num_buf` entries, each readable.
unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    num_buf: size_t,
    buf_list: *const ibv_data_buf,
) {
    // SAFETY: caller contract.
    guard("ibv_wr_set_inline_data_list", (), || unsafe {
        with_batch(qp, |batch, _| {
            let bufs: &[ibv_data_buf] = match num_buf {
                0 => &[],
                _ if buf_list.is_null() => {
                    return batch.fail(PostError::Unsupported("NULL inline buffer list"))
                }
                // SAFETY: caller contract.
                n => std::slice::from_raw_parts(buf_list, n as usize),
            };
            let chunks = bufs
                .iter()
                .map(|b| (b.addr.cast_const().cast::<u8>(), b.length as usize));
            // SAFETY: caller contract: every buffer is readable.
            batch.set_inline(chunks)
        })
    })
}

/// `ibv_wr_set_ud_addr`: the destination of the current request (UD QPs): the address handle
/// of this library `ah`, as `ibv_post_send` takes it from `wr.ud`.
///
/// # Safety
/// As [`wr_send`]; `ah` is an address handle of this library that outlives the request.
unsafe extern "C" fn wr_set_ud_addr(
    qp: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    // SAFETY: caller contract.
    guard("ibv_wr_set_ud_addr", (), || unsafe {
        with_batch(qp, |batch, _| {
            // SAFETY: caller contract: NULL or an AH of this library.
            match ah.cast::<VrdmaAh>().as_ref() {
                Some(vah) => batch.set_ud_dest(&vah.ah.dest(remote_qpn, remote_qkey)),
                None => batch.fail(PostError::MissingUdDest),
            }
        })
    })
}

//! Queue buffers the device mapped into the shared-memory region.

use parking_lot::Mutex;
use vrdma_spec::wire::RingDesc;

use super::context::ContextInner;
use super::error::{ProtocolError, Result, VerbsError};
use crate::provider::rxe_v1::RxeQueue;

/// Checks `desc` (spec §6) and wraps the buffer it describes: in place if the region is mapped
/// into this process, through the region's accessor otherwise.
///
/// # Safety
///
/// `desc` must come from the create (or RESIZE_CQ) response of an object whose DESTROY is sent
/// only after the returned queue (and everything built on it) is dropped, or that is resized
/// only while the returned queue is no longer used (and then dropped unused); each ring must be
/// wrapped once.
pub(crate) unsafe fn map_ring(ctx: &ContextInner, desc: &RingDesc) -> Result<RxeQueue> {
    let config = ctx.config();
    let page_size = 1u64 << config.shm_page_shift.get();
    let geometry = desc
        .check_rxe_v1(config.shm_size.get(), page_size)
        .map_err(ProtocolError::Ring)?;
    let offset = desc.shm_offset.get();
    let len = desc.map_len.get();
    let outside = || ProtocolError::OutsideRegion { offset, len };
    let offset = usize::try_from(offset).map_err(|_| outside())?;
    let len_bytes = len as usize;
    let region = ctx.shared_memory();
    let queue = if let Some(access) = region.access() {
        if !region.contains(offset, len_bytes) {
            return Err(outside().into());
        }
        RxeQueue::accessed(access.clone(), offset, len_bytes, geometry)
    } else {
        let base = region.range(offset, len_bytes).ok_or_else(outside)?;
        // SAFETY: the device mapped `len` bytes read/write at `offset` of the region before it
        // answered the create command (spec §5.1) and unmaps them only on DESTROY, which the
        // caller sends after dropping the queue, or on a RESIZE_CQ, after which the caller
        // drops the queue unused; the region stays mapped while the transport,
        // which the context holds, lives. The caller wraps the ring once; the host kernel is
        // the only other party and uses the index words atomically.
        unsafe { RxeQueue::new(base, len_bytes, geometry) }
    };
    queue.map_err(|e| ProtocolError::Queue(e).into())
}

/// A resize that replaces a queue's ring (RESIZE_CQ, RESIZE_SRQ), under the queue's lock:
/// refuses a queue that lost its ring in an earlier resize (with `lost`), runs `resize` (the
/// command), then drops the old ring, which the device unmapped once it answered, whatever
/// follows, and puts in what `wrap` makes of the answer. Returns the answer.
pub(crate) fn replace_ring<Q, A>(
    queue: &Mutex<Option<Q>>,
    lost: &'static str,
    resize: impl FnOnce() -> Result<A>,
    wrap: impl FnOnce(&A) -> Result<Q>,
) -> Result<A> {
    let mut queue = queue.lock();
    if queue.is_none() {
        return Err(VerbsError::InvalidArgument(lost));
    }
    let answer = resize()?;
    *queue = None;
    *queue = Some(wrap(&answer)?);
    Ok(answer)
}

//! Event channels (`struct rdma_event_channel`): the fd applications poll and block on, and
//! the events queued for the ids on the channel.
//!
//! As a completion channel of this library, the fd is an eventfd in semaphore mode whose
//! counter equals the queue's length (a push adds one, `rdma_get_cm_event` takes one before
//! it pops), so `poll()` reports it readable exactly while events wait, and a read blocks
//! unless the application set `O_NONBLOCK` on it, as on rdma-core's channel file. An event of
//! an id destroyed before it was read stays queued as a tombstone, so the count stays right.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use parking_lot::Mutex;
use vrdma::spec::cm::CmEventResp;

use crate::fd::{eventfd, read_one, write_one};
use crate::sys::rdma_event_channel;

/// An event channel: `rdma_event_channel` first, so the pointer handed out is the channel's.
#[repr(C)]
pub(crate) struct CmChannel {
    pub(crate) c: rdma_event_channel,
    fd: OwnedFd,
    /// Events in arrival order; `None`: the event of an id destroyed since.
    queue: Mutex<VecDeque<Option<Box<CmEventResp>>>>,
}

impl CmChannel {
    /// A new channel; `Arc::into_raw` of it is what the application gets.
    pub(crate) fn new() -> io::Result<Arc<CmChannel>> {
        let fd = eventfd(libc::EFD_SEMAPHORE)?;
        Ok(Arc::new(CmChannel {
            c: rdma_event_channel { fd: fd.as_raw_fd() },
            fd,
            queue: Mutex::new(VecDeque::new()),
        }))
    }

    /// Queues an event.
    pub(crate) fn push(&self, event: Box<CmEventResp>) {
        self.queue.lock().push_back(Some(event));
        write_one(&self.fd);
    }

    /// Turns the queued events of id `handle` (or whose listener it is) into tombstones.
    pub(crate) fn purge(&self, handle: u32) {
        for slot in self.queue.lock().iter_mut() {
            if slot
                .as_ref()
                .is_some_and(|e| e.id.get() == handle || e.listen_id.get() == handle)
            {
                *slot = None;
            }
        }
    }

    /// Takes the queued events of id `handle` out (leaving tombstones), in order.
    pub(crate) fn take(&self, handle: u32) -> Vec<CmEventResp> {
        let mut taken = Vec::new();
        for slot in self.queue.lock().iter_mut() {
            if slot.as_ref().is_some_and(|e| e.id.get() == handle) {
                taken.extend(slot.take().map(|e| *e));
            }
        }
        taken
    }

    /// The next queued event: blocks while none is queued unless the fd is non-blocking
    /// (then `EAGAIN`). Tombstones are skipped.
    pub(crate) fn next(&self) -> io::Result<Box<CmEventResp>> {
        loop {
            read_one(&self.fd)?;
            if let Some(Some(event)) = self.queue.lock().pop_front() {
                return Ok(event);
            }
        }
    }

    /// The channel of a pointer handed to the application.
    ///
    /// # Safety
    /// `ptr` is NULL or was made by `Arc::into_raw` of a `CmChannel` that is still alive.
    pub(crate) unsafe fn from_ptr(ptr: *mut rdma_event_channel) -> Option<Arc<CmChannel>> {
        if ptr.is_null() {
            return None;
        }
        let raw = ptr.cast::<CmChannel>().cast_const();
        // SAFETY: caller contract: a live Arc allocation (`c` is its first field); one more
        // reference is taken for the returned Arc.
        unsafe {
            Arc::increment_strong_count(raw);
            Some(Arc::from_raw(raw))
        }
    }

    /// The pointer to hand to the application (one reference, given back by
    /// [`CmChannel::release`]).
    pub(crate) fn into_ptr(channel: Arc<CmChannel>) -> *mut rdma_event_channel {
        Arc::into_raw(channel).cast_mut().cast()
    }

    /// Gives back the application's reference.
    ///
    /// # Safety
    /// `ptr` was returned by [`CmChannel::into_ptr`] and is not used afterwards.
    pub(crate) unsafe fn release(ptr: *mut rdma_event_channel) {
        // SAFETY: caller contract.
        drop(unsafe { Arc::from_raw(ptr.cast::<CmChannel>().cast_const()) });
    }
}

/// `rdma_create_event_channel`: a new channel, or NULL with errno.
pub unsafe extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    crate::ffi::guard(
        "rdma_create_event_channel",
        std::ptr::null_mut(),
        || match CmChannel::new() {
            Ok(channel) => CmChannel::into_ptr(channel),
            Err(e) => crate::ffi::null_with(
                "rdma_create_event_channel",
                e.raw_os_error().unwrap_or(libc::EMFILE),
            ),
        },
    )
}

/// `rdma_destroy_event_channel`. Its ids must be gone (as in rdma-core, not checked: the
/// channel stays allocated while an id still refers to it).
///
/// # Safety
/// `channel` was returned by [`rdma_create_event_channel`] and is not used afterwards.
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    crate::ffi::guard("rdma_destroy_event_channel", (), || {
        if !channel.is_null() {
            // SAFETY: caller contract.
            unsafe { CmChannel::release(channel) };
        }
    })
}

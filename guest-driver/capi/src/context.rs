//! The context behind an `ibv_context` of this library: the vrdma context, its transport and
//! the routing of its completion events. Made by `ibv_open_device` ([`crate::device`]), used by
//! every object and data-path call of the context.

use std::sync::Arc;

use vrdma::Context;

use crate::events::{CompletionRoutes, EventPump};
use crate::sys::ibv_context;
use crate::transport::AppTransport;

/// A context of this library: `ibv_context` first, so the pointers are interchangeable.
#[repr(C)]
pub(crate) struct VrdmaContext {
    pub(crate) ibv: ibv_context,
    pub(crate) ctx: Context,
    pub(crate) transport: Arc<AppTransport>,
    pub(crate) routes: Arc<CompletionRoutes>,
    // Taken and dropped first by `ibv_close_device`: stops the thread that holds a clone of
    // `ctx`.
    pub(crate) pump: Option<EventPump>,
    /// The process that opened the context: in a `fork()` child the device, the event thread
    /// and the objects are the parent's.
    pub(crate) owner: libc::pid_t,
}

impl VrdmaContext {
    /// The context behind `ptr`.
    ///
    /// # Safety
    /// `ptr` is NULL or was returned by [`ibv_open_device`](crate::device::ibv_open_device) and
    /// not closed.
    pub(crate) unsafe fn from_ptr<'a>(ptr: *mut ibv_context) -> Option<&'a VrdmaContext> {
        // SAFETY: caller contract; `ibv` is the first field of a repr(C) struct.
        unsafe { ptr.cast::<VrdmaContext>().as_ref() }
    }

    /// True in a `fork()` child of the process that opened the context.
    pub(crate) fn in_forked_child(&self) -> bool {
        // SAFETY: getpid has no preconditions.
        let current = unsafe { libc::getpid() };
        current != self.owner
    }
}

//! The context behind an `ibv_context` of this library: an extended context (rdma-core's
//! `struct verbs_context`, whose last member is the `ibv_context` handed to applications), the
//! vrdma context, its transport, the routing of its completion events and its asynchronous
//! event queue. Made by `ibv_open_device` ([`crate::device`]), used by every object and
//! data-path call of the context.

use std::mem::offset_of;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use vrdma::Context;

use crate::async_events::AsyncEvents;
use crate::cm_events::router::CmRouter;
use crate::events::{CompletionRoutes, EventPump, EventSinks};
use crate::sys::{ibv_context, verbs_context};
use crate::transport::AppTransport;

/// `ibv_context.abi_compat` of an extended context (`__VERBS_ABI_IS_EXTENDED`): the static
/// inline helpers of `verbs.h` then find the `verbs_context` in front of the `ibv_context`.
const ABI_IS_EXTENDED: usize = usize::MAX;

/// A context of this library: `verbs_context` first, so that the `ibv_context` at its end has
/// the `verbs_context` in front of it, as `verbs_get_ctx` expects.
#[repr(C)]
pub(crate) struct VrdmaContext {
    pub(crate) verbs: verbs_context,
    pub(crate) ctx: Context,
    pub(crate) transport: Arc<AppTransport>,
    pub(crate) routes: Arc<CompletionRoutes>,
    /// Behind `ibv.async_fd`.
    pub(crate) async_events: Arc<AsyncEvents>,
    /// Where its connection-manager events go.
    pub(crate) cm: Arc<CmRouter>,
    // Taken and dropped first by `ibv_close_device`: stops the thread that holds a clone of
    // `ctx`.
    pub(crate) pump: Option<EventPump>,
    /// The process that opened the context: in a `fork()` child the device, the event thread
    /// and the objects are the parent's.
    pub(crate) owner: libc::pid_t,
    /// Behind `ibv.cmd_fd` (see [`inert_command_fd`]).
    command_fd: Option<OwnedFd>,
}

/// The context's `cmd_fd`. A vrdma context has no uverbs command file: its commands go over
/// the device's control queue. Programs still use the number: rdma-core's tests `dup()` it to
/// try `ibv_import_device` (which this library refuses with EOPNOTSUPP, as rxe does), and a -1
/// makes that `dup()` fail first with EBADF. `/dev/null` opened read-only is a descriptor on
/// which a uverbs write fails (EBADF) and an ioctl fails (ENOTTY), so nothing can mistake it
/// for a device. `None` where even that cannot be opened.
fn inert_command_fd() -> Option<OwnedFd> {
    std::fs::File::open("/dev/null").ok().map(OwnedFd::from)
}

impl VrdmaContext {
    /// Wraps `ibv` (whose `ops`, device and descriptors are set), the extended operations in
    /// `verbs` (NULL ones make the inline helpers of `verbs.h` report EOPNOTSUPP or fall back
    /// to the classic verb) and the vrdma context into an extended context; the
    /// `ibv_context` to hand to the application. [`Self::from_raw`] takes it back.
    pub(crate) fn into_raw(
        mut ibv: ibv_context,
        mut verbs: verbs_context,
        ctx: Context,
        transport: Arc<AppTransport>,
        sinks: EventSinks,
        pump: Option<EventPump>,
    ) -> *mut ibv_context {
        let EventSinks {
            routes,
            async_events,
            cm,
        } = sinks;
        let command_fd = inert_command_fd();
        ibv.cmd_fd = command_fd.as_ref().map_or(-1, AsRawFd::as_raw_fd);
        ibv.abi_compat = ABI_IS_EXTENDED as *mut _;
        verbs.sz = std::mem::size_of::<verbs_context>() as crate::sys::size_t;
        verbs.context = ibv;
        let raw = Box::into_raw(Box::new(VrdmaContext {
            verbs,
            ctx,
            transport,
            routes,
            async_events,
            cm,
            pump,
            // SAFETY: getpid has no preconditions.
            owner: unsafe { libc::getpid() },
            command_fd,
        }));
        // SAFETY: `raw` is the live allocation just made.
        unsafe { &raw mut (*raw).verbs.context }
    }

    /// Whether this process is a `fork()` child of the one that opened the context.
    pub(crate) fn in_forked_child(&self) -> bool {
        // SAFETY: getpid has no preconditions.
        let current = unsafe { libc::getpid() };
        current != self.owner
    }

    /// The context behind `ptr`.
    ///
    /// # Safety
    /// `ptr` is NULL or was returned by [`Self::into_raw`] and not closed.
    pub(crate) unsafe fn from_ptr<'a>(ptr: *mut ibv_context) -> Option<&'a VrdmaContext> {
        // SAFETY: caller contract.
        unsafe { Self::container(ptr).as_ref() }
    }

    /// The context behind `ptr`, which is not NULL.
    ///
    /// # Safety
    /// `ptr` was returned by [`Self::into_raw`] and is not closed.
    pub(crate) unsafe fn of<'a>(ptr: *mut ibv_context) -> &'a VrdmaContext {
        // SAFETY: caller contract: a live context, so the container is not NULL.
        unsafe { &*Self::container(ptr) }
    }

    /// The `VrdmaContext` allocation around `ptr`, or NULL.
    ///
    /// # Safety
    /// As [`Self::from_ptr`].
    unsafe fn container(ptr: *mut ibv_context) -> *mut VrdmaContext {
        if ptr.is_null() {
            return std::ptr::null_mut();
        }
        let front = offset_of!(VrdmaContext, verbs) + offset_of!(verbs_context, context);
        // SAFETY: caller contract: `ptr` is the `verbs.context` field of a live VrdmaContext,
        // `front` bytes after the start of its allocation.
        unsafe { ptr.byte_sub(front).cast::<VrdmaContext>() }
    }

    /// Takes back the context [`Self::into_raw`] handed out.
    ///
    /// # Safety
    /// `ptr` was returned by [`Self::into_raw`]; it is not used afterwards.
    pub(crate) unsafe fn from_raw(ptr: *mut ibv_context) -> Option<Box<VrdmaContext>> {
        // SAFETY: caller contract: the allocation made by Box::into_raw in `into_raw`.
        let raw = unsafe { Self::container(ptr) };
        // SAFETY: as above; NULL stays None.
        (!raw.is_null()).then(|| unsafe { Box::from_raw(raw) })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use vrdma::Context;
    use vrdma_test_support::fake_transport::FakeTransport;

    use crate::device::{context_over, device, ibv_close_device};
    use crate::transport::AppTransport;
    use crate::unsupported::ibv_import_device;

    /// rdma-core's shared-PD test `dup()`s `cmd_fd` and imports it: the descriptor is there,
    /// no uverbs command reaches anything through it, and the import is refused as rxe
    /// refuses it (EOPNOTSUPP), so the test skips as it does natively.
    #[test]
    fn the_command_fd_is_inert_and_cannot_be_imported() {
        let fake = FakeTransport::new();
        let transport = Arc::new(AppTransport::over(fake));
        let ctx = Context::open(transport.clone()).unwrap();
        let context = context_over(device(), ctx, transport).unwrap();
        // SAFETY: a live context of this library.
        let fd = unsafe { (*context).cmd_fd };
        assert!(fd >= 0);
        let header = [0u8; 8];
        // SAFETY: writes 8 readable bytes to a descriptor the context owns.
        let written = unsafe { libc::write(fd, header.as_ptr().cast(), header.len()) };
        assert_eq!(written, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EBADF)
        );
        // SAFETY: dup of a live descriptor.
        let copy = unsafe { libc::dup(fd) };
        assert!(copy >= 0);
        // SAFETY: the entry point takes any number.
        let imported = unsafe { ibv_import_device(copy) };
        assert!(imported.is_null());
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EOPNOTSUPP)
        );
        // SAFETY: the copy is ours; the context is closed once.
        unsafe {
            libc::close(copy);
            assert_eq!(ibv_close_device(context), 0);
        }
    }
}

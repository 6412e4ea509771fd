//! The host kick (spec §5.3, `VRDMA_F_HOST_KICK`): where this process holds the host verbs
//! context's file (the process transport receives it with every SHMEM_MAP of a queue buffer),
//! a send starts the host's send processing with the system call a native rxe process makes,
//! instead of waking a device thread through the doorbell. The call names only the QP's own
//! handle in its own context ([`vrdma_spec::rxe_v1::kick`]).

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use vrdma_spec::rxe_v1::kick::{KickCall, RDMA_VERBS_IOCTL};

/// What kicks one QP's send queue on the host.
pub struct HostKick {
    file: Arc<OwnedFd>,
    qp_handle: u32,
}

impl HostKick {
    /// The kick of the QP `qp_handle` names in the host verbs context open as `file`.
    pub(crate) fn new(file: Arc<OwnedFd>, qp_handle: u32) -> HostKick {
        HostKick { file, qp_handle }
    }

    /// Starts the host's processing of what the send queue holds. Fails as rxe's POST_SEND
    /// does (for example `EINVAL` in a state that does not send); allocates nothing.
    pub fn kick(&self) -> io::Result<()> {
        let mut call = KickCall::new(self.qp_handle);
        call.aim();
        // SAFETY: `call` was aimed where it lies: its attributes name its own request and
        // response fields, of the lengths they state, alive and not moved during the call; the
        // kernel writes only the response and the attributes' flags, inside `call`. The file
        // is open while `self` holds it.
        let ret = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                RDMA_VERBS_IOCTL as _,
                std::ptr::from_mut(&mut call).cast::<libc::c_void>(),
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl fmt::Debug for HostKick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostKick")
            .field("fd", &self.file.as_raw_fd())
            .field("qp_handle", &self.qp_handle)
            .finish()
    }
}

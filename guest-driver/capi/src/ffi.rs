//! The FFI boundary: panics never unwind into C, errors become errno values.

use std::panic::{catch_unwind, AssertUnwindSafe};

use log::error;
use vrdma::dma::DmaError;
use vrdma::spec::status::Status;
use vrdma::transport::TransportError;
use vrdma::VerbsError;

/// Runs `body`; a panic is logged and turned into `on_panic` with errno `EIO`.
pub(crate) fn guard<T>(name: &str, on_panic: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(_) => {
            error!("vrdma: {name} panicked; returning an error instead");
            set_errno(libc::EIO);
            on_panic
        }
    }
}

/// The calling thread's `errno`.
pub(crate) fn errno() -> i32 {
    // SAFETY: `__errno_location` returns the calling thread's errno, always valid to read.
    unsafe { *libc::__errno_location() }
}

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(value: i32) {
    // SAFETY: `__errno_location` returns the calling thread's errno, always valid to write.
    unsafe { *libc::__errno_location() = value };
}

/// The errno of a failed verbs call, as rdma-core would report it.
pub(crate) fn errno_of(e: &VerbsError) -> i32 {
    match e {
        VerbsError::Status { source, .. } => match source.status() {
            Status::Ok => libc::EIO,
            Status::Unsupported => libc::EOPNOTSUPP,
            Status::Invalid => libc::EINVAL,
            Status::BadHandle => libc::EINVAL,
            Status::Quota => libc::ENOMEM,
            Status::NoMemory => libc::ENOMEM,
            Status::BadAddress => libc::EFAULT,
            Status::BadState => libc::EINVAL,
            Status::Busy => libc::EBUSY,
            Status::DeviceError => i32::try_from(source.detail())
                .ok()
                .filter(|&errno| errno > 0)
                .unwrap_or(libc::EIO),
        },
        // A failed system call of the allocator (mapping hugepages, mlock, the pagemap) is an
        // I/O error like the transport's own, not a lack of memory.
        VerbsError::Transport(TransportError::Dma(DmaError::Io { .. })) => libc::EIO,
        VerbsError::Transport(TransportError::Dma(_)) => libc::ENOMEM,
        VerbsError::Transport(TransportError::Disconnected) => libc::ENODEV,
        VerbsError::Transport(_) => libc::EIO,
        VerbsError::Protocol(_) => libc::EPROTO,
        VerbsError::InvalidArgument(_) => libc::EINVAL,
        VerbsError::Unsupported(_) => libc::EOPNOTSUPP,
        VerbsError::DeviceLost { .. } => libc::ENODEV,
    }
}

/// Reports a failed call the rdma-core way for functions returning a pointer: logs, sets errno,
/// returns NULL.
pub(crate) fn null_with<T>(what: &str, errno: i32) -> *mut T {
    log::debug!(
        "vrdma: {what} failed: {}",
        std::io::Error::from_raw_os_error(errno)
    );
    set_errno(errno);
    std::ptr::null_mut()
}

/// Logs a verbs error and returns its errno.
pub(crate) fn report(what: &str, e: &VerbsError) -> i32 {
    log::warn!("vrdma: {what}: {e}");
    errno_of(e)
}

/// For functions documented as "0 on success, -1 and errno on failure".
pub(crate) fn minus_one(errno: i32) -> i32 {
    set_errno(errno);
    -1
}

#[cfg(test)]
mod tests {
    use super::*;
    use vrdma::spec::control::Opcode;
    use vrdma::spec::status::StatusError;

    #[test]
    fn device_statuses_map_to_errno() {
        let status = |s| VerbsError::Status {
            opcode: Opcode::RegMr,
            source: StatusError::new(s),
        };
        assert_eq!(errno_of(&status(Status::Busy)), libc::EBUSY);
        assert_eq!(errno_of(&status(Status::Unsupported)), libc::EOPNOTSUPP);
        assert_eq!(errno_of(&status(Status::BadAddress)), libc::EFAULT);
        let host = VerbsError::Status {
            opcode: Opcode::RegMr,
            source: StatusError::device_error(libc::EAGAIN as u32),
        };
        assert_eq!(errno_of(&host), libc::EAGAIN);
        assert_eq!(errno_of(&VerbsError::InvalidArgument("x")), libc::EINVAL);
    }

    #[test]
    fn a_panic_becomes_the_error_value() {
        let value = guard("test", -1, || -> i32 { panic!("boom") });
        assert_eq!(value, -1);
        // SAFETY: reading the calling thread's errno.
        assert_eq!(unsafe { *libc::__errno_location() }, libc::EIO);
        assert_eq!(guard("test", -1, || 7), 7);
    }
}

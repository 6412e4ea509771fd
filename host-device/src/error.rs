//! Errors of the host-device layer.

use std::io;
use std::path::PathBuf;

use super::uverbs::FrameError;

/// Everything that can go wrong talking to the host RDMA device.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The kernel has no RDMA core at all (no `CONFIG_INFINIBAND`, or `ib_core` not loaded).
    #[error("no RDMA subsystem in this kernel (no /sys/class/infiniband)")]
    NoRdmaSubsystem,
    /// No RDMA device of that name.
    #[error("no RDMA device named {name:?}")]
    DeviceNotFound {
        /// The requested name.
        name: String,
    },
    /// No device has a port in state ACTIVE.
    #[error("no RDMA device with an ACTIVE port")]
    NoActiveDevice,
    /// The device has no uverbs character device (no user-space access).
    #[error("RDMA device {name:?} has no uverbs character device")]
    NoVerbsDevice {
        /// Device name.
        name: String,
    },
    /// The device is driven by a driver this layer does not implement.
    #[error("RDMA device {name:?} uses driver {driver:?}; only rxe is implemented")]
    UnsupportedDriver {
        /// Device name.
        name: String,
        /// Its driver.
        driver: String,
    },
    /// Reading a sysfs attribute failed.
    #[error("cannot read {path}: {source}")]
    Sysfs {
        /// The attribute.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A sysfs attribute holds something unexpected.
    #[error("unexpected content in {path}: {content:?}")]
    SysfsFormat {
        /// The attribute.
        path: PathBuf,
        /// What it held.
        content: String,
    },
    /// Opening the uverbs character device failed.
    #[error("cannot open {path}: {source}")]
    Open {
        /// The character device.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A uverbs command failed in the kernel.
    #[error("uverbs {command} failed: {}", io::Error::from_raw_os_error(*errno))]
    Command {
        /// Command name (`CREATE_QP`, …).
        command: &'static str,
        /// The errno the kernel returned.
        errno: i32,
    },
    /// The kernel accepted fewer bytes of a command than were written.
    #[error("uverbs {command}: kernel took {written} of {len} bytes")]
    ShortWrite {
        /// Command name.
        command: &'static str,
        /// Bytes accepted.
        written: usize,
        /// Bytes offered.
        len: usize,
    },
    /// A command could not be framed (a bug in this layer, reported instead of panicking).
    #[error("uverbs {command}: {source}")]
    Frame {
        /// Command name.
        command: &'static str,
        /// Why.
        source: FrameError,
    },
    /// The kernel answered something this layer cannot use.
    #[error("uverbs {command}: unexpected reply: {reason}")]
    InvalidReply {
        /// Command name.
        command: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// An fd operation (fcntl, read of an event fd) failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The I/O error.
        source: io::Error,
    },
}

impl DeviceError {
    /// The errno to report to a guest for this error (`EIO` when the kernel gave none).
    pub fn errno(&self) -> i32 {
        match self {
            DeviceError::Command { errno, .. } => *errno,
            DeviceError::Io { source, .. }
            | DeviceError::Open { source, .. }
            | DeviceError::Sysfs { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            DeviceError::DeviceNotFound { .. } | DeviceError::NoActiveDevice => libc::ENODEV,
            DeviceError::NoRdmaSubsystem => libc::ENOSYS,
            _ => libc::EIO,
        }
    }
}

/// Result of this layer.
pub type Result<T, E = DeviceError> = std::result::Result<T, E>;

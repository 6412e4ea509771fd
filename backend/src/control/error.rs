//! Why a control command failed, and the one mapping from failures to spec statuses (§7).

use std::io;

use vrdma_spec::rxe_v1::GeometryError;
use vrdma_spec::{DecodeError, Status, StatusError};

use crate::datapath::doorbell::AreaError;
use crate::host::DeviceError;
use crate::memory::budget::BudgetError;
use crate::memory::error::MemError;
use crate::memory::queue_region::ShmAllocError;
use crate::resources::kind::ResourceError;
use crate::vhost_device::shmem::ShmemError;

/// Why a command failed; [`CommandError::status`] is what the guest is told.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The request does not decode (spec §7.1).
    #[error("malformed request: {0}")]
    Decode(#[from] DecodeError),
    /// The command needs a feature the driver did not accept.
    #[error("{0} was not negotiated")]
    NotNegotiated(&'static str),
    /// An option this device does not implement.
    #[error("not supported: {0}")]
    Unsupported(&'static str),
    /// A value is out of range for this device or port.
    #[error("invalid {what}: {value:#x}")]
    Invalid {
        /// The offending field.
        what: &'static str,
        /// Its value.
        value: u64,
    },
    /// A handle, quota or reference-count failure.
    #[error(transparent)]
    Resource(#[from] ResourceError),
    /// An MR's window does not fit the guest's or the daemon's mapping or pinned-memory budget.
    #[error(transparent)]
    Budget(#[from] BudgetError),
    /// Guest memory could not be used as asked.
    #[error(transparent)]
    Memory(#[from] MemError),
    /// The QP is not in a state that allows the command.
    #[error("bad state: {0}")]
    BadState(&'static str),
    /// A status decided by a spec-crate rule (e.g. the QP transition table).
    #[error("{what}: {status}")]
    Rule {
        /// The rule that failed.
        what: &'static str,
        /// Its verdict.
        status: Status,
    },
    /// No room in the queue region.
    #[error("queue region: {0}")]
    Placement(#[from] ShmAllocError),
    /// The frontend did not map or unmap a queue buffer.
    #[error("queue region mapping: {0}")]
    Shmem(#[from] ShmemError),
    /// The host device refused the operation.
    #[error("host {op}: {source}")]
    Host {
        /// The host verb.
        op: &'static str,
        /// What the host said.
        source: DeviceError,
    },
    /// A ring the host made (or its staging ring) does not hold together as rxe v1 (spec §6).
    #[error("host queue ring: {0}")]
    Ring(#[from] GeometryError),
    /// The host answered with something that cannot be passed on to the guest.
    #[error("host answer: {0}")]
    HostAnswer(String),
    /// The host device failed (spec §11.2); only a reset clears this.
    #[error("the host device failed; reset the device")]
    DeviceFailed,
}

impl CommandError {
    /// The status (and errno detail) the guest receives.
    pub fn status(&self) -> StatusError {
        let eio = StatusError::device_error(libc::EIO as u32);
        match self {
            CommandError::Decode(e) => StatusError::new(e.status()),
            CommandError::NotNegotiated(_) | CommandError::Unsupported(_) => {
                StatusError::new(Status::Unsupported)
            }
            CommandError::Invalid { .. } => StatusError::new(Status::Invalid),
            CommandError::Resource(e) => match e {
                ResourceError::BadHandle { .. } => StatusError::new(Status::BadHandle),
                ResourceError::Quota { .. }
                | ResourceError::ByteQuota { .. }
                | ResourceError::TooManyRefs { .. } => StatusError::new(Status::Quota),
                ResourceError::Busy { .. } => StatusError::new(Status::Busy),
                ResourceError::NotReferenced { .. } | ResourceError::LimitTooLarge { .. } => eio,
            },
            CommandError::Budget(_) => StatusError::new(Status::Quota),
            CommandError::Memory(e) => memory_status(e),
            CommandError::BadState(_) => StatusError::new(Status::BadState),
            CommandError::Rule { status, .. } => StatusError::new(*status),
            CommandError::Placement(
                ShmAllocError::NoSpace { .. } | ShmAllocError::BadLength(_),
            ) => StatusError::new(Status::NoMemory),
            CommandError::Placement(ShmAllocError::TooManyExtents { .. }) => {
                StatusError::new(Status::Quota)
            }
            CommandError::Placement(_) => eio,
            CommandError::Shmem(ShmemError::Frontend(e)) => errno_status(e),
            CommandError::Shmem(_) => eio,
            CommandError::Host { source, .. } => match source.errno() {
                libc::ENOMEM => StatusError::new(Status::NoMemory),
                errno => StatusError::device_error(errno.unsigned_abs()),
            },
            CommandError::Ring(_) | CommandError::HostAnswer(_) => eio,
            CommandError::DeviceFailed => StatusError::device_error(libc::ENODEV as u32),
        }
    }
}

impl From<AreaError> for CommandError {
    fn from(e: AreaError) -> Self {
        match e {
            AreaError::Memory(e) => CommandError::Memory(e),
            AreaError::Misaligned(addr) => CommandError::Invalid {
                what: "doorbell area alignment in host memory",
                value: addr,
            },
        }
    }
}

fn errno_status(e: &io::Error) -> StatusError {
    let errno = e.raw_os_error().filter(|&n| n > 0).unwrap_or(libc::EIO);
    StatusError::device_error(errno.unsigned_abs())
}

/// REG_MR status of a memory error (spec §7.4 REG_MR validation steps 1, 2 and 5).
fn memory_status(e: &MemError) -> StatusError {
    match e {
        MemError::BadPageShift(_)
        | MemError::ZeroLength
        | MemError::TooLarge { .. }
        | MemError::IovaOverflow { .. }
        | MemError::PageCountMismatch { .. }
        | MemError::UnalignedPage { .. }
        | MemError::BackingGranularity { .. } => StatusError::new(Status::Invalid),
        MemError::NotInGuestRam { .. }
        | MemError::NotFdBacked { .. }
        | MemError::FileOffsetOverflow { .. }
        | MemError::BeyondEndOfFile { .. } => StatusError::new(Status::BadAddress),
        MemError::WindowTooLarge { .. } | MemError::Reserve { .. } | MemError::Map { .. } => {
            StatusError::new(Status::NoMemory)
        }
        MemError::InspectFile { source, .. } => errno_status(source),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_spec_statuses() {
        let status = |e: CommandError| e.status();
        assert_eq!(
            status(DecodeError::UnknownOpcode(0x99).into()).status(),
            Status::Unsupported
        );
        assert_eq!(
            status(DecodeError::Reserved("flags").into()).status(),
            Status::Invalid
        );
        assert_eq!(
            status(
                ResourceError::Busy {
                    kind: crate::resources::kind::ResourceKind::Pd,
                    handle: 1,
                    refs: 1
                }
                .into()
            )
            .status(),
            Status::Busy
        );
        assert_eq!(
            status(MemError::NotInGuestRam { gpa: 0, len: 1 }.into()).status(),
            Status::BadAddress
        );
        assert_eq!(
            status(ShmAllocError::NoSpace { len: 1, free: 0 }.into()).status(),
            Status::NoMemory
        );
        let host = |errno| CommandError::Host {
            op: "TEST",
            source: DeviceError::Command {
                command: "TEST",
                errno,
            },
        };
        assert_eq!(status(host(libc::ENOMEM)).status(), Status::NoMemory);
        let e = status(host(libc::EINVAL));
        assert_eq!(
            (e.status(), e.detail()),
            (Status::DeviceError, libc::EINVAL as u32)
        );
        let e = status(CommandError::DeviceFailed);
        assert_eq!(
            (e.status(), e.detail()),
            (Status::DeviceError, libc::ENODEV as u32)
        );
    }
}

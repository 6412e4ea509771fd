//! Execution of control commands (spec §7) on the host RDMA device.
//!
//! [`crate::guest::GuestDevice`] decodes a request with the spec crate, checks features and
//! takes the guest's state lock; [`execute`] then routes the decoded [`ControlRequest`] to the
//! handler of its object family. Each handler validates, in the order the specification gives,
//! everything that depends on device state (handles of this guest only, quotas, guest
//! addresses, state transitions), then calls the host device, and either answers with a body
//! or with a [`CommandError`] that names the spec status. A failed command changes nothing.

pub mod ah;
pub mod cq;
pub mod doorbell;
pub mod events;
pub mod mr;
pub mod pd;
pub mod qp;
pub mod query;
pub mod rings;
pub mod srq;
pub mod state;

use std::io;

use vrdma_spec::{ControlRequest, DecodeError, ResponseBody, Status, StatusError};

use crate::device::{DeviceError, HostContext};
use crate::guest::{GuestDevice, GuestState};
use crate::handler::{GuestContext, ShmemError};
use crate::mem::MemError;
use crate::resources::ResourceError;
use crate::shm_alloc::ShmAllocError;

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
    /// The host returned a queue buffer whose geometry cannot be described to the guest.
    #[error("host queue buffer: {0}")]
    Geometry(String),
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
            CommandError::Memory(e) => memory_status(e),
            CommandError::BadState(_) => StatusError::new(Status::BadState),
            CommandError::Rule { status, .. } => StatusError::new(*status),
            CommandError::Placement(
                ShmAllocError::NoSpace { .. } | ShmAllocError::BadLength(_),
            ) => StatusError::new(Status::NoMemory),
            CommandError::Placement(_) => eio,
            CommandError::Shmem(ShmemError::Frontend(e)) => errno_status(e),
            CommandError::Shmem(_) => eio,
            CommandError::Host { source, .. } => match source.errno() {
                libc::ENOMEM => StatusError::new(Status::NoMemory),
                errno => StatusError::device_error(errno.unsigned_abs()),
            },
            CommandError::Geometry(_) => eio,
            CommandError::DeviceFailed => StatusError::device_error(libc::ENODEV as u32),
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

/// Wraps a host-device error with the verb that failed.
pub(crate) fn host_err(op: &'static str) -> impl FnOnce(DeviceError) -> CommandError {
    move |source| CommandError::Host { op, source }
}

/// Result of one command.
pub type CommandResult = Result<ResponseBody, CommandError>;

/// Everything a command handler works with: the device, the guest's context and its state
/// (locked by the caller for the whole command).
pub(crate) struct Session<'a> {
    pub(crate) dev: &'a GuestDevice,
    pub(crate) ctx: &'a GuestContext,
    pub(crate) state: &'a mut GuestState,
    /// Feature bits the driver accepted.
    pub(crate) features: u64,
}

impl Session<'_> {
    pub(crate) fn host(&self) -> &dyn HostContext {
        self.dev.host()
    }

    /// Fails unless the driver accepted `bit`.
    pub(crate) fn require(&self, bit: u64, name: &'static str) -> Result<(), CommandError> {
        if self.features & bit == 0 {
            return Err(CommandError::NotNegotiated(name));
        }
        Ok(())
    }
}

/// Runs one decoded, feature-checked request.
pub(crate) fn execute(s: &mut Session<'_>, request: &ControlRequest<'_>) -> CommandResult {
    match request {
        ControlRequest::QueryDevice => query::query_device(s),
        ControlRequest::QueryPort(r) => query::query_port(s, r),
        ControlRequest::QueryGid(r) => query::query_gid(s, r),
        ControlRequest::QueryPkey(r) => query::query_pkey(s, r),
        ControlRequest::SetDoorbellArea(r) => doorbell::set_doorbell_area(s, r),
        ControlRequest::DiscardState => state::discard_state(s),
        ControlRequest::AllocPd => pd::alloc_pd(s),
        ControlRequest::DeallocPd(r) => pd::dealloc_pd(s, r),
        ControlRequest::RegMr(r) => mr::reg_mr(s, r),
        ControlRequest::DeregMr(r) => mr::dereg_mr(s, r),
        ControlRequest::CreateCq(r) => cq::create_cq(s, r),
        ControlRequest::DestroyCq(r) => cq::destroy_cq(s, r),
        ControlRequest::ArmCq(r) => cq::arm_cq(s, r),
        ControlRequest::CreateQp(r) => qp::create_qp(s, r),
        ControlRequest::ModifyQp(r) => qp::modify_qp(s, r),
        ControlRequest::QueryQp(r) => qp::query_qp(s, r),
        ControlRequest::DestroyQp(r) => qp::destroy_qp(s, r),
        ControlRequest::CreateSrq(r) => srq::create_srq(s, r),
        ControlRequest::ModifySrq(r) => srq::modify_srq(s, r),
        ControlRequest::QuerySrq(r) => srq::query_srq(s, r),
        ControlRequest::DestroySrq(r) => srq::destroy_srq(s, r),
        ControlRequest::CreateAh(r) => ah::create_ah(s, r),
        ControlRequest::DestroyAh(r) => ah::destroy_ah(s, r),
    }
}

/// Fails with `INVALID` if `value` exceeds the device limit `max`.
pub(crate) fn at_most(value: u32, max: u32, what: &'static str) -> Result<(), CommandError> {
    if value > max {
        return Err(CommandError::Invalid {
            what,
            value: value.into(),
        });
    }
    Ok(())
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
                    kind: crate::resources::ResourceKind::Pd,
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

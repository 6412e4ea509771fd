//! Control-command status codes.

/// Status word of every control response (`le32` at offset 0 of the response header).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Status {
    /// The command was executed; the response body follows.
    Ok = 0,
    /// Unknown opcode, or a command/option that needs a feature that was not negotiated
    /// or that this device does not implement.
    Unsupported = 1,
    /// Malformed request: short, oversized, trailing bytes, non-zero reserved field,
    /// out-of-range value, inconsistent sizes, or response buffer too small.
    Invalid = 2,
    /// A handle is zero, unknown, stale, of the wrong type, or belongs to another guest.
    BadHandle = 3,
    /// A per-guest quota would be exceeded.
    Quota = 4,
    /// The device (or the host) ran out of memory or of shared-memory region space.
    NoMemory = 5,
    /// A guest-physical address is not backed by this guest's RAM, or a range overflows.
    BadAddress = 6,
    /// The requested QP state transition is not allowed from the current state.
    BadState = 7,
    /// The object is still referenced (e.g. a PD with live MRs or QPs).
    Busy = 8,
    /// The host RDMA stack failed; `detail` carries the positive host errno.
    DeviceError = 9,
}

impl Status {
    /// Every status, in wire order.
    pub const ALL: [Status; 10] = [
        Status::Ok,
        Status::Unsupported,
        Status::Invalid,
        Status::BadHandle,
        Status::Quota,
        Status::NoMemory,
        Status::BadAddress,
        Status::BadState,
        Status::Busy,
        Status::DeviceError,
    ];

    /// Wire value.
    pub const fn to_u32(self) -> u32 {
        self as u32
    }

    /// Short upper-case name as used in the specification.
    pub const fn name(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::Unsupported => "UNSUPPORTED",
            Status::Invalid => "INVALID",
            Status::BadHandle => "BAD_HANDLE",
            Status::Quota => "QUOTA",
            Status::NoMemory => "NO_MEMORY",
            Status::BadAddress => "BAD_ADDRESS",
            Status::BadState => "BAD_STATE",
            Status::Busy => "BUSY",
            Status::DeviceError => "DEVICE_ERROR",
        }
    }
}

impl TryFrom<u32> for Status {
    type Error = u32;

    fn try_from(v: u32) -> Result<Self, u32> {
        Status::ALL.get(v as usize).copied().ok_or(v)
    }
}

impl core::fmt::Display for Status {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed control command, as carried in a response header: a non-OK status plus the
/// `detail` word (host errno for [`Status::DeviceError`], zero otherwise).
///
/// The device builds it to answer; the driver gets it back from
/// [`crate::ControlResponse::into_result`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StatusError {
    status: Status,
    detail: u32,
}

impl StatusError {
    /// A failure without detail. `Status::Ok` is mapped to `Status::DeviceError` so that a
    /// `StatusError` can never claim success.
    pub const fn new(status: Status) -> Self {
        let status = match status {
            Status::Ok => Status::DeviceError,
            s => s,
        };
        StatusError { status, detail: 0 }
    }

    /// A [`Status::DeviceError`] carrying a positive host errno.
    pub const fn device_error(errno: u32) -> Self {
        StatusError {
            status: Status::DeviceError,
            detail: errno,
        }
    }

    /// Rebuilds the error from wire values; `None` if the combination is not one the
    /// specification allows (OK status, or a non-zero detail with a status other than
    /// DEVICE_ERROR).
    pub const fn from_wire(status: Status, detail: u32) -> Option<Self> {
        match status {
            Status::Ok => None,
            Status::DeviceError => Some(StatusError { status, detail }),
            _ if detail != 0 => None,
            _ => Some(StatusError { status, detail }),
        }
    }

    /// The (never OK) status.
    pub const fn status(&self) -> Status {
        self.status
    }

    /// Host errno for DEVICE_ERROR, zero for every other status.
    pub const fn detail(&self) -> u32 {
        self.detail
    }
}

impl From<Status> for StatusError {
    fn from(s: Status) -> Self {
        StatusError::new(s)
    }
}

impl core::fmt::Display for StatusError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "vrdma command failed: {}", self.status)?;
        if self.detail != 0 {
            write!(f, " (host errno {})", self.detail)?;
        }
        Ok(())
    }
}

impl std::error::Error for StatusError {}

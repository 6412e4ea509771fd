//! What every command handler shares: the `Session` a command runs in, its result type and
//! the small checks all families use.

use vrdma_spec::ResponseBody;

use crate::control::error::CommandError;
use crate::guest::shared::GuestShared;
use crate::guest::state::GuestState;
use crate::host::{DeviceError, HostContext};
use crate::vhost_device::guest_io::GuestIo;

/// Wraps a host-device error with the verb that failed.
pub(crate) fn host_err(op: &'static str) -> impl FnOnce(DeviceError) -> CommandError {
    move |source| CommandError::Host { op, source }
}

/// Result of one command.
pub type CommandResult = Result<ResponseBody, CommandError>;

/// Everything a command handler works with: the device, the guest's context and its state
/// (locked by the caller for the whole command).
pub(crate) struct Session<'a> {
    pub(crate) guest: &'a GuestShared,
    pub(crate) guest_io: &'a GuestIo,
    pub(crate) state: &'a mut GuestState,
    /// Feature bits the driver accepted.
    pub(crate) features: u64,
    /// The configuration epoch when the command began (a reset requested while it runs moves
    /// the epoch on: the command belongs to the driver before it).
    pub(crate) epoch: u32,
}

impl Session<'_> {
    pub(crate) fn host(&self) -> &dyn HostContext {
        self.guest.host()
    }

    /// Fails unless the driver accepted `bit`.
    pub(crate) fn require(&self, bit: u64, name: &'static str) -> Result<(), CommandError> {
        if self.features & bit == 0 {
            return Err(CommandError::NotNegotiated(name));
        }
        Ok(())
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

//! DISCARD_STATE: the driver asks for everything to be dropped before it resets the device.

use vrdma_spec::control::ResponseBody;

use super::{CommandResult, Session};

/// Discards every object of the guest (spec §11.1) the way their destroy commands would,
/// removing the device's shared-memory mappings itself. The driver asked, so no DEVICE_FATAL
/// is owed for it.
pub(crate) fn discard_state(s: &mut Session<'_>) -> CommandResult {
    s.dev.discard(s.state, Some(s.ctx));
    s.state.announce_discard = false;
    Ok(ResponseBody::Empty)
}

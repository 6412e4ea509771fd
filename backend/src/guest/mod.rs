//! One guest's object model: what the per-guest device (`guest_device`), the `control`
//! commands and the event pumps work on. `shared` is what every worker of the guest reaches
//! without the state lock, [`state`] what sits behind it; [`objects`] are what the state's
//! handle tables hold, [`cm_ids`] its connection-manager ids; [`options`] is what the command
//! line decides; [`inventory`] is a snapshot of the state for consistency checks. It uses the
//! layers below it (the data-path pumps, memory, identity, the host device) and nothing
//! above.

pub mod cm_ids;
pub mod inventory;
pub mod objects;
pub mod options;
pub(crate) mod shared;
pub mod state;

//! The parts of the guest agent that judge what application processes send, as a library so
//! that they can be fuzzed on their own (`guest-driver/fuzz`, target `agent_commands`); the
//! agent itself is the `vrdma-guestd` binary.

pub mod cm_events;
pub mod ownership;
pub mod pin_budget;
pub mod translate;

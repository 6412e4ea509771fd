//! Per-guest state: one guest's vrdma device ([`device::GuestDevice`], the device logic the
//! vhost-user device calls), the objects it holds and the options every guest gets.
//!
//! Layers, top-down: [`device`] (the `DeviceHandler`) runs the `control` commands and the
//! `datapath` pumps, which work on `shared` and [`state`]; [`objects`] are what
//! the state's handle tables hold, [`cm_ids`] its connection-manager ids; [`options`] is what the command line decides;
//! [`inventory`] is a snapshot of the state for consistency checks.

pub mod cm_ids;
pub mod device;
pub mod inventory;
pub mod objects;
pub mod options;
pub(crate) mod shared;
pub mod state;

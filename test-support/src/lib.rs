//! Test fakes shared by every crate's tests, one copy each: the fake host device the backend's
//! control handlers run against, the simulated rxe kernel behind the guest provider's rings, and
//! the fake transport the verbs API runs over; and running checks in a `fork()` child. Tests only: nothing here ships.
//!
//! Its own test `tests/module_cycles.rs` guards the workspace's shape: no crate has an import
//! cycle between its modules.

pub mod echo_device;
pub mod fake_host;
pub mod fake_transport;
pub mod fork;
pub mod fuzz;
pub mod rxe_kernel_sim;

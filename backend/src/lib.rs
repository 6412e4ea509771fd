//! The vrdma vhost-user daemon as a library. Layers, top-down (ARCHITECTURE.md states them
//! once, a test enforces them): the [`daemon`] serves its command line's guests, its
//! [`listener`] accepts them; [`guest_device`] is
//! one guest's device, which runs [`control`] commands over the guest's object model
//! ([`guest`]) and the [`datapath`] pumps; [`vhost_device`] is the vhost-user device of one
//! connection; [`memory`] (guest RAM, MR windows, the queue region), [`identity`] and
//! [`resources`] sit above [`host`], the host RDMA device (the `vrdma-host` crate).

#![deny(unsafe_op_in_unsafe_fn)]

pub mod config;
pub mod control;
pub mod daemon;
pub mod datapath;
pub mod fault_log;
pub mod guest;
pub mod guest_device;
/// The host RDMA device (the `vrdma-host` crate), under the name the daemon's modules use.
pub use vrdma_host as host;
pub mod identity;
pub mod listener;
pub mod memory;
pub mod resources;
#[cfg(test)]
mod test_netns;
pub mod vhost_device;

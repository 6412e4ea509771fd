//! The vrdma vhost-user daemon as a library. Layers, top-down: the daemon's [`listener`]
//! accepts guests; [`vhost_device`] is the vhost-user device of one connection; [`guest`] is the
//! device logic of one guest, which runs [`control`] commands and the [`datapath`] pumps over
//! [`memory`] (guest RAM, MR windows, the queue region) and the [`host`] RDMA device.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod config;
pub mod control;
pub mod datapath;
pub mod fault_log;
pub mod guest;
pub mod guest_device;
pub mod host;
pub mod identity;
pub mod listener;
pub mod memory;
pub mod resources;
#[cfg(test)]
mod test_netns;
pub mod vhost_device;

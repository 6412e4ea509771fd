//! The host-device layer of vrdma's daemon: everything it does on the host's RDMA device on a
//! guest's behalf. A crate of its own, so that the daemon and the test fakes of the device
//! both build on it.
//!
//! The backend speaks the kernel's uverbs `write()` command ABI directly ([`uverbs`]) rather
//! than going through libibverbs: rxe's queue buffers can be mapped only once, by whoever maps
//! them first, so the guest's side (QEMU or a process-mode frontend) must do that mapping and the
//! backend must create queues itself and pass on (fd, offset, length). It also keeps the build
//! free of rdma-core.
//!
//! - [`sysfs`]: device discovery and GID tables (as the wire's `GidEntry`).
//! - [`HostDevice`] / [`HostContext`] ([`device`]): what the rest of the backend uses,
//!   object-safe so a test can put a fake device behind them; [`types`] are the verbs types
//!   they speak; device and port attributes are the kernel's own structs ([`uverbs`]).
//! - [`rxe`]: the Soft-RoCE implementation, over [`uverbs`] commands written to a
//!   [`verbs_file`]; [`rxe_convert`] translates between the verbs types and the command ABI.
//! - [`events`]: the context's async event and completion channel fds.
//! - [`local_addresses`]: whether a destination is this host's own (delivered locally).
//! - [`cm`]: the host's connection manager for one guest ([`cm::HostCm`]), and [`ucma`], the
//!   kernel's ABI it runs on (`/dev/infiniband/rdma_cm`).

#![deny(unsafe_op_in_unsafe_fn)]

pub mod cm;
pub mod device;
pub mod error;
pub mod events;
pub mod local_addresses;
pub mod rxe;
pub mod rxe_abi;
pub mod rxe_convert;
pub mod sysfs;
pub mod types;
pub mod ucma;
pub mod uverbs;
pub mod verbs_file;

#[cfg(test)]
mod layout_tests;

pub use device::{ContextGids, GidSource, HostContext, HostDevice};
pub use error::{DeviceError, Result};
pub use rxe::{RxeContext, RxeDevice};
pub use sysfs::{DeviceInfo, PortInfo};
pub use types::*;

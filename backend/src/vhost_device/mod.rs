//! The vhost-user device: the `VhostUserBackend` of one guest connection, the virtqueue
//! plumbing around a [`DeviceHandler`](handler::DeviceHandler) (the device logic: in the
//! daemon, the per-guest device).
//!
//! Queues: 0 = controlq (request then response buffer per chain), 1 = eventq (device-writable
//! buffers the device fills with one event each), 2 = doorbellq (its notification is the send
//! doorbell). The control queue runs on its own worker thread so that a slow command (a large
//! memory registration) never delays doorbells or events, which share the second worker with
//! the handler's watched fds.
//!
//! Nothing a guest puts on a queue may stop a worker: every malformed chain is returned with
//! a used length of 0 and logged (rate-limited, since a guest can produce them at will).
//!
//! - [`VhuVrdma`] (`vhu_vrdma.rs`, named as rust-vmm's vhost-device crates name theirs): the
//!   device's state and the serving of each queue; `vhost_user_backend.rs`: its
//!   `VhostUserBackend` impl, what the daemon calls.
//! - [`handler`]: the [`DeviceHandler`](handler::DeviceHandler) trait the device logic implements;
//!   [`guest_io`], [`event_queue`], [`shmem`]: what the handler can reach of the guest.
//! - [`chain_layout`]: the descriptor order every chain must have (readable, then writable).
//! - [`frontend_filter`]: what passes between the front-end and the daemon, keeping the
//!   device's own mappings out of the guest memory table.

pub mod backend_channel;
pub mod chain_layout;
pub mod event_queue;
pub mod frontend_filter;
pub mod guest_io;
pub mod handler;
pub(crate) use vrdma_keeper::message;
pub mod shmem;

mod vhost_user_backend;
mod vhu_vrdma;

pub use vhost_user_backend::{MAX_CONFIG_SIZE, MAX_QUEUE_SIZE};
pub use vhu_vrdma::{VhuVrdma, WorkerEpollHandler};

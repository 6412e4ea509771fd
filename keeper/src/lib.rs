//! vrdma-keeper: holds a VM's vhost-user connection while vrdma-backend daemons come and go.
//!
//! Under QEMU 11.1 a vhost-user device whose back-end disconnects is dead for good (spec
//! §11.4). The keeper is the back-end QEMU connects to; it relays every message to the daemon
//! and back, and remembers what the connection set up. When the daemon dies the keeper
//! removes the daemon's shared-memory mappings (the host then releases its objects), answers
//! QEMU alone, and gives the next daemon the same set-up, announced by [`resume::RESUME`], so
//! that the guest's driver learns of the loss through the device (spec §11.5).
//!
//! - [`message`]: vhost-user framing with descriptors (shared with vrdma-backend).
//! - [`resume`]: the keeper's own request.
//! - [`setup`]: what the front-end set up, and the keeper's answers without a daemon.
//! - [`mappings`]: the relayed back-end channel's mappings.
//! - [`relay`]: the connection loop.
//!
//! The keeper has no RDMA logic and reads no guest memory. It is itself not restartable: it
//! holds QEMU's socket, and QEMU cannot reconnect it (restart it with its VMs).

pub mod mappings;
pub mod message;
pub mod relay;
pub mod resume;
pub mod setup;

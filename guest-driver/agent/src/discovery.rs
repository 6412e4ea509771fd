//! Discovery: what RDMA software reads, besides libibverbs, to find and classify a device,
//! published for the device the agent serves (spec §7.6).
//!
//! UCX keeps a verbs device only if `/dev/infiniband/<dev_name>` is a character device the
//! process may read and write, reads each GID's type from
//! `/sys/class/infiniband/<dev>/ports/<p>/gid_attrs/types/<i>` (missing: RoCE v1, which a
//! native RoCE v2 peer then refuses) and the device's CPUs from `device/local_cpus`; Open MPI
//! reads `device/driver`; rdma-core's tests read the port files. No kernel driver makes these
//! for vrdma, so the agent writes them from what the device reports, through a session of its
//! own:
//! - the class tree `<dev>/…` with the kernel's file formats (`drivers/infiniband/core/sysfs.c`);
//! - the node `<dev>`: a character device with the numbers of `/dev/null` and the agent
//!   socket's owner, group and mode. Whoever may open it may reach the agent; opening it gives
//!   nothing, the agent socket is the device.
//!
//! [`Publication::system`] mounts a tmpfs over `/sys/class/infiniband` (in a guest whose only
//! RDMA device is vrdma's) and makes the node in `/dev/infiniband`;
//! [`Publication::directory`] writes both into a directory for a container runtime to
//! bind-mount at those paths. The tree is written once, at start: GID changes after that are
//! not followed.

mod facts;
mod publication;

pub use facts::{summary, DeviceFacts};
pub use publication::{NodeAccess, Publication};

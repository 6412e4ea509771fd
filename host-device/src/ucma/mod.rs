//! The kernel's RDMA connection manager ABI (ucma: `write()` commands on
//! `/dev/infiniband/rdma_cm`), the way the backend runs a guest's rdma_cm ids on the host.
//!
//! - [`abi`]: the command structs and constants of `<rdma/rdma_user_cm.h>`;
//! - [`file`]: one open rdma_cm device ([`CmFile`]): the commands, socket-address encoding;
//! - [`host_cm`]: [`crate::cm::HostCm`] over it ([`KernelCm`]), the one conversion
//!   between the CM's host types and the ABI;
//!
//! INIT_QP_ATTR's answer becomes the attributes MODIFY_QP takes in the one place conversions to
//! and from the kernel ABI live (`rxe_convert::qp_attr_from_cm`).

pub mod abi;
pub mod file;
pub mod host_cm;

pub use crate::cm::CmId;
pub use file::{CmFile, CM_DEVICE_PATH};
pub use host_cm::KernelCm;

//! The fake host side of the backend's tests: a host RDMA device without RDMA ([`device`]) and
//! its port's netdev ([`netdev`]) with its shared state ([`world`]), a frontend that serves SHMEM_MAP/UNMAP with QEMU's placement
//! rules ([`frontend`]), and a harness that runs one guest's real device over both
//! ([`harness`]); [`ownership`] records which context owns each host object.

pub mod device;
pub mod frontend;
pub mod harness;
pub mod netdev;
pub mod ownership;
pub mod world;

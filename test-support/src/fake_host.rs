//! The fake host side of the backend's tests: a host RDMA device without RDMA ([`device`]) and
//! its port's netdev ([`netdev`]) with its shared state ([`world`]), a frontend that serves SHMEM_MAP/UNMAP with QEMU's placement
//! rules ([`frontend`]), and a harness that runs one guest's real device over both
//! ([`harness`]); [`ownership`] records which context owns each host object; [`cm`] is the
//! fake connection manager, [`cm_steps`] the CM commands tests send.

pub mod cm;
pub mod cm_net;
pub mod cm_steps;
pub mod device;
pub mod frontend;
pub mod harness;
pub mod netdev;
pub mod ownership;
pub mod world;

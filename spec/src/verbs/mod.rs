//! Verbs-level constants carried in commands and in native queue entries: the one definition
//! of every verbs enum and flag set for all crates.
//!
//! Numeric values are those of rdma-core's `<infiniband/verbs.h>` (`ibv_*`), which are
//! also the kernel uverbs ABI values, so both sides can pass them through unchanged.
//! The submodules group them by job; every item is used as `vrdma_spec::verbs::Item`.

#[macro_use]
mod verbs_enum;

mod completion;
mod flags;
mod port;
mod qp;
mod work_request;

pub use completion::{arm_flags, WcOpcode, WcStatus};
pub use flags::{srq_attr, AccessFlags, QpAttrMask, SendFlags, WcFlags};
pub use port::{Gid, GidType, PortState, MAX_FLOW_LABEL, MAX_STATIC_RATE};
pub use qp::{check_modify_qp, qp_transition, Mtu, QpState, QpType, Transition, MAX_PSN};
pub use work_request::{MwType, WrOpcode};

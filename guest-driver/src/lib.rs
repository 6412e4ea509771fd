//! vrdma: the guest user library of the vrdma device (see spec/README.md).
//!
//! The verbs API and its transports land with the data-path work; for now this crate re-exports
//! the wire types so that guest code can already be written against them.

pub use vrdma_spec as spec;
pub mod provider;

pub mod dma;
pub mod pingpong;
pub mod transport;
pub mod verbs;
pub mod virtq;

pub use verbs::{
    Ah, AhAttr, Context, Cq, Mr, Pd, Qp, QpAttr, QpAttrMask, QpInitAttr, Srq, VerbsError,
};

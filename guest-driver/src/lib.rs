//! vrdma: the guest user library of the vrdma device (see spec/README.md).
//!
//! [`verbs`] is the API applications use; [`provider`] writes their work requests into the
//! rings in the host device's native format; [`transport`] reaches the device (the PCI
//! transport inside a VM, the process transport as a vhost-user frontend), driving its
//! [`virtq`] split virtqueues over the memory of [`dma`]. The wire types are re-exported as
//! [`spec`]. The test tools built on this library live in `guest-driver/tools/`.

pub use vrdma_spec as spec;
pub mod provider;

pub mod dma;
pub mod interfaces;
pub mod transport;
pub mod verbs;
pub mod virtq;

pub use verbs::{
    Ah, AhAttr, Context, Cq, Mr, Mw, Pd, Qp, QpAttr, QpAttrMask, QpInitAttr, Srq, VerbsError,
    DEVICE_NAME,
};

//! The PCI transport: a userspace modern virtio-pci driver for the vrdma device.

mod function;

pub use function::{PciError, PciFunction};

//! The PCI transport: a userspace modern virtio-pci driver for the vrdma device.
//!
//! [`PciTransport`] drives the device through any [`PciFunction`]: [`SysfsPciFunction`] in a
//! real guest (sysfs resource files, hugepage DMA memory, polling), or QEMU's qtest protocol
//! in tests.

mod function;
mod hugepage;
mod interrupt;
pub mod pagemap;
pub mod sysfs;
mod transport;
pub mod virtio;

pub use function::{PciError, PciFunction};
pub use hugepage::HugepageDma;
pub use sysfs::SysfsPciFunction;
pub use transport::{PciOptions, PciTransport};

#[cfg(test)]
mod tests;

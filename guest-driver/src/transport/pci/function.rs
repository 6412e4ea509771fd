//! "A PCI function": what the virtio-pci driver needs of the bus, and nothing of how it is
//! reached (sysfs in a real guest, QEMU's qtest protocol in tests).

use std::sync::Arc;
use std::time::Duration;

use crate::dma::DmaMemory;
use crate::transport::SharedMemory;

/// Errors of PCI function access.
#[derive(Debug, thiserror::Error)]
pub enum PciError {
    /// No function matching what was asked for exists.
    #[error("no vrdma PCI device found: {0}")]
    NotFound(String),
    /// Another process drives the function (one driver at a time: a second one would reset
    /// the device under the first).
    #[error("{0}")]
    Busy(String),
    /// The caller lacks the privilege the access needs.
    #[error("{0} (run as root)")]
    PermissionDenied(String),
    /// Hugepages are needed for ring memory and none are available.
    #[error("no hugepages available: {0}")]
    NoHugepages(String),
    /// An access outside what the function decodes, or of an unsupported size.
    #[error("invalid access: {0}")]
    InvalidAccess(String),
    /// The channel to the function failed (the function or whatever emulates it is gone).
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// One PCI function, as the virtio-pci driver sees it.
///
/// Register accesses are single bus accesses of 1, 2, 4 or 8 bytes, naturally aligned, in
/// the function's little-endian byte order, performed in program order. The function's BARs
/// are assigned and memory decoding is possible before the driver starts (firmware or the
/// implementation did it); the driver turns on memory space and bus mastering itself.
pub trait PciFunction: Send + Sync {
    /// Reads `buf.len()` (1, 2 or 4) bytes of configuration space at `offset`.
    fn config_read(&self, offset: u16, buf: &mut [u8]) -> Result<(), PciError>;

    /// Writes `data` (1, 2 or 4 bytes) to configuration space at `offset`.
    fn config_write(&self, offset: u16, data: &[u8]) -> Result<(), PciError>;

    /// Reads one register of `buf.len()` (1, 2, 4 or 8) bytes at `offset` of memory BAR `bar`.
    fn bar_read(&self, bar: u8, offset: u64, buf: &mut [u8]) -> Result<(), PciError>;

    /// Writes one register of `data.len()` (1, 2, 4 or 8) bytes at `offset` of memory BAR `bar`.
    fn bar_write(&self, bar: u8, offset: u64, data: &[u8]) -> Result<(), PciError>;

    /// `[offset, offset + len)` of memory BAR `bar` as a region the data path can use:
    /// mapped into this process where possible, else reached through register accesses.
    fn bar_region(&self, bar: u8, offset: u64, len: u64) -> Result<SharedMemory, PciError>;

    /// Memory the function can reach by DMA, with its bus addresses.
    fn dma(&self) -> Arc<dyn DmaMemory>;

    /// Waits up to `timeout` for the function's interrupt (INTx; the driver leaves MSI-X off).
    /// Returns true if one may have come, false on timeout. A function without interrupt
    /// delivery sleeps a short while and returns true, which makes the driver poll.
    fn wait_interrupt(&self, timeout: Duration) -> Result<bool, PciError>;
}

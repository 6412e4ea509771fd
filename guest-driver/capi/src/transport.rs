//! The process transport with [`AppMemory`] as its DMA memory, so that the verbs library
//! registers re-backed application memory like its own buffers.

use std::os::fd::BorrowedFd;
use std::time::Duration;

use vrdma::transport::process::{ProcessOptions, ProcessTransport};
use vrdma::transport::{DmaMemory, SharedMemory, Transport, TransportError};

use crate::memory::AppMemory;

/// A process transport whose DMA memory also covers re-backed application memory.
pub(crate) struct AppTransport {
    inner: ProcessTransport,
    memory: AppMemory,
}

impl AppTransport {
    /// Connects to the backend at `socket` with `ram_size` bytes of guest RAM.
    pub(crate) fn connect(
        socket: &std::path::Path,
        ram_size: usize,
    ) -> Result<AppTransport, TransportError> {
        let options = ProcessOptions {
            guest_ram_size: ram_size,
            ..ProcessOptions::default()
        };
        let inner = ProcessTransport::connect(socket, options)?;
        let ram = inner.process_dma().guest_ram().clone();
        let memory = AppMemory::new(ram).map_err(|source| TransportError::Io {
            what: "fstat of the guest RAM",
            source,
        })?;
        Ok(AppTransport { inner, memory })
    }

    /// Application memory registration.
    pub(crate) fn memory(&self) -> &AppMemory {
        &self.memory
    }
}

impl Transport for AppTransport {
    fn device_features(&self) -> u64 {
        self.inner.device_features()
    }

    fn device_config(&self) -> &[u8] {
        self.inner.device_config()
    }

    fn execute(&self, request: &[u8], response: &mut [u8]) -> Result<usize, TransportError> {
        self.inner.execute(request, response)
    }

    fn notify_doorbell(&self) -> Result<(), TransportError> {
        self.inner.notify_doorbell()
    }

    fn next_event(
        &self,
        out: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<Option<usize>, TransportError> {
        self.inner.next_event(out, timeout)
    }

    fn event_fd(&self) -> Option<BorrowedFd<'_>> {
        self.inner.event_fd()
    }

    fn shared_memory(&self) -> SharedMemory {
        self.inner.shared_memory()
    }

    fn dma(&self) -> &dyn DmaMemory {
        &self.memory
    }
}

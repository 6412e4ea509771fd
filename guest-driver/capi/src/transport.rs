//! The transport of the drop-in: the process transport with [`AppMemory`] as its DMA memory
//! (so that the verbs library registers re-backed application memory like its own buffers),
//! or the PCI transport, whose DMA memory translates any locked application memory itself.

use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use vrdma::dma::{DmaMemory, MemfdRam};
use vrdma::spec::features::{VRDMA_F_CM_MOVES_QP, VRDMA_F_HOST_KICK};
use vrdma::transport::agent::AgentTransport;
use vrdma::transport::pci::{PciOptions, PciTransport, SysfsPciFunction};
use vrdma::transport::process::{ProcessOptions, ProcessTransport};
use vrdma::transport::{HostKick, SharedMemory, Transport, TransportError};

use crate::config::ProcessSettings;
use crate::memory::{AppMemory, RebackError};

/// The device's transport, and what registering application memory takes with it.
pub(crate) struct AppTransport {
    inner: Arc<dyn Transport>,
    /// Re-backing of application memory (process transport only).
    memory: Option<AppMemory>,
}

/// How application memory becomes memory the device reaches.
pub(crate) enum Registration<'a> {
    /// Re-backed with guest-RAM pages (process transport).
    Reback(&'a AppMemory),
    /// Used in place: the transport locks and translates it (PCI transport).
    InPlace,
}

impl Registration<'_> {
    /// Makes `[addr, addr + len)` reachable by the device.
    pub(crate) fn make_registrable(&self, addr: usize, len: usize) -> Result<(), RebackError> {
        match self {
            Registration::Reback(memory) => memory.make_registrable(addr, len),
            Registration::InPlace => Ok(()),
        }
    }
}

/// Why the PCI transport could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PciOpenError {
    /// The device was not found or not accessible.
    #[error(transparent)]
    Function(#[from] vrdma::transport::pci::PciError),
    /// The device did not come up.
    #[error(transparent)]
    Transport(#[from] TransportError),
}

impl AppTransport {
    /// Connects to the backend at `socket` with what the environment set (`settings`).
    pub(crate) fn connect(
        socket: &std::path::Path,
        settings: ProcessSettings,
    ) -> Result<AppTransport, TransportError> {
        let defaults = ProcessOptions::default();
        let refused = [
            (settings.host_kick, VRDMA_F_HOST_KICK),
            (settings.cm_moves_qp, VRDMA_F_CM_MOVES_QP),
        ]
        .into_iter()
        .filter(|(on, _)| !on)
        .fold(0, |refused, (_, bit)| refused | bit);
        let options = ProcessOptions {
            guest_ram_size: settings.ram_size,
            device_features: defaults.device_features & !refused,
            command_spin: settings.command_spin,
            ..defaults
        };
        let inner = ProcessTransport::connect(socket, options)?;
        let ram = inner.process_dma().guest_ram().clone();
        Self::rebacked(Arc::new(inner), ram)
    }

    /// Connects to the guest agent at `socket`; application memory is re-backed with the
    /// guest RAM the agent gives this process.
    pub(crate) fn connect_agent(socket: &std::path::Path) -> Result<AppTransport, TransportError> {
        let inner = AgentTransport::connect(socket)?;
        let ram = inner.guest_ram().clone();
        Self::rebacked(Arc::new(inner), ram)
    }

    /// `inner`, with application memory re-backed by pages of `ram` (its guest RAM).
    fn rebacked(inner: Arc<dyn Transport>, ram: Arc<MemfdRam>) -> Result<Self, TransportError> {
        let memory = AppMemory::new(ram).map_err(|source| TransportError::Io {
            what: "fstat of the guest RAM",
            source,
        })?;
        Ok(AppTransport {
            inner,
            memory: Some(memory),
        })
    }

    /// Opens the vrdma PCI device at `address` (or the first one found); `command_spin`: see
    /// [`PciOptions`].
    pub(crate) fn open_pci(
        address: Option<&str>,
        command_spin: Duration,
    ) -> Result<AppTransport, PciOpenError> {
        let function = SysfsPciFunction::open(address)?;
        let options = PciOptions {
            command_spin,
            ..PciOptions::default()
        };
        let inner = PciTransport::open(Arc::new(function), options)?;
        Ok(AppTransport {
            inner: Arc::new(inner),
            memory: None,
        })
    }

    /// Another transport used as it is, with its own DMA memory (tests: the fake device).
    #[cfg(test)]
    pub(crate) fn over(inner: Arc<dyn Transport>) -> AppTransport {
        AppTransport {
            inner,
            memory: None,
        }
    }

    /// Application memory registration.
    pub(crate) fn memory(&self) -> Registration<'_> {
        match &self.memory {
            Some(memory) => Registration::Reback(memory),
            None => Registration::InPlace,
        }
    }
}

impl Transport for AppTransport {
    fn device_features(&self) -> u64 {
        self.inner.device_features()
    }

    fn device_config(&self) -> &[u8] {
        self.inner.device_config()
    }

    fn round_trip(&self, request: &[u8], response: &mut [u8]) -> Result<usize, TransportError> {
        self.inner.round_trip(request, response)
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

    fn registered_doorbell_area(&self) -> Option<(NonNull<u8>, usize)> {
        self.inner.registered_doorbell_area()
    }

    fn host_kick(&self, qp_handle: u32) -> Option<HostKick> {
        self.inner.host_kick(qp_handle)
    }

    fn dma(&self) -> &dyn DmaMemory {
        match &self.memory {
            Some(memory) => memory,
            None => self.inner.dma(),
        }
    }

    fn check_alive(&self) -> Result<(), TransportError> {
        self.inner.check_alive()
    }

    fn round_trip_batch(
        &self,
        commands: &mut [(&[u8], &mut [u8])],
    ) -> Result<Vec<usize>, TransportError> {
        self.inner.round_trip_batch(commands)
    }
}

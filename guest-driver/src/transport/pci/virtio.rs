//! Modern virtio-pci (VIRTIO 1.2, 4.1) register access over a [`PciFunction`]: the
//! capability walk, device status, feature negotiation, queue setup, configuration reads,
//! the ISR and queue notifications.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use log::debug;

use super::function::{PciError, PciFunction};
use crate::dma::{DmaMemory, PAGE_SIZE};
use crate::transport::{SharedMemory, TransportError};
use crate::virtq::SplitQueue;
use vrdma_spec::features::{DEVICE_SPECIFIC_MASK, VIRTIO_F_RING_EVENT_IDX, VIRTIO_F_VERSION_1};
use vrdma_spec::shm::VIRTIO_PCI_CAP_SHARED_MEMORY_CFG;
use vrdma_spec::PCI_VENDOR_ID;

/// PCI device IDs a vrdma device may carry: its own (virtio ID 42) and the one QEMU 11.1 can
/// present it under (virtio ID 38, see the spec, 2.1). The configuration magic decides.
pub const VRDMA_DEVICE_IDS: [u16; 2] = [vrdma_spec::PCI_DEVICE_ID, 0x1040 + 38];

/// The `queue_msix_vector` / `config_msix_vector` value for "no vector".
pub const NO_VECTOR: u16 = 0xffff;

/// Device status bits (VIRTIO 1.2, 2.1).
pub mod status {
    /// The driver found the device.
    pub const ACKNOWLEDGE: u8 = 1;
    /// The driver knows how to drive it.
    pub const DRIVER: u8 = 2;
    /// The driver is ready.
    pub const DRIVER_OK: u8 = 4;
    /// Feature negotiation is complete.
    pub const FEATURES_OK: u8 = 8;
    /// The device hit an error it cannot recover from without a reset.
    pub const DEVICE_NEEDS_RESET: u8 = 0x40;
    /// The driver gave up on the device.
    pub const FAILED: u8 = 0x80;
}

/// PCI configuration-space registers and bits the driver uses.
pub mod pci_config {
    /// Vendor ID (le16).
    pub const VENDOR_ID: u16 = 0x00;
    /// Device ID (le16).
    pub const DEVICE_ID: u16 = 0x02;
    /// Command register (le16).
    pub const COMMAND: u16 = 0x04;
    /// Status register (le16).
    pub const STATUS: u16 = 0x06;
    /// Offset of the first capability (u8).
    pub const CAPABILITIES_POINTER: u16 = 0x34;
    /// Command: decode memory BARs.
    pub const COMMAND_MEMORY: u16 = 1 << 1;
    /// Command: the function may master the bus (DMA).
    pub const COMMAND_BUS_MASTER: u16 = 1 << 2;
    /// Command: INTx is masked.
    pub const COMMAND_INTX_DISABLE: u16 = 1 << 10;
    /// Status: a capability list exists.
    pub const STATUS_CAPABILITIES: u16 = 1 << 4;
    /// Capability ID of vendor-specific capabilities (all virtio ones).
    pub const CAP_ID_VENDOR: u8 = 0x09;
}

/// `cfg_type` of the virtio-pci capabilities.
pub mod cap_type {
    /// Common configuration.
    pub const COMMON: u8 = 1;
    /// Notifications.
    pub const NOTIFY: u8 = 2;
    /// ISR status.
    pub const ISR: u8 = 3;
    /// Device-specific configuration.
    pub const DEVICE: u8 = 4;
    /// PCI configuration access (unused: BARs are reached directly).
    pub const PCI_CFG: u8 = 5;
}

/// Offsets in the common configuration structure (`virtio_pci_common_cfg`).
pub mod common {
    /// le32: selects which 32 feature bits `DEVICE_FEATURE` shows.
    pub const DEVICE_FEATURE_SELECT: u64 = 0x00;
    /// le32, read-only.
    pub const DEVICE_FEATURE: u64 = 0x04;
    /// le32: selects which 32 feature bits `DRIVER_FEATURE` sets.
    pub const DRIVER_FEATURE_SELECT: u64 = 0x08;
    /// le32.
    pub const DRIVER_FEATURE: u64 = 0x0c;
    /// le16.
    pub const CONFIG_MSIX_VECTOR: u64 = 0x10;
    /// le16, read-only.
    pub const NUM_QUEUES: u64 = 0x12;
    /// u8.
    pub const DEVICE_STATUS: u64 = 0x14;
    /// u8, read-only.
    pub const CONFIG_GENERATION: u64 = 0x15;
    /// le16.
    pub const QUEUE_SELECT: u64 = 0x16;
    /// le16: the device's maximum on read, the driver's choice on write.
    pub const QUEUE_SIZE: u64 = 0x18;
    /// le16.
    pub const QUEUE_MSIX_VECTOR: u64 = 0x1a;
    /// le16.
    pub const QUEUE_ENABLE: u64 = 0x1c;
    /// le16, read-only.
    pub const QUEUE_NOTIFY_OFF: u64 = 0x1e;
    /// le64 (written as two le32, low first).
    pub const QUEUE_DESC: u64 = 0x20;
    /// le64: the available ring.
    pub const QUEUE_DRIVER: u64 = 0x28;
    /// le64: the used ring.
    pub const QUEUE_DEVICE: u64 = 0x30;
    /// Size of the structure up to `queue_device` inclusive.
    pub const LEN: u64 = 0x38;
}

/// ISR bit: a virtqueue has been used.
pub const ISR_QUEUE: u8 = 1;
/// ISR bit: the configuration (or the device status) changed.
pub const ISR_CONFIG: u8 = 2;

/// How long a reset may take before the device is declared broken.
const RESET_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the configuration is re-read while the device keeps changing it.
const CONFIG_READ_ATTEMPTS: u32 = 100;

/// A range of one BAR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BarRange {
    /// BAR index.
    pub bar: u8,
    /// Offset inside the BAR.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// Where each virtio structure lives, as the capabilities say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Common configuration.
    pub common: BarRange,
    /// Notification area.
    pub notify: BarRange,
    /// `notify_off_multiplier`.
    pub notify_multiplier: u32,
    /// ISR status byte.
    pub isr: BarRange,
    /// Device-specific configuration.
    pub device: BarRange,
    /// Shared-memory region 0, if the device has one.
    pub shared_memory: Option<BarRange>,
}

/// The notification address of one queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotifyAddress {
    bar: u8,
    offset: u64,
    queue: u16,
}

/// A PCI error seen while doing `what`, as a transport error.
pub(crate) fn pci_failure(what: &'static str) -> impl FnOnce(PciError) -> TransportError {
    move |e| TransportError::Io {
        what,
        source: std::io::Error::other(e),
    }
}

/// Reads the capability list of `function`.
pub fn read_capabilities(function: &dyn PciFunction) -> Result<Capabilities, TransportError> {
    let read = |offset: u16, buf: &mut [u8]| {
        function
            .config_read(offset, buf)
            .map_err(pci_failure("reading the PCI capabilities"))
    };
    let config_u8 = |offset: u16| -> Result<u8, TransportError> {
        let mut b = [0u8; 1];
        read(offset, &mut b)?;
        Ok(b[0])
    };
    let config_u32 = |offset: u16| -> Result<u32, TransportError> {
        let mut b = [0u8; 4];
        read(offset, &mut b)?;
        Ok(u32::from_le_bytes(b))
    };
    let mut status = [0u8; 2];
    read(pci_config::STATUS, &mut status)?;
    if u16::from_le_bytes(status) & pci_config::STATUS_CAPABILITIES == 0 {
        return Err(TransportError::Unsupported("a PCI capability list"));
    }
    let (mut common, mut notify, mut isr, mut device, mut shared_memory) =
        (None, None, None, None, None);
    let mut notify_multiplier = 0;
    let mut next = config_u8(pci_config::CAPABILITIES_POINTER)? & !3;
    // 48 capabilities of 4 bytes fill the 192 bytes after the header: a longer walk loops.
    for _ in 0..48 {
        if next == 0 {
            break;
        }
        let at = u16::from(next);
        let id = config_u8(at)?;
        next = config_u8(at + 1)? & !3;
        if id != pci_config::CAP_ID_VENDOR {
            continue;
        }
        let cap_len = config_u8(at + 2)?;
        let cfg_type = config_u8(at + 3)?;
        let bar = config_u8(at + 4)?;
        let cap_id = config_u8(at + 5)?;
        if cap_len < 16 || bar > 5 {
            debug!("skipping virtio capability {cfg_type} at {at:#x}: length {cap_len}, BAR {bar}");
            continue;
        }
        let mut range = BarRange {
            bar,
            offset: u64::from(config_u32(at + 8)?),
            len: u64::from(config_u32(at + 12)?),
        };
        // The first capability of each type wins (VIRTIO 1.2, 4.1.4: the driver SHOULD use
        // the first one it can use).
        match cfg_type {
            cap_type::COMMON if common.is_none() => common = Some(range),
            cap_type::NOTIFY if notify.is_none() && cap_len >= 20 => {
                notify_multiplier = config_u32(at + 16)?;
                notify = Some(range);
            }
            cap_type::ISR if isr.is_none() => isr = Some(range),
            cap_type::DEVICE if device.is_none() => device = Some(range),
            VIRTIO_PCI_CAP_SHARED_MEMORY_CFG
                if shared_memory.is_none()
                    && cap_id == vrdma_spec::shm::QUEUE_REGION_ID
                    && cap_len >= 24 =>
            {
                range.offset |= u64::from(config_u32(at + 16)?) << 32;
                range.len |= u64::from(config_u32(at + 20)?) << 32;
                shared_memory = Some(range);
            }
            _ => {}
        }
    }
    let required = |range: Option<BarRange>, what: &'static str| {
        range.ok_or(TransportError::Unsupported(what))
    };
    let common = required(common, "a virtio-pci common configuration capability")?;
    if common.len < common::LEN {
        return Err(TransportError::DeviceFailure(format!(
            "the common configuration is {} bytes long",
            common.len
        )));
    }
    Ok(Capabilities {
        common,
        notify: required(notify, "a virtio-pci notification capability")?,
        notify_multiplier,
        isr: required(isr, "a virtio-pci ISR capability")?,
        device: required(device, "a virtio-pci device configuration capability")?,
        shared_memory,
    })
}

/// A modern virtio-pci device.
pub struct VirtioPci {
    function: Arc<dyn PciFunction>,
    caps: Capabilities,
}

impl VirtioPci {
    /// Checks that `function` is a virtio device with a vrdma device ID, turns on memory
    /// decoding and bus mastering, and finds its virtio structures.
    pub fn probe(function: Arc<dyn PciFunction>) -> Result<Self, TransportError> {
        let failure = pci_failure("reading the PCI IDs");
        let mut ids = [0u8; 4];
        function
            .config_read(pci_config::VENDOR_ID, &mut ids)
            .map_err(failure)?;
        let vendor = u16::from_le_bytes([ids[0], ids[1]]);
        let device = u16::from_le_bytes([ids[2], ids[3]]);
        if vendor != PCI_VENDOR_ID || !VRDMA_DEVICE_IDS.contains(&device) {
            return Err(TransportError::DeviceFailure(format!(
                "PCI function {vendor:04x}:{device:04x} is not a vrdma device"
            )));
        }
        let mut command = [0u8; 2];
        function
            .config_read(pci_config::COMMAND, &mut command)
            .map_err(pci_failure("reading the PCI command register"))?;
        let command = (u16::from_le_bytes(command)
            | pci_config::COMMAND_MEMORY
            | pci_config::COMMAND_BUS_MASTER)
            & !pci_config::COMMAND_INTX_DISABLE;
        function
            .config_write(pci_config::COMMAND, &command.to_le_bytes())
            .map_err(pci_failure("enabling memory space and bus mastering"))?;
        let caps = read_capabilities(function.as_ref())?;
        debug!("virtio-pci capabilities: {caps:?}");
        Ok(VirtioPci { function, caps })
    }

    /// The PCI function.
    pub fn function(&self) -> &Arc<dyn PciFunction> {
        &self.function
    }

    /// Where the virtio structures are.
    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn read<const N: usize>(
        &self,
        range: BarRange,
        offset: u64,
        what: &'static str,
    ) -> Result<[u8; N], TransportError> {
        let mut buf = [0u8; N];
        check_inside(range, offset, N as u64, what)?;
        self.function
            .bar_read(range.bar, range.offset + offset, &mut buf)
            .map_err(pci_failure(what))?;
        Ok(buf)
    }

    fn write(
        &self,
        range: BarRange,
        offset: u64,
        data: &[u8],
        what: &'static str,
    ) -> Result<(), TransportError> {
        check_inside(range, offset, data.len() as u64, what)?;
        self.function
            .bar_write(range.bar, range.offset + offset, data)
            .map_err(pci_failure(what))
    }

    fn common_u8(&self, offset: u64) -> Result<u8, TransportError> {
        Ok(self.read::<1>(self.caps.common, offset, "reading the common configuration")?[0])
    }

    fn common_u16(&self, offset: u64) -> Result<u16, TransportError> {
        let bytes = self.read(self.caps.common, offset, "reading the common configuration")?;
        Ok(u16::from_le_bytes(bytes))
    }

    fn common_u32(&self, offset: u64) -> Result<u32, TransportError> {
        let bytes = self.read(self.caps.common, offset, "reading the common configuration")?;
        Ok(u32::from_le_bytes(bytes))
    }

    fn set_common(&self, offset: u64, data: &[u8]) -> Result<(), TransportError> {
        self.write(
            self.caps.common,
            offset,
            data,
            "writing the common configuration",
        )
    }

    /// The device status.
    pub fn status(&self) -> Result<u8, TransportError> {
        self.common_u8(common::DEVICE_STATUS)
    }

    /// Adds `bits` to the device status.
    pub fn add_status(&self, bits: u8) -> Result<(), TransportError> {
        let current = self.status()?;
        self.set_common(common::DEVICE_STATUS, &[current | bits])
    }

    /// Resets the device and waits until it reads back as reset: the device then forgets the
    /// queues, and the backend everything it held for this driver.
    pub fn reset(&self) -> Result<(), TransportError> {
        self.set_common(common::DEVICE_STATUS, &[0])?;
        let deadline = Instant::now() + RESET_TIMEOUT;
        loop {
            if self.status()? == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(TransportError::Timeout(RESET_TIMEOUT));
            }
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// All 64 feature bits the device offers.
    pub fn device_features(&self) -> Result<u64, TransportError> {
        let mut features = 0;
        for select in 0..2u32 {
            self.set_common(common::DEVICE_FEATURE_SELECT, &select.to_le_bytes())?;
            features |= u64::from(self.common_u32(common::DEVICE_FEATURE)?) << (32 * select);
        }
        Ok(features)
    }

    /// Negotiates features: VIRTIO_F_VERSION_1 (required), VIRTIO_F_RING_EVENT_IDX if
    /// offered, and the offered device-specific bits among `accepted_device` (bits 0..=23).
    /// Sets FEATURES_OK and checks that the device kept it. Returns the negotiated bits.
    pub fn negotiate(&self, accepted_device: u64) -> Result<u64, TransportError> {
        let offered = self.device_features()?;
        if offered & VIRTIO_F_VERSION_1 == 0 {
            return Err(TransportError::Unsupported("VIRTIO_F_VERSION_1"));
        }
        let wanted =
            VIRTIO_F_VERSION_1 | VIRTIO_F_RING_EVENT_IDX | (accepted_device & DEVICE_SPECIFIC_MASK);
        let acked = offered & wanted;
        for select in 0..2u32 {
            let bits = (acked >> (32 * select)) as u32;
            self.set_common(common::DRIVER_FEATURE_SELECT, &select.to_le_bytes())?;
            self.set_common(common::DRIVER_FEATURE, &bits.to_le_bytes())?;
        }
        self.add_status(status::FEATURES_OK)?;
        if self.status()? & status::FEATURES_OK == 0 {
            return Err(TransportError::DeviceFailure(format!(
                "the device refused the features {acked:#x}"
            )));
        }
        debug!("virtio features: offered {offered:#x}, negotiated {acked:#x}");
        Ok(acked)
    }

    /// Number of virtqueues the device has.
    pub fn num_queues(&self) -> Result<u16, TransportError> {
        self.common_u16(common::NUM_QUEUES)
    }

    /// Sets up and enables virtqueue `index` with at most `max_size` entries (a power of two)
    /// in `dma`, without an MSI-X vector. Returns the queue and its notification address.
    pub fn set_up_queue(
        &self,
        dma: &dyn DmaMemory,
        index: u16,
        max_size: u16,
        event_idx: bool,
    ) -> Result<(SplitQueue, NotifyAddress), TransportError> {
        self.set_common(common::QUEUE_SELECT, &index.to_le_bytes())?;
        let device_max = self.common_u16(common::QUEUE_SIZE)?;
        let size = power_of_two_at_most(device_max.min(max_size));
        if size == 0 {
            return Err(TransportError::DeviceFailure(format!(
                "virtqueue {index} is not available (size {device_max})"
            )));
        }
        if self.common_u16(common::QUEUE_ENABLE)? != 0 {
            return Err(TransportError::DeviceFailure(format!(
                "virtqueue {index} is enabled before setup"
            )));
        }
        let queue = SplitQueue::new(dma, size, event_idx)?;
        let rings = queue.guest_addresses();
        self.set_common(common::QUEUE_SIZE, &size.to_le_bytes())?;
        self.set_common(common::QUEUE_MSIX_VECTOR, &NO_VECTOR.to_le_bytes())?;
        for (offset, address) in [
            (common::QUEUE_DESC, rings.desc),
            (common::QUEUE_DRIVER, rings.avail),
            (common::QUEUE_DEVICE, rings.used),
        ] {
            // Two 32-bit writes, low half first: what every device must accept.
            self.set_common(offset, &(address as u32).to_le_bytes())?;
            self.set_common(offset + 4, &((address >> 32) as u32).to_le_bytes())?;
        }
        let notify_off = self.common_u16(common::QUEUE_NOTIFY_OFF)?;
        let notify = self.notify_address(index, notify_off)?;
        self.set_common(common::QUEUE_ENABLE, &1u16.to_le_bytes())?;
        debug!("virtqueue {index}: {size} entries, rings {rings:?}, notify {notify:?}");
        Ok((queue, notify))
    }

    fn notify_address(&self, queue: u16, notify_off: u16) -> Result<NotifyAddress, TransportError> {
        let offset = u64::from(notify_off) * u64::from(self.caps.notify_multiplier);
        check_inside(
            self.caps.notify,
            offset,
            2,
            "the queue notification address",
        )?;
        Ok(NotifyAddress {
            bar: self.caps.notify.bar,
            offset: self.caps.notify.offset + offset,
            queue,
        })
    }

    /// Tells the device that queue `notify` names has new buffers.
    pub fn notify(&self, notify: &NotifyAddress) -> Result<(), TransportError> {
        self.function
            .bar_write(notify.bar, notify.offset, &notify.queue.to_le_bytes())
            .map_err(pci_failure("notifying the device"))
    }

    /// Sets the MSI-X vector for configuration changes to "none".
    pub fn disable_config_vector(&self) -> Result<(), TransportError> {
        self.set_common(common::CONFIG_MSIX_VECTOR, &NO_VECTOR.to_le_bytes())
    }

    /// Reads (and so clears) the ISR status; reading it also deasserts INTx.
    pub fn read_isr(&self) -> Result<u8, TransportError> {
        Ok(self.read::<1>(self.caps.isr, 0, "reading the ISR status")?[0])
    }

    /// `len` bytes (a multiple of 4) of device configuration, read as 32-bit registers and
    /// re-read until `config_generation` says they are consistent.
    pub fn read_config(&self, len: usize) -> Result<Vec<u8>, TransportError> {
        if !len.is_multiple_of(4) || len as u64 > self.caps.device.len {
            return Err(TransportError::DeviceFailure(format!(
                "the device configuration is {} bytes long, {len} needed",
                self.caps.device.len
            )));
        }
        let mut config = vec![0u8; len];
        for _ in 0..CONFIG_READ_ATTEMPTS {
            let before = self.common_u8(common::CONFIG_GENERATION)?;
            for (i, word) in config.chunks_exact_mut(4).enumerate() {
                let bytes = self.read::<4>(
                    self.caps.device,
                    4 * i as u64,
                    "reading the device configuration",
                )?;
                word.copy_from_slice(&bytes);
            }
            if self.common_u8(common::CONFIG_GENERATION)? == before {
                return Ok(config);
            }
        }
        Err(TransportError::DeviceFailure(
            "the device configuration keeps changing".into(),
        ))
    }

    /// Shared-memory region 0 as the function provides it; empty if the device has none.
    pub fn shared_memory(&self) -> Result<SharedMemory, TransportError> {
        let Some(range) = self.caps.shared_memory else {
            return Ok(SharedMemory::new(None, 0));
        };
        if range.len == 0 || !range.len.is_multiple_of(PAGE_SIZE as u64) {
            return Err(TransportError::DeviceFailure(format!(
                "shared-memory region of {:#x} bytes",
                range.len
            )));
        }
        self.function
            .bar_region(range.bar, range.offset, range.len)
            .map_err(pci_failure("mapping the shared-memory region"))
    }
}

fn check_inside(
    range: BarRange,
    offset: u64,
    len: u64,
    what: &'static str,
) -> Result<(), TransportError> {
    if offset.checked_add(len).is_some_and(|end| end <= range.len) {
        Ok(())
    } else {
        Err(TransportError::DeviceFailure(format!(
            "{what}: {len} bytes at {offset:#x} leave the {}-byte structure",
            range.len
        )))
    }
}

fn power_of_two_at_most(n: u16) -> u16 {
    match n {
        0 => 0,
        n => 1 << (15 - n.leading_zeros()),
    }
}

/// Whether the device configuration of `function` starts with the vrdma magic "vRDM".
/// Touches nothing but the capability list and that register.
pub fn has_vrdma_magic(function: &dyn PciFunction) -> bool {
    let magic = read_capabilities(function).and_then(|caps| {
        check_inside(caps.device, 0, 4, "the configuration magic")?;
        let mut magic = [0u8; 4];
        function
            .bar_read(caps.device.bar, caps.device.offset, &mut magic)
            .map_err(pci_failure("reading the configuration magic"))?;
        Ok(u32::from_le_bytes(magic))
    });
    match magic {
        Ok(magic) => magic == vrdma_spec::config::MAGIC,
        Err(e) => {
            debug!("no vrdma magic: {e}");
            false
        }
    }
}

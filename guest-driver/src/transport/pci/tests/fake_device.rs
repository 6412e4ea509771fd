//! A small emulated virtio-pci vrdma device for the driver's tests: configuration space with
//! the virtio capabilities, the common configuration registers, ISR, device configuration,
//! notifications, and a control queue that echoes requests back reversed.

use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use crate::dma::{DmaMemory, MemfdRam};
use crate::transport::pci::function::{PciError, PciFunction};
use crate::transport::pci::transport::{PciOptions, PciTransport};
use crate::transport::pci::virtio::{common, status, ISR_QUEUE};
use crate::transport::process::ProcessDma;
use crate::transport::{SharedMemory, TransportError};
use crate::virtq::test_device::{RingDevice, SeenChain};
use crate::virtq::RingAddresses;
use parking_lot::{Mutex, MutexGuard};
use vrdma_spec::config::MAGIC;
use vrdma_spec::features::{
    VIRTIO_F_RING_EVENT_IDX, VIRTIO_F_RING_INDIRECT_DESC, VIRTIO_F_VERSION_1, VRDMA_F_ALL,
};

pub(super) const MODERN_BAR: u8 = 2;
pub(super) const SHM_BAR: u8 = 4;
pub(super) const ISR_OFFSET: u64 = 0x1000;
pub(super) const DEVICE_OFFSET: u64 = 0x2000;
pub(super) const NOTIFY_OFFSET: u64 = 0x3000;
pub(super) const NOTIFY_MULTIPLIER: u32 = 4;
pub(super) const SHM_LEN: u64 = 0x10000;
/// A device-specific bit this driver does not know.
pub(super) const UNKNOWN_DEVICE_FEATURE: u64 = 1 << 20;

#[derive(Clone, Copy, Default, Debug)]
pub(super) struct QueueRegs {
    pub(super) max: u16,
    pub(super) size: u16,
    pub(super) msix: u16,
    pub(super) enable: u16,
    pub(super) desc: u64,
    pub(super) driver: u64,
    pub(super) device: u64,
}

pub(super) struct Regs {
    pub(super) device_feature_select: u32,
    pub(super) driver_feature_select: u32,
    pub(super) offered: u64,
    pub(super) driver_features: u64,
    pub(super) status: u8,
    pub(super) config_msix: u16,
    pub(super) queue_select: u16,
    pub(super) queues: [QueueRegs; 3],
    /// The device's side of each enabled queue.
    pub(super) rings: [Option<RingDevice>; 3],
    pub(super) isr: u8,
    pub(super) generation: u8,
    /// Times the generation changes under a reader, once per read of it.
    pub(super) generation_bumps: u32,
    pub(super) device_config: [u8; 64],
    pub(super) resets: u32,
    pub(super) notifications: Vec<(u64, u16)>,
    pub(super) refuse_features: bool,
    pub(super) stall_commands: bool,
}

pub(super) struct FakeDevice {
    pub(super) config_space: [u8; 256],
    pub(super) regs: Mutex<Regs>,
    pub(super) dma: Arc<ProcessDma>,
    pub(super) shm: Mutex<Vec<u8>>,
}

pub(super) fn put(space: &mut [u8], offset: usize, bytes: &[u8]) {
    space[offset..offset + bytes.len()].copy_from_slice(bytes);
}

/// A virtio capability of `len` bytes at `at`.
pub(super) fn vendor_cap(
    space: &mut [u8],
    at: usize,
    next: u8,
    cfg_type: u8,
    bar: u8,
    range: (u32, u32),
) {
    let len = match cfg_type {
        2 => 20,
        8 => 24,
        _ => 16,
    };
    put(space, at, &[0x09, next, len, cfg_type, bar, 0, 0, 0]);
    put(space, at + 8, &range.0.to_le_bytes());
    put(space, at + 12, &range.1.to_le_bytes());
}

impl FakeDevice {
    pub(super) fn new() -> Arc<Self> {
        let mut space = [0u8; 256];
        put(&mut space, 0, &0x1af4u16.to_le_bytes());
        put(&mut space, 2, &0x1066u16.to_le_bytes());
        put(&mut space, 6, &0x10u16.to_le_bytes());
        put(&mut space, 0x34, &[0x40]);
        // An MSI-X capability first: not a virtio one, to be skipped.
        put(&mut space, 0x40, &[0x11, 0x4c, 0, 0]);
        vendor_cap(&mut space, 0x4c, 0x5c, 1, MODERN_BAR, (0, 0x40));
        vendor_cap(
            &mut space,
            0x5c,
            0x6c,
            3,
            MODERN_BAR,
            (ISR_OFFSET as u32, 4),
        );
        vendor_cap(
            &mut space,
            0x6c,
            0x7c,
            4,
            MODERN_BAR,
            (DEVICE_OFFSET as u32, 64),
        );
        vendor_cap(
            &mut space,
            0x7c,
            0x90,
            2,
            MODERN_BAR,
            (NOTIFY_OFFSET as u32, 0x1000),
        );
        put(&mut space, 0x7c + 16, &NOTIFY_MULTIPLIER.to_le_bytes());
        // Shared-memory region 1 (ignored), then region 0 with the 64-bit high halves used.
        vendor_cap(&mut space, 0x90, 0xa8, 8, SHM_BAR, (0, 0x1000));
        space[0x90 + 5] = 1;
        vendor_cap(&mut space, 0xa8, 0, 8, SHM_BAR, (0x1000, SHM_LEN as u32));
        put(&mut space, 0xa8 + 16, &0u32.to_le_bytes());
        put(&mut space, 0xa8 + 20, &0u32.to_le_bytes());
        let mut device_config = [0u8; 64];
        put(&mut device_config, 0, &MAGIC.to_le_bytes());
        put(&mut device_config, 4, &1u16.to_le_bytes());
        put(&mut device_config, 8, &1u32.to_le_bytes());
        put(&mut device_config, 16, &SHM_LEN.to_le_bytes());
        put(&mut device_config, 28, &12u32.to_le_bytes());
        let queue = QueueRegs {
            max: 128,
            ..QueueRegs::default()
        };
        Arc::new(FakeDevice {
            config_space: space,
            regs: Mutex::new(Regs {
                device_feature_select: 0,
                driver_feature_select: 0,
                offered: VIRTIO_F_VERSION_1
                    | VIRTIO_F_RING_EVENT_IDX
                    | VIRTIO_F_RING_INDIRECT_DESC
                    | VRDMA_F_ALL
                    | UNKNOWN_DEVICE_FEATURE,
                driver_features: 0,
                status: 0x7f,
                config_msix: 0,
                queue_select: 0,
                queues: [queue; 3],
                rings: Default::default(),
                isr: 0,
                generation: 0,
                generation_bumps: 0,
                device_config,
                resets: 0,
                notifications: Vec::new(),
                refuse_features: false,
                stall_commands: false,
            }),
            dma: Arc::new(ProcessDma::new(4 << 20).unwrap()),
            shm: Mutex::new(vec![0; (SHM_LEN + 0x1000) as usize]),
        })
    }

    pub(super) fn regs(&self) -> MutexGuard<'_, Regs> {
        self.regs.lock()
    }

    pub(super) fn ram(&self) -> &Arc<MemfdRam> {
        self.dma.guest_ram()
    }

    /// How many chains the driver has made available on queue `index` in all.
    pub(super) fn posted(&self, index: usize) -> u16 {
        self.regs().rings[index]
            .as_ref()
            .expect("an enabled queue")
            .avail_idx()
    }

    /// Takes the next available chain of queue `index`, if it is enabled and has one.
    pub(super) fn pop(&self, regs: &mut Regs, index: usize) -> Option<SeenChain> {
        let ring = regs.rings[index].as_mut()?;
        let chain = ring.pop()?;
        // EVENT_IDX: ask for a notification when the next chain is made available.
        ring.set_avail_event(ring.next_avail());
        Some(chain)
    }

    pub(super) fn push_used(&self, regs: &mut Regs, index: usize, head: u16, len: u32) {
        let ring = regs.rings[index].as_mut().expect("an enabled queue");
        ring.push_used(u32::from(head), len);
        regs.isr |= ISR_QUEUE;
    }

    /// Answers every pending command with its request bytes reversed.
    pub(super) fn serve_controlq(&self, regs: &mut Regs) {
        if regs.stall_commands {
            return;
        }
        while let Some((head, chain)) = self.pop(regs, 0) {
            let ring = regs.rings[0].as_ref().expect("an enabled queue");
            let mut request = Vec::new();
            let mut writable = Vec::new();
            for (addr, len, flags) in chain {
                if flags & 2 == 0 {
                    request.extend(ring.read(addr, len));
                } else {
                    writable.push((addr, len as usize));
                }
            }
            request.reverse();
            let mut written = 0;
            for (addr, len) in writable {
                let part = &request[written.min(request.len())..(written + len).min(request.len())];
                ring.write(addr, part);
                written += part.len();
            }
            self.push_used(regs, 0, head, written as u32);
        }
    }

    /// Delivers `event` into the next eventq buffer.
    pub(super) fn deliver_event(&self, event: &[u8]) {
        let mut regs = self.regs();
        let (head, chain) = self.pop(&mut regs, 1).expect("an eventq buffer");
        let (addr, len, flags) = chain[0];
        assert_eq!(flags, 2, "eventq buffers are device-writable");
        assert!(len as usize >= event.len());
        regs.rings[1]
            .as_ref()
            .expect("an enabled queue")
            .write(addr, event);
        self.push_used(&mut regs, 1, head, event.len() as u32);
    }

    pub(super) fn common_read(&self, regs: &mut Regs, offset: u64, len: usize) -> u64 {
        let q = regs.queues.get(usize::from(regs.queue_select)).copied();
        let q = q.unwrap_or_default();
        let value = match (offset, len) {
            (common::DEVICE_FEATURE_SELECT, 4) => u64::from(regs.device_feature_select),
            (common::DEVICE_FEATURE, 4) => match regs.device_feature_select {
                0 => regs.offered & 0xffff_ffff,
                1 => regs.offered >> 32,
                _ => 0,
            },
            (common::NUM_QUEUES, 2) => 3,
            (common::DEVICE_STATUS, 1) => u64::from(regs.status),
            (common::CONFIG_GENERATION, 1) => {
                if regs.generation_bumps > 0 {
                    regs.generation_bumps -= 1;
                    regs.generation = regs.generation.wrapping_add(1);
                }
                u64::from(regs.generation)
            }
            (common::QUEUE_SELECT, 2) => u64::from(regs.queue_select),
            (common::QUEUE_SIZE, 2) => u64::from(if q.size == 0 { q.max } else { q.size }),
            (common::QUEUE_ENABLE, 2) => u64::from(q.enable),
            (common::QUEUE_NOTIFY_OFF, 2) => u64::from(regs.queue_select),
            _ => panic!("unexpected common read of {len} bytes at {offset:#x}"),
        };
        value
    }

    pub(super) fn common_write(&self, regs: &mut Regs, offset: u64, value: u64, len: usize) {
        let select = usize::from(regs.queue_select);
        let half = |old: u64, high: bool| {
            if high {
                (old & 0xffff_ffff) | (value << 32)
            } else {
                (old & !0xffff_ffff) | value
            }
        };
        match (offset, len) {
            (common::DEVICE_FEATURE_SELECT, 4) => regs.device_feature_select = value as u32,
            (common::DRIVER_FEATURE_SELECT, 4) => regs.driver_feature_select = value as u32,
            (common::DRIVER_FEATURE, 4) => match regs.driver_feature_select {
                0 => regs.driver_features = (regs.driver_features & !0xffff_ffff) | value,
                1 => regs.driver_features = (regs.driver_features & 0xffff_ffff) | (value << 32),
                _ => {}
            },
            (common::CONFIG_MSIX_VECTOR, 2) => regs.config_msix = value as u16,
            (common::DEVICE_STATUS, 1) => self.write_status(regs, value as u8),
            (common::QUEUE_SELECT, 2) => regs.queue_select = value as u16,
            (common::QUEUE_SIZE, 2) => regs.queues[select].size = value as u16,
            (common::QUEUE_MSIX_VECTOR, 2) => regs.queues[select].msix = value as u16,
            (common::QUEUE_ENABLE, 2) => {
                let q = &mut regs.queues[select];
                q.enable = value as u16;
                let rings = RingAddresses {
                    desc: q.desc,
                    avail: q.driver,
                    used: q.device,
                };
                regs.rings[select] =
                    (value != 0).then(|| RingDevice::at(self.ram(), rings, q.size));
            }
            (o, 4) if (common::QUEUE_DESC..common::QUEUE_DEVICE + 8).contains(&o) => {
                let q = &mut regs.queues[select];
                let high = o % 8 == 4;
                match o & !7 {
                    common::QUEUE_DESC => q.desc = half(q.desc, high),
                    common::QUEUE_DRIVER => q.driver = half(q.driver, high),
                    _ => q.device = half(q.device, high),
                }
            }
            _ => panic!("unexpected common write of {len} bytes at {offset:#x}"),
        }
    }

    pub(super) fn write_status(&self, regs: &mut Regs, value: u8) {
        if value == 0 {
            for queue in &mut regs.queues {
                *queue = QueueRegs {
                    max: queue.max,
                    ..QueueRegs::default()
                };
            }
            regs.rings = Default::default();
            regs.status = 0;
            regs.driver_features = 0;
            regs.isr = 0;
            regs.resets += 1;
            return;
        }
        let mut value = value;
        if value & status::FEATURES_OK != 0 && regs.status & status::FEATURES_OK == 0 {
            let acceptable = regs.driver_features & !regs.offered == 0
                && regs.driver_features & VIRTIO_F_VERSION_1 != 0;
            if regs.refuse_features || !acceptable {
                value &= !status::FEATURES_OK;
            }
        }
        regs.status = value;
    }
}

pub(super) fn value_of(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(word)
}

impl PciFunction for FakeDevice {
    fn config_read(&self, offset: u16, buf: &mut [u8]) -> Result<(), PciError> {
        let offset = usize::from(offset);
        buf.copy_from_slice(&self.config_space[offset..offset + buf.len()]);
        Ok(())
    }

    fn config_write(&self, offset: u16, data: &[u8]) -> Result<(), PciError> {
        // Only the command register is written; its value is checked through the reads.
        assert_eq!((offset, data.len()), (4, 2), "unexpected config write");
        let command = u16::from_le_bytes([data[0], data[1]]);
        assert_eq!(command & 0x6, 0x6, "memory space and bus master on");
        assert_eq!(command & 0x400, 0, "INTx not masked");
        Ok(())
    }

    fn bar_read(&self, bar: u8, offset: u64, buf: &mut [u8]) -> Result<(), PciError> {
        assert_eq!(bar, MODERN_BAR);
        let mut regs = self.regs();
        let value = match offset {
            0..0x40 => self.common_read(&mut regs, offset, buf.len()),
            ISR_OFFSET => u64::from(std::mem::take(&mut regs.isr)),
            o if (DEVICE_OFFSET..DEVICE_OFFSET + 64).contains(&o) => {
                let start = (o - DEVICE_OFFSET) as usize;
                value_of(&regs.device_config[start..start + buf.len()])
            }
            _ => panic!("unexpected BAR read at {offset:#x}"),
        };
        buf.copy_from_slice(&value.to_le_bytes()[..buf.len()]);
        Ok(())
    }

    fn bar_write(&self, bar: u8, offset: u64, data: &[u8]) -> Result<(), PciError> {
        assert_eq!(bar, MODERN_BAR);
        let mut regs = self.regs();
        let value = value_of(data);
        match offset {
            0..0x40 => self.common_write(&mut regs, offset, value, data.len()),
            o if (NOTIFY_OFFSET..NOTIFY_OFFSET + 0x1000).contains(&o) => {
                assert_eq!(data.len(), 2, "notifications are 16-bit writes");
                regs.notifications.push((o - NOTIFY_OFFSET, value as u16));
                if value == 0 {
                    self.serve_controlq(&mut regs);
                }
            }
            _ => panic!("unexpected BAR write at {offset:#x}"),
        }
        Ok(())
    }

    fn bar_region(&self, bar: u8, offset: u64, len: u64) -> Result<SharedMemory, PciError> {
        assert_eq!((bar, offset, len), (SHM_BAR, 0x1000, SHM_LEN));
        let mut shm = self.shm.lock();
        let base = NonNull::new(shm[offset as usize..].as_mut_ptr());
        Ok(SharedMemory::new(base, len as usize))
    }

    fn dma(&self) -> Arc<dyn DmaMemory> {
        self.dma.clone()
    }

    fn wait_interrupt(&self, timeout: Duration) -> Result<bool, PciError> {
        if self.regs().isr != 0 {
            return Ok(true);
        }
        std::thread::sleep(timeout.min(Duration::from_millis(1)));
        Ok(false)
    }
}

pub(super) fn open(device: &Arc<FakeDevice>) -> Result<PciTransport, TransportError> {
    let options = PciOptions {
        command_timeout: Duration::from_millis(200),
        ..PciOptions::default()
    };
    PciTransport::open(device.clone(), options)
}

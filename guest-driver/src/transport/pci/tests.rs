//! The virtio-pci driver against a small emulated device: configuration space with the
//! virtio capabilities, the common configuration registers, ISR, device configuration,
//! notifications, and a control queue that echoes requests back reversed.

use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use super::function::{PciError, PciFunction};
use super::transport::{PciOptions, PciTransport};
use super::virtio::{
    common, read_capabilities, status, BarRange, Capabilities, ISR_CONFIG, ISR_QUEUE, NO_VECTOR,
};
use crate::dma::{DmaMemory, MemfdRam};
use crate::transport::process::ProcessDma;
use crate::transport::{SharedMemory, Transport, TransportError};
use parking_lot::{Mutex, MutexGuard};
use vrdma_spec::config::MAGIC;
use vrdma_spec::features::{
    VIRTIO_F_RING_EVENT_IDX, VIRTIO_F_RING_INDIRECT_DESC, VIRTIO_F_VERSION_1, VRDMA_F_ALL,
};

const MODERN_BAR: u8 = 2;
const SHM_BAR: u8 = 4;
const ISR_OFFSET: u64 = 0x1000;
const DEVICE_OFFSET: u64 = 0x2000;
const NOTIFY_OFFSET: u64 = 0x3000;
const NOTIFY_MULTIPLIER: u32 = 4;
const SHM_LEN: u64 = 0x10000;
/// A device-specific bit this driver does not know.
const UNKNOWN_DEVICE_FEATURE: u64 = 1 << 20;

/// Address, length and flags of one descriptor.
type Descriptor = (u64, u32, u16);

#[derive(Clone, Copy, Default, Debug)]
struct QueueRegs {
    max: u16,
    size: u16,
    msix: u16,
    enable: u16,
    desc: u64,
    driver: u64,
    device: u64,
    /// Device side: next avail entry to take, and used idx.
    next_avail: u16,
    used_idx: u16,
}

struct Regs {
    device_feature_select: u32,
    driver_feature_select: u32,
    offered: u64,
    driver_features: u64,
    status: u8,
    config_msix: u16,
    queue_select: u16,
    queues: [QueueRegs; 3],
    isr: u8,
    generation: u8,
    /// Times the generation changes under a reader, once per read of it.
    generation_bumps: u32,
    device_config: [u8; 64],
    resets: u32,
    notifications: Vec<(u64, u16)>,
    refuse_features: bool,
    stall_commands: bool,
}

struct FakeDevice {
    config_space: [u8; 256],
    regs: Mutex<Regs>,
    dma: Arc<ProcessDma>,
    shm: Mutex<Vec<u8>>,
}

fn put(space: &mut [u8], offset: usize, bytes: &[u8]) {
    space[offset..offset + bytes.len()].copy_from_slice(bytes);
}

/// A virtio capability of `len` bytes at `at`.
fn vendor_cap(space: &mut [u8], at: usize, next: u8, cfg_type: u8, bar: u8, range: (u32, u32)) {
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
    fn new() -> Arc<Self> {
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

    fn regs(&self) -> MutexGuard<'_, Regs> {
        self.regs.lock()
    }

    fn ram(&self) -> &Arc<MemfdRam> {
        self.dma.guest_ram()
    }

    fn at(&self, gpa: u64) -> *mut u8 {
        let ram = self.ram();
        let offset = usize::try_from(gpa - ram.guest_base()).unwrap();
        assert!(offset < ram.len(), "device access outside guest RAM");
        // SAFETY: inside the guest RAM mapping (checked above).
        unsafe { ram.host_base().add(offset) }
    }

    fn read_u16(&self, gpa: u64) -> u16 {
        // SAFETY: test device reading guest RAM inside the mapping.
        u16::from_le(unsafe { self.at(gpa).cast::<u16>().read_volatile() })
    }

    fn write_u16(&self, gpa: u64, value: u16) {
        // SAFETY: test device writing guest RAM inside the mapping.
        unsafe { self.at(gpa).cast::<u16>().write_volatile(value.to_le()) }
    }

    /// Descriptors of the chain at `head` of queue `q`.
    fn chain(&self, q: &QueueRegs, head: u16) -> Vec<Descriptor> {
        let mut chain = Vec::new();
        let mut index = head;
        loop {
            let d = q.desc + 16 * u64::from(index);
            // SAFETY: test device reading a descriptor in guest RAM.
            let (addr, len) = unsafe {
                (
                    self.at(d).cast::<u64>().read_volatile(),
                    self.at(d + 8).cast::<u32>().read_volatile(),
                )
            };
            let flags = self.read_u16(d + 12);
            chain.push((addr, len, flags));
            if flags & 1 == 0 {
                return chain;
            }
            index = self.read_u16(d + 14);
        }
    }

    /// Takes the next available chain of queue `index`, if any.
    fn pop(&self, regs: &mut Regs, index: usize) -> Option<(u16, Vec<Descriptor>)> {
        let q = regs.queues[index];
        if q.enable == 0 || self.read_u16(q.driver + 2) == q.next_avail {
            return None;
        }
        let slot = u64::from(q.next_avail % q.size);
        let head = self.read_u16(q.driver + 4 + 2 * slot);
        regs.queues[index].next_avail = q.next_avail.wrapping_add(1);
        // EVENT_IDX: ask for a notification when the next chain is made available.
        self.write_u16(
            q.device + 4 + 8 * u64::from(q.size),
            q.next_avail.wrapping_add(1),
        );
        Some((head, self.chain(&q, head)))
    }

    fn push_used(&self, regs: &mut Regs, index: usize, head: u16, len: u32) {
        let q = regs.queues[index];
        let entry = q.device + 4 + 8 * u64::from(q.used_idx % q.size);
        // SAFETY: test device writing a used entry in guest RAM.
        unsafe {
            self.at(entry).cast::<u32>().write_volatile(u32::from(head));
            self.at(entry + 4).cast::<u32>().write_volatile(len);
        }
        regs.queues[index].used_idx = q.used_idx.wrapping_add(1);
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        self.write_u16(q.device + 2, regs.queues[index].used_idx);
        regs.isr |= ISR_QUEUE;
    }

    /// Answers every pending command with its request bytes reversed.
    fn serve_controlq(&self, regs: &mut Regs) {
        if regs.stall_commands {
            return;
        }
        while let Some((head, chain)) = self.pop(regs, 0) {
            let mut request = Vec::new();
            let mut writable = Vec::new();
            for (addr, len, flags) in chain {
                if flags & 2 == 0 {
                    for i in 0..u64::from(len) {
                        // SAFETY: test device reading a request byte.
                        request.push(unsafe { self.at(addr + i).read_volatile() });
                    }
                } else {
                    writable.push((addr, len));
                }
            }
            request.reverse();
            let mut written = 0;
            for (addr, len) in writable {
                for i in 0..u64::from(len) {
                    if let Some(&byte) = request.get(written) {
                        // SAFETY: test device writing a response byte.
                        unsafe { self.at(addr + i).write_volatile(byte) };
                        written += 1;
                    }
                }
            }
            self.push_used(regs, 0, head, written as u32);
        }
    }

    /// Delivers `event` into the next eventq buffer.
    fn deliver_event(&self, event: &[u8]) {
        let mut regs = self.regs();
        let (head, chain) = self.pop(&mut regs, 1).expect("an eventq buffer");
        let (addr, len, flags) = chain[0];
        assert_eq!(flags, 2, "eventq buffers are device-writable");
        assert!(len as usize >= event.len());
        for (i, &byte) in event.iter().enumerate() {
            // SAFETY: test device writing an event byte.
            unsafe { self.at(addr + i as u64).write_volatile(byte) };
        }
        self.push_used(&mut regs, 1, head, event.len() as u32);
    }

    fn common_read(&self, regs: &mut Regs, offset: u64, len: usize) -> u64 {
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

    fn common_write(&self, regs: &mut Regs, offset: u64, value: u64, len: usize) {
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
            (common::QUEUE_ENABLE, 2) => regs.queues[select].enable = value as u16,
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

    fn write_status(&self, regs: &mut Regs, value: u8) {
        if value == 0 {
            for queue in &mut regs.queues {
                *queue = QueueRegs {
                    max: queue.max,
                    ..QueueRegs::default()
                };
            }
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

fn value_of(bytes: &[u8]) -> u64 {
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

fn open(device: &Arc<FakeDevice>) -> Result<PciTransport, TransportError> {
    let options = PciOptions {
        command_timeout: Duration::from_millis(200),
        ..PciOptions::default()
    };
    PciTransport::open(device.clone(), options)
}

#[test]
fn the_capability_walk_finds_every_structure() {
    let device = FakeDevice::new();
    let caps = read_capabilities(device.as_ref()).unwrap();
    let bar = |offset, len| BarRange {
        bar: MODERN_BAR,
        offset,
        len,
    };
    assert_eq!(
        caps,
        Capabilities {
            common: bar(0, 0x40),
            notify: bar(NOTIFY_OFFSET, 0x1000),
            notify_multiplier: NOTIFY_MULTIPLIER,
            isr: bar(ISR_OFFSET, 4),
            device: bar(DEVICE_OFFSET, 64),
            shared_memory: Some(BarRange {
                bar: SHM_BAR,
                offset: 0x1000,
                len: SHM_LEN
            }),
        }
    );
}

#[test]
fn the_64_bit_halves_of_a_shared_memory_capability_count() {
    let mut device = FakeDevice::new();
    let space = &mut Arc::get_mut(&mut device).unwrap().config_space;
    put(space, 0xa8 + 16, &2u32.to_le_bytes());
    put(space, 0xa8 + 20, &1u32.to_le_bytes());
    let caps = read_capabilities(device.as_ref()).unwrap();
    let shm = caps.shared_memory.unwrap();
    assert_eq!(
        (shm.offset, shm.len),
        ((2 << 32) | 0x1000, (1 << 32) | SHM_LEN)
    );
}

#[test]
fn open_negotiates_and_sets_up_the_queues() {
    let device = FakeDevice::new();
    {
        let mut regs = device.regs();
        regs.queues[2].max = 100;
        // Two generation changes under the first configuration read: read again.
        regs.generation_bumps = 2;
    }
    let transport = open(&device).unwrap();
    let regs = device.regs();
    assert_eq!(regs.resets, 1);
    assert_eq!(
        regs.status,
        status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK
    );
    assert_eq!(
        regs.driver_features,
        VIRTIO_F_VERSION_1 | VIRTIO_F_RING_EVENT_IDX | VRDMA_F_ALL
    );
    assert_eq!(transport.device_features(), VRDMA_F_ALL);
    assert_eq!(regs.config_msix, NO_VECTOR);
    let dma = device.dma.guest_ram();
    for (index, size) in [(0, 128), (1, 128), (2, 64)] {
        let q = regs.queues[index];
        assert_eq!(
            (q.size, q.msix, q.enable),
            (size, NO_VECTOR, 1),
            "queue {index}"
        );
        assert!(q.desc >= dma.guest_base() && q.desc.is_multiple_of(4096));
        assert_eq!(q.driver, q.desc + 16 * u64::from(size));
        assert!(q.device > q.driver && q.device.is_multiple_of(4));
    }
    // The event queue got its buffers and one notification at its own address.
    assert_eq!(device.read_u16(regs.queues[1].driver + 2), 64);
    assert_eq!(regs.notifications, vec![(u64::from(NOTIFY_MULTIPLIER), 1)]);
    assert_eq!(transport.device_config(), &regs.device_config[..]);
    let shm = transport.shared_memory();
    assert_eq!(shm.len(), SHM_LEN as usize);
    assert!(shm.base().is_some());
}

#[test]
fn the_rings_stay_allocated_while_the_device_may_use_them() {
    let device = FakeDevice::new();
    let transport = open(&device).unwrap();
    let rings: Vec<(u64, u64)> = {
        let regs = device.regs();
        regs.queues[..3]
            .iter()
            .map(|q| (q.desc, q.device + 4 + 8 * u64::from(q.size) + 2))
            .collect()
    };
    // Memory handed out later must never be a ring the device was given, the doorbell
    // queue's included (the driver posts nothing there, but the device writes its
    // `avail_event`).
    let dma = transport.dma();
    let mut buffers = Vec::new();
    while let Ok(buffer) = dma.alloc(4096, 4096) {
        let gpa = dma.translate(buffer.as_ptr(), 4096).unwrap()[0];
        for &(start, end) in &rings {
            assert!(
                gpa + 4096 <= start || gpa >= end,
                "buffer at {gpa:#x} overlaps a ring at {start:#x}..{end:#x}"
            );
        }
        buffers.push(buffer);
    }
    assert!(!buffers.is_empty());
}

#[test]
fn a_refused_feature_set_fails_the_open() {
    let device = FakeDevice::new();
    device.regs().refuse_features = true;
    let error = open(&device).err().expect("open fails");
    assert!(
        error.to_string().contains("refused the features"),
        "{error}"
    );
    let regs = device.regs();
    assert_ne!(regs.status & status::FAILED, 0);
    assert_eq!(regs.status & status::DRIVER_OK, 0);
}

#[test]
fn a_device_without_version_1_is_refused() {
    let device = FakeDevice::new();
    device.regs().offered &= !VIRTIO_F_VERSION_1;
    assert!(matches!(
        open(&device),
        Err(TransportError::Unsupported("VIRTIO_F_VERSION_1"))
    ));
    assert_eq!(device.regs().status & status::FEATURES_OK, 0);
}

#[test]
fn a_foreign_configuration_is_refused_before_driver_ok() {
    for (offset, bytes) in [(0, *b"vRDX"), (4, [2, 0, 0, 0])] {
        let device = FakeDevice::new();
        put(&mut device.regs().device_config, offset, &bytes);
        assert!(open(&device).is_err());
        let regs = device.regs();
        assert_ne!(regs.status & status::FAILED, 0);
        assert_eq!(regs.status & status::DRIVER_OK, 0);
    }
}

#[test]
fn commands_events_and_doorbells_reach_the_device() {
    let device = FakeDevice::new();
    let transport = open(&device).unwrap();
    let mut response = [0u8; 16];
    let len = transport.execute(b"abcdef", &mut response).unwrap();
    assert_eq!(&response[..len], b"fedcba");
    // A request larger than the initial page-sized buffers.
    let big: Vec<u8> = (0..10_000).map(|i| i as u8).collect();
    let mut answer = vec![0u8; 10_000];
    assert_eq!(transport.execute(&big, &mut answer).unwrap(), 10_000);
    assert!(answer.iter().rev().eq(big.iter()));

    transport.notify_doorbell().unwrap();
    let doorbell = (2 * u64::from(NOTIFY_MULTIPLIER), 2);
    assert_eq!(device.regs().notifications.last(), Some(&doorbell));

    let mut event = [0u8; 64];
    assert_eq!(
        transport
            .next_event(&mut event, Some(Duration::from_millis(20)))
            .unwrap(),
        None
    );
    let posted = device.read_u16(device.regs().queues[1].driver + 2);
    device.deliver_event(&[7; 16]);
    let len = transport
        .next_event(&mut event, Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(len, Some(16));
    assert_eq!(&event[..16], &[7; 16]);
    // The buffer went back to the device.
    assert_eq!(
        device.read_u16(device.regs().queues[1].driver + 2),
        posted.wrapping_add(1)
    );
}

#[test]
fn events_wake_a_waiter_while_another_thread_waits_on_commands() {
    let device = FakeDevice::new();
    let transport = Arc::new(open(&device).unwrap());
    device.regs().stall_commands = true;
    let commander = {
        let transport = transport.clone();
        std::thread::spawn(move || transport.execute(b"x", &mut [0u8; 4]))
    };
    std::thread::sleep(Duration::from_millis(20));
    device.deliver_event(&[1; 16]);
    let mut event = [0u8; 16];
    assert_eq!(
        transport
            .next_event(&mut event, Some(Duration::from_secs(5)))
            .unwrap(),
        Some(16)
    );
    // The stalled command times out, and the control queue stays unusable.
    assert!(matches!(
        commander.join().unwrap(),
        Err(TransportError::Timeout(_))
    ));
    device.regs().stall_commands = false;
    assert!(matches!(
        transport.execute(b"y", &mut [0u8; 4]),
        Err(TransportError::DeviceFailure(_))
    ));
}

#[test]
fn device_needs_reset_fails_the_waiters() {
    let device = FakeDevice::new();
    let transport = open(&device).unwrap();
    {
        let mut regs = device.regs();
        regs.status |= status::DEVICE_NEEDS_RESET;
        regs.isr |= ISR_CONFIG;
    }
    let result = transport.next_event(&mut [0u8; 16], Some(Duration::from_secs(5)));
    assert!(
        matches!(&result, Err(TransportError::DeviceFailure(m)) if m.contains("reset")),
        "{result:?}"
    );
}

#[test]
fn dropping_the_transport_resets_the_device() {
    let device = FakeDevice::new();
    let transport = open(&device).unwrap();
    assert_eq!(device.regs().resets, 1);
    drop(transport);
    let regs = device.regs();
    assert_eq!(regs.resets, 2);
    assert_eq!(regs.status, 0);
}

/// A sysfs PCI bus in a temporary directory, removed on drop.
struct FakeSysfs {
    root: std::path::PathBuf,
}

impl FakeSysfs {
    fn new(name: &str) -> Self {
        let root = std::env::temp_dir().join(format!("vrdma-sysfs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("devices")).unwrap();
        std::fs::write(root.join("drivers_probe"), "").unwrap();
        FakeSysfs { root }
    }

    /// A function at `address` with IDs `vendor:device`, the virtio capabilities of
    /// [`FakeDevice`], a bound driver, and `magic` in its device configuration.
    fn add(&self, address: &str, ids: (u16, u16), magic: &[u8; 4]) -> std::path::PathBuf {
        let dir = self.root.join("devices").join(address);
        std::fs::create_dir_all(dir.join("driver")).unwrap();
        std::fs::write(dir.join("driver/unbind"), "").unwrap();
        std::fs::write(dir.join("vendor"), format!("{:#06x}\n", ids.0)).unwrap();
        std::fs::write(dir.join("device"), format!("{:#06x}\n", ids.1)).unwrap();
        std::fs::write(dir.join("enable"), "0").unwrap();
        std::fs::write(dir.join("config"), FakeDevice::new().config_space).unwrap();
        let zero = "0x0000000000000000 0x0000000000000000 0x0000000000000000\n";
        let bar2 = "0x00000000fe000000 0x00000000fe003fff 0x0000000000140204\n";
        std::fs::write(
            dir.join("resource"),
            format!("{zero}{zero}{bar2}{zero}{zero}{zero}{zero}"),
        )
        .unwrap();
        let mut bar = vec![0u8; 0x4000];
        put(&mut bar, DEVICE_OFFSET as usize, magic);
        std::fs::write(dir.join("resource2"), bar).unwrap();
        dir
    }

    fn read(&self, path: &str) -> String {
        std::fs::read_to_string(self.root.join(path)).unwrap()
    }
}

impl Drop for FakeSysfs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

#[test]
fn sysfs_discovery_unbinds_checks_the_magic_and_maps_the_bars() {
    use super::sysfs::SysfsPciFunction;
    let sysfs = FakeSysfs::new("discovery");
    sysfs.add("0000:00:01.0", (0x1af4, 0x106a), b"XXXX");
    sysfs.add("0000:00:02.0", (0x8086, 0x1066), b"vRDM");
    let vrdma = sysfs.add("0000:00:03.0", (0x1af4, 0x1066), b"vRDM");
    let dma: Arc<dyn DmaMemory> = Arc::new(ProcessDma::new(1 << 20).unwrap());
    let function = SysfsPciFunction::open_in(&sysfs.root, None, dma.clone()).unwrap();
    assert_eq!(function.address(), "0000:00:03.0");
    // The function without the magic was released and handed back; the other one kept.
    assert_eq!(
        sysfs.read("devices/0000:00:01.0/driver/unbind"),
        "0000:00:01.0"
    );
    assert_eq!(sysfs.read("drivers_probe"), "0000:00:01.0");
    assert_eq!(
        sysfs.read("devices/0000:00:03.0/driver/unbind"),
        "0000:00:03.0"
    );
    assert_eq!(sysfs.read("devices/0000:00:03.0/enable"), "1");
    assert_eq!(sysfs.read("devices/0000:00:02.0/driver/unbind"), "");

    // Registers are the mapped resource file.
    function
        .bar_write(2, 0x18, &0x1234u16.to_le_bytes())
        .unwrap();
    function
        .bar_write(2, 0x20, &u64::MAX.to_le_bytes())
        .unwrap();
    let mut word = [0u8; 4];
    function.bar_read(2, DEVICE_OFFSET, &mut word).unwrap();
    assert_eq!(&word, b"vRDM");
    let file = std::fs::read(vrdma.join("resource2")).unwrap();
    assert_eq!(&file[0x18..0x1a], &[0x34, 0x12]);
    assert_eq!(&file[0x20..0x28], &[0xff; 8]);
    let mut id = [0u8; 2];
    function.config_read(2, &mut id).unwrap();
    assert_eq!(u16::from_le_bytes(id), 0x1066);
    for (bar, offset, len) in [(2, 0x4000, 4), (2, 2, 4), (0, 0, 4), (2, 0, 3), (7, 0, 1)] {
        assert!(
            matches!(
                function.bar_read(bar, offset, &mut vec![0; len]),
                Err(PciError::InvalidAccess(_))
            ),
            "BAR {bar} offset {offset:#x} len {len}"
        );
    }
    let region = function.bar_region(2, 0x1000, 0x3000).unwrap();
    assert_eq!(region.len(), 0x3000);
    assert!(function.bar_region(2, 0x1000, 0x3001).is_err());

    // An explicit address must name a vrdma function.
    let error = SysfsPciFunction::open_in(&sysfs.root, Some("00:02.0"), dma.clone())
        .err()
        .unwrap();
    assert!(matches!(error, PciError::NotFound(_)), "{error}");
    let chosen = SysfsPciFunction::open_in(&sysfs.root, Some("00:03.0"), dma).unwrap();
    assert_eq!(chosen.address(), "0000:00:03.0");
}

#[test]
fn sysfs_discovery_says_what_it_scanned() {
    use super::sysfs::SysfsPciFunction;
    let sysfs = FakeSysfs::new("absent");
    sysfs.add("0000:00:02.0", (0x8086, 0x1234), b"vRDM");
    let dma: Arc<dyn DmaMemory> = Arc::new(ProcessDma::new(1 << 20).unwrap());
    let error = SysfsPciFunction::open_in(&sysfs.root, None, dma.clone())
        .err()
        .unwrap();
    let text = error.to_string();
    assert!(
        text.contains("none of the 1 functions") && text.contains("1af4:106a"),
        "{text}"
    );
    sysfs.add("0000:00:05.0", (0x1af4, 0x1066), b"nope");
    let error = SysfsPciFunction::open_in(&sysfs.root, None, dma)
        .err()
        .unwrap();
    assert!(error.to_string().contains("0000:00:05.0"), "{error}");
}

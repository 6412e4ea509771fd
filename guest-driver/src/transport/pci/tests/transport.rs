//! The virtio-pci transport against the emulated device: the capability walk, feature
//! negotiation and queue setup, commands, events and doorbells, waiters, and reset.

use std::sync::Arc;
use std::time::Duration;

use crate::transport::pci::virtio::{
    read_capabilities, status, BarRange, Capabilities, ISR_CONFIG, NO_VECTOR,
};
use crate::transport::{Transport, TransportError};
use vrdma_spec::features::{
    VIRTIO_F_RING_EVENT_IDX, VIRTIO_F_VERSION_1, VRDMA_F_ALL, VRDMA_F_HOST_KICK,
};

use super::fake_device::*;

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
    // Everything the device offers but the host kick, which a guest cannot make.
    let accepted = VRDMA_F_ALL & !VRDMA_F_HOST_KICK;
    assert_eq!(
        regs.driver_features,
        VIRTIO_F_VERSION_1 | VIRTIO_F_RING_EVENT_IDX | accepted
    );
    assert_eq!(transport.device_features(), accepted);
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
    assert_eq!(regs.rings[1].as_ref().unwrap().avail_idx(), 64);
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
    let len = transport.round_trip(b"abcdef", &mut response).unwrap();
    assert_eq!(&response[..len], b"fedcba");
    // A request larger than the initial page-sized buffers.
    let big: Vec<u8> = (0..10_000).map(|i| i as u8).collect();
    let mut answer = vec![0u8; 10_000];
    assert_eq!(transport.round_trip(&big, &mut answer).unwrap(), 10_000);
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
    let posted = device.posted(1);
    device.deliver_event(&[7; 16]);
    let len = transport
        .next_event(&mut event, Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(len, Some(16));
    assert_eq!(&event[..16], &[7; 16]);
    // The buffer went back to the device.
    assert_eq!(device.posted(1), posted.wrapping_add(1));
}

#[test]
fn events_wake_a_waiter_while_another_thread_waits_on_commands() {
    let device = FakeDevice::new();
    let transport = Arc::new(open(&device).unwrap());
    device.regs().stall_commands = true;
    let commander = {
        let transport = transport.clone();
        std::thread::spawn(move || transport.round_trip(b"x", &mut [0u8; 4]))
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
        transport.round_trip(b"y", &mut [0u8; 4]),
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

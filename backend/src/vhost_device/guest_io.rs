//! What the device logic of one guest can reach of its guest through vhost-user: guest RAM,
//! the shared-memory region, the event queue.

use std::io;

use vm_memory::{GuestAddressSpace, GuestMemoryLoadGuard};

use super::event_queue::EventQueue;
use super::shmem::ShmemMapper;
use crate::memory::guest_ram::{AtomicGuestRam, MappedGuestRam};

/// What a handler can reach of its guest.
pub struct GuestIo {
    memory: AtomicGuestRam,
    shmem: ShmemMapper,
    events: EventQueue,
}

impl GuestIo {
    pub(crate) fn new(
        memory: AtomicGuestRam,
        shmem_size: u64,
        event_capacity: usize,
    ) -> io::Result<Self> {
        Ok(GuestIo {
            memory,
            shmem: ShmemMapper::new(shmem_size),
            events: EventQueue::new(event_capacity)?,
        })
    }

    /// A snapshot of guest RAM. Translating a guest-physical address gives the region's
    /// backing file and offset (`GuestMemoryBackend::find_region`, `file_offset`) and the host
    /// address where this daemon mapped it. Take a new snapshot after
    /// the device handler's `memory_changed`.
    pub fn memory(&self) -> GuestMemoryLoadGuard<MappedGuestRam> {
        self.memory.memory()
    }

    /// Maps host memory into the guest's VIRTIO shared-memory region 0.
    pub fn shmem(&self) -> &ShmemMapper {
        &self.shmem
    }

    /// Queues events for the guest's event queue.
    pub fn events(&self) -> &EventQueue {
        &self.events
    }
}

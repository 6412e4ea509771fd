//! The `VhostUserBackend` impl of [`VhuVrdma`]: what the vhost-user daemon asks of the
//! device (features, configuration space, shared memory, worker layout) and the dispatch of each
//! worker's events to the queue it serves.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use log::{debug, warn};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserShMemConfig};
use vhost::vhost_user::Backend;
use vhost_user_backend::VhostUserBackend;
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use vrdma_spec::features::DEVICE_SPECIFIC_MASK;
use vrdma_spec::queue::{CONTROLQ, DOORBELLQ, EVENTQ, NUM_QUEUES};

use super::handler::DeviceHandler;
use super::vhu_vrdma::{
    VhuVrdma, Vring, CONTROL_LOCAL, CONTROL_WORKER, DOORBELL_LOCAL, EVENTS_WAKE_TOKEN, EVENT_LOCAL,
    FAST_WORKER, FIRST_WATCHED_TOKEN,
};
use crate::memory::guest_ram::AtomicGuestRam;

/// Largest queue size accepted.
pub const MAX_QUEUE_SIZE: usize = 256;
/// Largest configuration space served.
pub const MAX_CONFIG_SIZE: usize = 256;

/// `VHOST_USER_F_PROTOCOL_FEATURES` (virtio feature bit 30 in vhost-user).
const VHOST_USER_F_PROTOCOL_FEATURES: u64 = 1 << 30;

impl<H: DeviceHandler> VhostUserBackend for VhuVrdma<H> {
    type Bitmap = ();
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        usize::from(NUM_QUEUES)
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC)
            | VHOST_USER_F_PROTOCOL_FEATURES
            | (self.handler.device_features() & DEVICE_SPECIFIC_MASK)
    }

    fn acked_features(&self, features: u64) {
        self.handler.features_acked(features);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::BACKEND_REQ
            | VhostUserProtocolFeatures::BACKEND_SEND_FD
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::RESET_DEVICE
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
            | VhostUserProtocolFeatures::SHMEM
    }

    fn reset_device(&self) {
        self.request_discard();
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        // QEMU stops every vring alike after a guest reset and when the VM stops, and sends
        // nothing else in either case (no SET_STATUS without that protocol feature, no
        // RESET_DEVICE from vhost-user-base): the stop of the control queue is the reset.
        if queue_index == u32::from(CONTROLQ) {
            self.request_discard();
        }
        Ok(())
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let (offset, size) = (offset as usize, size as usize);
        let Some(end) = offset
            .checked_add(size)
            .filter(|&end| end <= MAX_CONFIG_SIZE)
        else {
            // An empty reply tells the frontend that the request failed.
            return Vec::new();
        };
        let mut config = self.handler.config_space();
        config.resize(MAX_CONFIG_SIZE, 0);
        config[offset..end].to_vec()
    }

    fn set_config(&self, _offset: u32, _buf: &[u8]) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the vrdma configuration space is read-only",
        ))
    }

    fn update_memory(&self, _mem: AtomicGuestRam) -> io::Result<()> {
        // `_mem` is the GuestMemoryAtomic the context already holds; only the handler needs
        // to look at what changed.
        self.handler.memory_changed(&self.guest_io);
        Ok(())
    }

    fn set_backend_req_fd(&self, _backend: Backend) {
        // The connection's filter takes the channel out of SET_BACKEND_REQ_FD and hands it
        // to the mapper (`frontend_filter::FilterHooks::on_backend_channel`); one that gets
        // here bypassed it (a malformed request the daemon would refuse anyway).
        warn!("a back-end request channel bypassed the connection filter; it is not used");
    }

    fn get_shmem_config(&self) -> io::Result<VhostUserShMemConfig> {
        let size = self.guest_io.shmem().size();
        if size == 0 {
            return Ok(VhostUserShMemConfig::new(0, &[]));
        }
        Ok(VhostUserShMemConfig::new(1, &[size]))
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        vec![1 << CONTROLQ, (1 << EVENTQ) | (1 << DOORBELLQ)]
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        // Without an exit event the workers could never be stopped when the guest goes.
        match new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC) {
            Ok(pair) => {
                self.exit_consumer_fds.lock().push(pair.0.as_raw_fd());
                Some(pair)
            }
            Err(e) => {
                warn!("cannot create a worker exit event: {e}");
                None
            }
        }
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        // Errors returned here would end the worker thread, so guest-caused problems are
        // logged where they happen and never returned.
        match (thread_id, device_event) {
            (CONTROL_WORKER, CONTROL_LOCAL) => self.serve_controlq(&vrings[0]),
            (FAST_WORKER, EVENT_LOCAL) => self.deliver_events(&vrings[0]),
            (FAST_WORKER, DOORBELL_LOCAL) => self.serve_doorbellq(&vrings[1]),
            (FAST_WORKER, EVENTS_WAKE_TOKEN) => {
                self.guest_io.events().consume_wake();
                self.deliver_events(&vrings[0]);
            }
            (FAST_WORKER, token) if token >= FIRST_WATCHED_TOKEN => {
                self.handler
                    .fd_ready(&self.guest_io, usize::from(token - FIRST_WATCHED_TOKEN));
                self.deliver_events(&vrings[0]);
            }
            (thread, token) => debug!("ignoring event {token} on worker {thread}"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vhost_device::guest_io::GuestIo;
    use crate::vhost_device::handler::CommandRejection;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;
    use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

    #[derive(Default)]
    struct ConfigOnly {
        resets: AtomicU64,
    }

    impl DeviceHandler for ConfigOnly {
        fn device_features(&self) -> u64 {
            // Bit 32 is a transport bit: the handler must not be able to offer it.
            0b101 | (1 << 32) | (1 << 40)
        }
        fn config_space(&self) -> Vec<u8> {
            b"abcdef".to_vec()
        }
        fn shmem_size(&self) -> u64 {
            0x10_0000
        }
        fn max_request_size(&self) -> usize {
            64
        }
        fn handle_command(&self, _: &GuestIo, _: &[u8], _: usize, _: &mut Vec<u8>) {}
        fn reject_command(&self, _: &GuestIo, _: CommandRejection, _: &mut Vec<u8>) {}
        fn doorbell(&self, _: &GuestIo, _: &[u8]) {}
        fn reset(&self) {
            self.resets.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn backend() -> VhuVrdma<ConfigOnly> {
        let memory = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        VhuVrdma::new(Arc::new(ConfigOnly::default()), memory).unwrap()
    }

    fn resets(backend: &VhuVrdma<ConfigOnly>) -> u64 {
        backend.handler().resets.load(Ordering::Relaxed)
    }

    #[test]
    fn stopping_the_control_queue_discards_guest_state() {
        let backend = backend();
        backend.stop_vring(u32::from(EVENTQ)).unwrap();
        backend.stop_vring(u32::from(DOORBELLQ)).unwrap();
        assert_eq!(resets(&backend), 0);
        backend.stop_vring(u32::from(CONTROLQ)).unwrap();
        assert_eq!(resets(&backend), 1);
        backend.reset_device();
        assert_eq!(resets(&backend), 2);
    }

    #[test]
    fn a_stop_during_a_command_discards_after_it_without_waiting() {
        let backend = Arc::new(backend());
        let running = backend.command.lock();
        // Returns at once although a command "runs" (holds the command buffers).
        backend.stop_vring(u32::from(CONTROLQ)).unwrap();
        assert_eq!(resets(&backend), 0);
        drop(running);
        backend.finish_pending_discard();
        assert_eq!(resets(&backend), 1);
        backend.finish_pending_discard();
        assert_eq!(resets(&backend), 1, "one stop, one discard");
    }

    #[test]
    fn configuration_space_is_padded_and_bounded() {
        let backend = backend();
        assert_eq!(backend.get_config(0, 4), b"abcd");
        assert_eq!(backend.get_config(4, 4), b"ef\0\0");
        assert_eq!(backend.get_config(0, 256).len(), 256);
        assert!(backend.get_config(250, 7).is_empty());
        assert!(backend.get_config(u32::MAX, 2).is_empty());
        assert!(backend.set_config(0, b"x").is_err());
    }

    #[test]
    fn features_keep_transport_bits_to_the_plumbing() {
        let features = backend().features();
        assert_eq!(features & DEVICE_SPECIFIC_MASK, 0b101);
        assert_ne!(features & (1 << VIRTIO_F_VERSION_1), 0);
        assert_ne!(features & (1 << VIRTIO_RING_F_EVENT_IDX), 0);
        assert_ne!(features & VHOST_USER_F_PROTOCOL_FEATURES, 0);
        assert_eq!(features & (1 << 40), 0);
    }

    #[test]
    fn protocol_features_and_shared_memory() {
        let backend = backend();
        let protocol = backend.protocol_features();
        // Bit 22 is VHOST_USER_PROTOCOL_F_SHMEM in QEMU 11.1 as in vhost 0.18.
        assert_eq!(VhostUserProtocolFeatures::SHMEM.bits(), 1 << 22);
        assert!(protocol.contains(
            VhostUserProtocolFeatures::CONFIG
                | VhostUserProtocolFeatures::BACKEND_REQ
                | VhostUserProtocolFeatures::BACKEND_SEND_FD
                | VhostUserProtocolFeatures::REPLY_ACK
                | VhostUserProtocolFeatures::SHMEM
        ));
        assert!(!protocol.contains(VhostUserProtocolFeatures::MQ));
        let shmem = backend.get_shmem_config().unwrap();
        assert_eq!(shmem.nregions, 1);
        assert_eq!(shmem.memory_sizes[0], 0x10_0000);
        assert_eq!(backend.num_queues(), 3);
        assert_eq!(backend.queues_per_thread(), vec![0b001, 0b110]);
    }

    /// A handler whose commands wait until the test lets them finish.
    struct SlowCommands {
        entered: std::sync::mpsc::SyncSender<()>,
        release: parking_lot::Mutex<std::sync::mpsc::Receiver<()>>,
        resets: AtomicU64,
    }

    impl DeviceHandler for SlowCommands {
        fn device_features(&self) -> u64 {
            0
        }
        fn config_space(&self) -> Vec<u8> {
            Vec::new()
        }
        fn shmem_size(&self) -> u64 {
            0x10_0000
        }
        fn max_request_size(&self) -> usize {
            64
        }
        fn handle_command(&self, _: &GuestIo, _: &[u8], _: usize, out: &mut Vec<u8>) {
            self.entered.send(()).unwrap();
            self.release.lock().recv().unwrap();
            out.extend_from_slice(&[0; 4]);
        }
        fn reject_command(&self, _: &GuestIo, _: CommandRejection, _: &mut Vec<u8>) {}
        fn doorbell(&self, _: &GuestIo, _: &[u8]) {}
        fn reset(&self) {
            self.resets.fetch_add(1, Ordering::Relaxed);
        }
    }

    const NEXT: u16 = virtio_bindings::bindings::virtio_ring::VRING_DESC_F_NEXT as u16;
    const WRITE: u16 = virtio_bindings::bindings::virtio_ring::VRING_DESC_F_WRITE as u16;

    /// Serves the chain of `flags` (16 bytes each readable, 64 writable, chained in order)
    /// through a real split virtqueue; with `stop_meanwhile` the control queue is stopped
    /// while the command runs. Returns the used ring's index afterwards, the used length if
    /// it moved, whether the handler saw the command, and the resets.
    fn serve_one(flags: &[u16], stop_meanwhile: bool) -> (u16, Option<u32>, bool, u64) {
        use vhost_user_backend::VringT;
        use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
        use virtio_queue::mock::MockSplitQueue;
        use vm_memory::GuestAddress;

        let ram = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x20_0000)]).unwrap();
        let queue = MockSplitQueue::new(&ram, 16);
        let descriptors: Vec<RawDescriptor> = flags
            .iter()
            .enumerate()
            .map(|(i, &f)| {
                let len = if f & WRITE != 0 { 64 } else { 16 };
                let next = if i + 1 < flags.len() { NEXT } else { 0 };
                let addr = 0x10_0000 + 0x1000 * i as u64;
                RawDescriptor::from(SplitDescriptor::new(addr, len, f | next, i as u16 + 1))
            })
            .collect();
        queue.add_desc_chains(&descriptors, 0).unwrap();
        let memory = GuestMemoryAtomic::new(ram.clone());
        let vring = crate::vhost_device::vhu_vrdma::Vring::new(memory.clone(), 16).unwrap();
        vring
            .set_queue_info(
                queue.desc_table_addr().0,
                queue.avail_addr().0,
                queue.used_addr().0,
            )
            .unwrap();
        vring.set_queue_size(16);
        vring.set_queue_ready(true);

        let (entered, entered_rx) = std::sync::mpsc::sync_channel(1);
        let (release_tx, release) = std::sync::mpsc::sync_channel(1);
        let handler = Arc::new(SlowCommands {
            entered,
            release: parking_lot::Mutex::new(release),
            resets: AtomicU64::new(0),
        });
        let backend = Arc::new(VhuVrdma::new(handler.clone(), memory).unwrap());
        if !stop_meanwhile {
            // Nothing to do while it runs: let it finish at once.
            release_tx.send(()).unwrap();
        }
        let serving = {
            let (backend, vring) = (Arc::clone(&backend), vring.clone());
            std::thread::spawn(move || backend.serve_controlq(&vring))
        };
        if stop_meanwhile {
            entered_rx.recv().unwrap();
            // Returns at once: the discard waits for the command.
            backend.stop_vring(u32::from(CONTROLQ)).unwrap();
            assert_eq!(handler.resets.load(Ordering::Relaxed), 0);
            release_tx.send(()).unwrap();
        }
        serving.join().unwrap();
        let used = queue.used().idx().load();
        let used_len = (used > 0).then(|| queue.used().ring().ref_at(0).unwrap().load().len());
        let executed = stop_meanwhile || entered_rx.try_recv().is_ok();
        (
            used,
            used_len,
            executed,
            handler.resets.load(Ordering::Relaxed),
        )
    }

    /// Spec §11.1: a command the reset interrupted is finished, its chain is not completed on
    /// the reset queue, and the discard runs right after it.
    #[test]
    fn a_command_interrupted_by_a_stop_is_not_completed() {
        assert_eq!(serve_one(&[0, WRITE], false), (1, Some(4), true, 0));
        assert_eq!(serve_one(&[0, WRITE], true), (0, None, true, 1));
    }

    /// A readable buffer after a writable one: not executed, completed with nothing written.
    #[test]
    fn a_chain_with_a_readable_buffer_after_a_writable_one_is_not_executed() {
        assert_eq!(serve_one(&[WRITE, 0], false), (1, Some(0), false, 0));
        assert_eq!(
            serve_one(&[0, WRITE, 0, WRITE], false),
            (1, Some(0), false, 0)
        );
    }

    /// Counts the commands it serves and the resumes it is told of.
    #[derive(Default)]
    struct Counting {
        commands: AtomicU64,
        resumed_with: parking_lot::Mutex<Option<Vec<u8>>>,
    }

    impl DeviceHandler for Counting {
        fn device_features(&self) -> u64 {
            0
        }
        fn config_space(&self) -> Vec<u8> {
            Vec::new()
        }
        fn shmem_size(&self) -> u64 {
            0x10_0000
        }
        fn max_request_size(&self) -> usize {
            64
        }
        fn handle_command(&self, _: &GuestIo, _: &[u8], _: usize, out: &mut Vec<u8>) {
            self.commands.fetch_add(1, Ordering::Relaxed);
            out.extend_from_slice(&[0; 4]);
        }
        fn reject_command(&self, _: &GuestIo, _: CommandRejection, _: &mut Vec<u8>) {}
        fn doorbell(&self, _: &GuestIo, _: &[u8]) {}
        fn reset(&self) {}
        fn resumed(&self, _: &GuestIo, last_config: &[u8]) {
            *self.resumed_with.lock() = Some(last_config.to_vec());
        }
    }

    /// Spec §11.5: after a resume the control queue starts at the ring's used index, whatever
    /// base the replay gave: what the lost daemon completed is not served again, what it left
    /// is.
    #[test]
    fn a_resumed_queue_starts_where_the_lost_daemon_stopped() {
        use vhost_user_backend::VringT;
        use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
        use virtio_queue::mock::MockSplitQueue;
        use vm_memory::GuestAddress;

        for resumed in [false, true] {
            let ram = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x20_0000)]).unwrap();
            let queue = MockSplitQueue::new(&ram, 16);
            // Three commands, each a readable request and a writable response.
            let descriptors: Vec<RawDescriptor> = (0..6u16)
                .map(|i| {
                    let (flags, len) = if i % 2 == 0 { (NEXT, 16) } else { (WRITE, 64) };
                    let addr = 0x10_0000 + 0x1000 * u64::from(i);
                    RawDescriptor::from(SplitDescriptor::new(addr, len, flags, i + 1))
                })
                .collect();
            queue.add_desc_chains(&descriptors, 0).unwrap();
            // The lost daemon completed the first.
            queue.used().idx().store(1);
            let memory = GuestMemoryAtomic::new(ram.clone());
            let vring = crate::vhost_device::vhu_vrdma::Vring::new(memory.clone(), 16).unwrap();
            vring
                .set_queue_info(
                    queue.desc_table_addr().0,
                    queue.avail_addr().0,
                    queue.used_addr().0,
                )
                .unwrap();
            vring.set_queue_size(16);
            // The replay's base: what the front-end set when the device started.
            vring.set_queue_next_avail(0);
            vring.set_queue_ready(true);
            let handler = Arc::new(Counting::default());
            let backend = VhuVrdma::new(handler.clone(), memory).unwrap();
            if resumed {
                backend.resume(&vrdma_keeper::resume::Resume {
                    losses: 1,
                    last_config: vec![5; 4],
                });
            }
            backend.serve_controlq(&vring);
            let served = handler.commands.load(Ordering::Relaxed);
            if resumed {
                assert_eq!(served, 2, "the two commands the lost daemon left");
                assert_eq!(*handler.resumed_with.lock(), Some(vec![5; 4]));
            } else {
                assert_eq!(
                    served, 3,
                    "without a resume the stale base serves all again"
                );
            }
            // Resumed: after the lost daemon's one; else from the stale 0, over it.
            assert_eq!(queue.used().idx().load(), 3);
        }
    }
}

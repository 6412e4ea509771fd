//! A fake vrdma device behind a [`Transport`], for testing the verbs API without a backend.
//!
//! [`FakeTransport`] decodes every command with the spec crate and answers it from the fake
//! device's own state ([`FakeDevice`]); it places rxe v1 queue buffers (with correct headers)
//! in a shared-memory region it maps and unmaps per object (`mprotect`, so a use after DESTROY
//! crashes the test), and plays a tiny loopback Soft-RoCE "kernel"
//! ([`FakeTransport::run_kernel`]) that drains the doorbell area and executes SEND, RDMA WRITE
//! and RDMA READ between its QPs through the registered page lists, writing native CQEs.
//! [`Fault`]s make the next response fail or misbehave. Guest RAM is a memfd, as the process
//! transport's.

mod device;
mod kernel;
mod mr;
mod profile;
mod region;
mod ring;
mod windows;

use std::collections::VecDeque;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use vrdma::dma::{DmaBuffer, DmaError, DmaMemory, MemfdRam};
use vrdma::spec::config::DeviceConfig;
use vrdma::spec::control::{ControlRequest, ControlResponse};
use vrdma::spec::event::Event;
use vrdma::spec::features;
use vrdma::spec::{Status, StatusError};
use vrdma::transport::{HostKick, SharedMemory, Transport, TransportError};

pub use device::{FakeDevice, FakeMr, FakeMw, Fault, MwBinding};
pub use kernel::object_event;
pub use profile::{
    default_config, doorbell_area_bytes, DOORBELL_SLOTS, LOCAL_GID, MAX_INLINE, MAX_MR_PAGES,
    MAX_QP_INIT_RD_ATOM, MAX_QP_RD_ATOM, MAX_QP_WR, MAX_SGE, ODP_RC_CAPS, RAM_SIZE, SHM_SIZE,
};
use region::Region;

/// Guest RAM of the fake: allocations and translations from a memfd, like the process
/// transport.
struct FakeDma(Arc<MemfdRam>);

impl DmaMemory for FakeDma {
    fn alloc(&self, len: usize, align: usize) -> Result<DmaBuffer, DmaError> {
        self.0.alloc(len, align)
    }

    fn translate(&self, addr: *const u8, len: usize) -> Result<Vec<u64>, DmaError> {
        self.0.translate(addr, len)
    }
}

/// A [`Transport`] to the fake device (see the module documentation).
pub struct FakeTransport {
    config: DeviceConfig,
    features: u64,
    dma: FakeDma,
    region: Region,
    device: Mutex<FakeDevice>,
    notifications: AtomicUsize,
    events: Mutex<VecDeque<Event>>,
    event_posted: Condvar,
    /// The event queue reports [`TransportError::Disconnected`] once it is empty.
    events_disconnected: AtomicBool,
}

impl FakeTransport {
    /// A fake device with [`default_config`], rxe v1 rings, UD with staged send queues, UC
    /// and memory windows.
    pub fn new() -> Arc<FakeTransport> {
        Self::with(
            default_config(),
            features::VRDMA_F_RING_RXE_V1
                | features::VRDMA_F_UD
                | features::VRDMA_F_UD_STAGED_SQ
                | features::VRDMA_F_UC
                | features::VRDMA_F_MW
                | features::VRDMA_F_MR_EXTENTS
                | features::VRDMA_F_ODP,
        )
    }

    /// A fake device with this configuration space and these negotiated device features.
    pub fn with(config: DeviceConfig, features: u64) -> Arc<FakeTransport> {
        let ram = MemfdRam::new(RAM_SIZE).unwrap();
        let mut device = FakeDevice::new(ram.clone());
        device.ud_staged = features & features::VRDMA_F_UD_STAGED_SQ != 0;
        Arc::new(FakeTransport {
            config,
            features,
            dma: FakeDma(ram.clone()),
            region: Region::new(SHM_SIZE),
            device: Mutex::new(device),
            notifications: AtomicUsize::new(0),
            events: Mutex::new(VecDeque::new()),
            event_posted: Condvar::new(),
            events_disconnected: AtomicBool::new(false),
        })
    }

    /// The device's state, locked.
    pub fn device(&self) -> MutexGuard<'_, FakeDevice> {
        self.device.lock().unwrap()
    }

    /// How many times the doorbell queue was notified.
    pub fn notifications(&self) -> usize {
        self.notifications.load(Ordering::SeqCst)
    }

    /// Applies `fault` to the next command it concerns.
    pub fn inject(&self, fault: Fault) {
        self.device().fault = Some(fault);
    }

    /// Queues `event` on the event queue.
    pub fn post_event(&self, event: Event) {
        self.events.lock().unwrap().push_back(event);
        self.event_posted.notify_all();
    }

    /// The "kernel" adds a SEND completion with `wr_id` to CQ `cq` (a handle of this device),
    /// raising the completion event if the CQ is armed; false if the CQ was full.
    pub fn complete(&self, cq: u32, wr_id: u64) -> bool {
        let mut events = Vec::new();
        let added = self.device().complete(cq, wr_id, &mut events);
        for e in events {
            self.post_event(e);
        }
        added
    }

    /// Makes the event queue behave as the backend's connection closed: the events already
    /// queued are read, then `next_event` fails with [`TransportError::Disconnected`] (as
    /// the process transport does when the backend goes away).
    pub fn disconnect_events(&self) {
        // Under the queue's lock, so that a reader cannot miss the change between its check
        // and its wait.
        let _events = self.events.lock().unwrap();
        self.events_disconnected.store(true, Ordering::SeqCst);
        self.event_posted.notify_all();
    }

    /// The "kernel": drains the doorbell area and processes the send queues it names; returns
    /// how many events that posted.
    pub fn run_kernel(&self) -> usize {
        let events = self.device().run_kernel();
        let n = events.len();
        for e in events {
            self.post_event(e);
        }
        n
    }
}

impl Transport for FakeTransport {
    fn device_features(&self) -> u64 {
        self.features
    }

    fn device_config(&self) -> &[u8] {
        self.config.as_wire()
    }

    fn round_trip(&self, request: &[u8], response: &mut [u8]) -> Result<usize, TransportError> {
        let answer = match ControlRequest::decode(request) {
            // Like the device: a command needing a feature that was not negotiated (spec §3).
            Ok(req) if req.required_features() & !self.features != 0 => {
                ControlResponse::Err(StatusError::new(Status::Unsupported)).to_vec()
            }
            Ok(req) => self.device().execute(request, &req, &self.region),
            Err(e) => ControlResponse::from(e).to_vec(),
        };
        if answer.len() > response.len() {
            return Err(TransportError::DeviceFailure(
                "response buffer too small".into(),
            ));
        }
        response[..answer.len()].copy_from_slice(&answer);
        Ok(answer.len())
    }

    fn notify_doorbell(&self) -> Result<(), TransportError> {
        self.notifications.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn next_event(
        &self,
        out: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<Option<usize>, TransportError> {
        let mut events = self.events.lock().unwrap();
        loop {
            if let Some(event) = events.pop_front() {
                let bytes = event.to_bytes();
                let n = bytes.len().min(out.len());
                out[..n].copy_from_slice(&bytes[..n]);
                return Ok(Some(n));
            }
            if self.events_disconnected.load(Ordering::SeqCst) {
                return Err(TransportError::Disconnected);
            }
            match timeout {
                None => events = self.event_posted.wait(events).unwrap(),
                Some(t) => {
                    let (guard, result) = self.event_posted.wait_timeout(events, t).unwrap();
                    events = guard;
                    if result.timed_out() && events.is_empty() {
                        return Ok(None);
                    }
                }
            }
        }
    }

    fn event_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    fn shared_memory(&self) -> SharedMemory {
        SharedMemory::new(Some(self.region.base), self.region.len)
    }

    fn dma(&self) -> &dyn DmaMemory {
        &self.dma
    }

    fn host_kick(&self, _qp_handle: u32) -> Option<HostKick> {
        // The fake device has no host context to kick.
        None
    }
}

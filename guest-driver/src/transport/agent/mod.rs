//! The agent transport: an application process that reaches the device through the guest
//! agent (`vrdma-guestd`), which alone talks to the backend.
//!
//! What goes through the agent: control commands and device events. What does not: the data
//! path. The agent hands the process, once, what the data path needs — its guest RAM (a
//! sealed memfd at a guest-physical address the agent chose) and the doorbell queue's kick
//! eventfd — and with each command's answer the queue buffers that command mapped. The
//! process then posts, rings, polls and receives exactly as a process that is its own
//! front-end: no extra hop, no copy.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use vmm_sys_util::eventfd::EventFd;

use super::shmem_window::{ShmemWindow, WindowChange};
use super::{HostKick, OwnerProcess, SharedMemory, Transport, TransportError};
use crate::dma::{DmaMemory, MemfdRam};
use crate::transport::process::ProcessDma;

pub mod protocol;
mod scm;
mod shared;

use protocol::{Frame, Outcome, ProtocolError, SharedDevice, Welcome, PROTOCOL_VERSION};
use shared::FileMapping;

/// Where the agent listens unless told otherwise.
pub const DEFAULT_AGENT_SOCKET: &str = "/run/vrdma/agent.sock";

/// Environment variable naming the agent's socket.
pub const AGENT_SOCKET_ENV: &str = "VRDMA_AGENT";

/// A vrdma device reached through the guest agent.
pub struct AgentTransport {
    control: Mutex<UnixStream>,
    /// A command's frames went out or came in only in part: the stream is out of step with
    /// the agent and nothing more can be asked on it.
    broken: AtomicBool,
    device_features: u64,
    config: Vec<u8>,
    queue_region: QueueRegion,
    /// The doorbell area the agent registered, when it shares the device (its length).
    doorbell_area: Option<(FileMapping, usize)>,
    dma: ProcessDma,
    doorbell_kick: EventFd,
    /// Events from the agent; closed by the agent when the device (or the agent) goes.
    events: OwnedFd,
    owner: OwnerProcess,
}

/// How this process reaches the device's queue region.
enum QueueRegion {
    /// A window filled with the queue buffers each command's answer passes on (the agent
    /// opened a device session for this process alone).
    Window(ShmemWindow),
    /// The whole region, mapped from the BAR the agent passed (the agent shares one PCI
    /// function among its processes); `len` bytes.
    Mapped { mapping: FileMapping, len: usize },
}

impl QueueRegion {
    fn shared_memory(&self) -> SharedMemory {
        match self {
            QueueRegion::Window(window) => window.shared_memory(),
            QueueRegion::Mapped { mapping, len } => SharedMemory::new(Some(mapping.base()), *len),
        }
    }
}

fn protocol(error: ProtocolError) -> TransportError {
    match error {
        ProtocolError::Closed => TransportError::Disconnected,
        ProtocolError::Io(e) => TransportError::Io {
            what: "talking to the guest agent",
            source: e,
        },
        ProtocolError::Malformed(what) => {
            TransportError::DeviceFailure(format!("the guest agent sent a malformed frame: {what}"))
        }
    }
}

impl AgentTransport {
    /// Connects to the agent listening at `socket`.
    pub fn connect(socket: impl AsRef<Path>) -> Result<Self, TransportError> {
        let stream = UnixStream::connect(socket.as_ref())
            .map_err(TransportError::io("cannot connect to the guest agent"))?;
        Frame::Hello {
            version: PROTOCOL_VERSION,
        }
        .send(&stream)
        .map_err(protocol)?;
        let welcome = match Frame::receive(&stream).map_err(protocol)? {
            Frame::Welcome(welcome) => welcome,
            Frame::Refused(why) => {
                return Err(TransportError::DeviceFailure(format!(
                    "the guest agent refused this process: {why}"
                )))
            }
            _ => return Err(protocol(ProtocolError::Malformed("expected a welcome"))),
        };
        Self::from_welcome(stream, welcome)
    }

    fn from_welcome(stream: UnixStream, welcome: Welcome) -> Result<Self, TransportError> {
        let Welcome {
            device_features,
            config,
            shm_size,
            ram_gpa,
            ram_len,
            ram,
            doorbell_kick,
            events,
            shared,
        } = welcome;
        let ram_len = usize::try_from(ram_len)
            .map_err(|_| TransportError::DeviceFailure("guest agent: guest RAM size".into()))?;
        let ram = MemfdRam::adopt(ram, ram_len, ram_gpa)?;
        // SAFETY: an eventfd the agent passed, whose ownership moves into the EventFd.
        let doorbell_kick = unsafe { EventFd::from_raw_fd(doorbell_kick.into_raw_fd()) };
        let (queue_region, doorbell_area) = match shared {
            None => (QueueRegion::Window(ShmemWindow::reserve(shm_size)?), None),
            Some(shared) => Self::map_shared(&shared, shm_size)?,
        };
        Ok(AgentTransport {
            control: Mutex::new(stream),
            broken: AtomicBool::new(false),
            device_features,
            config,
            queue_region,
            doorbell_area,
            dma: ProcessDma::over(ram),
            doorbell_kick,
            events,
            owner: OwnerProcess::current(),
        })
    }

    /// Maps the queue region and the doorbell area of a device the agent shares.
    fn map_shared(
        shared: &SharedDevice,
        shm_size: u64,
    ) -> Result<(QueueRegion, Option<(FileMapping, usize)>), TransportError> {
        let len = usize::try_from(shm_size)
            .map_err(|_| TransportError::DeviceFailure("guest agent: queue region size".into()))?;
        let mapping = FileMapping::new(
            &shared.queue_region,
            shared.queue_region_offset,
            shm_size,
            "mapping the device's queue region",
        )?;
        let area_len = usize::try_from(shared.doorbell_area_len)
            .map_err(|_| TransportError::DeviceFailure("guest agent: doorbell area size".into()))?;
        let area = FileMapping::new(
            &shared.doorbell_area,
            0,
            shared.doorbell_area_len,
            "mapping the doorbell area",
        )?;
        Ok((QueueRegion::Mapped { mapping, len }, Some((area, area_len))))
    }

    /// One command's round trip with the agent; `Err` leaves the stream out of step.
    fn exchange_frames(
        &self,
        control: &UnixStream,
        request: &[u8],
        capacity: usize,
    ) -> Result<(Outcome, Vec<u8>, Vec<WindowChange>), ProtocolError> {
        Frame::Execute {
            response_capacity: u32::try_from(capacity).unwrap_or(u32::MAX),
            request: request.to_vec(),
        }
        .send(control)?;
        match Frame::receive(control)? {
            Frame::Executed {
                outcome,
                response,
                changes,
            } => Ok((outcome, response, changes)),
            _ => Err(ProtocolError::Malformed("expected an answer")),
        }
    }

    /// This process's guest RAM (what application memory is re-backed with).
    pub fn guest_ram(&self) -> &Arc<MemfdRam> {
        self.dma.guest_ram()
    }
}

impl Transport for AgentTransport {
    fn device_features(&self) -> u64 {
        self.device_features
    }

    fn device_config(&self) -> &[u8] {
        &self.config
    }

    fn round_trip(&self, request: &[u8], response: &mut [u8]) -> Result<usize, TransportError> {
        self.owner.check()?;
        let control = self.control.lock();
        if self.broken.load(Ordering::Acquire) {
            return Err(TransportError::Disconnected);
        }
        let (outcome, answer, changes) = self
            .exchange_frames(&control, request, response.len())
            .inspect_err(|_| self.broken.store(true, Ordering::Release))
            .map_err(protocol)?;
        // Every mapping the command made is made here before anything is reported: objects
        // the device created must be usable (and destroyable) whatever else went wrong.
        let mut failed_mapping = None;
        for change in &changes {
            let applied = match &self.queue_region {
                QueueRegion::Window(window) => window.apply(change),
                QueueRegion::Mapped { .. } => Err(std::io::Error::other(
                    "a queue buffer passed for a region that is mapped whole",
                )),
            };
            if let Err(e) = applied {
                failed_mapping.get_or_insert(e);
            }
        }
        match outcome {
            Outcome::Answered => {}
            Outcome::Disconnected => return Err(TransportError::Disconnected),
            Outcome::Failed(why) => return Err(TransportError::DeviceFailure(why)),
        }
        if let Some(e) = failed_mapping {
            return Err(TransportError::io(
                "mapping a queue buffer the agent passed",
            )(e));
        }
        let out = response
            .get_mut(..answer.len())
            .ok_or(TransportError::InvalidRequest(
                "response larger than the buffer",
            ))?;
        out.copy_from_slice(&answer);
        Ok(answer.len())
    }

    fn notify_doorbell(&self) -> Result<(), TransportError> {
        self.doorbell_kick
            .write(1)
            .map_err(TransportError::io("cannot notify the device"))
    }

    fn check_alive(&self) -> Result<(), TransportError> {
        // The agent closes the event socket when the device goes (or when it dies itself);
        // a peek tells an end of stream from a pending event without taking it, and without
        // waiting for a command in progress.
        let mut byte = 0u8;
        // SAFETY: peeks at most one byte into a local; the socket is ours.
        let got = unsafe {
            libc::recv(
                self.events.as_raw_fd(),
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if got == 0 || self.broken.load(Ordering::Acquire) {
            return Err(TransportError::Disconnected);
        }
        Ok(())
    }

    fn next_event(
        &self,
        out: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<Option<usize>, TransportError> {
        self.owner.check()?;
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if !poll_readable(self.events.as_fd(), left)? {
                return Ok(None);
            }
            let mut event = [0u8; 64];
            // SAFETY: receives into a local buffer of that length; the socket is ours.
            let got = unsafe {
                libc::recv(
                    self.events.as_raw_fd(),
                    event.as_mut_ptr().cast(),
                    event.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if got == 0 {
                return Err(TransportError::Disconnected);
            }
            if got < 0 {
                let error = std::io::Error::last_os_error();
                if error.kind() == std::io::ErrorKind::WouldBlock
                    || error.kind() == std::io::ErrorKind::Interrupted
                {
                    continue;
                }
                return Err(TransportError::io("receiving an event from the agent")(
                    error,
                ));
            }
            let got = got as usize;
            let copied = got.min(out.len());
            out[..copied].copy_from_slice(&event[..copied]);
            return Ok(Some(got));
        }
    }

    fn event_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.events.as_fd())
    }

    fn shared_memory(&self) -> SharedMemory {
        self.queue_region.shared_memory()
    }

    fn host_kick(&self, qp_handle: u32) -> Option<HostKick> {
        match &self.queue_region {
            QueueRegion::Window(window) => Some(HostKick::new(window.host_context()?, qp_handle)),
            QueueRegion::Mapped { .. } => None,
        }
    }

    fn registered_doorbell_area(&self) -> Option<(NonNull<u8>, usize)> {
        self.doorbell_area
            .as_ref()
            .map(|(mapping, len)| (mapping.base(), *len))
    }

    fn dma(&self) -> &dyn DmaMemory {
        &self.dma
    }
}

/// Waits up to `timeout` (`None`: forever) for `fd` to turn readable (or hung up).
fn poll_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> Result<bool, TransportError> {
    let mut pollfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                i32::try_from(left.as_millis()).unwrap_or(i32::MAX)
            }
        };
        // SAFETY: one valid pollfd on the stack.
        let rc = unsafe { libc::poll(&mut pollfd, 1, ms) };
        match rc {
            0 => return Ok(false),
            n if n > 0 => return Ok(true),
            _ => {
                let error = std::io::Error::last_os_error();
                if error.kind() != std::io::ErrorKind::Interrupted {
                    return Err(TransportError::io("poll")(error));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;

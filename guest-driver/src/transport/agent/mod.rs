//! The agent transport: an application process that reaches the device through the guest
//! agent (`vrdma-guestd`), which alone drives it.
//!
//! What goes through the agent: control commands (it checks that a process names only its
//! own objects and registers only its own memory, and releases everything a process leaves
//! behind) and device events (it passes each to the process whose object it names). What
//! does not: the data path. The agent hands the process, once, everything the data path
//! needs — its own guest RAM (a sealed memfd at a guest-physical address the agent chose),
//! the shared doorbell area, the doorbell queue's kick eventfd — and with each command's
//! answer the queue buffers that command mapped. The process then posts, rings, polls and
//! receives exactly as a process that drives the device itself: no extra hop, no copy.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use vmm_sys_util::eventfd::EventFd;

use super::shmem_window::ShmemWindow;
use super::{OwnerProcess, SharedDoorbellArea, SharedMemory, Transport, TransportError};
use crate::dma::{map_shared, DmaMemory, MemfdRam};
use crate::transport::process::ProcessDma;

pub mod protocol;

use protocol::{Frame, Outcome, ProtocolError, Welcome, PROTOCOL_VERSION};

/// Where the agent listens unless told otherwise.
pub const DEFAULT_AGENT_SOCKET: &str = "/run/vrdma/agent.sock";

/// Environment variable naming the agent's socket.
pub const AGENT_SOCKET_ENV: &str = "VRDMA_AGENT";

/// The agent's socket: `$VRDMA_AGENT` if set, else [`DEFAULT_AGENT_SOCKET`] if it exists.
pub fn agent_socket() -> Option<PathBuf> {
    match std::env::var_os(AGENT_SOCKET_ENV) {
        Some(path) if !path.is_empty() => Some(PathBuf::from(path)),
        _ => {
            let default = Path::new(DEFAULT_AGENT_SOCKET);
            default.exists().then(|| default.to_path_buf())
        }
    }
}

/// A vrdma device reached through the guest agent.
pub struct AgentTransport {
    control: Mutex<UnixStream>,
    device_features: u64,
    config: Vec<u8>,
    window: ShmemWindow,
    dma: ProcessDma,
    /// The agent's doorbell area, if it shares one (else the context registers its own).
    doorbell: Option<DoorbellMapping>,
    doorbell_kick: EventFd,
    events: OwnedFd,
    owner: OwnerProcess,
}

/// The shared doorbell area, mapped in this process.
struct DoorbellMapping {
    base: NonNull<u8>,
    len: usize,
    gpa: u64,
}

// SAFETY: a shared mapping owned by this value; accessed only atomically (by the verbs
// layer's doorbell region), from any thread.
unsafe impl Send for DoorbellMapping {}
// SAFETY: as for Send.
unsafe impl Sync for DoorbellMapping {}

impl Drop for DoorbellMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `AgentTransport::connect`; the doorbell region that
        // views it is dropped before the transport (the context holds both).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
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
            doorbell_gpa,
            doorbell_len,
            ram,
            doorbell,
            doorbell_kick,
            events,
        } = welcome;
        let bad = |what: &str| TransportError::DeviceFailure(format!("guest agent: {what}"));
        let ram_len = usize::try_from(ram_len).map_err(|_| bad("guest RAM size"))?;
        let ram = MemfdRam::adopt(ram, ram_len, ram_gpa)?;
        let doorbell = match doorbell {
            None => None,
            Some(file) => {
                let len = usize::try_from(doorbell_len).map_err(|_| bad("doorbell area size"))?;
                let base = map_shared(file.as_fd(), len)
                    .map_err(TransportError::io("cannot map the doorbell area"))?;
                Some(DoorbellMapping {
                    base,
                    len,
                    gpa: doorbell_gpa,
                })
            }
        };
        // SAFETY: an eventfd the agent passed, whose ownership moves into the EventFd.
        let doorbell_kick = unsafe { EventFd::from_raw_fd(doorbell_kick.into_raw_fd()) };
        Ok(AgentTransport {
            control: Mutex::new(stream),
            device_features,
            config,
            window: ShmemWindow::reserve(shm_size)?,
            dma: ProcessDma::over(ram),
            doorbell,
            doorbell_kick,
            events,
            owner: OwnerProcess::current(),
        })
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

    fn execute(&self, request: &[u8], response: &mut [u8]) -> Result<usize, TransportError> {
        self.owner.check()?;
        let control = self.control.lock();
        Frame::Execute {
            response_capacity: u32::try_from(response.len()).unwrap_or(u32::MAX),
            request: request.to_vec(),
        }
        .send(&control)
        .map_err(protocol)?;
        let Frame::Executed {
            outcome,
            response: answer,
            changes,
        } = Frame::receive(&control).map_err(protocol)?
        else {
            return Err(protocol(ProtocolError::Malformed("expected an answer")));
        };
        // The command's queue buffers are mapped before the caller learns of them.
        for change in &changes {
            self.window.apply(change).map_err(TransportError::io(
                "mapping a queue buffer the agent passed",
            ))?;
        }
        match outcome {
            Outcome::Answered => {}
            Outcome::Disconnected => return Err(TransportError::Disconnected),
            Outcome::Failed(why) => return Err(TransportError::DeviceFailure(why)),
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
        // The agent never writes unasked on the control socket: readable means closed.
        if poll_readable(self.control.lock().as_fd(), Some(Duration::ZERO))? {
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
        self.window.shared_memory()
    }

    fn dma(&self) -> &dyn DmaMemory {
        &self.dma
    }

    fn shared_doorbell_area(&self) -> Option<SharedDoorbellArea> {
        self.doorbell.as_ref().map(|area| SharedDoorbellArea {
            base: area.base,
            len: area.len,
            gpa: area.gpa,
        })
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

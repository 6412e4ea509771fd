//! One application process served by the agent: its own device session, the commands it
//! sends, the events it receives, and the release of everything when it goes.
//!
//! In process mode each application process gets a vhost-user session of its own with the
//! backend, opened by the agent: its own guest RAM (a memfd only it and the backend map), its
//! own handle namespace and quotas (the backend's, per connection), its own host verbs
//! context. The agent executes the process's control commands on that session and passes on
//! the queue buffers each command mapped; the process maps them, posts, rings the session's
//! doorbell and polls its completions itself. When the process closes its socket, or dies,
//! the agent closes the session and the backend releases everything in it — nobody else's
//! objects are touched.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use log::{debug, info, warn};
use vrdma::transport::agent::protocol::{
    event_socket_pair, Frame, Outcome, ProtocolError, Welcome, PROTOCOL_VERSION,
};
use vrdma_spec::control::{MAX_CM_RESPONSE_SIZE, MAX_RESPONSE_SIZE};
use vrdma_spec::features::VRDMA_F_CM_EVENT_INLINE;

use crate::reach::Reach;
use vrdma::transport::process::{ProcessOptions, ProcessTransport};
use vrdma::transport::{Transport, TransportError};

/// How long a process that connected has to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Guest RAM of a session that only the agent uses: the vrings (3 × 256 entries), the posted
/// event buffers and the command buffers of one command at a time, which grow to the next
/// power of two of the largest command (a request of up to the protocol's 8 MiB payload).
const SESSION_RAM: usize = 32 << 20;

/// Who is on the other end of a client socket (SO_PEERCRED).
#[derive(Clone, Copy, Debug)]
pub struct Peer {
    /// Process id.
    pub pid: i32,
    /// User id.
    pub uid: u32,
}

impl Peer {
    /// The peer of `socket`.
    pub fn of(socket: &UnixStream) -> io::Result<Peer> {
        let mut cred = libc::ucred {
            pid: 0,
            uid: 0,
            gid: 0,
        };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: SO_PEERCRED fills a ucred of `len` bytes on the stack.
        let rc = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Peer {
            pid: cred.pid,
            uid: cred.uid,
        })
    }
}

/// What every session is opened with.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// The backend's vhost-user socket.
    pub backend: std::path::PathBuf,
    /// Bytes of guest RAM each process gets (its registrable memory).
    pub guest_ram_size: usize,
}

/// Serves one application process until it goes, then closes its session (the backend
/// releases every object of the process).
pub fn serve(socket: UnixStream, peer: Peer, options: &SessionOptions) {
    match serve_inner(&socket, peer, options) {
        Ok(()) => info!("process {} (uid {}) left", peer.pid, peer.uid),
        Err(e) => info!("process {} (uid {}) dropped: {e}", peer.pid, peer.uid),
    }
}

/// Why a process's session ended other than by its leaving.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    #[error("it speaks protocol version {0}, the agent {PROTOCOL_VERSION}")]
    Version(u32),
    #[error("it did not start with a hello")]
    NoHello,
    #[error("its device session could not be opened: {0}")]
    Open(TransportError),
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Io(#[from] io::Error),
}

fn serve_inner(
    socket: &UnixStream,
    peer: Peer,
    options: &SessionOptions,
) -> Result<(), SessionError> {
    receive_hello(socket)?;
    let device = match open_session(&options.backend, options.guest_ram_size) {
        Ok(device) => Arc::new(device),
        Err(e) => {
            let _ = Frame::Refused(format!("the device is not available: {e}")).send(socket);
            return Err(SessionError::Open(e));
        }
    };
    let (ours, theirs) = event_socket_pair()?;
    let ram = device
        .application_ram()
        .ok_or_else(|| io::Error::other("the session has no application RAM"))?;
    let welcome = Welcome {
        device_features: device.device_features(),
        config: device.device_config().to_vec(),
        shm_size: device.shared_memory().len() as u64,
        ram_gpa: ram.guest_base(),
        ram_len: ram.len() as u64,
        ram: ram.fd().try_clone_to_owned()?,
        doorbell_kick: device.doorbell_kick().try_clone_to_owned()?,
        events: theirs,
        shared: None,
    };
    Frame::Welcome(welcome).send(socket)?;
    info!("process {} (uid {}) connected", peer.pid, peer.uid);
    let stop = Arc::new(AtomicBool::new(false));
    let events = {
        let (device, stop) = (device.clone(), stop.clone());
        thread::Builder::new()
            .name(format!("events-{}", peer.pid))
            .spawn(move || forward_events(&device, &ours, &stop, peer.pid))?
    };
    let reach = Reach::new(ram.guest_base(), ram.len() as u64);
    let result = run_commands(socket, &device, reach);
    stop.store(true, Ordering::Release);
    if events.join().is_err() {
        warn!("the event thread of process {} panicked", peer.pid);
    }
    // Dropping the last reference closes the session: the backend releases every object.
    drop(device);
    result
}

/// Reads a process's hello, within [`HELLO_TIMEOUT`]; refuses another protocol version.
pub fn receive_hello(socket: &UnixStream) -> Result<(), SessionError> {
    // A process that connects and says nothing must not hold its place for ever.
    socket.set_read_timeout(Some(HELLO_TIMEOUT))?;
    let hello = Frame::receive(socket);
    socket.set_read_timeout(None)?;
    match hello? {
        Frame::Hello { version } if version == PROTOCOL_VERSION => Ok(()),
        Frame::Hello { version } => {
            let why = format!("protocol version {version} is not {PROTOCOL_VERSION}");
            let _ = Frame::Refused(why).send(socket);
            Err(SessionError::Version(version))
        }
        _ => Err(SessionError::NoHello),
    }
}

/// Opens and closes one session: whether the backend serves this agent at all.
pub fn probe(options: &SessionOptions) -> Result<(), TransportError> {
    open_session(&options.backend, options.guest_ram_size).map(drop)
}

/// Tells a process it is not served.
pub fn refuse(socket: &UnixStream, why: &str) {
    // Its hello is read first, so that the process learns why instead of finding the socket
    // closed under its hello; briefly, since the refused may be the ones that flood.
    let _ = socket.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = Frame::receive(socket);
    let _ = Frame::Refused(why.to_string()).send(socket);
}

fn open_session(backend: &Path, guest_ram_size: usize) -> Result<ProcessTransport, TransportError> {
    let options = ProcessOptions {
        // The agent's own part: vrings, command and event buffers.
        guest_ram_size: SESSION_RAM,
        // The process's part, which it alone allocates from.
        application_ram_size: guest_ram_size,
        // Events are relayed to the process as notices of at most EVENT_SIZE bytes.
        device_features: ProcessOptions::default().device_features & !VRDMA_F_CM_EVENT_INLINE,
        ..ProcessOptions::default()
    };
    let device = ProcessTransport::connect(backend, options)?;
    device.forward_window_changes();
    Ok(device)
}

fn run_commands(
    socket: &UnixStream,
    device: &ProcessTransport,
    reach: Reach,
) -> Result<(), SessionError> {
    let mut response = Vec::new();
    loop {
        let (capacity, request) = match Frame::receive(socket) {
            Ok(Frame::Execute {
                response_capacity,
                request,
            }) => (response_capacity, request),
            Ok(_) => return Err(ProtocolError::Malformed("expected a command").into()),
            Err(ProtocolError::Closed) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        if let Some(refusal) = reach.refusal(&request) {
            debug!("command refused: it names guest memory outside the process's own");
            Frame::Executed {
                outcome: Outcome::Answered,
                response: refusal,
                changes: Vec::new(),
            }
            .send(socket)?;
            continue;
        }
        response.clear();
        // No response is larger than the largest the device defines.
        response.resize(
            (capacity as usize).min(MAX_CM_RESPONSE_SIZE.max(MAX_RESPONSE_SIZE)),
            0,
        );
        let (outcome, used) = match device.round_trip(&request, &mut response) {
            Ok(used) => (Outcome::Answered, used),
            Err(TransportError::Disconnected) => (Outcome::Disconnected, 0),
            Err(e) => (Outcome::Failed(e.to_string()), 0),
        };
        response.truncate(used);
        let changes = device.take_window_changes();
        let device_gone = outcome == Outcome::Disconnected;
        Frame::Executed {
            outcome,
            response: std::mem::take(&mut response),
            changes,
        }
        .send(socket)?;
        if device_gone {
            // The session is over; closing the process's sockets tells it so at once.
            return Err(SessionError::Open(TransportError::Disconnected));
        }
    }
}

/// Passes the session's device events to the process until `stop`, until the process goes
/// or until the device does (then the socket's end of stream tells the process).
///
/// An event is taken from the device only when the socket has room for it: a process that
/// does not read its events leaves them in the device's event queue, which bounds them and
/// reports any it drops (spec §5.2), and this thread never blocks in a send (it is joined
/// when the session ends).
fn forward_events(device: &ProcessTransport, to: &OwnedFd, stop: &AtomicBool, pid: i32) {
    let mut event = [0u8; 64];
    while !stop.load(Ordering::Acquire) {
        match wait_writable(to, POLL_SLICE) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                debug!("process {pid}: event socket: {e}");
                return;
            }
        }
        let len = match device.next_event(&mut event, Some(POLL_SLICE)) {
            Ok(None) => continue,
            Ok(Some(len)) => len.min(event.len()),
            Err(e) => {
                debug!("process {pid}: event queue ended: {e}");
                return;
            }
        };
        // SAFETY: sends `len` bytes of a local buffer on a socket we own.
        let sent = unsafe {
            libc::send(
                to.as_raw_fd(),
                event.as_ptr().cast(),
                len,
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        if sent < 0 {
            // It had room a moment ago and only this thread writes: the process is gone.
            debug!(
                "process {pid}: event not delivered: {}",
                io::Error::last_os_error()
            );
            return;
        }
    }
}

/// How long the event thread waits at a time before it looks at its stop flag again.
pub const POLL_SLICE: Duration = Duration::from_millis(200);

/// Waits up to `timeout` for room to send on `fd`; `Err` once the peer is gone.
pub fn wait_writable(fd: &OwnedFd, timeout: Duration) -> io::Result<bool> {
    let mut pollfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd on the stack.
    let rc = unsafe { libc::poll(&mut pollfd, 1, timeout.as_millis() as i32) };
    match rc {
        0 => Ok(false),
        n if n > 0 => {
            if pollfd.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                Err(io::Error::from(io::ErrorKind::BrokenPipe))
            } else {
                Ok(true)
            }
        }
        _ => {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(error)
            }
        }
    }
}

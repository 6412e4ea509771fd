//! One front-end connection at a time, relayed to a daemon that may come and go.
//!
//! The front-end (QEMU) never sees the daemon's connection close: while no daemon is there,
//! the keeper answers the front-end itself ([`FrontendSetup::answer`]), removes the dead
//! daemon's shared-memory mappings ([`Mappings::unmap_all`]) and tries to reach a daemon
//! again. A daemon that comes is given the connection's set-up ([`FrontendSetup::replay`],
//! after [`Resume`]) and then every vring is kicked once, so that it looks at what the driver
//! posted meanwhile. The keeper holds no RDMA state and looks at no guest memory.

use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use log::{debug, info, warn};
use vhost::vhost_user::message::FrontendReq;

use crate::mappings::{Mappings, Origin};
use crate::message::{payload_u64, wants_reply, Message, FLAG_NEED_REPLY, FLAG_VERSION};
use crate::resume::Resume;
use crate::setup::{expects_reply, FrontendSetup};

/// Errors that end the keeper.
#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    #[error("cannot listen on {path}: {source}")]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot accept a front-end: {0}")]
    Accept(#[source] io::Error),
}

/// Why a daemon could not be given a connection's set-up.
#[derive(Debug, thiserror::Error)]
enum ReplayError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("the daemon closed the connection")]
    Closed,
    #[error("request {request}: the daemon answered request {answered}")]
    Mismatch { request: u32, answered: u32 },
    #[error("request {request}: the daemon offers {offered:#x}, the connection uses {used:#x}")]
    Features {
        request: u32,
        offered: u64,
        used: u64,
    },
    #[error("request {request}: refused by the daemon (status {status})")]
    Refused { request: u32, status: u64 },
}

/// How the keeper reaches daemons.
#[derive(Debug, Clone)]
pub struct DaemonSocket {
    /// The daemon's socket for this VM.
    pub path: PathBuf,
    /// Pause between two attempts to reach it.
    pub retry: Duration,
    /// Longest wait for one answer of a replay.
    pub replay_timeout: Duration,
}

/// Listens for front-ends and serves one at a time.
pub struct Keeper {
    listener: UnixListener,
    daemon: DaemonSocket,
}

impl Keeper {
    /// Listens on `socket` (a stale socket file there is removed first).
    pub fn bind(socket: &Path, daemon: DaemonSocket) -> Result<Keeper, KeeperError> {
        let bind = |source| KeeperError::Bind {
            path: socket.to_owned(),
            source,
        };
        match std::fs::remove_file(socket) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(bind(e)),
            _ => {}
        }
        let listener = UnixListener::bind(socket).map_err(bind)?;
        Ok(Keeper { listener, daemon })
    }

    /// Serves front-ends one after the other, for ever.
    pub fn run(&self) -> Result<(), KeeperError> {
        loop {
            let (frontend, _) = self.listener.accept().map_err(KeeperError::Accept)?;
            info!("front-end connected");
            serve(frontend, &self.daemon);
            info!("front-end gone; waiting for the next");
        }
    }
}

/// Serves one front-end connection until the front-end closes it.
pub fn serve(frontend: UnixStream, daemon: &DaemonSocket) {
    let mut connection = Connection {
        daemon_socket: daemon.clone(),
        frontend,
        frontend_channel: None,
        daemon: None,
        setup: FrontendSetup::default(),
        mappings: Mappings::default(),
        awaiting: None,
        held: None,
        losses: 0,
        next_attempt: Instant::now(),
    };
    if let Err(e) = connection.serve() {
        debug!("front-end connection ended: {e}");
    }
}

/// A daemon serving the connection now.
struct Daemon {
    socket: UnixStream,
    /// The keeper's end of the daemon's back-end request channel.
    channel: Option<UnixStream>,
}

struct Connection {
    daemon_socket: DaemonSocket,
    frontend: UnixStream,
    /// The front-end's back-end request channel (`SET_BACKEND_REQ_FD`).
    frontend_channel: Option<UnixStream>,
    daemon: Option<Daemon>,
    setup: FrontendSetup,
    mappings: Mappings,
    /// The front-end request the daemon is to answer (without its descriptors).
    awaiting: Option<Message>,
    /// A front-end request only a daemon can answer, kept until one is there.
    held: Option<Message>,
    losses: u64,
    next_attempt: Instant,
}

/// What one poll found readable.
#[derive(Default)]
struct Ready {
    frontend: bool,
    frontend_channel: bool,
    daemon: bool,
    daemon_channel: bool,
}

impl Connection {
    /// Relays until the front-end goes (`Err`: how it went).
    fn serve(&mut self) -> io::Result<()> {
        loop {
            if self.daemon.is_none() && Instant::now() >= self.next_attempt {
                self.attach();
            }
            let ready = self.poll()?;
            if ready.frontend_channel {
                self.relay_frontend_answer();
            }
            if ready.daemon_channel && self.daemon.is_some() {
                self.relay_backend_request();
            }
            if ready.daemon && self.daemon.is_some() {
                self.relay_daemon_answer()?;
            }
            if ready.frontend {
                match Message::receive(&self.frontend)? {
                    Some(message) => self.relay_frontend_request(message)?,
                    None => return Ok(()),
                }
            }
        }
    }

    /// Waits until a socket is readable or the next attempt to reach a daemon is due.
    fn poll(&self) -> io::Result<Ready> {
        // Without a daemon the front-end is read only when the keeper can answer it: not
        // before a daemon ever answered, and not while a request waits for one.
        let read_frontend =
            self.daemon.is_some() || (self.setup.is_started() && self.held.is_none());
        let daemon = self.daemon.as_ref();
        let candidates = [
            read_frontend.then_some(self.frontend.as_raw_fd()),
            self.frontend_channel.as_ref().map(AsRawFd::as_raw_fd),
            daemon.map(|d| d.socket.as_raw_fd()),
            daemon
                .and_then(|d| d.channel.as_ref())
                .map(AsRawFd::as_raw_fd),
        ];
        let mut fds: Vec<libc::pollfd> = candidates
            .iter()
            .map(|fd| libc::pollfd {
                fd: fd.unwrap_or(-1),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let timeout_ms = match daemon {
            Some(_) => -1,
            None => {
                let left = self.next_attempt.saturating_duration_since(Instant::now());
                i32::try_from(left.as_millis()).unwrap_or(i32::MAX)
            }
        };
        loop {
            // SAFETY: `fds` is a live array of `fds.len()` pollfd entries (negative fds are
            // ignored by poll), which poll only writes `revents` of.
            let count =
                unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
            if count >= 0 {
                break;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        let readable = |i: usize| fds[i].fd >= 0 && fds[i].revents != 0;
        Ok(Ready {
            frontend: readable(0),
            frontend_channel: readable(1),
            daemon: readable(2),
            daemon_channel: readable(3),
        })
    }

    fn relay_frontend_request(&mut self, message: Message) -> io::Result<()> {
        if message.request() == FrontendReq::SET_BACKEND_REQ_FD as u32 {
            return self.backend_channel_given(message);
        }
        if let Err(e) = self.setup.record(&message) {
            warn!("cannot keep request {}: {e}", message.request());
        }
        self.forward_or_answer(message)
    }

    /// Sends a front-end request to the daemon, or answers it without one.
    fn forward_or_answer(&mut self, message: Message) -> io::Result<()> {
        let copy = Message::new(
            message.request(),
            message.flags(),
            message.payload.clone(),
            vec![],
        );
        if let Some(daemon) = &self.daemon {
            match message.send(&daemon.socket) {
                Ok(()) => {
                    if expects_reply(&message) {
                        self.awaiting = Some(copy);
                    }
                    return Ok(());
                }
                Err(e) => {
                    warn!("daemon unreachable: {e}");
                    self.lose_daemon();
                }
            }
        }
        self.answer_locally(message)
    }

    fn answer_locally(&mut self, message: Message) -> io::Result<()> {
        if !expects_reply(&message) {
            return Ok(());
        }
        match self.setup.answer(&message) {
            Some(answer) => answer.send(&self.frontend),
            None => {
                info!("request {} waits for a daemon", message.request());
                self.held = Some(message);
                Ok(())
            }
        }
    }

    /// `SET_BACKEND_REQ_FD`: the keeper keeps the front-end's channel and gives the daemon
    /// one of its own, relaying between them.
    fn backend_channel_given(&mut self, mut message: Message) -> io::Result<()> {
        let Some(fd) = message.fds.pop() else {
            warn!("SET_BACKEND_REQ_FD without a descriptor");
            if wants_reply(&message) {
                Message::reply(message.request(), 1).send(&self.frontend)?;
            }
            return Ok(());
        };
        self.frontend_channel = Some(UnixStream::from(fd));
        self.mappings.clear();
        if self.daemon.is_some() {
            let (ours, theirs) = UnixStream::pair()?;
            let relayed = Message::new(
                message.request(),
                message.flags(),
                message.payload.clone(),
                vec![OwnedFd::from(theirs)],
            );
            if let Some(daemon) = &mut self.daemon {
                daemon.channel = Some(ours);
            }
            return self.forward_or_answer(relayed);
        }
        self.answer_locally(message)
    }

    fn relay_daemon_answer(&mut self) -> io::Result<()> {
        let Some(daemon) = &self.daemon else {
            return Ok(());
        };
        let answer = match Message::receive(&daemon.socket) {
            Ok(Some(answer)) => answer,
            Ok(None) => {
                warn!("the daemon closed the connection");
                self.lose_daemon();
                return Ok(());
            }
            Err(e) => {
                warn!("the daemon's connection failed: {e}");
                self.lose_daemon();
                return Ok(());
            }
        };
        let Some(request) = self.awaiting.take() else {
            warn!("the daemon sent {} unasked; dropped", answer.request());
            return Ok(());
        };
        self.setup.learn(request.request(), &answer);
        answer.send(&self.frontend)
    }

    fn relay_backend_request(&mut self) {
        let Some(channel) = self.daemon.as_ref().and_then(|d| d.channel.as_ref()) else {
            return;
        };
        let request = match Message::receive(channel) {
            Ok(Some(request)) => request,
            Ok(None) | Err(_) => {
                // The daemon's end closes with the daemon; its front-end socket says so.
                if let Some(daemon) = &mut self.daemon {
                    daemon.channel = None;
                }
                return;
            }
        };
        match &self.frontend_channel {
            Some(frontend_channel) => {
                self.mappings.sent(&request, Origin::Daemon);
                if let Err(e) = request.send(frontend_channel) {
                    warn!("cannot pass a back-end request to the front-end: {e}");
                }
            }
            None => warn!(
                "back-end request {} with no front-end channel; dropped",
                request.request()
            ),
        }
    }

    fn relay_frontend_answer(&mut self) {
        let Some(frontend_channel) = &self.frontend_channel else {
            return;
        };
        let answer = match Message::receive(frontend_channel) {
            Ok(Some(answer)) => answer,
            Ok(None) | Err(_) => {
                warn!("the front-end closed its back-end channel");
                self.frontend_channel = None;
                return;
            }
        };
        match self.mappings.answered(&answer) {
            Some(Origin::Daemon) => {
                if let Some(channel) = self.daemon.as_ref().and_then(|d| d.channel.as_ref()) {
                    if let Err(e) = answer.send(channel) {
                        debug!("cannot pass an answer to the daemon: {e}");
                    }
                }
            }
            Some(Origin::Keeper) => {
                if payload_u64(&answer.payload, 0) != Some(0) {
                    warn!("the front-end refused to remove a mapping of the lost daemon");
                }
            }
            None => warn!("an answer on the back-end channel that nothing asked for"),
        }
        if self.daemon.is_none() {
            // A mapping the lost daemon asked for may have been made only now.
            self.remove_mappings();
        }
    }

    /// The daemon is gone: answer what it left unanswered, remove its mappings, look for
    /// the next.
    fn lose_daemon(&mut self) {
        self.daemon = None;
        self.losses += 1;
        warn!(
            "daemon lost ({} so far); {} mapping(s) to remove",
            self.losses,
            self.mappings.live()
        );
        if let Some(request) = self.awaiting.take() {
            if let Err(e) = self.answer_locally(request) {
                warn!("cannot answer the front-end: {e}");
            }
        }
        self.remove_mappings();
        self.next_attempt = Instant::now();
    }

    fn remove_mappings(&mut self) {
        let Some(channel) = &self.frontend_channel else {
            return;
        };
        for removal in self.mappings.unmap_all(self.setup.reply_ack()) {
            if let Err(e) = removal.send(channel) {
                warn!("cannot remove a mapping of the lost daemon: {e}");
            }
        }
    }

    /// Tries to reach a daemon; a connection with a history is replayed to it first.
    fn attach(&mut self) {
        self.next_attempt = Instant::now() + self.daemon_socket.retry;
        let socket = match UnixStream::connect(&self.daemon_socket.path) {
            Ok(socket) => socket,
            Err(e) => {
                debug!("no daemon at {}: {e}", self.daemon_socket.path.display());
                return;
            }
        };
        if !self.setup.is_started() {
            info!("daemon attached");
            self.daemon = Some(Daemon {
                socket,
                channel: None,
            });
            return;
        }
        let channel = match self.replay(&socket) {
            Ok(channel) => channel,
            Err(e) => {
                warn!("the daemon could not take the connection over: {e}");
                return;
            }
        };
        info!(
            "daemon attached after {} loss(es); set-up replayed",
            self.losses
        );
        self.daemon = Some(Daemon { socket, channel });
        self.kick_vrings();
        if let Some(held) = self.held.take() {
            if let Err(e) = self.forward_or_answer(held) {
                warn!("cannot pass the waiting request on: {e}");
            }
        }
    }

    /// Gives `socket`'s daemon the connection's set-up; returns the keeper's end of its
    /// back-end channel.
    fn replay(&self, socket: &UnixStream) -> Result<Option<UnixStream>, ReplayError> {
        let ack = if self.setup.reply_ack() {
            FLAG_NEED_REPLY
        } else {
            0
        };
        let pair = match self.frontend_channel {
            Some(_) => Some(UnixStream::pair()?),
            None => None,
        };
        let channel_request = match &pair {
            Some((_, theirs)) => Some(Message::new(
                FrontendReq::SET_BACKEND_REQ_FD as u32,
                FLAG_VERSION | ack,
                vec![],
                vec![OwnedFd::from(theirs.try_clone()?)],
            )),
            None => None,
        };
        let resume = Resume {
            losses: self.losses,
            last_config: self.setup.last_config().to_vec(),
        };
        let steps = self.setup.replay(resume.to_message(), channel_request)?;
        socket.set_read_timeout(Some(self.daemon_socket.replay_timeout))?;
        for step in steps {
            let request = step.message.request();
            step.message.send(socket)?;
            if !step.answered {
                continue;
            }
            let answer = Message::receive(socket)?.ok_or(ReplayError::Closed)?;
            if answer.request() != request {
                return Err(ReplayError::Mismatch {
                    request,
                    answered: answer.request(),
                });
            }
            let value = payload_u64(&answer.payload, 0).unwrap_or(u64::MAX);
            match step.must_offer {
                Some(used) if value & used != used => {
                    return Err(ReplayError::Features {
                        request,
                        offered: value,
                        used,
                    })
                }
                Some(_) => {}
                None if value != 0 => {
                    return Err(ReplayError::Refused {
                        request,
                        status: value,
                    })
                }
                None => {}
            }
        }
        socket.set_read_timeout(None)?;
        Ok(pair.map(|(ours, _)| ours))
    }

    /// Kicks every started vring once: the new daemon serves what was posted meanwhile.
    fn kick_vrings(&self) {
        for fd in self.setup.kick_fds() {
            let kicked = fd
                .try_clone()
                .map(std::fs::File::from)
                .and_then(|mut eventfd| eventfd.write_all(&1u64.to_ne_bytes()));
            if let Err(e) = kicked {
                warn!("cannot kick a vring: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests;

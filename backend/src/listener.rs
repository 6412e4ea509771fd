//! Serves many guests at once: one vhost-user daemon per accepted connection.
//!
//! vhost-user-backend's `VhostUserDaemon` serves exactly one connection. The [`Listener`] owns
//! the listening socket, waits until a connection is pending, builds a fresh handler with the
//! factory and a daemon for it, lets the daemon accept that connection and serves it on a
//! thread of its own. When the guest goes, its worker threads are stopped, its handler is
//! reset (every host object of that guest released) and dropped; listening goes on.
//! [`run_all`] serves several sockets (one per configured guest), each on a thread of its own.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use log::{error, info, warn};
use vhost::vhost_user::Listener as SocketListener;
use vhost_user_backend::{ShutdownHandle, VhostUserDaemon};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::vhost_device::backend_channel::BackendChannel;
use crate::vhost_device::frontend_filter::{self, FilterHooks};
use crate::vhost_device::handler::DeviceHandler;
use crate::vhost_device::VhuVrdma;

/// Errors of the [`Listener`].
#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    /// The socket could not be bound.
    #[error("cannot listen on {path}: {source}")]
    Bind {
        /// Socket path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: vhost::vhost_user::Error,
    },
    /// Waiting for connections failed.
    #[error("cannot wait for connections: {0}")]
    Wait(#[source] io::Error),
    /// Creating the stop event failed.
    #[error("cannot create the stop event: {0}")]
    StopEvent(#[source] io::Error),
}

/// Makes [`Listener::run`] return (from any thread).
#[derive(Clone)]
pub struct StopHandle {
    event: Arc<EventFd>,
}

impl StopHandle {
    /// Asks the listener to stop: it disconnects every guest, waits for their handlers to be
    /// reset and returns.
    pub fn stop(&self) {
        if let Err(e) = self.event.write(1) {
            error!("cannot signal the listener to stop: {e}");
        }
    }
}

struct Connection {
    id: u64,
    shutdown: Option<ShutdownHandle>,
    thread: JoinHandle<()>,
}

const STOP_TOKEN: u64 = 0;
const SOCKET_TOKEN: u64 = 1;

/// A vhost-user socket serving one fresh handler per connection.
pub struct Listener<F> {
    socket: SocketListener,
    path: PathBuf,
    factory: F,
    stop: Arc<EventFd>,
    connections: Vec<Connection>,
}

/// Connection numbers, unique in the daemon (several listeners log side by side).
static NEXT_CONNECTION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl<H, E, F> Listener<F>
where
    H: DeviceHandler,
    E: std::fmt::Display,
    F: FnMut() -> Result<H, E>,
{
    /// Binds `path` (a stale socket file there is removed first). `factory` builds the handler
    /// of each new connection when one is pending.
    pub fn bind(path: impl AsRef<Path>, factory: F) -> Result<Self, ListenerError> {
        let path = path.as_ref().to_path_buf();
        let socket = SocketListener::new(&path, true).map_err(|source| ListenerError::Bind {
            path: path.clone(),
            source,
        })?;
        let stop = EventFd::new(EFD_NONBLOCK).map_err(ListenerError::StopEvent)?;
        Ok(Listener {
            socket,
            path,
            factory,
            stop: Arc::new(stop),
            connections: Vec::new(),
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A handle that makes [`Listener::run`] return.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle {
            event: self.stop.clone(),
        }
    }

    /// Accepts and serves connections until [`StopHandle::stop`]. On return every connection
    /// has been closed and its handler reset.
    pub fn run(&mut self) -> Result<(), ListenerError> {
        let result = self.accept_until_stopped();
        self.disconnect_all();
        result
    }

    fn accept_until_stopped(&mut self) -> Result<(), ListenerError> {
        let epoll = Epoll::new().map_err(ListenerError::Wait)?;
        for (fd, token) in [
            (self.stop.as_raw_fd(), STOP_TOKEN),
            (self.socket.as_raw_fd(), SOCKET_TOKEN),
        ] {
            epoll
                .ctl(
                    ControlOperation::Add,
                    fd,
                    EpollEvent::new(EventSet::IN, token),
                )
                .map_err(ListenerError::Wait)?;
        }
        let mut ready = [EpollEvent::default(); 2];
        loop {
            let count = match epoll.wait(-1, &mut ready) {
                Ok(count) => count,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(ListenerError::Wait(e)),
            };
            self.reap_finished();
            if ready[..count].iter().any(|e| e.data() == STOP_TOKEN) {
                info!("{}: stopping", self.path.display());
                return Ok(());
            }
            if ready[..count].iter().any(|e| e.data() == SOCKET_TOKEN) {
                self.accept_one();
            }
        }
    }

    /// Serves the pending connection; a connection that cannot be served is closed.
    ///
    /// The handler is built before the accept because `VhostUserDaemon` accepts by itself;
    /// waiting for readability first keeps idle listeners from holding a spare handler.
    fn accept_one(&mut self) {
        let id = NEXT_CONNECTION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let handler = match (self.factory)() {
            Ok(handler) => handler,
            Err(e) => {
                error!("guest {id}: cannot create a device: {e}; closing its connection");
                self.refuse_pending();
                return;
            }
        };
        let frontend = match self.socket.accept() {
            Ok(Some(stream)) => stream,
            Ok(None) => return,
            Err(e) => {
                warn!("guest {id}: cannot accept: {e}");
                return;
            }
        };
        // On failure the stream is dropped, which closes it: the frontend sees a disconnect.
        match start_connection(id, handler, frontend) {
            Ok(connection) => self.connections.push(connection),
            Err(e) => error!("guest {id}: cannot serve: {e}"),
        }
    }

    fn refuse_pending(&mut self) {
        // Dropping the accepted stream closes it; the frontend sees a disconnect.
        if let Err(e) = self.socket.accept() {
            warn!("cannot accept the connection to refuse it: {e}");
        }
    }

    fn reap_finished(&mut self) {
        let (finished, running): (Vec<_>, Vec<_>) = self
            .connections
            .drain(..)
            .partition(|connection| connection.thread.is_finished());
        self.connections = running;
        for connection in finished {
            join(connection);
        }
    }

    fn disconnect_all(&mut self) {
        for connection in &self.connections {
            if let Some(shutdown) = &connection.shutdown {
                shutdown.shutdown();
            }
        }
        for connection in self.connections.drain(..) {
            join(connection);
        }
    }
}

/// Serves every listener on a thread of its own until each has stopped (through its
/// [`StopHandle`]). A listener that fails stops the others, and the first error is returned.
pub fn run_all<H, E, F>(listeners: &mut [Listener<F>]) -> Result<(), ListenerError>
where
    H: DeviceHandler,
    E: std::fmt::Display,
    F: FnMut() -> Result<H, E> + Send,
{
    let stops: Vec<StopHandle> = listeners.iter().map(Listener::stop_handle).collect();
    thread::scope(|scope| {
        let threads: Vec<_> = listeners
            .iter_mut()
            .map(|listener| {
                let stops = &stops;
                scope.spawn(move || {
                    let result = listener.run();
                    if let Err(e) = &result {
                        error!("{}: {e}; stopping every listener", listener.path.display());
                        stops.iter().for_each(StopHandle::stop);
                    }
                    result
                })
            })
            .collect();
        let mut first = Ok(());
        for thread in threads {
            let result = thread.join().unwrap_or_else(|_| {
                stops.iter().for_each(StopHandle::stop);
                Err(ListenerError::Wait(io::Error::other(
                    "a listener thread panicked",
                )))
            });
            if first.is_ok() {
                first = result;
            }
        }
        first
    })
}

fn join(connection: Connection) {
    if connection.thread.join().is_err() {
        error!("guest {}: its connection thread panicked", connection.id);
    }
}

/// Builds the daemon of one guest, connects it to `frontend` through the
/// [`frontend_filter`] and serves it on a new thread.
fn start_connection<H: DeviceHandler>(
    id: u64,
    handler: H,
    frontend: UnixStream,
) -> Result<Connection, Box<dyn std::error::Error>> {
    let memory = GuestMemoryAtomic::new(GuestMemoryMmap::new());
    let handler = Arc::new(handler);
    let backend = Arc::new(VhuVrdma::new(handler.clone(), memory.clone())?);
    let mut daemon = VhostUserDaemon::new(format!("vrdma-guest-{id}"), backend.clone(), memory)
        .map_err(|e| format!("cannot create the daemon: {e}"))?;
    backend.attach(&daemon.get_epoll_handlers())?;
    let daemon_end = connect_daemon(&mut daemon)?;
    let features_handler = handler.clone();
    let channel_device = backend.clone();
    let resumed_device = backend.clone();
    let filter = frontend_filter::start(
        frontend,
        daemon_end,
        FilterHooks {
            is_device_mapping: Arc::new(move |file: &std::fs::File| {
                handler.is_device_mapping(file)
            }),
            on_protocol_features: Arc::new(move |acked| {
                features_handler.frontend_protocol_features(acked)
            }),
            on_backend_channel: Arc::new(move |socket, acked| {
                channel_device
                    .context()
                    .shmem()
                    .set_channel(BackendChannel::new(socket, acked))
            }),
            on_resume: Arc::new(move |resume| resumed_device.resume(&resume)),
        },
    )?;
    info!("guest {id}: connected");
    let shutdown = daemon.shutdown_handle();
    let thread = thread::Builder::new()
        .name(format!("vrdma-guest-{id}"))
        .spawn(move || {
            serve_until_disconnect(id, daemon, backend);
            filter.join();
        })?;
    Ok(Connection {
        id,
        shutdown,
        thread,
    })
}

/// Lets `daemon` accept a connection on a private socket (vhost-user-backend serves only
/// connections it accepts itself) and returns the other end.
fn connect_daemon<H: DeviceHandler>(
    daemon: &mut VhostUserDaemon<Arc<VhuVrdma<H>>>,
) -> Result<UnixStream, Box<dyn std::error::Error>> {
    let dir = PrivateDir::create()?;
    let path = dir.path.join("daemon.sock");
    let mut listener = SocketListener::from(UnixListener::bind(&path)?);
    // The connection is queued in the backlog until the daemon accepts it.
    let stream = UnixStream::connect(&path)?;
    daemon
        .start(&mut listener)
        .map_err(|e| format!("cannot start the daemon: {e}"))?;
    Ok(stream)
}

/// A directory only this user can enter, removed on drop.
struct PrivateDir {
    path: PathBuf,
}

impl PrivateDir {
    fn create() -> io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let unique = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("vrdma-backend-{}-{unique}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(PrivateDir { path })
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            warn!("cannot remove {}: {e}", self.path.display());
        }
    }
}

fn serve_until_disconnect<H: DeviceHandler>(
    id: u64,
    mut daemon: VhostUserDaemon<Arc<VhuVrdma<H>>>,
    backend: Arc<VhuVrdma<H>>,
) {
    match daemon.wait() {
        // A frontend that closes its socket (process exit, QEMU quitting) is the normal end.
        Ok(())
        | Err(vhost_user_backend::Error::HandleRequest(vhost::vhost_user::Error::Disconnected)) => {
            info!("guest {id}: disconnected")
        }
        Err(e) => warn!("guest {id}: connection ended: {e}"),
    }
    // Dropping the daemon stops and joins its worker threads, so the handler is reset with no
    // request in flight.
    drop(daemon);
    backend.close_leaked_exit_fds();
    backend.handler().reset();
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::guest_device::GuestDevice;

    #[test]
    fn several_sockets_are_served_and_stopped_together() {
        let dir = PrivateDir::create().unwrap();
        let tried = [AtomicUsize::new(0), AtomicUsize::new(0)];
        let mut listeners: Vec<_> = tried
            .iter()
            .enumerate()
            .map(|(i, tried)| {
                // A factory that cannot make a device: each connection is closed at once,
                // which is enough to see which socket served it.
                Listener::bind(dir.path.join(format!("{i}.sock")), move || {
                    tried.fetch_add(1, Ordering::SeqCst);
                    Err::<GuestDevice, _>("no device in this test")
                })
                .unwrap()
            })
            .collect();
        let stops: Vec<_> = listeners.iter().map(Listener::stop_handle).collect();
        let paths: Vec<_> = listeners.iter().map(|l| l.path().to_owned()).collect();
        thread::scope(|scope| {
            let server = scope.spawn(|| run_all(&mut listeners));
            for (path, tried) in paths.iter().zip(&tried) {
                let mut stream = UnixStream::connect(path).unwrap();
                // The refused connection is closed: end of file.
                assert_eq!(stream.read(&mut [0u8; 1]).unwrap(), 0);
                assert_eq!(tried.load(Ordering::SeqCst), 1);
            }
            // The daemon's signal thread stops every listener.
            stops.iter().for_each(StopHandle::stop);
            server.join().unwrap().unwrap();
        });
    }
}

//! The TCP connection that carries the out-of-band lines, with every wait bounded.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::exchange::{ExchangeError, Message, MAX_LINE};

/// Why the out-of-band connection failed.
#[derive(Debug, thiserror::Error)]
pub enum OobError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("no peer within {0:?}")]
    Timeout(Duration),
    #[error("peer closed the connection")]
    Closed,
    #[error("peer sent a bad line: {0}")]
    BadLine(#[from] ExchangeError),
    #[error("peer failed: {0}")]
    PeerFailed(String),
}

fn io_error(what: impl Into<String>) -> impl FnOnce(io::Error) -> OobError {
    let what = what.into();
    move |source| OobError::Io { what, source }
}

/// One side's end of the out-of-band connection.
pub struct Channel {
    stream: TcpStream,
    timeout: Duration,
    /// A line that [`Channel::check_peer`] read ahead.
    pending: Option<Message>,
}

impl Channel {
    /// Listens on `host:port` and accepts one client within `timeout`.
    pub fn accept(host: &str, port: u16, timeout: Duration) -> Result<Channel, OobError> {
        let listener = TcpListener::bind((host, port))
            .map_err(io_error(format!("listening on {host}:{port}")))?;
        Self::accept_on(listener, timeout)
    }

    /// [`Channel::accept`] on a listener bound beforehand.
    pub fn accept_on(listener: TcpListener, timeout: Duration) -> Result<Channel, OobError> {
        listener
            .set_nonblocking(true)
            .map_err(io_error("configuring the listener"))?;
        let deadline = Instant::now() + timeout;
        loop {
            match listener.accept() {
                Ok((stream, peer)) => {
                    log::info!("client {peer} connected");
                    return Channel::new(stream, timeout);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(OobError::Timeout(timeout));
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(io_error("accepting")(e)),
            }
        }
    }

    /// Connects to `host:port`, retrying while nobody listens yet, for up to `timeout`.
    pub fn connect(host: &str, port: u16, timeout: Duration) -> Result<Channel, OobError> {
        let addrs: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(io_error(format!("resolving {host}")))?
            .collect();
        let deadline = Instant::now() + timeout;
        loop {
            let mut last = None;
            for addr in &addrs {
                match TcpStream::connect_timeout(addr, timeout) {
                    Ok(stream) => return Channel::new(stream, timeout),
                    Err(e) => last = Some(e),
                }
            }
            if Instant::now() >= deadline {
                return Err(match last {
                    Some(e) => io_error(format!("connecting to {host}:{port}"))(e),
                    None => OobError::Timeout(timeout),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn new(stream: TcpStream, timeout: Duration) -> Result<Channel, OobError> {
        stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_nodelay(true))
            .and_then(|()| stream.set_read_timeout(Some(timeout)))
            .and_then(|()| stream.set_write_timeout(Some(timeout)))
            .map_err(io_error("configuring the connection"))?;
        Ok(Channel {
            stream,
            timeout,
            pending: None,
        })
    }

    /// Sends one message.
    pub fn send(&mut self, message: &Message) -> Result<(), OobError> {
        self.stream
            .write_all(message.to_line().as_bytes())
            .map_err(io_error("sending to the peer"))
    }

    /// Receives one message, waiting at most the channel's timeout. An `error` line from the
    /// peer becomes [`OobError::PeerFailed`].
    pub fn receive(&mut self) -> Result<Message, OobError> {
        match self.pending.take() {
            Some(message) => Ok(message),
            None => self.read_message(),
        }
    }

    fn read_message(&mut self) -> Result<Message, OobError> {
        // Byte by byte: lines are few and short, and nothing may be read past the newline.
        let mut line = Vec::with_capacity(128);
        let mut byte = [0u8; 1];
        loop {
            match self.stream.read(&mut byte) {
                Ok(0) if line.is_empty() => return Err(OobError::Closed),
                Ok(0) => {
                    return Err(OobError::BadLine(ExchangeError::NotOurProtocol(lossy(
                        &line,
                    ))))
                }
                Ok(_) => {
                    line.push(byte[0]);
                    if byte[0] == b'\n' {
                        break;
                    }
                    if line.len() >= MAX_LINE {
                        return Err(ExchangeError::TooLong.into());
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(OobError::Timeout(self.timeout));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error("receiving from the peer")(e)),
            }
        }
        let text = std::str::from_utf8(&line).map_err(|_| ExchangeError::NotAscii)?;
        match Message::parse(text)? {
            Message::Error(text) => Err(OobError::PeerFailed(text)),
            message => Ok(message),
        }
    }

    /// Returns at once: an error if the peer has reported a failure or hung up, `Ok` otherwise.
    /// Called while polling completions, so that a dead peer ends the wait early. A regular
    /// line that arrives meanwhile (the peer finishing first) is kept for [`Channel::receive`].
    pub fn check_peer(&mut self) -> Result<(), OobError> {
        if self.pending.is_some() {
            return Ok(());
        }
        let mut byte = [0u8; 1];
        self.stream
            .set_nonblocking(true)
            .map_err(io_error("configuring the connection"))?;
        let peeked = self.stream.peek(&mut byte);
        self.stream
            .set_nonblocking(false)
            .map_err(io_error("configuring the connection"))?;
        match peeked {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(io_error("checking the peer")(e)),
            Ok(0) => Err(OobError::Closed),
            Ok(_) => {
                self.pending = Some(self.read_message()?);
                Ok(())
            }
        }
    }

    /// Tells the peer why this side gives up; failures to do so are only logged, since the
    /// original error matters more.
    pub fn report_failure(&mut self, text: &str) {
        if let Err(e) = self.send(&Message::Error(text.to_string())) {
            log::warn!("could not tell the peer about the failure: {e}");
        }
    }
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Channel, Channel) {
        // The listener stays bound from the start: a port given up and bound again could be
        // taken by a parallel test in between.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            Channel::accept_on(listener, Duration::from_secs(5)).unwrap()
        });
        let client = Channel::connect("127.0.0.1", port, Duration::from_secs(5)).unwrap();
        (server.join().unwrap(), client)
    }

    #[test]
    fn lines_cross_and_failures_are_reported() {
        let (mut server, mut client) = pair();
        client.send(&Message::Ready).unwrap();
        assert_eq!(server.receive().unwrap(), Message::Ready);
        assert!(server.check_peer().is_ok(), "nothing pending");
        // A peer that finishes first: its line waits for receive().
        client.send(&Message::Done).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(server.check_peer().is_ok());
        assert_eq!(server.receive().unwrap(), Message::Done);
        client.report_failure("write 64 iteration 3: first differing offset 5");
        // check_peer looks only at what has arrived: wait until the failure line has.
        let deadline = Instant::now() + Duration::from_secs(30);
        let err = loop {
            match server.check_peer() {
                Err(e) => break e,
                Ok(()) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Ok(()) => panic!("the peer's failure never arrived"),
            }
        };
        assert!(
            matches!(&err, OobError::PeerFailed(t) if t.contains("offset 5")),
            "{err}"
        );
        drop(client);
        assert!(matches!(server.receive(), Err(OobError::Closed)));
    }

    #[test]
    fn receive_waits_at_most_the_timeout() {
        let (mut server, client) = pair();
        server
            .stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let start = Instant::now();
        assert!(matches!(server.receive(), Err(OobError::Timeout(_))));
        assert!(start.elapsed() < Duration::from_secs(5));
        drop(client);
    }

    #[test]
    fn garbage_from_the_peer_is_an_error() {
        let (mut server, mut client) = pair();
        client.stream.write_all(b"GET / HTTP/1.0\n").unwrap();
        assert!(matches!(server.receive(), Err(OobError::BadLine(_))));
    }

    #[test]
    fn nobody_listening_times_out() {
        // A port bound but never listened on refuses connections, and stays ours meanwhile.
        let (port, socket) = bound_not_listening();
        assert!(Channel::connect("127.0.0.1", port, Duration::from_millis(200)).is_err());
        // SAFETY: the descriptor bound_not_listening opened, closed once.
        unsafe { libc::close(socket) };
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(matches!(
            Channel::accept_on(listener, Duration::from_millis(100)),
            Err(OobError::Timeout(_))
        ));
    }

    /// A TCP socket bound to a free loopback port without listening: (port, descriptor).
    fn bound_not_listening() -> (u16, libc::c_int) {
        // SAFETY: plain socket calls on a descriptor this function owns; the address
        // structures are initialized and their sizes passed alongside.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            assert!(fd >= 0);
            let mut addr: libc::sockaddr_in = std::mem::zeroed();
            addr.sin_family = libc::AF_INET as libc::sa_family_t;
            addr.sin_addr.s_addr = u32::from_be_bytes([127, 0, 0, 1]).to_be();
            let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let bound = libc::bind(fd, (&addr as *const libc::sockaddr_in).cast(), len);
            assert_eq!(bound, 0);
            let mut got_len = len;
            let named = libc::getsockname(
                fd,
                (&mut addr as *mut libc::sockaddr_in).cast(),
                &mut got_len,
            );
            assert_eq!(named, 0);
            (u16::from_be(addr.sin_port), fd)
        }
    }
}

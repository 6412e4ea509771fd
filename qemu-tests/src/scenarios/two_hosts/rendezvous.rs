//! A one-shot rendezvous over the link: one host says that something of its own is ready (a
//! server listens), the other waits until it has heard so.
//!
//! Programs like perftest accept exactly one out-of-band connection and fail a client that
//! comes before they listen, so neither side can probe the other's port: the host that
//! serves announces on a second port, once its server listens, and the peer connects there
//! (retrying while the host is not there yet) before it starts its client.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::vm_link::Host;

/// What the announcing host writes.
const READY: &[u8] = b"ready\n";

/// Host `host` tells its peer, who connects to `port` on `host`'s address, that it is ready;
/// returns once the peer has read it, or fails after `timeout`.
pub fn announce(host: Host, port: u16, timeout: Duration) -> Result<()> {
    let address = host.scoped_address();
    let listener = TcpListener::bind((address.as_str(), port))
        .map_err(|e| Error::Scenario(format!("rendezvous on [{address}]:{port}: bind: {e}")))?;
    announce_on(listener, timeout)
}

/// Host `host` waits until its peer announces on `port` (see [`announce`]), for at most
/// `timeout`.
pub fn await_peer(host: Host, port: u16, timeout: Duration) -> Result<()> {
    await_announcement(&host.peer().scoped_address(), port, timeout)
}

fn announce_on(listener: TcpListener, timeout: Duration) -> Result<()> {
    let at = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let failed =
        |what: &str, e: std::io::Error| Error::Scenario(format!("rendezvous on {at}: {what}: {e}"));
    listener
        .set_nonblocking(true)
        .map_err(|e| failed("set_nonblocking", e))?;
    let deadline = Instant::now() + timeout;
    let mut stream = loop {
        match listener.accept() {
            Ok((stream, _)) => break stream,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(Error::Scenario(format!(
                        "rendezvous on {at}: the peer did not come within {timeout:?}"
                    )));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(failed("accept", e)),
        }
    };
    stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .and_then(|()| stream.write_all(READY))
        .map_err(|e| failed("write", e))?;
    // The peer closes once it has read the line: wait for that, so that the announcement is
    // not lost to a reset when this end closes first.
    let mut rest = Vec::new();
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.read_to_end(&mut rest))
        .map_err(|e| failed("waiting for the peer to close", e))?;
    Ok(())
}

fn await_announcement(address: &str, port: u16, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last_error = String::new();
    while Instant::now() < deadline {
        match TcpStream::connect((address, port)) {
            Ok(mut stream) => {
                let mut line = [0u8; READY.len()];
                stream
                    .set_read_timeout(Some(timeout))
                    .and_then(|()| stream.read_exact(&mut line))
                    .map_err(|e| {
                        Error::Scenario(format!("rendezvous with [{address}]:{port}: read: {e}"))
                    })?;
                if line != READY {
                    return Err(Error::Scenario(format!(
                        "rendezvous with [{address}]:{port}: got {:?}",
                        String::from_utf8_lossy(&line)
                    )));
                }
                return Ok(());
            }
            Err(e) => last_error = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(Error::Scenario(format!(
        "rendezvous with [{address}]:{port}: nobody within {timeout:?} ({last_error})"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_waiting_side_returns_once_the_other_announces() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let announcer = std::thread::spawn(move || announce_on(listener, Duration::from_secs(60)));
        await_announcement("127.0.0.1", port, Duration::from_secs(60)).unwrap();
        announcer.join().unwrap().unwrap();
    }

    #[test]
    fn a_stranger_is_not_an_announcement() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stranger = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            stream.write_all(b"hello\n").unwrap();
        });
        let err = await_announcement("127.0.0.1", port, Duration::from_secs(60)).unwrap_err();
        assert!(err.to_string().contains("hello"), "{err}");
        stranger.join().unwrap();
    }

    #[test]
    fn nobody_announcing_is_an_error_after_the_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let err = announce_on(listener, Duration::from_millis(50)).unwrap_err();
        assert!(err.to_string().contains("did not come"), "{err}");
    }
}

//! Byte relays that carry the ping-pong's out-of-band TCP exchange over a virtio-serial port,
//! so that a nested guest reaches its peer without any network (the test VMs have none).
//!
//! Guest side: a TCP listener on loopback whose one connection is pumped to the serial port.
//! Host side: the port's QEMU chardev socket pumped to the peer's TCP port.
//!
//! A link opens when the guest side says so: once its port is open it sends [`HELLO`], and
//! only then does the host side connect or accept its TCP end. Until then the host side
//! follows the chardev across QEMU processes: a boot that dies before its command started is
//! booted once more with the same chardevs ([`crate::vm::run`]), and a peer that serves one
//! connection must not be used up by a QEMU whose guest never reached it.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::error::{Error, IoContext, Result};

/// One end of a relay: something to read from and write to, and a way to say "no more data".
pub trait RelayEnd: Read + Write + Send + 'static {
    /// A second handle on the same stream, for the other direction.
    fn try_clone_end(&self) -> io::Result<Box<dyn RelayEnd>>;
    /// Tells the other side that nothing more will be written (half-close), where possible.
    fn finish_writing(&mut self);
}

impl RelayEnd for TcpStream {
    fn try_clone_end(&self) -> io::Result<Box<dyn RelayEnd>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn finish_writing(&mut self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

impl RelayEnd for UnixStream {
    fn try_clone_end(&self) -> io::Result<Box<dyn RelayEnd>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn finish_writing(&mut self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

impl RelayEnd for File {
    fn try_clone_end(&self) -> io::Result<Box<dyn RelayEnd>> {
        Ok(Box::new(self.try_clone()?))
    }
    // A serial port has no half-close: the peer learns the end from the protocol itself.
    fn finish_writing(&mut self) {}
}

/// Copies `a` to `b` and `b` to `a` on two threads until each direction ends; returns the
/// threads, which end when both streams close.
pub fn pump(a: Box<dyn RelayEnd>, b: Box<dyn RelayEnd>) -> Result<Vec<JoinHandle<()>>> {
    let a2 = a.try_clone_end().context(|| "cloning a relay end".into())?;
    let b2 = b.try_clone_end().context(|| "cloning a relay end".into())?;
    Ok(vec![copy_thread(a, b2), copy_thread(b, a2)])
}

fn copy_thread(mut from: Box<dyn RelayEnd>, mut to: Box<dyn RelayEnd>) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).and_then(|()| to.flush()).is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        to.finish_writing();
    })
}

/// The character device of the virtio-serial port named `name` (`virtserialport,name=…`),
/// found through sysfs since the test guests run no udev.
pub fn serial_port_device(name: &str) -> Result<PathBuf> {
    port_device_in(Path::new("/sys/class/virtio-ports"), name)
}

fn port_device_in(class: &Path, name: &str) -> Result<PathBuf> {
    let entries = std::fs::read_dir(class)
        .context(|| format!("listing {} (virtio_console loaded?)", class.display()))?;
    for entry in entries.flatten() {
        let port_name = std::fs::read_to_string(entry.path().join("name")).unwrap_or_default();
        if port_name.trim() == name {
            return Ok(Path::new("/dev").join(entry.file_name()));
        }
    }
    Err(Error::Scenario(format!(
        "no virtio-serial port named {name} under {}",
        class.display()
    )))
}

/// Opens the virtio-serial port `name` for reading and writing.
pub fn open_serial_port(name: &str) -> Result<File> {
    open_device(&serial_port_device(name)?)
}

fn open_device(device: &Path) -> Result<File> {
    File::options()
        .read(true)
        .write(true)
        .open(device)
        .context(|| format!("opening {}", device.display()))
}

/// What a guest-side relay sends first, once its serial port is open.
pub const HELLO: u8 = 0x06;

/// Guest side: the serial port `device`, opened, its hello sent.
fn open_and_greet(device: &Path) -> Result<File> {
    let mut serial = open_device(device)?;
    serial
        .write_all(&[HELLO])
        .and_then(|()| serial.flush())
        .context(|| format!("greeting over {}", device.display()))?;
    Ok(serial)
}

/// Host side: the QEMU chardev socket at `chardev` once its guest side said hello. A socket
/// that QEMU closes first (it exited before the guest opened the port) is connected to again,
/// as the next QEMU opens it, until `deadline`.
fn open_chardev(chardev: &Path, deadline: Instant) -> Result<UnixStream> {
    let what = || format!("waiting for the guest side of {}", chardev.display());
    loop {
        let mut serial = retry(deadline, || UnixStream::connect(chardev))
            .context(|| format!("connecting to {}", chardev.display()))?;
        let left = deadline.saturating_duration_since(Instant::now());
        serial
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .context(what)?;
        let mut byte = [0u8];
        // A reset is a close too: a connection that reached a QEMU's listening chardev just as
        // that QEMU went (queued, never accepted) is reset, not ended.
        let read = match serial.read(&mut byte) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(0),
            other => other,
        };
        match read.context(what)? {
            0 => log::info!(
                "{}: closed before its guest side spoke; waiting for the next QEMU",
                chardev.display()
            ),
            _ if byte[0] == HELLO => {
                serial.set_read_timeout(None).context(what)?;
                return Ok(serial);
            }
            _ => {
                return Err(Error::Scenario(format!(
                    "{}: the guest side sent {:#04x} before its hello",
                    chardev.display(),
                    byte[0]
                )))
            }
        }
    }
}

/// A listener on `127.0.0.1:port`.
pub fn listen_loopback(port: u16) -> Result<TcpListener> {
    TcpListener::bind(("127.0.0.1", port)).context(|| format!("listening on port {port}"))
}

/// Guest side: accepts one TCP connection on `listener` (bound beforehand, so that a client
/// started right after cannot find the port closed) and relays it to the serial port `name`.
/// Returns once both directions have ended.
pub fn serve_serial(listener: TcpListener, name: &str, timeout: Duration) -> Result<()> {
    let device = serial_port_device(name)?;
    let stream = accept_before(&listener, Instant::now() + timeout)?;
    let serial = open_and_greet(&device)?;
    for thread in pump(Box::new(stream), Box::new(serial))? {
        let _ = thread.join();
    }
    Ok(())
}

/// The next connection to `listener`, waiting until `deadline`.
fn accept_before(listener: &TcpListener, deadline: Instant) -> Result<TcpStream> {
    let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
    listener
        .set_nonblocking(true)
        .context(|| "configuring the listener".into())?;
    let stream = loop {
        match listener.accept() {
            Ok((stream, _)) => break stream,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(10))
            }
            Err(e) => return Err(e).context(|| format!("accepting on port {port}")),
        }
    };
    stream
        .set_nonblocking(false)
        .context(|| "configuring the connection".into())?;
    Ok(stream)
}

/// Guest side, the other direction: opens the serial port `name` and relays it to a server
/// listening on `127.0.0.1:port` in the guest (retrying until it listens). Returns once both
/// directions have ended.
pub fn connect_serial_to_tcp(name: &str, port: u16, timeout: Duration) -> Result<()> {
    // Open the port first: the host side connects its peer once it hears from it.
    let serial = open_and_greet(&serial_port_device(name)?)?;
    let deadline = Instant::now() + timeout;
    let server = retry(deadline, || TcpStream::connect(("127.0.0.1", port)))
        .context(|| format!("connecting to the guest's server on port {port}"))?;
    for thread in pump(Box::new(server), Box::new(serial))? {
        let _ = thread.join();
    }
    Ok(())
}

/// Host side, the other direction: once the guest side of the QEMU chardev socket at
/// `chardev` said hello, accepts one connection on `listener` (a peer client connecting to the
/// guest's server, which waits in the listener's backlog meanwhile) and relays the two.
pub fn accept_to_chardev(
    listener: TcpListener,
    chardev: &Path,
    timeout: Duration,
) -> Result<Vec<JoinHandle<()>>> {
    let deadline = Instant::now() + timeout;
    let serial = open_chardev(chardev, deadline)?;
    let client = accept_before(&listener, deadline)?;
    pump(Box::new(client), Box::new(serial))
}

/// Host side: once the guest side of the QEMU chardev socket at `chardev` said hello,
/// connects it to `127.0.0.1:port`, retrying until `timeout` (QEMU and the peer may still be
/// starting). The relay runs on.
pub fn connect_chardev_to_tcp(
    chardev: &Path,
    port: u16,
    timeout: Duration,
) -> Result<Vec<JoinHandle<()>>> {
    let deadline = Instant::now() + timeout;
    let serial = open_chardev(chardev, deadline)?;
    let peer = retry(deadline, || TcpStream::connect(("127.0.0.1", port)))
        .context(|| format!("connecting to the peer on port {port}"))?;
    pump(Box::new(serial), Box::new(peer))
}

fn retry<T>(deadline: Instant, mut attempt: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match attempt() {
            Ok(value) => return Ok(value),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => thread::sleep(Duration::from_millis(50)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_is_found_by_name() {
        let dir = std::env::temp_dir().join(format!("vrdma-ports-{}", std::process::id()));
        for (entry, name) in [("vport0p0", "other"), ("vport1p1", "vrdma-oob")] {
            std::fs::create_dir_all(dir.join(entry)).unwrap();
            std::fs::write(dir.join(entry).join("name"), format!("{name}\n")).unwrap();
        }
        assert_eq!(
            port_device_in(&dir, "vrdma-oob").unwrap(),
            Path::new("/dev/vport1p1")
        );
        assert!(port_device_in(&dir, "missing").is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_host_side_follows_its_chardev_until_the_guest_side_says_hello() {
        use std::os::unix::net::UnixListener;
        let path = std::env::temp_dir().join(format!("vrdma-relay-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let first_qemu = UnixListener::bind(&path).unwrap();
        let at = path.clone();
        let qemus = thread::spawn(move || {
            // The first QEMU goes before its guest opened the port.
            drop(first_qemu.accept().unwrap());
            drop(first_qemu);
            std::fs::remove_file(&at).unwrap();
            let second_qemu = UnixListener::bind(&at).unwrap();
            let (mut guest, _) = second_qemu.accept().unwrap();
            guest.write_all(&[HELLO]).unwrap();
            guest.write_all(b"data").unwrap();
            guest
        });
        let mut serial = open_chardev(&path, Instant::now() + Duration::from_secs(60)).unwrap();
        let mut got = [0u8; 4];
        serial.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"data", "the hello is not passed on");
        drop(qemus.join().unwrap());
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_guest_side_that_speaks_before_its_hello_is_refused() {
        use std::os::unix::net::UnixListener;
        let path =
            std::env::temp_dir().join(format!("vrdma-relay-bad-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let qemu = UnixListener::bind(&path).unwrap();
        let guest = thread::spawn(move || {
            let (mut guest, _) = qemu.accept().unwrap();
            guest.write_all(b"x").unwrap();
            guest
        });
        let refused = open_chardev(&path, Instant::now() + Duration::from_secs(60));
        assert!(refused.is_err());
        drop(guest.join().unwrap());
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn bytes_cross_the_relay_both_ways_and_the_end_is_passed_on() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (mut near, far) = UnixStream::pair().unwrap();
        let threads = pump(
            Box::new(far),
            Box::new(TcpStream::connect(("127.0.0.1", port)).unwrap()),
        )
        .unwrap();
        let (mut peer, _) = listener.accept().unwrap();
        near.write_all(b"hello\n").unwrap();
        let mut got = [0u8; 6];
        peer.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello\n");
        peer.write_all(b"back").unwrap();
        peer.shutdown(Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        near.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, b"back");
        near.shutdown(Shutdown::Both).unwrap();
        for thread in threads {
            thread.join().unwrap();
        }
    }
}

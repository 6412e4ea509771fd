//! Event file descriptors: the eventfds behind the pollable fds this library hands to
//! applications (completion channels, the context's `async_fd`) and the event thread's stop
//! signal, and waiting for fds to turn readable.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use log::warn;

/// A new eventfd (close-on-exec) with these extra `flags`.
pub(crate) fn eventfd(flags: i32) -> io::Result<OwnedFd> {
    // SAFETY: creating a new eventfd; no memory is involved.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds one to the eventfd's counter.
pub(crate) fn write_one(fd: &OwnedFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a live buffer to an eventfd we own.
    let n = unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    if n != 8 {
        warn!(
            "vrdma: eventfd write failed: {}",
            io::Error::last_os_error()
        );
    }
}

/// Reads the eventfd once, blocking as its file status flags say (in semaphore mode: takes
/// one from the counter).
pub(crate) fn read_one(fd: &OwnedFd) -> io::Result<()> {
    let mut count = [0u8; 8];
    // SAFETY: reads 8 bytes into a live buffer from an eventfd we own.
    let n = unsafe { libc::read(fd.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the application made `fd` non-blocking (`O_NONBLOCK`, set with `fcntl`).
pub(crate) fn is_nonblocking(fd: &OwnedFd) -> io::Result<bool> {
    // SAFETY: F_GETFL on an fd we own reads its flags and touches no memory.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(flags & libc::O_NONBLOCK != 0)
}

/// Which of `fds` are readable, waiting up to `timeout_ms` (-1: forever) for one to be.
pub(crate) fn wait_readable<const N: usize>(
    fds: [i32; N],
    timeout_ms: i32,
) -> io::Result<[bool; N]> {
    let mut polled = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    loop {
        // SAFETY: `polled` is a live array of N pollfd entries.
        let n = unsafe { libc::poll(polled.as_mut_ptr(), N as libc::nfds_t, timeout_ms) };
        if n >= 0 {
            return Ok(polled.map(|p| p.revents != 0));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

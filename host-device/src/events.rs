//! Event fds of a context: the async event fd and the completion channel. Both are anonymous
//! uverbs files that yield one fixed-size descriptor per `read()`; they are switched to
//! non-blocking mode so an epoll loop can drain them.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use zerocopy::{FromBytes, IntoBytes};

use super::error::{DeviceError, Result};
use super::types::{AsyncEvent, AsyncEventKind, CompEvent};
use super::uverbs::{AsyncEventDesc, CompEventDesc};

/// An fd the kernel handed out in a command response.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// Takes ownership of an fd number from a uverbs response and makes it non-blocking.
    pub fn from_kernel(command: &'static str, raw: u32) -> Result<EventFd> {
        let raw = i32::try_from(raw).map_err(|_| DeviceError::InvalidReply {
            command,
            reason: format!("fd {raw} out of range"),
        })?;
        // Checks that the number names an open fd before claiming it.
        // SAFETY: F_GETFD only inspects the descriptor table.
        if unsafe { libc::fcntl(raw, libc::F_GETFD) } < 0 {
            return Err(DeviceError::InvalidReply {
                command,
                reason: format!("fd {raw} is not open"),
            });
        }
        // SAFETY: the kernel just installed `raw` in this process for this command's object and
        // nothing else in the process knows the number, so this becomes its only owner.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        set_nonblocking(&fd)?;
        Ok(EventFd { fd })
    }

    /// Reads one descriptor of type `T`; `None` when none is pending.
    fn read_one<T: FromBytes + IntoBytes>(&self, what: &'static str) -> Result<Option<T>> {
        let mut desc = T::new_zeroed();
        let buf = desc.as_mut_bytes();
        // SAFETY: `buf` is a writable buffer of `buf.len()` bytes owned by this frame.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let err = io::Error::last_os_error();
            return match err.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(DeviceError::Io { what, source: err }),
            };
        }
        if n.unsigned_abs() != buf.len() {
            return Err(DeviceError::Io {
                what,
                source: io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("read {n} bytes of a {}-byte event", buf.len()),
                ),
            });
        }
        Ok(Some(desc))
    }

    /// Next async event, if any (for the context's async fd).
    pub fn read_async_event(&self) -> Result<Option<AsyncEvent>> {
        Ok(self
            .read_one::<AsyncEventDesc>("reading the async event fd")?
            .map(|d| AsyncEvent {
                kind: AsyncEventKind::from_kernel(d.event_type),
                element: d.element,
            }))
    }

    /// Next completion event, if any (for a completion channel).
    pub fn read_comp_event(&self) -> Result<Option<CompEvent>> {
        Ok(self
            .read_one::<CompEventDesc>("reading the completion channel")?
            .map(|d| CompEvent {
                cq_user_handle: d.cq_handle,
            }))
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn set_nonblocking(fd: &OwnedFd) -> Result<()> {
    let raw = fd.as_raw_fd();
    // SAFETY: F_GETFL/F_SETFL on an fd this process owns change only its status flags.
    let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(raw, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(DeviceError::Io {
            what: "making an event fd non-blocking",
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipe stands in for the kernel's event file: same read() semantics.
    fn pipe() -> (EventFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: pipe2 just created fds[1]; nothing else owns it.
        let writer = unsafe { OwnedFd::from_raw_fd(fds[1]) };
        let reader = EventFd::from_kernel("TEST", fds[0] as u32).unwrap();
        (reader, writer)
    }

    fn write_all(fd: &OwnedFd, bytes: &[u8]) {
        // SAFETY: `bytes` is a valid buffer of its length.
        let n = unsafe { libc::write(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
        assert_eq!(n, bytes.len() as isize);
    }

    #[test]
    fn async_events_are_typed_and_empty_reads_are_none() {
        let (reader, writer) = pipe();
        assert_eq!(reader.read_async_event().unwrap(), None);
        let desc = AsyncEventDesc {
            element: 0xabc,
            event_type: 1,
            reserved: 0,
        };
        write_all(&writer, desc.as_bytes());
        assert_eq!(
            reader.read_async_event().unwrap(),
            Some(AsyncEvent {
                kind: AsyncEventKind::QpFatal,
                element: 0xabc
            })
        );
        assert_eq!(reader.read_async_event().unwrap(), None);
    }

    #[test]
    fn comp_events_carry_the_cq_user_handle() {
        let (reader, writer) = pipe();
        write_all(&writer, &42u64.to_le_bytes());
        assert_eq!(
            reader.read_comp_event().unwrap(),
            Some(CompEvent { cq_user_handle: 42 })
        );
    }

    #[test]
    fn a_truncated_event_is_an_error() {
        let (reader, writer) = pipe();
        write_all(&writer, &[1, 2, 3]);
        assert!(reader.read_comp_event().is_err());
    }

    #[test]
    fn unknown_fd_numbers_are_refused() {
        assert!(EventFd::from_kernel("TEST", u32::MAX).is_err());
        assert!(EventFd::from_kernel("TEST", 1_000_000).is_err());
    }
}

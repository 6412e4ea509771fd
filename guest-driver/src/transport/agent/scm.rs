//! Bytes and descriptors on the agent's stream socket: `sendmsg` that never raises SIGPIPE
//! and finishes a frame a signal interrupted, `recvmsg` whose descriptors are close-on-exec
//! from the moment they exist (a `fork`+`exec` of another thread must not inherit them).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Room for this many descriptors in one control message.
const FD_ROOM: usize = 32;

/// Sends `bytes` with `fds` attached to the first of them.
pub(super) fn send(socket: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > FD_ROOM {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let mut sent = 0;
    let mut with_fds = !fds.is_empty();
    while sent < bytes.len() {
        let mut iov = libc::iovec {
            iov_base: bytes[sent..].as_ptr() as *mut libc::c_void,
            iov_len: bytes.len() - sent,
        };
        let mut control = ControlBuffer::new();
        // SAFETY: an all-zero msghdr is valid; the fields set below point at live locals.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if with_fds {
            control.put_fds(&mut msg, fds);
        }
        // SAFETY: `msg` describes valid buffers for the duration of the call.
        let rc = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if rc < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        // Once any byte went, the descriptors went with it.
        with_fds = false;
        sent += rc as usize;
    }
    Ok(())
}

/// Receives up to `buf.len()` bytes and the descriptors attached to them (appended to `fds`,
/// close-on-exec). Returns the byte count (0: the peer closed).
pub(super) fn receive(
    socket: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    loop {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut control = ControlBuffer::new();
        // SAFETY: an all-zero msghdr is valid; the fields set below point at live locals.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.bytes.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(control.bytes.as_slice()) as _;
        // SAFETY: `msg` describes valid, writable buffers for the duration of the call.
        let rc = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if rc < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        // SAFETY: the kernel filled `msg`'s control buffer; the walk stays inside it.
        unsafe { take_fds(&msg, fds) };
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "more descriptors than a frame may carry",
            ));
        }
        return Ok(rc as usize);
    }
}

/// A control-message buffer, aligned for `cmsghdr`.
struct ControlBuffer {
    bytes: Vec<u64>,
}

impl ControlBuffer {
    fn new() -> Self {
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE((FD_ROOM * std::mem::size_of::<RawFd>()) as u32) };
        ControlBuffer {
            bytes: vec![0; (space as usize).div_ceil(8)],
        }
    }

    /// Attaches `fds` (at most [`FD_ROOM`]) to `msg` as one SCM_RIGHTS message.
    fn put_fds(&mut self, msg: &mut libc::msghdr, fds: &[RawFd]) {
        let data_len = std::mem::size_of_val(fds);
        msg.msg_control = self.bytes.as_mut_ptr().cast();
        // SAFETY: pure size computation.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(data_len as u32) } as _;
        // SAFETY: the buffer holds CMSG_SPACE(FD_ROOM fds) >= msg_controllen bytes, so the
        // first header and its data lie inside it.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(msg);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(data_len as u32) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(header).cast::<RawFd>(),
                fds.len(),
            );
        }
    }
}

/// Moves the descriptors of every SCM_RIGHTS message of `msg` into `fds`.
///
/// # Safety
/// `msg` was filled by `recvmsg` and its control buffer is alive.
unsafe fn take_fds(msg: &libc::msghdr, fds: &mut Vec<OwnedFd>) {
    // SAFETY: caller contract; CMSG_FIRSTHDR/NXTHDR stay within msg_controllen.
    let mut header = unsafe { libc::CMSG_FIRSTHDR(msg) };
    while !header.is_null() {
        // SAFETY: a header the kernel wrote, inside the control buffer.
        let (level, kind, len) = unsafe {
            (
                (*header).cmsg_level,
                (*header).cmsg_type,
                (*header).cmsg_len,
            )
        };
        if level == libc::SOL_SOCKET && kind == libc::SCM_RIGHTS {
            // SAFETY: pure size computation.
            let data_offset = unsafe { libc::CMSG_LEN(0) } as usize;
            let count = len.saturating_sub(data_offset) / std::mem::size_of::<RawFd>();
            for i in 0..count {
                // SAFETY: the message's data holds `count` descriptors the kernel installed
                // in this process; each is owned from here on. Read unaligned: CMSG_DATA need
                // not be aligned for RawFd on every ABI.
                let fd = unsafe {
                    let raw = libc::CMSG_DATA(header)
                        .cast::<RawFd>()
                        .add(i)
                        .read_unaligned();
                    OwnedFd::from_raw_fd(raw)
                };
                fds.push(fd);
            }
        }
        // SAFETY: caller contract, as above.
        header = unsafe { libc::CMSG_NXTHDR(msg, header) };
    }
}

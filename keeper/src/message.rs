//! vhost-user message framing: a header (request, flags, payload size), the payload and the
//! descriptors sent with it, as the keeper relays them and as vrdma-backend's front-end filter
//! and back-end request channel move them.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// vhost-user message header: request, flags, payload size (all u32, little-endian).
pub const HEADER_SIZE: usize = 12;
/// Largest payload accepted (vhost-user messages are far smaller).
pub const MAX_PAYLOAD: usize = 64 * 1024;
/// Most descriptors one message may carry (SET_MEM_TABLE carries up to 8).
pub const MAX_FDS: usize = 32;

/// Protocol version 1, set in every message.
pub const FLAG_VERSION: u32 = 0x1;
/// The message answers one of the peer's.
pub const FLAG_REPLY: u32 = 0x4;
/// The sender waits for a REPLY_ACK answer.
pub const FLAG_NEED_REPLY: u32 = 0x8;

/// One vhost-user message with the descriptors that came with it.
#[derive(Debug)]
pub struct Message {
    pub header: [u8; HEADER_SIZE],
    pub payload: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

impl Message {
    pub fn request(&self) -> u32 {
        header_word(&self.header, 0)
    }

    pub fn flags(&self) -> u32 {
        header_word(&self.header, 4)
    }

    /// Reads the next message; `None` when the peer closed the connection between messages.
    pub fn receive(socket: &UnixStream) -> io::Result<Option<Message>> {
        let mut header = [0u8; HEADER_SIZE];
        let mut raw_fds = [-1 as RawFd; MAX_FDS];
        let mut iov = [libc::iovec {
            iov_base: header.as_mut_ptr().cast(),
            iov_len: HEADER_SIZE,
        }];
        // SAFETY: the iovec points at `header`, which lives across the call and may take any
        // bytes.
        let (read, fd_count) =
            restarting(|| unsafe { socket.recv_with_fds(&mut iov, &mut raw_fds) })?;
        let fds: Vec<OwnedFd> = raw_fds[..fd_count]
            .iter()
            // SAFETY: recvmsg just installed these descriptors in this process; nothing else
            // owns them.
            .map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) })
            .collect();
        if read == 0 {
            return Ok(None);
        }
        let mut reader = socket;
        reader.read_exact(&mut header[read..])?;
        let size = header_word(&header, 8) as usize;
        if size > MAX_PAYLOAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("vhost-user message with a payload of {size} bytes"),
            ));
        }
        let mut payload = vec![0u8; size];
        reader.read_exact(&mut payload)?;
        Ok(Some(Message {
            header,
            payload,
            fds,
        }))
    }

    /// A message of `request` with `flags` and `payload`, carrying `fds`.
    pub fn new(request: u32, flags: u32, payload: Vec<u8>, fds: Vec<OwnedFd>) -> Message {
        let size = u32::try_from(payload.len()).unwrap_or(u32::MAX);
        Message {
            header: header(request, flags, size),
            payload,
            fds,
        }
    }

    /// The same message with duplicates of its descriptors.
    pub fn try_clone(&self) -> io::Result<Message> {
        Ok(Message {
            header: self.header,
            payload: self.payload.clone(),
            fds: self
                .fds
                .iter()
                .map(OwnedFd::try_clone)
                .collect::<io::Result<_>>()?,
        })
    }

    /// The message with `flags` in place of its own.
    pub fn with_flags(mut self, flags: u32) -> Message {
        self.header[4..8].copy_from_slice(&flags.to_le_bytes());
        self
    }

    /// Whether it answers a request (`FLAG_REPLY`).
    pub fn is_reply(&self) -> bool {
        self.flags() & FLAG_REPLY != 0
    }

    pub fn send(&self, socket: &UnixStream) -> io::Result<()> {
        let fds: Vec<RawFd> = self.fds.iter().map(AsRawFd::as_raw_fd).collect();
        send_bytes(socket, &self.header, &self.payload, &fds)
    }

    /// The success acknowledgement of a request that asked for one.
    pub fn ack(request: u32) -> Message {
        Self::reply(request, 0)
    }

    /// The REPLY_ACK answer `status` (0 success, anything else failure) to `request`.
    pub fn reply(request: u32, status: u64) -> Message {
        Message {
            header: header(request, FLAG_VERSION | FLAG_REPLY, 8),
            payload: status.to_le_bytes().to_vec(),
            fds: Vec::new(),
        }
    }
}

pub fn wants_reply(message: &Message) -> bool {
    message.flags() & FLAG_NEED_REPLY != 0
}

pub fn header_word(header: &[u8; HEADER_SIZE], offset: usize) -> u32 {
    u32::from_le_bytes(header[offset..offset + 4].try_into().unwrap_or_default())
}

pub fn payload_u64(payload: &[u8], offset: usize) -> Option<u64> {
    let bytes = payload.get(offset..offset + 8)?;
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

/// Sends one message built from its parts: `request`, `flags` and `payload`, with `fds`
/// attached to its first byte.
pub fn send_parts(
    socket: &UnixStream,
    request: u32,
    flags: u32,
    payload: &[u8],
    fds: &[RawFd],
) -> io::Result<()> {
    let size = u32::try_from(payload.len())
        .ok()
        .filter(|&size| size as usize <= MAX_PAYLOAD)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "payload too large"))?;
    send_bytes(socket, &header(request, flags, size), payload, fds)
}

fn header(request: u32, flags: u32, size: u32) -> [u8; HEADER_SIZE] {
    let mut header = [0u8; HEADER_SIZE];
    header[0..4].copy_from_slice(&request.to_le_bytes());
    header[4..8].copy_from_slice(&flags.to_le_bytes());
    header[8..12].copy_from_slice(&size.to_le_bytes());
    header
}

fn send_bytes(
    socket: &UnixStream,
    header: &[u8; HEADER_SIZE],
    payload: &[u8],
    fds: &[RawFd],
) -> io::Result<()> {
    // Header and payload gathered in one sendmsg, with the descriptors; what a short send
    // left follows as plain bytes.
    let sent = restarting(|| socket.send_with_fds(&[&header[..], payload], fds))?;
    let mut writer = socket;
    match sent.checked_sub(HEADER_SIZE) {
        Some(payload_sent) => writer.write_all(&payload[payload_sent..]),
        None => {
            writer.write_all(&header[sent..])?;
            writer.write_all(payload)
        }
    }
}

/// Runs a socket call again while a signal handler interrupts it (EINTR), as std's
/// `read_exact` and `write_all` do: an interrupted call is no reason to end a guest's
/// connection.
pub fn restarting<T>(
    mut call: impl FnMut() -> Result<T, vmm_sys_util::errno::Error>,
) -> io::Result<T> {
    loop {
        match call() {
            Err(e) if e.errno() == libc::EINTR => continue,
            result => return result.map_err(|e| io::Error::from_raw_os_error(e.errno())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interrupted_socket_call_is_made_again() {
        let mut interruptions = 2;
        let result = restarting(|| {
            if interruptions > 0 {
                interruptions -= 1;
                Err(vmm_sys_util::errno::Error::new(libc::EINTR))
            } else {
                Ok(7)
            }
        });
        assert_eq!(result.unwrap(), 7);
        let result: io::Result<()> =
            restarting(|| Err(vmm_sys_util::errno::Error::new(libc::ECONNRESET)));
        assert_eq!(result.unwrap_err().raw_os_error(), Some(libc::ECONNRESET));
    }

    #[test]
    fn a_message_built_from_parts_reads_back_whole() {
        let (a, b) = UnixStream::pair().unwrap();
        let devnull = std::fs::File::open("/dev/null").unwrap();
        send_parts(
            &a,
            9,
            FLAG_VERSION | FLAG_NEED_REPLY,
            &[1, 2, 3],
            &[devnull.as_raw_fd()],
        )
        .unwrap();
        let got = Message::receive(&b).unwrap().unwrap();
        assert_eq!(got.request(), 9);
        assert!(wants_reply(&got));
        assert_eq!(got.payload, [1, 2, 3]);
        assert_eq!(got.fds.len(), 1);
        let too_large = vec![0u8; MAX_PAYLOAD + 1];
        assert_eq!(
            send_parts(&a, 9, FLAG_VERSION, &too_large, &[])
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidInput
        );
    }
}

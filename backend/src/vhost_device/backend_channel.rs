//! The back-end request channel: the socket the front-end hands over with
//! `VHOST_USER_SET_BACKEND_REQ_FD`, on which the back-end asks it to map and unmap ranges of
//! the shared-memory region (`SHMEM_MAP`, `SHMEM_UNMAP`).
//!
//! The daemon drives this socket itself rather than through the vhost crate's `Backend`,
//! which sends one request and waits for its answer before the next can go. Requests sent
//! back to back are answered in order (the front-end serves the channel one message at a
//! time), so a QP's send and receive queue mappings cost one wait for the front-end instead of
//! two — each wait, under TCG, is two thread wake-ups (measured ~0.3 ms a mapping).
//!
//! The front-end connection's filter ([`frontend_filter`](crate::vhost_device::frontend_filter))
//! takes the socket out of `SET_BACKEND_REQ_FD`, with the protocol features acknowledged
//! before it, and hands it to the guest's [`ShmemMapper`](super::shmem::ShmemMapper).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;

use vhost::vhost_user::message::{BackendReq, VhostUserMMap, VhostUserProtocolFeatures};
use vm_memory::ByteValued;

use super::message::{send_parts, Message, FLAG_NEED_REPLY, FLAG_REPLY, FLAG_VERSION};

/// One request: `SHMEM_MAP` of `fd` (given) or `SHMEM_UNMAP` (none).
#[derive(Debug, Clone, Copy)]
pub struct ShmemRequest<'fd> {
    /// The region, offsets, length and access (`VhostUserMMap`).
    pub body: VhostUserMMap,
    /// The descriptor to map; `None` for an unmap.
    pub fd: Option<BorrowedFd<'fd>>,
}

impl ShmemRequest<'_> {
    /// `SHMEM_UNMAP` of `len` bytes at `shm_offset` of region 0.
    pub fn unmap(shm_offset: u64, len: u64) -> ShmemRequest<'static> {
        ShmemRequest {
            body: VhostUserMMap {
                shmid: 0,
                shm_offset,
                len,
                ..Default::default()
            },
            fd: None,
        }
    }

    fn request(&self) -> BackendReq {
        match self.fd {
            Some(_) => BackendReq::SHMEM_MAP,
            None => BackendReq::SHMEM_UNMAP,
        }
    }
}

/// The back-end's end of the request channel.
#[derive(Debug)]
pub struct BackendChannel {
    socket: UnixStream,
    /// `VHOST_USER_PROTOCOL_F_REPLY_ACK`: every request asks for an answer and gets one.
    reply_ack: bool,
    /// `VHOST_USER_PROTOCOL_F_SHMEM`: the front-end accepts SHMEM_MAP/UNMAP at all.
    shmem: bool,
    /// Why the channel stopped being usable: requests and answers are out of step after an
    /// I/O error or an unexpected answer, so nothing more is sent.
    broken: Option<String>,
}

impl BackendChannel {
    /// The channel over `socket`, with the protocol features the front-end acknowledged.
    pub fn new(socket: UnixStream, acked_protocol_features: u64) -> Self {
        let acked = VhostUserProtocolFeatures::from_bits_truncate(acked_protocol_features);
        BackendChannel {
            socket,
            reply_ack: acked.contains(VhostUserProtocolFeatures::REPLY_ACK),
            shmem: acked.contains(VhostUserProtocolFeatures::SHMEM),
            broken: None,
        }
    }

    /// Sends every request, then takes the front-end's answers in order: one result per
    /// request. `Ok` means the front-end did it (without REPLY_ACK: that it was sent, as
    /// nothing else can be known). An answer that does not come, or does not match, breaks
    /// the channel; the requests it covered, and every later one, are `Err`.
    pub fn exchange(&mut self, requests: &[ShmemRequest<'_>]) -> Vec<io::Result<()>> {
        if let Err(e) = self.usable() {
            return requests.iter().map(|_| Err(copy_error(&e))).collect();
        }
        let mut sent = 0;
        let mut failure = None;
        for request in requests {
            if let Err(e) = self.send(request) {
                failure = Some(self.break_with(e));
                break;
            }
            sent += 1;
        }
        let mut results: Vec<io::Result<()>> = Vec::with_capacity(requests.len());
        for request in &requests[..sent] {
            if !self.reply_ack {
                results.push(Ok(()));
                continue;
            }
            if self.broken.is_some() {
                results.push(Err(self.broken_error()));
                continue;
            }
            results.push(match self.answer(request.request()) {
                Ok(0) => Ok(()),
                Ok(status) => Err(io::Error::other(format!(
                    "the front-end refused {:?} (status {status})",
                    request.request()
                ))),
                Err(e) => Err(self.break_with(e)),
            });
        }
        if sent < requests.len() {
            let failure = failure.unwrap_or_else(|| self.broken_error());
            results.extend(requests[sent..].iter().map(|_| Err(copy_error(&failure))));
        }
        results
    }

    fn usable(&self) -> io::Result<()> {
        if !self.shmem {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the front-end did not negotiate VHOST_USER_PROTOCOL_F_SHMEM",
            ));
        }
        match self.broken {
            Some(_) => Err(self.broken_error()),
            None => Ok(()),
        }
    }

    fn send(&self, request: &ShmemRequest<'_>) -> io::Result<()> {
        let body = request.body;
        let payload = body.as_slice();
        let mut flags = FLAG_VERSION;
        if self.reply_ack {
            flags |= FLAG_NEED_REPLY;
        }
        let fd = request.fd.as_ref().map(AsRawFd::as_raw_fd);
        send_parts(
            &self.socket,
            request.request() as u32,
            flags,
            payload,
            fd.as_slice(),
        )
    }

    /// The status the front-end answered `request` with.
    fn answer(&self, request: BackendReq) -> io::Result<u64> {
        let reply = Message::receive(&self.socket)?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the front-end closed the back-end request channel",
            )
        })?;
        let expected = request as u32;
        let status = reply
            .payload
            .get(..8)
            .filter(|_| reply.payload.len() == 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes);
        match status {
            Some(status)
                if reply.request() == expected
                    && reply.flags() & FLAG_REPLY != 0
                    && reply.fds.is_empty() =>
            {
                Ok(status)
            }
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "answer to {request:?} was request {} with flags {:#x}, {} payload bytes and \
                     {} descriptors",
                    reply.request(),
                    reply.flags(),
                    reply.payload.len(),
                    reply.fds.len()
                ),
            )),
        }
    }

    fn break_with(&mut self, e: io::Error) -> io::Error {
        log::warn!("back-end request channel broken: {e}");
        self.broken.get_or_insert_with(|| e.to_string());
        e
    }

    fn broken_error(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::BrokenPipe,
            format!(
                "the back-end request channel broke earlier: {}",
                self.broken.as_deref().unwrap_or("?")
            ),
        )
    }
}

fn copy_error(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

#[cfg(test)]
mod tests;

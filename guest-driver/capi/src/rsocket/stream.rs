//! A connected stream rsocket's protocol state (rdma-core's, version 1): data written with
//! immediates into the peer's receive ring, credits and ring halves handed back as scatter
//! entries, control messages, and what each completion means.
//!
//! Two resources gate a data write (spec/research/rsockets.md §2): message credits (the peer's
//! receive WQEs: `sseq_no` may not reach `sseq_comp`) and buffer space (the scatter entries the
//! peer wrote into our target buffer). The receiver reads its ring in order and never takes an
//! address from the wire. Sequence numbers are 16-bit and wrap, as rdma-core's do.

use std::collections::VecDeque;
use std::ffi::c_int;
use std::sync::atomic::{fence, Ordering};

use super::endpoint::{Completion, Endpoint, CTRL_SLOTS};
use super::wire::{
    host_is_big_endian, message, parse_message, value_to_scale, ConnData, Op, Sge,
    CONN_DATA_VERSION, CONN_FLAG_IOMAP, CONN_FLAG_NET, CTRL_DISCONNECT, CTRL_SHUTDOWN,
    SEND_LOW_WATER, SGE_LEN, SGL_ENTRIES,
};
use crate::sys::ibv_sge;

/// First chunk of a send; chunks double up to [`MAX_TRANSFER`].
pub(crate) const FIRST_CHUNK: usize = 2048;
/// Largest chunk one write carries.
const MAX_TRANSFER: usize = 65536;

/// Whether the connection still stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Link {
    Connected,
    /// The peer or this side closed it.
    Disconnected,
    /// A transfer failed.
    Failed,
}

/// The connected state of one stream rsocket.
pub(crate) struct Flow {
    pub(crate) ep: Endpoint,
    pub(crate) link: Link,
    pub(crate) readable: bool,
    pub(crate) writable: bool,
    /// The errno a failure left (`SO_ERROR`).
    pub(crate) err: c_int,
    /// The peer's byte order differs: scatter entries written to it are swapped.
    peer_big_endian: bool,
    // Sender.
    sseq_no: u16,
    sseq_comp: u16,
    sqe_avail: u32,
    sbuf_bytes_avail: u32,
    /// Next free byte of the send ring.
    sbuf_pos: u32,
    /// Which of our target entries (written by the peer) the next data goes to.
    target_sge: usize,
    /// The peer's scatter list (length = entries) and the next entry to write there.
    remote_sgl: Sge,
    remote_sge: u32,
    ctrl_seqno: u32,
    ctrl_max_seqno: u32,
    // Receiver.
    rseq_no: u16,
    rseq_comp: u16,
    rbuf_offset: u32,
    rbuf_bytes_avail: u32,
    rbuf_free_offset: u32,
    /// Lengths of the data writes received and not yet read, oldest first.
    rmsg: VecDeque<u32>,
    pub(crate) cq_armed: bool,
    scratch: Vec<Completion>,
}

impl Flow {
    /// The state of a new endpoint before the peer's connection data is known.
    pub(crate) fn new(ep: Endpoint) -> Flow {
        let s = ep.sizes;
        Flow {
            link: Link::Connected,
            readable: true,
            writable: true,
            err: 0,
            peer_big_endian: host_is_big_endian(),
            sseq_no: 0,
            sseq_comp: 0,
            sqe_avail: s.sq - CTRL_SLOTS as u32,
            sbuf_bytes_avail: s.sbuf,
            sbuf_pos: 0,
            target_sge: 0,
            remote_sgl: Sge::default(),
            remote_sge: 1,
            ctrl_seqno: 0,
            ctrl_max_seqno: CTRL_SLOTS as u32,
            rseq_no: 0,
            rseq_comp: (s.rq >> 1) as u16,
            rbuf_offset: 0,
            rbuf_bytes_avail: s.rbuf >> 1,
            rbuf_free_offset: s.rbuf >> 1,
            rmsg: VecDeque::with_capacity(s.rq as usize + 1),
            cq_armed: false,
            scratch: Vec::with_capacity(16),
            ep,
        }
    }

    /// Our connection data: credits, the target buffer and the first half of the ring.
    pub(crate) fn conn_data(&self) -> ConnData {
        let s = self.ep.sizes;
        let mut flags = CONN_FLAG_IOMAP;
        if host_is_big_endian() {
            flags |= CONN_FLAG_NET;
        }
        ConnData {
            version: CONN_DATA_VERSION,
            flags,
            credits: s.rq as u16,
            target_iomap_size: value_to_scale(s.iomap_entries, 8),
            target_sgl: Sge {
                addr: self.ep.target.buf.addr(),
                key: self.ep.target.rkey(),
                length: SGL_ENTRIES,
            },
            data_buf: Sge {
                addr: self.ep.rbuf.buf.addr(),
                key: self.ep.rbuf.rkey(),
                length: s.rbuf >> 1,
            },
        }
    }

    /// Takes in the peer's connection data (`rs_save_conn_data`). Entry 1 of our target
    /// buffer is left alone: it starts zeroed, and the peer writes its first buffer update
    /// there as soon as its side is established, which on the connecting side can be before
    /// this runs.
    pub(crate) fn save_peer(&mut self, peer: &ConnData) {
        self.remote_sgl = peer.target_sgl;
        self.remote_sge = 1;
        self.peer_big_endian = peer.sender_big_endian();
        self.write_target(0, peer.data_buf);
        self.sseq_comp = peer.credits;
    }

    // --- The target buffer: entries the peer writes, read as the device left them. ---

    fn target_ptr(&self, i: usize) -> *mut u8 {
        debug_assert!(i < SGL_ENTRIES as usize);
        // SAFETY: entry `i` lies inside the target buffer (SGL_ENTRIES entries first).
        unsafe { self.ep.target.buf.as_ptr().add(i * SGE_LEN) }
    }

    fn target_len(&self, i: usize) -> u32 {
        // SAFETY: an aligned u32 inside our target buffer, which the device may write
        // concurrently: read it as volatile memory.
        let len = unsafe { std::ptr::read_volatile(self.target_ptr(i).add(12).cast::<u32>()) };
        fence(Ordering::Acquire);
        len
    }

    fn read_target(&self, i: usize) -> Sge {
        let p = self.target_ptr(i);
        // SAFETY: aligned fields inside our target buffer (volatile: the device writes it).
        unsafe {
            Sge {
                addr: std::ptr::read_volatile(p.cast::<u64>()),
                key: std::ptr::read_volatile(p.add(8).cast::<u32>()),
                length: std::ptr::read_volatile(p.add(12).cast::<u32>()),
            }
        }
    }

    fn write_target(&self, i: usize, sge: Sge) {
        let p = self.target_ptr(i);
        // SAFETY: aligned fields inside our target buffer; the peer rewrites an entry only
        // after we have used it up (rsockets' slot rule), so these writes do not race it.
        unsafe {
            std::ptr::write_volatile(p.cast::<u64>(), sge.addr);
            std::ptr::write_volatile(p.add(8).cast::<u32>(), sge.key);
            std::ptr::write_volatile(p.add(12).cast::<u32>(), sge.length);
        }
    }

    // --- Conditions. ---

    pub(crate) fn connected(&self) -> bool {
        self.link == Link::Connected
    }

    pub(crate) fn can_send(&self) -> bool {
        self.sqe_avail > 0
            && self.sbuf_bytes_avail >= SEND_LOW_WATER
            && self.sseq_no != self.sseq_comp
            && self.target_len(self.target_sge) != 0
    }

    /// A send can go, or never will.
    pub(crate) fn conn_can_send(&self) -> bool {
        self.can_send() || !self.writable || !self.connected()
    }

    pub(crate) fn have_rdata(&self) -> bool {
        !self.rmsg.is_empty()
    }

    /// Data is there, or no more will come.
    pub(crate) fn conn_have_rdata(&self) -> bool {
        self.have_rdata() || !self.readable
    }

    fn ctrl_avail(&self) -> bool {
        self.ctrl_seqno != self.ctrl_max_seqno
    }

    pub(crate) fn conn_ctrl_avail(&self) -> bool {
        self.ctrl_avail() || !self.connected()
    }

    /// Every send (data and control) has completed, or the connection is gone.
    pub(crate) fn all_sends_done(&self) -> bool {
        self.sqe_avail + self.ctrl_max_seqno - self.ctrl_seqno == self.ep.sizes.sq
            || !self.connected()
    }

    // --- Completions. ---

    fn fail(&mut self, err: c_int) {
        if self.connected() {
            self.link = Link::Failed;
            self.readable = false;
            self.writable = false;
            self.err = err;
        }
    }

    /// The peer closed both directions.
    pub(crate) fn disconnected(&mut self) {
        self.link = Link::Disconnected;
        self.readable = false;
        self.writable = false;
    }

    /// Processes every completion there is (`rs_poll_cq`), then reposts a receive for each
    /// one consumed while connected.
    pub(crate) fn poll_cq(&mut self) {
        let mut received = 0u32;
        let mut completions = std::mem::take(&mut self.scratch);
        'outer: loop {
            completions.clear();
            if let Err(e) = self.ep.poll(&mut completions, 16) {
                self.fail(e);
                break;
            }
            if completions.is_empty() {
                break;
            }
            for c in completions.iter().copied() {
                if c.recv {
                    if !c.ok {
                        continue;
                    }
                    received += 1;
                    let Some(msg) = c.msg else { continue };
                    match parse_message(msg) {
                        (Op::Sgl, credits) => self.sseq_comp = credits as u16,
                        (Op::IomapSgl, _) | (Op::Other(_), _) => {}
                        (Op::Ctrl, CTRL_DISCONNECT) => {
                            self.disconnected();
                            break 'outer;
                        }
                        (Op::Ctrl, CTRL_SHUTDOWN) => {
                            if self.writable {
                                self.readable = false;
                            } else {
                                self.disconnected();
                                break 'outer;
                            }
                        }
                        (Op::Ctrl, _) => {}
                        (Op::Data, len) => {
                            // A peer within the protocol never writes more than a ring half
                            // nor more messages than it had credits for.
                            if len > self.ep.sizes.rbuf >> 1
                                || self.rmsg.len() > self.ep.sizes.rq as usize
                            {
                                self.fail(libc::EPROTO);
                                break 'outer;
                            }
                            self.rmsg.push_back(len);
                        }
                    }
                } else {
                    match c.msg.map(parse_message) {
                        Some((Op::Sgl, _)) => self.ctrl_max_seqno += 1,
                        Some((Op::Ctrl, code)) => {
                            self.ctrl_max_seqno += 1;
                            if code == CTRL_DISCONNECT {
                                self.disconnected();
                            }
                        }
                        Some((Op::IomapSgl, _)) => {
                            self.sqe_avail += 1;
                            self.sbuf_bytes_avail += super::endpoint::IOMAP_ENTRY_LEN as u32;
                        }
                        Some((_, len)) => {
                            self.sqe_avail += 1;
                            self.sbuf_bytes_avail += len;
                        }
                        None => {}
                    }
                    if !c.ok {
                        self.fail(libc::EIO);
                    }
                }
            }
        }
        self.scratch = completions;
        if self.connected() {
            for _ in 0..received {
                if let Err(e) = self.ep.post_recv() {
                    self.fail(e);
                    break;
                }
            }
        }
    }

    // --- Credits. ---

    fn give_credits(&self) -> bool {
        (self.rbuf_bytes_avail >= self.ep.sizes.rbuf >> 1
            || (self.rseq_no.wrapping_sub(self.rseq_comp) as i16) >= 0)
            && self.ctrl_avail()
            && self.connected()
    }

    /// Hands the peer credits and, when half the ring is free, that half (`rs_update_credits`).
    pub(crate) fn update_credits(&mut self) {
        if self.give_credits() {
            self.send_credits();
        }
    }

    fn send_credits(&mut self) {
        let s = self.ep.sizes;
        self.ctrl_seqno += 1;
        self.rseq_comp = self.rseq_no.wrapping_add((s.rq >> 1) as u16);
        let limit = message(Op::Sgl, u32::from(self.rseq_no.wrapping_add(s.rq as u16)));
        let half = s.rbuf >> 1;
        let result = if self.rbuf_bytes_avail >= half {
            let sge = Sge {
                addr: self.ep.rbuf.buf.addr() + u64::from(self.rbuf_free_offset),
                key: self.ep.rbuf.rkey(),
                length: half,
            };
            let bytes = sge.to_receiver_bytes(self.peer_big_endian);
            let remote = (
                self.remote_sgl.addr + u64::from(self.remote_sge) * SGE_LEN as u64,
                self.remote_sgl.key,
            );
            let result = if (s.inline as usize) < SGE_LEN {
                let slot =
                    s.sbuf as usize + SGE_LEN * (self.ctrl_seqno as usize & (CTRL_SLOTS - 1));
                self.ep.sbuf.buf.write(slot, &bytes);
                let mut sge = [ibv_sge {
                    addr: self.ep.sbuf.buf.addr() + slot as u64,
                    length: SGE_LEN as u32,
                    lkey: self.ep.sbuf.lkey(),
                }];
                self.ep
                    .post_write(limit, &mut sge, Some(limit), false, remote)
            } else {
                let mut sge = [ibv_sge {
                    addr: bytes.as_ptr() as u64,
                    length: SGE_LEN as u32,
                    lkey: 0,
                }];
                self.ep
                    .post_write(limit, &mut sge, Some(limit), true, remote)
            };
            self.rbuf_bytes_avail -= half;
            self.rbuf_free_offset += half;
            if self.rbuf_free_offset >= s.rbuf {
                self.rbuf_free_offset = 0;
            }
            self.remote_sge += 1;
            if self.remote_sge >= self.remote_sgl.length {
                self.remote_sge = 0;
            }
            result
        } else {
            self.ep
                .post_write(limit, &mut [], Some(limit), false, (0, 0))
        };
        if let Err(e) = result {
            self.fail(e);
        }
    }

    /// Sends control message `code` (a zero-length write with immediate); needs a free
    /// control slot ([`conn_ctrl_avail`](Self::conn_ctrl_avail)).
    pub(crate) fn post_ctrl(&mut self, code: u32) -> Result<(), c_int> {
        self.ctrl_seqno += 1;
        let msg = message(Op::Ctrl, code);
        self.ep.post_write(msg, &mut [], Some(msg), false, (0, 0))
    }

    // --- Data. ---

    /// Writes one chunk of `buf` (at most the chunk size `olen` allows, which then grows);
    /// the bytes written. Needs [`can_send`](Self::can_send).
    pub(crate) fn send_chunk(&mut self, buf: &[u8], olen: &mut usize) -> Result<usize, c_int> {
        let s = self.ep.sizes;
        let mut xfer = if *olen < buf.len() {
            let x = *olen;
            if *olen < MAX_TRANSFER {
                *olen <<= 1;
            }
            x
        } else {
            buf.len()
        };
        xfer = xfer
            .min(self.sbuf_bytes_avail as usize)
            .min(self.target_len(self.target_sge) as usize);
        let data = &buf[..xfer];
        if xfer <= s.inline as usize {
            let mut sge = [ibv_sge {
                addr: data.as_ptr() as u64,
                length: xfer as u32,
                lkey: 0,
            }];
            self.write_data(&mut sge, xfer as u32, true)?;
        } else {
            let pos = self.sbuf_pos as usize;
            let to_end = s.sbuf as usize - pos;
            let base = self.ep.sbuf.buf.addr();
            let lkey = self.ep.sbuf.lkey();
            if xfer <= to_end {
                self.ep.sbuf.buf.write(pos, data);
                let mut sge = [ibv_sge {
                    addr: base + pos as u64,
                    length: xfer as u32,
                    lkey,
                }];
                self.sbuf_pos = if xfer < to_end {
                    (pos + xfer) as u32
                } else {
                    0
                };
                self.write_data(&mut sge, xfer as u32, false)?;
            } else {
                let (head, tail) = data.split_at(to_end);
                self.ep.sbuf.buf.write(pos, head);
                self.ep.sbuf.buf.write(0, tail);
                let mut sges = [
                    ibv_sge {
                        addr: base + pos as u64,
                        length: to_end as u32,
                        lkey,
                    },
                    ibv_sge {
                        addr: base,
                        length: tail.len() as u32,
                        lkey,
                    },
                ];
                self.sbuf_pos = tail.len() as u32;
                self.write_data(&mut sges, xfer as u32, false)?;
            }
        }
        Ok(xfer)
    }

    fn write_data(&mut self, sges: &mut [ibv_sge], len: u32, inline: bool) -> Result<(), c_int> {
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= 1;
        self.sbuf_bytes_avail -= len;
        let i = self.target_sge;
        let mut target = self.read_target(i);
        let remote = (target.addr, target.key);
        // The entry is updated before the write goes: the peer may rewrite it as soon as it
        // sees the data.
        target.addr += u64::from(len);
        target.length -= len;
        self.write_target(i, target);
        if target.length == 0 {
            self.target_sge = (i + 1) % SGL_ENTRIES as usize;
        }
        let msg = message(Op::Data, len);
        let result = self.ep.post_write(msg, sges, Some(msg), inline, remote);
        if let Err(e) = result {
            self.fail(e);
        }
        result
    }

    /// Copies received data into `buf` in order (consuming it unless `peek`): the bytes copied.
    pub(crate) fn recv_into(&mut self, buf: &mut [u8], peek: bool) -> usize {
        let size = self.ep.sizes.rbuf;
        let mut copied = 0usize;
        let mut offset = self.rbuf_offset;
        let mut index = 0usize;
        while copied < buf.len() {
            let Some(&avail) = self.rmsg.get(index) else {
                break;
            };
            let take = (buf.len() - copied).min(avail as usize) as u32;
            let mut left = take;
            while left > 0 {
                let run = left.min(size - offset);
                self.ep
                    .rbuf
                    .buf
                    .read(offset as usize, &mut buf[copied..copied + run as usize]);
                copied += run as usize;
                left -= run;
                offset += run;
                if offset == size {
                    offset = 0;
                }
            }
            if peek {
                index += 1;
                continue;
            }
            if take < avail {
                self.rmsg[0] = avail - take;
            } else {
                self.rmsg.pop_front();
                self.rseq_no = self.rseq_no.wrapping_add(1);
            }
            self.rbuf_bytes_avail += take;
        }
        if !peek {
            self.rbuf_offset = offset;
        }
        copied
    }
}

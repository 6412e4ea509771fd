//! The verbs objects of a connected rsocket and the work requests it posts: one RC QP made
//! through its CM id, one CQ (with its completion channel) for both queues, and three
//! registered buffers — the send ring, the receive ring and the target buffer (the scatter
//! list, then the iomap table, that the peer writes into).
//!
//! These are calls into this library's own verbs and CM entry points, as rdma-core's
//! rsockets call libibverbs and librdmacm; each raw object is owned here and released on drop
//! in the reverse order of its making, so that a create that fails half-way unwinds.

use std::ffi::c_int;
use std::os::fd::RawFd;

use super::buffers::PageBuf;
use super::wire::SGE_LEN;
use crate::cq::{
    ibv_ack_cq_events, ibv_create_comp_channel, ibv_create_cq, ibv_destroy_comp_channel,
    ibv_destroy_cq, ibv_get_cq_event,
};
use crate::datapath::{poll_cq, post_recv, post_send, req_notify_cq};
use crate::ffi::errno;
use crate::objects::{ibv_dereg_mr, ibv_reg_mr};
use crate::qp::ibv_modify_qp;
use crate::rdmacm::{rdma_create_qp, rdma_destroy_qp};
use crate::sys::*;

/// Bit set in a receive's work-request id (`RS_WR_ID_FLAG_RECV`): sends' ids are messages.
const RECV_WR_ID: u64 = 1 << 63;
/// Bytes of one iomap table entry.
pub(crate) const IOMAP_ENTRY_LEN: usize = 24;
/// Control-message staging slots in the send buffer when inline data is too small for a
/// scatter entry (`RS_QP_CTRL_SIZE` × `RS_MAX_CTRL_MSG`).
pub(crate) const CTRL_SLOTS: usize = 4;

/// Queue and buffer sizes of an endpoint.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    pub(crate) sq: u32,
    pub(crate) rq: u32,
    pub(crate) inline: u32,
    pub(crate) sbuf: u32,
    pub(crate) rbuf: u32,
    pub(crate) iomap_entries: u32,
}

/// A completion, reduced to what rsockets read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Completion {
    pub(crate) recv: bool,
    pub(crate) ok: bool,
    /// The message: the send's work-request id, or a receive's immediate data.
    pub(crate) msg: Option<u32>,
}

/// A registered page buffer; deregistered on drop, before the pages go.
pub(crate) struct Registered {
    pub(crate) mr: *mut ibv_mr,
    pub(crate) buf: PageBuf,
}

impl Registered {
    fn new(pd: *mut ibv_pd, len: usize, access: u32) -> Result<Registered, c_int> {
        let buf = PageBuf::new(len).map_err(|e| e.raw_os_error().unwrap_or(libc::ENOMEM))?;
        // SAFETY: `pd` is the id's live PD; the buffer is ours and outlives the MR (dropped
        // after it, in `Drop`).
        let mr = unsafe { ibv_reg_mr(pd, buf.as_void(), buf.len(), access as c_int) };
        if mr.is_null() {
            return Err(errno());
        }
        Ok(Registered { mr, buf })
    }

    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: a live MR of ours.
        unsafe { (*self.mr).lkey }
    }

    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: a live MR of ours.
        unsafe { (*self.mr).rkey }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        // SAFETY: our MR, deregistered once.
        unsafe { ibv_dereg_mr(self.mr) };
    }
}

/// The CQ and its channel; destroyed on drop (after the QP, which the endpoint drops first).
struct CompletionQueue {
    channel: *mut ibv_comp_channel,
    cq: *mut ibv_cq,
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: our own objects, destroyed once, CQ before its channel.
        unsafe {
            if !self.cq.is_null() {
                ibv_destroy_cq(self.cq);
            }
            ibv_destroy_comp_channel(self.channel);
        }
    }
}

/// The id's QP, destroyed on drop (before the CQ and buffers).
struct QpOfId {
    id: *mut rdma_cm_id,
}

impl Drop for QpOfId {
    fn drop(&mut self) {
        // SAFETY: the id is live (the socket destroys it after its endpoint) and has our QP.
        unsafe { rdma_destroy_qp(self.id) };
    }
}

/// A connected rsocket's verbs objects. Fields drop in order: QP, buffers, CQ.
pub(crate) struct Endpoint {
    /// Held only to destroy the QP first.
    _qp_of_id: QpOfId,
    pub(crate) sbuf: Registered,
    pub(crate) rbuf: Registered,
    pub(crate) target: Registered,
    cq: CompletionQueue,
    qp: *mut ibv_qp,
    pub(crate) sizes: Sizes,
}

// SAFETY: the raw objects are this library's thread-safe verbs objects; the socket serialises
// its use of them.
unsafe impl Send for Endpoint {}

impl Endpoint {
    /// Makes the QP, CQ and buffers of `id` and posts every receive.
    ///
    /// # Safety
    /// `id` is a live CM id of this library, bound to the device (`verbs` set) and without a
    /// QP; it outlives the endpoint.
    pub(crate) unsafe fn create(id: *mut rdma_cm_id, mut sizes: Sizes) -> Result<Endpoint, c_int> {
        // SAFETY: caller contract.
        let verbs = unsafe { (*id).verbs };
        // SAFETY: a context of this library.
        let channel = unsafe { ibv_create_comp_channel(verbs) };
        if channel.is_null() {
            return Err(errno());
        }
        let mut cq = CompletionQueue {
            channel,
            cq: std::ptr::null_mut(),
        };
        // Waits go through poll(2); a read after it must never block.
        // SAFETY: the channel is live.
        set_nonblocking(unsafe { (*channel).fd }, true);
        let depth = (sizes.sq + sizes.rq) as c_int;
        // SAFETY: a context of this library and its channel.
        cq.cq = unsafe { ibv_create_cq(verbs, depth, std::ptr::null_mut(), channel, 0) };
        if cq.cq.is_null() {
            return Err(errno());
        }
        // SAFETY: a C struct for which all zeroes are valid.
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = cq.cq;
        attr.recv_cq = cq.cq;
        attr.qp_type = ibv_qp_type_IBV_QPT_RC;
        attr.sq_sig_all = 1;
        attr.cap.max_send_wr = sizes.sq;
        attr.cap.max_recv_wr = sizes.rq;
        attr.cap.max_send_sge = 2;
        attr.cap.max_recv_sge = 1;
        attr.cap.max_inline_data = sizes.inline;
        // SAFETY: caller contract; `attr` is a local.
        if unsafe { rdma_create_qp(id, std::ptr::null_mut(), &mut attr) } != 0 {
            return Err(errno());
        }
        let qp_of_id = QpOfId { id };
        sizes.inline = attr.cap.max_inline_data;
        // SAFETY: caller contract: the id now has its QP and PD.
        let (qp, pd) = unsafe { ((*id).qp, (*id).pd) };
        let pd = if pd.is_null() {
            // SAFETY: the QP just made.
            unsafe { (*qp).pd }
        } else {
            pd
        };
        let local = ibv_access_flags_IBV_ACCESS_LOCAL_WRITE;
        let remote = local | ibv_access_flags_IBV_ACCESS_REMOTE_WRITE;
        let ctrl_area = if (sizes.inline as usize) < SGE_LEN {
            CTRL_SLOTS * SGE_LEN
        } else {
            0
        };
        let sbuf = Registered::new(pd, sizes.sbuf as usize + ctrl_area, local)?;
        let target_len = SGE_LEN * super::wire::SGL_ENTRIES as usize
            + IOMAP_ENTRY_LEN * sizes.iomap_entries as usize;
        let target = Registered::new(pd, target_len, remote)?;
        let rbuf = Registered::new(pd, sizes.rbuf as usize, remote)?;
        let ep = Endpoint {
            _qp_of_id: qp_of_id,
            sbuf,
            rbuf,
            target,
            cq,
            qp,
            sizes,
        };
        for _ in 0..sizes.rq {
            ep.post_recv()?;
        }
        Ok(ep)
    }

    /// Posts one receive without scatter entries (a write with immediate consumes it).
    pub(crate) fn post_recv(&self) -> Result<(), c_int> {
        // SAFETY: a C struct for which all zeroes are valid.
        let mut wr: ibv_recv_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = RECV_WR_ID;
        let mut bad = std::ptr::null_mut();
        // SAFETY: our live QP; `wr` a local list of one.
        match unsafe { post_recv(self.qp, &mut wr, &mut bad) } {
            0 => Ok(()),
            e => Err(e),
        }
    }

    /// Posts an RDMA WRITE (with immediate `imm` when given) of `sges` to `remote`.
    pub(crate) fn post_write(
        &self,
        wr_id: u32,
        sges: &mut [ibv_sge],
        imm: Option<u32>,
        inline: bool,
        remote: (u64, u32),
    ) -> Result<(), c_int> {
        // SAFETY: a C struct for which all zeroes are valid.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = u64::from(wr_id);
        wr.num_sge = sges.len() as c_int;
        wr.sg_list = if sges.is_empty() {
            std::ptr::null_mut()
        } else {
            sges.as_mut_ptr()
        };
        match imm {
            Some(imm) => {
                wr.opcode = ibv_wr_opcode_IBV_WR_RDMA_WRITE_WITH_IMM;
                wr.__bindgen_anon_1.imm_data = imm.to_be();
            }
            None => wr.opcode = ibv_wr_opcode_IBV_WR_RDMA_WRITE,
        }
        if inline {
            wr.send_flags = ibv_send_flags_IBV_SEND_INLINE;
        }
        wr.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
            remote_addr: remote.0,
            rkey: remote.1,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: our live QP; `wr` and the scatter list it names are live locals.
        match unsafe { post_send(self.qp, &mut wr, &mut bad) } {
            0 => Ok(()),
            e => Err(e),
        }
    }

    /// Takes up to `out.len()` completions; `Err` when the CQ failed.
    pub(crate) fn poll(&self, out: &mut Vec<Completion>, max: usize) -> Result<(), c_int> {
        // SAFETY: a C struct for which all zeroes are valid.
        let mut wc: [ibv_wc; 16] = unsafe { std::mem::zeroed() };
        let want = max.min(wc.len()) as c_int;
        // SAFETY: our live CQ; `wc` has room for `want` entries.
        let n = unsafe { poll_cq(self.cq.cq, want, wc.as_mut_ptr()) };
        if n < 0 {
            return Err(libc::EIO);
        }
        for c in &wc[..n as usize] {
            let recv = c.wr_id & RECV_WR_ID != 0;
            let ok = c.status == ibv_wc_status_IBV_WC_SUCCESS;
            let msg = if recv {
                // SAFETY: reading the immediate of a completion that says it carries one.
                (c.wc_flags & ibv_wc_flags_IBV_WC_WITH_IMM != 0)
                    .then(|| u32::from_be(unsafe { c.__bindgen_anon_1.imm_data }))
            } else {
                Some(c.wr_id as u32)
            };
            out.push(Completion { recv, ok, msg });
        }
        Ok(())
    }

    /// Asks for an event at the next completion.
    pub(crate) fn arm(&self) -> Result<(), c_int> {
        // SAFETY: our live CQ.
        match unsafe { req_notify_cq(self.cq.cq, 0) } {
            0 => Ok(()),
            e => Err(e),
        }
    }

    /// Takes and acknowledges the channel's pending completion events, without blocking:
    /// whether there was one.
    pub(crate) fn take_events(&self) -> bool {
        let mut any = false;
        loop {
            let mut cq = std::ptr::null_mut();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: our live channel (non-blocking); `cq`, `ctx` are locals.
            if unsafe { ibv_get_cq_event(self.cq.channel, &mut cq, &mut ctx) } != 0 {
                return any;
            }
            // SAFETY: the event's CQ is ours.
            unsafe { ibv_ack_cq_events(cq, 1) };
            any = true;
        }
    }

    /// The completion channel's descriptor (readable when an event is pending).
    pub(crate) fn channel_fd(&self) -> RawFd {
        // SAFETY: our live channel.
        unsafe { (*self.cq.channel).fd }
    }

    /// Moves the QP to the error state, flushing what is queued (rdma-core's `ucma_shutdown`).
    pub(crate) fn to_error(&self) {
        // SAFETY: a C struct for which all zeroes are valid.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state_IBV_QPS_ERR;
        // SAFETY: our live QP; `attr` a local.
        unsafe { ibv_modify_qp(self.qp, &mut attr, ibv_qp_attr_mask_IBV_QP_STATE as c_int) };
    }
}

/// Sets or clears `O_NONBLOCK` on `fd`.
pub(crate) fn set_nonblocking(fd: RawFd, on: bool) {
    // SAFETY: fcntl on a descriptor; no memory is involved.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            let flags = if on {
                flags | libc::O_NONBLOCK
            } else {
                flags & !libc::O_NONBLOCK
            };
            libc::fcntl(fd, libc::F_SETFL, flags);
        }
    }
}

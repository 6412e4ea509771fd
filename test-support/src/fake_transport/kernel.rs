//! The fake's loopback Soft-RoCE "kernel": drains the doorbell area and executes SEND, RDMA
//! WRITE (with or without immediate data), RDMA READ and the two atomics (compare and swap,
//! fetch and add, on native-endian 64-bit words as rdma_rxe) between the device's own QPs through
//! the registered page lists (and memory windows, `windows.rs`), writing native CQEs and the
//! events they raise. As rdma_rxe, a UC sender is never told what became of its message: what
//! the responder drops completes successfully at the sender.

use std::mem::size_of;
use std::sync::atomic::{AtomicU32, Ordering};

use vrdma::dma::PAGE_SIZE;
use vrdma::spec::event::{Event, EventType};
use vrdma::spec::rxe_v1::{IbUverbsWc, RxeRecvWqe, RxeSendWqe, RxeSge};
use vrdma::spec::verbs::{self as sv, AccessFlags, QpState, QpType, WcOpcode, WcStatus, WrOpcode};
use vrdma::spec::{DoorbellArea, Le32};
use zerocopy::FromZeros;

use super::device::{FakeDevice, FakeMr};
use super::profile::{doorbell_area_bytes, DOORBELL_SLOTS, MAX_INLINE, MAX_SGE};
use super::ring::Ring;
use super::windows::LOCAL_INV_FAILED;

impl FakeDevice {
    /// Drains the doorbell area and processes the send queue of every QP it names; returns
    /// the events that produced.
    pub(crate) fn run_kernel(&mut self) -> Vec<Event> {
        let Some(gpa) = self.doorbell else {
            return Vec::new();
        };
        let area_ptr = self.ram_range(gpa, doorbell_area_bytes()).unwrap();
        // SAFETY: the registered area lies in guest RAM (checked at registration), is 4-byte
        // aligned, and both sides use it only atomically.
        let words = unsafe {
            std::slice::from_raw_parts(area_ptr.cast::<AtomicU32>(), doorbell_area_bytes() / 4)
        };
        let area = DoorbellArea::new(words, DOORBELL_SLOTS).unwrap();
        let mut kicked = Vec::new();
        area.drain(&mut self.doorbell_head, |index| kicked.push(index));
        let mut events = Vec::new();
        for index in kicked {
            let qp = self
                .qps
                .iter()
                .find(|(_, q)| q.doorbell_index == index)
                .map(|(h, _)| *h);
            if let Some(qp) = qp {
                self.process_send_queue(qp, &mut events);
            }
        }
        events
    }

    fn process_send_queue(&mut self, handle: u32, events: &mut Vec<Event>) {
        let qp = &self.qps[&handle];
        if qp.state != QpState::Rts {
            return;
        }
        let (sq, qpn, send_cq, sig_all) = (qp.sq, qp.qpn, qp.send_cq, qp.sq_sig_all);
        while let Some(index) = sq.peek() {
            // SAFETY: a posted slot, owned by the kernel until the consumer passes it.
            let wqe = unsafe { sq.slot(index).cast::<RxeSendWqe>().read() };
            let (mut status, opcode, byte_len) = if self.qps[&handle].state == QpState::Err {
                // What follows a WQE the device refused is flushed (spec §9.6).
                (WcStatus::WrFlushErr.raw(), WcOpcode::Send.raw(), 0)
            } else if !self.staged_ud_allowed(handle, &wqe) {
                // The device's checks of a staged UD WQE (spec §9.6): it reaches the host
                // neutralised, fails there, and the QP goes to ERR.
                if let Some(qp) = self.qps.get_mut(&handle) {
                    qp.state = QpState::Err;
                }
                (WcStatus::LocQpOpErr.raw(), WcOpcode::Send.raw(), 0)
            } else {
                self.execute_wqe(handle, &sq, index, &wqe, events)
            };
            // Only errors found at the sender reach a UC sender; no acknowledgement carries
            // the responder's.
            if self.qps[&handle].qp_type == QpType::Uc && !local_error(status) {
                status = WcStatus::Success.raw();
            }
            sq.pop(index);
            let signaled = wqe.wr.send_flags.get() & sv::SendFlags::SIGNALED.bits() != 0;
            if signaled || sig_all || status != WcStatus::Success.raw() {
                let wc = IbUverbsWc {
                    wr_id: wqe.wr.wr_id,
                    status: Le32::new(status),
                    opcode: Le32::new(opcode),
                    byte_len: Le32::new(byte_len),
                    qp_num: Le32::new(qpn),
                    port_num: 1,
                    ..IbUverbsWc::new_zeroed()
                };
                self.push_cqe(send_cq, wc, events);
            }
        }
    }

    /// Whether a WQE of QP `handle` passes the device's checks of staged UD sends (always true
    /// for other QPs, or without `VRDMA_F_UD_STAGED_SQ`): SEND or SEND_WITH_IMM through an AH
    /// *handle* of the QP's PD, with no embedded address vector.
    fn staged_ud_allowed(&self, handle: u32, wqe: &RxeSendWqe) -> bool {
        let qp = &self.qps[&handle];
        if !self.ud_staged || qp.qp_type != QpType::Ud {
            return true;
        }
        let opcode = wqe.wr.opcode.get();
        let ud = wqe.wr.wr.ud();
        (opcode == WrOpcode::Send as u32 || opcode == WrOpcode::SendWithImm as u32)
            && self
                .ahs
                .get(&ud.ah_num.get())
                .is_some_and(|&(pd, _)| pd == qp.pd)
    }

    /// Executes one send WQE; returns the completion's status, opcode and length.
    fn execute_wqe(
        &mut self,
        handle: u32,
        sq: &Ring,
        index: u32,
        wqe: &RxeSendWqe,
        events: &mut Vec<Event>,
    ) -> (u32, u32, u32) {
        let qp = &self.qps[&handle];
        let pd = qp.pd;
        let dest_qpn = if qp.qp_type == QpType::Ud {
            wqe.wr.wr.ud().remote_qpn.get()
        } else {
            qp.dest_qpn
        };
        let len = wqe.dma.length.get();
        let local = local_payload(sq, index, wqe);
        match WrOpcode::try_from(wqe.wr.opcode.get()) {
            Ok(op @ (WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv)) => {
                let Some(payload) = self.gather(pd, &local) else {
                    return (WcStatus::LocProtErr.raw(), WcOpcode::Send.raw(), 0);
                };
                let ex = u32::from_ne_bytes(wqe.wr.ex);
                let extra = match op {
                    WrOpcode::SendWithImm => Extra::Imm(ex),
                    WrOpcode::SendWithInv => Extra::Invalidate(ex),
                    _ => Extra::None,
                };
                let src_qpn = self.qps[&handle].qpn;
                let status = self.deliver(dest_qpn, src_qpn, &payload, extra, events);
                (status, WcOpcode::Send.raw(), len)
            }
            Ok(WrOpcode::BindMw) => {
                let status = self.bind_mw(handle, wqe);
                (status.raw(), WcOpcode::BindMw.raw(), 0)
            }
            Ok(WrOpcode::LocalInv) => {
                let status = if self.invalidate(u32::from_ne_bytes(wqe.wr.ex)) {
                    WcStatus::Success
                } else {
                    LOCAL_INV_FAILED
                };
                (status.raw(), WcOpcode::LocalInv.raw(), 0)
            }
            Ok(op @ (WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm)) => {
                let Some(payload) = self.gather(pd, &local) else {
                    return (WcStatus::LocProtErr.raw(), WcOpcode::RdmaWrite.raw(), 0);
                };
                let rdma = wqe.wr.wr.rdma();
                let (rkey, remote_addr) = (rdma.rkey.get(), rdma.remote_addr.get());
                match self.remote(
                    dest_qpn,
                    rkey,
                    remote_addr,
                    len,
                    AccessFlags::REMOTE_WRITE.bits(),
                ) {
                    Some(mr) if op == WrOpcode::RdmaWrite => {
                        self.copy_to_mr(mr, remote_addr, &payload);
                        (WcStatus::Success.raw(), WcOpcode::RdmaWrite.raw(), len)
                    }
                    Some(mr) => {
                        self.copy_to_mr(mr, remote_addr, &payload);
                        let imm = u32::from_ne_bytes(wqe.wr.ex);
                        let src_qpn = self.qps[&handle].qpn;
                        let status = self.complete_write_imm(dest_qpn, src_qpn, len, imm, events);
                        (status, WcOpcode::RdmaWrite.raw(), len)
                    }
                    None => (WcStatus::RemAccessErr.raw(), WcOpcode::RdmaWrite.raw(), 0),
                }
            }
            Ok(WrOpcode::RdmaRead) => {
                let rdma = wqe.wr.wr.rdma();
                let (rkey, remote_addr) = (rdma.rkey.get(), rdma.remote_addr.get());
                let Some(mr) = self.remote(
                    dest_qpn,
                    rkey,
                    remote_addr,
                    len,
                    AccessFlags::REMOTE_READ.bits(),
                ) else {
                    return (WcStatus::RemAccessErr.raw(), WcOpcode::RdmaRead.raw(), 0);
                };
                let data = self.copy_from_mr(mr, remote_addr, len as usize);
                let Local::Sges(sges) = &local else {
                    return (WcStatus::LocQpOpErr.raw(), WcOpcode::RdmaRead.raw(), 0);
                };
                if self.scatter(pd, sges, &data).is_none() {
                    return (WcStatus::LocProtErr.raw(), WcOpcode::RdmaRead.raw(), 0);
                }
                (WcStatus::Success.raw(), WcOpcode::RdmaRead.raw(), len)
            }
            Ok(op @ (WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd)) => {
                self.execute_atomic(pd, dest_qpn, op, wqe, &local)
            }
            Ok(WrOpcode::AtomicWrite) => {
                // As rxe: the 8 bytes replace the remote word whole; RDMA WRITE's access.
                let wc_opcode = WcOpcode::AtomicWrite.raw();
                let rdma = wqe.wr.wr.rdma();
                let (rkey, remote_addr) = (rdma.rkey.get(), rdma.remote_addr.get());
                let access = AccessFlags::REMOTE_WRITE.bits();
                let Some(mr) = self.remote(dest_qpn, rkey, remote_addr, 8, access) else {
                    return (WcStatus::RemAccessErr.raw(), wc_opcode, 0);
                };
                if !remote_addr.is_multiple_of(8) {
                    return (WcStatus::RemInvReqErr.raw(), wc_opcode, 0);
                }
                let Local::Inline(bytes) = &local else {
                    return (WcStatus::LocQpOpErr.raw(), wc_opcode, 0);
                };
                self.copy_to_mr(mr, remote_addr, bytes);
                (WcStatus::Success.raw(), wc_opcode, 8)
            }
            _ => (WcStatus::LocQpOpErr.raw(), WcOpcode::Send.raw(), 0),
        }
    }

    /// Executes an atomic: the remote 64-bit word is replaced (compare and swap: if it equals
    /// `compare_add`) and its original value lands in the local SGEs.
    fn execute_atomic(
        &mut self,
        pd: u32,
        dest_qpn: u32,
        op: WrOpcode,
        wqe: &RxeSendWqe,
        local: &Local,
    ) -> (u32, u32, u32) {
        let wc_opcode = if op == WrOpcode::AtomicCmpAndSwp {
            WcOpcode::CompSwap.raw()
        } else {
            WcOpcode::FetchAdd.raw()
        };
        let atomic = wqe.wr.wr.atomic();
        let (rkey, remote_addr) = (atomic.rkey.get(), atomic.remote_addr.get());
        let access = AccessFlags::REMOTE_ATOMIC.bits();
        let Some(mr) = self.remote(dest_qpn, rkey, remote_addr, 8, access) else {
            return (WcStatus::RemAccessErr.raw(), wc_opcode, 0);
        };
        if !remote_addr.is_multiple_of(8) {
            return (WcStatus::RemInvReqErr.raw(), wc_opcode, 0);
        }
        let bytes: [u8; 8] = self.copy_from_mr(mr, remote_addr, 8).try_into().unwrap();
        let original = u64::from_ne_bytes(bytes);
        let operand = atomic.compare_add.get();
        let replaced = match op {
            WrOpcode::AtomicCmpAndSwp if original == operand => atomic.swap.get(),
            WrOpcode::AtomicCmpAndSwp => original,
            _ => original.wrapping_add(operand),
        };
        self.copy_to_mr(mr, remote_addr, &replaced.to_ne_bytes());
        let Local::Sges(sges) = local else {
            return (WcStatus::LocQpOpErr.raw(), wc_opcode, 0);
        };
        if self.scatter(pd, sges, &bytes).is_none() {
            return (WcStatus::LocProtErr.raw(), wc_opcode, 0);
        }
        (WcStatus::Success.raw(), wc_opcode, 8)
    }

    /// The payload of a send or write: inline bytes or the bytes under the SGEs.
    fn gather(&self, pd: u32, local: &Local) -> Option<Vec<u8>> {
        match local {
            Local::Inline(bytes) => Some(bytes.clone()),
            Local::Sges(sges) => {
                let mut out = Vec::new();
                for sge in sges {
                    let (lkey, addr, length) = (sge.lkey.get(), sge.addr.get(), sge.length.get());
                    let mr = self.local_mr(pd, lkey, addr, length, 0)?;
                    out.extend(self.copy_from_mr(mr, addr, length as usize));
                }
                Some(out)
            }
        }
    }

    /// Writes `data` over the SGEs (which need local write access); `None` on a protection
    /// error, `Some(false)` if the SGEs are too short.
    fn scatter(&self, pd: u32, sges: &[RxeSge], data: &[u8]) -> Option<bool> {
        let mut rest = data;
        for sge in sges {
            let (lkey, addr, length) = (sge.lkey.get(), sge.addr.get(), sge.length.get());
            let n = rest.len().min(length as usize);
            let mr = self.local_mr(pd, lkey, addr, length, AccessFlags::LOCAL_WRITE.bits())?;
            self.copy_to_mr(mr, addr, &rest[..n]);
            rest = &rest[n..];
        }
        Some(rest.is_empty())
    }

    /// The MR of `pd` with local key `lkey` covering `[addr, addr + len)` with `access`.
    fn local_mr(&self, pd: u32, lkey: u32, addr: u64, len: u32, access: u32) -> Option<&FakeMr> {
        self.mrs.values().find(|m| {
            m.pd == pd
                && m.lkey == lkey
                && m.access & access == access
                && addr >= m.iova
                && addr + u64::from(len) <= m.iova + m.len
        })
    }

    /// The MR a remote access through QP `qpn` with `rkey` (of an MR or a window) reaches.
    fn remote(&self, qpn: u32, rkey: u32, addr: u64, len: u32, access: u32) -> Option<&FakeMr> {
        let pd = self.qps.values().find(|q| q.qpn == qpn)?.pd;
        self.mrs
            .values()
            .find(|m| {
                m.pd == pd
                    && m.rkey == rkey
                    && m.access & access == access
                    && addr >= m.iova
                    && addr + u64::from(len) <= m.iova + m.len
            })
            .or_else(|| self.remote_window(qpn, pd, rkey, addr, len, access))
    }

    /// Host address of MR byte `iova`, through the page list as the device maps it.
    fn mr_byte(&self, mr: &FakeMr, iova: u64) -> (*mut u8, usize) {
        let page_size = PAGE_SIZE as u64;
        let offset = (mr.iova % page_size) + (iova - mr.iova);
        let page = mr.pages[(offset / page_size) as usize];
        let in_page = (offset % page_size) as usize;
        let host = self.ram_range(page, PAGE_SIZE).unwrap();
        // SAFETY: inside the page just translated.
        (unsafe { host.add(in_page) }, PAGE_SIZE - in_page)
    }

    fn copy_to_mr(&self, mr: &FakeMr, mut iova: u64, mut data: &[u8]) {
        while !data.is_empty() {
            let (host, room) = self.mr_byte(mr, iova);
            let n = room.min(data.len());
            // SAFETY: `n` bytes inside one registered guest page; the "NIC" writes guest
            // memory the application handed to it, as DMA would.
            unsafe { std::ptr::copy(data.as_ptr(), host, n) };
            data = &data[n..];
            iova += n as u64;
        }
    }

    fn copy_from_mr(&self, mr: &FakeMr, mut iova: u64, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let (host, room) = self.mr_byte(mr, iova);
            let n = room.min(len - out.len());
            // SAFETY: `n` readable bytes inside one registered guest page.
            out.extend_from_slice(unsafe { std::slice::from_raw_parts(host, n) });
            iova += n as u64;
        }
        out
    }

    /// A received message: consumes a receive WQE of QP `qpn` and completes it.
    fn deliver(
        &mut self,
        qpn: u32,
        src_qp: u32,
        payload: &[u8],
        extra: Extra,
        events: &mut Vec<Event>,
    ) -> u32 {
        let Some(dest) = self.qps.values().find(|q| q.qpn == qpn) else {
            return WcStatus::RetryExcErr.raw();
        };
        if !matches!(dest.state, QpState::Rtr | QpState::Rts) {
            return WcStatus::RetryExcErr.raw();
        }
        let (rq, pd, recv_cq) = (dest.rq, dest.pd, dest.recv_cq);
        let Some(index) = rq.peek() else {
            return WcStatus::RnrRetryExcErr.raw();
        };
        if let Extra::Invalidate(rkey) = extra {
            if !self.invalidate(rkey) {
                return WcStatus::RemOpErr.raw();
            }
        }
        // SAFETY: a posted receive slot, owned by the kernel until the consumer passes it.
        let wqe = unsafe { rq.slot(index).cast::<RxeRecvWqe>().read() };
        let n = (wqe.dma.num_sge.get() as usize).min(MAX_SGE as usize);
        // SAFETY: `n` SGEs follow the receive WQE inside its slot.
        let first = unsafe { rq.slot(index).add(size_of::<RxeRecvWqe>()).cast::<RxeSge>() };
        // SAFETY: as above; SGEs are plain data.
        let sges: Vec<RxeSge> = (0..n).map(|i| unsafe { first.add(i).read() }).collect();
        rq.pop(index);
        let status = match self.scatter(pd, &sges, payload) {
            Some(true) => WcStatus::Success.raw(),
            Some(false) => WcStatus::LocLenErr.raw(),
            None => WcStatus::LocProtErr.raw(),
        };
        let wc = IbUverbsWc {
            wr_id: wqe.wr_id,
            status: Le32::new(status),
            opcode: Le32::new(WcOpcode::Recv.raw()),
            byte_len: Le32::new(payload.len() as u32),
            ex: match extra {
                Extra::Imm(v) | Extra::Invalidate(v) => v.to_ne_bytes(),
                Extra::None => [0; 4],
            },
            qp_num: Le32::new(qpn),
            src_qp: Le32::new(src_qp),
            // rxe writes the kernel's flags: IB_WC_WITH_INVALIDATE is bit 2.
            wc_flags: Le32::new(match extra {
                Extra::Imm(_) => sv::WcFlags::WITH_IMM.bits(),
                Extra::Invalidate(_) => KERNEL_WC_WITH_INVALIDATE,
                Extra::None => 0,
            }),
            port_num: 1,
            ..IbUverbsWc::new_zeroed()
        };
        self.push_cqe(recv_cq, wc, events);
        if status == WcStatus::Success.raw() {
            WcStatus::Success.raw()
        } else {
            WcStatus::RemOpErr.raw()
        }
    }

    /// Adds a successful SEND completion with `wr_id` to CQ `handle`, as the kernel would for a
    /// QP using it; returns false if the CQ is full (the completion is then lost, as rxe's).
    pub(crate) fn complete(&mut self, handle: u32, wr_id: u64, events: &mut Vec<Event>) -> bool {
        let before = events.len();
        let wc = IbUverbsWc {
            wr_id: wr_id.into(),
            opcode: Le32::new(WcOpcode::Send.raw()),
            port_num: 1,
            ..IbUverbsWc::new_zeroed()
        };
        self.push_cqe(handle, wc, events);
        !events[before..]
            .iter()
            .any(|e| e.event_type == EventType::CqErr)
    }

    /// The receive side of an RDMA WRITE with immediate data (already written): consumes a
    /// receive WQE of QP `qpn` without touching its SGEs and completes it with the immediate.
    fn complete_write_imm(
        &mut self,
        qpn: u32,
        src_qp: u32,
        len: u32,
        imm: u32,
        events: &mut Vec<Event>,
    ) -> u32 {
        let Some(dest) = self.qps.values().find(|q| q.qpn == qpn) else {
            return WcStatus::RetryExcErr.raw();
        };
        if !matches!(dest.state, QpState::Rtr | QpState::Rts) {
            return WcStatus::RetryExcErr.raw();
        }
        let (rq, recv_cq) = (dest.rq, dest.recv_cq);
        let Some(index) = rq.peek() else {
            return WcStatus::RnrRetryExcErr.raw();
        };
        // SAFETY: a posted receive slot, owned by the kernel until the consumer passes it.
        let wqe = unsafe { rq.slot(index).cast::<RxeRecvWqe>().read() };
        rq.pop(index);
        let wc = IbUverbsWc {
            wr_id: wqe.wr_id,
            status: Le32::new(WcStatus::Success.raw()),
            opcode: Le32::new(WcOpcode::RecvRdmaWithImm.raw()),
            byte_len: Le32::new(len),
            ex: imm.to_ne_bytes(),
            qp_num: Le32::new(qpn),
            src_qp: Le32::new(src_qp),
            wc_flags: Le32::new(sv::WcFlags::WITH_IMM.bits()),
            port_num: 1,
            ..IbUverbsWc::new_zeroed()
        };
        self.push_cqe(recv_cq, wc, events);
        WcStatus::Success.raw()
    }

    fn push_cqe(&mut self, handle: u32, wc: IbUverbsWc, events: &mut Vec<Event>) {
        let cq = self.cqs.get_mut(&handle).unwrap();
        let ring = cq.ring;
        let p = ring.producer().load(Ordering::Relaxed) & ring.mask;
        let c = ring.consumer().load(Ordering::Acquire) & ring.mask;
        if (p + 1) & ring.mask == c {
            events.push(object_event(EventType::CqErr, handle));
            return;
        }
        // SAFETY: the producer slot of a CQ that is not full belongs to the kernel.
        unsafe { ring.slot(p).cast::<IbUverbsWc>().write(wc) };
        ring.producer()
            .store((p + 1) & ring.mask, Ordering::Release);
        if std::mem::take(&mut cq.armed) {
            events.push(object_event(EventType::Completion, handle));
        }
    }
}

/// The kernel's `IB_WC_WITH_INVALIDATE`, as rxe writes it into user CQEs.
const KERNEL_WC_WITH_INVALIDATE: u32 = 1 << 2;

/// What a send carries besides its payload.
#[derive(Clone, Copy)]
enum Extra {
    None,
    /// Immediate data (network order, as found in the WQE).
    Imm(u32),
    /// An rkey the responder invalidates.
    Invalidate(u32),
}

/// Whether a completion status reports an error found at the sender itself (which a UC sender
/// sees), rather than one reported back by the responder (which UC has no way to report).
fn local_error(status: u32) -> bool {
    [
        WcStatus::LocLenErr,
        WcStatus::LocQpOpErr,
        WcStatus::LocProtErr,
        WcStatus::MwBindErr,
    ]
    .iter()
    .any(|s| s.raw() == status)
}

/// What a send WQE carries locally.
enum Local {
    Inline(Vec<u8>),
    Sges(Vec<RxeSge>),
}

fn local_payload(sq: &Ring, index: u32, wqe: &RxeSendWqe) -> Local {
    // SAFETY: the payload area follows the WQE inside its slot.
    let payload = unsafe { sq.slot(index).add(size_of::<RxeSendWqe>()) };
    let operand = WrOpcode::try_from(wqe.wr.opcode.get()).map_or(0, WrOpcode::wqe_operand_len);
    if operand != 0 {
        // ATOMIC_WRITE's 8 bytes (rxe's `dma.atomic_wr`), as inline bytes.
        // SAFETY: 8 bytes, which every slot holds after the WQE.
        return Local::Inline(unsafe { std::slice::from_raw_parts(payload, operand) }.to_vec());
    }
    if wqe.wr.send_flags.get() & sv::SendFlags::INLINE.bits() != 0 {
        let len = (wqe.dma.length.get() as usize).min(MAX_INLINE as usize);
        // SAFETY: at most MAX_INLINE bytes, which the slot holds.
        return Local::Inline(unsafe { std::slice::from_raw_parts(payload, len) }.to_vec());
    }
    let n = (wqe.dma.num_sge.get() as usize).min(MAX_SGE as usize);
    let first = payload.cast::<RxeSge>();
    // SAFETY: at most MAX_SGE SGEs, which the slot holds; SGEs are plain data.
    Local::Sges((0..n).map(|i| unsafe { first.add(i).read() }).collect())
}

/// An event of `event_type` about the object `handle`, as the device queues it.
pub fn object_event(event_type: EventType, handle: u32) -> Event {
    Event {
        event_type,
        handle,
        detail: 0,
    }
}

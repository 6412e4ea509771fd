//! The fake device's control plane: its objects, and the answer to every control command,
//! checked as the host device would (handles, PDs in use, legal QP transitions through the spec
//! crate, queue sizes), with queue buffers placed in the shared-memory region.

use std::collections::{BTreeMap, HashMap};
use std::mem::size_of;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use vrdma::dma::{MemfdRam, GUEST_RAM_BASE, PAGE_SIZE};
use vrdma::spec::control::{ControlRequest, ControlResponse, Opcode, ResponseBody};
use vrdma::spec::rxe_v1::{num_slots_for, recv_wqe_size, send_wqe_size, IbUverbsWc, RxeAv};
use vrdma::spec::verbs::{check_modify_qp, MwType, QpAttrMask, QpState, QpType};
use vrdma::spec::wire::*;
use vrdma::spec::{Le16, Le32, Le64, Status, StatusError};
use vrdma::verbs::GidType;
use zerocopy::FromZeros;

use super::profile::{
    check_port, device_attr, doorbell_area_bytes, port_attr, DOORBELL_SLOTS, LOCAL_GID, MAX_INLINE,
    MAX_QP_WR, MAX_SGE, SHM_SIZE,
};
use super::region::Region;
use super::ring::Ring;

/// A misbehaviour to apply to the next response.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
    /// Answer the next command of this opcode with this error, without executing it.
    Fail(Opcode, StatusError),
    /// Cut the next success response of this opcode by one byte.
    Truncate(Opcode),
    /// Describe the next created ring beyond the end of the region.
    RingOutsideRegion,
    /// Write a wrong `index_mask` into the next created ring's header.
    RingHeaderMismatch,
}

/// A memory region as the device registered it.
pub struct FakeMr {
    /// Handle of its PD.
    pub pd: u32,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
    /// First byte's iova.
    pub iova: u64,
    /// Length in bytes.
    pub len: u64,
    /// Access flags (wire values).
    pub access: u32,
    /// Guest-physical page list.
    pub pages: Vec<u64>,
}

/// A memory window as the device allocated it.
pub struct FakeMw {
    /// Handle of its PD.
    pub pd: u32,
    /// Type 1 or 2.
    pub mw_type: MwType,
    /// Current rkey (its low 8 bits change with every bind).
    pub rkey: u32,
    /// Where it is bound, if it is.
    pub binding: Option<MwBinding>,
}

/// A bound window: the MR range it opens and to whom.
#[derive(Clone, Copy, Debug)]
pub struct MwBinding {
    /// Handle of the MR.
    pub mr: u32,
    /// First byte, in the MR's iova space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote access the window grants (wire values).
    pub access: u32,
    /// The QP number a type-2 window was bound through: only that QP may use it.
    pub qpn: Option<u32>,
}

pub(crate) struct FakeCq {
    pub(crate) ring: Ring,
    pub(crate) armed: bool,
}

pub(crate) struct FakeQp {
    pub(crate) pd: u32,
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) state: QpState,
    pub(crate) send_cq: u32,
    pub(crate) recv_cq: u32,
    pub(crate) sq_sig_all: bool,
    pub(crate) doorbell_index: u32,
    pub(crate) sq: Ring,
    pub(crate) rq: Ring,
    pub(crate) dest_qpn: u32,
    pub(crate) attr: QpAttr,
}

/// The fake device's state: its objects, the command log, the next fault, and where the
/// doorbell area is.
pub struct FakeDevice {
    pub(crate) ram: Arc<MemfdRam>,
    /// Every command executed, with its request bytes, in order.
    pub log: Vec<(Opcode, Vec<u8>)>,
    pub(crate) fault: Option<Fault>,
    pub(crate) next_handle: u32,
    pub(crate) next_key: u32,
    pub(crate) pds: Vec<u32>,
    /// The registered memory regions by handle.
    pub mrs: HashMap<u32, FakeMr>,
    pub(crate) cqs: HashMap<u32, FakeCq>,
    pub(crate) qps: HashMap<u32, FakeQp>,
    /// Address handles by handle: their PD and `ah_num`.
    pub(crate) ahs: HashMap<u32, (u32, u32)>,
    /// `VRDMA_F_UD_STAGED_SQ` was negotiated: UD WQEs name AHs by handle and are checked
    /// as the device checks staged WQEs (the fake reads them where the driver wrote them).
    pub(crate) ud_staged: bool,
    /// The allocated memory windows by handle.
    pub mws: HashMap<u32, FakeMw>,
    /// Describe the receive queues of new QPs as staging rings (spec §9.7). The fake "kernel"
    /// reads them where the driver writes them either way; the flag tells the driver to ring
    /// after receives, which tests count.
    pub stage_receive_queues: bool,
    pub(crate) doorbell: Option<u64>,
    pub(crate) doorbell_head: u32,
    pub(crate) region_pages: Vec<bool>,
    /// The port's `gid_tbl_len` (QUERY_PORT) and its populated GID entries by index, which
    /// QUERY_GID and QUERY_GID_TABLE answer from. Tests change them (and post GID_CHANGE).
    pub gid_tbl_len: u32,
    /// See [`Self::gid_tbl_len`]; every entry is valid.
    pub gids: BTreeMap<u32, GidEntry>,
}

// SAFETY: the raw pointers are into the region and guest RAM, both owned by the transport that
// owns this device; every access happens under the device mutex or atomically.
unsafe impl Send for FakeDevice {}

pub(crate) type Answer = Result<ResponseBody, Status>;

impl FakeDevice {
    pub(crate) fn new(ram: Arc<MemfdRam>) -> FakeDevice {
        FakeDevice {
            ram,
            log: Vec::new(),
            fault: None,
            next_handle: 0x10,
            next_key: 0x1000,
            pds: Vec::new(),
            mrs: HashMap::new(),
            cqs: HashMap::new(),
            qps: HashMap::new(),
            ahs: HashMap::new(),
            ud_staged: false,
            mws: HashMap::new(),
            stage_receive_queues: false,
            doorbell: None,
            doorbell_head: 0,
            region_pages: vec![false; SHM_SIZE / PAGE_SIZE],
            gid_tbl_len: port_attr().gid_tbl_len.get(),
            gids: BTreeMap::from([(0, GidEntry::valid(LOCAL_GID, GidType::RoceV2))]),
        }
    }

    /// Sets GID `index` of the port (`None`: empties it), as the host's table changes when an
    /// address is added to or removed from its interface.
    pub fn set_gid(&mut self, index: u32, entry: Option<GidEntry>) {
        match entry {
            Some(entry) => self.gids.insert(index, entry),
            None => self.gids.remove(&index),
        };
    }

    /// The QUERY_GID_TABLE answer from `first` on, with the backend's batching rules.
    fn gid_table(&self, first: u32) -> Answer {
        if first >= self.gid_tbl_len {
            return Err(Status::Invalid);
        }
        let populated: Vec<_> = self.gids.range(first..self.gid_tbl_len).collect();
        let mut table = GidTableResp::new_zeroed();
        for (slot, (index, entry)) in table.entries.iter_mut().zip(&populated) {
            *slot = GidTableEntry::new(**index, entry);
        }
        table.count = Le32::new(populated.len().min(GID_TABLE_BATCH) as u32);
        table.next_index = Le32::new(match populated.get(GID_TABLE_BATCH) {
            Some(_) => populated[GID_TABLE_BATCH - 1].0 + 1,
            None => GID_TABLE_END,
        });
        Ok(ResponseBody::QueryGidTable(table))
    }

    fn handle(&mut self) -> u32 {
        self.next_handle += 1;
        self.next_handle
    }

    /// The opcodes of [`FakeDevice::log`].
    pub fn ops(&self) -> Vec<Opcode> {
        self.log.iter().map(|(op, _)| *op).collect()
    }

    /// Whether the device holds no object and no queue buffer.
    pub fn is_empty(&self) -> bool {
        self.pds.is_empty()
            && self.mrs.is_empty()
            && self.cqs.is_empty()
            && self.qps.is_empty()
            && self.ahs.is_empty()
            && self.mws.is_empty()
            && self.region_pages.iter().all(|used| !used)
    }

    /// Executes one decoded command and encodes the response (applying the pending fault).
    pub(crate) fn execute(
        &mut self,
        raw: &[u8],
        req: &ControlRequest<'_>,
        region: &Region,
    ) -> Vec<u8> {
        let op = req.opcode();
        self.log.push((op, raw.to_vec()));
        let mut truncate = false;
        match self.fault {
            Some(Fault::Fail(o, e)) if o == op => {
                self.fault = None;
                return ControlResponse::Err(e).to_vec();
            }
            Some(Fault::Truncate(o)) if o == op => {
                self.fault = None;
                truncate = true;
            }
            _ => {}
        }
        let answer = self.answer(req, region);
        let mut bytes = match answer {
            Ok(body) => ControlResponse::Ok(body).to_vec(),
            Err(status) => ControlResponse::Err(StatusError::new(status)).to_vec(),
        };
        if truncate {
            bytes.pop();
        }
        bytes
    }

    /// REG_MR and REG_MR_EXTENTS, once the pages are listed.
    fn reg_mr(&mut self, req: &RegMrReq, pages: Vec<u64>) -> Answer {
        let pd = req.pd.get();
        if !self.pds.contains(&pd) {
            return Err(Status::BadHandle);
        }
        for &page in &pages {
            self.ram_range(page, PAGE_SIZE)?;
        }
        let handle = self.handle();
        self.next_key += 0x100;
        let (lkey, rkey) = (self.next_key, self.next_key + 1);
        self.mrs.insert(
            handle,
            FakeMr {
                pd,
                lkey,
                rkey,
                iova: req.iova.get(),
                len: req.length.get(),
                access: req.access.get(),
                pages,
            },
        );
        Ok(ResponseBody::RegMr(RegMrResp {
            mr: Le32::new(handle),
            lkey: Le32::new(lkey),
            rkey: Le32::new(rkey),
            reserved: Le32::ZERO,
        }))
    }

    fn answer(&mut self, req: &ControlRequest<'_>, region: &Region) -> Answer {
        use ControlRequest as R;
        match req {
            R::QueryDevice => Ok(ResponseBody::QueryDevice(device_attr())),
            R::QueryPort(r) => {
                check_port(r.port_num.get())?;
                let mut attr = port_attr();
                attr.gid_tbl_len = Le32::new(self.gid_tbl_len);
                Ok(ResponseBody::QueryPort(attr))
            }
            R::QueryGid(r) => {
                check_port(r.port_num.get())?;
                let index = r.index.get();
                if index >= self.gid_tbl_len {
                    return Err(Status::Invalid);
                }
                Ok(ResponseBody::QueryGid(
                    self.gids.get(&index).copied().unwrap_or(GidEntry::EMPTY),
                ))
            }
            R::QueryGidTable(r) => {
                check_port(r.port_num.get())?;
                self.gid_table(r.index.get())
            }
            R::QueryPkey(r) => {
                check_port(r.port_num.get())?;
                if r.index.get() != 0 {
                    return Err(Status::Invalid);
                }
                Ok(ResponseBody::QueryPkey(PkeyEntry {
                    pkey: Le16::new(0xffff),
                    reserved: [0; 6],
                }))
            }
            R::DiscardState => {
                self.pds.clear();
                self.mrs.clear();
                self.cqs.clear();
                self.qps.clear();
                self.ahs.clear();
                self.mws.clear();
                self.doorbell = None;
                self.region_pages.iter_mut().for_each(|page| *page = false);
                Ok(ResponseBody::Empty)
            }
            R::SetDoorbellArea(r) => {
                if r.slots.get() != DOORBELL_SLOTS {
                    return Err(Status::Invalid);
                }
                if !self.qps.is_empty() {
                    return Err(Status::Busy);
                }
                self.ram_range(r.gpa.get(), doorbell_area_bytes())?;
                self.doorbell = Some(r.gpa.get());
                Ok(ResponseBody::Empty)
            }
            R::AllocPd => {
                let pd = self.handle();
                self.pds.push(pd);
                Ok(ResponseBody::AllocPd(HandleResp {
                    handle: Le32::new(pd),
                    reserved: Le32::ZERO,
                }))
            }
            R::DeallocPd(r) => {
                let pd = r.handle.get();
                let pos = self
                    .pds
                    .iter()
                    .position(|p| *p == pd)
                    .ok_or(Status::BadHandle)?;
                let used = self.mrs.values().any(|m| m.pd == pd)
                    || self.qps.values().any(|q| q.pd == pd)
                    || self.ahs.values().any(|a| a.0 == pd)
                    || self.mws.values().any(|w| w.pd == pd);
                if used {
                    return Err(Status::Busy);
                }
                self.pds.remove(pos);
                Ok(ResponseBody::Empty)
            }
            R::RegMr(m) => self.reg_mr(&m.req, m.pages.iter().collect()),
            R::RegMrExtents(m) => {
                let page_size = m.page_size();
                let pages = m
                    .extents
                    .iter()
                    .flat_map(|(gpa, len)| (0..len / page_size).map(move |i| gpa + i * page_size))
                    .collect();
                self.reg_mr(&m.req, pages)
            }
            R::DeregMr(r) => {
                let mr = r.handle.get();
                if !self.mrs.contains_key(&mr) {
                    return Err(Status::BadHandle);
                }
                // rxe refuses to deregister an MR windows are bound to (EINVAL).
                let bound = self
                    .mws
                    .values()
                    .any(|w| w.binding.is_some_and(|b| b.mr == mr));
                if bound {
                    return Err(Status::DeviceError);
                }
                self.mrs.remove(&mr);
                Ok(ResponseBody::Empty)
            }
            R::AllocMw(r) => {
                let pd = r.pd.get();
                if !self.pds.contains(&pd) {
                    return Err(Status::BadHandle);
                }
                let mw_type = MwType::try_from(r.mw_type.get()).map_err(|_| Status::Invalid)?;
                let handle = self.handle();
                self.next_key += 0x100;
                let rkey = self.next_key | 0x80;
                self.mws.insert(
                    handle,
                    FakeMw {
                        pd,
                        mw_type,
                        rkey,
                        binding: None,
                    },
                );
                Ok(ResponseBody::AllocMw(AllocMwResp {
                    mw: Le32::new(handle),
                    rkey: Le32::new(rkey),
                }))
            }
            R::DeallocMw(r) => {
                self.mws.remove(&r.handle.get()).ok_or(Status::BadHandle)?;
                Ok(ResponseBody::Empty)
            }
            R::ReregMr(m) => self.rereg_mr(m),
            R::CreateCq(r) => {
                let cqe = r.cqe.get();
                if cqe > 4096 {
                    return Err(Status::Invalid);
                }
                let slots = num_slots_for(cqe).ok_or(Status::Invalid)?;
                let ring = self.create_ring(region, slots, size_of::<IbUverbsWc>())?;
                let handle = self.handle();
                self.cqs.insert(handle, FakeCq { ring, armed: false });
                Ok(ResponseBody::CreateCq(CreateCqResp {
                    cq: Le32::new(handle),
                    cqe: Le32::new(slots - 1),
                    ring: self.describe(&ring),
                }))
            }
            R::DestroyCq(r) => {
                let cq = r.handle.get();
                if self
                    .qps
                    .values()
                    .any(|q| q.send_cq == cq || q.recv_cq == cq)
                {
                    return Err(Status::Busy);
                }
                let cq = self.cqs.remove(&cq).ok_or(Status::BadHandle)?;
                self.destroy_ring(region, &cq.ring);
                Ok(ResponseBody::Empty)
            }
            R::ResizeCq(r) => self.resize_cq(r, region),
            R::ArmCq(r) => {
                let cq = self.cqs.get_mut(&r.cq.get()).ok_or(Status::BadHandle)?;
                cq.armed = true;
                Ok(ResponseBody::Empty)
            }
            R::CreateQp(r) => self.create_qp(r, region),
            R::ModifyQp(r) => {
                let qp = self.qps.get_mut(&r.qp.get()).ok_or(Status::BadHandle)?;
                let mask = QpAttrMask::from_bits_retain(r.attr_mask.get());
                let next = if mask.contains(QpAttrMask::STATE) {
                    QpState::try_from(r.attr.qp_state.get()).map_err(|_| Status::Invalid)?
                } else {
                    qp.state
                };
                let claimed = mask
                    .contains(QpAttrMask::CUR_STATE)
                    .then(|| QpState::try_from(r.attr.cur_qp_state.get()).ok())
                    .flatten();
                check_modify_qp(qp.qp_type, qp.state, mask, next, claimed)?;
                if mask.contains(QpAttrMask::DEST_QPN) {
                    qp.dest_qpn = r.attr.dest_qp_num.get();
                }
                qp.state = next;
                qp.attr = r.attr;
                Ok(ResponseBody::Empty)
            }
            R::QueryQp(r) => {
                let qp = self.qps.get(&r.qp.get()).ok_or(Status::BadHandle)?;
                let mut attr = qp.attr;
                attr.qp_state = Le32::new(qp.state as u32);
                attr.dest_qp_num = Le32::new(qp.dest_qpn);
                Ok(ResponseBody::QueryQp(QueryQpResp {
                    attr_mask: Le32::new((QpAttrMask::STATE | QpAttrMask::DEST_QPN).bits()),
                    reserved: Le32::ZERO,
                    attr,
                }))
            }
            R::DestroyQp(r) => {
                let qp = self.qps.remove(&r.handle.get()).ok_or(Status::BadHandle)?;
                self.destroy_ring(region, &qp.sq);
                self.destroy_ring(region, &qp.rq);
                Ok(ResponseBody::Empty)
            }
            R::CreateAh(r) => {
                let pd = r.pd.get();
                if !self.pds.contains(&pd) {
                    return Err(Status::BadHandle);
                }
                let handle = self.handle();
                let ah_num = self.ahs.len() as u32 + 1;
                self.ahs.insert(handle, (pd, ah_num));
                Ok(ResponseBody::CreateAh(CreateAhResp {
                    ah: Le32::new(handle),
                    ah_num: Le32::new(ah_num),
                    av: RxeAv {
                        port_num: r.ah_attr.port_num,
                        network_type: 2,
                        dmac: [2, 0, 0, 0, 0, 1],
                        dgid: r.ah_attr.dgid,
                        flow_label: r.ah_attr.flow_label,
                        sgid_index: r.ah_attr.sgid_index,
                        hop_limit: r.ah_attr.hop_limit,
                        traffic_class: r.ah_attr.traffic_class,
                        pad: 0,
                        sgid_addr: [0; 28],
                        dgid_addr: [0; 28],
                    },
                }))
            }
            R::DestroyAh(r) => {
                self.ahs.remove(&r.handle.get()).ok_or(Status::BadHandle)?;
                Ok(ResponseBody::Empty)
            }
            R::CreateSrq(_)
            | R::ModifySrq(_)
            | R::QuerySrq(_)
            | R::DestroySrq(_)
            | R::ResizeSrq(_)
            | R::Cm(_) => Err(Status::Unsupported),
        }
    }

    /// RESIZE_CQ as rxe's `rxe_queue_resize`: the pending CQEs move to slots 0.. of a new
    /// buffer whose consumer index is 0; the old buffer is unmapped.
    fn resize_cq(&mut self, r: &ResizeCqReq, region: &Region) -> Answer {
        let handle = r.cq.get();
        let old = self.cqs.get(&handle).ok_or(Status::BadHandle)?.ring;
        let cqe = r.cqe.get();
        if cqe > 4096 {
            return Err(Status::Invalid);
        }
        let producer = old.producer().load(Ordering::Acquire) & old.mask;
        let consumer = old.consumer().load(Ordering::Acquire) & old.mask;
        let pending = producer.wrapping_sub(consumer) & old.mask;
        if cqe < pending {
            return Err(Status::Invalid);
        }
        let slots = num_slots_for(cqe).ok_or(Status::Invalid)?;
        let new = self.create_ring(region, slots, size_of::<IbUverbsWc>())?;
        for i in 0..pending {
            // SAFETY: both slots lie in their mapped extents and hold at least a CQE; the
            // driver does not poll during the resize (spec RESIZE_CQ).
            unsafe {
                let cqe = old.slot(consumer + i).cast::<IbUverbsWc>().read();
                new.slot(i).cast::<IbUverbsWc>().write(cqe);
            }
        }
        new.producer().store(pending, Ordering::Release);
        self.destroy_ring(region, &old);
        self.cqs.get_mut(&handle).ok_or(Status::BadHandle)?.ring = new;
        Ok(ResponseBody::ResizeCq(ResizeCqResp {
            cqe: Le32::new(slots - 1),
            reserved: Le32::ZERO,
            ring: self.describe(&new),
        }))
    }

    fn create_qp(&mut self, r: &CreateQpReq, region: &Region) -> Answer {
        let qp_type = QpType::try_from(r.qp_type).map_err(|_| Status::Invalid)?;
        if self.doorbell.is_none() {
            return Err(Status::BadState);
        }
        let pd = r.pd.get();
        if !self.pds.contains(&pd)
            || !self.cqs.contains_key(&r.send_cq.get())
            || !self.cqs.contains_key(&r.recv_cq.get())
        {
            return Err(Status::BadHandle);
        }
        let (send_wr, recv_wr) = (r.max_send_wr.get(), r.max_recv_wr.get());
        let (send_sge, recv_sge) = (r.max_send_sge.get(), r.max_recv_sge.get());
        let inline = r.max_inline_data.get();
        if send_wr > MAX_QP_WR
            || recv_wr > MAX_QP_WR
            || send_sge > MAX_SGE
            || recv_sge > MAX_SGE
            || inline > MAX_INLINE
        {
            return Err(Status::Invalid);
        }
        let doorbell_index = (0..DOORBELL_SLOTS)
            .find(|i| self.qps.values().all(|q| q.doorbell_index != *i))
            .ok_or(Status::Quota)?;
        let sq_slots = num_slots_for(send_wr.max(1)).ok_or(Status::Invalid)?;
        let rq_slots = num_slots_for(recv_wr.max(1)).ok_or(Status::Invalid)?;
        let sq = self.create_ring(region, sq_slots, send_wqe_size(send_sge, inline))?;
        let rq = match self.create_ring(region, rq_slots, recv_wqe_size(recv_sge)) {
            Ok(rq) => rq,
            Err(e) => {
                self.destroy_ring(region, &sq);
                return Err(e);
            }
        };
        let handle = self.handle();
        let qpn = 0x100 + handle;
        self.qps.insert(
            handle,
            FakeQp {
                pd,
                qpn,
                qp_type,
                state: QpState::Reset,
                send_cq: r.send_cq.get(),
                recv_cq: r.recv_cq.get(),
                sq_sig_all: r.sq_sig_all != 0,
                doorbell_index,
                sq,
                rq,
                dest_qpn: 0,
                attr: QpAttr::default(),
            },
        );
        Ok(ResponseBody::CreateQp(CreateQpResp {
            qp: Le32::new(handle),
            qpn: Le32::new(qpn),
            max_send_wr: Le32::new(sq_slots - 1),
            max_recv_wr: Le32::new(rq_slots - 1),
            max_send_sge: Le32::new(send_sge),
            max_recv_sge: Le32::new(recv_sge),
            max_inline_data: Le32::new(inline),
            doorbell_index: Le32::new(doorbell_index),
            sq: self.describe(&sq),
            rq: {
                let mut desc = self.describe(&rq);
                if self.stage_receive_queues {
                    desc.flags = Le32::new(ring_flags::STAGED);
                }
                desc
            },
        }))
    }

    /// Places a ring of `slots` slots for entries of `entry` bytes, as rxe sizes it.
    fn create_ring(&mut self, region: &Region, slots: u32, entry: usize) -> Result<Ring, Status> {
        let log2 = entry.next_power_of_two().max(64).trailing_zeros();
        let len = 384 + ((slots as usize) << log2);
        let pages = len.div_ceil(PAGE_SIZE);
        let first = (0..=self.region_pages.len() - pages)
            .find(|&p| self.region_pages[p..p + pages].iter().all(|used| !used))
            .ok_or(Status::NoMemory)?;
        self.region_pages[first..first + pages].fill(true);
        let (offset, map_len) = (first * PAGE_SIZE, pages * PAGE_SIZE);
        let base = region.map(offset, map_len);
        let mask = if self.fault == Some(Fault::RingHeaderMismatch) {
            self.fault = None;
            slots * 2 - 1
        } else {
            slots - 1
        };
        // SAFETY: the header words lie at the start of the extent just mapped.
        unsafe {
            base.cast::<u32>().write(log2);
            base.cast::<u32>().add(1).write(mask);
        }
        Ok(Ring {
            offset,
            map_len,
            base,
            mask: slots - 1,
            log2,
        })
    }

    fn describe(&mut self, ring: &Ring) -> RingDesc {
        let mut desc = ring.desc();
        if self.fault == Some(Fault::RingOutsideRegion) {
            self.fault = None;
            desc.shm_offset = Le64::new(SHM_SIZE as u64);
        }
        desc
    }

    fn destroy_ring(&mut self, region: &Region, ring: &Ring) {
        region.unmap(ring.offset, ring.map_len);
        let first = ring.offset / PAGE_SIZE;
        self.region_pages[first..first + ring.map_len / PAGE_SIZE].fill(false);
    }

    /// Host address of `len` guest-physical bytes at `gpa`, if they are guest RAM.
    pub fn ram_range(&self, gpa: u64, len: usize) -> Result<*mut u8, Status> {
        let offset = gpa.checked_sub(GUEST_RAM_BASE).ok_or(Status::BadAddress)? as usize;
        if offset + len > self.ram.len() {
            return Err(Status::BadAddress);
        }
        // SAFETY: inside the guest RAM mapping (checked).
        Ok(unsafe { self.ram.host_base().add(offset) })
    }
}

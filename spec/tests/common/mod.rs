//! Shared fixtures: one valid request and one valid response per opcode, and a
//! deterministic PRNG.
#![allow(dead_code)]

mod cm;
pub use cm::*;

use vrdma_spec::control::RegMrExtents;
use vrdma_spec::control::{rereg_flags, ReregMr};
use vrdma_spec::rxe_v1::RxeAv;
use vrdma_spec::verbs::{AccessFlags, QpAttrMask, QpType};
use vrdma_spec::wire::*;
use vrdma_spec::{ControlRequest, Le16, Le32, Le64, Opcode, RegMr, ResponseBody};
use zerocopy::FromZeros;

/// SplitMix64: tiny, deterministic, good enough to drive mutation tests.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.next_u64() as u8;
        }
    }
}

pub fn ah_attr() -> AhAttr {
    let mut a = AhAttr::new_zeroed();
    a.dgid = [
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55,
    ];
    a.flow_label = Le32::new(0x12345);
    a.sgid_index = 1;
    a.hop_limit = 64;
    a.traffic_class = 0x10;
    a.sl = 3;
    a.static_rate = 0;
    a.is_global = 1;
    a.port_num = 1;
    a
}

pub fn h(v: u32) -> HandleReq {
    HandleReq {
        handle: Le32::new(v),
        reserved: Le32::ZERO,
    }
}

/// Page-list bytes for a REG_MR of 3 pages of 4 KiB.
pub fn page_list() -> Vec<u8> {
    let mut v = Vec::new();
    vrdma_spec::control::encode_page_list([0x1000_0000u64, 0x2000_3000, 0x7fff_f000], &mut v);
    v
}

/// Extent-list bytes for the same 3 pages as REG_MR_EXTENTS: one page, then two.
pub fn extent_list() -> &'static [u8] {
    let mut v = Vec::new();
    vrdma_spec::control::encode_extent_list([(0x1000_0000u64, 4096), (0x2000_3000, 8192)], &mut v);
    Vec::leak(v)
}

pub fn reg_mr_req() -> RegMrReq {
    RegMrReq {
        pd: Le32::new(1),
        access: Le32::new(
            (AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ)
                .bits(),
        ),
        iova: Le64::new(0x7f00_0000_0100),
        // first page offset 0x100, 3 pages: 0x100 + len <= 3 * 4096, > 2 * 4096
        length: Le64::new(3 * 4096 - 0x100),
        page_shift: Le32::new(12),
        npages: Le32::new(3),
    }
}

/// A REREG_MR changing everything: the translation of [`reg_mr_req`] (3 pages of
/// [`page_list`]), PD 2, local write only.
pub fn rereg_mr_req() -> ReregMrReq {
    let t = reg_mr_req();
    ReregMrReq {
        mr: Le32::new(0x0100_0002),
        flags: Le32::new(rereg_flags::ALL),
        pd: Le32::new(2),
        access: Le32::new(AccessFlags::LOCAL_WRITE.bits()),
        iova: t.iova,
        length: t.length,
        page_shift: t.page_shift,
        npages: t.npages,
    }
}

pub fn modify_qp_req() -> ModifyQpReq {
    let mut a = QpAttr::new_zeroed();
    a.qp_state = Le32::new(2);
    a.path_mtu = Le32::new(3);
    a.dest_qp_num = Le32::new(0x11);
    a.rq_psn = Le32::new(0xabcdef);
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 12;
    a.ah_attr = ah_attr();
    ModifyQpReq {
        qp: Le32::new(7),
        attr_mask: Le32::new(
            (QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER)
                .bits(),
        ),
        attr: a,
    }
}

pub fn create_qp_req() -> CreateQpReq {
    CreateQpReq {
        pd: Le32::new(1),
        send_cq: Le32::new(2),
        recv_cq: Le32::new(3),
        srq: Le32::ZERO,
        max_send_wr: Le32::new(128),
        max_recv_wr: Le32::new(256),
        max_send_sge: Le32::new(4),
        max_recv_sge: Le32::new(2),
        max_inline_data: Le32::new(64),
        qp_type: QpType::Rc as u8,
        sq_sig_all: 0,
        reserved: Le16::ZERO,
    }
}

/// One valid request per opcode; `pages` must outlive the result.
pub fn all_requests(pages: &[u8]) -> Vec<ControlRequest<'_>> {
    vec![
        ControlRequest::QueryDevice,
        ControlRequest::DiscardState,
        ControlRequest::QueryPort(QueryPortReq {
            port_num: Le32::new(1),
            reserved: Le32::ZERO,
        }),
        ControlRequest::QueryGid(QueryTableReq {
            port_num: Le32::new(1),
            index: Le32::new(3),
        }),
        ControlRequest::QueryPkey(QueryTableReq {
            port_num: Le32::new(1),
            index: Le32::new(0),
        }),
        ControlRequest::QueryGidTable(QueryTableReq {
            port_num: Le32::new(1),
            index: Le32::new(6),
        }),
        ControlRequest::SetDoorbellArea(SetDoorbellAreaReq {
            gpa: Le64::new(0x4000_1000),
            slots: Le32::new(1024),
            reserved: Le32::ZERO,
        }),
        ControlRequest::AllocPd,
        ControlRequest::DeallocPd(h(1)),
        ControlRequest::RegMr(RegMr::new(reg_mr_req(), pages)),
        ControlRequest::DeregMr(h(0x0100_0002)),
        ControlRequest::ReregMr(ReregMr::new(rereg_mr_req(), pages)),
        ControlRequest::RegMrExtents(RegMrExtents::new(
            RegMrReq {
                npages: Le32::new(2),
                ..reg_mr_req()
            },
            extent_list(),
        )),
        ControlRequest::AllocMw(AllocMwReq {
            pd: Le32::new(1),
            mw_type: Le32::new(2),
        }),
        ControlRequest::DeallocMw(h(0x0100_0003)),
        ControlRequest::CreateCq(CreateCqReq {
            cqe: Le32::new(1023),
            reserved: Le32::ZERO,
        }),
        ControlRequest::DestroyCq(h(2)),
        ControlRequest::ArmCq(ArmCqReq {
            cq: Le32::new(2),
            flags: Le32::new(vrdma_spec::verbs::arm_flags::SOLICITED_ONLY),
        }),
        ControlRequest::ResizeCq(ResizeCqReq {
            cq: Le32::new(2),
            cqe: Le32::new(4095),
        }),
        ControlRequest::CreateQp(create_qp_req()),
        ControlRequest::ModifyQp(modify_qp_req()),
        ControlRequest::QueryQp(QueryQpReq {
            qp: Le32::new(7),
            attr_mask: Le32::new((QpAttrMask::STATE | QpAttrMask::CAP).bits()),
        }),
        ControlRequest::DestroyQp(h(7)),
        ControlRequest::CreateSrq(CreateSrqReq {
            pd: Le32::new(1),
            max_wr: Le32::new(512),
            max_sge: Le32::new(1),
            srq_limit: Le32::new(16),
        }),
        ControlRequest::ModifySrq(ModifySrqReq {
            srq: Le32::new(5),
            attr_mask: Le32::new(vrdma_spec::verbs::srq_attr::LIMIT),
            max_wr: Le32::ZERO,
            srq_limit: Le32::new(8),
        }),
        ControlRequest::QuerySrq(h(5)),
        ControlRequest::DestroySrq(h(5)),
        ControlRequest::ResizeSrq(ResizeSrqReq {
            srq: Le32::new(5),
            max_wr: Le32::new(63),
        }),
        ControlRequest::CreateAh(CreateAhReq {
            pd: Le32::new(1),
            reserved: Le32::ZERO,
            ah_attr: ah_attr(),
        }),
        ControlRequest::DestroyAh(h(9)),
    ]
    .into_iter()
    .chain(cm_requests())
    .collect()
}

fn ring(off: u64) -> RingDesc {
    RingDesc {
        shm_offset: Le64::new(off),
        map_len: Le32::new(0x3000),
        num_slots: Le32::new(64),
        log2_slot_size: Le32::new(7),
        format: Le32::new(1),
        db_offset: Le64::ZERO,
        db_len: Le32::ZERO,
        flags: Le32::ZERO,
    }
}

/// One valid success body per opcode.
pub fn body_for(op: Opcode) -> ResponseBody {
    match op {
        Opcode::QueryDevice => {
            let mut d = DeviceAttr::new_zeroed();
            d.fw_ver[..5].copy_from_slice(b"1.2.3");
            d.max_qp = Le32::new(64);
            d.max_mr_bytes = Le64::new(1 << 30);
            d.phys_port_cnt = 1;
            ResponseBody::QueryDevice(d)
        }
        Opcode::QueryPort => {
            let mut p = PortAttr::new_zeroed();
            p.state = Le32::new(4);
            p.active_mtu = Le32::new(3);
            p.gid_tbl_len = Le32::new(16);
            p.link_layer = 2;
            ResponseBody::QueryPort(p)
        }
        Opcode::QueryGid => ResponseBody::QueryGid(GidEntry {
            gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
            gid_type: Le32::new(2),
            flags: Le32::new(GID_FLAG_VALID),
        }),
        Opcode::QueryGidTable => {
            let mut t = GidTableResp::new_zeroed();
            t.count = Le32::new(1);
            t.next_index = Le32::new(GID_TABLE_END);
            t.entries[0] = GidTableEntry::new(
                3,
                &GidEntry::valid([0xfe; 16], vrdma_spec::verbs::GidType::RoceV2),
            );
            ResponseBody::QueryGidTable(t)
        }
        Opcode::QueryPkey => ResponseBody::QueryPkey(PkeyEntry {
            pkey: Le16::new(0xffff),
            reserved: [0; 6],
        }),
        Opcode::AllocMw => ResponseBody::AllocMw(AllocMwResp {
            mw: Le32::new(0x0100_0003),
            rkey: Le32::new(0x0000_1234),
        }),
        Opcode::AllocPd => ResponseBody::AllocPd(HandleResp {
            handle: Le32::new(0x0100_0001),
            reserved: Le32::ZERO,
        }),
        Opcode::RegMr | Opcode::RegMrExtents => ResponseBody::RegMr(RegMrResp {
            mr: Le32::new(3),
            lkey: Le32::new(0x1234),
            rkey: Le32::new(0x5678),
            reserved: Le32::ZERO,
        }),
        Opcode::ReregMr => ResponseBody::ReregMr(ReregMrResp {
            lkey: Le32::new(0x1334),
            rkey: Le32::new(0x5778),
        }),
        Opcode::CreateCq => ResponseBody::CreateCq(CreateCqResp {
            cq: Le32::new(2),
            cqe: Le32::new(63),
            ring: ring(0),
        }),
        Opcode::ResizeCq => ResponseBody::ResizeCq(ResizeCqResp {
            cqe: Le32::new(255),
            reserved: Le32::ZERO,
            ring: ring(0x9000),
        }),
        Opcode::CreateQp => ResponseBody::CreateQp(CreateQpResp {
            qp: Le32::new(7),
            qpn: Le32::new(0x11),
            max_send_wr: Le32::new(127),
            max_recv_wr: Le32::new(255),
            max_send_sge: Le32::new(4),
            max_recv_sge: Le32::new(2),
            max_inline_data: Le32::new(64),
            doorbell_index: Le32::new(7),
            sq: ring(0x3000),
            rq: ring(0x6000),
        }),
        Opcode::QueryQp => ResponseBody::QueryQp(QueryQpResp {
            attr_mask: Le32::new(QpAttrMask::STATE.bits()),
            reserved: Le32::ZERO,
            attr: modify_qp_req().attr,
        }),
        Opcode::CreateSrq => ResponseBody::CreateSrq(CreateSrqResp {
            srq: Le32::new(5),
            srq_num: Le32::new(9),
            max_wr: Le32::new(511),
            max_sge: Le32::new(1),
            ring: ring(0x9000),
        }),
        Opcode::ResizeSrq => ResponseBody::ResizeSrq(ResizeSrqResp {
            max_wr: Le32::new(63),
            reserved: Le32::ZERO,
            ring: ring(0xa000),
        }),
        Opcode::QuerySrq => ResponseBody::QuerySrq(QuerySrqResp {
            max_wr: Le32::new(511),
            max_sge: Le32::new(1),
            srq_limit: Le32::new(8),
            reserved: Le32::ZERO,
        }),
        Opcode::CreateAh => {
            let mut av = RxeAv::new_zeroed();
            av.port_num = 1;
            av.network_type = 2;
            ResponseBody::CreateAh(CreateAhResp {
                ah: Le32::new(9),
                ah_num: Le32::new(4),
                av,
            })
        }
        op => cm_body_for(op).unwrap_or(ResponseBody::Empty),
    }
}

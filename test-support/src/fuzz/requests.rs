//! Control requests built from fuzz input: every opcode, with bodies that are mostly plausible
//! (live handles, small counts, pages in guest RAM, valid QP transitions) and sometimes not.
//! Bodies are written at the offsets of the spec's wire layouts (`vrdma_spec::wire`).

use vrdma_spec::control::HEADER_SIZE;
use vrdma_spec::Opcode;

use super::bytes::ByteReader;
use crate::fake_host::device::PAGE;
use crate::fake_host::harness::{RAM_BASE, RAM_SIZE};

/// A request body under construction, written at wire offsets.
pub struct Body(Vec<u8>);

impl Body {
    fn new(len: usize) -> Self {
        Body(vec![0; len])
    }
    fn u8(&mut self, at: usize, v: u8) -> &mut Self {
        self.0[at] = v;
        self
    }
    fn u16(&mut self, at: usize, v: u16) -> &mut Self {
        self.0[at..at + 2].copy_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(&mut self, at: usize, v: u32) -> &mut Self {
        self.0[at..at + 4].copy_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, at: usize, v: u64) -> &mut Self {
        self.0[at..at + 8].copy_from_slice(&v.to_le_bytes());
        self
    }
}

/// The whole request: header and body.
pub fn request(op: Opcode, body: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0u8; HEADER_SIZE];
    bytes[..2].copy_from_slice(&(op as u16).to_le_bytes());
    bytes.extend_from_slice(body);
    bytes
}

/// A small count: mostly in the range devices accept, sometimes at or past the limits.
pub fn count(r: &mut ByteReader<'_>) -> u32 {
    match r.below(8) {
        0..=4 => r.below(33),
        5 => r.pick(&[0, 64, 255, 256, 1 << 14, (1 << 14) + 1, 1 << 15]),
        6 => r.below(4096),
        _ => r.u32(),
    }
}

/// A guest-physical page address: mostly among the first pages of guest RAM (so that repeats
/// and neighbours are common), sometimes anywhere in RAM, just outside it, or anything.
pub fn page(r: &mut ByteReader<'_>) -> u64 {
    match r.below(40) {
        0..=31 => RAM_BASE + u64::from(r.below(32)) * PAGE,
        32..=35 => RAM_BASE + u64::from(r.below((RAM_SIZE / PAGE) as u32)) * PAGE,
        36..=37 => r.pick(&[
            0,
            RAM_BASE - PAGE,
            RAM_BASE + RAM_SIZE,
            RAM_BASE + RAM_SIZE - PAGE,
        ]),
        38 => r.u64() & !(PAGE - 1),
        _ => r.u64(),
    }
}

/// A page list: scattered, contiguous runs, or one page repeated; up to a little over the
/// 64-page limit of the fuzzed device.
pub fn page_list(r: &mut ByteReader<'_>) -> Vec<u64> {
    let n = match r.below(6) {
        0 => r.pick(&[0, 1, 2, 63, 64, 65]),
        _ => r.below(8) + 1,
    } as usize;
    match r.below(4) {
        0 => {
            let first = page(r);
            (0..n as u64)
                .map(|i| first.wrapping_add(i * PAGE))
                .collect()
        }
        1 => vec![page(r); n],
        _ => (0..n).map(|_| page(r)).collect(),
    }
}

/// The page-list bytes of `pages`, and the fixed fields REG_MR and REREG_MR share: access,
/// iova, length, page_shift, npages (usually matching the list).
fn translation(r: &mut ByteReader<'_>, pages: &[u64]) -> (u32, u64, u64, u32, u32) {
    // Mostly allowed flags with local write (which remote write and atomics need).
    let access = match r.below(8) {
        0 => r.u32(),
        1 => u32::from(r.u8()) & 0x3f,
        _ => (u32::from(r.u8()) & 0x1f) | 1,
    };
    let iova = match r.below(12) {
        0 => r.u64(),
        1 => u64::MAX - PAGE + 1,
        _ => u64::from(r.below(16)) * PAGE + u64::from(r.pick(&[0u32, 0, 0, 8, 0x800])),
    };
    let offset = iova % PAGE;
    let full = (pages.len() as u64 * PAGE).saturating_sub(offset);
    let length = match r.below(20) {
        0 => r.u64(),
        1 => full + 1,
        2 => 0,
        _ => full.saturating_sub(u64::from(r.below(PAGE as u32))).max(1),
    };
    let shift = if r.chance(90) {
        12
    } else {
        r.pick(&[0, 11, 13, 21, 63, 64, 255])
    };
    let npages = if r.chance(90) {
        pages.len() as u32
    } else {
        r.below(70)
    };
    (access, iova, length, shift, npages)
}

fn with_pages(mut body: Vec<u8>, pages: &[u64]) -> Vec<u8> {
    vrdma_spec::control::encode_page_list(pages.iter().copied(), &mut body);
    body
}

/// REG_MR on `pd`, or half of the time REG_MR_EXTENTS of the same pages (runs merged), now
/// and then with one extent broken.
pub fn reg_mr(r: &mut ByteReader<'_>, pd: u32) -> Vec<u8> {
    let pages = page_list(r);
    let (access, iova, length, shift, npages) = translation(r, &pages);
    let as_extents = r.chance(50);
    let (op, entries, list) = if as_extents {
        let mut extents: Vec<(u64, u64)> = Vec::new();
        for &page in &pages {
            match extents.last_mut() {
                Some((start, len)) if start.wrapping_add(*len) == page => *len += PAGE,
                _ => extents.push((page, PAGE)),
            }
        }
        if !extents.is_empty() && r.chance(10) {
            let i = r.below(extents.len() as u32) as usize;
            match r.below(4) {
                0 => extents[i].1 = 0,
                1 => extents[i].1 += 8,
                2 => extents[i].0 |= 8,
                _ => extents[i].1 = u64::MAX - PAGE + 1,
            }
        }
        // A count that matches the pages matches the extents instead.
        let count = if npages as usize == pages.len() {
            extents.len() as u32
        } else {
            npages
        };
        let mut list = Vec::new();
        vrdma_spec::control::encode_extent_list(extents, &mut list);
        (Opcode::RegMrExtents, count, list)
    } else {
        (Opcode::RegMr, npages, with_pages(Vec::new(), &pages))
    };
    let mut b = Body::new(32);
    b.u32(0, pd)
        .u32(4, access)
        .u64(8, iova)
        .u64(16, length)
        .u32(24, shift)
        .u32(28, entries);
    let mut body = b.0;
    body.extend_from_slice(&list);
    request(op, &body)
}

/// REREG_MR of `mr`, maybe onto `pd`.
pub fn rereg_mr(r: &mut ByteReader<'_>, mr: u32, pd: u32) -> Vec<u8> {
    let flags = if r.chance(90) {
        1 + r.below(7)
    } else {
        r.u32()
    };
    let pages = if flags & 1 != 0 || r.chance(10) {
        page_list(r)
    } else {
        Vec::new()
    };
    let (access, iova, length, shift, npages) = translation(r, &pages);
    // Usually only the fields the flags select are set, as the spec requires.
    let consistent = r.chance(90);
    let set = |bit: u32| !consistent || flags & bit != 0;
    let mut b = Body::new(40);
    b.u32(0, mr).u32(4, flags);
    if set(2) {
        b.u32(8, pd);
    }
    if set(4) {
        b.u32(12, access);
    }
    if set(1) {
        b.u64(16, iova)
            .u64(24, length)
            .u32(32, shift)
            .u32(36, npages);
    }
    request(Opcode::ReregMr, &with_pages(b.0, &pages))
}

/// A request whose body is one handle.
pub fn handle_request(op: Opcode, handle: u32) -> Vec<u8> {
    let mut b = Body::new(8);
    b.u32(0, handle);
    request(op, &b.0)
}

/// A request of two words (ALLOC_MW, ARM_CQ, RESIZE_CQ, QUERY_QP, QUERY_PORT and the table
/// queries).
pub fn two_words(op: Opcode, first: u32, second: u32) -> Vec<u8> {
    let mut b = Body::new(8);
    b.u32(0, first).u32(4, second);
    request(op, &b.0)
}

/// CREATE_QP on the given objects.
pub fn create_qp(r: &mut ByteReader<'_>, pd: u32, send_cq: u32, recv_cq: u32, srq: u32) -> Vec<u8> {
    let qp_type = match r.below(10) {
        0..=5 => 2, // RC
        6 => 3,     // UC
        7..=8 => 4, // UD
        _ => r.u8(),
    };
    let mut b = Body::new(40);
    b.u32(0, pd)
        .u32(4, send_cq)
        .u32(8, recv_cq)
        .u32(12, srq)
        .u32(16, count(r))
        .u32(20, if srq == 0 { count(r) } else { 0 })
        .u32(24, r.below(6))
        .u32(28, if srq == 0 { r.below(6) } else { 0 })
        .u32(32, r.pick(&[0, 0, 64, 256, 1024, 4096]))
        .u8(36, qp_type)
        .u8(37, if r.chance(90) { r.u8() & 1 } else { r.u8() });
    request(Opcode::CreateQp, &b.0)
}

/// Where requests may aim: destination GIDs (the host's, the guests' addresses, another
/// machine's) and the QP numbers the guests were given.
pub struct Aims {
    /// Destination GIDs worth aiming at.
    pub dgids: [[u8; 16]; 4],
    /// QP numbers of both guests' QPs.
    pub qpns: Vec<u32>,
}

/// An address vector (32 bytes at `at`): a destination among `aims` or anything, GID index,
/// port, hop limit and the rest mostly valid.
fn ah_attr(r: &mut ByteReader<'_>, b: &mut Body, at: usize, aims: &Aims) {
    let dgid = if r.chance(60) {
        r.pick(&aims.dgids)
    } else {
        let mut dgid = [0; 16];
        for byte in &mut dgid[10..] {
            *byte = r.u8();
        }
        dgid
    };
    for (i, &byte) in dgid.iter().enumerate() {
        b.u8(at + i, byte);
    }
    b.u32(at + 16, r.u32() & 0xfffff)
        .u8(at + 20, if r.chance(80) { 0 } else { r.below(20) as u8 })
        .u8(at + 21, r.u8())
        .u8(at + 22, r.u8())
        .u8(at + 23, r.below(17) as u8)
        .u16(at + 24, r.u16())
        .u8(at + 26, r.below(2) as u8)
        .u8(at + 27, r.below(20) as u8)
        .u8(at + 28, if r.chance(90) { 1 } else { r.u8() })
        .u8(at + 29, if r.chance(85) { 1 } else { r.u8() });
}

/// QP attribute mask bits that go with each transition (from `ibv_modify_qp(3)`), OR-ed with
/// a few random bits now and then.
fn qp_mask(r: &mut ByteReader<'_>, state: u32) -> u32 {
    const STATE: u32 = 1;
    let rc = r.chance(60);
    let typical = match (state, rc) {
        // INIT: pkey, port, and access (RC) or qkey (UD).
        (1, true) => STATE | 0x10 | 0x20 | 0x8,
        (1, false) => STATE | 0x10 | 0x20 | 0x40,
        // RTR: AV, path MTU, dest QPN, RQ PSN, max dest rd atomic, min RNR timer (RC).
        (2, true) => STATE | 0x80 | 0x100 | 0x10_0000 | 0x1000 | 0x2_0000 | 0x8000,
        // RTS: timeout, retry counts, SQ PSN, max rd atomic (RC); SQ PSN (UD).
        (3, true) => STATE | 0x200 | 0x400 | 0x800 | 0x1_0000 | 0x2000,
        (3, false) => STATE | 0x1_0000,
        _ => STATE,
    };
    let mut mask = match r.below(8) {
        0 => r.u32() & 0x3f_ffff,
        1 => typical & !(1 << r.below(21)),
        _ => typical,
    };
    if r.chance(10) {
        mask |= 1 << r.below(26);
    }
    if r.chance(5) {
        mask |= 0x4000; // alternate path
    }
    mask
}

/// MODIFY_QP of `qp`, usually to the next state of the RC/UD life cycle.
pub fn modify_qp(r: &mut ByteReader<'_>, qp: u32, aims: &Aims) -> Vec<u8> {
    let state = match r.below(10) {
        0..=6 => r.below(4) + 1, // INIT, RTR, RTS, SQD
        7 => r.pick(&[0, 5, 6]), // RESET, SQE, ERR
        _ => r.below(16),
    };
    let mut b = Body::new(152);
    b.u32(0, qp).u32(4, qp_mask(r, state));
    let a = 8;
    b.u32(a, state)
        .u32(a + 4, r.below(8))
        .u32(a + 8, r.below(7))
        .u32(a + 12, r.below(4))
        .u32(a + 16, r.u32())
        .u32(a + 20, r.u32() & 0xff_ffff)
        .u32(a + 24, r.u32() & 0xff_ffff)
        .u32(
            a + 28,
            match r.below(10) {
                0..=5 if !aims.qpns.is_empty() => r.pick(&aims.qpns),
                0..=7 => 0x100 + r.below(64),
                _ => r.u32(),
            },
        )
        .u32(a + 32, u32::from(r.u8()) & 0xf);
    for (i, v) in [16u32, 16, 2, 2, 64].into_iter().enumerate() {
        b.u32(a + 36 + 4 * i, if r.chance(80) { v } else { count(r) });
    }
    ah_attr(r, &mut b, a + 56, aims);
    ah_attr(r, &mut b, a + 88, aims);
    b.u16(a + 120, if r.chance(90) { 0 } else { r.u16() })
        .u16(a + 122, if r.chance(90) { 0 } else { r.u16() })
        .u8(a + 124, r.below(2) as u8)
        .u8(a + 126, r.below(20) as u8)
        .u8(a + 127, r.below(20) as u8)
        .u8(a + 128, r.below(32) as u8)
        .u8(a + 129, if r.chance(85) { 1 } else { r.u8() })
        .u8(a + 130, r.below(32) as u8)
        .u8(a + 131, r.below(8) as u8)
        .u8(a + 132, r.below(8) as u8)
        .u8(a + 133, if r.chance(85) { 1 } else { r.u8() })
        .u8(a + 134, r.below(32) as u8);
    if r.chance(3) {
        b.u8(a + 135, 1);
    }
    request(Opcode::ModifyQp, &b.0)
}

/// CREATE_SRQ on `pd`.
pub fn create_srq(r: &mut ByteReader<'_>, pd: u32) -> Vec<u8> {
    let mut b = Body::new(16);
    b.u32(0, pd)
        .u32(4, count(r))
        .u32(8, r.below(8))
        .u32(12, r.below(20));
    request(Opcode::CreateSrq, &b.0)
}

/// MODIFY_SRQ of `srq`.
pub fn modify_srq(r: &mut ByteReader<'_>, srq: u32) -> Vec<u8> {
    let mut b = Body::new(16);
    b.u32(0, srq)
        .u32(4, if r.chance(90) { r.below(4) } else { r.u32() })
        .u32(8, count(r))
        .u32(12, r.below(40));
    request(Opcode::ModifySrq, &b.0)
}

/// CREATE_AH on `pd`.
pub fn create_ah(r: &mut ByteReader<'_>, pd: u32, aims: &Aims) -> Vec<u8> {
    let mut b = Body::new(40);
    b.u32(0, pd);
    if r.chance(5) {
        b.u32(4, r.u32());
    }
    ah_attr(r, &mut b, 8, aims);
    request(Opcode::CreateAh, &b.0)
}

/// SET_DOORBELL_AREA at a page of guest RAM (usually) with `slots` slots (usually).
pub fn set_doorbell_area(r: &mut ByteReader<'_>, slots: u32) -> (Vec<u8>, u64) {
    let gpa = match r.below(6) {
        0 => page(r),
        1 => r.u64(),
        _ => RAM_BASE + u64::from(r.below(64)) * PAGE,
    };
    let slots = if r.chance(90) { slots } else { count(r) };
    let mut b = Body::new(16);
    b.u64(0, gpa).u32(8, slots);
    (request(Opcode::SetDoorbellArea, &b.0), gpa)
}

/// Any opcode with a body of random bytes.
pub fn raw(r: &mut ByteReader<'_>) -> Vec<u8> {
    let op = r.pick(&Opcode::ALL);
    let body = if r.chance(50) {
        let mut body = r.bytes(op.request_body_len());
        body.resize(op.request_body_len(), 0);
        body
    } else {
        r.bytes(600)
    };
    let mut bytes = request(op, &body);
    if r.chance(5) {
        // Flags or reserved header bits.
        bytes[2 + r.below(6) as usize] = r.u8() | 1;
    }
    bytes
}

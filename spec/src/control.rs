//! Control-queue commands: opcodes, request decoding/encoding, response
//! decoding/encoding.

use crate::config::exact;
use crate::error::DecodeError;
use crate::features;
use crate::status::{Status, StatusError};
use crate::verbs::{self, AccessFlags, Mtu, QpAttrMask, QpType};
use crate::wire::*;
use crate::{Le16, Le32};
use zerocopy::{FromBytes, IntoBytes};

/// Control opcodes (`le16` at offset 0 of the request header).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Opcode {
    /// Device attributes and per-guest limits.
    QueryDevice = 0x0001,
    /// Port attributes.
    QueryPort = 0x0002,
    /// One GID table entry.
    QueryGid = 0x0003,
    /// One P_Key table entry.
    QueryPkey = 0x0004,
    /// Register the driver's doorbell area.
    SetDoorbellArea = 0x0005,
    /// Discard every object of the guest (spec §11.1) before a reset.
    DiscardState = 0x0006,
    /// Allocate a protection domain.
    AllocPd = 0x0010,
    /// Free a protection domain.
    DeallocPd = 0x0011,
    /// Register guest pages as a memory region.
    RegMr = 0x0020,
    /// Deregister a memory region.
    DeregMr = 0x0021,
    /// Create a completion queue and map its buffer.
    CreateCq = 0x0030,
    /// Destroy a completion queue.
    DestroyCq = 0x0031,
    /// Request one completion event.
    ArmCq = 0x0032,
    /// Create a queue pair and map its buffers.
    CreateQp = 0x0040,
    /// Modify QP attributes / state.
    ModifyQp = 0x0041,
    /// Query QP attributes.
    QueryQp = 0x0042,
    /// Destroy a queue pair.
    DestroyQp = 0x0043,
    /// Create a shared receive queue and map its buffer.
    CreateSrq = 0x0050,
    /// Arm the SRQ limit (or resize: unsupported).
    ModifySrq = 0x0051,
    /// Query SRQ attributes.
    QuerySrq = 0x0052,
    /// Destroy a shared receive queue.
    DestroySrq = 0x0053,
    /// Create an address handle.
    CreateAh = 0x0060,
    /// Destroy an address handle.
    DestroyAh = 0x0061,
}

impl Opcode {
    /// Every opcode, in numeric order.
    pub const ALL: [Opcode; 23] = [
        Opcode::QueryDevice,
        Opcode::QueryPort,
        Opcode::QueryGid,
        Opcode::QueryPkey,
        Opcode::SetDoorbellArea,
        Opcode::DiscardState,
        Opcode::AllocPd,
        Opcode::DeallocPd,
        Opcode::RegMr,
        Opcode::DeregMr,
        Opcode::CreateCq,
        Opcode::DestroyCq,
        Opcode::ArmCq,
        Opcode::CreateQp,
        Opcode::ModifyQp,
        Opcode::QueryQp,
        Opcode::DestroyQp,
        Opcode::CreateSrq,
        Opcode::ModifySrq,
        Opcode::QuerySrq,
        Opcode::DestroySrq,
        Opcode::CreateAh,
        Opcode::DestroyAh,
    ];

    /// Size of the fixed request body (REG_MR: without its page list).
    pub const fn request_body_len(self) -> usize {
        use core::mem::size_of;
        match self {
            Opcode::QueryDevice | Opcode::AllocPd | Opcode::DiscardState => 0,
            Opcode::QueryPort => size_of::<QueryPortReq>(),
            Opcode::QueryGid | Opcode::QueryPkey => size_of::<QueryTableReq>(),
            Opcode::SetDoorbellArea => size_of::<SetDoorbellAreaReq>(),
            Opcode::RegMr => size_of::<RegMrReq>(),
            Opcode::CreateCq => size_of::<CreateCqReq>(),
            Opcode::ArmCq => size_of::<ArmCqReq>(),
            Opcode::CreateQp => size_of::<CreateQpReq>(),
            Opcode::ModifyQp => size_of::<ModifyQpReq>(),
            Opcode::QueryQp => size_of::<QueryQpReq>(),
            Opcode::CreateSrq => size_of::<CreateSrqReq>(),
            Opcode::ModifySrq => size_of::<ModifySrqReq>(),
            Opcode::CreateAh => size_of::<CreateAhReq>(),
            Opcode::DeallocPd
            | Opcode::DeregMr
            | Opcode::DestroyCq
            | Opcode::DestroyQp
            | Opcode::QuerySrq
            | Opcode::DestroySrq
            | Opcode::DestroyAh => size_of::<HandleReq>(),
        }
    }

    /// Size of the response body on success (the header's 8 bytes not included).
    pub const fn response_body_len(self) -> usize {
        use core::mem::size_of;
        match self {
            Opcode::QueryDevice => size_of::<DeviceAttr>(),
            Opcode::QueryPort => size_of::<PortAttr>(),
            Opcode::QueryGid => size_of::<GidEntry>(),
            Opcode::QueryPkey => size_of::<PkeyEntry>(),
            Opcode::AllocPd => size_of::<HandleResp>(),
            Opcode::RegMr => size_of::<RegMrResp>(),
            Opcode::CreateCq => size_of::<CreateCqResp>(),
            Opcode::CreateQp => size_of::<CreateQpResp>(),
            Opcode::QueryQp => size_of::<QueryQpResp>(),
            Opcode::CreateSrq => size_of::<CreateSrqResp>(),
            Opcode::QuerySrq => size_of::<QuerySrqResp>(),
            Opcode::CreateAh => size_of::<CreateAhResp>(),
            Opcode::SetDoorbellArea
            | Opcode::DiscardState
            | Opcode::DeallocPd
            | Opcode::DeregMr
            | Opcode::DestroyCq
            | Opcode::ArmCq
            | Opcode::ModifyQp
            | Opcode::DestroyQp
            | Opcode::ModifySrq
            | Opcode::DestroySrq
            | Opcode::DestroyAh => 0,
        }
    }

    /// Feature bit the command needs, if any (without it the device answers UNSUPPORTED).
    pub const fn required_feature(self) -> Option<u64> {
        match self {
            Opcode::CreateSrq | Opcode::ModifySrq | Opcode::QuerySrq | Opcode::DestroySrq => {
                Some(features::VRDMA_F_SRQ)
            }
            Opcode::CreateAh | Opcode::DestroyAh => Some(features::VRDMA_F_UD),
            _ => None,
        }
    }
}

impl TryFrom<u16> for Opcode {
    type Error = DecodeError;
    fn try_from(v: u16) -> Result<Self, DecodeError> {
        Opcode::ALL
            .iter()
            .copied()
            .find(|o| *o as u16 == v)
            .ok_or(DecodeError::UnknownOpcode(v))
    }
}

/// Size of a request/response header.
pub const HEADER_SIZE: usize = 8;
/// Smallest `page_shift` of REG_MR (4 KiB).
pub const MIN_PAGE_SHIFT: u32 = 12;
/// Largest `page_shift` of REG_MR (1 GiB).
pub const MAX_PAGE_SHIFT: u32 = 30;
/// Largest response of this version: header + QUERY_DEVICE body.
pub const MAX_RESPONSE_SIZE: usize = HEADER_SIZE + core::mem::size_of::<DeviceAttr>();

/// The page list of a REG_MR request, borrowed from the request bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageList<'a> {
    bytes: &'a [u8],
}

impl<'a> PageList<'a> {
    /// Wraps raw little-endian page addresses (length must be a multiple of 8).
    fn new(bytes: &'a [u8]) -> Self {
        debug_assert!(bytes.len() & 7 == 0);
        PageList { bytes }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.bytes.len() / 8
    }

    /// True if there are no entries (never the case for a decoded request).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Entry `i`.
    pub fn get(&self, i: usize) -> Option<u64> {
        let start = i.checked_mul(8)?;
        let chunk = self.bytes.get(start..start.checked_add(8)?)?;
        let mut b = [0u8; 8];
        b.copy_from_slice(chunk);
        Some(u64::from_le_bytes(b))
    }

    /// Iterates over the guest-physical page addresses.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = u64> + 'a {
        self.bytes.chunks_exact(8).map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            u64::from_le_bytes(b)
        })
    }

    /// The raw little-endian bytes.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }
}

/// A decoded REG_MR request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegMr<'a> {
    /// Fixed part.
    pub req: RegMrReq,
    /// `npages` page addresses, each aligned to `1 << page_shift`.
    pub pages: PageList<'a>,
}

impl RegMr<'_> {
    /// Page size in bytes.
    pub fn page_size(&self) -> u64 {
        1u64 << self.req.page_shift.get()
    }

    /// Offset of the first byte of the region inside the first page.
    pub fn first_page_offset(&self) -> u64 {
        self.req.iova.get() & (self.page_size() - 1)
    }
}

/// A decoded, structurally valid control request.
///
/// Decoding checks everything that can be checked without device state (see the
/// README's per-command "validation" lists); handles, quotas, guest addresses and
/// state transitions are the device's to check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlRequest<'a> {
    /// QUERY_DEVICE.
    QueryDevice,
    /// QUERY_PORT.
    QueryPort(QueryPortReq),
    /// QUERY_GID.
    QueryGid(QueryTableReq),
    /// QUERY_PKEY.
    QueryPkey(QueryTableReq),
    /// SET_DOORBELL_AREA.
    SetDoorbellArea(SetDoorbellAreaReq),
    /// DISCARD_STATE.
    DiscardState,
    /// ALLOC_PD.
    AllocPd,
    /// DEALLOC_PD.
    DeallocPd(HandleReq),
    /// REG_MR with its page list.
    RegMr(RegMr<'a>),
    /// DEREG_MR.
    DeregMr(HandleReq),
    /// CREATE_CQ.
    CreateCq(CreateCqReq),
    /// DESTROY_CQ.
    DestroyCq(HandleReq),
    /// ARM_CQ.
    ArmCq(ArmCqReq),
    /// CREATE_QP.
    CreateQp(CreateQpReq),
    /// MODIFY_QP.
    ModifyQp(ModifyQpReq),
    /// QUERY_QP.
    QueryQp(QueryQpReq),
    /// DESTROY_QP.
    DestroyQp(HandleReq),
    /// CREATE_SRQ.
    CreateSrq(CreateSrqReq),
    /// MODIFY_SRQ.
    ModifySrq(ModifySrqReq),
    /// QUERY_SRQ.
    QuerySrq(HandleReq),
    /// DESTROY_SRQ.
    DestroySrq(HandleReq),
    /// CREATE_AH.
    CreateAh(CreateAhReq),
    /// DESTROY_AH.
    DestroyAh(HandleReq),
}

fn take_body<
    T: FromBytes + zerocopy::KnownLayout + zerocopy::Immutable + zerocopy::Unaligned + Copy,
>(
    body: &[u8],
) -> Result<T, DecodeError> {
    exact::<T>(body).map_err(|e| match e {
        DecodeError::Short { needed, got } => DecodeError::Short {
            needed: needed + HEADER_SIZE,
            got: got + HEADER_SIZE,
        },
        DecodeError::Trailing { expected, got } => DecodeError::Trailing {
            expected: expected + HEADER_SIZE,
            got: got + HEADER_SIZE,
        },
        e => e,
    })
}

fn zero(v: u64, field: &'static str) -> Result<(), DecodeError> {
    if v == 0 {
        Ok(())
    } else {
        Err(DecodeError::Reserved(field))
    }
}

fn range(v: u64, lo: u64, hi: u64, field: &'static str) -> Result<(), DecodeError> {
    if (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(DecodeError::InvalidValue { field, value: v })
    }
}

fn handle_req(body: &[u8]) -> Result<HandleReq, DecodeError> {
    let r: HandleReq = take_body(body)?;
    zero(r.reserved.get().into(), "reserved")?;
    Ok(r)
}

fn table_req(body: &[u8]) -> Result<QueryTableReq, DecodeError> {
    let r: QueryTableReq = take_body(body)?;
    range(r.port_num.get().into(), 1, u8::MAX.into(), "port_num")?;
    Ok(r)
}

/// Validates an address vector (CREATE_AH, and MODIFY_QP with AV / ALT_PATH).
pub fn check_ah_attr(ah: &AhAttr) -> Result<(), DecodeError> {
    zero(ah.reserved.get().into(), "ah_attr.reserved")?;
    range(ah.is_global.into(), 0, 1, "ah_attr.is_global")?;
    range(
        ah.flow_label.get().into(),
        0,
        verbs::MAX_FLOW_LABEL.into(),
        "ah_attr.flow_label",
    )?;
    range(ah.sl.into(), 0, 15, "ah_attr.sl")?;
    range(
        ah.static_rate.into(),
        0,
        verbs::MAX_STATIC_RATE.into(),
        "ah_attr.static_rate",
    )?;
    range(ah.port_num.into(), 1, u8::MAX.into(), "ah_attr.port_num")?;
    Ok(())
}

/// Validates the fields of `attr` selected by `attr_mask` (MODIFY_QP).
pub fn check_qp_attr(attr_mask: u32, a: &QpAttr) -> Result<(), DecodeError> {
    let Some(mask) = QpAttrMask::from_bits(attr_mask) else {
        return Err(DecodeError::InvalidValue {
            field: "attr_mask",
            value: attr_mask.into(),
        });
    };
    zero(a.reserved0.into(), "attr.reserved0")?;
    zero(a.reserved1.get().into(), "attr.reserved1")?;
    zero(a.ah_attr.reserved.get().into(), "ah_attr.reserved")?;
    zero(a.alt_ah_attr.reserved.get().into(), "alt_ah_attr.reserved")?;
    let has = |bits: QpAttrMask| mask.contains(bits);
    if has(QpAttrMask::STATE) {
        range(a.qp_state.get().into(), 0, 6, "qp_state")?;
    }
    if has(QpAttrMask::CUR_STATE) {
        range(a.cur_qp_state.get().into(), 0, 6, "cur_qp_state")?;
    }
    if has(QpAttrMask::EN_SQD_ASYNC_NOTIFY) {
        range(a.en_sqd_async_notify.into(), 0, 1, "en_sqd_async_notify")?;
    }
    if has(QpAttrMask::ACCESS_FLAGS)
        && a.qp_access_flags.get() & !AccessFlags::QP_ALLOWED.bits() != 0
    {
        return Err(DecodeError::InvalidValue {
            field: "qp_access_flags",
            value: a.qp_access_flags.get().into(),
        });
    }
    if has(QpAttrMask::PORT) {
        range(a.port_num.into(), 1, u8::MAX.into(), "port_num")?;
    }
    if has(QpAttrMask::AV) {
        check_ah_attr(&a.ah_attr)?;
    }
    if has(QpAttrMask::PATH_MTU) {
        range(
            a.path_mtu.get().into(),
            (Mtu::Mtu256 as u32).into(),
            (Mtu::Mtu4096 as u32).into(),
            "path_mtu",
        )?;
    }
    if has(QpAttrMask::TIMEOUT) {
        range(a.timeout.into(), 0, 31, "timeout")?;
    }
    if has(QpAttrMask::RETRY_CNT) {
        range(a.retry_cnt.into(), 0, 7, "retry_cnt")?;
    }
    if has(QpAttrMask::RNR_RETRY) {
        range(a.rnr_retry.into(), 0, 7, "rnr_retry")?;
    }
    if has(QpAttrMask::RQ_PSN) {
        range(a.rq_psn.get().into(), 0, verbs::MAX_PSN.into(), "rq_psn")?;
    }
    if has(QpAttrMask::SQ_PSN) {
        range(a.sq_psn.get().into(), 0, verbs::MAX_PSN.into(), "sq_psn")?;
    }
    if has(QpAttrMask::ALT_PATH) {
        check_ah_attr(&a.alt_ah_attr)?;
        range(a.alt_port_num.into(), 1, u8::MAX.into(), "alt_port_num")?;
        range(a.alt_timeout.into(), 0, 31, "alt_timeout")?;
    }
    if has(QpAttrMask::MIN_RNR_TIMER) {
        range(a.min_rnr_timer.into(), 0, 31, "min_rnr_timer")?;
    }
    if has(QpAttrMask::PATH_MIG_STATE) {
        range(a.path_mig_state.get().into(), 0, 2, "path_mig_state")?;
    }
    if has(QpAttrMask::DEST_QPN) {
        range(
            a.dest_qp_num.get().into(),
            0,
            verbs::MAX_PSN.into(),
            "dest_qp_num",
        )?;
    }
    Ok(())
}

/// Validates the fixed part of REG_MR; returns the number of pages it needs.
///
/// Useful on its own to a device that streams a large page list from the descriptor
/// chain instead of collecting it.
pub fn check_reg_mr(r: &RegMrReq) -> Result<u64, DecodeError> {
    let acc = r.access.get();
    let Some(flags) = AccessFlags::from_bits(acc) else {
        return Err(DecodeError::InvalidValue {
            field: "access",
            value: acc.into(),
        });
    };
    if flags.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
        && !flags.contains(AccessFlags::LOCAL_WRITE)
    {
        return Err(DecodeError::InvalidValue {
            field: "access",
            value: acc.into(),
        });
    }
    let shift = r.page_shift.get();
    if !(MIN_PAGE_SHIFT..=MAX_PAGE_SHIFT).contains(&shift) {
        return Err(DecodeError::PageShift(shift));
    }
    let length = r.length.get();
    if length == 0 {
        return Err(DecodeError::InvalidValue {
            field: "length",
            value: 0,
        });
    }
    let iova = r.iova.get();
    iova.checked_add(length)
        .ok_or(DecodeError::Overflow("iova + length"))?;
    let page_size = 1u64 << shift;
    let span = (iova & (page_size - 1))
        .checked_add(length)
        .ok_or(DecodeError::Overflow("iova offset + length"))?;
    let expected = span.div_ceil(page_size);
    if expected != u64::from(r.npages.get()) {
        return Err(DecodeError::PageCount {
            expected,
            got: r.npages.get(),
        });
    }
    Ok(expected)
}

/// Validates one page-list entry against the page size.
pub fn check_page_address(addr: u64, page_shift: u32) -> Result<(), DecodeError> {
    let page_size = 1u64 << page_shift.min(63);
    if addr & (page_size - 1) != 0 {
        return Err(DecodeError::Misaligned {
            field: "page",
            value: addr,
        });
    }
    addr.checked_add(page_size)
        .ok_or(DecodeError::Overflow("page address + page size"))?;
    Ok(())
}

impl<'a> ControlRequest<'a> {
    /// Decodes the whole device-readable part of a control chain.
    pub fn decode(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let (hdr, body) =
            RequestHeader::read_from_prefix(bytes).map_err(|_| DecodeError::Short {
                needed: HEADER_SIZE,
                got: bytes.len(),
            })?;
        let op = Opcode::try_from(hdr.opcode.get())?;
        zero(hdr.flags.get().into(), "flags")?;
        zero(hdr.reserved.get().into(), "reserved")?;
        let empty = |body: &[u8]| {
            if body.is_empty() {
                Ok(())
            } else {
                Err(DecodeError::Trailing {
                    expected: HEADER_SIZE,
                    got: HEADER_SIZE + body.len(),
                })
            }
        };
        Ok(match op {
            Opcode::QueryDevice => {
                empty(body)?;
                ControlRequest::QueryDevice
            }
            Opcode::AllocPd => {
                empty(body)?;
                ControlRequest::AllocPd
            }
            Opcode::DiscardState => {
                empty(body)?;
                ControlRequest::DiscardState
            }
            Opcode::QueryPort => {
                let r: QueryPortReq = take_body(body)?;
                range(r.port_num.get().into(), 1, u8::MAX.into(), "port_num")?;
                zero(r.reserved.get().into(), "reserved")?;
                ControlRequest::QueryPort(r)
            }
            Opcode::QueryGid => ControlRequest::QueryGid(table_req(body)?),
            Opcode::QueryPkey => ControlRequest::QueryPkey(table_req(body)?),
            Opcode::SetDoorbellArea => {
                let r: SetDoorbellAreaReq = take_body(body)?;
                zero(r.reserved.get().into(), "reserved")?;
                if !r.gpa.get().is_multiple_of(4096) {
                    return Err(DecodeError::Misaligned {
                        field: "gpa",
                        value: r.gpa.get(),
                    });
                }
                let slots = r.slots.get();
                if !slots.is_power_of_two() || slots > crate::doorbell::MAX_SLOTS {
                    return Err(DecodeError::InvalidValue {
                        field: "slots",
                        value: slots.into(),
                    });
                }
                ControlRequest::SetDoorbellArea(r)
            }
            Opcode::DeallocPd => ControlRequest::DeallocPd(handle_req(body)?),
            Opcode::DeregMr => ControlRequest::DeregMr(handle_req(body)?),
            Opcode::DestroyCq => ControlRequest::DestroyCq(handle_req(body)?),
            Opcode::DestroyQp => ControlRequest::DestroyQp(handle_req(body)?),
            Opcode::QuerySrq => ControlRequest::QuerySrq(handle_req(body)?),
            Opcode::DestroySrq => ControlRequest::DestroySrq(handle_req(body)?),
            Opcode::DestroyAh => ControlRequest::DestroyAh(handle_req(body)?),
            Opcode::RegMr => {
                let fixed = core::mem::size_of::<RegMrReq>();
                let (req, list) =
                    RegMrReq::read_from_prefix(body).map_err(|_| DecodeError::Short {
                        needed: HEADER_SIZE + fixed,
                        got: bytes.len(),
                    })?;
                let npages = check_reg_mr(&req)?;
                // npages <= u32::MAX, so this cannot overflow on 64-bit; checked anyway.
                let list_len = usize::try_from(npages)
                    .ok()
                    .and_then(|n| n.checked_mul(8))
                    .ok_or(DecodeError::Overflow("npages * 8"))?;
                let total = HEADER_SIZE + fixed + list_len;
                match list.len().cmp(&list_len) {
                    core::cmp::Ordering::Less => {
                        return Err(DecodeError::Short {
                            needed: total,
                            got: bytes.len(),
                        })
                    }
                    core::cmp::Ordering::Greater => {
                        return Err(DecodeError::Trailing {
                            expected: total,
                            got: bytes.len(),
                        })
                    }
                    core::cmp::Ordering::Equal => {}
                }
                let pages = PageList::new(list);
                let shift = req.page_shift.get();
                for addr in pages.iter() {
                    check_page_address(addr, shift)?;
                }
                ControlRequest::RegMr(RegMr { req, pages })
            }
            Opcode::CreateCq => {
                let r: CreateCqReq = take_body(body)?;
                range(r.cqe.get().into(), 1, u32::MAX.into(), "cqe")?;
                zero(r.reserved.get().into(), "reserved")?;
                ControlRequest::CreateCq(r)
            }
            Opcode::ArmCq => {
                let r: ArmCqReq = take_body(body)?;
                if r.flags.get() & !verbs::arm_flags::SOLICITED_ONLY != 0 {
                    return Err(DecodeError::Reserved("flags"));
                }
                ControlRequest::ArmCq(r)
            }
            Opcode::CreateQp => {
                let r: CreateQpReq = take_body(body)?;
                QpType::try_from(r.qp_type).map_err(|v| DecodeError::InvalidValue {
                    field: "qp_type",
                    value: v.into(),
                })?;
                range(r.sq_sig_all.into(), 0, 1, "sq_sig_all")?;
                zero(r.reserved.get().into(), "reserved")?;
                if r.srq.get() != 0 {
                    zero(r.max_recv_wr.get().into(), "max_recv_wr")?;
                    zero(r.max_recv_sge.get().into(), "max_recv_sge")?;
                }
                ControlRequest::CreateQp(r)
            }
            Opcode::ModifyQp => {
                let r: ModifyQpReq = take_body(body)?;
                check_qp_attr(r.attr_mask.get(), &r.attr)?;
                ControlRequest::ModifyQp(r)
            }
            Opcode::QueryQp => {
                let r: QueryQpReq = take_body(body)?;
                if QpAttrMask::from_bits(r.attr_mask.get()).is_none() {
                    return Err(DecodeError::InvalidValue {
                        field: "attr_mask",
                        value: r.attr_mask.get().into(),
                    });
                }
                ControlRequest::QueryQp(r)
            }
            Opcode::CreateSrq => {
                let r: CreateSrqReq = take_body(body)?;
                range(r.max_wr.get().into(), 1, u32::MAX.into(), "max_wr")?;
                range(r.max_sge.get().into(), 1, u32::MAX.into(), "max_sge")?;
                ControlRequest::CreateSrq(r)
            }
            Opcode::ModifySrq => {
                let r: ModifySrqReq = take_body(body)?;
                let all = verbs::srq_attr::MAX_WR | verbs::srq_attr::LIMIT;
                let m = r.attr_mask.get();
                if m == 0 || m & !all != 0 {
                    return Err(DecodeError::InvalidValue {
                        field: "attr_mask",
                        value: m.into(),
                    });
                }
                ControlRequest::ModifySrq(r)
            }
            Opcode::CreateAh => {
                let r: CreateAhReq = take_body(body)?;
                zero(r.reserved.get().into(), "reserved")?;
                check_ah_attr(&r.ah_attr)?;
                ControlRequest::CreateAh(r)
            }
        })
    }

    /// The request's opcode.
    pub fn opcode(&self) -> Opcode {
        match self {
            ControlRequest::QueryDevice => Opcode::QueryDevice,
            ControlRequest::QueryPort(_) => Opcode::QueryPort,
            ControlRequest::QueryGid(_) => Opcode::QueryGid,
            ControlRequest::QueryPkey(_) => Opcode::QueryPkey,
            ControlRequest::SetDoorbellArea(_) => Opcode::SetDoorbellArea,
            ControlRequest::DiscardState => Opcode::DiscardState,
            ControlRequest::AllocPd => Opcode::AllocPd,
            ControlRequest::DeallocPd(_) => Opcode::DeallocPd,
            ControlRequest::RegMr(_) => Opcode::RegMr,
            ControlRequest::DeregMr(_) => Opcode::DeregMr,
            ControlRequest::CreateCq(_) => Opcode::CreateCq,
            ControlRequest::DestroyCq(_) => Opcode::DestroyCq,
            ControlRequest::ArmCq(_) => Opcode::ArmCq,
            ControlRequest::CreateQp(_) => Opcode::CreateQp,
            ControlRequest::ModifyQp(_) => Opcode::ModifyQp,
            ControlRequest::QueryQp(_) => Opcode::QueryQp,
            ControlRequest::DestroyQp(_) => Opcode::DestroyQp,
            ControlRequest::CreateSrq(_) => Opcode::CreateSrq,
            ControlRequest::ModifySrq(_) => Opcode::ModifySrq,
            ControlRequest::QuerySrq(_) => Opcode::QuerySrq,
            ControlRequest::DestroySrq(_) => Opcode::DestroySrq,
            ControlRequest::CreateAh(_) => Opcode::CreateAh,
            ControlRequest::DestroyAh(_) => Opcode::DestroyAh,
        }
    }

    /// Feature bits this particular request needs (a CREATE_QP may need SRQ and/or UD).
    pub fn required_features(&self) -> u64 {
        let mut f = self.opcode().required_feature().unwrap_or(0);
        if let ControlRequest::CreateQp(r) = self {
            if r.srq.get() != 0 {
                f |= features::VRDMA_F_SRQ;
            }
            if r.qp_type == QpType::Ud as u8 {
                f |= features::VRDMA_F_UD;
            }
        }
        f
    }

    /// Length of the encoded request.
    pub fn encoded_len(&self) -> usize {
        HEADER_SIZE
            + self.opcode().request_body_len()
            + match self {
                ControlRequest::RegMr(m) => m.pages.as_bytes().len(),
                _ => 0,
            }
    }

    /// Appends the encoded request (header, body, REG_MR page list) to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.reserve(self.encoded_len());
        let hdr = RequestHeader {
            opcode: Le16::new(self.opcode() as u16),
            flags: Le16::ZERO,
            reserved: Le32::ZERO,
        };
        out.extend_from_slice(hdr.as_bytes());
        match self {
            ControlRequest::QueryDevice
            | ControlRequest::AllocPd
            | ControlRequest::DiscardState => {}
            ControlRequest::QueryPort(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::QueryGid(r) | ControlRequest::QueryPkey(r) => {
                out.extend_from_slice(r.as_bytes())
            }
            ControlRequest::SetDoorbellArea(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::DeallocPd(r)
            | ControlRequest::DeregMr(r)
            | ControlRequest::DestroyCq(r)
            | ControlRequest::DestroyQp(r)
            | ControlRequest::QuerySrq(r)
            | ControlRequest::DestroySrq(r)
            | ControlRequest::DestroyAh(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::RegMr(m) => {
                out.extend_from_slice(m.req.as_bytes());
                out.extend_from_slice(m.pages.as_bytes());
            }
            ControlRequest::CreateCq(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::ArmCq(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::CreateQp(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::ModifyQp(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::QueryQp(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::CreateSrq(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::ModifySrq(r) => out.extend_from_slice(r.as_bytes()),
            ControlRequest::CreateAh(r) => out.extend_from_slice(r.as_bytes()),
        }
    }

    /// Encodes into a fresh vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.encoded_len());
        self.encode_into(&mut v);
        v
    }
}

/// Builds the page-list bytes of a REG_MR request from page addresses (driver side).
pub fn encode_page_list(pages: impl IntoIterator<Item = u64>, out: &mut Vec<u8>) {
    for p in pages {
        out.extend_from_slice(&p.to_le_bytes());
    }
}

impl<'a> RegMr<'a> {
    /// Builds a REG_MR request over page-list bytes produced by [`encode_page_list`].
    /// The result is not validated; [`ControlRequest::decode`] of its encoding is.
    pub fn new(req: RegMrReq, page_list_bytes: &'a [u8]) -> Self {
        let n = page_list_bytes.len() / 8 * 8;
        RegMr {
            req,
            pages: PageList::new(&page_list_bytes[..n]),
        }
    }
}

/// Body of a successful response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseBody {
    /// Commands whose success carries no body.
    Empty,
    /// QUERY_DEVICE.
    QueryDevice(DeviceAttr),
    /// QUERY_PORT.
    QueryPort(PortAttr),
    /// QUERY_GID.
    QueryGid(GidEntry),
    /// QUERY_PKEY.
    QueryPkey(PkeyEntry),
    /// ALLOC_PD.
    AllocPd(HandleResp),
    /// REG_MR.
    RegMr(RegMrResp),
    /// CREATE_CQ.
    CreateCq(CreateCqResp),
    /// CREATE_QP.
    CreateQp(CreateQpResp),
    /// QUERY_QP.
    QueryQp(QueryQpResp),
    /// CREATE_SRQ.
    CreateSrq(CreateSrqResp),
    /// QUERY_SRQ.
    QuerySrq(QuerySrqResp),
    /// CREATE_AH.
    CreateAh(CreateAhResp),
}

impl ResponseBody {
    /// The body bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            ResponseBody::Empty => &[],
            ResponseBody::QueryDevice(b) => b.as_bytes(),
            ResponseBody::QueryPort(b) => b.as_bytes(),
            ResponseBody::QueryGid(b) => b.as_bytes(),
            ResponseBody::QueryPkey(b) => b.as_bytes(),
            ResponseBody::AllocPd(b) => b.as_bytes(),
            ResponseBody::RegMr(b) => b.as_bytes(),
            ResponseBody::CreateCq(b) => b.as_bytes(),
            ResponseBody::CreateQp(b) => b.as_bytes(),
            ResponseBody::QueryQp(b) => b.as_bytes(),
            ResponseBody::CreateSrq(b) => b.as_bytes(),
            ResponseBody::QuerySrq(b) => b.as_bytes(),
            ResponseBody::CreateAh(b) => b.as_bytes(),
        }
    }

    /// True if this body is the one `op` returns on success.
    pub fn matches(&self, op: Opcode) -> bool {
        matches!(
            (self, op),
            (ResponseBody::QueryDevice(_), Opcode::QueryDevice)
                | (ResponseBody::QueryPort(_), Opcode::QueryPort)
                | (ResponseBody::QueryGid(_), Opcode::QueryGid)
                | (ResponseBody::QueryPkey(_), Opcode::QueryPkey)
                | (ResponseBody::AllocPd(_), Opcode::AllocPd)
                | (ResponseBody::RegMr(_), Opcode::RegMr)
                | (ResponseBody::CreateCq(_), Opcode::CreateCq)
                | (ResponseBody::CreateQp(_), Opcode::CreateQp)
                | (ResponseBody::QueryQp(_), Opcode::QueryQp)
                | (ResponseBody::CreateSrq(_), Opcode::CreateSrq)
                | (ResponseBody::QuerySrq(_), Opcode::QuerySrq)
                | (ResponseBody::CreateAh(_), Opcode::CreateAh)
        ) || (matches!(self, ResponseBody::Empty) && op.response_body_len() == 0)
    }

    fn decode(op: Opcode, b: &[u8]) -> Result<Self, DecodeError> {
        Ok(match op {
            Opcode::QueryDevice => ResponseBody::QueryDevice(take_body(b)?),
            Opcode::QueryPort => ResponseBody::QueryPort(take_body(b)?),
            Opcode::QueryGid => ResponseBody::QueryGid(take_body(b)?),
            Opcode::QueryPkey => ResponseBody::QueryPkey(take_body(b)?),
            Opcode::AllocPd => ResponseBody::AllocPd(take_body(b)?),
            Opcode::RegMr => ResponseBody::RegMr(take_body(b)?),
            Opcode::CreateCq => ResponseBody::CreateCq(take_body(b)?),
            Opcode::CreateQp => ResponseBody::CreateQp(take_body(b)?),
            Opcode::QueryQp => ResponseBody::QueryQp(take_body(b)?),
            Opcode::CreateSrq => ResponseBody::CreateSrq(take_body(b)?),
            Opcode::QuerySrq => ResponseBody::QuerySrq(take_body(b)?),
            Opcode::CreateAh => ResponseBody::CreateAh(take_body(b)?),
            _ => {
                if !b.is_empty() {
                    return Err(DecodeError::Trailing {
                        expected: HEADER_SIZE,
                        got: HEADER_SIZE + b.len(),
                    });
                }
                ResponseBody::Empty
            }
        })
    }
}

/// A control response: success with its body, or a failure status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlResponse {
    /// Status OK.
    Ok(ResponseBody),
    /// Any other status (header only).
    Err(StatusError),
}

impl ControlResponse {
    /// Decodes the bytes the device wrote (the used length) for a request with `op`.
    ///
    /// Success responses must be exactly header + body; failures exactly the header,
    /// with `detail` zero unless the status is DEVICE_ERROR. Reserved fields inside
    /// bodies are not checked (drivers ignore them for forward compatibility).
    pub fn decode(op: Opcode, bytes: &[u8]) -> Result<Self, DecodeError> {
        let (hdr, body) =
            ResponseHeader::read_from_prefix(bytes).map_err(|_| DecodeError::Short {
                needed: HEADER_SIZE,
                got: bytes.len(),
            })?;
        let status = Status::try_from(hdr.status.get()).map_err(DecodeError::UnknownStatus)?;
        if status == Status::Ok {
            if hdr.detail.get() != 0 {
                return Err(DecodeError::Reserved("detail"));
            }
            return Ok(ControlResponse::Ok(ResponseBody::decode(op, body)?));
        }
        if !body.is_empty() {
            return Err(DecodeError::Trailing {
                expected: HEADER_SIZE,
                got: bytes.len(),
            });
        }
        StatusError::from_wire(status, hdr.detail.get())
            .map(ControlResponse::Err)
            .ok_or(DecodeError::Reserved("detail"))
    }

    /// Length of the encoding.
    pub fn encoded_len(&self) -> usize {
        HEADER_SIZE
            + match self {
                ControlResponse::Ok(b) => b.as_bytes().len(),
                ControlResponse::Err(_) => 0,
            }
    }

    /// Appends the encoded response to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let (status, detail, body): (Status, u32, &[u8]) = match self {
            ControlResponse::Ok(b) => (Status::Ok, 0, b.as_bytes()),
            ControlResponse::Err(e) => (e.status(), e.detail(), &[]),
        };
        let hdr = ResponseHeader {
            status: Le32::new(status.to_u32()),
            detail: Le32::new(detail),
        };
        out.extend_from_slice(hdr.as_bytes());
        out.extend_from_slice(body);
    }

    /// Encodes into a fresh vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.encoded_len());
        self.encode_into(&mut v);
        v
    }

    /// Converts to a `Result` for `?`-style use on the driver side.
    pub fn into_result(self) -> Result<ResponseBody, StatusError> {
        match self {
            ControlResponse::Ok(b) => Ok(b),
            ControlResponse::Err(e) => Err(e),
        }
    }
}

impl From<StatusError> for ControlResponse {
    fn from(e: StatusError) -> Self {
        ControlResponse::Err(e)
    }
}

impl From<DecodeError> for ControlResponse {
    fn from(e: DecodeError) -> Self {
        ControlResponse::Err(StatusError::new(e.status()))
    }
}

//! The checks of one staged UD WQE (spec §9.6) and what replaces a refused one, on the
//! device's private copy; the address handles a guest may name.

use std::collections::HashMap;
use std::mem::{offset_of, size_of};
use std::sync::Arc;

use vrdma_spec::rxe_v1::{self, RxeSendWqe, RxeSendWr, RxeSge, RxeUdWr};
use vrdma_spec::verbs::{SendFlags, WrOpcode};
use vrdma_spec::{Le32, Le64};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use crate::identity::endpoints::{Destination, LocalEndpoints};
use crate::resources::table::Handle;

/// `ah_num` of a neutralised WQE: no rxe AH pool reaches it, so the kernel finds no address
/// vector and fails the WQE (`LOC_QP_OP_ERR`) if the QP is not already flushing.
pub const NEUTRALISED_AH_NUM: u32 = u32::MAX;

/// What the pump knows of one of the guest's address handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagedAh {
    /// The AH's PD (guest handle).
    pub pd: Handle,
    /// The host's `ah_num` for it.
    pub ah_num: u32,
    /// Its destination address. Where it leads (whose QPs a send through it may name) is
    /// decided for each send, not once: an address may become the host's own later (a tenant's
    /// address re-added, one the host gains).
    pub dgid: [u8; 16],
}

/// Whether packets to a GID stay on this host, by the host device's addresses now.
pub type IsLocal = Arc<dyn Fn(&[u8; 16]) -> bool + Send + Sync>;

/// Where the guest's staged sends may go: the daemon's table of tenant addresses and QP
/// numbers, and which destinations are this host's own.
#[derive(Clone)]
pub struct Reach {
    endpoints: Arc<LocalEndpoints>,
    is_local: IsLocal,
}

impl Reach {
    /// Sends checked against `endpoints`, `is_local` telling the host's own addresses.
    pub fn new(endpoints: Arc<LocalEndpoints>, is_local: IsLocal) -> Self {
        Reach {
            endpoints,
            is_local,
        }
    }

    /// A host none of whose addresses is anybody's destination, no tenants.
    pub fn nowhere_local() -> Self {
        Reach::new(LocalEndpoints::new(), Arc::new(|_| false))
    }

    /// The daemon's table.
    pub fn endpoints(&self) -> &Arc<LocalEndpoints> {
        &self.endpoints
    }

    /// Where `dgid` leads now.
    pub fn destination(&self, dgid: &[u8; 16]) -> Destination {
        self.endpoints.classify(dgid, (self.is_local)(dgid))
    }
}

/// Where the destinations of one pump pass lead, each classified once: all WQEs forwarded
/// together go by the host's addresses of that moment, and the pass pays one look at them
/// (a lock and a system call) per destination rather than per WQE. A few entries, reused
/// round robin: no allocation on the data path.
#[derive(Debug, Default)]
pub struct PassDestinations {
    seen: [Option<([u8; 16], Destination)>; 4],
    next: usize,
}

impl PassDestinations {
    /// Where `dgid` leads, by `reach`, classified at its first send of the pass.
    fn classify(&mut self, reach: &Reach, dgid: &[u8; 16]) -> Destination {
        let known = self.seen.iter().flatten().find(|(gid, _)| gid == dgid);
        if let Some(&(_, destination)) = known {
            return destination;
        }
        let destination = reach.destination(dgid);
        self.seen[self.next] = Some((*dgid, destination));
        self.next = (self.next + 1) % self.seen.len();
        destination
    }
}

impl std::fmt::Debug for Reach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reach")
            .field("endpoints", &self.endpoints)
            .finish_non_exhaustive()
    }
}

/// Why a staged WQE was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Not SEND or SEND_WITH_IMM.
    #[error("opcode {0} is not a UD opcode")]
    Opcode(u32),
    /// Undefined send flags.
    #[error("send flags {0:#x}")]
    Flags(u32),
    /// More SGEs than the QP's `max_send_sge`.
    #[error("{0} SGEs")]
    TooManySges(u32),
    /// Inline data longer than the QP's `max_inline_data`.
    #[error("{0} inline bytes")]
    InlineTooLong(u32),
    /// `dma.length`/`resid` do not describe the payload.
    #[error("payload length {0} does not match its SGEs")]
    Length(u32),
    /// `ah_num` names no AH of this guest in the QP's PD (0, a host `ah_num`, another
    /// guest's handle, a destroyed AH).
    #[error("AH handle {0:#x} is not an AH of the QP's PD")]
    AddressHandle(u32),
    /// The destination policy refused `remote_qpn`.
    #[error("destination QPN {0:#x} refused")]
    Destination(u32),
}

/// The checks of one staged WQE, applied to the private copy in `slot`, which becomes the WQE
/// the host receives: host-owned fields zeroed, `ah_num` translated, the embedded AV zeroed.
/// Returns the bytes of the slot in use (header and payload). `pass`: the destinations of the
/// pump pass this WQE is forwarded in.
pub fn check(
    slot: &mut [u8],
    pd: Handle,
    max_sge: u32,
    max_inline: u32,
    ahs: &StagedAhs,
    pass: &mut PassDestinations,
) -> Result<usize, Refusal> {
    let head = size_of::<RxeSendWqe>();
    let (wqe_bytes, payload) = slot.split_at_mut(head);
    let mut wqe = RxeSendWqe::read_from_bytes(wqe_bytes).expect("slot holds a WQE header");
    let opcode = wqe.wr.opcode.get();
    if opcode != WrOpcode::Send as u32 && opcode != WrOpcode::SendWithImm as u32 {
        return Err(Refusal::Opcode(opcode));
    }
    let flags = wqe.wr.send_flags.get();
    let Some(flags) = SendFlags::from_bits(flags) else {
        return Err(Refusal::Flags(flags));
    };
    let length = wqe.dma.length.get();
    if wqe.dma.resid.get() != length {
        return Err(Refusal::Length(length));
    }
    let used = if flags.contains(SendFlags::INLINE) {
        if length > max_inline || length as usize > payload.len() {
            return Err(Refusal::InlineTooLong(length));
        }
        head + length as usize
    } else {
        let num_sge = wqe.dma.num_sge.get();
        if num_sge > max_sge {
            return Err(Refusal::TooManySges(num_sge));
        }
        let sges = payload
            .get(..num_sge as usize * size_of::<RxeSge>())
            .ok_or(Refusal::TooManySges(num_sge))?;
        let total: u64 = <[RxeSge]>::ref_from_bytes(sges)
            .expect("SGEs are unaligned plain data")
            .iter()
            .map(|sge| u64::from(sge.length.get()))
            .sum();
        if total != u64::from(length) {
            return Err(Refusal::Length(length));
        }
        head + sges.len()
    };
    let ud = wqe.wr.wr.ud();
    let handle = ud.ah_num.get();
    let ah = ahs
        .get(handle)
        .filter(|ah| ah.pd == pd)
        .ok_or(Refusal::AddressHandle(handle))?;
    let destination = pass.classify(&ahs.reach, &ah.dgid);
    if !ahs.reach.endpoints.allows(destination, ud.remote_qpn.get()) {
        return Err(Refusal::Destination(ud.remote_qpn.get()));
    }
    wqe.wr.reserved = Le32::ZERO;
    wqe.wr.wr = rxe_v1::RxeSendWrUnion::from_ud(RxeUdWr {
        remote_qpn: ud.remote_qpn,
        remote_qkey: ud.remote_qkey,
        pkey_index: ud.pkey_index,
        reserved: Default::default(),
        ah_num: Le32::new(ah.ah_num),
        pad: [0; 16],
        av: FromZeros::new_zeroed(),
    });
    clear_host_fields(&mut wqe);
    wqe_bytes.copy_from_slice(wqe.as_bytes());
    Ok(used)
}

/// Bytes after the header that the WQE in `slot` says it uses: its inline data or its SGEs.
pub(super) fn payload_len(slot: &[u8]) -> usize {
    let Ok((wqe, _)) = RxeSendWqe::read_from_prefix(slot) else {
        return 0;
    };
    let operand = WrOpcode::try_from(wqe.wr.opcode.get()).map_or(0, WrOpcode::wqe_operand_len);
    if operand != 0 {
        // ATOMIC_WRITE: its 8 bytes, where SGEs would be (rxe's `dma.atomic_wr`).
        operand
    } else if wqe.wr.send_flags.get() & SendFlags::INLINE.bits() != 0 {
        wqe.dma.length.get() as usize
    } else {
        (wqe.dma.num_sge.get() as usize).saturating_mul(size_of::<RxeSge>())
    }
}

/// The fields the host owns once a WQE is posted, as a fresh WQE has them.
fn clear_host_fields(wqe: &mut RxeSendWqe) {
    wqe.status = Le32::ZERO;
    wqe.state = Le32::new(rxe_v1::WQE_STATE_POSTED);
    wqe.iova = Le64::ZERO;
    wqe.mask = Le32::ZERO;
    wqe.first_psn = Le32::ZERO;
    wqe.last_psn = Le32::ZERO;
    wqe.ack_length = Le32::ZERO;
    wqe.ssn = Le32::ZERO;
    wqe.has_rd_atomic = Le32::ZERO;
    wqe.dma.cur_sge = Le32::ZERO;
    wqe.dma.sge_offset = Le32::ZERO;
    wqe.dma.reserved = Le32::ZERO;
}

/// Replaces the WQE in `slot` by a signaled, payload-less SEND with the same `wr_id` through
/// [`NEUTRALISED_AH_NUM`]; returns its length.
pub fn neutralise(slot: &mut [u8]) -> usize {
    let head = size_of::<RxeSendWqe>();
    let wr_id =
        Le64::read_from_prefix(&slot[offset_of!(RxeSendWqe, wr) + offset_of!(RxeSendWr, wr_id)..])
            .map_or(Le64::ZERO, |(id, _)| id);
    let mut wqe = RxeSendWqe::new_zeroed();
    wqe.wr.wr_id = wr_id;
    wqe.wr.opcode = Le32::new(WrOpcode::Send as u32);
    wqe.wr.send_flags = Le32::new(SendFlags::SIGNALED.bits());
    wqe.wr.wr = rxe_v1::RxeSendWrUnion::from_ud(RxeUdWr {
        ah_num: Le32::new(NEUTRALISED_AH_NUM),
        ..FromZeros::new_zeroed()
    });
    wqe.state = Le32::new(rxe_v1::WQE_STATE_POSTED);
    slot[..head].copy_from_slice(wqe.as_bytes());
    head
}

/// The guest's address handles as the pump sees them, by raw AH handle, and where sends
/// through them may go.
#[derive(Debug)]
pub struct StagedAhs {
    by_handle: HashMap<u32, StagedAh>,
    reach: Reach,
}

impl StagedAhs {
    /// No address handles; sends reach local QPs as `reach` allows.
    pub fn new(reach: Reach) -> Self {
        StagedAhs {
            by_handle: HashMap::new(),
            reach,
        }
    }

    /// Where the sends may go.
    pub fn reach(&self) -> &Reach {
        &self.reach
    }

    /// Makes AH `handle` usable in staged WQEs.
    pub fn insert(&mut self, handle: Handle, ah: StagedAh) {
        self.by_handle.insert(handle.raw(), ah);
    }

    /// Stops AH `handle` from being usable; returns what it was.
    pub fn remove(&mut self, handle: Handle) -> Option<StagedAh> {
        self.by_handle.remove(&handle.raw())
    }

    /// The AH a staged WQE names by `raw` handle.
    pub fn get(&self, raw: u32) -> Option<&StagedAh> {
        self.by_handle.get(&raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PD: u32 = 0x0100_0001;
    const AH: u32 = 0x0100_0002;

    const REMOTE: [u8; 16] = [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

    fn ahs() -> StagedAhs {
        ahs_to(Reach::nowhere_local(), REMOTE)
    }

    /// AH handle `AH` of PD `PD`, host `ah_num` 42, aimed at `dgid`, its sends going as
    /// `reach` allows.
    fn ahs_to(reach: Reach, dgid: [u8; 16]) -> StagedAhs {
        let mut ahs = StagedAhs::new(reach);
        let ah = StagedAh {
            pd: Handle::from_raw(PD),
            ah_num: 42,
            dgid,
        };
        ahs.insert(Handle::from_raw(AH), ah);
        ahs
    }

    /// A slot of 512 bytes holding an inline UD SEND of `len` bytes, with host-owned junk.
    fn inline_slot(len: u32) -> Vec<u8> {
        let mut wqe = RxeSendWqe::new_zeroed();
        wqe.wr.wr_id = Le64::new(5);
        wqe.wr.reserved = Le32::new(7);
        wqe.wr.opcode = Le32::new(WrOpcode::SendWithImm as u32);
        wqe.wr.send_flags = Le32::new((SendFlags::INLINE | SendFlags::SIGNALED).bits());
        wqe.wr.wr = rxe_v1::RxeSendWrUnion::from_ud(RxeUdWr {
            remote_qpn: Le32::new(0x42),
            ah_num: Le32::new(AH),
            pad: [1; 16],
            ..FromZeros::new_zeroed()
        });
        wqe.status = Le32::new(3);
        wqe.first_psn = Le32::new(9);
        wqe.dma.length = Le32::new(len);
        wqe.dma.resid = Le32::new(len);
        wqe.dma.cur_sge = Le32::new(1);
        let mut slot = vec![0xee; 512];
        slot[..size_of::<RxeSendWqe>()].copy_from_slice(wqe.as_bytes());
        slot
    }

    #[test]
    fn the_payload_forwarded_is_the_sges_the_inline_bytes_or_an_atomic_write_operand() {
        let mut wqe = RxeSendWqe::new_zeroed();
        wqe.wr.opcode = Le32::new(WrOpcode::RdmaWrite as u32);
        wqe.dma.num_sge = Le32::new(3);
        wqe.dma.length = Le32::new(5000);
        assert_eq!(payload_len(wqe.as_bytes()), 3 * size_of::<RxeSge>());
        wqe.wr.send_flags = Le32::new(SendFlags::INLINE.bits());
        assert_eq!(payload_len(wqe.as_bytes()), 5000);
        // ATOMIC_WRITE carries 8 bytes where SGEs would be, whatever dma says.
        wqe.wr.opcode = Le32::new(WrOpcode::AtomicWrite as u32);
        assert_eq!(payload_len(wqe.as_bytes()), 8);
        assert_eq!(payload_len(&[0; 8]), 0, "a short slot holds no WQE");
    }

    #[test]
    fn a_checked_wqe_is_rewritten_for_the_host() {
        let mut slot = inline_slot(64);
        let used = check(
            &mut slot,
            Handle::from_raw(PD),
            1,
            64,
            &ahs(),
            &mut PassDestinations::default(),
        )
        .unwrap();
        assert_eq!(used, size_of::<RxeSendWqe>() + 64);
        let (wqe, _) = RxeSendWqe::read_from_prefix(&slot).unwrap();
        let ud = wqe.wr.wr.ud();
        assert_eq!((ud.ah_num.get(), ud.remote_qpn.get()), (42, 0x42));
        assert_eq!(ud.pad, [0; 16]);
        assert_eq!(wqe.wr.reserved.get(), 0);
        assert_eq!((wqe.status.get(), wqe.first_psn.get()), (0, 0));
        assert_eq!(wqe.dma.cur_sge.get(), 0);
        assert_eq!(wqe.wr.wr_id.get(), 5);
    }

    #[test]
    fn checks_refuse_what_the_qp_cannot_send() {
        let pd = Handle::from_raw(PD);
        let mut long = inline_slot(65);
        assert_eq!(
            check(
                &mut long,
                pd,
                1,
                64,
                &ahs(),
                &mut PassDestinations::default()
            ),
            Err(Refusal::InlineTooLong(65))
        );
        let mut other_pd = inline_slot(8);
        assert_eq!(
            check(
                &mut other_pd,
                Handle::from_raw(PD + 1),
                1,
                64,
                &ahs(),
                &mut PassDestinations::default()
            ),
            Err(Refusal::AddressHandle(AH))
        );
        let mut slot = inline_slot(8);
        let used = neutralise(&mut slot);
        let (wqe, _) = RxeSendWqe::read_from_prefix(&slot).unwrap();
        assert_eq!(used, size_of::<RxeSendWqe>());
        assert_eq!(wqe.wr.wr_id.get(), 5);
        assert_eq!(wqe.wr.wr.ud().ah_num.get(), NEUTRALISED_AH_NUM);
        assert_eq!((wqe.dma.length.get(), wqe.wr.ex), (0, [0; 4]));
    }

    #[test]
    fn a_send_through_a_tenants_address_reaches_only_that_tenants_qps() {
        let endpoints = LocalEndpoints::new();
        let own = endpoints.add_tenant([[0xfe; 16]]);
        let neighbour = endpoints.add_tenant([[0xfd; 16]]);
        let _own_qp = endpoints.claim_qpn(own, 0x42);
        let pd = Handle::from_raw(PD);
        // An AH aimed at the sender's own address: its own QP 0x42 only.
        let reach = Reach::new(Arc::clone(&endpoints), Arc::new(|_| true));
        let ahs = ahs_to(reach, [0xfe; 16]);
        let mut slot = inline_slot(8);
        assert!(check(&mut slot, pd, 1, 64, &ahs, &mut PassDestinations::default()).is_ok());
        // The same QP number claimed by the neighbour (the sender's QP gone, the number
        // reused): refused, nothing rewritten for the host.
        drop(_own_qp);
        let _neighbour_qp = endpoints.claim_qpn(neighbour, 0x42);
        let mut slot = inline_slot(8);
        assert_eq!(
            check(&mut slot, pd, 1, 64, &ahs, &mut PassDestinations::default()),
            Err(Refusal::Destination(0x42))
        );
        assert_eq!(slot, inline_slot(8));
    }

    #[test]
    fn an_address_that_becomes_local_is_checked_as_local_from_then_on() {
        // An AH made while its address was another machine's lets a send name any QP number;
        // once the address is the host's own (a tenant's address added back after a link flap,
        // one the host gains), the same AH may reach only the QPs that address allows.
        let endpoints = LocalEndpoints::new();
        endpoints.add_tenant([REMOTE]);
        // QP 0x42 is a third tenant's, not the one whose address REMOTE becomes.
        let third = endpoints.add_tenant([[0xfd; 16]]);
        let _third_qp = endpoints.claim_qpn(third, 0x42);
        let local = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let is_local = Arc::clone(&local);
        let reach = Reach::new(
            endpoints,
            Arc::new(move |_| is_local.load(std::sync::atomic::Ordering::SeqCst)),
        );
        let ahs = ahs_to(reach, REMOTE);
        let pd = Handle::from_raw(PD);
        assert!(check(
            &mut inline_slot(8),
            pd,
            1,
            64,
            &ahs,
            &mut PassDestinations::default()
        )
        .is_ok());
        local.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            check(
                &mut inline_slot(8),
                pd,
                1,
                64,
                &ahs,
                &mut PassDestinations::default()
            ),
            Err(Refusal::Destination(0x42))
        );
    }

    #[test]
    fn a_pass_classifies_each_destination_once() {
        use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
        let looks = Arc::new(AtomicU32::new(0));
        let counted = Arc::clone(&looks);
        let reach = Reach::new(
            LocalEndpoints::new(),
            Arc::new(move |_| {
                counted.fetch_add(1, SeqCst);
                false
            }),
        );
        let mut ahs = ahs_to(reach, REMOTE);
        let other = [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
        let second = StagedAh {
            pd: Handle::from_raw(PD),
            ah_num: 43,
            dgid: other,
        };
        ahs.insert(Handle::from_raw(AH + 1), second);
        let pd = Handle::from_raw(PD);
        let mut pass = PassDestinations::default();
        for _ in 0..3 {
            assert!(check(&mut inline_slot(8), pd, 1, 64, &ahs, &mut pass).is_ok());
        }
        assert_eq!(
            looks.load(SeqCst),
            1,
            "one look for three sends to one address"
        );
        let mut to_other = inline_slot(8);
        let ah_num =
            offset_of!(RxeSendWqe, wr) + offset_of!(RxeSendWr, wr) + offset_of!(RxeUdWr, ah_num);
        to_other[ah_num..ah_num + 4].copy_from_slice(&(AH + 1).to_le_bytes());
        assert!(check(&mut to_other, pd, 1, 64, &ahs, &mut pass).is_ok());
        assert!(check(&mut inline_slot(8), pd, 1, 64, &ahs, &mut pass).is_ok());
        assert_eq!(looks.load(SeqCst), 2, "a second address, looked at once");
        // The next pass looks again: the host's addresses may have changed in between.
        let mut next = PassDestinations::default();
        assert!(check(&mut inline_slot(8), pd, 1, 64, &ahs, &mut next).is_ok());
        assert_eq!(looks.load(SeqCst), 3);
    }
}

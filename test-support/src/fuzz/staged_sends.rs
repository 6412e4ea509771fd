//! Staging rings (spec §9.6, §9.7) in a handler sequence: a guest writes fuzzed send WQEs
//! into a QP's staging ring (plausible UD SENDs naming its own AHs, the other guest's, host
//! `ah_num`s or nothing; junk address vectors; garbage slots), or into the staged receive
//! queue of an RC or UC QP, moves the producer index (usually by the WQEs written) and rings
//! the QP's doorbell; the device's pump copies what it accepts into the host queue. After
//! every step each WQE that reached a host send queue is checked: for a UD QP neutralised, or
//! a UD opcode through an AH of the QP's own context with no embedded address vector, aimed
//! at a QP reachable behind the AH's destination (a connected QP's WQEs are copied as
//! written, as into a directly mapped queue: counted, nothing to check).

use std::collections::{BTreeMap, HashMap};
use std::mem::size_of;
use std::os::unix::fs::FileExt;

use vrdma_backend::datapath::staging::NEUTRALISED_AH_NUM;
use vrdma_backend::identity::endpoints::TenantId;
use vrdma_backend::resources::kind::ResourceKind;
use vrdma_backend::vhost_device::handler::DeviceHandler;
use vrdma_spec::rxe_v1::{
    header, RingGeometry, RxeAv, RxeSendWqe, RxeSendWrUnion, RxeSge, RxeUdWr,
};
use vrdma_spec::verbs::{QpType, SendFlags, WrOpcode};
use vrdma_spec::wire::RingDesc;
use vrdma_spec::{Le32, Le64};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use super::bytes::ByteReader;
use super::guest_slot::{Slot, StagedQp, REMEMBERED};
use super::tenancy::{host_gids, Daemon};
use crate::fake_host::device::{FakeDevice, World};

/// What a staged WQE may name besides the guest's own AHs: QP numbers and AH handles seen.
pub(super) struct Targets<'a> {
    /// QP numbers of both guests' QPs.
    pub(super) qpns: &'a [u32],
    /// AH handles of the other guest.
    pub(super) foreign_ahs: &'a [u32],
}

impl Slot {
    /// Remembers a QP with staging rings (`rq` all zero if its receive queue is not one).
    pub(super) fn remember_staged(
        &mut self,
        (handle, qpn): (u32, u32),
        sq: RingDesc,
        rq: RingDesc,
        doorbell: u32,
    ) {
        if self.staged.len() == REMEMBERED {
            self.staged.remove(0);
        }
        self.staged.push(StagedQp {
            handle,
            qpn,
            sq,
            rq,
            doorbell_index: doorbell,
            producer: 0,
            rq_producer: 0,
        });
    }

    /// Writes WQEs into one live staging ring, moves its producer index and rings its
    /// doorbell.
    pub(super) fn stage_sends(
        &mut self,
        fake: &FakeDevice,
        targets: &Targets<'_>,
        r: &mut ByteReader<'_>,
    ) {
        let live: Vec<usize> = {
            let w = fake.world();
            let qps: Vec<_> = self
                .guest
                .dev()
                .inventory()
                .of(ResourceKind::Qp)
                .cloned()
                .collect();
            (0..self.staged.len())
                .filter(|&i| {
                    let s = &self.staged[i];
                    qps.iter().any(|qp| {
                        qp.handle == s.handle
                            && qp.host.and_then(|h| w.qps.get(&h)).map(|q| q.0) == Some(s.qpn)
                    })
                })
                .collect()
        };
        if live.is_empty() || self.area.is_none() {
            return;
        }
        let at = r.pick(&live);
        let own_ahs = self.seen[super::invariants::kind_index(ResourceKind::Ah)].clone();
        let qp = self.staged[at];
        let recv = qp.rq.map_len.get() != 0 && r.chance(40);
        let (ring, old_producer) = if recv {
            (qp.rq, qp.rq_producer)
        } else {
            (qp.sq, qp.producer)
        };
        let geometry = RingGeometry::new(ring.num_slots.get(), ring.log2_slot_size.get())
            .expect("the device described a valid ring");
        let slot_size = geometry.slot_size();
        let count = r.below(5);
        for i in 0..count {
            let index = old_producer.wrapping_add(i);
            let bytes = if recv || r.chance(10) {
                let mut junk = r.bytes(slot_size);
                junk.resize(slot_size, 0);
                junk
            } else {
                wqe_bytes(r, &own_ahs, targets, slot_size)
            };
            let offset = geometry.slot_offset(index) as u64;
            self.guest
                .frontend
                .write(ring.shm_offset.get() + offset, &bytes);
        }
        let producer = if r.chance(90) {
            old_producer.wrapping_add(count)
        } else {
            r.u32()
        };
        if recv {
            self.staged[at].rq_producer = producer;
        } else {
            self.staged[at].producer = producer;
        }
        self.guest.frontend.write(
            ring.shm_offset.get() + header::PRODUCER_INDEX as u64,
            &producer.to_le_bytes(),
        );
        self.ring(qp.doorbell_index);
        self.guest.dev().doorbell(self.guest.guest_io(), &[]);
    }
}

/// One send WQE, mostly a plausible UD SEND, padded to the slot.
fn wqe_bytes(
    r: &mut ByteReader<'_>,
    own_ahs: &[u32],
    targets: &Targets<'_>,
    slot_size: usize,
) -> Vec<u8> {
    let mut wqe = RxeSendWqe::new_zeroed();
    wqe.wr.wr_id = Le64::new(r.u64());
    let opcode = match r.below(10) {
        0..=6 => WrOpcode::Send as u32,
        7..=8 => WrOpcode::SendWithImm as u32,
        _ => r.below(16),
    };
    wqe.wr.opcode = Le32::new(opcode);
    let inline = r.chance(15);
    let mut flags = if r.chance(85) {
        SendFlags::SIGNALED.bits()
    } else {
        r.u32() & 0x1f
    };
    if inline {
        flags |= SendFlags::INLINE.bits();
    }
    wqe.wr.send_flags = Le32::new(flags);
    let ah_num = match r.below(10) {
        0..=6 if !own_ahs.is_empty() => r.pick(own_ahs),
        7 if !targets.foreign_ahs.is_empty() => r.pick(targets.foreign_ahs),
        8 => 0,
        _ => r.below(64),
    };
    let remote_qpn = if !targets.qpns.is_empty() && r.chance(70) {
        r.pick(targets.qpns)
    } else {
        r.u32() & 0xff_ffff
    };
    let mut av = RxeAv::new_zeroed();
    if r.chance(30) {
        av.network_type = r.u8();
        av.sgid_addr = [r.u8(); 28];
    }
    wqe.wr.wr = RxeSendWrUnion::from_ud(RxeUdWr {
        remote_qpn: Le32::new(remote_qpn),
        remote_qkey: Le32::new(r.u32()),
        ah_num: Le32::new(ah_num),
        av,
        ..RxeUdWr::new_zeroed()
    });
    let mut payload = Vec::new();
    let length = if inline {
        let n = r.below(64);
        payload.resize(n as usize, 0x5a);
        n
    } else {
        let sges = if r.chance(90) { r.below(3) } else { r.u32() };
        let mut total = 0u32;
        for _ in 0..sges.min(4) {
            let length = if r.chance(90) { r.below(4096) } else { r.u32() };
            total = total.wrapping_add(length);
            let sge = RxeSge {
                addr: Le64::new(r.u64()),
                length: Le32::new(length),
                lkey: Le32::new(r.u32()),
            };
            payload.extend_from_slice(sge.as_bytes());
        }
        wqe.dma.num_sge = Le32::new(sges);
        total
    };
    let length = if r.chance(90) { length } else { r.u32() };
    wqe.dma.length = Le32::new(length);
    wqe.dma.resid = Le32::new(if r.chance(90) { length } else { r.u32() });
    let mut bytes = wqe.as_bytes().to_vec();
    bytes.extend_from_slice(&payload);
    bytes.resize(slot_size.max(bytes.len()), 0);
    bytes.truncate(slot_size);
    bytes
}

/// Checks every WQE the pump put into the host send queue of any live UD QP of the guests
/// since the last check (`cursors`: host QP to the next index to check); returns how many it
/// found, and how many of them were neutralised.
pub(super) fn check_forwarded(
    fake: &FakeDevice,
    daemon: &Daemon,
    slots: &[Slot; 2],
    cursors: &mut HashMap<u32, u32>,
) -> (usize, usize) {
    let (mut forwarded, mut neutralised) = (0, 0);
    let qpn_owners = daemon.live_tenant_qpns(fake, slots);
    let w = fake.world();
    let table = host_gids(&w);
    let contexts: Vec<u64> = slots.iter().map(|s| s.context).collect();
    for (&host, (file, buffer)) in &w.send_queues {
        let owned = w
            .ownership
            .owner(host)
            .is_some_and(|c| contexts.contains(&c));
        if !owned {
            continue;
        }
        let ud = w.qp_types.get(&host) == Some(&QpType::Ud);
        let geometry = w.send_geometry[&host];
        let read = |at: usize, len: usize| {
            let mut bytes = vec![0; len];
            file.read_exact_at(&mut bytes, buffer.offset + at as u64)
                .expect("host send queue");
            bytes
        };
        let word = |at: usize| u32::from_le_bytes(read(at, 4).try_into().expect("4 bytes"));
        let producer = word(header::PRODUCER_INDEX);
        let cursor = cursors.entry(host).or_insert(0);
        // Only the last ring's worth can still be read.
        let from = producer.wrapping_sub(producer.wrapping_sub(*cursor).min(geometry.num_slots()));
        let mut index = from;
        while index != producer {
            let at = geometry.slot_offset(index);
            let bytes = read(at, size_of::<RxeSendWqe>());
            let wqe = RxeSendWqe::read_from_bytes(&bytes).expect("a WQE");
            forwarded += 1;
            if ud {
                neutralised += usize::from(check_ud(&w, daemon, &table, &qpn_owners, host, &wqe));
            }
            index = index.wrapping_add(1);
        }
        *cursor = producer;
    }
    (forwarded, neutralised)
}

/// Checks one WQE the pump put into a UD QP's host send queue (`host`); whether it was
/// neutralised.
fn check_ud(
    w: &World,
    daemon: &Daemon,
    table: &BTreeMap<u32, [u8; 16]>,
    qpn_owners: &BTreeMap<u32, TenantId>,
    host: u32,
    wqe: &RxeSendWqe,
) -> bool {
    let ud = wqe.wr.wr.ud();
    let ah_num = ud.ah_num.get();
    if ah_num == NEUTRALISED_AH_NUM {
        return true;
    }
    let opcode = wqe.wr.opcode.get();
    assert!(
        opcode == WrOpcode::Send as u32 || opcode == WrOpcode::SendWithImm as u32,
        "forwarded a UD WQE with opcode {opcode}"
    );
    assert!(
        w.ahs.contains_key(&ah_num) && w.pd_of.get(&ah_num) == w.pd_of.get(&host),
        "forwarded a UD WQE through ah_num {ah_num}, not an AH of the QP's PD"
    );
    assert!(
        ud.av.as_bytes().iter().all(|&b| b == 0),
        "forwarded a UD WQE with an embedded address vector"
    );
    let dgid = w.ah_attrs[&ah_num].dgid;
    assert!(
        daemon.reachable(table, qpn_owners, &dgid, ud.remote_qpn.get()),
        "forwarded a UD send to QP number {:#x} behind {}",
        ud.remote_qpn.get(),
        std::net::Ipv6Addr::from(dgid)
    );
    false
}

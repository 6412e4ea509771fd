//! What a driver does first, as one step: a PD, a CQ and the doorbell area; an RC QP moved to
//! RTR towards a destination among the run's aims; a UD QP moved to RTS with an AH, and a few
//! sends staged through it. Random inputs rarely get that far by themselves, so every run with
//! a set-up step reaches the connection and staged-send checks.

use vrdma_backend::resources::kind::ResourceKind::{self, *};
use vrdma_spec::control::HEADER_SIZE;
use vrdma_spec::verbs::{AccessFlags, QpAttrMask as M, QpState};
use vrdma_spec::wire::{CreateAhReq, CreateQpReq, ModifyQpReq, QpAttr};
use vrdma_spec::{Le32, Opcode};
use zerocopy::{FromZeros, IntoBytes};

use super::super::bytes::ByteReader;
use super::super::requests::{self as q};
use super::super::staged_sends::Targets;
use super::Sequence;
use crate::fake_host::device::PAGE;
use crate::fake_host::harness::{qp_req, rc_to_rtr, roce_av, RAM_BASE};

/// The UD QP type on the wire.
const UD: u8 = 4;

impl Sequence {
    /// Runs the set-up of guest `g` (each command may fail: later ones then use handle 0).
    pub(super) fn set_up(&mut self, g: usize, r: &mut ByteReader<'_>) {
        let pd = self.created(g, Pd, &q::request(Opcode::AllocPd, &[]), r);
        let cq = self.created(g, Cq, &q::two_words(Opcode::CreateCq, 16, 0), r);
        self.doorbell_area(g, r);
        // An RC QP aimed at one of the run's destinations.
        let rc = self.new_qp(g, qp_req(pd, cq, 0), r);
        let mut attr = QpAttr::new_zeroed().with_qp_state(QpState::Init);
        attr.port_num = 1;
        attr.qp_access_flags = Le32::new(AccessFlags::LOCAL_WRITE.bits());
        self.modify(
            g,
            rc,
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
            attr,
            r,
        );
        let aims = self.aims();
        let dest_qpn = if aims.qpns.is_empty() || r.chance(10) {
            r.u32() & 0xff_ffff
        } else {
            r.pick(&aims.qpns)
        };
        let rtr = rc_to_rtr(rc, 0, r.pick(&aims.dgids), dest_qpn);
        self.run(g, &q::request(Opcode::ModifyQp, rtr.as_bytes()), r);
        // A UD QP, ready to send, with an AH towards one of the destinations.
        let ud = self.new_qp(
            g,
            CreateQpReq {
                qp_type: UD,
                ..qp_req(pd, cq, 0)
            },
            r,
        );
        let mut attr = QpAttr::new_zeroed().with_qp_state(QpState::Init);
        attr.port_num = 1;
        attr.qkey = Le32::new(0x1111);
        self.modify(g, ud, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY, attr, r);
        let attr = QpAttr::new_zeroed().with_qp_state(QpState::Rtr);
        self.modify(g, ud, M::STATE, attr, r);
        let attr = QpAttr::new_zeroed().with_qp_state(QpState::Rts);
        self.modify(g, ud, M::STATE | M::SQ_PSN, attr, r);
        let ah = CreateAhReq {
            pd: Le32::new(pd),
            reserved: Le32::ZERO,
            ah_attr: roce_av(0, r.pick(&aims.dgids)),
        };
        self.created(g, Ah, &q::request(Opcode::CreateAh, ah.as_bytes()), r);
        let foreign_ahs = self.slots[1 - g].seen[super::kind_index(Ah)].clone();
        let targets = Targets {
            qpns: &aims.qpns,
            foreign_ahs: &foreign_ahs,
        };
        self.slots[g].stage_sends(&self.fake, &targets, r);
    }

    /// Puts guest `g`'s doorbell area at its usual place in guest RAM.
    pub(super) fn doorbell_area(&mut self, g: usize, r: &mut ByteReader<'_>) {
        let slots = self.slots[g].guest.dev().options().doorbell_slots();
        let area = RAM_BASE + 48 * PAGE;
        let mut body = area.to_le_bytes().to_vec();
        body.extend_from_slice(&slots.to_le_bytes());
        body.extend_from_slice(&[0; 4]);
        if self
            .run(g, &q::request(Opcode::SetDoorbellArea, &body), r)
            .is_some()
        {
            self.slots[g].area = Some(area);
        }
    }

    /// Runs a creation and returns the new handle (0 when it failed).
    pub(super) fn created(
        &mut self,
        g: usize,
        kind: ResourceKind,
        request: &[u8],
        r: &mut ByteReader<'_>,
    ) -> u32 {
        self.create(g, kind, request, r).map_or(0, |b| {
            u32::from_le_bytes(b[HEADER_SIZE..HEADER_SIZE + 4].try_into().unwrap())
        })
    }

    /// Runs a CREATE_QP and returns the new handle (0 when it failed).
    pub(super) fn new_qp(&mut self, g: usize, req: CreateQpReq, r: &mut ByteReader<'_>) -> u32 {
        self.create_qp(g, &q::request(Opcode::CreateQp, req.as_bytes()), r)
            .unwrap_or(0)
    }

    fn modify(&mut self, g: usize, qp: u32, mask: M, attr: QpAttr, r: &mut ByteReader<'_>) {
        let req = ModifyQpReq {
            qp: Le32::new(qp),
            attr_mask: Le32::new(mask.bits()),
            attr,
        };
        self.run(g, &q::request(Opcode::ModifyQp, req.as_bytes()), r);
    }
}

//! Connection-manager steps (spec §7.5): every CM command with plausible bodies
//! ([`cm_requests`](super::super::cm_requests)), the device's CM event pump, and a whole
//! connection between the two guests as librdmacm sets it up (listen on one; resolve, route
//! and connect from the other; accept, establish with CM_ACCEPT without a QP, disconnect,
//! reject or destroy), which random steps alone rarely complete. Every CM answer a guest gets
//! is remembered ([`Sequence::observe_cm`]): the ids it was given, and how many events of
//! each CM_DESTROY_ID must count.

use vrdma_backend::guest_device::cm_events::CM_FD;
use vrdma_backend::resources::kind::ResourceKind;
use vrdma_backend::vhost_device::handler::DeviceHandler;
use vrdma_spec::cm::{cm_event, cm_port_space, CmDestroyIdResp, CmEventResp, CM_EVENT_NONE};
use vrdma_spec::cm::{CmInitQpAttrResp, CM_EVENT_INLINE_SIZE, CM_EVENT_LAST};
use vrdma_spec::control::HEADER_SIZE;
use vrdma_spec::event::EVENT_SIZE;
use vrdma_spec::features::VRDMA_F_CM_EVENT_INLINE;
use vrdma_spec::wire::{CreateQpReq, ModifyQpReq};
use vrdma_spec::{Event, Le32, Opcode};
use zerocopy::{FromBytes, IntoBytes};

use super::super::bytes::ByteReader;
use super::super::cm_requests::{self as c, CmAims};
use super::super::guest_slot::Slot;
use super::super::requests::{self as q};
use super::Sequence;
use crate::fake_host::harness::qp_req;

/// Step kinds [`Sequence::cm_step`] chooses from.
pub(super) const CM_STEPS: u32 = 12;

/// The wire QP types the port spaces need.
const RC: u8 = 2;
const UD: u8 = 4;

/// The first word of a success body.
fn first_word(response: &[u8]) -> u32 {
    u32::from_le_bytes(response[HEADER_SIZE..HEADER_SIZE + 4].try_into().unwrap())
}

impl Sequence {
    /// One CM step of guest `g`.
    pub(super) fn cm_step(&mut self, g: usize, r: &mut ByteReader<'_>) {
        let aims = self.cm_aims(g);
        match r.below(CM_STEPS) {
            0 => {
                self.run(g, &c::create_id(r), r);
            }
            1 => {
                let id = self.cm_id(g, r);
                self.run(g, &q::handle_request(Opcode::CmDestroyId, id), r);
            }
            2 => {
                let id = self.cm_id(g, r);
                let request = if r.chance(60) {
                    c::bind(id, c::address(r, aims.own, aims.peer))
                } else {
                    c::listen(r, id)
                };
                self.run(g, &request, r);
            }
            3 => {
                let id = self.cm_id(g, r);
                let request = if r.chance(60) {
                    let src = r.chance(25).then(|| c::address(r, aims.own, aims.peer));
                    let dst = c::address(r, aims.peer, aims.own);
                    c::resolve_addr(r, id, src, dst)
                } else {
                    c::resolve_route(r, id)
                };
                self.run(g, &request, r);
            }
            4 => {
                let id = self.cm_id(g, r);
                let qp_type = if r.chance(80) { RC } else { UD };
                let (op, qp) = match r.below(3) {
                    0 => (Opcode::CmConnect, self.cm_qp(g, qp_type, r)),
                    1 => (Opcode::CmAccept, self.cm_qp(g, qp_type, r)),
                    _ => (Opcode::CmAccept, 0),
                };
                self.run(g, &c::conn(r, op, id, qp), r);
            }
            5 => {
                let id = self.cm_id(g, r);
                let request = if r.chance(50) {
                    c::reject(r, id)
                } else {
                    q::handle_request(Opcode::CmDisconnect, id)
                };
                self.run(g, &request, r);
            }
            6 => {
                let (id, qp) = (self.cm_id(g, r), self.cm_qp(g, RC, r));
                self.cm_modify(g, id, qp, None, r);
            }
            7 => {
                let id = self.cm_id(g, r);
                let request = match r.below(3) {
                    0 => c::set_option(r, id),
                    1 => c::notify(r, id),
                    _ => q::handle_request(Opcode::CmQueryAddr, id),
                };
                self.run(g, &request, r);
            }
            8..=9 => {
                if r.chance(80) {
                    self.pump(g);
                }
                let max = r.below(4) as usize;
                self.cm_events(g, max, r);
            }
            _ => self.cm_connection(g, r),
        }
    }

    /// Where guest `g`'s CM requests aim.
    fn cm_aims(&self, g: usize) -> CmAims {
        CmAims {
            own: self.daemon.cm_address(g),
            peer: self.daemon.cm_address(1 - g),
        }
    }

    /// A CM id for guest `g` to name: mostly one it was given, sometimes the other guest's
    /// (whose numbers are this guest's handles too, maybe of ids it has not seen yet) or any.
    fn cm_id(&self, g: usize, r: &mut ByteReader<'_>) -> u32 {
        let (own, other) = (&self.slots[g].cm_ids, &self.slots[1 - g].cm_ids);
        match r.below(16) {
            0..=12 if !own.is_empty() => r.pick(own),
            13 if !other.is_empty() => r.pick(other),
            14 => r.u32(),
            _ => r.below(8),
        }
    }

    /// A QP of guest `g` for a CM command: mostly one of wire type `qp_type`.
    fn cm_qp(&self, g: usize, qp_type: u8, r: &mut ByteReader<'_>) -> u32 {
        let typed: Vec<u32> = self.slots[g]
            .typed_qps
            .iter()
            .filter(|&&(_, t)| t == qp_type)
            .map(|&(qp, _)| qp)
            .collect();
        if !typed.is_empty() && r.chance(85) {
            r.pick(&typed)
        } else {
            self.handle(g, ResourceKind::Qp, r)
        }
    }

    /// A QP for a connection of guest `g`: a live one of wire type `qp_type` it has, or (more
    /// often, and always when it has none) a new one, which no other id connects yet, on a
    /// PD and CQ the guest has or gets (and its doorbell area, which a QP needs, when the
    /// first try fails); when that fails too, any QP handle.
    fn connection_qp(&mut self, g: usize, qp_type: u8, r: &mut ByteReader<'_>) -> u32 {
        let live: Vec<u32> = {
            let inventory = self.slots[g].guest.dev().inventory();
            let qps: Vec<u32> = inventory.of(ResourceKind::Qp).map(|o| o.handle).collect();
            self.slots[g]
                .typed_qps
                .iter()
                .filter(|&&(qp, t)| t == qp_type && qps.contains(&qp))
                .map(|&(qp, _)| qp)
                .collect()
        };
        if !live.is_empty() && r.chance(40) {
            return r.pick(&live);
        }
        let inventory = self.slots[g].guest.dev().inventory();
        let have = |kind| inventory.of(kind).last().map(|o| o.handle);
        let (pd, cq) = (have(ResourceKind::Pd), have(ResourceKind::Cq));
        let pd = pd.unwrap_or_else(|| {
            self.created(g, ResourceKind::Pd, &q::request(Opcode::AllocPd, &[]), r)
        });
        let cq = cq.unwrap_or_else(|| {
            let request = q::two_words(Opcode::CreateCq, 16, 0);
            self.created(g, ResourceKind::Cq, &request, r)
        });
        let request = CreateQpReq {
            qp_type,
            ..qp_req(pd, cq, 0)
        };
        let mut qp = self.new_qp(g, request, r);
        if qp == 0 {
            // A discard may have taken the doorbell area the slot remembers.
            self.doorbell_area(g, r);
            qp = self.new_qp(g, request, r);
        }
        match qp {
            0 if !live.is_empty() => r.pick(&live),
            0 => self.cm_qp(g, qp_type, r),
            qp => qp,
        }
    }

    /// Runs guest `g`'s CM event pump, as its worker does when the host CM's fd is readable.
    pub(super) fn pump(&self, g: usize) {
        let guest = &self.slots[g].guest;
        guest.dev().fd_ready(guest.guest_io(), CM_FD);
    }

    /// Up to `max` CM_GET_EVENTs of guest `g`, until one answers that nothing is pending.
    fn cm_events(&mut self, g: usize, max: usize, r: &mut ByteReader<'_>) -> Vec<CmEventResp> {
        let mut events = Vec::new();
        for _ in 0..max {
            if self.features & VRDMA_F_CM_EVENT_INLINE != 0 && r.chance(50) {
                // A notice placed into an event buffer of the driver's size.
                let capacity = r.pick(&[
                    EVENT_SIZE,
                    CM_EVENT_INLINE_SIZE - 1,
                    CM_EVENT_INLINE_SIZE,
                    512,
                ]);
                if let Some(event) = self.place_cm_notice(g, capacity) {
                    events.push(event);
                }
                continue;
            }
            let Some(response) = self.run(g, &q::request(Opcode::CmGetEvent, &[]), r) else {
                continue;
            };
            let (event, _) = CmEventResp::read_from_prefix(&response[HEADER_SIZE..]).unwrap();
            if event.event.get() == CM_EVENT_NONE {
                break;
            }
            events.push(event);
        }
        events
    }

    /// Takes guest `g`'s next CM_EVENT notice off its event queue and places it as into a
    /// buffer of `capacity` bytes; returns the event it carried whole, checked and counted.
    fn place_cm_notice(&mut self, g: usize, capacity: usize) -> Option<CmEventResp> {
        let guest = &self.slots[g].guest;
        let notice = crate::fake_host::cm_steps::take_cm_notice(guest)?;
        let bytes = guest.dev().expand_event(&notice, capacity)?;
        assert!(
            capacity >= CM_EVENT_INLINE_SIZE && bytes.len() == CM_EVENT_INLINE_SIZE,
            "guest {g}: {} bytes placed into {capacity}",
            bytes.len()
        );
        let header = Event::decode(&bytes[..EVENT_SIZE]).unwrap();
        let (body, _) = CmEventResp::read_from_prefix(&bytes[EVENT_SIZE..]).unwrap();
        let named = if body.event.get() == cm_event::CONNECT_REQUEST {
            body.listen_id.get()
        } else {
            body.id.get()
        };
        assert_eq!(
            (header.handle, header.detail),
            (named, body.event.get()),
            "guest {g}: the notice names another event than it carries"
        );
        self.observe_cm_event(g, &body);
        self.stats.cm_events_inline += 1;
        Some(body)
    }

    /// Moves `qp` of guest `g` with what CM_INIT_QP_ATTR of `id` computes for `state` (any
    /// when `None`), as librdmacm does (sometimes only asks), or with CM_MOVE_QP.
    fn cm_modify(
        &mut self,
        g: usize,
        id: u32,
        qp: u32,
        state: Option<u32>,
        r: &mut ByteReader<'_>,
    ) {
        if r.chance(40) {
            // The device's one-command form of the pair below.
            self.run(g, &c::move_qp(r, id, qp, state), r);
            return;
        }
        let mut request = c::init_qp_attr(r, id);
        if let Some(state) = state {
            request[HEADER_SIZE + 4..HEADER_SIZE + 8].copy_from_slice(&state.to_le_bytes());
        }
        let Some(response) = self.run(g, &request, r) else {
            return;
        };
        if r.chance(10) {
            return;
        }
        let (a, _) = CmInitQpAttrResp::read_from_prefix(&response[HEADER_SIZE..]).unwrap();
        let modify = ModifyQpReq {
            qp: Le32::new(qp),
            attr_mask: a.attr_mask,
            attr: a.attr,
        };
        self.run(g, &q::request(Opcode::ModifyQp, modify.as_bytes()), r);
    }

    /// Remembers what a successful CM answer of guest `g` tells its driver, and checks what
    /// must hold of it: an event names live ids of the guest, and CM_DESTROY_ID counts the
    /// events CM_GET_EVENT delivered.
    pub(super) fn observe_cm(&mut self, g: usize, op: Opcode, request: &[u8], response: &[u8]) {
        let slot = &mut self.slots[g];
        match op {
            Opcode::CmCreateId => {
                let id = first_word(response);
                Slot::keep(&mut slot.cm_ids, id);
                slot.cm_delivered.insert(id, 0);
            }
            Opcode::CmDestroyId => {
                let id =
                    u32::from_le_bytes(request[HEADER_SIZE..HEADER_SIZE + 4].try_into().unwrap());
                let (answer, _) =
                    CmDestroyIdResp::read_from_prefix(&response[HEADER_SIZE..]).unwrap();
                if let Some(delivered) = slot.cm_delivered.remove(&id) {
                    assert_eq!(
                        answer.events_delivered.get(),
                        delivered,
                        "guest {g}: CM_DESTROY_ID of {id:#x} counts other events than were delivered"
                    );
                }
            }
            Opcode::CmGetEvent => {
                let (e, _) = CmEventResp::read_from_prefix(&response[HEADER_SIZE..]).unwrap();
                self.observe_cm_event(g, &e);
            }
            _ => {}
        }
    }

    /// Checks and remembers a CM event delivered to guest `g` (by CM_GET_EVENT, or whole in
    /// an event buffer): it names live ids of the guest, and counts toward CM_DESTROY_ID.
    fn observe_cm_event(&mut self, g: usize, e: &CmEventResp) {
        let slot = &mut self.slots[g];
        let event = e.event.get();
        if event == CM_EVENT_NONE {
            return;
        }
        assert!(event <= CM_EVENT_LAST, "guest {g}: CM event {event}");
        *self.stats.cm_events.entry(event).or_default() += 1;
        let (id, listener) = (e.id.get(), e.listen_id.get());
        let live: Vec<u32> = slot
            .guest
            .dev()
            .inventory()
            .of(ResourceKind::CmId)
            .map(|o| o.handle)
            .collect();
        assert!(
            live.contains(&id),
            "guest {g}: CM event {event} about id {id:#x}, which it does not have"
        );
        if event == cm_event::CONNECT_REQUEST {
            assert!(
                live.contains(&listener),
                "guest {g}: a connect request on listener {listener:#x}, which it does \
                 not have"
            );
            Slot::keep(&mut slot.cm_ids, id);
            slot.cm_delivered.insert(id, 0);
            // librdmacm counts a request against its listener.
            if let Some(n) = slot.cm_delivered.get_mut(&listener) {
                *n += 1;
            }
        } else {
            assert_eq!(listener, 0, "guest {g}: CM event {event} with a listener");
            if let Some(n) = slot.cm_delivered.get_mut(&id) {
                *n += 1;
            }
        }
    }

    /// A connection from a client to a listener of guest `server` (the client is mostly the
    /// other guest) the way librdmacm sets one up; most choices are the plausible ones, the
    /// input may cut the dance short at every stage, and the ids stay for later steps.
    fn cm_connection(&mut self, server: usize, r: &mut ByteReader<'_>) {
        // A tenant and a guest sharing the host's identity have no address in common to
        // reach each other through (a tenant sends from its own address only; the other
        // guest binds link-local fe80::1, which a tenant's source cannot reach): such a pair
        // connects each guest with itself.
        let tenant = |g: usize| self.daemon.tenant_gid(g).is_some();
        let across = tenant(server) == tenant(1 - server);
        let client = if across && r.chance(80) {
            1 - server
        } else {
            server
        };
        let (at, from) = (
            self.daemon.cm_address(server),
            self.daemon.cm_address(client),
        );
        let (port_space, qp_type) = if r.chance(15) {
            (cm_port_space::UDP, UD)
        } else {
            (cm_port_space::TCP, RC)
        };
        let port = r.pick(&c::PORTS[..3]);
        let stages = if r.chance(75) { 8 } else { r.below(8) };
        // The server: an id bound to its address and listening.
        let Some(listener) = self.create_cm_id(server, port_space, r) else {
            return;
        };
        let addr = if r.chance(85) {
            c::wire(r, at, port)
        } else {
            c::address(r, at, from)
        };
        self.run(server, &c::bind(listener, addr), r);
        self.run(server, &c::listen(r, listener), r);
        if stages < 1 {
            return;
        }
        // The client: resolve towards the listener, route, connect with a QP of its own.
        let Some(id) = self.create_cm_id(client, port_space, r) else {
            return;
        };
        let dst = if r.chance(85) {
            c::wire(r, at, port)
        } else {
            c::address(r, at, from)
        };
        let src = r.chance(15).then(|| c::address(r, from, at));
        self.run(client, &c::resolve_addr(r, id, src, dst), r);
        self.run(client, &c::resolve_route(r, id), r);
        self.pump(client);
        self.cm_events(client, 3, r);
        if stages < 2 {
            return;
        }
        let client_qp = self.connection_qp(client, qp_type, r);
        if r.chance(50) {
            self.cm_modify(client, id, client_qp, Some(1), r);
        }
        self.run(client, &c::conn(r, Opcode::CmConnect, id, client_qp), r);
        if stages < 3 {
            return;
        }
        // The server's answer to the request it hears of.
        self.pump(server);
        let request = self
            .cm_events(server, 4, r)
            .into_iter()
            .find(|e| e.event.get() == cm_event::CONNECT_REQUEST && e.listen_id.get() == listener)
            .map(|e| e.id.get());
        let Some(conn) = request else { return };
        if stages < 4 {
            return;
        }
        if r.chance(10) {
            self.run(server, &c::reject(r, conn), r);
            self.pump(client);
            self.cm_events(client, 2, r);
            return;
        }
        let server_qp = self.connection_qp(server, qp_type, r);
        if r.chance(50) {
            for state in 1..=3 {
                self.cm_modify(server, conn, server_qp, Some(state), r);
            }
        }
        self.run(server, &c::conn(r, Opcode::CmAccept, conn, server_qp), r);
        if stages < 5 {
            return;
        }
        // The client hears the reply and establishes.
        self.pump(client);
        self.cm_events(client, 3, r);
        if r.chance(50) {
            for state in 2..=3 {
                self.cm_modify(client, id, client_qp, Some(state), r);
            }
        }
        self.run(client, &c::conn(r, Opcode::CmAccept, id, 0), r);
        self.pump(server);
        self.cm_events(server, 3, r);
        if stages < 6 {
            return;
        }
        // Either side disconnects, the other answers.
        let (first, second) = if r.chance(50) {
            ((client, id), (server, conn))
        } else {
            ((server, conn), (client, id))
        };
        self.run(
            first.0,
            &q::handle_request(Opcode::CmDisconnect, first.1),
            r,
        );
        self.pump(second.0);
        self.cm_events(second.0, 2, r);
        self.run(
            second.0,
            &q::handle_request(Opcode::CmDisconnect, second.1),
            r,
        );
        self.pump(first.0);
        self.cm_events(first.0, 2, r);
        if stages < 7 {
            return;
        }
        for (guest, handle) in [(client, id), (server, conn), (server, listener)] {
            if r.chance(50) {
                self.run(guest, &q::handle_request(Opcode::CmDestroyId, handle), r);
            }
        }
    }

    /// CM_CREATE_ID of `port_space` for guest `g` (sometimes an id it has instead). With
    /// most of its quota of ids in use, the guest mostly destroys one first (the first in its
    /// table), as an application that goes on connecting does.
    fn create_cm_id(&mut self, g: usize, port_space: u16, r: &mut ByteReader<'_>) -> Option<u32> {
        if r.chance(10) && !self.slots[g].cm_ids.is_empty() {
            return Some(self.cm_id(g, r));
        }
        let guest = self.slots[g].guest.dev();
        let quota = guest.options().quotas.cm_ids as usize;
        let first = {
            let inventory = guest.inventory();
            let ids: Vec<u32> = inventory.of(ResourceKind::CmId).map(|o| o.handle).collect();
            (ids.len() + 1 >= quota)
                .then(|| ids.first().copied())
                .flatten()
        };
        if let Some(first) = first {
            if r.chance(70) {
                self.run(g, &q::handle_request(Opcode::CmDestroyId, first), r);
            }
        }
        let mut request = c::create_id(r);
        request[HEADER_SIZE..HEADER_SIZE + 2].copy_from_slice(&port_space.to_le_bytes());
        request[HEADER_SIZE + 2..HEADER_SIZE + 8].fill(0);
        self.run(g, &request, r).map(|b| first_word(&b))
    }
}

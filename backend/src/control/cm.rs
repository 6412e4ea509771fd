//! The connection manager's commands (spec §7.5): a guest's ids run on the host's
//! connection manager, bound and resolved only on the guest's own addresses (spec §12.1,
//! `identity::cm_addresses`), connected only with the guest's own QPs, and answered in the
//! guest's terms (its GID indices, port 1, its scope ids). Events come through
//! `guest_device::cm_events` and wait in the guest's state for CM_GET_EVENT.

use std::net::SocketAddr;

use vrdma_spec::cm::*;
use vrdma_spec::control::{CmRequest, CmResponseBody, ResponseBody};
use vrdma_spec::event::Subject;
use vrdma_spec::verbs::{AccessFlags, QpAttrMask, QpState, QpType};
use vrdma_spec::wire::{AhAttr, HandleReq, HandleResp, ModifyQpReq, QpAttr};
use vrdma_spec::{Le16, Le32, Status};
use zerocopy::FromZeros;

use super::error::CommandError;
use super::session::{host_err, CommandResult, Session};
use crate::guest::cm_ids::{CmIdEntry, CmIds};
use crate::guest::objects::discard_events_of;
use crate::guest::objects::EventOwner;
use crate::guest::shared::{GuestShared, GUEST_PORT};
use crate::host::cm::{CmId, CmOption, ConnParams, HostCm, PrivateData};
use crate::host::DeviceError;
use crate::identity::address_gid;
use crate::identity::cm_addresses::{CmAddressError, CmAddressRules};
use crate::resources::table::Handle;

/// The most connect requests a listener may have waiting (a backlog of 0 or above asks for
/// this many).
pub const MAX_BACKLOG: u32 = 128;

/// Runs one CM command.
pub(crate) fn dispatch(s: &mut Session<'_>, request: &CmRequest) -> CommandResult {
    let Some(cm) = s.guest.cm() else {
        // The feature is offered only with a host CM; a driver cannot have accepted it.
        return Err(CommandError::NotNegotiated("VRDMA_F_CM"));
    };
    log::trace!("guest {}: {request:?}", s.guest.id());
    if request.makes_events() && s.state.cm.backlogged(pending_limit(s)) {
        // The host could queue events without bound while the driver does not fetch them.
        return Err(CommandError::Rule {
            what: "undelivered connection-manager events (fetch them with CM_GET_EVENT)",
            status: Status::Busy,
        });
    }
    let body = match request {
        CmRequest::CreateId(r) => create_id(s, cm, r.port_space.get())?,
        CmRequest::DestroyId(r) => destroy_id(s, cm, r)?,
        CmRequest::Bind(r) => {
            bind(s, cm, r.id.get(), &r.addr)?;
            None
        }
        CmRequest::ResolveAddr(r) => {
            resolve_addr(s, cm, r)?;
            None
        }
        CmRequest::ResolveRoute(r) => {
            let id = entry(s, r.id.get())?.host;
            cm.resolve_route(id, r.timeout_ms.get())
                .map_err(host_err("CM_RESOLVE_ROUTE"))?;
            None
        }
        CmRequest::Listen(r) => {
            listen(s, cm, r.id.get(), r.backlog.get())?;
            None
        }
        CmRequest::Connect(r) => {
            connect(s, cm, r, false)?;
            None
        }
        CmRequest::Accept(r) => {
            connect(s, cm, r, true)?;
            None
        }
        CmRequest::Reject(r) => {
            let id = entry(s, r.id.get())?.host;
            let data = &r.private_data[..usize::from(r.private_data_len)];
            cm.reject(id, r.reason, &PrivateData::new(data))
                .map_err(host_err("CM_REJECT"))?;
            None
        }
        CmRequest::Disconnect(r) => {
            let id = entry(s, r.handle.get())?.host;
            cm.disconnect(id).map_err(host_err("CM_DISCONNECT"))?;
            None
        }
        CmRequest::InitQpAttr(r) => Some(init_qp_attr(s, cm, r.id.get(), r.qp_state.get())?),
        CmRequest::GetEvent => Some(get_event(&s.state.cm)),
        CmRequest::SetOption(r) => {
            set_option(s, cm, r)?;
            None
        }
        CmRequest::Notify(r) => {
            let id = entry(s, r.id.get())?.host;
            cm.notify(id, r.event.get())
                .map_err(host_err("CM_NOTIFY"))?;
            None
        }
        CmRequest::QueryAddr(r) => Some(query_addr(s, cm, r.handle.get())?),
        CmRequest::MoveQp(r) => {
            move_qp_command(s, cm, r)?;
            None
        }
    };
    Ok(body.map_or(ResponseBody::Empty, ResponseBody::Cm))
}

/// Undelivered events past which commands that make more are refused (`BUSY`): room for a
/// few events of every id the guest may hold, which the commands already under way (at most
/// one per id and operation) and peers' requests (bounded by backlogs and the id quota) stay
/// within.
fn pending_limit(s: &Session<'_>) -> usize {
    (s.guest.options().quotas.cm_ids as usize)
        .saturating_mul(4)
        .max(64)
}

/// The guest's id `raw`.
fn entry<'a>(s: &'a Session<'_>, raw: u32) -> Result<&'a CmIdEntry, CommandError> {
    Ok(s.state.cm.ids.get(Handle::from_raw(raw))?)
}

fn create_id(
    s: &mut Session<'_>,
    cm: &dyn HostCm,
    port_space: u16,
) -> Result<Option<CmResponseBody>, CommandError> {
    s.state.cm.ids.check_room(0)?;
    let uid = s.state.new_user_handle();
    let host = cm
        .create_id(uid, port_space)
        .map_err(host_err("CM_CREATE_ID"))?;
    let handle = match s.state.cm.insert(CmIdEntry::new(host, uid, port_space)) {
        Ok(handle) => handle,
        Err(e) => {
            release_host(s.guest, cm, host);
            return Err(e.into());
        }
    };
    s.state.owners.insert(uid, EventOwner::CmId(handle));
    Ok(Some(CmResponseBody::CreateId(HandleResp {
        handle: Le32::new(handle.raw()),
        reserved: Le32::ZERO,
    })))
}

fn destroy_id(
    s: &mut Session<'_>,
    cm: &dyn HostCm,
    r: &HandleReq,
) -> Result<Option<CmResponseBody>, CommandError> {
    let handle = Handle::from_raw(r.handle.get());
    let (entry, orphans) = s.state.cm.remove(handle)?;
    // Nothing about the id may reach the guest after this answer (spec §8).
    discard_events_of(s.guest_io, Subject::CmId, handle);
    for (orphan_handle, orphan) in &orphans {
        discard_events_of(s.guest_io, Subject::CmId, *orphan_handle);
        release(s.guest, cm, &mut s.state.owners, orphan);
    }
    release(s.guest, cm, &mut s.state.owners, &entry);
    Ok(Some(CmResponseBody::DestroyId(CmDestroyIdResp {
        events_delivered: Le32::new(entry.counters.events_delivered()),
        reserved: Le32::ZERO,
    })))
}

/// Destroys the host id of a forgotten entry.
pub(crate) fn release(
    guest: &GuestShared,
    cm: &dyn HostCm,
    owners: &mut std::collections::HashMap<u64, EventOwner>,
    entry: &CmIdEntry,
) {
    owners.remove(&entry.uid);
    release_host(guest, cm, entry.host);
}

fn release_host(guest: &GuestShared, cm: &dyn HostCm, id: crate::host::cm::CmId) {
    if let Err(e) = cm.destroy_id(id) {
        // Only an id the host already dropped fails; closing the guest's CM at disconnect
        // would release anything left.
        log::warn!("guest {}: destroying CM id {}: {e}", guest.id(), id.0);
    }
}

/// Destroys every id of the guest (a discard, spec §11.1).
pub(crate) fn discard(guest: &GuestShared, cm_ids: &mut CmIds) {
    let Some(cm) = guest.cm() else { return };
    for host in cm_ids.drain() {
        release_host(guest, cm, host);
    }
}

/// The address rules of this guest (spec §7.5).
fn with_rules<T>(s: &Session<'_>, f: impl FnOnce(&CmAddressRules<'_>) -> T) -> T {
    let identity = &s.guest.options().identity;
    let endpoints = &s.guest.tenant().endpoints;
    let tenants_present = endpoints.has_tenants();
    // What a guest sharing the host's identity may bind and send from: the port's addresses
    // that are no tenant's (its GID view shows exactly those).
    let host_sources = if identity.addresses.is_empty() {
        s.guest
            .gids()
            .table(&s.guest.gid_source(), s.guest.options().host_port)
            .unwrap_or_default()
            .into_iter()
            .map(|(_, entry)| gid_ip(&entry.gid))
            .collect()
    } else {
        Vec::new()
    };
    let is_tenant = |ip: &std::net::IpAddr| endpoints.is_tenant_address(&address_gid(*ip));
    let rules = CmAddressRules {
        addresses: &identity.addresses,
        host_sources: &host_sources,
        is_tenant_address: &is_tenant,
        tenants_present,
        netdev_ifindex: s.guest.netdev_ifindex(),
    };
    f(&rules)
}

/// The IP address of a RoCE v2 GID (IPv4 mapped into IPv6).
fn gid_ip(gid: &[u8; 16]) -> std::net::IpAddr {
    std::net::Ipv6Addr::from(*gid).to_canonical()
}

fn address_refused(e: CmAddressError) -> CommandError {
    CommandError::Rule {
        what: match e {
            CmAddressError::NotOwn(_) | CmAddressError::TenantAddress(_) => {
                "an address that is not the guest's"
            }
            CmAddressError::AmbiguousWildcard { .. } | CmAddressError::WildcardBesideTenants => {
                "a wildcard the device cannot bind"
            }
            CmAddressError::BadDestination(_) => "a wildcard, multicast or broadcast destination",
            CmAddressError::NoSource(_) => "no source address of the guest for the destination",
        },
        status: Status::Invalid,
    }
}

/// The guest's scope id of a link-local IPv6 address it gave, else 0.
fn link_local_scope(addr: &SocketAddr) -> Option<u32> {
    match addr {
        SocketAddr::V6(v6) if v6.ip().is_unicast_link_local() => Some(v6.scope_id()),
        _ => None,
    }
}

fn bind(s: &mut Session<'_>, cm: &dyn HostCm, raw: u32, addr: &CmAddr) -> Result<(), CommandError> {
    let id = entry(s, raw)?.host;
    let requested = addr.socket_addr().ok_or(CommandError::Invalid {
        what: "addr.family",
        value: addr.family.get().into(),
    })?;
    let host_addr = with_rules(s, |rules| rules.bind(requested)).map_err(address_refused)?;
    // A taken address and port is BUSY; anything else the host says (EADDRNOTAVAIL: the host
    // no longer has the address) travels as its errno.
    cm.bind(id, &host_addr).map_err(|e| match e.errno() {
        libc::EADDRINUSE => CommandError::Rule {
            what: "the address and port are bound already",
            status: Status::Busy,
        },
        _ => host_err("CM_BIND")(e),
    })?;
    let e = s.state.cm.ids.get_mut(Handle::from_raw(raw))?;
    e.bound = true;
    e.loopback = requested.ip().to_canonical().is_loopback();
    if let Some(scope) = link_local_scope(&requested) {
        e.guest_scope = scope;
    }
    Ok(())
}

fn resolve_addr(
    s: &mut Session<'_>,
    cm: &dyn HostCm,
    r: &CmResolveAddrReq,
) -> Result<(), CommandError> {
    let raw = r.id.get();
    let id = entry(s, raw)?.host;
    let src = r.src.socket_addr();
    let dst = r.dst.socket_addr().ok_or(CommandError::Invalid {
        what: "dst.family",
        value: r.dst.family.get().into(),
    })?;
    if let Some(prefixes) = &s.guest.options().identity.policy.destinations {
        let gid = address_gid(dst.ip().to_canonical());
        if !prefixes.iter().any(|p| p.contains_gid(&gid)) {
            return Err(CommandError::Rule {
                what: "a destination outside the guest's prefixes",
                status: Status::Invalid,
            });
        }
    }
    let (host_src, host_dst) =
        with_rules(s, |rules| rules.resolve(src, dst)).map_err(address_refused)?;
    cm.resolve_addr(id, Some(&host_src), &host_dst, r.timeout_ms.get())
        .map_err(host_err("CM_RESOLVE_ADDR"))?;
    let e = s.state.cm.ids.get_mut(Handle::from_raw(raw))?;
    if let Some(scope) = link_local_scope(&dst).or_else(|| src.as_ref().and_then(link_local_scope))
    {
        e.guest_scope = scope;
    }
    Ok(())
}

fn listen(
    s: &mut Session<'_>,
    cm: &dyn HostCm,
    raw: u32,
    backlog: u32,
) -> Result<(), CommandError> {
    let e = entry(s, raw)?;
    if !e.bound {
        // The host would bind the wildcard (spec §7.5).
        return Err(CommandError::BadState(
            "CM_LISTEN on an id not bound by CM_BIND",
        ));
    }
    let backlog = if backlog == 0 || backlog > MAX_BACKLOG {
        MAX_BACKLOG
    } else {
        backlog
    };
    cm.listen(e.host, backlog).map_err(host_err("CM_LISTEN"))?;
    s.state.cm.ids.get_mut(Handle::from_raw(raw))?.backlog = Some(backlog);
    Ok(())
}

/// CM_CONNECT, and CM_ACCEPT (`accept`): with a QP handle the QP's host number goes to the
/// peer; CM_ACCEPT without one establishes after a reply. A CM_ACCEPT with
/// [`cm_conn_flags::MOVE_QP`] first moves the QP as librdmacm would ([`move_qp`]).
fn connect(
    s: &mut Session<'_>,
    cm: &dyn HostCm,
    r: &CmConnReq,
    accept: bool,
) -> Result<(), CommandError> {
    let handle = Handle::from_raw(r.id.get());
    let e = s.state.cm.ids.get(handle)?;
    let (id, uid, port_space) = (e.host, e.uid, e.port_space);
    let qp_raw = r.qp.get();
    if accept && qp_raw == 0 {
        // Only the active side establishes after a reply; on a connect request's id the host
        // would accept with QP number 0 (and, never having the id's uid, drop its events).
        let e = s.state.cm.ids.get(handle)?;
        let Some(qp) = e.qp.filter(|_| e.active) else {
            return Err(CommandError::BadState(
                "CM_ACCEPT without a QP on an id that sent no connect request",
            ));
        };
        if r.param.flags & cm_conn_flags::MOVE_QP != 0 {
            move_qp(s, cm, id, qp, &r.param)?;
        }
        return cm.accept(id, uid, None).map_err(host_err("CM_ACCEPT"));
    }
    let qp_handle = Handle::from_raw(qp_raw);
    let qp = s.state.qps.get(qp_handle)?;
    let wanted = if port_space == cm_port_space::UDP {
        QpType::Ud
    } else {
        QpType::Rc
    };
    if qp.qp_type != wanted {
        return Err(CommandError::Invalid {
            what: "QP type for the id's port space",
            value: qp_raw.into(),
        });
    }
    if s.state
        .cm
        .connecting(qp_handle)
        .is_some_and(|other| other != handle)
    {
        return Err(CommandError::Rule {
            what: "the QP is connected through another id",
            status: Status::Busy,
        });
    }
    let p = &r.param;
    let params = ConnParams {
        qp_num: qp.qpn,
        srq: qp.deps.srq.is_some(),
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        flow_control: p.flow_control,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        private_data: PrivateData::new(&p.private_data[..usize::from(p.private_data_len)]),
    };
    if accept {
        if p.flags & cm_conn_flags::MOVE_QP != 0 {
            move_qp(s, cm, id, qp_handle, p)?;
        }
        cm.accept(id, uid, Some(&params))
            .map_err(host_err("CM_ACCEPT"))?;
    } else {
        cm.connect(id, &params).map_err(host_err("CM_CONNECT"))?;
    }
    let e = s.state.cm.ids.get_mut(handle)?;
    e.qp = Some(qp_handle);
    e.active |= !accept;
    Ok(())
}

/// Moves the RC QP `qp` to INIT, RTR and RTS with the attributes the host's CM computes for
/// the host id `id`, RTR's and RTS's read/atomic depths from `param` unless 0xff (librdmacm's
/// `ucma_modify_qp_rtr/rts`), each step as [`move_qp_to`] makes it; the first one refused ends
/// the command with its status, before anything goes to the peer.
fn move_qp(
    s: &mut Session<'_>,
    cm: &dyn HostCm,
    id: CmId,
    qp: Handle,
    param: &CmConnParam,
) -> Result<(), CommandError> {
    if s.state.qps.get(qp)?.qp_type != QpType::Rc {
        return Err(CommandError::Invalid {
            what: "MOVE_QP of a QP that is not RC",
            value: qp.raw().into(),
        });
    }
    let depths = (param.responder_resources, param.initiator_depth);
    for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
        move_qp_to(s, cm, id, qp, state, depths, "CM_ACCEPT moving the QP")?;
    }
    Ok(())
}

/// CM_MOVE_QP: one step of [`move_qp`] on the guest's QP, through one of its ids.
fn move_qp_command(
    s: &mut Session<'_>,
    cm: &dyn HostCm,
    r: &CmMoveQpReq,
) -> Result<(), CommandError> {
    let id = entry(s, r.id.get())?.host;
    // The decoder let only INIT, RTR and RTS through.
    let state = qp_state(r.qp_state.get())?;
    let qp = Handle::from_raw(r.qp.get());
    let depths = (r.responder_resources, r.initiator_depth);
    move_qp_to(s, cm, id, qp, state, depths, "CM_MOVE_QP")
}

/// Moves the guest's QP `qp` to `state` with the attributes the host's CM computes for the
/// host id `id` (in the guest's terms, as CM_INIT_QP_ATTR answers them), RTR's
/// `max_dest_rd_atomic` and RTS's `max_rd_atomic` from `depths` (responder resources,
/// initiator depth) unless 0xff. The step is the guest's MODIFY_QP, with every check it
/// makes (spec §7.4, §12).
fn move_qp_to(
    s: &mut Session<'_>,
    cm: &dyn HostCm,
    id: CmId,
    qp: Handle,
    state: QpState,
    (responder_resources, initiator_depth): (u8, u8),
    what: &'static str,
) -> Result<(), CommandError> {
    let (mut attr, mask) = cm.init_qp_attr(id, state).map_err(host_err(what))?;
    let mask = mask & QpAttrMask::LEGACY_ALL;
    guest_terms(s.guest, &mut attr, mask)?;
    if state == QpState::Rtr && responder_resources != CM_HOST_DEPTH {
        attr.max_dest_rd_atomic = responder_resources;
    }
    if state == QpState::Rts && initiator_depth != CM_HOST_DEPTH {
        attr.max_rd_atomic = initiator_depth;
    }
    super::qp::modify_qp(
        s,
        &ModifyQpReq {
            qp: Le32::new(qp.raw()),
            attr_mask: Le32::new(mask.bits()),
            attr,
        },
    )?;
    Ok(())
}

/// A request's `qp_state` field.
fn qp_state(raw: u32) -> Result<QpState, CommandError> {
    QpState::try_from(raw).map_err(|v| CommandError::Invalid {
        what: "qp_state",
        value: v.into(),
    })
}

fn init_qp_attr(
    s: &mut Session<'_>,
    cm: &dyn HostCm,
    raw: u32,
    state: u32,
) -> Result<CmResponseBody, CommandError> {
    let id = entry(s, raw)?.host;
    let state = qp_state(state)?;
    let (mut attr, mask) = cm
        .init_qp_attr(id, state)
        .map_err(host_err("CM_INIT_QP_ATTR"))?;
    // The host computes only legacy attributes; anything else would be its own business.
    let mask = mask & QpAttrMask::LEGACY_ALL;
    guest_terms(s.guest, &mut attr, mask)?;
    Ok(CmResponseBody::InitQpAttr(CmInitQpAttrResp {
        attr_mask: Le32::new(mask.bits()),
        reserved: Le32::ZERO,
        attr,
    }))
}

/// Turns the host's QP attributes into the guest's (spec §7.5): GID indices through the
/// guest's table, port 1, the access flags of §7.4.
fn guest_terms(
    guest: &GuestShared,
    attr: &mut QpAttr,
    mask: QpAttrMask,
) -> Result<(), CommandError> {
    if mask.contains(QpAttrMask::AV) {
        guest_av(guest, &mut attr.ah_attr)?;
    }
    if mask.contains(QpAttrMask::ALT_PATH) {
        guest_av(guest, &mut attr.alt_ah_attr)?;
        attr.alt_port_num = guest.guest_port(attr.alt_port_num);
    }
    if mask.contains(QpAttrMask::PORT) {
        attr.port_num = guest.guest_port(attr.port_num);
    }
    // rxe adds its FLUSH bits after a request or reply: the guest did not ask for them (a
    // guest's own MODIFY_QP may carry them, §7.4).
    let flush = AccessFlags::FLUSH_GLOBAL | AccessFlags::FLUSH_PERSISTENT;
    let access = attr.qp_access_flags.get() & (AccessFlags::QP_ALLOWED.bits() & !flush.bits());
    attr.qp_access_flags = Le32::new(access);
    Ok(())
}

/// An address vector of the host's in the guest's terms; an error if its source is not the
/// guest's (its ids bind only the guest's addresses, so this would be a host surprise).
pub(crate) fn guest_av(guest: &GuestShared, av: &mut AhAttr) -> Result<(), CommandError> {
    let port = guest.options().host_port;
    if av.port_num != port {
        return Err(CommandError::Host {
            op: "CM address vector",
            source: DeviceError::InvalidReply {
                command: "CM",
                reason: format!("port {} is not the guest's port", av.port_num),
            },
        });
    }
    let index = guest
        .gids()
        .guest_index(&guest.gid_source(), port, av.sgid_index.into())
        .map_err(host_err("reading the GID table"))?
        .and_then(|i| u8::try_from(i).ok())
        .ok_or(CommandError::Host {
            op: "CM address vector",
            source: DeviceError::InvalidReply {
                command: "CM",
                reason: format!("source GID index {} is not the guest's", av.sgid_index),
            },
        })?;
    av.sgid_index = index;
    av.port_num = guest.guest_port(av.port_num);
    Ok(())
}

/// CM_GET_EVENT: the oldest undelivered event, counted as delivered.
fn get_event(cm: &CmIds) -> CmResponseBody {
    let Some(body) = cm.pending.take_oldest() else {
        let mut none = CmEventResp::new_zeroed();
        none.event = Le32::new(CM_EVENT_NONE);
        return CmResponseBody::GetEvent(none);
    };
    CmResponseBody::GetEvent(*body)
}

fn set_option(
    s: &mut Session<'_>,
    cm: &dyn HostCm,
    r: &CmSetOptionReq,
) -> Result<(), CommandError> {
    let id = entry(s, r.id.get())?.host;
    let value = r.value.get();
    // The decoder checked each value's range.
    let byte = u8::try_from(value).unwrap_or(u8::MAX);
    let option = match r.name.get() {
        cm_option::TOS => {
            if !s
                .guest
                .options()
                .identity
                .policy
                .traffic_classes
                .contains(byte)
            {
                return Err(CommandError::Rule {
                    what: "a traffic class outside the guest's policy",
                    status: Status::Invalid,
                });
            }
            CmOption::Tos(byte)
        }
        cm_option::REUSEADDR => CmOption::ReuseAddr(value != 0),
        cm_option::AFONLY => CmOption::AfOnly(value != 0),
        cm_option::ACK_TIMEOUT => CmOption::AckTimeout(byte),
        other => {
            return Err(CommandError::Invalid {
                what: "option name",
                value: other.into(),
            })
        }
    };
    cm.set_option(id, option).map_err(host_err("CM_SET_OPTION"))
}

/// A host socket address in the guest's terms: a link-local IPv6 address with the guest's
/// scope id, any other without one.
pub(crate) fn guest_cm_addr(addr: Option<SocketAddr>, guest_scope: u32) -> CmAddr {
    let Some(mut addr) = addr else {
        return CmAddr::NONE;
    };
    if let SocketAddr::V6(v6) = &mut addr {
        let scope = if v6.ip().is_unicast_link_local() {
            guest_scope
        } else {
            0
        };
        v6.set_scope_id(scope);
    }
    CmAddr::from_socket_addr(&addr)
}

fn query_addr(
    s: &mut Session<'_>,
    cm: &dyn HostCm,
    raw: u32,
) -> Result<CmResponseBody, CommandError> {
    let e = entry(s, raw)?;
    let scope = e.guest_scope;
    let addresses = cm.query_addr(e.host).map_err(host_err("CM_QUERY_ADDR"))?;
    let node_guid = super::query::node_guids(s.guest, &s.guest.limits().attr).0;
    Ok(CmResponseBody::QueryAddr(CmQueryAddrResp {
        src: guest_cm_addr(addresses.src, scope),
        dst: guest_cm_addr(addresses.dst, scope),
        node_guid,
        port_num: GUEST_PORT,
        reserved: 0,
        pkey: Le16::new(0xffff),
        reserved2: Le32::ZERO,
    }))
}

//! The fake host's connection manager: [`FakeCm`] implements the backend's `HostCm` over a
//! [`CmNet`] in the fake device's [`World`], where the ids of every guest of the device meet.
//! It follows the kernel's rules a guest could trip over (ids of another file are EINVAL,
//! link-local binds need the netdev's scope, a bound address and port is EADDRINUSE, a connect
//! to a port nobody listens on is rejected with reason 8, the initiator of a disconnect hears
//! DISCONNECTED once the peer disconnects too, destroying an id ends its connection or rejects
//! its request) and reports events the way ucma does; it never times out.

use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

use vrdma_host as host;
use vrdma_host::cm::*;
use vrdma_spec::cm::{cm_event, cm_port_space};
use vrdma_spec::verbs::{AccessFlags, QpAttrMask, QpState};
use vrdma_spec::wire::{AhAttr, QpAttr};
use vrdma_spec::{Le16, Le32};
use zerocopy::FromZeros;

use super::cm_net::{errno, gid_of, FakeCmId};
pub use super::cm_net::{REJECT_CONSUMER_DEFINED, REJECT_NO_LISTENER, UDP_QKEY};
use super::world::{World, GID0};

/// The interface index of the fake port's netdev: the scope its link-local addresses need.
pub const FAKE_NETDEV_IFINDEX: u32 = 7;
/// What the fake port's GID table holds, for source checks and GID indices.
fn host_index(world: &World, ip: IpAddr) -> Option<u32> {
    let gid = gid_of(ip);
    if gid == GID0 {
        return Some(0);
    }
    world
        .extra_gids
        .iter()
        .find_map(|(i, e)| (e.gid == gid).then_some(*i))
}

/// The fake device's connection manager for one guest context.
pub struct FakeCm {
    file: u64,
    ready: Arc<OwnedFd>,
    world: Arc<Mutex<World>>,
}

impl FakeCm {
    /// Opens a file of the fake CM of `world`.
    pub fn open(world: &Arc<Mutex<World>>) -> FakeCm {
        let (file, ready) = world.lock().unwrap().cm.open_file();
        FakeCm {
            file,
            ready,
            world: Arc::clone(world),
        }
    }

    fn world(&self) -> std::sync::MutexGuard<'_, World> {
        self.world.lock().unwrap()
    }
}

impl Drop for FakeCm {
    fn drop(&mut self) {
        if let Ok(mut w) = self.world.lock() {
            w.cm.close_file(self.file);
        }
    }
}

fn conn_event(p: &ConnParams) -> EventParams {
    EventParams {
        conn: *p,
        ud: UdPeer::NONE,
    }
}

/// The address vector from `from` towards `to`, as the host would give a datagram id.
fn ud_path(world: &World, from: Option<SocketAddr>, to: Option<SocketAddr>) -> AhAttr {
    let mut av = UdPeer::NONE.ah_attr;
    av.is_global = 1;
    av.port_num = 1;
    av.hop_limit = 64;
    av.dgid = to.map_or([0; 16], |a| gid_of(a.ip()));
    av.sgid_index = from
        .and_then(|a| host_index(world, a.ip()))
        .and_then(|i| u8::try_from(i).ok())
        .unwrap_or(0);
    av
}

impl HostCm for FakeCm {
    fn event_fd(&self) -> BorrowedFd<'_> {
        self.ready.as_fd()
    }

    fn create_id(&self, uid: u64, port_space: u16) -> host::Result<CmId> {
        let mut w = self.world();
        w.fail("CM_CREATE_ID")?;
        let id = w.cm.new_id();
        w.cm.ids.insert(
            id,
            FakeCmId {
                file: self.file,
                uid,
                port_space,
                src: None,
                dst: None,
                routed: false,
                listening: false,
                peer: None,
                qp_num: 0,
                peer_qp: None,
                heard_end: false,
                sent_disconnect: false,
                options: Vec::new(),
            },
        );
        Ok(CmId(id))
    }

    fn destroy_id(&self, id: CmId) -> host::Result<()> {
        let mut w = self.world();
        w.cm.own(self.file, id, "CM_DESTROY_ID")?;
        w.cm.destroy(id.0);
        Ok(())
    }

    fn bind(&self, id: CmId, addr: &SocketAddr) -> host::Result<()> {
        let mut w = self.world();
        w.fail("CM_BIND")?;
        let port_space = w.cm.own(self.file, id, "CM_BIND")?.port_space;
        bind_locked(&mut w, self.file, id, port_space, *addr)
    }

    fn resolve_addr(
        &self,
        id: CmId,
        src: Option<&SocketAddr>,
        dst: &SocketAddr,
        _timeout_ms: u32,
    ) -> host::Result<()> {
        let mut w = self.world();
        let e = w.cm.own(self.file, id, "CM_RESOLVE_ADDR")?;
        let (port_space, bound) = (e.port_space, e.src.is_some());
        if !bound {
            // The host's route picks the port's first address of the family.
            let from = match src {
                Some(s) => *s,
                None => match route_source(&w, dst.ip()) {
                    IpAddr::V6(v6) if v6.is_unicast_link_local() => {
                        SocketAddrV6::new(v6, 0, 0, FAKE_NETDEV_IFINDEX).into()
                    }
                    ip => SocketAddr::new(ip, 0),
                },
            };
            bind_locked(&mut w, self.file, id, port_space, from)?;
        }
        let e = w.cm.own(self.file, id, "CM_RESOLVE_ADDR")?;
        e.dst = Some(*dst);
        w.cm.push(id.0, cm_event::ADDR_RESOLVED, 0, EventParams::NONE);
        Ok(())
    }

    fn resolve_route(&self, id: CmId, _timeout_ms: u32) -> host::Result<()> {
        let mut w = self.world();
        let e = w.cm.own(self.file, id, "CM_RESOLVE_ROUTE")?;
        if e.dst.is_none() {
            return Err(errno("CM_RESOLVE_ROUTE", libc::EINVAL));
        }
        e.routed = true;
        w.cm.push(id.0, cm_event::ROUTE_RESOLVED, 0, EventParams::NONE);
        Ok(())
    }

    fn query_addr(&self, id: CmId) -> host::Result<CmAddresses> {
        let mut w = self.world();
        let e = w.cm.own(self.file, id, "CM_QUERY")?;
        Ok(CmAddresses {
            src: e.src,
            dst: e.dst,
        })
    }

    fn listen(&self, id: CmId, _backlog: u32) -> host::Result<()> {
        let mut w = self.world();
        let e = w.cm.own(self.file, id, "CM_LISTEN")?;
        let port_space = e.port_space;
        if e.src.is_none() {
            // The kernel binds the wildcard itself.
            let any = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), 0);
            bind_locked(&mut w, self.file, id, port_space, any)?;
        }
        w.cm.own(self.file, id, "CM_LISTEN")?.listening = true;
        Ok(())
    }

    fn connect(&self, id: CmId, params: &ConnParams) -> host::Result<()> {
        let mut w = self.world();
        w.fail("CM_CONNECT")?;
        let e = w.cm.own(self.file, id, "CM_CONNECT")?;
        if !e.routed || e.peer.is_some() {
            return Err(errno("CM_CONNECT", libc::EINVAL));
        }
        e.qp_num = params.qp_num;
        let (port_space, src, dst) = (e.port_space, e.src, e.dst.expect("routed"));
        let listener = w.cm.ids.iter().find_map(|(&lid, l)| {
            let bound = l.src?;
            (l.listening
                && l.port_space == port_space
                && bound.port() == dst.port()
                && (bound.ip() == dst.ip() || bound.ip().is_unspecified()))
            .then_some((lid, l.file, l.uid))
        });
        let Some((_, file, listener_uid)) = listener else {
            w.cm.push(
                id.0,
                cm_event::REJECTED,
                REJECT_NO_LISTENER,
                EventParams::NONE,
            );
            return Ok(());
        };
        let request = w.cm.new_id();
        let local = SocketAddr::new(dst.ip(), dst.port());
        w.cm.ids.insert(
            request,
            FakeCmId {
                file,
                // The kernel gives a request's id no uid until it is accepted (and drops its
                // events meanwhile).
                uid: 0,
                port_space,
                src: Some(local),
                dst: src,
                routed: true,
                listening: false,
                peer: Some(id.0),
                qp_num: 0,
                peer_qp: Some((params.qp_num, params.initiator_depth)),
                heard_end: false,
                sent_disconnect: false,
                options: Vec::new(),
            },
        );
        w.cm.ids.get_mut(&id.0).expect("present").peer = Some(request);
        let event = if port_space == cm_port_space::UDP {
            EventParams {
                conn: ConnParams::NONE,
                ud: UdPeer {
                    qp_num: params.qp_num,
                    qkey: UDP_QKEY,
                    ah_attr: ud_path(&w, Some(local), src),
                    private_data: params.private_data,
                },
            }
        } else {
            conn_event(params)
        };
        w.cm.push_to(
            file,
            listener_uid,
            request,
            cm_event::CONNECT_REQUEST,
            0,
            event,
        );
        Ok(())
    }

    fn accept(&self, id: CmId, uid: u64, params: Option<&ConnParams>) -> host::Result<()> {
        let mut w = self.world();
        w.fail("CM_ACCEPT")?;
        let e = w.cm.own(self.file, id, "CM_ACCEPT")?;
        let Some(peer) = e.peer else {
            return Err(errno("CM_ACCEPT", libc::EINVAL));
        };
        let Some(params) = params else {
            // The establishing accept of the active side, after CONNECT_RESPONSE.
            if e.peer_qp.is_none() || e.qp_num == 0 {
                return Err(errno("CM_ACCEPT", libc::EINVAL));
            }
            w.cm.push(peer, cm_event::ESTABLISHED, 0, EventParams::NONE);
            return Ok(());
        };
        e.uid = uid;
        e.qp_num = params.qp_num;
        let (port_space, src, dst) = (e.port_space, e.src, e.dst);
        if let Some(p) = w.cm.ids.get_mut(&peer) {
            p.peer_qp = Some((params.qp_num, params.initiator_depth));
        }
        if port_space == cm_port_space::UDP {
            let ud = UdPeer {
                qp_num: params.qp_num,
                qkey: UDP_QKEY,
                ah_attr: ud_path(&w, dst, src),
                private_data: params.private_data,
            };
            let event = EventParams {
                conn: ConnParams::NONE,
                ud,
            };
            w.cm.push(peer, cm_event::ESTABLISHED, 0, event);
        } else {
            w.cm.push(peer, cm_event::CONNECT_RESPONSE, 0, conn_event(params));
        }
        Ok(())
    }

    fn reject(&self, id: CmId, _reason: u8, private_data: &PrivateData) -> host::Result<()> {
        let mut w = self.world();
        let e = w.cm.own(self.file, id, "CM_REJECT")?;
        let Some(peer) = e.peer.take() else {
            return Err(errno("CM_REJECT", libc::EINVAL));
        };
        let mut params = ConnParams::NONE;
        params.private_data = *private_data;
        if let Some(p) = w.cm.ids.get_mut(&peer) {
            p.peer = None;
        }
        w.cm.push(
            peer,
            cm_event::REJECTED,
            REJECT_CONSUMER_DEFINED,
            conn_event(&params),
        );
        Ok(())
    }

    fn disconnect(&self, id: CmId) -> host::Result<()> {
        let mut w = self.world();
        let e = w.cm.own(self.file, id, "CM_DISCONNECT")?;
        let Some(peer) = e.peer else {
            return Err(errno("CM_DISCONNECT", libc::EINVAL));
        };
        if e.sent_disconnect {
            return Ok(());
        }
        e.sent_disconnect = true;
        // A request (or the answer to the peer's): the peer hears DISCONNECTED unless it
        // did already; the initiator hears its own when the peer answers.
        if let Some(p) = w.cm.ids.get_mut(&peer) {
            if !p.heard_end {
                p.heard_end = true;
                w.cm.push(peer, cm_event::DISCONNECTED, 0, EventParams::NONE);
            }
        }
        Ok(())
    }

    fn init_qp_attr(&self, id: CmId, state: QpState) -> host::Result<(QpAttr, QpAttrMask)> {
        let mut w = self.world();
        w.fail("CM_INIT_QP_ATTR")?;
        let e = w.cm.own(self.file, id, "CM_INIT_QP_ATTR")?.clone();
        let mut attr = QpAttr::new_zeroed();
        attr.qp_state = Le32::new(state as u32);
        let ud = e.port_space == cm_port_space::UDP;
        let mask = match state {
            QpState::Init => {
                attr.port_num = 1;
                attr.pkey_index = Le16::new(0);
                if ud {
                    attr.qkey = Le32::new(UDP_QKEY);
                    QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY
                } else {
                    let mut access = AccessFlags::REMOTE_WRITE.bits();
                    if e.peer_qp.is_some_and(|(_, depth)| depth > 0) {
                        // rxe's FLUSH bits come with read and atomic access.
                        access |= AccessFlags::REMOTE_READ.bits()
                            | AccessFlags::REMOTE_ATOMIC.bits()
                            | 0x300;
                    }
                    attr.qp_access_flags = Le32::new(access);
                    QpAttrMask::STATE
                        | QpAttrMask::PKEY_INDEX
                        | QpAttrMask::PORT
                        | QpAttrMask::ACCESS_FLAGS
                }
            }
            QpState::Rtr if ud => QpAttrMask::STATE,
            QpState::Rtr => {
                let Some((peer_qp, _)) = e.peer_qp else {
                    return Err(errno("CM_INIT_QP_ATTR", libc::EINVAL));
                };
                attr.ah_attr = ud_path(&w, e.src, e.dst);
                attr.path_mtu = Le32::new(3);
                attr.dest_qp_num = Le32::new(peer_qp);
                attr.rq_psn = Le32::new(0x1234);
                attr.max_dest_rd_atomic = 1;
                QpAttrMask::STATE
                    | QpAttrMask::AV
                    | QpAttrMask::PATH_MTU
                    | QpAttrMask::DEST_QPN
                    | QpAttrMask::RQ_PSN
                    | QpAttrMask::MAX_DEST_RD_ATOMIC
                    | QpAttrMask::MIN_RNR_TIMER
            }
            QpState::Rts => {
                attr.sq_psn = Le32::new(0x1234);
                if ud {
                    QpAttrMask::STATE | QpAttrMask::SQ_PSN
                } else {
                    attr.timeout = 14;
                    attr.retry_cnt = 7;
                    attr.rnr_retry = 7;
                    attr.max_rd_atomic = 1;
                    QpAttrMask::STATE
                        | QpAttrMask::SQ_PSN
                        | QpAttrMask::TIMEOUT
                        | QpAttrMask::RETRY_CNT
                        | QpAttrMask::RNR_RETRY
                        | QpAttrMask::MAX_QP_RD_ATOMIC
                }
            }
            _ => return Err(errno("CM_INIT_QP_ATTR", libc::EINVAL)),
        };
        Ok((attr, mask))
    }

    fn get_event(&self) -> host::Result<Option<CmEvent>> {
        Ok(self.world().cm.pop(self.file))
    }

    fn set_option(&self, id: CmId, option: CmOption) -> host::Result<()> {
        let mut w = self.world();
        w.cm.own(self.file, id, "CM_SET_OPTION")?
            .options
            .push(option);
        Ok(())
    }

    fn notify(&self, id: CmId, _event: u32) -> host::Result<()> {
        let mut w = self.world();
        w.cm.own(self.file, id, "CM_NOTIFY")?;
        Ok(())
    }
}

/// The host address the fake's routing picks towards `dst`: the port's first entry of its
/// family (link-local for a link-local destination).
fn route_source(world: &World, dst: IpAddr) -> IpAddr {
    let link_local = matches!(dst, IpAddr::V6(v6) if v6.is_unicast_link_local());
    std::iter::once(GID0)
        .chain(world.extra_gids.iter().map(|(_, e)| e.gid))
        .map(|gid| Ipv6Addr::from(gid).to_canonical())
        .find(|ip| {
            ip.is_ipv4() == dst.is_ipv4()
                && matches!(ip, IpAddr::V6(v6) if v6.is_unicast_link_local()) == link_local
        })
        .unwrap_or(Ipv6Addr::from(GID0).into())
}

/// BIND under the world's lock, with the kernel's checks.
fn bind_locked(
    w: &mut World,
    file: u64,
    id: CmId,
    port_space: u16,
    mut addr: SocketAddr,
) -> host::Result<()> {
    if w.cm.own(file, id, "CM_BIND")?.src.is_some() {
        return Err(errno("CM_BIND", libc::EINVAL));
    }
    if let SocketAddr::V6(v6) = addr {
        if v6.ip().is_unicast_link_local() && v6.scope_id() != FAKE_NETDEV_IFINDEX {
            // The kernel needs a scope, and this port's netdev is the only one with it.
            return Err(errno("CM_BIND", libc::EINVAL));
        }
    }
    if !addr.ip().is_unspecified() && host_index(w, addr.ip()).is_none() {
        return Err(errno("CM_BIND", libc::EADDRNOTAVAIL));
    }
    if addr.port() == 0 {
        let port = w.cm.ephemeral_port();
        addr.set_port(port);
    } else if w.cm.port_taken(port_space, &addr) {
        return Err(errno("CM_BIND", libc::EADDRINUSE));
    }
    w.cm.own(file, id, "CM_BIND")?.src = Some(addr);
    w.cm.binds.push((file, addr));
    Ok(())
}

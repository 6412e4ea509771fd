//! CREATE_AH and DESTROY_AH (spec §7.4), and the address-vector checks and translations
//! MODIFY_QP and QUERY_QP share: ports, the guest's own source GIDs and its traffic policy.

use log::{debug, warn};
use vrdma_spec::rxe_v1::RxeAv;
use vrdma_spec::wire::{AhAttr, CreateAhReq, CreateAhResp, GidEntry, HandleReq};
use vrdma_spec::{Le32, ResponseBody};

use super::error::CommandError;
use super::session::{host_err, CommandResult, Session};
use super::unwind::{Undo, Unwind};
use crate::datapath::staging::StagedAh;
use crate::guest::objects::AhEntry;
use crate::guest::shared::GuestShared;
use crate::host::{AhInit, HostContext};
use crate::identity::endpoints::Destination;
use crate::identity::policy::PolicyViolation;
use crate::resources::kind::{ResourceError, ResourceKind};
use crate::resources::table::Handle;

/// `IB_LINK_LAYER_ETHERNET`: RoCE ports, where every address vector needs a GRH.
const LINK_LAYER_ETHERNET: u8 = 2;
/// `RXE_NETWORK_TYPE_IPV4` / `RXE_NETWORK_TYPE_IPV6` of `struct rxe_av`.
const NETWORK_TYPE_IPV4: u8 = 1;
const NETWORK_TYPE_IPV6: u8 = 2;

/// An address vector in the host's terms, and the source GID entry it names.
pub(crate) struct HostAv {
    /// The attributes with the host's port number and GID index.
    pub(crate) attr: AhAttr,
    /// The source GID entry (the guest's own when it has an identity).
    pub(crate) sgid: GidEntry,
}

/// Checks an address vector against the port it names and the guest's identity (spec §7.4
/// AhAttr rules: port; `sgid_index` below the guest's `gid_tbl_len` and naming a populated
/// entry of the guest's GID table; GRH on RoCE; traffic class, SL and destination within the
/// guest's policy, spec §12) and returns a copy in the host's terms (host port number, host
/// GID index looked up now by the entry's GID and type).
pub(crate) fn ah_attr_to_host(
    guest: &GuestShared,
    a: &AhAttr,
    what: &'static str,
) -> Result<HostAv, CommandError> {
    let port = guest
        .host_port(a.port_num.into())
        .ok_or(CommandError::Invalid {
            what,
            value: a.port_num.into(),
        })?;
    let port_attr = guest.port_limits();
    let gids = guest.gids();
    let found = if u32::from(a.sgid_index) < gids.table_len(port_attr.gid_tbl_len) {
        gids.entry(&guest.gid_source(), port, a.sgid_index.into())
            .map_err(host_err("GID table"))?
    } else {
        None
    };
    // The host index must also lie in the host's table (a virtual slot always maps into it).
    let Some((host_index, sgid)) = found.filter(|(i, _)| *i < port_attr.gid_tbl_len) else {
        return Err(CommandError::Invalid {
            what: "sgid_index",
            value: a.sgid_index.into(),
        });
    };
    let host_index = u8::try_from(host_index).map_err(|_| CommandError::Invalid {
        what: "sgid_index (host entry beyond 255)",
        value: host_index.into(),
    })?;
    if port_attr.link_layer == LINK_LAYER_ETHERNET && a.is_global == 0 {
        return Err(CommandError::Invalid {
            what: "is_global (RoCE needs a GRH)",
            value: 0,
        });
    }
    guest
        .options()
        .identity
        .policy
        .check(a.traffic_class, a.sl, &a.dgid)
        .map_err(|violation| policy_error(guest, violation))?;
    let mut attr = *a;
    attr.port_num = port;
    attr.sgid_index = host_index;
    Ok(HostAv { attr, sgid })
}

/// Fails if the source GID entry `host` was translated to is no longer where it was: the
/// host's GID table changed between the translation and the host command that used it (the
/// kernel resolved the index when the command ran), so the host object may send from an
/// address that is not the guest's.
pub(crate) fn check_source_unchanged(
    guest: &GuestShared,
    requested: &AhAttr,
    host: &HostAv,
    what: &'static str,
) -> Result<(), CommandError> {
    let now = ah_attr_to_host(guest, requested, what)?;
    if now.attr.sgid_index == host.attr.sgid_index && now.sgid.gid == host.sgid.gid {
        return Ok(());
    }
    warn!(
        "guest {}: the host's GID table changed under a command (source entry {} moved)",
        guest.options().identity.name,
        host.attr.sgid_index
    );
    Err(CommandError::Invalid {
        what: "sgid_index (the host's GID table changed during the command)",
        value: requested.sgid_index.into(),
    })
}

/// Where `dgid` leads (spec §12.1): an address of another tenant, one of the host's own, or
/// another machine.
pub(crate) fn destination(
    guest: &GuestShared,
    dgid: &[u8; 16],
) -> Result<Destination, CommandError> {
    let local = guest
        .device()
        .delivers_locally(dgid)
        .map_err(host_err("local address lookup"))?;
    Ok(guest.tenant().classify(dgid, local))
}

/// Refuses a path or send from this guest to QP number `qpn` at `dgid` unless that QP is
/// reachable there: through a tenant's address only its own QPs, through the host's addresses
/// only QPs of no tenant (rxe delivers local packets by QP number alone).
pub(crate) fn check_reach(
    guest: &GuestShared,
    dgid: &[u8; 16],
    qpn: u32,
) -> Result<(), CommandError> {
    let destination = destination(guest, dgid)?;
    if guest.tenant().allows(destination, qpn) {
        return Ok(());
    }
    debug!(
        "guest {}: QP {qpn:#x} is not reachable at {} ({destination:?})",
        guest.options().identity.name,
        std::net::Ipv6Addr::from(*dgid)
    );
    Err(CommandError::Invalid {
        what: "dest_qp_num (not a QP of the destination address's tenant)",
        value: qpn.into(),
    })
}

/// The command error of a policy violation; the log line names the guest's rule.
fn policy_error(guest: &GuestShared, violation: PolicyViolation) -> CommandError {
    let name = &guest.options().identity.name;
    match violation {
        PolicyViolation::TrafficClass(tc) => CommandError::Invalid {
            what: "traffic_class (not allowed for this guest)",
            value: tc.into(),
        },
        PolicyViolation::ServiceLevel(sl) => CommandError::Invalid {
            what: "sl (not allowed for this guest)",
            value: sl.into(),
        },
        PolicyViolation::Destination(dgid) => {
            debug!(
                "guest {name}: destination {} is outside its allowed prefixes",
                std::net::Ipv6Addr::from(dgid)
            );
            CommandError::Invalid {
                what: "dgid (outside the guest's allowed destinations)",
                value: u128::from_be_bytes(dgid) as u64,
            }
        }
    }
}

/// The guest's view of a host address vector: guest port number and the guest's index of
/// its source GID. An address vector whose source entry is not the guest's (the QP was never
/// given a path, or the entry left the host table since) reports index 0.
pub(crate) fn ah_attr_to_guest(guest: &GuestShared, a: &AhAttr) -> Result<AhAttr, CommandError> {
    let mut attr = *a;
    attr.port_num = guest.guest_port(a.port_num);
    if attr.port_num == 0 {
        // No path (the host reports port 0) or one on a port the guest does not see.
        attr.sgid_index = 0;
        return Ok(attr);
    }
    let index = guest
        .gids()
        .guest_index(&guest.gid_source(), a.port_num, a.sgid_index.into())
        .map_err(host_err("GID table"))?;
    attr.sgid_index = index.and_then(|i| u8::try_from(i).ok()).unwrap_or(0);
    Ok(attr)
}

/// CREATE_AH: PD, address vector, quota, host AH.
pub(crate) fn create_ah(s: &mut Session<'_>, r: &CreateAhReq) -> CommandResult {
    let pd = Handle::from_raw(r.pd.get());
    let pd_host = s.state.pds.get(pd)?.host;
    let host_av = ah_attr_to_host(s.guest, &r.ah_attr, "ah_attr.port_num")?;
    let HostAv { attr, sgid } = host_av;
    s.state.ahs.check_room(0)?;
    // Destroyed AHs the host still holds for the guest's sends count against its quota: a
    // guest cannot make the host hold AHs without bound.
    let lingering = s.guest.doorbells().lock().staging().lingering_ahs();
    if s.state.ahs.len() + lingering >= s.state.ahs.limit() as usize {
        return Err(ResourceError::Quota {
            kind: ResourceKind::Ah,
            limit: s.state.ahs.limit(),
        }
        .into());
    }
    // Fails early on a host that cannot list its addresses; staged sends classify the
    // destination again when they go.
    destination(s.guest, &attr.dgid)?;
    let mut c = Unwind::new(s);
    c.take_ref(|s| s.state.pds.acquire(pd), Undo::PdRef(pd))?;
    let ah = c
        .host()
        .create_ah(&AhInit {
            pd: pd_host,
            attr,
            user_handle: 0,
        })
        .map_err(host_err("CREATE_AH"))?;
    c.did(Undo::HostAh(ah.handle));
    check_source_unchanged(c.guest, &r.ah_attr, &host_av, "ah_attr.port_num")?;
    if ah.ah_num == 0 {
        return Err(CommandError::HostAnswer(
            "the host returned ah_num 0".into(),
        ));
    }
    let handle = c.state.ahs.insert(AhEntry {
        host: ah.handle,
        pd,
    })?;
    c.commit();
    // Staged UD sends (spec §9.6) name it by handle from now on.
    s.guest.doorbells().lock().staging().ahs_mut().insert(
        handle,
        StagedAh {
            pd,
            ah_num: ah.ah_num,
            dgid: attr.dgid,
        },
    );
    // The AV the guest sees names its own GID index (as QUERY_GID numbers it).
    let mut guest_attr = attr;
    guest_attr.sgid_index = r.ah_attr.sgid_index;
    Ok(ResponseBody::CreateAh(CreateAhResp {
        ah: Le32::new(handle.raw()),
        ah_num: Le32::new(ah.ah_num),
        av: rxe_av(&guest_attr, &sgid.gid),
    }))
}

/// DESTROY_AH.
pub(crate) fn destroy_ah(s: &mut Session<'_>, r: &HandleReq) -> CommandResult {
    let handle = Handle::from_raw(r.handle.get());
    let host = s.state.ahs.get(handle)?.host;
    // No staged WQE may be translated to its host number once the host may reuse it, and
    // the host keeps the number while WQEs forwarded through it may wait (spec §9.6).
    let mut doorbells = s.guest.doorbells().lock();
    let staging = doorbells.staging();
    let staged = staging.ahs_mut().remove(handle);
    if let Err(e) = staging.destroy_ah(host, s.guest.host()) {
        if let Some(staged) = staged {
            staging.ahs_mut().insert(handle, staged);
        }
        return Err(host_err("DESTROY_AH")(e));
    }
    drop(doorbells);
    let entry = s.state.ahs.remove(handle)?;
    if let Err(e) = s.state.pds.release(entry.pd) {
        warn!("AH bookkeeping: {e}");
    }
    Ok(ResponseBody::Empty)
}

/// Destroys an AH whose table entry is gone (teardown).
pub(crate) fn release(host: &dyn HostContext, handle: Handle, entry: AhEntry) {
    if let Err(e) = host.destroy_ah(entry.host) {
        warn!("destroying AH {handle} (host {}) failed: {e}", entry.host);
    }
}

/// Whether a GID is an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`), i.e. RoCE v2 over IPv4.
fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// A `struct sockaddr_in` / `sockaddr_in6` for a GID, as rdma-core's `rdma_gid2ip` builds it.
fn gid_sockaddr(gid: &[u8; 16]) -> [u8; 28] {
    let mut addr = [0u8; 28];
    if is_ipv4_mapped(gid) {
        addr[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        addr[4..8].copy_from_slice(&gid[12..]);
    } else {
        addr[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        addr[8..24].copy_from_slice(gid);
    }
    addr
}

/// The `struct rxe_av` of an address vector, as far as it follows from the attributes: every
/// field except `dmac`, which the host kernel resolves privately and does not return.
fn rxe_av(attr: &AhAttr, sgid: &[u8; 16]) -> RxeAv {
    RxeAv {
        port_num: attr.port_num,
        network_type: if is_ipv4_mapped(&attr.dgid) {
            NETWORK_TYPE_IPV4
        } else {
            NETWORK_TYPE_IPV6
        },
        dmac: [0; 6],
        dgid: attr.dgid,
        flow_label: attr.flow_label,
        sgid_index: attr.sgid_index,
        hop_limit: attr.hop_limit,
        traffic_class: attr.traffic_class,
        pad: 0,
        sgid_addr: gid_sockaddr(sgid),
        dgid_addr: gid_sockaddr(&attr.dgid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_addresses_follow_rdma_gid2ip() {
        let mut v4 = [0u8; 16];
        v4[10] = 0xff;
        v4[11] = 0xff;
        v4[12..].copy_from_slice(&[192, 168, 1, 2]);
        let a = gid_sockaddr(&v4);
        assert_eq!(u16::from_ne_bytes([a[0], a[1]]), libc::AF_INET as u16);
        assert_eq!(&a[4..8], &[192, 168, 1, 2]);
        let mut v6 = [0u8; 16];
        v6[0] = 0xfe;
        v6[1] = 0x80;
        v6[15] = 1;
        let a = gid_sockaddr(&v6);
        assert_eq!(u16::from_ne_bytes([a[0], a[1]]), libc::AF_INET6 as u16);
        assert_eq!(&a[8..24], &v6);
        let attr = AhAttr {
            dgid: v4,
            port_num: 1,
            ..AhAttr::default()
        };
        assert_eq!(rxe_av(&attr, &v6).network_type, NETWORK_TYPE_IPV4);
    }
}

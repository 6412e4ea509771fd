//! CREATE_AH and DESTROY_AH (spec §7.4), and the address-vector checks MODIFY_QP shares.

use log::warn;
use vrdma_spec::rxe_v1::RxeAv;
use vrdma_spec::wire::{AhAttr, CreateAhReq, CreateAhResp, HandleReq};
use vrdma_spec::{Le32, ResponseBody};

use super::error::CommandError;
use super::session::{host_err, CommandResult, Session};
use crate::datapath::ud_staging::StagedAh;
use crate::guest::objects::AhEntry;
use crate::guest::shared::GuestShared;
use crate::host::{AhHandle, AhInit, HostContext};
use crate::resources::table::Handle;

/// `IB_LINK_LAYER_ETHERNET`: RoCE ports, where every address vector needs a GRH.
const LINK_LAYER_ETHERNET: u8 = 2;
/// `RXE_NETWORK_TYPE_IPV4` / `RXE_NETWORK_TYPE_IPV6` of `struct rxe_av`.
const NETWORK_TYPE_IPV4: u8 = 1;
const NETWORK_TYPE_IPV6: u8 = 2;

/// Checks an address vector against the port it names (spec §7.4 AhAttr rules: port,
/// `sgid_index` below the table length and naming a populated entry, GRH on RoCE) and
/// returns a copy in the host's terms (host port number).
pub(crate) fn ah_attr_to_host(
    guest: &GuestShared,
    a: &AhAttr,
    what: &'static str,
) -> Result<AhAttr, CommandError> {
    let port = guest
        .host_port(a.port_num.into())
        .ok_or(CommandError::Invalid {
            what,
            value: a.port_num.into(),
        })?;
    let port_attr = guest
        .host()
        .query_port(port)
        .map_err(host_err("QUERY_PORT"))?;
    let gid_valid = u32::from(a.sgid_index) < port_attr.gid_tbl_len
        && guest
            .device()
            .gid_entry(port, a.sgid_index.into())
            .map_err(host_err("GID table"))?
            .is_some();
    if !gid_valid {
        return Err(CommandError::Invalid {
            what: "sgid_index",
            value: a.sgid_index.into(),
        });
    }
    if port_attr.link_layer == LINK_LAYER_ETHERNET && a.is_global == 0 {
        return Err(CommandError::Invalid {
            what: "is_global (RoCE needs a GRH)",
            value: 0,
        });
    }
    Ok(a.with_port_num(port))
}

/// The guest's view of a host address vector (guest port number).
pub(crate) fn ah_attr_to_guest(guest: &GuestShared, a: &AhAttr) -> AhAttr {
    a.with_port_num(guest.guest_port(a.port_num))
}

/// CREATE_AH: PD, address vector, quota, host AH.
pub(crate) fn create_ah(s: &mut Session<'_>, r: &CreateAhReq) -> CommandResult {
    let pd = Handle::from_raw(r.pd.get());
    let pd_host = s.state.pds.get(pd)?.host;
    let attr = ah_attr_to_host(s.guest, &r.ah_attr, "ah_attr.port_num")?;
    s.state.ahs.check_room(0)?;
    let ah = s
        .host()
        .create_ah(&AhInit {
            pd: pd_host,
            attr,
            user_handle: 0,
        })
        .map_err(host_err("CREATE_AH"))?;
    if ah.ah_num == 0 {
        destroy_host(s.host(), ah.handle);
        return Err(CommandError::Geometry("the host returned ah_num 0".into()));
    }
    let handle = match s.state.ahs.insert(AhEntry {
        host: ah.handle,
        pd,
    }) {
        Ok(handle) => handle,
        Err(e) => {
            destroy_host(s.host(), ah.handle);
            return Err(e.into());
        }
    };
    if let Err(e) = s.state.pds.acquire(pd) {
        if let Ok(entry) = s.state.ahs.remove(handle) {
            release(s.host(), handle, entry);
        }
        return Err(e.into());
    }
    // Staged UD sends (spec §9.6) name it by handle from now on.
    s.guest.doorbells().lock().ud_staging().ahs_mut().insert(
        handle,
        StagedAh {
            pd,
            ah_num: ah.ah_num,
        },
    );
    let sgid = s
        .guest
        .device()
        .gid_entry(attr.port_num, attr.sgid_index.into())
        .ok()
        .flatten()
        .map_or([0; 16], |e| e.gid);
    Ok(ResponseBody::CreateAh(CreateAhResp {
        ah: Le32::new(handle.raw()),
        ah_num: Le32::new(ah.ah_num),
        av: rxe_av(&attr, &sgid),
    }))
}

/// DESTROY_AH.
pub(crate) fn destroy_ah(s: &mut Session<'_>, r: &HandleReq) -> CommandResult {
    let handle = Handle::from_raw(r.handle.get());
    let host = s.state.ahs.get(handle)?.host;
    // No staged WQE may be translated to its host number once the host may reuse it.
    let staged = s
        .guest
        .doorbells()
        .lock()
        .ud_staging()
        .ahs_mut()
        .remove(handle);
    if let Err(e) = s.host().destroy_ah(host) {
        if let Some(staged) = staged {
            let mut doorbells = s.guest.doorbells().lock();
            doorbells.ud_staging().ahs_mut().insert(handle, staged);
        }
        return Err(host_err("DESTROY_AH")(e));
    }
    let entry = s.state.ahs.remove(handle)?;
    if let Err(e) = s.state.pds.release(entry.pd) {
        warn!("AH bookkeeping: {e}");
    }
    Ok(ResponseBody::Empty)
}

fn destroy_host(host: &dyn HostContext, ah: AhHandle) {
    if let Err(e) = host.destroy_ah(ah) {
        warn!("destroying host AH {ah} failed: {e}");
    }
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

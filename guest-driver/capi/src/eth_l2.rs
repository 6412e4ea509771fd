//! `ibv_resolve_eth_l2_from_gid`: the Ethernet address a RoCE destination GID is reached at.
//!
//! rdma-core finds the host netdev holding the source GID's IP address, looks the destination
//! up in that netdev's neighbour table (sending a neighbour solicitation if needed) and reports
//! the netdev's VLAN id. A guest has none of that: the netdev of the host's RDMA device lives
//! on the host. What can be answered without it is answered exactly as rdma-core's encoded
//! addresses are (rdma-core answers these without the neighbour table too):
//!
//! - IPv4 multicast (224.0.0.0/4, as `::ffff:a.b.c.d` or `ff0e::ffff:a.b.c.d`):
//!   `01:00:5e` and the address's low 23 bits (RFC 1112);
//! - IPv6 multicast (`ff00::/8`): `33:33` and the address's last 32 bits (RFC 2464);
//! - IPv6 link-local (`fe80::/64`) with a modified EUI-64 interface id (`…:xxff:fexx:…`, the
//!   form of RoCE's default GIDs): the MAC it was made from, universal/local bit flipped back
//!   (RFC 4291). rdma-core derives a MAC from any `fe80::/64` address; one whose interface id
//!   is not EUI-64 (stable-privacy or random) names no MAC, and this library refuses it.
//!
//! Every other destination needs a neighbour table: `-EINVAL`, which is what rdma-core returns
//! when it finds no interface for the source address. The VLAN id is reported as 0xffff ("not
//! a VLAN device", rdma-core's value then): vrdma's GID entries do not say whether the host's
//! netdev is a VLAN device. As in rdma-core, the result is a negative errno value.

use std::ffi::c_int;

use crate::context::VrdmaContext;
use crate::ffi::guard;
use crate::gid_table::{gid_slot, GidSlot};
use crate::sys::{ibv_ah_attr, ibv_context};

/// `ETHERNET_LL_SIZE` of `<infiniband/verbs.h>`.
const ETHERNET_LL_SIZE: usize = 6;
/// The VLAN id rdma-core reports for a netdev that is not a VLAN device.
const NO_VLAN: u16 = 0xffff;

/// An IPv4 address as a GID encodes it, if it does: IPv4-mapped (`::ffff:a.b.c.d`) or the
/// IPv4 multicast encoding (`ff0e::ffff:a.b.c.d`), as rdma-core's `ipv6_addr_v4mapped`.
fn ipv4_of(gid: &[u8; 16]) -> Option<[u8; 4]> {
    let prefix_mapped = gid[..10].iter().all(|&b| b == 0);
    let prefix_mcast = gid[..2] == [0xff, 0x0e] && gid[2..10].iter().all(|&b| b == 0);
    let ipv4 = [gid[12], gid[13], gid[14], gid[15]];
    ((prefix_mapped || prefix_mcast) && gid[10..12] == [0xff, 0xff]).then_some(ipv4)
}

/// The MAC of `dgid` seen from `sgid`, or the negative errno value rdma-core would return.
fn resolve(sgid: &[u8; 16], dgid: &[u8; 16]) -> Result<[u8; ETHERNET_LL_SIZE], c_int> {
    match (ipv4_of(sgid), ipv4_of(dgid)) {
        (Some(_), Some(ip)) if ip[0] & 0xf0 == 0xe0 => {
            Ok([0x01, 0x00, 0x5e, ip[1] & 0x7f, ip[2], ip[3]])
        }
        (None, None) if dgid[0] == 0xff => Ok([0x33, 0x33, dgid[12], dgid[13], dgid[14], dgid[15]]),
        (None, None)
            if dgid[..8] == [0xfe, 0x80, 0, 0, 0, 0, 0, 0] && dgid[11..13] == [0xff, 0xfe] =>
        {
            Ok([
                dgid[8] ^ 0x02,
                dgid[9],
                dgid[10],
                dgid[13],
                dgid[14],
                dgid[15],
            ])
        }
        // Unicast, or source and destination of different families: a neighbour table (or a
        // route between the families) on a netdev this guest does not have.
        _ => Err(-libc::EINVAL),
    }
}

/// `ibv_resolve_eth_l2_from_gid` (IBVERBS_1.1): 0 with the MAC in `eth_mac` and 0xffff in
/// `*vid` (if not NULL), or a negative errno value (see the module documentation); -1 when
/// the source GID cannot be queried, as rdma-core's `ibv_query_gid` failure.
///
/// # Safety
/// `context` is a context of this library; `attr` points to an `ibv_ah_attr`; `eth_mac` to
/// 6 writable bytes; `vid` is NULL or writable.
pub unsafe extern "C" fn ibv_resolve_eth_l2_from_gid(
    context: *mut ibv_context,
    attr: *mut ibv_ah_attr,
    eth_mac: *mut u8,
    vid: *mut u16,
) -> c_int {
    guard("ibv_resolve_eth_l2_from_gid", -libc::EIO, || {
        // SAFETY: caller contract.
        let Some(ctx) = (unsafe { VrdmaContext::from_ptr(context) }) else {
            return -libc::EINVAL;
        };
        // SAFETY: caller contract.
        let Some(attr) = (unsafe { attr.as_ref() }) else {
            return -libc::EINVAL;
        };
        if eth_mac.is_null() {
            return -libc::EINVAL;
        }
        let verb = "ibv_resolve_eth_l2_from_gid";
        let sgid = match gid_slot(&ctx.ctx, attr.port_num, attr.grh.sgid_index.into(), verb) {
            Ok(GidSlot::Populated(entry)) => entry.gid,
            // An empty entry has no address, so no interface either.
            Ok(GidSlot::Empty) => return -libc::EINVAL,
            // rdma-core returns what its ibv_query_gid did: -1 and errno.
            Ok(GidSlot::OutOfRange) => {
                crate::ffi::set_errno(libc::EINVAL);
                return -1;
            }
            Err(errno) => {
                crate::ffi::set_errno(errno);
                return -1;
            }
        };
        // SAFETY: every bit pattern of the 16-byte union is a valid `raw`.
        let dgid = unsafe { attr.grh.dgid.raw };
        match resolve(&sgid, &dgid) {
            Ok(mac) => {
                // SAFETY: caller contract: 6 writable bytes.
                unsafe { std::ptr::copy_nonoverlapping(mac.as_ptr(), eth_mac, mac.len()) };
                if !vid.is_null() {
                    // SAFETY: caller contract.
                    unsafe { vid.write(NO_VLAN) };
                }
                0
            }
            Err(errno) => errno,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid(text: &str) -> [u8; 16] {
        text.parse::<std::net::Ipv6Addr>().unwrap().octets()
    }

    #[test]
    fn multicast_destinations_map_per_rfc_1112_and_2464() {
        let v4 = gid("::ffff:192.168.1.5");
        assert_eq!(
            resolve(&v4, &gid("::ffff:239.129.2.3")),
            Ok([0x01, 0x00, 0x5e, 0x01, 0x02, 0x03]),
            "the 24th bit from the end is dropped"
        );
        assert_eq!(
            resolve(&v4, &gid("ff0e::ffff:224.0.0.251")),
            Ok([0x01, 0x00, 0x5e, 0x00, 0x00, 0xfb])
        );
        let v6 = gid("fe80::5054:ff:fe12:3456");
        assert_eq!(
            resolve(&v6, &gid("ff02::1:ff12:3456")),
            Ok([0x33, 0x33, 0xff, 0x12, 0x34, 0x56])
        );
    }

    #[test]
    fn eui64_link_local_destinations_give_back_their_mac() {
        let v6 = gid("fe80::1");
        assert_eq!(
            resolve(&v6, &gid("fe80::5054:ff:fe12:3456")),
            Ok([0x52, 0x54, 0x00, 0x12, 0x34, 0x56])
        );
        // A stable-privacy interface id names no MAC.
        assert_eq!(
            resolve(&v6, &gid("fe80::1c2d:3e4f:5a6b:7c8d")),
            Err(-libc::EINVAL)
        );
        // Not link-local: fe80:1::/64 is outside fe80::/64.
        assert_eq!(
            resolve(&v6, &gid("fe80:1::5054:ff:fe12:3456")),
            Err(-libc::EINVAL)
        );
    }

    #[test]
    fn unicast_and_mixed_families_need_a_neighbour_table() {
        let v4 = gid("::ffff:10.0.0.1");
        let v6 = gid("2001:db8::1");
        assert_eq!(resolve(&v4, &gid("::ffff:10.0.0.2")), Err(-libc::EINVAL));
        assert_eq!(resolve(&v6, &gid("2001:db8::2")), Err(-libc::EINVAL));
        assert_eq!(resolve(&v6, &gid("::ffff:239.1.1.1")), Err(-libc::EINVAL));
        assert_eq!(resolve(&v4, &gid("ff02::1")), Err(-libc::EINVAL));
    }

    #[test]
    fn null_arguments_are_refused() {
        let mut mac = [0u8; 6];
        // SAFETY: NULL context and attribute pointers are refused before any use.
        let rc = unsafe {
            ibv_resolve_eth_l2_from_gid(
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                mac.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(rc, -libc::EINVAL);
    }
}

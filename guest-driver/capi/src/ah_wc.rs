//! Address handles that answer a received UD message: `ibv_init_ah_from_wc` and
//! `ibv_create_ah_from_wc`.
//!
//! On RoCE v2 the 40 bytes in front of a UD receive hold the packet's network header: an
//! IPv6 header, or an IPv4 header in the last 20 bytes. The reply goes back to the source
//! address, from the local GID the message was sent to, with the traffic class, flow label
//! and hop limit it arrived with (as rdma-core's libibverbs does).

use std::ffi::c_int;

use vrdma::verbs::{AhAttr, Gid, GidType, GlobalRoute};
use vrdma::Context;

use crate::context::VrdmaContext;
use crate::ffi::{guard, minus_one, null_with, report};
use crate::objects::{ah_attr_to, ibv_create_ah, VrdmaPd};
use crate::sys::{
    ibv_ah, ibv_ah_attr, ibv_context, ibv_grh, ibv_pd, ibv_wc, ibv_wc_flags_IBV_WC_GRH,
};

/// IPv6 next header of RoCE v2 (UDP) and of RoCE v1 / InfiniBand (BTH).
const NEXT_HEADER_UDP: u8 = 17;
const NEXT_HEADER_BTH: u8 = 0x1b;

/// Size of the network header area in front of a UD receive (`struct ibv_grh`).
const GRH_LEN: usize = 40;

/// Where the IPv4 header sits in that area when RoCE v2 runs over IPv4.
const IPV4_OFFSET: usize = 20;

/// Addresses and flow of a received packet's network header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ReceivedRoute {
    /// Source address (the peer's GID).
    source: Gid,
    /// Destination address (one of our GIDs).
    destination: Gid,
    traffic_class: u8,
    flow_label: u32,
    hop_limit: u8,
    /// GID types the destination may have in our table.
    gid_types: &'static [GidType],
}

/// The GID form of an IPv4 address (`::ffff:a.b.c.d`).
fn ipv4_mapped(addr: &[u8]) -> Gid {
    let mut gid = [0u8; 16];
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12..].copy_from_slice(addr);
    Gid(gid)
}

/// Whether `header` (20 bytes) has a correct IPv4 header checksum.
fn ipv4_checksum_ok(header: &[u8]) -> bool {
    let mut sum: u32 = header
        .chunks_exact(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum == 0xffff
}

/// Reads the network header of a receive. Both header kinds may look plausible (the IPv6
/// version nibble is the first byte of the area, the IPv4 header its second half): an IPv4
/// header with five words and a correct checksum wins, as in rdma-core. An errno value if
/// neither is present, or the packet went to a multicast address (not in the GID table).
fn parse_header(area: &[u8; GRH_LEN]) -> Result<ReceivedRoute, c_int> {
    let ipv4 = &area[IPV4_OFFSET..];
    let ipv6_version = area[0] >> 4;
    let ipv4_version = ipv4[0] >> 4;
    let ipv4_words = ipv4[0] & 0xf;
    let is_ipv4 = if ipv6_version != 6 {
        ipv4_version == 4
    } else {
        ipv4_version == 4 && ipv4_words == 5 && ipv4_checksum_ok(ipv4)
    };
    if is_ipv4 {
        // Class D (224.0.0.0/4): multicast.
        if ipv4[16] >> 4 == 0xe {
            return Err(libc::EINVAL);
        }
        return Ok(ReceivedRoute {
            source: ipv4_mapped(&ipv4[12..16]),
            destination: ipv4_mapped(&ipv4[16..20]),
            traffic_class: ipv4[1],
            flow_label: 0,
            hop_limit: ipv4[8],
            gid_types: &[GidType::RoceV2],
        });
    }
    if ipv6_version != 6 {
        return Err(libc::EPROTONOSUPPORT);
    }
    // An IPv6 header, or an InfiniBand GRH, which has the same layout.
    let gid_types: &[GidType] = match area[6] {
        NEXT_HEADER_UDP => &[GidType::RoceV2],
        NEXT_HEADER_BTH => &[GidType::Ib, GidType::RoceV1],
        _ => return Err(libc::EPROTONOSUPPORT),
    };
    if area[24] == 0xff {
        return Err(libc::EINVAL);
    }
    let word = u32::from_be_bytes([area[0], area[1], area[2], area[3]]);
    let gid = |at: usize| {
        let mut g = [0u8; 16];
        g.copy_from_slice(&area[at..at + 16]);
        Gid(g)
    };
    Ok(ReceivedRoute {
        source: gid(8),
        destination: gid(24),
        traffic_class: (word >> 20) as u8,
        flow_label: word & 0xf_ffff,
        hop_limit: area[7],
        gid_types,
    })
}

/// The index of `gid` with one of `gid_types` in the GID table of `port`.
fn find_gid_index(ctx: &Context, port: u8, gid: Gid, gid_types: &[GidType]) -> Result<u8, c_int> {
    // The populated entries from the context's GID table cache (read in a few commands), by
    // increasing index: the first match is the one rdma-core's entry-by-entry search finds.
    let table = ctx
        .gid_table(port)
        .map_err(|e| report("ibv_init_ah_from_wc", &e))?;
    table
        .populated()
        .iter()
        .find(|(_, entry)| {
            Gid(entry.gid) == gid && entry.gid_type().is_ok_and(|t| gid_types.contains(&t))
        })
        // sgid_index is a u8: entries beyond 255 cannot be named in an address handle.
        .and_then(|(index, _)| u8::try_from(*index).ok())
        .ok_or(libc::ENOENT)
}

/// The address vector answering `wc` (received on `port` with network header `grh`).
fn ah_from_wc(
    ctx: &Context,
    port: u8,
    wc: &ibv_wc,
    grh: Option<&ibv_grh>,
) -> Result<AhAttr, c_int> {
    let attr = AhAttr::default()
        .with_dlid(wc.slid)
        .with_sl(wc.sl)
        .with_src_path_bits(wc.dlid_path_bits)
        .with_static_rate(0)
        .with_port_num(port);
    if wc.wc_flags & ibv_wc_flags_IBV_WC_GRH == 0 {
        return Ok(attr);
    }
    let grh = grh.ok_or(libc::EINVAL)?;
    // SAFETY: `ibv_grh` is 40 plain bytes without padding (checked below at compile time).
    let area = unsafe { &*(grh as *const ibv_grh).cast::<[u8; GRH_LEN]>() };
    let route = parse_header(area)?;
    let sgid_index = find_gid_index(ctx, port, route.destination, route.gid_types)?;
    Ok(attr.with_grh(GlobalRoute {
        dgid: route.source,
        flow_label: route.flow_label,
        sgid_index,
        hop_limit: route.hop_limit,
        traffic_class: route.traffic_class,
    }))
}

const _: () = assert!(std::mem::size_of::<ibv_grh>() == GRH_LEN);

/// `ibv_init_ah_from_wc`: 0, or -1 with errno.
///
/// # Safety
/// `context` is a context of this library; `wc` is valid for a read, `grh` NULL or valid for
/// a read, `ah_attr` valid for a write.
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    guard("ibv_init_ah_from_wc", -1, || {
        // SAFETY: caller contract.
        let (Some(ctx), Some(wc)) = (unsafe { (VrdmaContext::from_ptr(context), wc.as_ref()) })
        else {
            return minus_one(libc::EINVAL);
        };
        if ah_attr.is_null() {
            return minus_one(libc::EINVAL);
        }
        // SAFETY: caller contract.
        let grh = unsafe { grh.as_ref() };
        match ah_from_wc(&ctx.ctx, port_num, wc, grh) {
            Ok(attr) => {
                // SAFETY: caller contract.
                unsafe { ah_attr.write(ah_attr_to(&attr)) };
                0
            }
            Err(errno) => minus_one(errno),
        }
    })
}

/// `ibv_create_ah_from_wc`: an address handle answering `wc`, or NULL with errno.
///
/// # Safety
/// `pd` is a PD of this library; `wc` is valid for a read, `grh` NULL or valid for a read.
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port_num: u8,
) -> *mut ibv_ah {
    guard("ibv_create_ah_from_wc", std::ptr::null_mut(), || {
        // SAFETY: caller contract.
        let (Some(vpd), Some(wc)) = (unsafe { (VrdmaPd::from_ptr(pd), wc.as_ref()) }) else {
            return null_with("ibv_create_ah_from_wc", libc::EINVAL);
        };
        // SAFETY: caller contract.
        let grh = unsafe { grh.as_ref() };
        match ah_from_wc(&vpd.context().ctx, port_num, wc, grh) {
            Ok(attr) => {
                let mut attr = ah_attr_to(&attr);
                // SAFETY: `pd` is a PD of this library; `attr` is a valid local.
                unsafe { ibv_create_ah(pd, &mut attr) }
            }
            Err(errno) => null_with("ibv_create_ah_from_wc", errno),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipv6_area(tclass: u8, flow: u32, src: [u8; 16], dst: [u8; 16]) -> [u8; GRH_LEN] {
        let mut a = [0u8; GRH_LEN];
        let word = (6u32 << 28) | (u32::from(tclass) << 20) | flow;
        a[..4].copy_from_slice(&word.to_be_bytes());
        a[6] = 0x11; // next header: UDP
        a[7] = 64;
        a[8..24].copy_from_slice(&src);
        a[24..40].copy_from_slice(&dst);
        a
    }

    fn ipv4_area(tos: u8, src: [u8; 4], dst: [u8; 4]) -> [u8; GRH_LEN] {
        let mut a = [0u8; GRH_LEN];
        let h = &mut a[IPV4_OFFSET..];
        h[0] = 0x45;
        h[1] = tos;
        h[2..4].copy_from_slice(&60u16.to_be_bytes());
        h[8] = 64;
        h[9] = 0x11;
        h[12..16].copy_from_slice(&src);
        h[16..20].copy_from_slice(&dst);
        let mut sum: u32 = h
            .chunks_exact(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        a
    }

    #[test]
    fn ipv6_headers_give_addresses_class_and_flow() {
        let src = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        let dst = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 9, 9, 9, 9, 9, 9, 9, 9];
        let route = parse_header(&ipv6_area(0x2a, 0x12345, src, dst)).unwrap();
        assert_eq!(
            route,
            ReceivedRoute {
                source: Gid(src),
                destination: Gid(dst),
                traffic_class: 0x2a,
                flow_label: 0x12345,
                hop_limit: 64,
                gid_types: &[GidType::RoceV2],
            }
        );
    }

    #[test]
    fn ipv4_headers_give_mapped_addresses_and_tos() {
        let route = parse_header(&ipv4_area(0x10, [10, 0, 0, 1], [10, 0, 0, 2])).unwrap();
        assert_eq!(route.source, ipv4_mapped(&[10, 0, 0, 1]));
        assert_eq!(route.destination, ipv4_mapped(&[10, 0, 0, 2]));
        assert_eq!(
            route.source.0[..12],
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]
        );
        assert_eq!((route.traffic_class, route.flow_label), (0x10, 0));
        assert_eq!(route.hop_limit, 64);
        assert!(parse_header(&ipv4_area(0, [10, 0, 0, 1], [224, 0, 0, 1])) == Err(libc::EINVAL));
    }

    #[test]
    fn an_ipv6_header_whose_tail_looks_like_ipv4_stays_ipv6_unless_the_checksum_holds() {
        let mut src = [1u8; 16];
        src[12] = 0x45; // byte 20 of the area: "IPv4, five words"
        let dst = [2u8; 16];
        let area = ipv6_area(0, 7, src, dst);
        let route = parse_header(&area).unwrap();
        assert_eq!((route.source, route.destination), (Gid(src), Gid(dst)));
        assert_eq!(route.flow_label, 7);
    }

    #[test]
    fn other_headers_are_refused() {
        assert_eq!(parse_header(&[0u8; GRH_LEN]), Err(libc::EPROTONOSUPPORT));
        let mut tcp = ipv6_area(0, 0, [1; 16], [2; 16]);
        tcp[6] = 6;
        assert_eq!(parse_header(&tcp), Err(libc::EPROTONOSUPPORT));
        let multicast = ipv6_area(0, 0, [1; 16], [0xff; 16]);
        assert_eq!(parse_header(&multicast), Err(libc::EINVAL));
    }
}

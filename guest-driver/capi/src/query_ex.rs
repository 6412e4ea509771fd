//! The extended queries of the `verbs_context`: `query_device_ex` (behind the inline
//! `ibv_query_device_ex`) and `query_port` (behind the inline `ibv_query_port` of current
//! headers, which passes the size of its `ibv_port_attr`). Both follow rdma-core's size rules:
//! the caller's structure may be shorter or longer than this library's (older or newer
//! headers); bytes beyond the caller's size are never touched.

use std::ffi::c_int;
use std::mem::{offset_of, size_of};

use crate::context::VrdmaContext;
use crate::ffi::{guard, report};
use crate::query::{device_attr, port_attr};
use crate::sys::{
    ibv_context, ibv_device_attr, ibv_device_attr_ex, ibv_odp_caps, ibv_odp_caps__bindgen_ty_1,
    ibv_port_attr, ibv_query_device_ex_input, size_t,
};

/// Where `active_speed_ex` (a `u32`, added to `ibv_port_attr` after rdma-core 44) lies in the
/// `ibv_port_attr` of headers that have it; the QUERY_PORT answer carries it.
const ACTIVE_SPEED_EX_OFFSET: usize = 52;

// The field that comes before `active_speed_ex` ends at its alignment gap.
const _: () = assert!(
    offset_of!(ibv_port_attr, port_cap_flags2) + size_of::<u16>() <= ACTIVE_SPEED_EX_OFFSET
        && size_of::<ibv_port_attr>() <= ACTIVE_SPEED_EX_OFFSET
);

/// `IBV_ODP_SUPPORT` in `ibv_odp_caps.general_caps` (implicit ODP, bit 1, is never reported:
/// rxe has none).
const IBV_ODP_SUPPORT: u64 = 1 << 0;

/// Whether a caller's structure of `size` bytes holds the whole field ending at `end`.
fn holds(size: usize, offset: usize, len: usize) -> bool {
    size >= offset + len
}

/// `verbs_context.query_device_ex`: `ibv_device_attr_ex` from the QUERY_DEVICE answer, as
/// rdma-core's rxe provider reports it: the classic attributes, `device_cap_flags_ex` (the same
/// capability bits, vrdma's device has no flags beyond the first 32), `phys_port_cnt_ex` and,
/// with `VRDMA_F_ODP`, the ODP capabilities the device reports; no timestamps, TSO, RSS, WQs, packet pacing, raw packet, tag matching, CQ moderation,
/// device memory or PCI atomics (all 0). 0, or an errno value: EINVAL for a `comp_mask` in
/// `input` or an `attr_size` below `ibv_device_attr`. The first `attr_size` bytes are written
/// (fields this library does not know are 0), nothing beyond.
///
/// # Safety
/// `context` is a context of this library; `input` is NULL or readable; `attr` is valid for
/// `attr_size` bytes and aligned for `ibv_device_attr_ex`.
pub(crate) unsafe extern "C" fn query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: size_t,
) -> c_int {
    let attr_size = usize::try_from(attr_size).unwrap_or(usize::MAX);
    guard("ibv_query_device_ex", libc::EIO, || {
        // SAFETY: caller contract.
        let Some(ctx) = (unsafe { VrdmaContext::from_ptr(context) }) else {
            return libc::EINVAL;
        };
        // SAFETY: caller contract.
        if unsafe { input.as_ref() }.is_some_and(|input| input.comp_mask != 0) {
            return libc::EINVAL;
        }
        if attr.is_null() || attr_size < size_of::<ibv_device_attr>() {
            return libc::EINVAL;
        }
        let orig = device_attr(ctx.ctx.query_device());
        // SAFETY: caller contract: `attr_size` bytes are writable; every field written below
        // lies wholly inside them (checked against `attr_size` where it could not).
        unsafe {
            attr.cast::<u8>().write_bytes(0, attr_size);
            (&raw mut (*attr).orig_attr).write(orig);
            let flags_ex = offset_of!(ibv_device_attr_ex, device_cap_flags_ex);
            if holds(attr_size, flags_ex, size_of::<u64>()) {
                (&raw mut (*attr).device_cap_flags_ex).write(u64::from(orig.device_cap_flags));
            }
            let ports_ex = offset_of!(ibv_device_attr_ex, phys_port_cnt_ex);
            if holds(attr_size, ports_ex, size_of::<u32>()) {
                (&raw mut (*attr).phys_port_cnt_ex).write(u32::from(orig.phys_port_cnt));
            }
            let odp = offset_of!(ibv_device_attr_ex, odp_caps);
            if let Some(caps) = ctx.ctx.odp_caps() {
                if holds(attr_size, odp, size_of::<ibv_odp_caps>()) {
                    (&raw mut (*attr).odp_caps).write(ibv_odp_caps {
                        general_caps: IBV_ODP_SUPPORT,
                        per_transport_caps: ibv_odp_caps__bindgen_ty_1 {
                            rc_odp_caps: caps.rc,
                            uc_odp_caps: caps.uc,
                            ud_odp_caps: caps.ud,
                        },
                    });
                }
            }
        }
        0
    })
}

/// `verbs_context.query_port`: the port's attributes into the caller's `ibv_port_attr` of
/// `port_attr_len` bytes, as libibverbs does: a shorter structure gets the prefix that fits; a
/// longer one is cleared first, and gets `active_speed_ex` when it has that field. 0, or an
/// errno value.
///
/// # Safety
/// `context` is a context of this library; `port_attr` is valid for `port_attr_len` bytes and
/// aligned for `ibv_port_attr`.
pub(crate) unsafe extern "C" fn query_port_ex(
    context: *mut ibv_context,
    port_num: u8,
    port_attr_out: *mut ibv_port_attr,
    port_attr_len: size_t,
) -> c_int {
    let port_attr_len = usize::try_from(port_attr_len).unwrap_or(usize::MAX);
    guard("ibv_query_port", libc::EIO, || {
        // SAFETY: caller contract.
        let Some(ctx) = (unsafe { VrdmaContext::from_ptr(context) }) else {
            return libc::EINVAL;
        };
        if port_attr_out.is_null() {
            return libc::EINVAL;
        }
        let port = match ctx.ctx.query_port(port_num) {
            Ok(port) => port,
            Err(e) => return report("ibv_query_port", &e),
        };
        let attr = port_attr(&port);
        if port_attr_len < size_of::<ibv_port_attr>() {
            // SAFETY: `attr` is a whole ibv_port_attr, of which the caller's buffer takes the
            // first `port_attr_len` bytes (caller contract).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (&raw const attr).cast::<u8>(),
                    port_attr_out.cast::<u8>(),
                    port_attr_len,
                );
            }
            return 0;
        }
        // SAFETY: caller contract: `port_attr_len` bytes, at least a whole ibv_port_attr, are
        // writable; `active_speed_ex` is written only where the caller's structure has it.
        unsafe {
            port_attr_out.cast::<u8>().write_bytes(0, port_attr_len);
            port_attr_out.write(attr);
            if holds(port_attr_len, ACTIVE_SPEED_EX_OFFSET, size_of::<u32>()) {
                let speed_ex = port_attr_out.byte_add(ACTIVE_SPEED_EX_OFFSET).cast::<u32>();
                speed_ex.write(port.active_speed_ex.get());
            }
        }
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cq_ex::tests::{close, open_fake, verbs_get_ctx};

    #[test]
    fn query_device_ex_writes_only_what_the_caller_has_room_for() {
        let (_fake, ctx) = open_fake();
        let query = verbs_get_ctx(ctx).query_device_ex.unwrap();
        let full = size_of::<ibv_device_attr_ex>();
        let orig = size_of::<ibv_device_attr>();
        // A buffer larger than any header's structure, filled with a sentinel.
        let mut buf = vec![0xa5a5_a5a5_a5a5_a5a5u64; full / 8 + 8];
        let attr = buf.as_mut_ptr().cast::<ibv_device_attr_ex>();
        let bytes =
            |buf: &Vec<u64>| -> Vec<u8> { buf.iter().flat_map(|w| w.to_ne_bytes()).collect() };
        // SAFETY: the buffer holds more than `full` bytes.
        unsafe {
            assert_eq!(
                query(ctx, std::ptr::null(), attr, (orig - 1) as size_t),
                libc::EINVAL
            );
            let input = ibv_query_device_ex_input { comp_mask: 1 };
            assert_eq!(query(ctx, &input, attr, full as size_t), libc::EINVAL);
            // The classic size: only orig_attr, the bytes after it untouched.
            assert_eq!(query(ctx, std::ptr::null(), attr, orig as size_t), 0);
            assert_eq!((*attr).orig_attr.phys_port_cnt, 1);
            assert!(bytes(&buf)[orig..].iter().all(|&b| b == 0xa5));
            // The full size (and a newer header's larger one): the extended fields.
            let input = ibv_query_device_ex_input { comp_mask: 0 };
            assert_eq!(query(ctx, &input, attr, (full + 16) as size_t), 0);
            let got = &*attr;
            assert_eq!(
                got.device_cap_flags_ex,
                u64::from(got.orig_attr.device_cap_flags)
            );
            assert_eq!(got.phys_port_cnt_ex, 1);
            // The fake negotiates VRDMA_F_ODP and describes rxe's ODP.
            assert_eq!(got.odp_caps.general_caps, IBV_ODP_SUPPORT);
            let per_transport = got.odp_caps.per_transport_caps;
            assert_eq!(
                (
                    per_transport.rc_odp_caps,
                    per_transport.uc_odp_caps,
                    per_transport.ud_odp_caps
                ),
                (vrdma_test_support::fake_transport::ODP_RC_CAPS, 0, 0b11)
            );
            assert_eq!(
                (
                    got.raw_packet_caps,
                    got.max_dm_size,
                    got.completion_timestamp_mask
                ),
                (0, 0, 0)
            );
            let b = bytes(&buf);
            assert!(
                b[full..full + 16].iter().all(|&x| x == 0),
                "cleared up to attr_size"
            );
            assert!(b[full + 16..].iter().all(|&x| x == 0xa5));
        }
        close(ctx);
    }

    #[test]
    fn query_port_fills_active_speed_ex_only_for_headers_that_have_it() {
        let (_fake, ctx) = open_fake();
        let query = verbs_get_ctx(ctx).query_port.unwrap();
        let mut buf = [0xa5a5_a5a5u32; 16];
        let attr = buf.as_mut_ptr().cast::<ibv_port_attr>();
        // SAFETY: the buffer holds 64 bytes.
        unsafe {
            // rdma-core 44's structure: active_speed_ex (offset 52) is not the caller's.
            assert_eq!(query(ctx, 1, attr, size_of::<ibv_port_attr>() as size_t), 0);
            assert_eq!((*attr).state, 4);
            assert_eq!(buf[13], 0xa5a5_a5a5);
            // A newer header's 56 bytes: active_speed_ex is written (the fake reports 0).
            assert_eq!(query(ctx, 1, attr, 56), 0);
            assert_eq!((buf[13], buf[14]), (0, 0xa5a5_a5a5));
            // An older, shorter one: the prefix only.
            buf = [0xa5a5_a5a5u32; 16];
            assert_eq!(query(ctx, 1, attr, 8), 0);
            assert_eq!(buf[0], 4);
            assert_eq!(buf[2], 0xa5a5_a5a5);
            assert_ne!(query(ctx, 9, attr, 56), 0, "no port 9");
        }
        close(ctx);
    }
}

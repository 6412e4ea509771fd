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
    ibv_context, ibv_device_attr, ibv_device_attr_ex, ibv_port_attr, ibv_query_device_ex_input,
    size_t,
};

/// Where `active_speed_ex` (a `u32`, added to `ibv_port_attr` after rdma-core 44) lies in the
/// `ibv_port_attr` of headers that have it; the QUERY_PORT answer carries it.
const ACTIVE_SPEED_EX_OFFSET: usize = 52;

// The field that comes before `active_speed_ex` ends at its alignment gap.
const _: () = assert!(
    offset_of!(ibv_port_attr, port_cap_flags2) + size_of::<u16>() <= ACTIVE_SPEED_EX_OFFSET
        && size_of::<ibv_port_attr>() <= ACTIVE_SPEED_EX_OFFSET
);

/// Whether a caller's structure of `size` bytes holds the whole field ending at `end`.
fn holds(size: usize, offset: usize, len: usize) -> bool {
    size >= offset + len
}

/// `verbs_context.query_device_ex`: `ibv_device_attr_ex` from the QUERY_DEVICE answer, as
/// rdma-core's rxe provider reports it: the classic attributes, `device_cap_flags_ex` (the same
/// capability bits, vrdma's device has no flags beyond the first 32) and `phys_port_cnt_ex`;
/// no ODP, timestamps, TSO, RSS, WQs, packet pacing, raw packet, tag matching, CQ moderation,
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

//! The GID entry points over the fake device, reached as an application reaches them: what
//! `ibv_devinfo -v`'s walk of a 1024-entry table costs in commands, rdma-core's answers for
//! empty and out-of-range indices, and an `IBV_EVENT_GID_CHANGE` handed to the application
//! only after the cached table was dropped.

use std::ffi::c_uint;
use std::time::{Duration, Instant};

use vrdma::spec::control::Opcode;
use vrdma::spec::event::{Event, EventType};
use vrdma::verbs::{GidEntry, GidType};
use vrdma_test_support::fake_transport::LOCAL_GID;

use super::*;
use crate::async_verbs::{ibv_ack_async_event, ibv_get_async_event};
use crate::cq_ex::tests::{close, open_fake};
use crate::fd::wait_readable;
use crate::sys::{ibv_async_event, ibv_event_type_IBV_EVENT_GID_CHANGE as GID_CHANGE};

/// rxe's GID table size.
const RXE_GID_TABLE_LEN: u32 = 1024;

/// Bounds the wait for the event the test posted; never reached when the code works.
const GIVE_UP_MS: i32 = 20_000;

fn query_gid(ctx: *mut ibv_context, port: u8, index: u32) -> Result<[u8; 16], i32> {
    let mut gid = ibv_gid { raw: [0xee; 16] };
    // SAFETY: a live context of the test; `gid` is valid for a write.
    match unsafe { ibv_query_gid(ctx, port, index as c_int, &mut gid) } {
        // SAFETY: every bit pattern is a valid `raw`.
        0 => Ok(unsafe { gid.raw }),
        _ => Err(std::io::Error::last_os_error().raw_os_error().unwrap()),
    }
}

fn query_gid_type(ctx: *mut ibv_context, port: u8, index: u32) -> Result<c_uint, i32> {
    let mut gid_type: c_uint = 0xee;
    // SAFETY: as above.
    match unsafe { ibv_query_gid_type(ctx, port, index, &mut gid_type) } {
        0 => Ok(gid_type),
        _ => Err(std::io::Error::last_os_error().raw_os_error().unwrap()),
    }
}

fn query_gid_ex(ctx: *mut ibv_context, index: u32) -> Result<ibv_gid_entry, i32> {
    // SAFETY: all-zero is a valid ibv_gid_entry.
    let mut entry: ibv_gid_entry = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    match unsafe { _ibv_query_gid_ex(ctx, 1, index, &mut entry, 0, size_of::<ibv_gid_entry>()) } {
        0 => Ok(entry),
        errno => Err(errno),
    }
}

#[test]
fn ibv_devinfo_walking_1024_indices_twice_costs_a_handful_of_commands() {
    let (fake, ctx) = open_fake();
    // SAFETY: a live context of the test.
    let vctx = unsafe { VrdmaContext::of(ctx) };
    // The default lifetime would make a stalled test machine read the table again.
    vctx.ctx.set_gid_cache_lifetime(Duration::from_secs(3600));
    {
        let mut device = fake.device();
        device.gid_tbl_len = RXE_GID_TABLE_LEN;
        device.set_gid(1, Some(GidEntry::valid([1; 16], GidType::RoceV1)));
        device.set_gid(3, Some(GidEntry::valid([3; 16], GidType::RoceV2)));
        device.log.clear();
    }
    let start = Instant::now();
    for _ in 0..2 {
        for index in 0..RXE_GID_TABLE_LEN {
            let (gid, gid_type) = match index {
                0 => (LOCAL_GID, 1),
                1 => ([1; 16], 0),
                3 => ([3; 16], 1),
                // Empty entries: the zero GID and type 0, with success, as rdma-core 44.
                _ => ([0; 16], 0),
            };
            assert_eq!(query_gid(ctx, 1, index), Ok(gid), "index {index}");
            assert_eq!(query_gid_type(ctx, 1, index), Ok(gid_type), "index {index}");
        }
    }
    let walk = start.elapsed();
    assert_eq!(
        fake.device().ops(),
        [Opcode::QueryPort, Opcode::QueryGidTable],
        "one table read for 4096 queries"
    );
    log::info!("4096 GID queries from the cache took {walk:?}");

    // The extended query: the entry, ENODATA for an empty one; EINVAL beyond the table.
    let entry = query_gid_ex(ctx, 3).unwrap();
    // SAFETY: every bit pattern is a valid `raw`.
    let raw = unsafe { entry.gid.raw };
    assert_eq!(
        (raw, entry.gid_index, entry.port_num, entry.gid_type),
        ([3; 16], 3, 1, ibv_gid_type_IBV_GID_TYPE_ROCE_V2)
    );
    assert_eq!(query_gid_ex(ctx, 2).map(|_| ()), Err(libc::ENODATA));
    assert_eq!(
        query_gid_ex(ctx, RXE_GID_TABLE_LEN).map(|_| ()),
        Err(libc::EINVAL)
    );
    assert_eq!(query_gid(ctx, 1, RXE_GID_TABLE_LEN), Err(libc::EINVAL));
    assert_eq!(query_gid_type(ctx, 1, RXE_GID_TABLE_LEN), Err(libc::EINVAL));
    // A port the device does not have: its error, not a cached answer.
    assert_eq!(query_gid(ctx, 2, 0), Err(libc::EINVAL));
    assert_eq!(query_gid(ctx, 1, -1i32 as u32), Err(libc::EINVAL));
    close(ctx);
}

#[test]
fn after_ibv_event_gid_change_the_application_reads_the_new_gid() {
    let (fake, ctx) = open_fake();
    // SAFETY: a live context of the test.
    let vctx = unsafe { VrdmaContext::of(ctx) };
    // Only the event may make the cache read the table again here.
    vctx.ctx.set_gid_cache_lifetime(Duration::from_secs(3600));
    assert_eq!(query_gid(ctx, 1, 0), Ok(LOCAL_GID));
    for round in 1..=3u8 {
        let new = GidEntry::valid([round; 16], GidType::RoceV2);
        fake.device().set_gid(0, Some(new));
        fake.post_event(Event {
            event_type: EventType::GidChange,
            handle: 1,
            detail: 0,
        });
        // SAFETY: a live context of the test.
        let async_fd = unsafe { (*ctx).async_fd };
        assert_eq!(wait_readable([async_fd], GIVE_UP_MS).unwrap(), [true]);
        // SAFETY: all-zero is a valid ibv_async_event; the context is live.
        let mut event: ibv_async_event = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        assert_eq!(unsafe { ibv_get_async_event(ctx, &mut event) }, 0);
        // SAFETY: a port event: `port_num` is the member set.
        let port = unsafe { event.element.port_num };
        assert_eq!((event.event_type, port), (GID_CHANGE, 1));
        // SAFETY: handed out by ibv_get_async_event, acknowledged once.
        unsafe { ibv_ack_async_event(&mut event) };
        assert_eq!(query_gid(ctx, 1, 0), Ok([round; 16]), "round {round}");
        assert_eq!(query_gid_type(ctx, 1, 0), Ok(1));
    }
    close(ctx);
}

//! The GID table cache of a context against the fake device: what it costs in commands, and
//! that a GID_CHANGE event read by any waiter, or the lifetime running out, makes the next
//! query read the device's new table.

use std::time::{Duration, Instant};

use vrdma::spec::control::Opcode;
use vrdma::spec::event::{Event, EventType};
use vrdma::spec::Status;
use vrdma::verbs::{Cq, DeviceEvent, GidEntry, GidType, DEFAULT_GID_CACHE_LIFETIME};
use vrdma_test_support::fake_transport::LOCAL_GID;

use crate::helpers::*;

/// rxe's table size: what `ibv_devinfo -v` walks, index by index.
const RXE_GID_TABLE_LEN: u32 = 1024;

fn gid(byte: u8) -> GidEntry {
    GidEntry::valid([byte; 16], GidType::RoceV2)
}

fn gid_change(port: u32) -> Event {
    Event {
        event_type: EventType::GidChange,
        handle: port,
        detail: 0,
    }
}

#[test]
fn walking_a_1024_entry_table_twice_costs_a_handful_of_commands() {
    let (t, ctx) = open();
    // A day-to-day lifetime would make a slow test machine read the table more than once.
    ctx.set_gid_cache_lifetime(Duration::from_secs(3600));
    {
        let mut device = t.device();
        device.gid_tbl_len = RXE_GID_TABLE_LEN;
        // Link-local and one IPv4 address, RoCE v1 and v2 each, as rxe fills its table, plus
        // enough further entries that the table takes more than one QUERY_GID_TABLE.
        for index in 0..9 {
            device.set_gid(index, Some(gid(index as u8 + 1)));
        }
        device.set_gid(1000, Some(gid(0xaa)));
        device.log.clear();
    }
    // What ibv_devinfo -v does per port: GID, then GID type, for every index, twice over.
    for _ in 0..2 {
        for index in 0..RXE_GID_TABLE_LEN {
            let table = ctx.gid_table(1).unwrap();
            let entry = table.entry(index);
            let expected = match index {
                0..9 => Some(gid(index as u8 + 1)),
                1000 => Some(gid(0xaa)),
                _ => None,
            };
            assert_eq!(entry.copied(), expected, "index {index}");
            let table = ctx.gid_table(1).unwrap();
            assert_eq!(table.len(), RXE_GID_TABLE_LEN);
            assert_eq!(table.entry(index).copied(), expected);
        }
    }
    // One QUERY_PORT for the length, two QUERY_GID_TABLE for ten entries (six per command).
    assert_eq!(
        t.device().ops(),
        [
            Opcode::QueryPort,
            Opcode::QueryGidTable,
            Opcode::QueryGidTable
        ]
    );
    // A port the device does not have is its error, and is not kept.
    let err = ctx.gid_table(2).unwrap_err();
    assert_eq!(status_of(&err), Some(Status::Invalid));
}

#[test]
fn a_gid_change_read_by_any_waiter_makes_the_next_query_see_the_new_table() {
    let (t, ctx) = open();
    ctx.set_gid_cache_lifetime(Duration::from_secs(3600));
    assert_eq!(ctx.gid_table(1).unwrap().entry(0).unwrap().gid, LOCAL_GID);

    // The host table changes; until the event is read, the kept table answers.
    t.device().set_gid(0, Some(gid(7)));
    t.device().set_gid(1, Some(gid(8)));
    assert_eq!(ctx.gid_table(1).unwrap().entry(0).unwrap().gid, LOCAL_GID);
    t.post_event(gid_change(1));
    let event = ctx.next_event(Some(Duration::from_secs(20))).unwrap();
    assert_eq!(event, Some(DeviceEvent::GidChange { port: 1 }));
    // Whoever received the event, the next query reads the new table: never the old one.
    let table = ctx.gid_table(1).unwrap();
    assert_eq!(table.entry(0).unwrap().gid, [7; 16]);
    assert_eq!(table.entry(1).unwrap().gid, [8; 16]);

    // An event read by a CQ's waiter and kept for `next_event` drops the table as it is
    // read, before anyone takes it from the stash.
    let cq = Cq::new(&ctx, 4).unwrap();
    t.device().set_gid(0, None);
    t.post_event(gid_change(1));
    assert!(!cq.wait_event(Some(Duration::from_millis(50))).unwrap());
    assert_eq!(ctx.gid_table(1).unwrap().entry(0), None, "emptied entry");
    assert_eq!(
        ctx.next_event(Some(Duration::ZERO)).unwrap(),
        Some(DeviceEvent::GidChange { port: 1 })
    );

    // Events of other ports and other kinds keep the table.
    t.device().log.clear();
    t.device().set_gid(0, Some(gid(9)));
    t.post_event(gid_change(2));
    ctx.next_event(Some(Duration::from_secs(20))).unwrap();
    assert_eq!(ctx.gid_table(1).unwrap().entry(0), None, "kept");
    assert!(t.device().ops().is_empty());
    // PORT_ERR of the port drops it.
    t.post_event(Event {
        event_type: EventType::PortErr,
        handle: 1,
        detail: 0,
    });
    ctx.next_event(Some(Duration::from_secs(20))).unwrap();
    assert_eq!(ctx.gid_table(1).unwrap().entry(0).unwrap().gid, [9; 16]);
}

#[test]
fn without_events_a_change_is_seen_within_the_lifetime() {
    let (t, ctx) = open();
    assert_eq!(ctx.gid_table(1).unwrap().entry(0).unwrap().gid, LOCAL_GID);
    t.device().set_gid(0, Some(gid(3)));
    // Nobody reads events: the change must show once the lifetime ran out, and then it must
    // (the bound holds however slow the machine: only "at most", never "at least", is tested).
    let changed_at = Instant::now();
    loop {
        // Taken before the query: the kept table was read before `changed_at`, so a query
        // begun a lifetime after it must read the device again.
        let asked_after = changed_at.elapsed();
        let seen = ctx.gid_table(1).unwrap().entry(0).unwrap().gid;
        if seen == [3; 16] {
            break;
        }
        assert_eq!(seen, LOCAL_GID);
        assert!(
            asked_after < DEFAULT_GID_CACHE_LIFETIME,
            "the old GID outlived the cache lifetime"
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    // A zero lifetime asks the device every time.
    ctx.set_gid_cache_lifetime(Duration::ZERO);
    t.device().log.clear();
    ctx.gid_table(1).unwrap();
    ctx.gid_table(1).unwrap();
    assert_eq!(
        t.device().ops(),
        [
            Opcode::QueryPort,
            Opcode::QueryGidTable,
            Opcode::QueryPort,
            Opcode::QueryGidTable
        ]
    );
}

//! QUERY_GID_TABLE of the per-guest device: populated entries only, by increasing index, in
//! batches that continue where the last one stopped, within the port's `gid_tbl_len`, as
//! QUERY_GID answers them one by one.
//!
//! The real per-guest device over the fake host device of `vrdma_test_support::fake_host`.

use vrdma_spec::features::*;
use vrdma_spec::verbs::GidType;
use vrdma_spec::wire::*;
use vrdma_spec::{ControlRequest, Le32, ResponseBody, Status};
use vrdma_test_support::fake_host::device::*;
use vrdma_test_support::fake_host::harness::*;

fn table_req(port: u32, index: u32) -> QueryTableReq {
    QueryTableReq {
        port_num: Le32::new(port),
        index: Le32::new(index),
    }
}

fn batch(guest: &TestGuest, index: u32) -> GidTableResp {
    match guest.ok(ControlRequest::QueryGidTable(table_req(1, index))) {
        ResponseBody::QueryGidTable(t) => t,
        other => panic!("{other:?}"),
    }
}

fn gid(n: u8) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[15] = n;
    g
}

#[test]
fn one_batch_holds_a_small_table() {
    let fake = FakeDevice::new();
    fake.world().extra_gids = vec![
        (3, GidEntry::valid(gid(3), GidType::RoceV1)),
        (1, GidEntry::valid(gid(1), GidType::RoceV2)),
        // Empty slots and entries beyond gid_tbl_len (16) are not returned.
        (2, GidEntry::EMPTY),
        (16, GidEntry::valid(gid(16), GidType::RoceV2)),
    ];
    let guest = TestGuest::new(&fake, test_options(), VRDMA_F_RING_RXE_V1);
    let t = batch(&guest, 0);
    assert_eq!(t.count.get(), 3);
    assert_eq!(t.next_index.get(), GID_TABLE_END);
    let got: Vec<(u32, [u8; 16], u32)> = t.entries[..3]
        .iter()
        .map(|e| (e.index.get(), e.gid, e.gid_type.get()))
        .collect();
    assert_eq!(
        got,
        [(0, GID0, 2), (1, gid(1), 2), (3, gid(3), 1)],
        "by increasing index"
    );
    assert!(t.entries[3..]
        .iter()
        .all(|e| e.index.get() == 0 && !e.entry().is_valid()));
    // Each entry is what QUERY_GID says of its index.
    for e in &t.entries[..3] {
        let ResponseBody::QueryGid(one) =
            guest.ok(ControlRequest::QueryGid(table_req(1, e.index.get())))
        else {
            panic!()
        };
        assert_eq!(one, e.entry());
    }
    // Starting later skips what lies before.
    let t = batch(&guest, 2);
    assert_eq!((t.count.get(), t.entries[0].index.get()), (1, 3));
}

#[test]
fn a_large_table_comes_in_batches() {
    let fake = FakeDevice::new();
    fake.world().extra_gids = (1..15)
        .map(|i| (i, GidEntry::valid(gid(i as u8), GidType::RoceV2)))
        .collect();
    let guest = TestGuest::new(&fake, test_options(), VRDMA_F_RING_RXE_V1);
    let mut seen = Vec::new();
    let mut index = 0;
    let mut commands = 0;
    while index != GID_TABLE_END {
        let t = batch(&guest, index);
        commands += 1;
        assert!(t.count.get() as usize <= GID_TABLE_BATCH);
        seen.extend(
            t.entries[..t.count.get() as usize]
                .iter()
                .map(|e| e.index.get()),
        );
        index = t.next_index.get();
    }
    assert_eq!(seen, (0..15).collect::<Vec<u32>>());
    assert_eq!(commands, 3, "15 entries, 6 per batch");
}

#[test]
fn ports_and_indices_are_checked() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), VRDMA_F_RING_RXE_V1);
    for (port, index) in [(2, 0), (0, 0), (1, 16), (1, u32::MAX)] {
        assert_eq!(
            guest.status(ControlRequest::QueryGidTable(table_req(port, index))),
            Status::Invalid,
            "port {port} index {index}"
        );
    }
}

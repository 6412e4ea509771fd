//! REG_MR_EXTENTS (spec §7.4): MRs whose pages come as extents, validated like REG_MR, limited
//! in extents rather than pages, and mapped like the same pages listed one by one.
//!
//! The real per-guest device driven through the `DeviceHandler` API over the fake host device.

use std::fs::File;

use vm_memory::{Bytes, GuestAddress, GuestAddressSpace};
use vrdma_backend::guest::options::DeviceOptions;
use vrdma_spec::features::*;
use vrdma_spec::{ControlResponse, ResponseBody, Status};
use vrdma_test_support::fake_host::device::*;
use vrdma_test_support::fake_host::harness::*;

fn status(r: ControlResponse) -> Status {
    match r {
        ControlResponse::Ok(_) => Status::Ok,
        ControlResponse::Err(e) => e.status(),
    }
}

/// The 32-bit word at `addr` of this process (where the fake host's MR starts).
fn read_word(addr: u64) -> u32 {
    let mut word = [0u8; 4];
    let file = File::open("/proc/self/mem").unwrap();
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut word, addr).unwrap();
    u32::from_ne_bytes(word)
}

/// A guest that negotiated extents, on a fake device of its own, with a PD.
fn guest_with_extents(options: DeviceOptions) -> (std::sync::Arc<FakeDevice>, TestGuest, u32) {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, options, VRDMA_F_RING_RXE_V1 | VRDMA_F_MR_EXTENTS);
    let pd = guest.alloc_pd();
    (fake, guest, pd)
}

#[test]
fn extents_map_the_pages_they_name_in_order() {
    let (fake, guest, pd) = guest_with_extents(test_options());
    // Three pages from two extents, the second before the first in guest-physical order; the
    // MR starts 0x10 bytes into the first page.
    let extents = [(RAM_BASE + 8 * PAGE, 2 * PAGE), (RAM_BASE + PAGE, PAGE)];
    for (gpa, word) in [
        (RAM_BASE + 8 * PAGE + 0x10, 0x1111_1111u32),
        (RAM_BASE + 9 * PAGE, 0x2222_2222),
        (RAM_BASE + PAGE, 0x3333_3333),
    ] {
        guest
            .memory
            .memory()
            .write_obj(word, GuestAddress(gpa))
            .unwrap();
    }
    let ControlResponse::Ok(ResponseBody::RegMr(mr)) =
        reg_mr_extents(&guest, pd, 0x7000_0010, 3 * PAGE - 0x10, &extents)
    else {
        panic!("REG_MR_EXTENTS failed")
    };
    let start = {
        let world = fake.world();
        let init = world.mrs.values().next().unwrap();
        assert_eq!((init.iova, init.length), (0x7000_0010, 3 * PAGE - 0x10));
        init.start
    };
    assert_eq!(read_word(start), 0x1111_1111);
    assert_eq!(read_word(start + PAGE - 0x10), 0x2222_2222);
    assert_eq!(read_word(start + 2 * PAGE - 0x10), 0x3333_3333);
    assert_eq!(guest.dev().object_counts().mrs, 1);
    assert_eq!(guest.dev().memory_usage().mr_bytes, 3 * PAGE);
    assert_eq!(
        guest.status(vrdma_spec::ControlRequest::DeregMr(handle(mr.mr.get()))),
        Status::Ok
    );
    assert_eq!(fake.world().live(), 1, "only the PD is left");
}

/// What a request is, its length, its extents, and the status it gets.
type Case<'a> = (&'a str, u64, &'a [(u64, u64)], Status);

#[test]
fn extents_are_validated_like_pages_and_limited_in_extents() {
    let (fake, guest, pd) = guest_with_extents(test_options());
    let last = RAM_BASE + RAM_SIZE - PAGE;
    let cases: &[Case] = &[
        ("outside RAM", PAGE, &[(0, PAGE)], Status::BadAddress),
        (
            "across RAM's end",
            2 * PAGE,
            &[(last, 2 * PAGE)],
            Status::BadAddress,
        ),
        (
            "unaligned start",
            PAGE,
            &[(RAM_BASE + 8, PAGE)],
            Status::Invalid,
        ),
        (
            "unaligned length",
            PAGE,
            &[(RAM_BASE, PAGE + 8)],
            Status::Invalid,
        ),
        (
            "empty extent",
            PAGE,
            &[(RAM_BASE, 0), (RAM_BASE, PAGE)],
            Status::Invalid,
        ),
        (
            "too few pages",
            2 * PAGE,
            &[(RAM_BASE, PAGE)],
            Status::Invalid,
        ),
        (
            "too many pages",
            PAGE,
            &[(RAM_BASE, 2 * PAGE)],
            Status::Invalid,
        ),
        ("no extent", PAGE, &[], Status::Invalid),
        (
            "wrapping extent",
            PAGE,
            &[(u64::MAX - PAGE + 1, PAGE)],
            Status::Invalid,
        ),
    ];
    for (what, length, extents, expected) in cases {
        assert_eq!(
            status(reg_mr_extents(&guest, pd, 0, *length, extents)),
            *expected,
            "{what}"
        );
    }
    assert_eq!(guest.dev().object_counts().mrs, 0);
    assert_eq!(fake.world().live(), 1);

    // max_mr_pages is 64: 32 extents at most (here one page each, adjacent, so that nothing
    // else — mappings, quotas — is near its limit), but a contiguous MR of more pages is one
    // extent (here bounded by the byte quota of 64 pages instead).
    let one_page_each =
        |n: u64| -> Vec<(u64, u64)> { (0..n).map(|i| (RAM_BASE + i * PAGE, PAGE)).collect() };
    assert_eq!(
        status(reg_mr_extents(&guest, pd, 0, 33 * PAGE, &one_page_each(33))),
        Status::Invalid
    );
    let ControlResponse::Ok(ResponseBody::RegMr(mr)) =
        reg_mr_extents(&guest, pd, 0, 32 * PAGE, &one_page_each(32))
    else {
        panic!("32 extents")
    };
    assert_eq!(
        guest.status(vrdma_spec::ControlRequest::DeregMr(handle(mr.mr.get()))),
        Status::Ok
    );
    assert_eq!(
        status(reg_mr_extents(
            &guest,
            pd,
            0,
            64 * PAGE,
            &[(RAM_BASE, 64 * PAGE)]
        )),
        Status::Ok,
        "64 contiguous pages are one extent"
    );
}

#[test]
fn max_mr_pages_bounds_page_lists_not_extents() {
    let (_fake, guest, pd) = guest_with_extents(DeviceOptions {
        max_mr_pages: 8,
        ..test_options()
    });
    let pages: Vec<u64> = (0..64).map(|i| RAM_BASE + i * PAGE).collect();
    assert_eq!(
        status(reg_mr(&guest, pd, 0, 64 * PAGE, &pages)),
        Status::Invalid
    );
    assert_eq!(
        status(reg_mr_extents(
            &guest,
            pd,
            0,
            64 * PAGE,
            &[(RAM_BASE, 64 * PAGE)]
        )),
        Status::Ok
    );
}

#[test]
fn extents_need_the_feature() {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), VRDMA_F_RING_RXE_V1);
    let pd = guest.alloc_pd();
    assert_eq!(
        status(reg_mr_extents(&guest, pd, 0, PAGE, &[(RAM_BASE, PAGE)])),
        Status::Unsupported
    );
    assert_eq!(guest.dev().object_counts().mrs, 0);
}

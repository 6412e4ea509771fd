//! REREG_MR on the per-guest device: each flag alone and combined, the accounting of PD
//! references and MR bytes, failures that leave the old MR registered, foreign handles, and
//! revoked MRs.
//!
//! The real per-guest device driven over the fake host device of
//! `vrdma_test_support::fake_host`.

use std::fs::File;

use vm_memory::{Bytes, GuestAddress, GuestAddressSpace};
use vrdma_backend::guest_device::GuestDeviceFactory;
use vrdma_backend::host::MrInit;
use vrdma_backend::vhost_device::handler::DeviceHandler;
use vrdma_spec::control::{encode_page_list, rereg_flags, ReregMr};
use vrdma_spec::features::*;
use vrdma_spec::verbs::AccessFlags;
use vrdma_spec::wire::{RegMrResp, ReregMrReq, ReregMrResp};
use vrdma_spec::{ControlRequest, ControlResponse, Le32, Le64, ResponseBody, Status};
use vrdma_test_support::fake_host::device::*;
use vrdma_test_support::fake_host::harness::*;
use zerocopy::FromZeros;

/// A REREG_MR of `mr`: `pd` and `access` when given, and a translation of `pages` covering
/// `length` bytes from `iova` when given.
struct Change<'a> {
    pd: Option<u32>,
    access: Option<AccessFlags>,
    translation: Option<(u64, u64, &'a [u64])>,
}

const NONE: Change<'static> = Change {
    pd: None,
    access: None,
    translation: None,
};

fn rereg(guest: &TestGuest, mr: u32, change: &Change<'_>) -> Result<ReregMrResp, Status> {
    let mut req = ReregMrReq::new_zeroed();
    req.mr = Le32::new(mr);
    let mut flags = 0;
    if let Some(pd) = change.pd {
        flags |= rereg_flags::CHANGE_PD;
        req.pd = Le32::new(pd);
    }
    if let Some(access) = change.access {
        flags |= rereg_flags::CHANGE_ACCESS;
        req.access = Le32::new(access.bits());
    }
    let mut list = Vec::new();
    if let Some((iova, length, pages)) = change.translation {
        flags |= rereg_flags::CHANGE_TRANSLATION;
        req.iova = Le64::new(iova);
        req.length = Le64::new(length);
        req.page_shift = Le32::new(12);
        req.npages = Le32::new(pages.len() as u32);
        encode_page_list(pages.iter().copied(), &mut list);
    }
    req.flags = Le32::new(flags);
    match guest.run(ControlRequest::ReregMr(ReregMr::new(req, &list))) {
        ControlResponse::Ok(ResponseBody::ReregMr(r)) => Ok(r),
        ControlResponse::Ok(other) => panic!("{other:?}"),
        ControlResponse::Err(e) => Err(e.status()),
    }
}

fn registered(guest: &TestGuest, pd: u32, iova: u64, length: u64, pages: &[u64]) -> RegMrResp {
    match reg_mr(guest, pd, iova, length, pages) {
        ControlResponse::Ok(ResponseBody::RegMr(r)) => r,
        other => panic!("{other:?}"),
    }
}

/// The one host MR of the fake device, with its host handle.
fn only_host_mr(fake: &FakeDevice) -> (u32, MrInit) {
    let w = fake.world();
    assert_eq!(w.mrs.len(), 1, "exactly one host MR");
    let (h, init) = w.mrs.iter().next().unwrap();
    (*h, *init)
}

/// A word of this process's memory (where the backend mapped an MR window).
fn read_word(at: u64) -> u32 {
    let mut word = [0u8; 4];
    let file = File::open("/proc/self/mem").unwrap();
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut word, at).unwrap();
    u32::from_ne_bytes(word)
}

fn guest() -> (std::sync::Arc<FakeDevice>, TestGuest) {
    let fake = FakeDevice::new();
    let guest = TestGuest::new(&fake, test_options(), VRDMA_F_RING_RXE_V1);
    (fake, guest)
}

#[test]
fn pd_alone_moves_the_pd_reference() {
    let (fake, guest) = guest();
    let (pd_a, pd_b) = (guest.alloc_pd(), guest.alloc_pd());
    let mr = registered(&guest, pd_a, 0x1000, PAGE, &[RAM_BASE]);
    let (host_mr, before) = only_host_mr(&fake);
    let keys = rereg(
        &guest,
        mr.mr.get(),
        &Change {
            pd: Some(pd_b),
            ..NONE
        },
    )
    .unwrap();
    // A new host MR over the same window (not rxe's in-place rereg, whose access change leaves a
    // local-only MR without an rkey): new keys, the old host MR gone, the same memory.
    assert_ne!((keys.lkey, keys.rkey), (mr.lkey, mr.rkey));
    let (host_after, after) = only_host_mr(&fake);
    assert_ne!(host_after, host_mr);
    assert_ne!(after.pd, before.pd);
    assert_eq!(
        (after.start, after.iova, after.length, after.access),
        (before.start, before.iova, before.length, before.access)
    );
    // The old PD is free, the new one is referenced.
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd_b))),
        Status::Busy
    );
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd_a))),
        Status::Ok
    );
    assert_eq!(
        guest.status(ControlRequest::DeregMr(handle(mr.mr.get()))),
        Status::Ok
    );
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd_b))),
        Status::Ok
    );
    assert_eq!(fake.world().live(), 0);
}

#[test]
fn access_alone_changes_the_host_mr_in_place() {
    let (fake, guest) = guest();
    let pd = guest.alloc_pd();
    let mr = registered(&guest, pd, 0x1000, PAGE, &[RAM_BASE]);
    let wide = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let relaxed = wide | AccessFlags::RELAXED_ORDERING;
    rereg(
        &guest,
        mr.mr.get(),
        &Change {
            access: Some(relaxed),
            ..NONE
        },
    )
    .unwrap();
    // The relaxed-ordering hint is not passed on, as with REG_MR.
    assert_eq!(only_host_mr(&fake).1.access, wide);
    // Invalid access is refused before anything happens.
    assert_eq!(
        rereg(
            &guest,
            mr.mr.get(),
            &Change {
                access: Some(AccessFlags::REMOTE_WRITE),
                ..NONE
            }
        ),
        Err(Status::Invalid)
    );
    assert_eq!(only_host_mr(&fake).1.access, wide);
}

#[test]
fn translation_alone_registers_new_pages_and_moves_the_byte_quota() {
    let (fake, guest) = guest();
    let pd = guest.alloc_pd();
    let big: Vec<u64> = (0..40).map(|i| RAM_BASE + i * PAGE).collect();
    let mr = registered(&guest, pd, 0x7000_0000, 40 * PAGE, &big);
    let (old_host, old) = only_host_mr(&fake);
    // 40 of 64 quota pages are in use: a second 40-page MR does not fit ...
    let other: Vec<u64> = (0..40).map(|i| RAM_BASE + (100 + i) * PAGE).collect();
    assert!(matches!(
        reg_mr(&guest, pd, 0, 40 * PAGE, &other),
        ControlResponse::Err(e) if e.status() == Status::Quota
    ));
    // ... but the MR itself may grow to 60 pages (its own 40 are given back) ...
    let sixty: Vec<u64> = (0..60).map(|i| RAM_BASE + (200 + i) * PAGE).collect();
    rereg(
        &guest,
        mr.mr.get(),
        &Change {
            translation: Some((0x7000_0000, 60 * PAGE, &sixty)),
            ..NONE
        },
    )
    .unwrap();
    // ... but not past the quota with its own pages counted once: 60 + 4 are all 64.
    let four: Vec<u64> = (0..4).map(|i| RAM_BASE + (300 + i) * PAGE).collect();
    let small = registered(&guest, pd, 0, 4 * PAGE, &four);
    let sixty_one: Vec<u64> = (0..61).map(|i| RAM_BASE + (200 + i) * PAGE).collect();
    assert_eq!(
        rereg(
            &guest,
            mr.mr.get(),
            &Change {
                translation: Some((0x7000_0000, 61 * PAGE, &sixty_one)),
                ..NONE
            }
        ),
        Err(Status::Quota)
    );
    assert_eq!(
        guest.status(ControlRequest::DeregMr(handle(small.mr.get()))),
        Status::Ok
    );
    // Shrink to two pages, 0x10 bytes into the first, pages out of order.
    let pages = [RAM_BASE + 5 * PAGE, RAM_BASE + 2 * PAGE];
    let keys = rereg(
        &guest,
        mr.mr.get(),
        &Change {
            translation: Some((0x9000_0010, PAGE + 8, &pages)),
            ..NONE
        },
    )
    .unwrap();
    let (new_host, new) = only_host_mr(&fake);
    assert_ne!(new_host, old_host, "a new host MR; the old one is gone");
    assert_ne!((keys.lkey, keys.rkey), (mr.lkey, mr.rkey), "new keys");
    assert_eq!((new.iova, new.length), (0x9000_0010, PAGE + 8));
    assert_eq!(
        (new.pd, new.access),
        (old.pd, old.access),
        "PD and access kept"
    );
    // The new window maps the new pages.
    let mem = guest.memory.memory();
    mem.write_obj(0xfeed_f00d_u32, GuestAddress(RAM_BASE + 5 * PAGE + 0x10))
        .unwrap();
    mem.write_obj(0xabad_cafe_u32, GuestAddress(RAM_BASE + 2 * PAGE))
        .unwrap();
    assert_eq!(read_word(new.start), 0xfeed_f00d);
    assert_eq!(read_word(new.start + PAGE - 0x10), 0xabad_cafe);
    // 2 pages in use now: a 40-page MR fits again, 63 would not.
    assert!(matches!(
        reg_mr(&guest, pd, 0, 40 * PAGE, &other),
        ControlResponse::Ok(_)
    ));
    assert_eq!(
        guest.status(ControlRequest::DeregMr(handle(mr.mr.get()))),
        Status::Ok
    );
    assert_eq!(fake.world().mrs.len(), 1);
}

#[test]
fn every_flag_combined() {
    let (fake, guest) = guest();
    let (pd_a, pd_b) = (guest.alloc_pd(), guest.alloc_pd());
    let mr = registered(&guest, pd_a, 0x1000, PAGE, &[RAM_BASE]);
    let pd_b_host = {
        let before = only_host_mr(&fake).1;
        // PD handles on the host are distinct and the first one is `before.pd`.
        before.pd.0 + 1
    };
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
    let pages = [RAM_BASE + 7 * PAGE, RAM_BASE + 9 * PAGE];
    let keys = rereg(
        &guest,
        mr.mr.get(),
        &Change {
            pd: Some(pd_b),
            access: Some(access),
            translation: Some((0x2000, 2 * PAGE, &pages)),
        },
    )
    .unwrap();
    let (_, init) = only_host_mr(&fake);
    assert_eq!(init.pd.0, pd_b_host);
    assert_eq!(
        (init.access, init.iova, init.length),
        (access, 0x2000, 2 * PAGE)
    );
    assert_ne!(keys.lkey, mr.lkey);
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd_a))),
        Status::Ok
    );
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd_b))),
        Status::Busy
    );
    // Then PD and access together over the same window.
    let pd_c = guest.alloc_pd();
    let again = rereg(
        &guest,
        mr.mr.get(),
        &Change {
            pd: Some(pd_c),
            access: Some(AccessFlags::LOCAL_WRITE),
            ..NONE
        },
    )
    .unwrap();
    assert_ne!(again, keys);
    let (_, last) = only_host_mr(&fake);
    assert_eq!(
        (last.access, last.iova, last.length),
        (AccessFlags::LOCAL_WRITE, 0x2000, 2 * PAGE)
    );
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd_b))),
        Status::Ok
    );
}

#[test]
fn failures_leave_the_old_mr_registered() {
    let (fake, guest) = guest();
    let (pd, pd_b) = (guest.alloc_pd(), guest.alloc_pd());
    let mr = registered(&guest, pd, 0x1000, PAGE, &[RAM_BASE]);
    let before = only_host_mr(&fake);
    let counts = guest.dev().object_counts();
    let new_pages = [RAM_BASE + 3 * PAGE];
    let translation = Change {
        pd: Some(pd_b),
        translation: Some((0x5000, PAGE, &new_pages)),
        ..NONE
    };
    let unchanged = |what: &str| {
        assert_eq!(only_host_mr(&fake), before, "{what}");
        assert_eq!(guest.dev().object_counts(), counts, "{what}");
    };
    // The new registration fails on the host.
    fake.world().fail_next = Some("REG_MR");
    assert_eq!(
        rereg(&guest, mr.mr.get(), &translation),
        Err(Status::DeviceError)
    );
    unchanged("failed registration");
    // The old registration cannot be dropped: the new one is, and the old one stays.
    fake.world().fail_next = Some("DEREG_MR");
    assert_eq!(
        rereg(&guest, mr.mr.get(), &translation),
        Err(Status::DeviceError)
    );
    unchanged("failed deregistration");
    // A PD change whose new registration fails, or whose old one cannot be dropped.
    let pd_only = Change {
        pd: Some(pd_b),
        ..NONE
    };
    for step in ["REG_MR", "DEREG_MR"] {
        fake.world().fail_next = Some(step);
        assert_eq!(
            rereg(&guest, mr.mr.get(), &pd_only),
            Err(Status::DeviceError),
            "{step}"
        );
        unchanged(step);
    }
    // Pages outside guest RAM, and over the byte quota.
    let outside = Change {
        translation: Some((0, PAGE, &[0])),
        ..NONE
    };
    assert_eq!(
        rereg(&guest, mr.mr.get(), &outside),
        Err(Status::BadAddress)
    );
    let many: Vec<u64> = (0..65).map(|i| RAM_BASE + i * PAGE).collect();
    let too_many = Change {
        translation: Some((0, 65 * PAGE, &many)),
        ..NONE
    };
    assert_eq!(rereg(&guest, mr.mr.get(), &too_many), Err(Status::Invalid));
    unchanged("refused translations");
    // The PD references did not move: the old PD is busy, the other one free.
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::Busy
    );
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd_b))),
        Status::Ok
    );
    // And the MR still works: it re-registers and deregisters normally.
    rereg(
        &guest,
        mr.mr.get(),
        &Change {
            translation: Some((0x5000, PAGE, &new_pages)),
            ..NONE
        },
    )
    .unwrap();
    assert_eq!(
        guest.status(ControlRequest::DeregMr(handle(mr.mr.get()))),
        Status::Ok
    );
    assert_eq!(
        guest.status(ControlRequest::DeallocPd(handle(pd))),
        Status::Ok
    );
    assert_eq!(fake.world().live(), 0);
}

#[test]
fn foreign_and_stale_handles_are_refused() {
    let fake = FakeDevice::new();
    let factory = GuestDeviceFactory::new(fake.clone(), test_options()).unwrap();
    let a = TestGuest::from_factory(&factory, VRDMA_F_RING_RXE_V1);
    let b = TestGuest::from_factory(&factory, VRDMA_F_RING_RXE_V1);
    let pd_a = a.alloc_pd();
    let mr_a = registered(&a, pd_a, 0x1000, PAGE, &[RAM_BASE]);
    // B has no MR: A's handle means nothing in B's namespace.
    let pd_b = b.alloc_pd();
    let pd_b2 = b.alloc_pd();
    assert_eq!(
        rereg(
            &b,
            mr_a.mr.get(),
            &Change {
                pd: Some(pd_b),
                ..NONE
            }
        ),
        Err(Status::BadHandle)
    );
    // A has one PD: B's second PD handle is unknown to A.
    assert_ne!(pd_b2, pd_a);
    assert_eq!(
        rereg(
            &a,
            mr_a.mr.get(),
            &Change {
                pd: Some(pd_b2),
                ..NONE
            }
        ),
        Err(Status::BadHandle)
    );
    // A handle of the wrong kind, zero, and a destroyed MR.
    assert_eq!(
        rereg(
            &a,
            pd_a,
            &Change {
                access: Some(AccessFlags::LOCAL_WRITE),
                ..NONE
            }
        )
        .err(),
        if pd_a == mr_a.mr.get() {
            None
        } else {
            Some(Status::BadHandle)
        }
    );
    let access_only = Change {
        access: Some(AccessFlags::LOCAL_WRITE),
        ..NONE
    };
    assert_eq!(rereg(&a, 0, &access_only), Err(Status::BadHandle));
    assert_eq!(
        a.status(ControlRequest::DeregMr(handle(mr_a.mr.get()))),
        Status::Ok
    );
    assert_eq!(
        rereg(&a, mr_a.mr.get(), &access_only),
        Err(Status::BadHandle)
    );
    assert_eq!(fake.world().mrs.len(), 0);
}

#[test]
fn a_revoked_mr_only_deregisters() {
    let (fake, guest) = guest();
    let pd = guest.alloc_pd();
    let mr = registered(&guest, pd, 0x1000, PAGE, &[RAM_BASE + 3 * PAGE]);
    let other = memfd(RAM_SIZE);
    guest.memory.lock().unwrap().replace(guest_memory(&other));
    guest.dev().memory_changed(guest.guest_io());
    assert_eq!(fake.world().mrs.len(), 0);
    assert_eq!(
        rereg(
            &guest,
            mr.mr.get(),
            &Change {
                translation: Some((0x1000, PAGE, &[RAM_BASE])),
                ..NONE
            }
        ),
        Err(Status::BadState)
    );
    assert_eq!(fake.world().mrs.len(), 0);
    assert_eq!(
        guest.status(ControlRequest::DeregMr(handle(mr.mr.get()))),
        Status::Ok
    );
}

#[test]
fn a_translation_of_max_mr_pages_fits_the_request_size() {
    // A REREG_MR body is 8 bytes longer than a REG_MR body: max_request_size must cover it,
    // or the largest translation is refused as a request too large.
    let (fake, guest) = guest();
    let pd = guest.alloc_pd();
    let mr = registered(&guest, pd, 0x1000, PAGE, &[RAM_BASE]);
    let max_pages = test_options().max_mr_pages as u64;
    let pages: Vec<u64> = (0..max_pages).map(|i| RAM_BASE + i * PAGE).collect();
    let translation = (0x10_0000, max_pages * PAGE, &pages[..]);
    rereg(
        &guest,
        mr.mr.get(),
        &Change {
            translation: Some(translation),
            ..NONE
        },
    )
    .expect("a REREG_MR of max_mr_pages pages");
    assert_eq!(only_host_mr(&fake).1.length, max_pages * PAGE);
}

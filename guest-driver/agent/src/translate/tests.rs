use vrdma_spec::control::{
    encode_extent_list, encode_page_list, rereg_flags, RegMr, RegMrExtents, ReregMr,
};
use vrdma_spec::wire::{RegMrReq, ReregMrReq};
use vrdma_spec::{ControlRequest, Le32, Le64, Status};

use super::{ProcessRam, PAGE};

const BASE: u64 = 1 << 30;

/// The guest pages of 8 process pages: scattered, two of them adjacent (pages 2 and 3).
const GUEST_PAGES: [u64; 8] = [
    0x9000, 0x5000, 0x20000, 0x21000, 0x7000, 0x3000, 0x40000, 0x11000,
];

fn ram() -> ProcessRam {
    ProcessRam::new(BASE, GUEST_PAGES.len() as u64)
}

fn guest_page(addr: u64) -> Option<u64> {
    GUEST_PAGES
        .get(usize::try_from((addr - BASE) / PAGE).ok()?)
        .copied()
}

fn reg_req(iova: u64, length: u64, shift: u32, npages: u32) -> RegMrReq {
    RegMrReq {
        pd: Le32::new(1),
        access: Le32::new(1),
        iova: Le64::new(iova),
        length: Le64::new(length),
        page_shift: Le32::new(shift),
        npages: Le32::new(npages),
    }
}

fn rewrite(request: &ControlRequest<'_>, extents: bool) -> Result<Vec<u8>, Status> {
    let bytes = ram()
        .registration(request)?
        .expect("a registration")
        .rewrite(guest_page, extents, 1024)?;
    // The result is itself a valid request.
    ControlRequest::decode(&bytes).expect("decodes");
    Ok(bytes)
}

/// The 4 KiB guest pages a rewritten registration lists, in order.
fn listed(bytes: &[u8]) -> Vec<u64> {
    match ControlRequest::decode(bytes).unwrap() {
        ControlRequest::RegMr(m) => {
            assert_eq!(m.req.page_shift.get(), 12);
            m.pages.iter().collect()
        }
        ControlRequest::RegMrExtents(m) => {
            assert_eq!(m.req.page_shift.get(), 12);
            m.extents
                .iter()
                .flat_map(|(start, len)| (0..len / PAGE).map(move |i| start + i * PAGE))
                .collect()
        }
        ControlRequest::ReregMr(m) => {
            assert_eq!(m.req.page_shift.get(), 12);
            m.pages.iter().collect()
        }
        other => panic!("not a registration: {other:?}"),
    }
}

#[test]
fn a_page_list_becomes_the_guest_pages_under_the_mr() {
    let mut list = Vec::new();
    encode_page_list([BASE + PAGE, BASE + 2 * PAGE, BASE + 3 * PAGE], &mut list);
    // 3 pages from the middle of process page 1.
    let req = reg_req(0x7000_0800, 2 * PAGE, 12, 3);
    let request = ControlRequest::RegMr(RegMr::new(req, &list));
    let page_list = rewrite(&request, false).unwrap();
    assert_eq!(listed(&page_list), [0x5000, 0x20000, 0x21000]);
    // With extents, pages 2 and 3 merge: two extents instead of three pages.
    let extents = rewrite(&request, true).unwrap();
    let ControlRequest::RegMrExtents(m) = ControlRequest::decode(&extents).unwrap() else {
        panic!("not extents");
    };
    assert_eq!(
        m.extents.iter().collect::<Vec<_>>(),
        [(0x5000, PAGE), (0x20000, 2 * PAGE)]
    );
    // iova and length are the process's own.
    assert_eq!(
        (m.req.iova.get(), m.req.length.get()),
        (0x7000_0800, 2 * PAGE)
    );
}

#[test]
fn large_process_pages_are_split_into_the_small_pages_the_mr_covers() {
    // One 16 KiB process page (process pages 4..8); the MR covers its last 5 KiB.
    let mut list = Vec::new();
    encode_page_list([BASE + 4 * PAGE], &mut list);
    let req = reg_req(0x10_0000 + 0x2c00, 0x1400, 14, 1);
    let request = ControlRequest::RegMr(RegMr::new(req, &list));
    assert_eq!(
        listed(&rewrite(&request, false).unwrap()),
        [0x40000, 0x11000]
    );
}

#[test]
fn extents_are_walked_across_their_boundaries() {
    let mut list = Vec::new();
    encode_extent_list([(BASE + 6 * PAGE, 2 * PAGE), (BASE, PAGE)], &mut list);
    let req = reg_req(0x1000, 3 * PAGE, 12, 2);
    let request = ControlRequest::RegMrExtents(RegMrExtents::new(req, &list));
    assert_eq!(
        listed(&rewrite(&request, true).unwrap()),
        [0x40000, 0x11000, 0x9000]
    );
}

#[test]
fn memory_outside_the_process_is_refused() {
    for page in [BASE - PAGE, BASE + 8 * PAGE, 0x5000, BASE + 0x800] {
        let mut list = Vec::new();
        encode_page_list([page, BASE + 8 * PAGE], &mut list);
        let req = reg_req(0, 2 * PAGE, 12, 2);
        let request = ControlRequest::RegMr(RegMr::new(req, &list));
        assert_eq!(
            rewrite(&request, false),
            Err(Status::BadAddress),
            "{page:#x}"
        );
    }
    // More memory than the process has, even through pages it owns.
    let mut list = Vec::new();
    encode_page_list([BASE; 9], &mut list);
    let request = ControlRequest::RegMr(RegMr::new(reg_req(0, 9 * PAGE, 12, 9), &list));
    assert_eq!(rewrite(&request, false), Err(Status::BadAddress));
}

#[test]
fn rereg_with_a_translation_is_rewritten_and_without_one_left_alone() {
    let mut list = Vec::new();
    encode_page_list([BASE + 7 * PAGE], &mut list);
    let req = ReregMrReq {
        mr: Le32::new(3),
        flags: Le32::new(rereg_flags::CHANGE_TRANSLATION),
        pd: Le32::ZERO,
        access: Le32::ZERO,
        iova: Le64::new(0x4000),
        length: Le64::new(PAGE),
        page_shift: Le32::new(12),
        npages: Le32::new(1),
    };
    let request = ControlRequest::ReregMr(ReregMr::new(req, &list));
    assert_eq!(listed(&rewrite(&request, true).unwrap()), [0x11000]);
    let access_only = ReregMrReq {
        flags: Le32::new(rereg_flags::CHANGE_ACCESS),
        access: Le32::new(1),
        iova: Le64::ZERO,
        length: Le64::ZERO,
        page_shift: Le32::ZERO,
        npages: Le32::ZERO,
        ..req
    };
    let request = ControlRequest::ReregMr(ReregMr::new(access_only, &[]));
    assert!(ram().registration(&request).unwrap().is_none());
    assert!(ram()
        .registration(&ControlRequest::QueryDevice)
        .unwrap()
        .is_none());
}

#[test]
fn what_is_pinned_is_each_named_page_once_in_runs() {
    // Pages 5, 1, 2, 1 (again), 6: three MR pages name page 1 twice.
    let mut list = Vec::new();
    let named = [5, 1, 2, 1, 6].map(|i| BASE + i * PAGE);
    encode_page_list(named, &mut list);
    let request = ControlRequest::RegMr(RegMr::new(reg_req(0, 5 * PAGE, 12, 5), &list));
    let registration = ram().registration(&request).unwrap().unwrap();
    assert_eq!(registration.pages(), named);
    assert_eq!(
        registration.runs(),
        [(BASE + PAGE, 2 * PAGE), (BASE + 5 * PAGE, 2 * PAGE)]
    );
    // A page the lookup does not know (not pinned) is never handed to the device.
    let unpinned = |addr| {
        (addr != BASE + 6 * PAGE)
            .then(|| guest_page(addr))
            .flatten()
    };
    assert_eq!(
        registration.rewrite(unpinned, false, 1024),
        Err(Status::BadAddress)
    );
}

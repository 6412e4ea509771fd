//! REREG_MR decoding: each flag alone and combined, the fields a flag leaves unused must be
//! zero, and a translation change is checked exactly like REG_MR's page list.

mod common;

use common::*;
use vrdma_spec::control::{encode_page_list, rereg_flags, ReregMr};
use vrdma_spec::verbs::AccessFlags;
use vrdma_spec::wire::ReregMrReq;
use vrdma_spec::{ControlRequest, DecodeError, Le32, Le64, Status};
use zerocopy::FromZeros;

fn decode(req: ReregMrReq, pages: &[u8]) -> Result<(), DecodeError> {
    let bytes = ControlRequest::ReregMr(ReregMr::new(req, pages)).to_vec();
    match ControlRequest::decode(&bytes)? {
        ControlRequest::ReregMr(m) => {
            assert_eq!(m.req, req);
            Ok(())
        }
        other => panic!("{other:?}"),
    }
}

fn status(r: Result<(), DecodeError>) -> Status {
    match r {
        Ok(()) => Status::Ok,
        Err(e) => e.status(),
    }
}

/// Only `flags` set, every other field zero.
fn bare(flags: u32) -> ReregMrReq {
    let mut r = ReregMrReq::new_zeroed();
    r.mr = Le32::new(1);
    r.flags = Le32::new(flags);
    r
}

#[test]
fn each_flag_alone_and_combined() {
    let pages = page_list();
    let mut pd = bare(rereg_flags::CHANGE_PD);
    pd.pd = Le32::new(3);
    assert_eq!(decode(pd, &[]), Ok(()));
    let mut access = bare(rereg_flags::CHANGE_ACCESS);
    access.access = Le32::new(AccessFlags::REMOTE_READ.bits());
    assert_eq!(decode(access, &[]), Ok(()));
    let mut translation = rereg_mr_req();
    translation.flags = Le32::new(rereg_flags::CHANGE_TRANSLATION);
    translation.pd = Le32::ZERO;
    translation.access = Le32::ZERO;
    assert_eq!(decode(translation, &pages), Ok(()));
    let mut pd_access = bare(rereg_flags::CHANGE_PD | rereg_flags::CHANGE_ACCESS);
    pd_access.pd = Le32::new(3);
    assert_eq!(decode(pd_access, &[]), Ok(()));
    assert_eq!(decode(rereg_mr_req(), &pages), Ok(()));

    let bytes = ControlRequest::ReregMr(ReregMr::new(rereg_mr_req(), &pages)).to_vec();
    let ControlRequest::ReregMr(m) = ControlRequest::decode(&bytes).unwrap() else {
        panic!()
    };
    assert_eq!(m.new_pd(), Some(2));
    assert_eq!(m.new_access(), Some(AccessFlags::LOCAL_WRITE.bits()));
    assert!(m.changes_translation());
    assert_eq!(m.pages.len(), 3);
    assert_eq!(m.page_size(), 4096);
    let bytes = ControlRequest::ReregMr(ReregMr::new(pd, &[])).to_vec();
    let ControlRequest::ReregMr(m) = ControlRequest::decode(&bytes).unwrap() else {
        panic!()
    };
    assert_eq!((m.new_pd(), m.new_access()), (Some(3), None));
    assert!(!m.changes_translation() && m.pages.is_empty());
}

#[test]
fn flags_and_unused_fields() {
    assert_eq!(status(decode(bare(0), &[])), Status::Invalid, "no flag");
    assert_eq!(status(decode(bare(1 << 3), &[])), Status::Invalid);
    // A field whose flag is clear is reserved.
    let mut stray_pd = bare(rereg_flags::CHANGE_ACCESS);
    stray_pd.pd = Le32::new(1);
    assert_eq!(decode(stray_pd, &[]), Err(DecodeError::Reserved("pd")));
    let mut stray_access = bare(rereg_flags::CHANGE_PD);
    stray_access.access = Le32::new(1);
    assert_eq!(
        decode(stray_access, &[]),
        Err(DecodeError::Reserved("access"))
    );
    let mut stray_iova = bare(rereg_flags::CHANGE_PD);
    stray_iova.iova = Le64::new(0x1000);
    assert_eq!(decode(stray_iova, &[]), Err(DecodeError::Reserved("iova")));
    let mut stray_pages = bare(rereg_flags::CHANGE_PD);
    stray_pages.npages = Le32::new(1);
    assert_eq!(status(decode(stray_pages, &[])), Status::Invalid);
    // A page list without CHANGE_TRANSLATION is trailing bytes.
    let pages = page_list();
    assert!(matches!(
        decode(bare(rereg_flags::CHANGE_PD), &pages),
        Err(DecodeError::Trailing { .. })
    ));
    // Access flags as REG_MR: unknown bits, remote write without local write.
    let mut bad = bare(rereg_flags::CHANGE_ACCESS);
    bad.access = Le32::new(AccessFlags::ZERO_BASED.bits());
    assert_eq!(status(decode(bad, &[])), Status::Invalid);
    bad.access = Le32::new(AccessFlags::REMOTE_WRITE.bits());
    assert_eq!(status(decode(bad, &[])), Status::Invalid);
    let mut bad_translation = rereg_mr_req();
    bad_translation.access = Le32::new(AccessFlags::REMOTE_ATOMIC.bits());
    assert_eq!(status(decode(bad_translation, &pages)), Status::Invalid);
}

#[test]
fn translation_is_checked_like_reg_mr() {
    let pages = page_list();
    let mut short = rereg_mr_req();
    short.npages = Le32::new(2);
    assert!(matches!(
        decode(short, &pages),
        Err(DecodeError::PageCount {
            expected: 3,
            got: 2
        })
    ));
    assert!(matches!(
        decode(rereg_mr_req(), &pages[..16]),
        Err(DecodeError::Short { .. })
    ));
    let mut misaligned = Vec::new();
    encode_page_list([0x1000_0000u64, 0x2000_3008, 0x7fff_f000], &mut misaligned);
    assert!(matches!(
        decode(rereg_mr_req(), &misaligned),
        Err(DecodeError::Misaligned { .. })
    ));
    let mut zero_length = rereg_mr_req();
    zero_length.length = Le64::ZERO;
    assert_eq!(status(decode(zero_length, &pages)), Status::Invalid);
    let mut shift = rereg_mr_req();
    shift.page_shift = Le32::new(31);
    assert_eq!(status(decode(shift, &pages)), Status::Invalid);
    // Truncated fixed part.
    let bytes = ControlRequest::ReregMr(ReregMr::new(bare(rereg_flags::CHANGE_PD), &[])).to_vec();
    assert!(matches!(
        ControlRequest::decode(&bytes[..bytes.len() - 1]),
        Err(DecodeError::Short { .. })
    ));
}

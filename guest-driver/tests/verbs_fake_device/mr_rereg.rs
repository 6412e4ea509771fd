//! `Mr::rereg` and `Mr::rereg_translation` against the fake device: what REREG_MR carries for
//! each change, the region following the device's answer, and failures leaving it unchanged.

use vrdma::dma::PAGE_SIZE;
use vrdma::spec::control::{rereg_flags, ControlRequest, Opcode};
use vrdma::spec::{Status, StatusError};
use vrdma::verbs::{AccessFlags, MrChange, VerbsError};
use vrdma_test_support::fake_transport::Fault;

use crate::helpers::*;

/// The last REREG_MR the fake received, decoded: flags, PD, access, page count.
fn last_rereg(t: &vrdma_test_support::fake_transport::FakeTransport) -> (u32, u32, u32, usize) {
    let dev = t.device();
    let (_, bytes) = dev
        .log
        .iter()
        .rev()
        .find(|(op, _)| *op == Opcode::ReregMr)
        .expect("a REREG_MR");
    let ControlRequest::ReregMr(m) = ControlRequest::decode(bytes).unwrap() else {
        panic!()
    };
    (
        m.req.flags.get(),
        m.req.pd.get(),
        m.req.access.get(),
        m.pages.len(),
    )
}

#[test]
fn pd_and_access_change_in_place() {
    let (t, ctx) = open();
    let (pd_a, pd_b) = (ctx.alloc_pd().unwrap(), ctx.alloc_pd().unwrap());
    let buf = ctx.alloc_buffer(PAGE_SIZE).unwrap();
    let mut mr = pd_a.register(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    let keys = (mr.lkey(), mr.rkey());
    let wide = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    mr.rereg(MrChange {
        pd: Some(&pd_b),
        access: Some(wide),
    })
    .unwrap();
    assert_eq!(
        last_rereg(&t),
        (
            rereg_flags::CHANGE_PD | rereg_flags::CHANGE_ACCESS,
            pd_b.handle(),
            wide.bits(),
            0
        )
    );
    assert_eq!((mr.lkey(), mr.rkey()), keys);
    assert_eq!(mr.access(), wide);
    {
        let dev = t.device();
        let fake = &dev.mrs[&mr.handle()];
        assert_eq!((fake.pd, fake.access), (pd_b.handle(), wide.bits()));
    }
    // The region now holds the new PD: dropping the old one deallocates it at once, the new
    // one only after the region.
    t.device().log.clear();
    drop(pd_a);
    drop(pd_b);
    assert_eq!(t.device().ops(), [Opcode::DeallocPd]);
    drop(mr);
    assert_eq!(t.device().ops()[1..], [Opcode::DeregMr, Opcode::DeallocPd]);
    assert!(t.device().is_empty());
}

#[test]
fn translation_moves_the_region_and_takes_the_new_keys() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let old = ctx.alloc_buffer(PAGE_SIZE).unwrap();
    let new = ctx.alloc_buffer(3 * PAGE_SIZE).unwrap();
    let mut mr = pd.register(&old, AccessFlags::LOCAL_WRITE).unwrap();
    let keys = (mr.lkey(), mr.rkey());
    let (addr, len) = (new.as_ptr().wrapping_add(100), 2 * PAGE_SIZE);
    // SAFETY: `new` is DMA memory that outlives the region (dropped after it).
    unsafe { mr.rereg_translation(MrChange::default(), addr, len) }.unwrap();
    assert_eq!(last_rereg(&t), (rereg_flags::CHANGE_TRANSLATION, 0, 0, 3));
    assert_ne!((mr.lkey(), mr.rkey()), keys);
    assert_eq!((mr.addr(), mr.len()), (addr as u64, len));
    assert_eq!(mr.access(), AccessFlags::LOCAL_WRITE, "kept");
    let sge = mr.sge(0, 8).unwrap();
    assert_eq!((sge.addr, sge.lkey), (addr as u64, mr.lkey()));
    {
        let dev = t.device();
        let fake = &dev.mrs[&mr.handle()];
        assert_eq!((fake.iova, fake.len), (addr as u64, len as u64));
        assert_eq!((fake.lkey, fake.rkey), (mr.lkey(), mr.rkey()));
    }
    drop(mr);
    drop(pd);
    assert!(t.device().is_empty());
}

#[test]
fn failures_leave_the_region_unchanged() {
    let (t, ctx) = open();
    let (pd_a, pd_b) = (ctx.alloc_pd().unwrap(), ctx.alloc_pd().unwrap());
    let buf = ctx.alloc_buffer(PAGE_SIZE).unwrap();
    let mut mr = pd_a.register(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    let before = (mr.addr(), mr.len(), mr.lkey(), mr.rkey(), mr.access());
    let state =
        |mr: &vrdma::verbs::Mr<'_>| (mr.addr(), mr.len(), mr.lkey(), mr.rkey(), mr.access());

    t.inject(Fault::Fail(Opcode::ReregMr, StatusError::device_error(95)));
    let err = mr
        .rereg(MrChange {
            pd: Some(&pd_b),
            access: None,
        })
        .unwrap_err();
    assert!(err.to_string().contains("REREG_MR"), "{err}");
    assert_eq!(state(&mr), before);
    // Still on PD A: dropping B deallocates it.
    t.device().log.clear();
    drop(pd_b);
    assert_eq!(t.device().ops(), [Opcode::DeallocPd]);

    // Refused before any command: nothing to change, bad access, memory that is not DMA.
    t.device().log.clear();
    assert!(matches!(
        mr.rereg(MrChange::default()),
        Err(VerbsError::InvalidArgument(_))
    ));
    assert!(matches!(
        mr.rereg(MrChange {
            pd: None,
            access: Some(AccessFlags::REMOTE_WRITE),
        }),
        Err(VerbsError::InvalidArgument(_))
    ));
    let stack = [0u8; 64];
    // SAFETY: refused before any command; nothing keeps the address.
    let err = unsafe { mr.rereg_translation(MrChange::default(), stack.as_ptr(), 64) };
    assert!(matches!(err, Err(VerbsError::Transport(_))));
    assert!(t.device().log.is_empty());
    // A PD of another context.
    let (_t2, ctx2) = open();
    let foreign = ctx2.alloc_pd().unwrap();
    assert!(matches!(
        mr.rereg(MrChange {
            pd: Some(&foreign),
            access: None,
        }),
        Err(VerbsError::InvalidArgument(_))
    ));
    // A device status for a translation.
    let other = ctx.alloc_buffer(PAGE_SIZE).unwrap();
    t.inject(Fault::Fail(
        Opcode::ReregMr,
        StatusError::new(Status::BadAddress),
    ));
    // SAFETY: `other` outlives the region.
    let err = unsafe { mr.rereg_translation(MrChange::default(), other.as_ptr(), PAGE_SIZE) };
    assert_eq!(status_of(&err.unwrap_err()), Some(Status::BadAddress));
    assert_eq!(state(&mr), before);
    drop(mr);
    drop(pd_a);
    assert!(t.device().is_empty());
}

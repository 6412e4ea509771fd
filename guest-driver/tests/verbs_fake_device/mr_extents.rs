//! REG_MR against the fake device: extents when the device takes them, the page list when it
//! does not or when the buffer has more pieces than extents allowed, the same MR either way.

use vrdma::dma::PAGE_SIZE;
use vrdma::spec::control::{ControlRequest, Opcode};
use vrdma::spec::features;
use vrdma::verbs::{AccessFlags, Context};
use vrdma_test_support::fake_transport::{default_config, FakeTransport};

use crate::helpers::*;

/// The last registration the fake received: its opcode, entries, and the pages they name.
fn last_registration(t: &FakeTransport) -> (Opcode, usize, Vec<u64>) {
    let dev = t.device();
    let (op, bytes) = dev
        .log
        .iter()
        .rev()
        .find(|(op, _)| matches!(op, Opcode::RegMr | Opcode::RegMrExtents))
        .expect("a registration");
    match ControlRequest::decode(bytes).unwrap() {
        ControlRequest::RegMr(m) => (*op, m.pages.len(), m.pages.iter().collect()),
        ControlRequest::RegMrExtents(m) => {
            let page = PAGE_SIZE as u64;
            let pages = m
                .extents
                .iter()
                .flat_map(|(gpa, len)| (0..len / page).map(move |i| gpa + i * page))
                .collect();
            (*op, m.extents.len(), pages)
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_contiguous_buffer_is_one_extent() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let buf = ctx.alloc_buffer(5 * PAGE_SIZE).unwrap();
    let mr = pd.register(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    let (op, entries, pages) = last_registration(&t);
    assert_eq!((op, entries, pages.len()), (Opcode::RegMrExtents, 1, 5));
    assert!(pages.windows(2).all(|w| w[1] == w[0] + PAGE_SIZE as u64));
    assert_eq!(t.device().mrs[&mr.handle()].pages, pages);
}

#[test]
fn without_the_feature_the_page_list_is_sent() {
    let t = FakeTransport::with(default_config(), features::VRDMA_F_RING_RXE_V1);
    let ctx = Context::open(t.clone()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let buf = ctx.alloc_buffer(5 * PAGE_SIZE).unwrap();
    pd.register(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    let (op, entries, pages) = last_registration(&t);
    assert_eq!((op, entries), (Opcode::RegMr, 5));
    assert!(pages.windows(2).all(|w| w[1] == w[0] + PAGE_SIZE as u64));
}

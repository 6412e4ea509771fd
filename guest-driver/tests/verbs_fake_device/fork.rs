//! `fork()` with a context open: the child gets no mapping of guest RAM (registered buffers,
//! command buffers), and the parent's regions keep working through the kernel afterwards.

use vrdma::dma::PAGE_SIZE;
use vrdma::verbs::{AccessFlags, Cq, RecvWr, SendFlags, SendWr, WcStatus, WrOpcode};
use vrdma_test_support::fork::in_child;

use crate::helpers::*;

/// Whether any page of `[addr, addr + len)` is mapped in the calling process (mincore fails
/// with ENOMEM on unmapped addresses).
fn mapped(addr: usize, len: usize) -> bool {
    let start = addr & !(PAGE_SIZE - 1);
    let mut resident = [0u8; 8];
    assert!(len <= resident.len() * PAGE_SIZE - (addr - start));
    // SAFETY: `resident` has a byte for every page of the range.
    let rc = unsafe { libc::mincore(start as *mut libc::c_void, len, resident.as_mut_ptr()) };
    rc == 0
}

#[test]
fn the_child_has_no_guest_ram_and_the_parent_keeps_its_regions() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (Cq::new(&ctx, 16).unwrap(), Cq::new(&ctx, 16).unwrap());
    let (a, b) = connected_pair(&pd, &cq_a, &cq_b);
    let src = filled(&ctx, &[0x5a; 512]);
    let src_mr = pd.register(&src, AccessFlags::empty()).unwrap();
    let dst = ctx.alloc_buffer(512).unwrap();
    let dst_mr = pd.register(&dst, AccessFlags::LOCAL_WRITE).unwrap();

    let (src_addr, dst_addr) = (src.as_ptr() as usize, dst.as_ptr() as usize);
    assert!(mapped(src_addr, 512) && mapped(dst_addr, 512));
    let status = in_child(|| {
        if mapped(src_addr, 512) || mapped(dst_addr, 512) {
            1
        } else {
            0
        }
    });
    assert_eq!(
        status, 0,
        "the child maps the parent's registered guest RAM"
    );

    // The parent's regions, queues and command path are untouched.
    let recv_sge = [dst_mr.sge(0, 512).unwrap()];
    b.post_recv(&[RecvWr {
        wr_id: 2,
        sg_list: &recv_sge,
    }])
    .unwrap();
    let send_sge = [src_mr.sge(0, 512).unwrap()];
    post(
        &a,
        &[SendWr {
            wr_id: 1,
            opcode: WrOpcode::Send,
            flags: SendFlags::SIGNALED,
            sg_list: &send_sge,
            ..SendWr::default()
        }],
    )
    .unwrap();
    t.run_kernel();
    assert_eq!(poll_all(&cq_a)[0].status, WcStatus::Success);
    assert_eq!(poll_all(&cq_b)[0].status, WcStatus::Success);
    assert!(dst.as_slice().iter().all(|&x| x == 0x5a));
    // A control command after the fork.
    pd.register(&src, AccessFlags::empty()).unwrap();
}

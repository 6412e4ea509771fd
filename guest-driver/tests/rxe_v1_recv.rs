//! The rxe v1 receive queue (QP receive queues and SRQs) against the simulated Soft-RoCE kernel
//! ([`vrdma_test_support::rxe_kernel_sim`]): every field of a receive WQE over many wraps, and
//! the accesses of a queue reached through a [`RegionAccess`](vrdma::transport::RegionAccess).

use std::sync::atomic::Ordering;

use vrdma::provider::rxe_v1::RecvQueue;
use vrdma::provider::{PostError, RecvWr, Sge};
use vrdma_test_support::for_both_reaches;
use vrdma_test_support::rxe_kernel_sim::{rxe_sges, Access, Reach, SharedQueue};

fn receive_wqes_carry_every_field_and_wrap(reach: Reach) {
    let shared = SharedQueue::new(reach, 8, 7);
    let k = shared.kernel();
    let mut rq = RecvQueue::new(shared.queue(), 4).unwrap();
    assert_eq!(rq.capacity(), 7);
    let sgl: Vec<Sge> = (0..4)
        .map(|j| Sge {
            addr: 0x4000 + j * 0x1000,
            length: 0x1000 - j as u32,
            lkey: 40 + j as u32,
        })
        .collect();
    let wrs = [
        RecvWr {
            wr_id: 10,
            sg_list: &sgl,
        },
        RecvWr {
            wr_id: 11,
            sg_list: &sgl[..1],
        },
        RecvWr {
            wr_id: 12,
            sg_list: &[],
        },
    ];
    rq.post_recv(&wrs).unwrap();
    assert_eq!(k.producer().load(Ordering::Acquire), 3);
    for (i, wr) in wrs.iter().enumerate() {
        let wqe = k.recv_wqe(i as u32);
        let length: u32 = wr.sg_list.iter().map(|s| s.length).sum();
        assert_eq!(
            (wqe.wr_id.get(), wqe.reserved.get(), wqe.padding.get()),
            (wr.wr_id, 0, 0)
        );
        assert_eq!(
            (
                wqe.dma.length.get(),
                wqe.dma.resid.get(),
                wqe.dma.cur_sge.get(),
                wqe.dma.num_sge.get()
            ),
            (length, length, 0, wr.sg_list.len() as u32)
        );
        assert_eq!((wqe.dma.sge_offset.get(), wqe.dma.reserved.get()), (0, 0));
        assert_eq!(k.sges(i as u32, 40, wr.sg_list.len()), rxe_sges(wr.sg_list));
    }

    let five = [sgl[0]; 5];
    let too_many = [
        wrs[1],
        RecvWr {
            wr_id: 13,
            sg_list: &five,
        },
    ];
    assert_eq!(
        rq.post_recv(&too_many),
        Err((1, PostError::TooManySges { num: 5, max: 4 }))
    );
    let fill = [wrs[2]; 4];
    assert_eq!(rq.post_recv(&fill), Err((3, PostError::QueueFull)));
    assert_eq!(k.producer().load(Ordering::Acquire), 7);

    // Many wraps on a full queue: each time the kernel consumes one, exactly one more fits.
    let mut cons = 0u32;
    for round in 0..5000u64 {
        cons = (cons + 1) & 7;
        k.consumer().store(cons, Ordering::Release);
        let wr = RecvWr {
            wr_id: round,
            sg_list: &sgl[..(round % 5) as usize],
        };
        assert_eq!(rq.post_recv(&[wr, wr]), Err((1, PostError::QueueFull)));
        let prod = k.producer().load(Ordering::Acquire);
        assert_eq!(prod, cons.wrapping_sub(1) & 7);
        let wqe = k.recv_wqe(prod.wrapping_sub(1));
        assert_eq!(
            (wqe.wr_id.get(), wqe.dma.num_sge.get()),
            (round, (round % 5) as u32)
        );
        assert_eq!(
            k.sges(prod.wrapping_sub(1), 40, (round % 5) as usize),
            rxe_sges(wr.sg_list)
        );
    }
}

/// The same for receive WQEs (the SRQ path is the same queue type).
#[test]
fn accessed_receive_queue_writes_each_wqe_once_before_publishing() {
    let shared = SharedQueue::new(Reach::Accessed, 4, 7);
    let mut rq = RecvQueue::new(shared.queue(), 4).unwrap();
    let region = shared.region();
    let sgl = [Sge {
        addr: 0x1000,
        length: 64,
        lkey: 5,
    }; 4];
    region.start_log();
    let wrs = [
        RecvWr {
            wr_id: 1,
            sg_list: &sgl,
        },
        RecvWr {
            wr_id: 2,
            sg_list: &sgl[..1],
        },
    ];
    rq.post_recv(&wrs).unwrap();
    let consumer = Access::Load {
        offset: shared.word_offset(256),
    };
    let wqe = |index: u32, sges: usize| Access::Write {
        offset: shared.slot_offset(index),
        len: 40 + 16 * sges,
    };
    assert_eq!(
        region.take_log(),
        [
            consumer,
            wqe(0, 4),
            consumer,
            wqe(1, 1),
            Access::Store {
                offset: shared.word_offset(128),
                value: 2
            }
        ]
    );
    assert_eq!(shared.kernel().recv_wqe(1).wr_id.get(), 2);
}

for_both_reaches!(receive_wqes_carry_every_field_and_wrap,);

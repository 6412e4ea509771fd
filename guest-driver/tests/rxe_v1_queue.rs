//! rxe v1 queues whose shared memory the other side corrupted, against the simulated Soft-RoCE
//! kernel ([`vrdma_test_support::rxe_kernel_sim`]): wrong headers are refused, and wild indices
//! never make the provider read or write outside the buffer (which ends at a guard page).

use std::sync::atomic::Ordering;

use vrdma::provider::rxe_v1::{CompletionQueue, RecvQueue, SendQueue, SendQueueCaps};
use vrdma::provider::{SendFlags, SendWr, WorkCompletion};
use vrdma_spec::rxe_v1::{GeometryError, IbUverbsWc, RingGeometry};
use vrdma_spec::verbs::QpType;
use vrdma_spec::Le64;
use vrdma_test_support::for_both_reaches;
use vrdma_test_support::rxe_kernel_sim::{sge_of, Reach, SharedQueue};
use zerocopy::FromZeros;

fn corrupted_headers_are_refused(reach: Reach) {
    let good = SharedQueue::new(reach, 8, 7);
    assert!(good.try_queue().is_ok());
    let wrong_size = SharedQueue::with_header(reach, 8, 7, 8, 7);
    assert_eq!(
        wrong_size.try_queue().unwrap_err(),
        GeometryError::HeaderMismatch { log2: 8, mask: 7 }
    );
    let wrong_mask = SharedQueue::with_header(reach, 8, 7, 7, 0xffff);
    assert_eq!(
        wrong_mask.try_queue().unwrap_err(),
        GeometryError::HeaderMismatch {
            log2: 7,
            mask: 0xffff
        }
    );
    let wild_index = SharedQueue::new(reach, 8, 7);
    wild_index
        .kernel()
        .consumer()
        .store(0x8000_0001, Ordering::Relaxed);
    assert_eq!(
        wild_index.try_queue().unwrap_err(),
        GeometryError::IndexOutOfRange {
            which: "consumer",
            value: 0x8000_0001
        }
    );
    // The device claims more than is mapped.
    let short = good.queue_claiming(good.buffer_len(), RingGeometry::new(16, 7).unwrap());
    assert_eq!(
        short.unwrap_err(),
        GeometryError::TooSmall {
            need: 384 + 16 * 128,
            mapped: good.buffer_len()
        }
    );
    // Slots too small for what the queue is created for.
    let caps = SendQueueCaps {
        qp_type: QpType::Rc,
        max_sge: 4,
        max_inline: 256,
    };
    assert_eq!(
        SendQueue::new(good.queue(), caps).unwrap_err(),
        GeometryError::SlotTooSmall {
            need: 208 + 256,
            slot: 128
        }
    );
    assert_eq!(
        RecvQueue::new(good.queue(), 6).unwrap_err(),
        GeometryError::SlotTooSmall {
            need: 40 + 6 * 16,
            slot: 128
        }
    );
}

fn corrupted_indices_stay_inside_the_buffer(reach: Reach) {
    // A 4-slot CQ of 64-byte slots ends exactly at the guard page: reading one byte past its
    // last slot would crash the test.
    let shared = SharedQueue::new(reach, 4, 6);
    let k = shared.kernel();
    let mut cq = CompletionQueue::new(shared.queue()).unwrap();
    for i in 0..4 {
        k.write_cqe(
            i,
            IbUverbsWc {
                wr_id: Le64::new(u64::from(i)),
                ..IbUverbsWc::new_zeroed()
            },
        );
    }
    let mut wcs = [WorkCompletion::default(); 16];
    let mut seen = 0u32;
    for wild in [0xffff_ffff, 0x1234_5677, 0x8000_0002, 0xffff_fffc] {
        k.producer().store(wild, Ordering::Release);
        let n = cq.poll(&mut wcs);
        assert!(n <= 3, "at most capacity entries, got {n}");
        for wc in &wcs[..n] {
            assert_eq!(wc.wr_id, u64::from(seen & 3));
            seen += 1;
        }
        assert_eq!(k.consumer().load(Ordering::Acquire), wild & 3);
    }
    assert!(seen > 0);

    // A wild SQ consumer index cannot make the provider write outside the queue either.
    let sq_shared = SharedQueue::new(reach, 2, 9);
    let sk = sq_shared.kernel();
    let caps = SendQueueCaps {
        qp_type: QpType::Rc,
        max_sge: 1,
        max_inline: 256,
    };
    let mut sq = SendQueue::new(sq_shared.queue(), caps).unwrap();
    let payload = [7u8; 256];
    let sgl = [sge_of(&payload, 0)];
    let wr = SendWr {
        flags: SendFlags::INLINE,
        sg_list: &sgl,
        ..Default::default()
    };
    for wild in [0xffff_ffffu32, 0xffff_fffe, 0x7fff_ffff] {
        sk.consumer().store(wild, Ordering::Release);
        // SAFETY: the inline SGE points into `payload`, a live local array.
        let _ = unsafe { sq.post_send(&[wr]) };
        assert!(sk.producer().load(Ordering::Acquire) <= 1);
    }
    assert_eq!(sk.payload(1, 208, 256), payload);
}

for_both_reaches!(
    corrupted_headers_are_refused,
    corrupted_indices_stay_inside_the_buffer,
);

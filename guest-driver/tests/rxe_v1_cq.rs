//! Polling the rxe v1 completion queue against the simulated Soft-RoCE kernel
//! ([`vrdma_test_support::rxe_kernel_sim`]): native CQEs converted field by field, and the
//! accesses of a CQ reached through a [`RegionAccess`](vrdma::transport::RegionAccess).

use std::mem::size_of;
use std::sync::atomic::Ordering;

use vrdma::provider::rxe_v1::CompletionQueue;
use vrdma::provider::{WcFlags, WorkCompletion};
use vrdma_spec::rxe_v1::IbUverbsWc;
use vrdma_spec::verbs::{WcOpcode, WcStatus};
use vrdma_spec::{Le16, Le32, Le64};
use vrdma_test_support::for_both_reaches;
use vrdma_test_support::rxe_kernel_sim::{Access, Reach, SharedQueue};
use zerocopy::FromZeros;

fn poll_converts_native_completions(reach: Reach) {
    let shared = SharedQueue::new(reach, 4, 7);
    let k = shared.kernel();
    let mut cq = CompletionQueue::new(shared.queue()).unwrap();
    let mut wcs = [WorkCompletion::default(); 2];
    assert_eq!(cq.poll(&mut wcs), 0);

    let recv = IbUverbsWc {
        wr_id: Le64::new(0xfeed),
        status: Le32::new(0),
        opcode: Le32::new(128),
        vendor_err: Le32::new(0),
        byte_len: Le32::new(4096),
        ex: [0xde, 0xad, 0xbe, 0xef],
        qp_num: Le32::new(0x11),
        src_qp: Le32::new(0x22),
        wc_flags: Le32::new(0x3),
        pkey_index: Le16::new(5),
        slid: Le16::new(6),
        sl: 7,
        dlid_path_bits: 8,
        port_num: 1,
        reserved: 0xff,
    };
    let flushed = IbUverbsWc {
        wr_id: Le64::new(2),
        status: Le32::new(5),
        vendor_err: Le32::new(0x99),
        qp_num: Le32::new(0x11),
        ..IbUverbsWc::new_zeroed()
    };
    let strange = IbUverbsWc {
        wr_id: Le64::new(3),
        status: Le32::new(77),
        opcode: Le32::new(55),
        ..IbUverbsWc::new_zeroed()
    };
    for (i, cqe) in [recv, flushed, strange].into_iter().enumerate() {
        k.write_cqe(i as u32, cqe);
    }
    k.producer().store(3, Ordering::Release);

    assert_eq!(cq.poll(&mut wcs), 2);
    assert_eq!(k.consumer().load(Ordering::Acquire), 2);
    assert_eq!(
        wcs[0],
        WorkCompletion {
            wr_id: 0xfeed,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: 4096,
            imm_data: u32::from_ne_bytes([0xde, 0xad, 0xbe, 0xef]),
            qp_num: 0x11,
            src_qp: 0x22,
            wc_flags: WcFlags::from_bits_retain(0x3),
            pkey_index: 5,
            slid: 6,
            sl: 7,
            dlid_path_bits: 8,
            port_num: 1,
            vendor_err: 0,
        }
    );
    assert_eq!(u32::from_be(wcs[0].imm_data), 0xdead_beef);
    assert!(wcs[0].wc_flags.contains(WcFlags::GRH | WcFlags::WITH_IMM));
    assert_eq!(
        (wcs[1].wr_id, wcs[1].status, wcs[1].vendor_err),
        (2, WcStatus::WrFlushErr, 0x99)
    );

    assert_eq!(cq.poll(&mut wcs), 1);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status, wcs[0].opcode),
        (3, WcStatus::Other(77), WcOpcode::Other(55))
    );
    assert_eq!(cq.poll(&mut wcs), 0);
    assert_eq!(cq.poll(&mut []), 0);
    assert_eq!(k.consumer().load(Ordering::Acquire), 3);
}

/// Polling an accessed CQ: one Acquire load of the producer index before any CQE is read, one
/// read per CQE, and the consumer index stored (Release) only after the last read.
#[test]
fn accessed_completion_queue_reads_before_handing_slots_back() {
    let shared = SharedQueue::new(Reach::Accessed, 8, 6);
    let mut cq = CompletionQueue::new(shared.queue()).unwrap();
    let k = shared.kernel();
    for i in 0..3 {
        k.write_cqe(
            i,
            IbUverbsWc {
                wr_id: Le64::new(10 + u64::from(i)),
                ..IbUverbsWc::new_zeroed()
            },
        );
    }
    k.producer().store(3, Ordering::Release);
    let region = shared.region();
    region.start_log();
    let mut wcs = [WorkCompletion::default(); 8];
    assert_eq!(cq.poll(&mut wcs), 3);
    assert_eq!(
        wcs[..3].iter().map(|wc| wc.wr_id).collect::<Vec<_>>(),
        [10, 11, 12]
    );
    let cqe = |index: u32| Access::Read {
        offset: shared.slot_offset(index),
        len: size_of::<IbUverbsWc>(),
    };
    let producer = Access::Load {
        offset: shared.word_offset(128),
    };
    assert_eq!(
        region.take_log(),
        [
            producer,
            cqe(0),
            cqe(1),
            cqe(2),
            // The header, checked after the CQEs: still this queue's.
            Access::Load {
                offset: shared.word_offset(vrdma_spec::rxe_v1::header::INDEX_MASK),
            },
            Access::Store {
                offset: shared.word_offset(256),
                value: 3
            }
        ]
    );
    // Nothing new: one load, nothing else.
    assert_eq!(cq.poll(&mut wcs), 0);
    assert_eq!(region.take_log(), [producer]);
}

/// Batch polling (`ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll`): `peek` reads the oldest
/// completion without consuming it, `skip` moves the read cursor only, and the kernel sees the
/// slots handed back only at `publish`; a later `poll` continues after the skipped ones.
fn batch_poll_hands_slots_back_at_publish(reach: Reach) {
    let shared = SharedQueue::new(reach, 4, 7);
    let k = shared.kernel();
    let mut cq = CompletionQueue::new(shared.queue()).unwrap();
    assert_eq!(cq.peek(), None);
    assert!(!cq.skip(), "nothing to skip in an empty queue");
    for i in 0..3u32 {
        let cqe = IbUverbsWc {
            wr_id: Le64::new(20 + u64::from(i)),
            byte_len: Le32::new(100 * i),
            ..IbUverbsWc::new_zeroed()
        };
        k.write_cqe(i, cqe);
    }
    k.producer().store(3, Ordering::Release);

    let first = cq.peek().unwrap();
    assert_eq!((first.wr_id, first.byte_len), (20, 0));
    assert_eq!(
        cq.peek(),
        Some(first),
        "peeking twice reads the same completion"
    );
    assert!(cq.skip());
    assert_eq!(cq.peek().map(|wc| (wc.wr_id, wc.byte_len)), Some((21, 100)));
    assert!(cq.skip());
    assert_eq!(
        k.consumer().load(Ordering::Acquire),
        0,
        "not handed back yet"
    );
    cq.publish();
    assert_eq!(k.consumer().load(Ordering::Acquire), 2);

    let mut wcs = [WorkCompletion::default(); 4];
    assert_eq!(cq.poll(&mut wcs), 1);
    assert_eq!(wcs[0].wr_id, 22);
    assert_eq!(cq.peek(), None);
    assert!(!cq.skip());
    assert_eq!(k.consumer().load(Ordering::Acquire), 3);
}

/// After the back-end is lost the CQ's buffer is replaced by zeroed memory. Its producer
/// index (0) then differs from the consumer's cursor, but what lies in the slots are not
/// completions: the CQ reads as empty instead of returning zeroed successes with wr_id 0.
fn a_buffer_replaced_by_zeros_yields_no_completions(reach: Reach) {
    let shared = SharedQueue::new(reach, 4, 7);
    let k = shared.kernel();
    let mut cq = CompletionQueue::new(shared.queue()).unwrap();
    for i in 0..2u32 {
        let cqe = IbUverbsWc {
            wr_id: Le64::new(30 + u64::from(i)),
            qp_num: Le32::new(0x11),
            ..IbUverbsWc::new_zeroed()
        };
        k.write_cqe(i, cqe);
    }
    k.producer().store(2, Ordering::Release);
    let mut wcs = [WorkCompletion::default(); 4];
    assert_eq!(cq.poll(&mut wcs), 2);

    k.replace_with_zeros();
    assert_eq!(cq.poll(&mut wcs), 0);
    assert_eq!(cq.peek(), None);
    assert!(!cq.skip());
    assert_eq!(
        k.consumer().load(Ordering::Acquire),
        0,
        "nothing handed back into the replacement"
    );
}

for_both_reaches!(
    poll_converts_native_completions,
    batch_poll_hands_slots_back_at_publish,
    a_buffer_replaced_by_zeros_yields_no_completions,
);

//! `Cq::resize` (RESIZE_CQ): completions pending in the old buffer come out of the new one
//! first, in order, none lost or repeated, also while other threads poll; a refused resize
//! changes nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use vrdma::spec::control::Opcode;
use vrdma::spec::Status;
use vrdma::verbs::{Cq, VerbsError, WorkCompletion};

use crate::helpers::*;

fn wr_ids(completions: &[WorkCompletion]) -> Vec<u64> {
    completions.iter().map(|wc| wc.wr_id).collect()
}

#[test]
fn pending_completions_survive_growing_and_shrinking_in_order() {
    let (t, ctx) = open();
    let cq = Cq::new(&ctx, 7).unwrap();
    assert_eq!(cq.capacity(), 7);
    // Five completions, three polled, four more: the old ring's indices have wrapped and six
    // completions (3..=8) are pending.
    for wr_id in 0..5 {
        assert!(t.complete(cq.handle(), wr_id));
    }
    let mut out = [WorkCompletion::default(); 3];
    assert_eq!(cq.poll(&mut out), 3);
    assert_eq!(wr_ids(&out), [0, 1, 2]);
    for wr_id in 5..9 {
        assert!(t.complete(cq.handle(), wr_id));
    }

    assert_eq!(cq.resize(20).unwrap(), 31);
    assert_eq!(cq.capacity(), 31);
    // New completions land behind the carried-over ones.
    for wr_id in 9..30 {
        assert!(t.complete(cq.handle(), wr_id));
    }
    let mut out = [WorkCompletion::default(); 32];
    assert_eq!(cq.poll(&mut out[..4]), 4);
    assert_eq!(wr_ids(&out[..4]), [3, 4, 5, 6]);

    // 23 pending: too many for 15 entries; nothing changes.
    let err = cq.resize(15).unwrap_err();
    assert_eq!(err.status(), Some(Status::Invalid));
    assert!(matches!(
        err,
        VerbsError::Status {
            opcode: Opcode::ResizeCq,
            ..
        }
    ));
    assert_eq!(cq.capacity(), 31);
    // Exactly enough room.
    assert_eq!(cq.resize(23).unwrap(), 31);
    let n = cq.poll(&mut out);
    assert_eq!(wr_ids(&out[..n]), (7..30).collect::<Vec<_>>());
    assert_eq!(cq.resize(1).unwrap(), 1, "an empty CQ shrinks to anything");
    assert!(t.complete(cq.handle(), 30));
    assert!(!t.complete(cq.handle(), 31), "one entry: full");
    assert_eq!(wr_ids(&poll_all(&cq)), [30]);

    assert!(matches!(cq.resize(0), Err(VerbsError::InvalidArgument(_))));
    drop(cq);
    assert!(
        t.device().is_empty(),
        "every buffer unmapped, the CQ destroyed"
    );
}

#[test]
fn concurrent_pollers_see_every_completion_once_in_order() {
    let (t, ctx) = open();
    let cq = Cq::new(&ctx, 8).unwrap();
    let seen = Mutex::new(Vec::new());
    let done = AtomicBool::new(false);
    const ROUNDS: u64 = 200;
    const BATCH: u64 = 3;
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                let mut out = [WorkCompletion::default(); 2];
                while !done.load(Ordering::Acquire) {
                    // Poll and record under one lock, so that the record keeps poll order.
                    let mut seen = seen.lock().unwrap();
                    let n = cq.poll(&mut out);
                    seen.extend(wr_ids(&out[..n]));
                }
            });
        }
        let sizes = [BATCH as u32, 7, 50, 15, 4];
        for round in 0..ROUNDS {
            for i in 0..BATCH {
                assert!(t.complete(cq.handle(), round * BATCH + i));
            }
            // Some of the batch may already be polled, some still pending: both must work.
            let size = sizes[round as usize % sizes.len()];
            assert!(cq.resize(size).unwrap() >= size);
            while (seen.lock().unwrap().len() as u64) < (round + 1) * BATCH {
                std::thread::yield_now();
            }
        }
        done.store(true, Ordering::Release);
    });
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen, (0..ROUNDS * BATCH).collect::<Vec<_>>());
    assert_eq!(count_ops(&t, Opcode::ResizeCq), ROUNDS as usize);
}

#[test]
fn a_failed_resize_keeps_the_old_ring() {
    let (t, ctx) = open();
    let cq = Cq::new(&ctx, 8).unwrap();
    assert!(t.complete(cq.handle(), 1));
    t.inject(vrdma_test_support::fake_transport::Fault::Fail(
        Opcode::ResizeCq,
        vrdma::spec::StatusError::new(Status::NoMemory),
    ));
    assert_eq!(cq.resize(100).unwrap_err().status(), Some(Status::NoMemory));
    assert_eq!(cq.capacity(), 15);
    assert!(t.complete(cq.handle(), 2));
    assert_eq!(wr_ids(&poll_all(&cq)), [1, 2]);
}

#[test]
fn an_unusable_new_ring_leaves_a_cq_that_yields_nothing() {
    let (t, ctx) = open();
    let cq = Cq::new(&ctx, 8).unwrap();
    assert!(t.complete(cq.handle(), 1));
    t.inject(vrdma_test_support::fake_transport::Fault::RingHeaderMismatch);
    assert!(matches!(cq.resize(16), Err(VerbsError::Protocol(_))));
    // The old buffer is unmapped (a touch would fault) and the new one is not trusted.
    assert_eq!(cq.capacity(), 0);
    assert!(poll_all(&cq).is_empty());
    assert!(matches!(cq.resize(16), Err(VerbsError::InvalidArgument(_))));
    drop(cq);
    assert!(t.device().is_empty());
}

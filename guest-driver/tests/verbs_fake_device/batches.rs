//! Batches of commands (`Cq::new_many`, `Qp::create_many`, `Qp::modify_many`,
//! `Qp::connect_many`) against the
//! fake device: every command runs, in order, and each result is its own.

use vrdma::spec::control::Opcode;
use vrdma::spec::verbs::{QpAttrMask, QpState, QpType};
use vrdma::spec::wire::QpAttr;
use vrdma::spec::Status;
use vrdma::verbs::{ConnectOptions, Cq, Qp, QpChange, VerbsError};

use crate::helpers::*;

#[test]
fn cqs_are_created_in_a_batch_each_with_its_own_result() {
    let (t, ctx) = open();
    let before = t.device().ops().len();
    let cqs = Cq::new_many(&ctx, &[16, 0, 64]).unwrap();
    assert_eq!(cqs.len(), 3);
    // The empty one is refused before anything reaches the device; the others are created.
    assert!(matches!(cqs[1], Err(VerbsError::InvalidArgument(_))));
    let ops = t.device().ops();
    assert_eq!(ops[before..], [Opcode::CreateCq, Opcode::CreateCq]);
    let (small, large) = (cqs[0].as_ref().unwrap(), cqs[2].as_ref().unwrap());
    assert!(small.capacity() >= 16 && large.capacity() >= 64);
    assert_ne!(small.handle(), large.handle());
    // Each is a CQ of its own: a QP uses them, and they are destroyed with their `Cq`.
    let pd = ctx.alloc_pd().unwrap();
    let qp = create_qp(&pd, small, QpType::Rc);
    drop(qp);
    drop(cqs);
    assert_eq!(count_ops(&t, Opcode::DestroyCq), 2);
}

#[test]
fn many_qps_are_created_and_connected_in_batches() {
    let (t, ctx) = open();
    let pd = ctx.alloc_pd().unwrap();
    let cq = Cq::new(&ctx, 64).unwrap();
    let init = init_attr(&cq, QpType::Rc);
    let qps: Vec<Qp> = Qp::create_many(&pd, &[init; 8])
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(count_ops(&t, Opcode::CreateQp), 8);
    let mut qpns: Vec<u32> = qps.iter().map(Qp::qpn).collect();
    qpns.sort_unstable();
    qpns.dedup();
    assert_eq!(qpns.len(), 8, "eight distinct QPs");

    // Pair them up: QP i with QP i ^ 1.
    let targets: Vec<(&Qp, _)> = qps
        .iter()
        .enumerate()
        .map(|(i, qp)| (qp, remote(&qps[i ^ 1], 0)))
        .collect();
    let before = modify_requests(&t).len();
    let results = Qp::connect_many(&targets, &ConnectOptions::default()).unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let modifies = modify_requests(&t);
    assert_eq!(modifies.len() - before, 24, "INIT, RTR, RTS for each of 8");
    // In order: each QP's three steps follow each other.
    let states: Vec<u32> = modifies[before..]
        .iter()
        .map(|m| m.attr.qp_state.get())
        .collect();
    let expected: Vec<u32> = (0..8)
        .flat_map(|_| [QpState::Init, QpState::Rtr, QpState::Rts].map(|s| s as u32))
        .collect();
    assert_eq!(states, expected);
    for qp in &qps {
        let (attr, _) = qp.query(QpAttrMask::STATE).unwrap();
        assert_eq!(attr.qp_state.get(), QpState::Rts as u32);
    }

    // Connecting again fails for each QP on its own (INIT from RTS), the batch runs on.
    let again = Qp::connect_many(&targets[..2], &ConnectOptions::default()).unwrap();
    assert_eq!(again.len(), 2);
    for result in &again {
        assert_eq!(
            result.as_ref().err().and_then(status_of),
            Some(Status::BadState)
        );
    }
}

#[test]
fn a_modification_batch_stays_in_one_context() {
    let (_t, ctx) = open();
    let (_u, other) = open();
    let (pd, other_pd) = (ctx.alloc_pd().unwrap(), other.alloc_pd().unwrap());
    let (cq, other_cq) = (Cq::new(&ctx, 8).unwrap(), Cq::new(&other, 8).unwrap());
    let a = create_qp(&pd, &cq, QpType::Rc);
    let b = create_qp(&other_pd, &other_cq, QpType::Rc);
    let reset = QpAttr::default().with_qp_state(QpState::Reset);
    let changes = [
        QpChange {
            qp: &a,
            attr: &reset,
            mask: QpAttrMask::STATE,
        },
        QpChange {
            qp: &b,
            attr: &reset,
            mask: QpAttrMask::STATE,
        },
    ];
    assert!(matches!(
        Qp::modify_many(&changes),
        Err(VerbsError::InvalidArgument(_))
    ));
    assert!(Qp::modify_many(&[]).unwrap().is_empty());
    let one = Qp::modify_many(&changes[..1]).unwrap();
    assert!(one[0].is_ok());
}

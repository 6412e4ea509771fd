//! What the tests share: opening a context on a fresh fake, QPs and their connection, buffers,
//! posting and polling, and reading the fake's command log.

use std::sync::Arc;
use std::time::Duration;

use vrdma::dma::DmaBuffer;
use vrdma::spec::control::{ControlRequest, Opcode};
use vrdma::spec::wire::*;
use vrdma::spec::Status;
use vrdma::verbs::{
    ConnectOptions, Context, Cq, Gid, Pd, PostSendError, Qp, QpCaps, QpInitAttr, QpType, RemoteQp,
    SendWr, VerbsError, WorkCompletion,
};
use vrdma_test_support::fake_transport::{FakeTransport, LOCAL_GID};

/// Bound of every wait for an event.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

pub(crate) fn open() -> (Arc<FakeTransport>, Context) {
    let transport = FakeTransport::new();
    let ctx = Context::open(transport.clone()).unwrap();
    (transport, ctx)
}

pub(crate) fn rc_caps() -> QpCaps {
    QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    }
}

/// A QP of `qp_type` on `cq` (send and receive) with [`rc_caps`].
pub(crate) fn init_attr(cq: &Cq, qp_type: QpType) -> QpInitAttr<'_> {
    QpInitAttr {
        qp_type,
        send_cq: cq,
        recv_cq: cq,
        caps: rc_caps(),
        sq_sig_all: false,
    }
}

pub(crate) fn create_qp(pd: &Pd, cq: &Cq, qp_type: QpType) -> Qp {
    Qp::new(pd, &init_attr(cq, qp_type)).unwrap()
}

pub(crate) fn remote(qp: &Qp, psn: u32) -> RemoteQp {
    RemoteQp {
        qpn: qp.qpn(),
        psn,
        gid: Gid(LOCAL_GID),
        lid: 0,
    }
}

/// Two RC QPs of one context connected to each other, each with its own CQ.
pub(crate) fn connected_pair(pd: &Pd, cq_a: &Cq, cq_b: &Cq) -> (Qp, Qp) {
    let a = create_qp(pd, cq_a, QpType::Rc);
    let b = create_qp(pd, cq_b, QpType::Rc);
    let opts_a = ConnectOptions {
        sq_psn: 100,
        ..ConnectOptions::default()
    };
    let opts_b = ConnectOptions {
        sq_psn: 200,
        ..ConnectOptions::default()
    };
    a.connect(&remote(&b, 200), &opts_a).unwrap();
    b.connect(&remote(&a, 100), &opts_b).unwrap();
    (a, b)
}

pub(crate) fn filled(ctx: &Context, bytes: &[u8]) -> DmaBuffer {
    let mut buf = ctx.alloc_buffer(bytes.len()).unwrap();
    buf.as_mut_slice().copy_from_slice(bytes);
    buf
}

pub(crate) fn post(qp: &Qp, wrs: &[SendWr<'_>]) -> Result<(), PostSendError> {
    // SAFETY: inline SGEs in these tests point into live local buffers.
    unsafe { qp.post_send(wrs) }
}

pub(crate) fn poll_all(cq: &Cq) -> Vec<WorkCompletion> {
    let mut out = [WorkCompletion::default(); 16];
    let n = cq.poll(&mut out);
    out[..n].to_vec()
}

/// How many `op` commands the device ran.
pub(crate) fn count_ops(t: &FakeTransport, op: Opcode) -> usize {
    t.device().ops().iter().filter(|o| **o == op).count()
}

pub(crate) fn modify_requests(t: &FakeTransport) -> Vec<ModifyQpReq> {
    t.device()
        .log
        .iter()
        .filter_map(|(_, raw)| match ControlRequest::decode(raw) {
            Ok(ControlRequest::ModifyQp(r)) => Some(r),
            _ => None,
        })
        .collect()
}

pub(crate) fn status_of(e: &VerbsError) -> Option<Status> {
    e.status()
}

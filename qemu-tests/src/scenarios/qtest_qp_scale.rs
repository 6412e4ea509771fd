//! How many QPs one guest gets through QEMU: the library over the qtest-driven device creates
//! RC QPs, each with a CQ of its own ([`QPS_PER_CQ`]), until it has the asked number or
//! something refuses,
//! checks that QEMU still answers, runs a verified exchange on one more QP while they all
//! live, then destroys them all and checks that a new QP gets mapped queues again (their
//! mappings went back to the back-end's budget).
//!
//! The first QPs get host queue buffers mapped into the device's shared-memory BAR (each its
//! own `SHMEM_MAP`, a memory slot of QEMU's); once QEMU could not take more, the back-end gives
//! the next ones staging rings (spec §9.7), which share mappings, and once nearly all slots are
//! taken it stages CQs too (spec §9.8), so the count is bounded by the back-end's quotas rather
//! than by QEMU's 512 slots.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use vrdma::verbs::{Context, Cq, Qp, QpCaps, QpInitAttr, QpType};

use crate::error::{Error, Result};

/// QPs that share one CQ: one, the most demanding case (a CQ per connection, as many
/// applications make them).
pub const QPS_PER_CQ: u32 = 1;

/// What the step saw.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QpScale {
    /// QPs asked for.
    pub requested: u32,
    /// QPs created.
    pub created: u32,
    /// Of them, QPs whose queues are staging rings.
    pub staged: u32,
    /// CQs created for them.
    pub cqs: u32,
    /// Of them, CQs whose ring is a staging ring.
    pub staged_cqs: u32,
    /// What refused the next one, if anything did.
    pub refused: Option<String>,
    /// Milliseconds per QP over the first and the last 64 created.
    pub first_ms_per_qp: f64,
    pub last_ms_per_qp: f64,
    /// QEMU answered after the last creation (the device's configuration magic read back).
    pub qemu_alive_after: bool,
    /// Milliseconds to destroy them all.
    pub destroy_ms: u64,
    /// Once they were destroyed, a new QP and its CQ got host queue buffers, not staging
    /// rings: at most half of the mapping budget (~240) can have stayed taken.
    pub direct_after_release: bool,
}

/// An RC QP of depth 1 on `cq`: the smallest queues, so that the region holds thousands.
fn init(cq: &Cq) -> QpInitAttr<'_> {
    QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        caps: QpCaps {
            max_send_wr: 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    }
}

/// Whether a new QP with a CQ of its own gets host queue buffers mapped (no staging ring).
fn next_is_direct(ctx: &Context) -> Result<bool> {
    let failed = |what: &str, e: vrdma::verbs::VerbsError| Error::Scenario(format!("{what}: {e}"));
    let pd = ctx.alloc_pd().map_err(|e| failed("allocating a PD", e))?;
    let cq = Cq::new(ctx, 2).map_err(|e| failed("creating a CQ after the release", e))?;
    let qp = Qp::new(&pd, &init(&cq)).map_err(|e| failed("creating a QP after the release", e))?;
    Ok(!qp.receives_staged() && !cq.is_staged())
}

/// Creates up to `count` QPs on `ctx`; `alive` asks QEMU something; `exchange` runs while
/// they all live (its QP is one more than were created: the last one, staged if they were).
pub fn run<T>(
    ctx: &Context,
    count: u32,
    alive: impl Fn() -> bool,
    exchange: impl FnOnce() -> Result<T>,
) -> Result<(QpScale, T)> {
    let pd = ctx
        .alloc_pd()
        .map_err(|e| Error::Scenario(format!("allocating a PD: {e}")))?;
    let mut cqs: Vec<Cq> = Vec::new();
    let mut qps: Vec<Qp> = Vec::new();
    let mut times = Vec::new();
    let mut refused = None;
    while (qps.len() as u32) < count {
        let started = Instant::now();
        if qps.len().is_multiple_of(QPS_PER_CQ as usize) {
            match Cq::new(ctx, 2 * QPS_PER_CQ) {
                Ok(cq) => cqs.push(cq),
                Err(e) => {
                    refused = Some(format!("CQ {}: {e}", cqs.len() + 1));
                    break;
                }
            }
        }
        let cq = cqs.last().expect("a CQ was created above");
        match Qp::new(&pd, &init(cq)) {
            Ok(qp) => qps.push(qp),
            Err(e) => {
                refused = Some(format!("QP {}: {e}", qps.len() + 1));
                break;
            }
        }
        times.push(started.elapsed().as_secs_f64() * 1e3);
        if qps.len().is_multiple_of(256) {
            println!("  {} QPs", qps.len());
        }
    }
    let mean = |t: &[f64]| {
        if t.is_empty() {
            0.0
        } else {
            t.iter().sum::<f64>() / t.len() as f64
        }
    };
    let first = mean(&times[..times.len().min(64)]);
    let last = mean(&times[times.len().saturating_sub(64)..]);
    let qemu_alive_after = alive();
    let created = qps.len() as u32;
    let staged = qps.iter().filter(|qp| qp.receives_staged()).count() as u32;
    // The exchange needs a QP of its own: make room if the quota refused the last one.
    if refused.is_some() {
        qps.pop();
    }
    let exchanged = exchange()?;
    let started = Instant::now();
    drop(qps);
    let cq_count = cqs.len() as u32;
    let staged_cqs = cqs.iter().filter(|cq| cq.is_staged()).count() as u32;
    drop(cqs);
    drop(pd);
    let destroy_ms = started.elapsed().as_millis() as u64;
    let direct_after_release = next_is_direct(ctx)?;
    Ok((
        QpScale {
            requested: count,
            created,
            staged,
            cqs: cq_count,
            staged_cqs,
            refused,
            first_ms_per_qp: first,
            last_ms_per_qp: last,
            qemu_alive_after,
            destroy_ms,
            direct_after_release,
        },
        exchanged,
    ))
}

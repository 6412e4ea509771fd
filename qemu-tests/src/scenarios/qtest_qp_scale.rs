//! How many QPs one guest gets through QEMU: the library over the qtest-driven device creates
//! CQ and RC QP pairs (each queue buffer its own `SHMEM_MAP` into the device's shared-memory
//! BAR) until it has the asked number or something refuses, then checks that QEMU still
//! answers, destroys them all and checks the device again.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use vrdma::verbs::{Context, Cq, Qp, QpCaps, QpInitAttr, QpType};

use crate::error::{Error, Result};

/// What the step saw.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QpScale {
    /// QP (and CQ) pairs asked for.
    pub requested: u32,
    /// Pairs created.
    pub created: u32,
    /// What refused the next one, if anything did.
    pub refused: Option<String>,
    /// Milliseconds per pair over the first and the last 64 created.
    pub first_ms_per_pair: f64,
    pub last_ms_per_pair: f64,
    /// QEMU answered after the last creation (the device's configuration magic read back).
    pub qemu_alive_after: bool,
    /// Milliseconds to destroy them all.
    pub destroy_ms: u64,
}

/// Creates up to `count` CQ+QP pairs on `ctx`; `alive` asks QEMU something.
pub fn run(ctx: &Context, count: u32, alive: impl Fn() -> bool) -> Result<QpScale> {
    let pd = ctx
        .alloc_pd()
        .map_err(|e| Error::Scenario(format!("allocating a PD: {e}")))?;
    let mut pairs: Vec<(Qp, Cq)> = Vec::new();
    let mut times = Vec::new();
    let mut refused = None;
    for _ in 0..count {
        let started = Instant::now();
        let cq = match Cq::new(ctx, 1) {
            Ok(cq) => cq,
            Err(e) => {
                refused = Some(format!("CQ {}: {e}", pairs.len() + 1));
                break;
            }
        };
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            caps: QpCaps {
                max_send_wr: 1,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        };
        match Qp::new(&pd, &init) {
            Ok(qp) => pairs.push((qp, cq)),
            Err(e) => {
                refused = Some(format!("QP {}: {e}", pairs.len() + 1));
                break;
            }
        }
        times.push(started.elapsed().as_secs_f64() * 1e3);
        if pairs.len().is_multiple_of(256) {
            println!("  {} QPs", pairs.len());
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
    let created = pairs.len() as u32;
    let started = Instant::now();
    drop(pairs);
    drop(pd);
    Ok(QpScale {
        requested: count,
        created,
        refused,
        first_ms_per_pair: first,
        last_ms_per_pair: last,
        qemu_alive_after,
        destroy_ms: started.elapsed().as_millis() as u64,
    })
}

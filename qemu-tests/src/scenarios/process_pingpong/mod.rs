//! `process-pingpong`: vrdma in process mode on real rxe, inside the VM.
//!
//! One backend serves every vrdma process of the run. Against it:
//! - vrdma ↔ native (C over rdma-core's librxe): every operation and size, every byte verified,
//!   latency and bandwidth measured next to native ↔ native with the same tool (perftest's
//!   native baseline is `native-perftest`'s, and `perftest-over-vrdma` runs it beside vrdma);
//! - vrdma ↔ vrdma through the one backend; a UD exchange;
//! - completion events instead of polling; asynchronous events (an RDMA WRITE with a wrong
//!   rkey, a CQ overflowed on purpose);
//! - the data path bypasses the backend: with the backend stopped (SIGSTOP), a native peer
//!   RDMA-WRITEs into and SENDs to a vrdma process that posted its receives beforehand;
//! - isolation between two guests;
//! - cleanup: vrdma processes killed mid-traffic, 50 times by default, leave nothing behind.
//!
//! [`run`] is the scenario's script; each step lives in a module of its own.

pub mod async_event;
mod bypass;
mod cleanup;
mod completion_events;
mod pair;
pub mod results;
pub mod settings;
mod ud;
mod verified;

use std::time::Duration;

use crate::error::{Error, Result};
use crate::inside::{resource_counts, wait_for_counts, DEVICE};
use crate::scenarios::backend::Backend;
use crate::scenarios::binaries::Binaries;
use crate::scenarios::isolation;
use pair::Impl;
use results::Results;
use settings::Settings;

/// Runs the whole scenario.
pub fn run(binaries: &Binaries, settings: &Settings) -> Result<Results> {
    let idle = resource_counts(DEVICE)?;
    println!("idle {DEVICE} resources: {idle:?}");
    let mut results = Results::default();

    let backend = Backend::start(&binaries.backend, "vrdma-backend", &["--allow-ud"], "info")?;
    let mut port = 18600;
    let mut next_port = || {
        port += 1;
        port
    };
    for (label, pair) in verified::PAIRS {
        let rows = verified::run(binaries, &backend, pair, settings, label, &mut next_port)?;
        results.pingpong.insert(label.to_string(), rows);
    }

    println!("== UD: vrdma client, native server");
    let rows = ud::run(binaries, &backend, settings, next_port())?;
    results.pingpong.insert("ud-vrdma-over-native".into(), rows);

    for (label, pair) in [
        ("events-vrdma-over-native", (Impl::Native, Impl::Vrdma)),
        ("events-vrdma-over-vrdma", (Impl::Vrdma, Impl::Vrdma)),
    ] {
        println!("== {label}: completion events instead of polling");
        let rows =
            completion_events::run(binaries, &backend, pair, settings, label, &mut next_port)?;
        results.pingpong.insert(label.to_string(), rows);
    }

    println!("== asynchronous event: RDMA WRITE with a wrong rkey");
    results.async_event = Some(async_event::run(&backend)?);

    println!("== data path without the backend");
    results.bypass_messages = bypass::run(binaries, &backend, next_port())?;

    println!("== isolation between guests");
    isolation::run(&backend.socket)?;

    println!(
        "== cleanup: {} vrdma processes killed mid-traffic",
        settings.cleanup_rounds
    );
    let (fds, rss) = cleanup::run(
        binaries,
        &backend,
        idle,
        settings.cleanup_rounds,
        &mut next_port,
    )?;
    results.cleanup_rounds = settings.cleanup_rounds;
    results.backend_fds = fds;
    results.backend_rss_kib = rss;

    drop(backend);
    if let Err(last) = wait_for_counts(DEVICE, idle, Duration::from_secs(30)) {
        return Err(Error::Scenario(format!(
            "after the backend exited {DEVICE} holds {last:?}, idle was {idle:?}"
        )));
    }
    Ok(results)
}

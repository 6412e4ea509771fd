//! Scale: the cost of one send — writing the WQE and ringing the doorbell — as the number of
//! open QPs in a guest and the number of guests on one backend grow.
//!
//! Each guest is one process with its own connection (vrdma: its own vhost-user connection to
//! the one backend; natively: its own rdma-core context on rxe0). It opens `qps` RC QPs, each
//! connected to a peer QP of its own in the same guest (loopback on rxe0), and sends 64-byte
//! RDMA WRITEs round robin over all of them, at most 16 in flight. The guests of a
//! configuration start their timed part together.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::ctlbench::{parse_output, Programs, ScaleJob, Via};
use super::stats::{ratio, Summary};
use crate::error::{Error, IoContext, Result};
use crate::inside::Proc;

/// Backend options for the scale runs: a guest holds twice the largest QP count (every QP has
/// a peer), and their rings must fit its queue region.
pub const BACKEND_ARGS: &[&str] = &["--max-qps", "2048", "--shm-size", "256M"];

/// One point of the curve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleConfig {
    /// Processes, each its own guest.
    pub guests: u32,
    /// Sending QPs per guest.
    pub qps: u32,
}

/// The curve's points: 1, 64 and 1024 QPs in one guest, then 8 guests; the short form keeps
/// it small.
pub fn configs(quick: bool) -> Vec<ScaleConfig> {
    let points: &[(u32, u32)] = if quick {
        &[(1, 1), (1, 16), (2, 1)]
    } else {
        &[(1, 1), (1, 64), (1, 1024), (8, 1), (8, 64)]
    };
    points
        .iter()
        .map(|&(guests, qps)| ScaleConfig { guests, qps })
        .collect()
}

/// One configuration through one implementation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScaleSide {
    /// Nanoseconds per `post_send` of one message (WQE and doorbell), over every guest's
    /// samples.
    pub post_ns: Summary,
    /// Messages completed per second by all guests together (all messages / the longest
    /// guest's timed part).
    pub msgs_per_s: f64,
    /// Seconds the slowest guest took to create and connect its QPs.
    pub setup_s: f64,
}

/// One row of the curve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScaleRow {
    pub guests: u32,
    pub qps: u32,
    pub messages_per_guest: u32,
    pub native: ScaleSide,
    pub vrdma: ScaleSide,
    /// Median post_send time, vrdma / native.
    pub post_ratio: f64,
    /// Message rate, vrdma / native.
    pub rate_ratio: f64,
}

/// Runs every configuration natively, then through vrdma (backend at `socket`, started with
/// [`BACKEND_ARGS`]).
pub fn run(
    programs: &Programs,
    socket: &Path,
    configs: &[ScaleConfig],
    messages: u32,
) -> Result<Vec<ScaleRow>> {
    let mut rows = Vec::new();
    for config in configs {
        let job = ScaleJob {
            qps: config.qps,
            messages,
            window: 16,
            size: 64,
        };
        let native = run_side(programs, Via::Native, None, config, &job)?;
        let vrdma = run_side(programs, Via::Vrdma, Some(socket), config, &job)?;
        let bad = |what: &str| Error::Scenario(format!("scale {config:?}: native {what} is 0"));
        rows.push(ScaleRow {
            guests: config.guests,
            qps: config.qps,
            messages_per_guest: messages,
            post_ratio: ratio(vrdma.post_ns.median, native.post_ns.median)
                .ok_or_else(|| bad("post time"))?,
            rate_ratio: ratio(vrdma.msgs_per_s, native.msgs_per_s)
                .ok_or_else(|| bad("message rate"))?,
            native,
            vrdma,
        });
    }
    Ok(rows)
}

/// Runs `config.guests` processes of `job` through `via`, lined up to start their timed part
/// together.
fn run_side(
    programs: &Programs,
    via: Via,
    socket: Option<&Path>,
    config: &ScaleConfig,
    job: &ScaleJob,
) -> Result<ScaleSide> {
    println!(
        "scale: {} guest(s) x {} QP(s), {} …",
        config.guests,
        config.qps,
        via.label()
    );
    let dir = std::env::temp_dir().join(format!("vrdma-bench-scale-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).context(|| format!("creating {}", dir.display()))?;
    let start_file = dir.join("start");
    let ready_files: Vec<PathBuf> = (0..config.guests)
        .map(|g| dir.join(format!("ready-{g}")))
        .collect();
    let mut procs = Vec::new();
    for (g, ready) in ready_files.iter().enumerate() {
        let mut cmd = programs.scale(via, socket, job, Some((ready, &start_file)))?;
        let name = format!("bench-{}-scale-{g}", via.label());
        procs.push(Proc::spawn(&name, &mut cmd)?);
    }
    // Creating 2048 QPs through a control queue under TCG takes minutes, not hours.
    let timeout = Duration::from_secs(900);
    wait_ready(&mut procs, &ready_files, timeout)?;
    std::fs::write(&start_file, b"").context(|| format!("creating {}", start_file.display()))?;
    let mut outputs = Vec::new();
    for proc in &mut procs {
        proc.wait_success(timeout)?;
        outputs.push(parse_output(&proc.output()).map_err(|e| proc.failure(&e.to_string()))?);
    }
    let _ = std::fs::remove_dir_all(&dir);

    let mut post = Vec::new();
    let mut longest_ns = 0u64;
    let mut slowest_setup_ns = 0u64;
    let mut total = 0u64;
    for out in &outputs {
        post.extend(out.series("post_send")?.iter().map(|&ns| ns as f64));
        longest_ns = longest_ns.max(out.elapsed_ns.unwrap_or(0));
        slowest_setup_ns = slowest_setup_ns.max(out.setup_ns.unwrap_or(0));
        total += out.messages.unwrap_or(0);
    }
    let post_ns = Summary::of(&post)
        .ok_or_else(|| Error::Scenario("scale bench: no post_send samples".into()))?;
    if longest_ns == 0 || total == 0 {
        return Err(Error::Scenario(format!(
            "scale bench: {total} messages in {longest_ns} ns"
        )));
    }
    Ok(ScaleSide {
        post_ns,
        msgs_per_s: total as f64 / (longest_ns as f64 * 1e-9),
        setup_s: slowest_setup_ns as f64 * 1e-9,
    })
}

/// Waits until every process created its ready file; fails if one exits first.
fn wait_ready(procs: &mut [Proc], ready_files: &[PathBuf], timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if ready_files.iter().all(|f| f.exists()) {
            return Ok(());
        }
        for proc in procs.iter_mut() {
            if let Some(status) = proc.try_wait()? {
                return Err(proc.failure(&format!("exited ({status}) before it was ready")));
            }
        }
        if Instant::now() >= deadline {
            return Err(Error::Scenario(format!(
                "scale bench: not every guest was ready within {timeout:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_curve_covers_one_to_1024_qps_and_eight_guests() {
        let points: Vec<(u32, u32)> = configs(false).iter().map(|c| (c.guests, c.qps)).collect();
        assert!(points.contains(&(1, 1)) && points.contains(&(1, 64)));
        assert!(points.contains(&(1, 1024)) && points.contains(&(8, 1)));
        let quick = configs(true);
        assert!(quick.len() >= 2 && quick.iter().any(|c| c.guests > 1));
    }

    #[test]
    fn backend_has_room_for_the_largest_guest() {
        let max_qps: u32 = BACKEND_ARGS[1].parse().unwrap();
        let largest = configs(false).iter().map(|c| c.qps).max().unwrap();
        assert!(max_qps >= 2 * largest);
    }
}

//! Latency and bandwidth figures from measured samples.

use std::time::Duration;

use serde::Serialize;

/// Summary of one-way latencies (each sample is half a measured round trip), in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LatencySummary {
    pub min_us: f64,
    pub max_us: f64,
    /// The median (perftest's "typical").
    pub typical_us: f64,
    pub avg_us: f64,
    /// Nearest-rank 99th percentile: the smallest sample that at least 99 % of all are ≤.
    pub p99_us: f64,
}

/// Summarizes `samples_us`, sorting it in place; `None` when there is no sample.
pub fn summarize(samples_us: &mut [f64]) -> Option<LatencySummary> {
    if samples_us.is_empty() {
        return None;
    }
    samples_us.sort_by(f64::total_cmp);
    let n = samples_us.len();
    let p99_rank = (n * 99).div_ceil(100); // 1-based nearest rank
    Some(LatencySummary {
        min_us: samples_us[0],
        max_us: samples_us[n - 1],
        typical_us: samples_us[n / 2],
        avg_us: samples_us.iter().sum::<f64>() / n as f64,
        p99_us: samples_us[p99_rank - 1],
    })
}

/// Throughput of `messages` messages of `size` bytes in `elapsed`: (MiB/s, millions of
/// messages per second). Zero for an empty interval.
pub fn throughput(messages: u64, size: u32, elapsed: Duration) -> (f64, f64) {
    let seconds = elapsed.as_secs_f64();
    if seconds <= 0.0 {
        return (0.0, 0.0);
    }
    let bytes = messages as f64 * f64::from(size);
    (
        bytes / seconds / (1u64 << 20) as f64,
        messages as f64 / seconds / 1e6,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_known_samples() {
        // 1..=100 shuffled: median (upper) 51, mean 50.5, p99 99.
        let mut samples: Vec<f64> = (1..=100).map(|i| f64::from((i * 37) % 101)).collect();
        assert!(samples.iter().all(|s| (1.0..=100.0).contains(s)));
        let s = summarize(&mut samples).unwrap();
        assert_eq!(
            (s.min_us, s.max_us, s.typical_us, s.avg_us, s.p99_us),
            (1.0, 100.0, 51.0, 50.5, 99.0)
        );
    }

    #[test]
    fn p99_of_small_and_skewed_sets() {
        let s = summarize(&mut [5.0]).unwrap();
        assert_eq!((s.typical_us, s.p99_us, s.avg_us), (5.0, 5.0, 5.0));
        // One outlier in 1000 stays above the 99th percentile; eleven do not.
        let mut few = vec![2.0; 1000];
        few[0] = 900.0;
        assert_eq!(summarize(&mut few).unwrap().p99_us, 2.0);
        let mut many = vec![2.0; 1000];
        many[..11].fill(900.0);
        let s = summarize(&mut many).unwrap();
        assert_eq!((s.typical_us, s.p99_us, s.max_us), (2.0, 900.0, 900.0));
        assert!(summarize(&mut []).is_none());
    }

    #[test]
    fn throughput_in_mib_and_mmsg() {
        let (mib, mmsg) = throughput(1024, 1 << 20, Duration::from_secs(2));
        assert_eq!((mib, mmsg), (512.0, 1024.0 / 2.0 / 1e6));
        assert_eq!(throughput(1, 1, Duration::ZERO), (0.0, 0.0));
    }
}

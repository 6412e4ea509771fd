//! Order statistics of a series of samples.

use serde::{Deserialize, Serialize};

/// What a series of samples comes to.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    pub mean: f64,
    pub min: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Summary {
    /// The summary of `samples`; `None` if there are none or one is not a finite number.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        if samples.is_empty() || samples.iter().any(|v| !v.is_finite()) {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Some(Summary {
            n,
            median,
            mean: sorted.iter().sum::<f64>() / n as f64,
            min: sorted[0],
            p90: nearest_rank(&sorted, 0.90),
            p99: nearest_rank(&sorted, 0.99),
            max: sorted[n - 1],
        })
    }

    /// The summary of `samples` each multiplied by `factor` (a change of unit).
    pub fn of_scaled(samples: &[u64], factor: f64) -> Option<Summary> {
        let values: Vec<f64> = samples.iter().map(|&v| v as f64 * factor).collect();
        Summary::of(&values)
    }
}

/// The nearest-rank percentile `q` (0..=1) of sorted, non-empty `sorted`.
fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `ours / theirs`, or `None` when `theirs` is not positive.
pub fn ratio(ours: f64, theirs: f64) -> Option<f64> {
    (theirs > 0.0 && ours.is_finite()).then(|| ours / theirs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(Summary::of(&[3.0, 1.0, 2.0]).unwrap().median, 2.0);
        assert_eq!(Summary::of(&[4.0, 1.0, 3.0, 2.0]).unwrap().median, 2.5);
    }

    #[test]
    fn percentiles_mean_and_extremes() {
        let samples: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let s = Summary::of(&samples).unwrap();
        assert_eq!((s.n, s.min, s.max), (100, 1.0, 100.0));
        assert_eq!((s.p90, s.p99), (90.0, 99.0));
        assert_eq!(s.mean, 50.5);
        let one = Summary::of(&[7.0]).unwrap();
        assert_eq!((one.median, one.p99, one.min), (7.0, 7.0, 7.0));
    }

    #[test]
    fn no_summary_of_nothing_or_of_garbage() {
        assert!(Summary::of(&[]).is_none());
        assert!(Summary::of(&[1.0, f64::NAN]).is_none());
    }

    #[test]
    fn scaled_changes_the_unit() {
        let s = Summary::of_scaled(&[1000, 3000, 2000], 1e-3).unwrap();
        assert_eq!((s.median, s.max), (2.0, 3.0));
    }

    #[test]
    fn ratio_needs_a_positive_denominator() {
        assert_eq!(ratio(3.0, 2.0), Some(1.5));
        assert_eq!(ratio(3.0, 0.0), None);
        assert_eq!(ratio(f64::INFINITY, 2.0), None);
    }
}

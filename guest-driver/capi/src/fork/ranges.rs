//! Reference counts over address ranges: how many registrations cover each page, so that
//! `MADV_DONTFORK` is applied when the first one covers a page and taken back with the last
//! (rdma-core's `ibv_dontfork_range`/`ibv_dofork_range` counting).

use std::collections::BTreeMap;
use std::ops::Range;

/// Disjoint ranges with a non-zero count (start → (end, count)); neighbours with equal
/// counts are merged. Addresses outside every range have count 0.
#[derive(Debug, Default)]
pub(crate) struct RangeCounts {
    ranges: BTreeMap<usize, (usize, u32)>,
}

impl RangeCounts {
    /// No range counted.
    pub(crate) const fn new() -> Self {
        RangeCounts {
            ranges: BTreeMap::new(),
        }
    }

    /// Adds one to the count of every address of `range`; returns the parts whose count went
    /// from 0 to 1, in address order.
    pub(crate) fn increment(&mut self, range: Range<usize>) -> Vec<Range<usize>> {
        if range.is_empty() {
            return Vec::new();
        }
        self.split_at(range.start);
        self.split_at(range.end);
        let covered: Vec<(usize, usize, u32)> = self
            .ranges
            .range(range.clone())
            .map(|(&start, &(end, count))| (start, end, count))
            .collect();
        let mut fresh = Vec::new();
        let mut cursor = range.start;
        for (start, end, count) in covered {
            if start > cursor {
                fresh.push(cursor..start);
            }
            self.ranges.insert(start, (end, count.saturating_add(1)));
            cursor = end;
        }
        if cursor < range.end {
            fresh.push(cursor..range.end);
        }
        for part in &fresh {
            self.ranges.insert(part.start, (part.end, 1));
        }
        self.merge_around(range);
        fresh
    }

    /// Takes one from the count of every address of `range` that has one (addresses at 0
    /// stay at 0); returns the parts whose count went from 1 to 0, in address order, with
    /// touching parts joined.
    pub(crate) fn decrement(&mut self, range: Range<usize>) -> Vec<Range<usize>> {
        if range.is_empty() {
            return Vec::new();
        }
        self.split_at(range.start);
        self.split_at(range.end);
        let covered: Vec<(usize, usize, u32)> = self
            .ranges
            .range(range.clone())
            .map(|(&start, &(end, count))| (start, end, count))
            .collect();
        let mut released: Vec<Range<usize>> = Vec::new();
        for (start, end, count) in covered {
            if count == 1 {
                self.ranges.remove(&start);
                match released.last_mut() {
                    Some(last) if last.end == start => last.end = end,
                    _ => released.push(start..end),
                }
            } else {
                self.ranges.insert(start, (end, count - 1));
            }
        }
        self.merge_around(range);
        released
    }

    /// The count at `addr`.
    #[cfg(test)]
    pub(crate) fn count_at(&self, addr: usize) -> u32 {
        match self.ranges.range(..=addr).next_back() {
            Some((_, &(end, count))) if addr < end => count,
            _ => 0,
        }
    }

    /// Every range with a non-zero count, in address order.
    pub(crate) fn counted(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        self.ranges.iter().map(|(&start, &(end, _))| start..end)
    }

    /// Splits the range containing `at` (if any starts before it) into two at `at`.
    fn split_at(&mut self, at: usize) {
        if let Some((&start, &(end, count))) = self.ranges.range(..at).next_back() {
            if end > at {
                self.ranges.insert(start, (at, count));
                self.ranges.insert(at, (end, count));
            }
        }
    }

    /// Merges touching neighbours of equal count from just before `range` to its end.
    fn merge_around(&mut self, range: Range<usize>) {
        let first = self
            .ranges
            .range(..range.start)
            .next_back()
            .map_or(range.start, |(&start, _)| start);
        let starts: Vec<usize> = self
            .ranges
            .range(first..=range.end)
            .map(|(&start, _)| start)
            .collect();
        let mut current: Option<usize> = None;
        for start in starts {
            let (end, count) = self.ranges[&start];
            if let Some(previous) = current {
                let (previous_end, previous_count) = self.ranges[&previous];
                if previous_end == start && previous_count == count {
                    self.ranges.remove(&start);
                    self.ranges.insert(previous, (end, count));
                    continue;
                }
            }
            current = Some(start);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(counts: &RangeCounts) -> Vec<(usize, usize, u32)> {
        counts
            .ranges
            .iter()
            .map(|(&s, &(e, c))| (s, e, c))
            .collect()
    }

    #[test]
    fn first_cover_and_last_release_are_reported() {
        let mut counts = RangeCounts::default();
        assert_eq!(counts.increment(0x1000..0x3000), vec![0x1000..0x3000]);
        // Overlapping: only the new tail is fresh.
        assert_eq!(counts.increment(0x2000..0x5000), vec![0x3000..0x5000]);
        assert_eq!(
            all(&counts),
            vec![
                (0x1000, 0x2000, 1),
                (0x2000, 0x3000, 2),
                (0x3000, 0x5000, 1)
            ]
        );
        // Covered twice: nothing fresh.
        assert_eq!(counts.increment(0x2000..0x3000), Vec::<Range<usize>>::new());
        assert_eq!(counts.count_at(0x2fff), 3);
        assert_eq!(counts.decrement(0x1000..0x3000), vec![0x1000..0x2000]);
        assert_eq!(counts.decrement(0x2000..0x3000), Vec::<Range<usize>>::new());
        assert_eq!(all(&counts), vec![(0x2000, 0x5000, 1)], "merged again");
        assert_eq!(counts.decrement(0x2000..0x5000), vec![0x2000..0x5000]);
        assert!(all(&counts).is_empty());
    }

    #[test]
    fn a_hole_between_ranges_is_fresh_and_releases_join() {
        let mut counts = RangeCounts::default();
        counts.increment(0x1000..0x2000);
        counts.increment(0x3000..0x4000);
        assert_eq!(
            counts.increment(0x0..0x5000),
            vec![0x0..0x1000, 0x2000..0x3000, 0x4000..0x5000]
        );
        assert_eq!(
            counts.decrement(0x0..0x5000),
            vec![0x0..0x1000, 0x2000..0x3000, 0x4000..0x5000]
        );
        assert_eq!(
            counts.decrement(0x0..0x5000),
            vec![0x1000..0x2000, 0x3000..0x4000]
        );
    }

    #[test]
    fn unbalanced_releases_stay_at_zero() {
        let mut counts = RangeCounts::default();
        assert!(counts.decrement(0x1000..0x2000).is_empty());
        assert_eq!(counts.count_at(0x1000), 0);
        assert_eq!(counts.increment(0x1000..0x2000), vec![0x1000..0x2000]);
        assert_eq!(counts.decrement(0x0..0x3000), vec![0x1000..0x2000]);
    }
}

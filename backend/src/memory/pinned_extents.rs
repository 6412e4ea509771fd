// Copyright 2026 The vrdma Authors
// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause

//! The distinct guest-physical bytes a guest's MRs pin: reference-counted, non-overlapping
//! extents ([`PinnedExtents`]).
//!
//! Two MRs over the same guest pages pin them once, so the daemon's pinned-memory budget
//! counts each byte while at least one live MR covers it. The structure is kept in extents, not
//! pages: its size and the cost of every update follow the number of extents involved, so a
//! registration described by a few extents (issue 17 moves REG_MR to extents) costs a few
//! operations whatever its size.

use std::collections::BTreeMap;

/// Bytes the kernel charges to locked memory for an MR of `length` bytes starting
/// `in_page_offset` bytes into a page: the base pages its range spans (`ib_umem_num_pages`;
/// huge pages count as the base pages they hold).
pub fn locked_bytes(in_page_offset: u64, length: u64) -> u64 {
    const BASE_PAGE: u64 = 4096;
    let span = (in_page_offset % BASE_PAGE).saturating_add(length);
    span.div_ceil(BASE_PAGE).saturating_mul(BASE_PAGE)
}

/// A half-open guest-physical range `[start, end)`, never empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Extent {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

impl Extent {
    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// Always false: extents are never empty.
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
}

/// Sorts `extents` and merges those that overlap or touch: every byte is then covered once,
/// as [`PinnedExtents`] expects. Empty extents are dropped.
pub fn normalize(extents: &mut Vec<Extent>) {
    extents.retain(|extent| !extent.is_empty());
    extents.sort_unstable();
    let mut merged: Vec<Extent> = Vec::with_capacity(extents.len());
    for extent in extents.drain(..) {
        match merged.last_mut() {
            Some(last) if extent.start <= last.end => last.end = last.end.max(extent.end),
            _ => merged.push(extent),
        }
    }
    *extents = merged;
}

/// Guest-physical bytes with the number of MRs pinning each: non-overlapping extents, each with
/// a count of at least one. Neighbouring extents with equal counts are merged, so the map never
/// holds more extents than the MRs that built it brought in (times two, for the splits at
/// their ends).
#[derive(Debug, Default)]
pub struct PinnedExtents {
    /// start → (end, count).
    ranges: BTreeMap<u64, (u64, u32)>,
    /// Sum of the lengths of `ranges`: the distinct pinned bytes.
    bytes: u64,
}

impl PinnedExtents {
    /// Distinct bytes pinned.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Number of extents held (for tests and diagnostics).
    pub fn extent_count(&self) -> usize {
        self.ranges.len()
    }

    /// How many bytes of `extents` (normalized) no MR pins yet: what [`pin`](Self::pin) would
    /// add to [`bytes`](Self::bytes).
    pub fn unpinned_bytes(&self, extents: &[Extent]) -> u64 {
        extents
            .iter()
            .map(|extent| extent.len() - self.covered(*extent))
            .sum()
    }

    /// Adds one reference to every byte of `extents` (normalized); returns the bytes that were
    /// not pinned before.
    pub fn pin(&mut self, extents: &[Extent]) -> u64 {
        let mut added = 0;
        for &extent in extents {
            self.split_at(extent.start);
            self.split_at(extent.end);
            let mut cursor = extent.start;
            let inside: Vec<u64> = self
                .ranges
                .range(extent.start..extent.end)
                .map(|(&start, _)| start)
                .collect();
            for start in inside {
                let Some((end, count)) = self.ranges.get_mut(&start) else {
                    continue;
                };
                *count = count.saturating_add(1);
                let end = *end;
                if start > cursor {
                    self.ranges.insert(cursor, (start, 1));
                    added += start - cursor;
                }
                cursor = end;
            }
            if cursor < extent.end {
                self.ranges.insert(cursor, (extent.end, 1));
                added += extent.end - cursor;
            }
            self.coalesce(extent);
        }
        self.bytes += added;
        added
    }

    /// Drops one reference from every byte of `extents` (normalized, and pinned by an earlier
    /// [`pin`](Self::pin)); returns the bytes no MR pins any more.
    pub fn unpin(&mut self, extents: &[Extent]) -> u64 {
        let mut freed = 0;
        for &extent in extents {
            self.split_at(extent.start);
            self.split_at(extent.end);
            let inside: Vec<u64> = self
                .ranges
                .range(extent.start..extent.end)
                .map(|(&start, _)| start)
                .collect();
            let mut covered = 0;
            for start in inside {
                let Some((end, count)) = self.ranges.get_mut(&start) else {
                    continue;
                };
                covered += *end - start;
                *count -= 1;
                if *count == 0 {
                    freed += *end - start;
                    self.ranges.remove(&start);
                }
            }
            if covered != extent.len() {
                log::error!(
                    "pinned-memory bookkeeping: {:#x}..{:#x} was only partly pinned",
                    extent.start,
                    extent.end
                );
            }
            self.coalesce(extent);
        }
        self.bytes -= freed;
        freed
    }

    /// Forgets every pin.
    pub fn clear(&mut self) {
        self.ranges.clear();
        self.bytes = 0;
    }

    /// Bytes of `extent` some MR pins.
    fn covered(&self, extent: Extent) -> u64 {
        let before = self
            .ranges
            .range(..extent.start)
            .next_back()
            .map(|(&start, &(end, _))| (start, end));
        before
            .into_iter()
            .chain(
                self.ranges
                    .range(extent.start..extent.end)
                    .map(|(&start, &(end, _))| (start, end)),
            )
            .map(|(start, end)| end.min(extent.end).saturating_sub(start.max(extent.start)))
            .sum()
    }

    /// Makes `at` an extent boundary if an extent spans it.
    fn split_at(&mut self, at: u64) {
        let Some((&start, &(end, count))) = self.ranges.range(..at).next_back() else {
            return;
        };
        if end > at {
            self.ranges.insert(start, (at, count));
            self.ranges.insert(at, (end, count));
        }
    }

    /// Merges touching extents with equal counts from the one before `span` to the one at its
    /// end.
    fn coalesce(&mut self, span: Extent) {
        let first = self
            .ranges
            .range(..span.start)
            .next_back()
            .map_or(span.start, |(&start, _)| start);
        let keys: Vec<u64> = self
            .ranges
            .range(first..=span.end)
            .map(|(&start, _)| start)
            .collect();
        let mut previous: Option<u64> = None;
        for start in keys {
            let (end, count) = self.ranges[&start];
            match previous {
                Some(p) if self.ranges[&p].0 == start && self.ranges[&p].1 == count => {
                    self.ranges.remove(&start);
                    self.ranges.insert(p, (end, count));
                }
                _ => previous = Some(start),
            }
        }
    }

    /// The extents and their counts, in order (for tests).
    #[cfg(test)]
    fn snapshot(&self) -> Vec<(u64, u64, u32)> {
        self.ranges
            .iter()
            .map(|(&start, &(end, count))| (start, end, count))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(start: u64, end: u64) -> Extent {
        Extent { start, end }
    }

    #[test]
    fn normalize_sorts_and_merges() {
        let mut extents = vec![e(30, 40), e(0, 10), e(10, 20), e(35, 50), e(5, 5)];
        normalize(&mut extents);
        assert_eq!(extents, vec![e(0, 20), e(30, 50)]);
    }

    #[test]
    fn overlapping_pins_count_distinct_bytes_once() {
        let mut pinned = PinnedExtents::default();
        assert_eq!(pinned.unpinned_bytes(&[e(0, 100)]), 100);
        assert_eq!(pinned.pin(&[e(0, 100)]), 100);
        // Overlaps the first on 50..100, adds 100..150 and 200..250.
        let second = [e(50, 150), e(200, 250)];
        assert_eq!(pinned.unpinned_bytes(&second), 100);
        assert_eq!(pinned.pin(&second), 100);
        assert_eq!(pinned.bytes(), 200);
        assert_eq!(
            pinned.snapshot(),
            vec![(0, 50, 1), (50, 100, 2), (100, 150, 1), (200, 250, 1)]
        );
        // The same MR again pins nothing new.
        assert_eq!(pinned.unpinned_bytes(&[e(0, 100)]), 0);
        assert_eq!(pinned.pin(&[e(0, 100)]), 0);
        assert_eq!(pinned.bytes(), 200);

        // Unpinning the first MR frees only what no other MR covers.
        assert_eq!(pinned.unpin(&[e(0, 100)]), 0);
        assert_eq!(pinned.unpin(&[e(0, 100)]), 50);
        assert_eq!(pinned.bytes(), 150);
        assert_eq!(pinned.snapshot(), vec![(50, 150, 1), (200, 250, 1)]);
        assert_eq!(pinned.unpin(&second), 150);
        assert_eq!((pinned.bytes(), pinned.extent_count()), (0, 0));
    }

    #[test]
    fn equal_neighbours_merge() {
        let mut pinned = PinnedExtents::default();
        pinned.pin(&[e(0, 10)]);
        pinned.pin(&[e(10, 20)]);
        pinned.pin(&[e(30, 40)]);
        assert_eq!(pinned.snapshot(), vec![(0, 20, 1), (30, 40, 1)]);
        pinned.pin(&[e(20, 30)]);
        assert_eq!(pinned.snapshot(), vec![(0, 40, 1)]);
        pinned.pin(&[e(5, 15)]);
        pinned.unpin(&[e(5, 15)]);
        assert_eq!(pinned.snapshot(), vec![(0, 40, 1)]);
    }

    #[test]
    fn many_mrs_over_one_buffer_stay_a_few_extents() {
        let mut pinned = PinnedExtents::default();
        for _ in 0..1000 {
            pinned.pin(&[e(0x1000, 0x100_0000)]);
        }
        assert_eq!((pinned.bytes(), pinned.extent_count()), (0xff_f000, 1));
        for _ in 0..1000 {
            pinned.unpin(&[e(0x1000, 0x100_0000)]);
        }
        assert_eq!((pinned.bytes(), pinned.extent_count()), (0, 0));
    }

    #[test]
    fn clear_forgets_everything() {
        let mut pinned = PinnedExtents::default();
        pinned.pin(&[e(0, 10), e(20, 30)]);
        pinned.clear();
        assert_eq!((pinned.bytes(), pinned.extent_count()), (0, 0));
    }
}

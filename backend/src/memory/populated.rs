// Copyright 2026 The vrdma Authors
// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause

//! Which parts of guest RAM the daemon's own mapping of it already has in its page tables.
//!
//! An MR registered over that mapping is populated first (read faults, batched by the kernel)
//! so that pinning does not take a write fault per page. Populating memory that is already
//! populated still walks every page table entry, which costs as much as the pinning itself, so
//! each guest remembers what it populated and populates only the rest. Forgetting is always
//! safe: the kernel faults in whatever is missing when it pins.

use std::sync::{Arc, Weak};

use super::guest_ram::MappedGuestRam;
use super::pinned_extents::{normalize, Extent};

/// More extents than this and the record is dropped (the next registrations populate again):
/// keeps a guest from growing it without bound with scattered registrations.
const MAX_EXTENTS: usize = 4096;

/// Guest-physical extents populated in one mapping of guest RAM.
#[derive(Debug, Default)]
pub struct PopulatedRam {
    /// The mapping the extents refer to; a new memory table comes with new mappings, which
    /// start empty. Weak, so that its allocation (hence its address) is not reused while this
    /// record names it.
    mapping: Weak<MappedGuestRam>,
    /// Normalized.
    extents: Vec<Extent>,
}

impl PopulatedRam {
    /// Returns the parts of `range` not yet populated in `mapping`, in order, and records all
    /// of `range` as populated.
    pub fn take_missing(&mut self, mapping: &Arc<MappedGuestRam>, range: Extent) -> Vec<Extent> {
        if self.mapping.as_ptr() != Arc::as_ptr(mapping) || self.extents.len() >= MAX_EXTENTS {
            self.mapping = Arc::downgrade(mapping);
            self.extents.clear();
        }
        let mut missing = Vec::new();
        let mut from = range.start;
        // Extents are sorted and disjoint: skip those ending before the range.
        let first = self.extents.partition_point(|e| e.end <= range.start);
        for known in &self.extents[first..] {
            if known.start >= range.end {
                break;
            }
            if known.start > from {
                missing.push(Extent {
                    start: from,
                    end: known.start,
                });
            }
            from = from.max(known.end);
        }
        if from < range.end {
            missing.push(Extent {
                start: from,
                end: range.end,
            });
        }
        if !missing.is_empty() {
            self.extents.push(range);
            normalize(&mut self.extents);
        }
        missing
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    fn ram() -> Arc<MappedGuestRam> {
        Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap())
    }

    fn extent(start: u64, end: u64) -> Extent {
        Extent { start, end }
    }

    #[test]
    fn populates_each_part_once() {
        let mapping = ram();
        let mut populated = PopulatedRam::default();
        assert_eq!(
            populated.take_missing(&mapping, extent(0x2000, 0x4000)),
            [extent(0x2000, 0x4000)]
        );
        assert!(populated
            .take_missing(&mapping, extent(0x2000, 0x4000))
            .is_empty());
        assert!(populated
            .take_missing(&mapping, extent(0x3000, 0x4000))
            .is_empty());
        assert_eq!(
            populated.take_missing(&mapping, extent(0x8000, 0x9000)),
            [extent(0x8000, 0x9000)]
        );
        assert_eq!(
            populated.take_missing(&mapping, extent(0x1000, 0xa000)),
            [
                extent(0x1000, 0x2000),
                extent(0x4000, 0x8000),
                extent(0x9000, 0xa000)
            ]
        );
        assert!(populated
            .take_missing(&mapping, extent(0x1000, 0xa000))
            .is_empty());
    }

    #[test]
    fn a_new_mapping_starts_empty() {
        let (first, second) = (ram(), ram());
        let mut populated = PopulatedRam::default();
        populated.take_missing(&first, extent(0, 0x1000));
        assert_eq!(
            populated.take_missing(&second, extent(0, 0x1000)),
            [extent(0, 0x1000)]
        );
    }

    #[test]
    fn the_record_is_bounded() {
        let mapping = ram();
        let mut populated = PopulatedRam::default();
        for i in 0..(MAX_EXTENTS as u64 + 10) {
            populated.take_missing(&mapping, extent(i * 0x2000, i * 0x2000 + 0x1000));
        }
        assert!(populated.extents.len() <= MAX_EXTENTS);
    }
}

//! Placement of queue buffers in the guest's queue region (VIRTIO shared-memory region 0), and
//! the description of a buffer placed there ([`MappedRing`]).
//!
//! Every host queue buffer the device maps into the region needs an extent of its own: aligned
//! to the region's page size, never overlapping another (the frontend refuses overlapping
//! SHMEM_MAPs). [`ShmAllocator`] hands out such extents first-fit from a free list that is
//! kept sorted and coalesced, so a region of `n` pages never holds more than `n / 2` free
//! extents and fragmentation heals as soon as neighbours are freed.
//!
//! Buffers of the device's own memory (staging rings, spec §9.7) need no mapping each: they
//! are placed in *pooled extents*, chunks of the region that one mapping covers and several
//! buffers share ([`ShmAllocator::alloc_pooled`]). A chunk is an extent like any other (it
//! counts against the extent cap) and is given back when its last buffer goes.

use std::collections::BTreeMap;

use vrdma_spec::wire::RingDesc;

/// A queue buffer mapped into the queue region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappedRing {
    /// Its extent of the region.
    pub range: ShmRange,
    /// Its description for the guest.
    pub desc: RingDesc,
}

/// Errors of the [`ShmAllocator`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ShmAllocError {
    /// The region size or the page size cannot describe a region.
    #[error("a region of {size:#x} bytes cannot be split in pages of {page_size:#x} bytes")]
    BadGeometry {
        /// Region size.
        size: u64,
        /// Page size.
        page_size: u64,
    },
    /// An extent of 0 bytes, or one larger than the region, was requested.
    #[error("no extent of {0:#x} bytes can be placed")]
    BadLength(u64),
    /// No free extent is large enough.
    #[error("no free extent of {len:#x} bytes ({free:#x} bytes free in total)")]
    NoSpace {
        /// Bytes requested (rounded up to pages).
        len: u64,
        /// Bytes free, possibly fragmented.
        free: u64,
    },
    /// The region holds as many extents as its front-end can take mappings (see
    /// [`ShmAllocator::set_max_extents`]).
    #[error("{max} queue-region mappings, the most the front-end can hold")]
    TooManyExtents {
        /// The limit.
        max: usize,
    },
    /// A pooled extent given back while buffers still lie in it.
    #[error("pooled extent {offset:#x} still holds buffers")]
    ChunkInUse {
        /// Offset of the chunk.
        offset: u64,
    },
    /// The extent given back was not handed out (or was already given back).
    #[error("extent {offset:#x}+{len:#x} is not allocated")]
    NotAllocated {
        /// Offset of the extent.
        offset: u64,
        /// Its length.
        len: u64,
    },
}

/// A page-aligned extent of the queue region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShmRange {
    /// Offset in the region (page aligned).
    pub offset: u64,
    /// Length in bytes (a multiple of the page size).
    pub len: u64,
}

impl ShmRange {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        // Cannot overflow: extents lie inside the region.
        self.offset + self.len
    }
}

/// First-fit allocator of page-aligned extents of a region.
#[derive(Debug)]
pub struct ShmAllocator {
    size: u64,
    page_size: u64,
    /// Free extents: offset → length; sorted, non-overlapping, never adjacent.
    free: BTreeMap<u64, u64>,
    /// Allocated extents: offset → length.
    used: BTreeMap<u64, u64>,
    /// Most extents at once (each is one SHMEM_MAP, which some front-ends count as a memory
    /// slot).
    max_extents: usize,
    /// Pooled extents: chunk offset → the placement of buffers inside it (chunk-relative).
    pooled: BTreeMap<u64, ShmAllocator>,
}

impl ShmAllocator {
    /// An allocator for a region of `size` bytes placed in units of `page_size` bytes (a power
    /// of two). `size` must be a non-zero multiple of `page_size`.
    pub fn new(size: u64, page_size: u64) -> Result<Self, ShmAllocError> {
        let bad = ShmAllocError::BadGeometry { size, page_size };
        if !page_size.is_power_of_two() || size == 0 || !size.is_multiple_of(page_size) {
            return Err(bad);
        }
        let mut allocator = ShmAllocator {
            size,
            page_size,
            free: BTreeMap::new(),
            used: BTreeMap::new(),
            max_extents: usize::MAX,
            pooled: BTreeMap::new(),
        };
        allocator.free.insert(0, size);
        Ok(allocator)
    }

    /// Size of the region.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Placement granularity.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// Limits the extents held at once to `max` (those held already stay).
    pub fn set_max_extents(&mut self, max: usize) {
        self.max_extents = max;
    }

    /// The cap on extents held at once ([`ShmAllocator::set_max_extents`]).
    pub fn max_extents(&self) -> usize {
        self.max_extents
    }

    /// Extents that may still be allocated under the cap.
    pub fn extents_left(&self) -> usize {
        self.max_extents.saturating_sub(self.used.len())
    }

    /// Bytes allocated.
    pub fn used_bytes(&self) -> u64 {
        self.used.values().sum()
    }

    /// Number of allocated extents.
    pub fn used_extents(&self) -> usize {
        self.used.len()
    }

    /// Bytes free (possibly fragmented).
    pub fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }

    /// Whether nothing is allocated.
    pub fn is_empty(&self) -> bool {
        self.used.is_empty()
    }

    /// Allocates an extent of at least `len` bytes (rounded up to whole pages), at the lowest
    /// offset where one fits.
    pub fn alloc(&mut self, len: u64) -> Result<ShmRange, ShmAllocError> {
        if len == 0 || len > self.size {
            return Err(ShmAllocError::BadLength(len));
        }
        if self.used.len() >= self.max_extents {
            return Err(ShmAllocError::TooManyExtents {
                max: self.max_extents,
            });
        }
        // Cannot overflow: len <= size, and size is a multiple of the page size.
        let len = len.next_multiple_of(self.page_size);
        let (offset, extent) = self
            .free
            .iter()
            .find(|(_, &extent)| extent >= len)
            .map(|(&offset, &extent)| (offset, extent))
            .ok_or(ShmAllocError::NoSpace {
                len,
                free: self.free_bytes(),
            })?;
        self.free.remove(&offset);
        if extent > len {
            self.free.insert(offset + len, extent - len);
        }
        self.used.insert(offset, len);
        Ok(ShmRange { offset, len })
    }

    /// Gives an extent back; it must be exactly one that [`ShmAllocator::alloc`] returned.
    pub fn free(&mut self, range: ShmRange) -> Result<(), ShmAllocError> {
        let not_allocated = ShmAllocError::NotAllocated {
            offset: range.offset,
            len: range.len,
        };
        if self.used.get(&range.offset) != Some(&range.len) {
            return Err(not_allocated);
        }
        if let Some(chunk) = self.pooled.get(&range.offset) {
            if !chunk.is_empty() {
                return Err(ShmAllocError::ChunkInUse {
                    offset: range.offset,
                });
            }
            self.pooled.remove(&range.offset);
        }
        self.used.remove(&range.offset);
        let mut start = range.offset;
        let mut len = range.len;
        // Merge with the free neighbour below, then with the one above.
        if let Some((&below, &below_len)) = self.free.range(..start).next_back() {
            if below + below_len == start {
                self.free.remove(&below);
                start = below;
                len += below_len;
            }
        }
        if let Some(above_len) = self.free.remove(&(start + len)) {
            len += above_len;
        }
        self.free.insert(start, len);
        Ok(())
    }

    /// Places `len` bytes (rounded up to whole pages) in a pooled extent, first fit over the
    /// chunks in offset order; if none has room, opens a chunk of `chunk_len` bytes (or of the
    /// buffer's length, if larger or if only that fits). Returns the buffer's range and the
    /// chunk if one was opened for it, which the caller maps before the buffer is used.
    pub fn alloc_pooled(
        &mut self,
        len: u64,
        chunk_len: u64,
    ) -> Result<(ShmRange, Option<ShmRange>), ShmAllocError> {
        if len == 0 || len > self.size {
            return Err(ShmAllocError::BadLength(len));
        }
        for (&base, chunk) in self.pooled.iter_mut() {
            if let Ok(inner) = chunk.alloc(len) {
                return Ok((
                    ShmRange {
                        offset: base + inner.offset,
                        len: inner.len,
                    },
                    None,
                ));
            }
        }
        let opened = match self.alloc(len.max(chunk_len)) {
            Ok(chunk) => chunk,
            Err(ShmAllocError::NoSpace { .. } | ShmAllocError::BadLength(_)) => self.alloc(len)?,
            Err(e) => return Err(e),
        };
        let mut chunk =
            ShmAllocator::new(opened.len, self.page_size).expect("a chunk is whole pages");
        let inner = chunk
            .alloc(len)
            .expect("a fresh chunk holds its first buffer");
        self.pooled.insert(opened.offset, chunk);
        Ok((
            ShmRange {
                offset: opened.offset + inner.offset,
                len: inner.len,
            },
            Some(opened),
        ))
    }

    /// The pooled extent that holds the buffer at `range`, if `range` is a pooled buffer.
    pub fn chunk_of(&self, range: ShmRange) -> Option<ShmRange> {
        let (&base, chunk) = self.pooled.range(..=range.offset).next_back()?;
        (range.offset < base + chunk.size()).then_some(ShmRange {
            offset: base,
            len: chunk.size(),
        })
    }

    /// Gives a pooled buffer back. Returns its chunk when no buffer is left in it: the caller
    /// unmaps the chunk and gives it back with [`ShmAllocator::free`].
    pub fn free_pooled(&mut self, range: ShmRange) -> Result<Option<ShmRange>, ShmAllocError> {
        let not_allocated = ShmAllocError::NotAllocated {
            offset: range.offset,
            len: range.len,
        };
        let chunk_range = self.chunk_of(range).ok_or(not_allocated)?;
        let chunk = self
            .pooled
            .get_mut(&chunk_range.offset)
            .ok_or(not_allocated)?;
        chunk
            .free(ShmRange {
                offset: range.offset - chunk_range.offset,
                len: range.len,
            })
            .map_err(|_| not_allocated)?;
        Ok(chunk.is_empty().then_some(chunk_range))
    }

    /// Frees every extent at once (the guest's state was discarded).
    pub fn clear(&mut self) {
        self.pooled.clear();
        self.used.clear();
        self.free.clear();
        self.free.insert(0, self.size);
    }

    /// Allocated extents, by offset.
    pub fn extents(&self) -> impl Iterator<Item = ShmRange> + '_ {
        self.used
            .iter()
            .map(|(&offset, &len)| ShmRange { offset, len })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 4096;

    #[test]
    fn geometry_is_checked() {
        assert!(ShmAllocator::new(0, PAGE).is_err());
        assert!(ShmAllocator::new(PAGE + 1, PAGE).is_err());
        assert!(ShmAllocator::new(4 * PAGE, 3000).is_err());
        let a = ShmAllocator::new(4 * PAGE, PAGE).unwrap();
        assert_eq!(
            (a.size(), a.free_bytes(), a.used_bytes()),
            (4 * PAGE, 4 * PAGE, 0)
        );
    }

    #[test]
    fn extents_are_page_rounded_disjoint_and_first_fit() {
        let mut a = ShmAllocator::new(8 * PAGE, PAGE).unwrap();
        let r1 = a.alloc(1).unwrap();
        let r2 = a.alloc(PAGE + 1).unwrap();
        let r3 = a.alloc(PAGE).unwrap();
        assert_eq!(
            r1,
            ShmRange {
                offset: 0,
                len: PAGE
            }
        );
        assert_eq!(
            r2,
            ShmRange {
                offset: PAGE,
                len: 2 * PAGE
            }
        );
        assert_eq!(
            r3,
            ShmRange {
                offset: 3 * PAGE,
                len: PAGE
            }
        );
        a.free(r2).unwrap();
        // The hole is reused first.
        assert_eq!(a.alloc(PAGE).unwrap().offset, PAGE);
        assert_eq!(a.used_bytes(), 3 * PAGE);
        assert_eq!(a.used_extents(), 3);
    }

    #[test]
    fn exhaustion_and_bad_lengths_are_errors() {
        let mut a = ShmAllocator::new(4 * PAGE, PAGE).unwrap();
        assert_eq!(a.alloc(0), Err(ShmAllocError::BadLength(0)));
        assert_eq!(a.alloc(5 * PAGE), Err(ShmAllocError::BadLength(5 * PAGE)));
        assert_eq!(a.alloc(u64::MAX), Err(ShmAllocError::BadLength(u64::MAX)));
        let r = a.alloc(3 * PAGE).unwrap();
        assert_eq!(
            a.alloc(2 * PAGE),
            Err(ShmAllocError::NoSpace {
                len: 2 * PAGE,
                free: PAGE
            })
        );
        a.free(r).unwrap();
        assert_eq!(a.alloc(4 * PAGE).unwrap().offset, 0);
    }

    #[test]
    fn the_extent_count_can_be_capped() {
        let mut a = ShmAllocator::new(8 * PAGE, PAGE).unwrap();
        a.set_max_extents(2);
        let first = a.alloc(PAGE).unwrap();
        a.alloc(PAGE).unwrap();
        assert_eq!(
            a.alloc(PAGE),
            Err(ShmAllocError::TooManyExtents { max: 2 }),
            "room for bytes, not for another mapping"
        );
        a.free(first).unwrap();
        a.alloc(PAGE).unwrap();
        a.clear();
        assert_eq!(a.max_extents, 2, "a reset keeps the front-end's limit");
    }

    #[test]
    fn freeing_coalesces_and_refuses_unknown_extents() {
        let mut a = ShmAllocator::new(6 * PAGE, PAGE).unwrap();
        let rs: Vec<_> = (0..6).map(|_| a.alloc(PAGE).unwrap()).collect();
        for i in [1, 3, 2, 5, 0, 4] {
            a.free(rs[i]).unwrap();
        }
        assert!(a.is_empty());
        assert_eq!(a.free.len(), 1, "all free extents merged: {:?}", a.free);
        assert_eq!(
            a.alloc(6 * PAGE).unwrap(),
            ShmRange {
                offset: 0,
                len: 6 * PAGE
            }
        );
        a.clear();
        assert!(a
            .free(ShmRange {
                offset: 0,
                len: PAGE
            })
            .is_err());
        let r = a.alloc(2 * PAGE).unwrap();
        assert!(
            a.free(ShmRange {
                offset: 0,
                len: PAGE
            })
            .is_err(),
            "wrong length"
        );
        a.free(r).unwrap();
        assert!(a.free(r).is_err(), "double free");
    }

    #[test]
    fn pooled_buffers_share_a_chunk_until_it_is_full() {
        let mut a = ShmAllocator::new(16 * PAGE, PAGE).unwrap();
        a.set_max_extents(3);
        let direct = a.alloc(PAGE).unwrap();
        let (b1, opened) = a.alloc_pooled(PAGE, 4 * PAGE).unwrap();
        let chunk = opened.unwrap();
        assert_eq!(
            chunk,
            ShmRange {
                offset: PAGE,
                len: 4 * PAGE
            }
        );
        assert_eq!(
            b1,
            ShmRange {
                offset: PAGE,
                len: PAGE
            }
        );
        // Three more fit the chunk without another extent.
        let (b2, none) = a.alloc_pooled(2 * PAGE, 4 * PAGE).unwrap();
        assert_eq!((b2.offset, none), (2 * PAGE, None));
        let (b3, none) = a.alloc_pooled(1, 4 * PAGE).unwrap();
        assert_eq!(
            (b3, none),
            (
                ShmRange {
                    offset: 4 * PAGE,
                    len: PAGE
                },
                None
            )
        );
        assert_eq!(a.used_extents(), 2);
        assert_eq!(a.extents_left(), 1);
        // The next opens a second chunk, the last extent the cap allows.
        let (b4, second) = a.alloc_pooled(PAGE, 4 * PAGE).unwrap();
        assert_eq!(second.unwrap().offset, 5 * PAGE);
        assert!(matches!(
            a.alloc_pooled(4 * PAGE, 4 * PAGE),
            Err(ShmAllocError::TooManyExtents { max: 3 })
        ));
        assert_eq!(a.chunk_of(b2), Some(chunk));
        assert_eq!(a.chunk_of(direct), None);
        // A chunk with buffers cannot be freed; the last buffer hands it back.
        assert_eq!(a.free_pooled(b1), Ok(None));
        assert_eq!(
            a.free(chunk),
            Err(ShmAllocError::ChunkInUse { offset: PAGE })
        );
        assert_eq!(a.free_pooled(b3), Ok(None));
        assert!(a.free_pooled(b3).is_err());
        assert_eq!(a.free_pooled(b2), Ok(Some(chunk)));
        a.free(chunk).unwrap();
        assert_eq!(a.chunk_of(b2), None);
        assert!(a.free_pooled(b2).is_err());
        assert_eq!(a.free_pooled(b4).unwrap().unwrap().offset, 5 * PAGE);
        a.clear();
        assert!(a.is_empty());
    }

    #[test]
    fn a_pooled_buffer_larger_than_a_chunk_gets_a_chunk_of_its_own() {
        let mut a = ShmAllocator::new(8 * PAGE, PAGE).unwrap();
        let (buffer, opened) = a.alloc_pooled(3 * PAGE, 2 * PAGE).unwrap();
        assert_eq!(opened, Some(buffer));
        // Only 5 pages left: a 6-page chunk does not fit, the buffer alone does.
        let (small, opened) = a.alloc_pooled(5 * PAGE, 6 * PAGE).unwrap();
        assert_eq!(opened, Some(small));
        assert!(a.alloc_pooled(PAGE, 2 * PAGE).is_err());
    }

    #[test]
    fn random_workload_never_overlaps() {
        let mut a = ShmAllocator::new(64 * PAGE, PAGE).unwrap();
        let mut live: Vec<ShmRange> = Vec::new();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..5000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            if seed.is_multiple_of(3) && !live.is_empty() {
                let r = live.swap_remove((seed >> 8) as usize % live.len());
                a.free(r).unwrap();
            } else if let Ok(r) = a.alloc(((seed >> 16) % (5 * PAGE)) + 1) {
                assert!(r.offset.is_multiple_of(PAGE) && r.len.is_multiple_of(PAGE));
                assert!(r.end() <= 64 * PAGE);
                assert!(live
                    .iter()
                    .all(|o| r.end() <= o.offset || o.end() <= r.offset));
                live.push(r);
            }
            assert_eq!(a.used_bytes() + a.free_bytes(), 64 * PAGE);
        }
    }
}

// Copyright 2026 The vrdma Authors
// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause

//! Planning an MR window: which runs of guest pages go where, which guest-physical bytes the
//! registration pins, and which parts of guest RAM it depends on. Pure computation over a
//! [`GuestRamFiles`] snapshot; nothing is mapped here.

use super::error::MemError;
use super::guest_ram::{FileIdentity, GuestRamFiles};
use super::pinned_extents::{normalize, Extent};

/// A part of guest RAM a window maps: used to tell whether a new memory map still backs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Dependency {
    /// Guest-physical hull of the pages mapped from one region.
    pub(super) gpa_start: u64,
    pub(super) gpa_end: u64,
    pub(super) identity: FileIdentity,
    /// File offset of `gpa_start`.
    pub(super) file_offset: u64,
}

/// Pages that are consecutive both in the page list and in one backing file: one mmap.
#[derive(Debug, Clone, Copy)]
pub(super) struct Run {
    /// Region providing the descriptor to map.
    pub(super) region: usize,
    /// Guest-physical address of the first page (for error messages).
    pub(super) gpa: u64,
    pub(super) file_offset: u64,
    pub(super) len: u64,
}

/// A planned mmap of one run, relative to the window base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PlannedMap {
    pub(super) region: usize,
    pub(super) window_offset: u64,
    pub(super) file_offset: u64,
    pub(super) len: u64,
}

/// Where everything goes in the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Layout {
    /// Alignment of the window base.
    pub(super) alignment: u64,
    /// Length of the whole reservation.
    pub(super) reserve_len: u64,
    /// Offset of the first page of the MR from the window base.
    pub(super) first_page: u64,
    pub(super) maps: Vec<PlannedMap>,
}

/// Lays `runs` out back to back, honouring each backing's mapping granularity.
///
/// Runs whose backing can be mapped in host pages are mapped exactly. Runs backed by huge pages
/// are widened to whole huge pages; this is only possible when the widened mappings do not
/// overlap their neighbours, i.e. when run boundaries inside the window fall on huge page
/// boundaries. The first page is placed at its offset within its huge page, so the window base
/// can be huge-page aligned.
pub(super) fn plan_layout(
    runs: &[Run],
    granularity_of: impl Fn(usize) -> u64,
    page_size: u64,
    host_page_size: u64,
) -> Result<Layout, MemError> {
    let largest_granularity = runs
        .iter()
        .map(|run| granularity_of(run.region))
        .fold(host_page_size, u64::max);
    // Place the pages so that the first run with the largest granularity starts at its offset
    // within a unit of that granularity; the other runs are checked below.
    let mut prefix = 0u64;
    let mut first_page = 0;
    for run in runs {
        if granularity_of(run.region) == largest_granularity {
            first_page = run.file_offset.wrapping_sub(prefix) & (largest_granularity - 1);
            break;
        }
        // Only needed modulo the granularity.
        prefix = prefix.wrapping_add(run.len);
    }
    let too_large = || MemError::WindowTooLarge {
        pages: runs.iter().map(|run| run.len / page_size).sum(),
        page_size,
    };

    let mut maps = Vec::with_capacity(runs.len());
    let mut next_page = first_page;
    let mut mapped_end = 0u64;
    for run in runs {
        let granularity = granularity_of(run.region);
        let misaligned = MemError::BackingGranularity {
            gpa: run.gpa,
            granularity,
        };
        let head = run.file_offset % granularity;
        let window_offset = next_page
            .checked_sub(head)
            .filter(|offset| offset % granularity == 0 && *offset >= mapped_end)
            .ok_or(misaligned)?;
        let len = head
            .checked_add(run.len)
            .and_then(|len| align_up(len, granularity))
            .ok_or_else(too_large)?;
        maps.push(PlannedMap {
            region: run.region,
            window_offset,
            file_offset: run.file_offset - head,
            len,
        });
        mapped_end = window_offset.checked_add(len).ok_or_else(too_large)?;
        next_page = next_page.checked_add(run.len).ok_or_else(too_large)?;
    }
    let reserve_len = align_up(mapped_end.max(next_page), host_page_size).ok_or_else(too_large)?;
    Ok(Layout {
        alignment: largest_granularity.max(page_size),
        reserve_len,
        first_page,
        maps,
    })
}

pub(super) fn align_up(value: u64, alignment: u64) -> Option<u64> {
    debug_assert!(alignment.is_power_of_two());
    value
        .checked_add(alignment - 1)
        .map(|value| value & !(alignment - 1))
}

impl Layout {
    /// Number of memory mappings (VMAs) the window adds to this process: one per planned map,
    /// plus one per piece of the reservation left inaccessible before, between or after them.
    /// An upper bound: the kernel may merge neighbours that continue each other.
    pub(super) fn mappings(&self) -> u64 {
        let mut count = 0;
        let mut end = 0;
        for map in &self.maps {
            if map.window_offset > end {
                count += 1;
            }
            count += 1;
            end = map.window_offset + map.len;
        }
        if self.reserve_len > end {
            count += 1;
        }
        count
    }
}

/// The guest-physical extents of a page list, in MR order: runs of consecutive pages merged,
/// each page checked to be aligned to `page_size`. Planning works on these, so a contiguous MR
/// costs the same however many pages it has.
pub(super) fn page_extents(pages: &[u64], page_size: u64) -> Result<Vec<Extent>, MemError> {
    let mut extents: Vec<Extent> = Vec::new();
    for &gpa in pages {
        if gpa & (page_size - 1) != 0 {
            return Err(MemError::UnalignedPage { gpa, page_size });
        }
        let end = gpa.checked_add(page_size).ok_or(MemError::NotInGuestRam {
            gpa,
            len: page_size,
        })?;
        match extents.last_mut() {
            Some(last) if last.end == gpa => last.end = end,
            _ => extents.push(Extent { start: gpa, end }),
        }
    }
    Ok(extents)
}

/// The guest-physical extents of the host pages that hold the MR's bytes `[o, o + length)` of
/// the concatenated `extents` (whole MR pages, in MR order), normalized: only the head of the
/// first and the tail of the last can be unused.
pub(super) fn pinned_extents(
    extents: &[Extent],
    in_page_offset: u64,
    length: u64,
    host_page_size: u64,
) -> Vec<Extent> {
    let total: u64 = extents.iter().map(Extent::len).sum();
    // The caller checked that the pages cover `o + length`, ending in the last page.
    let unused_tail = total - in_page_offset - length;
    let mut pinned = extents.to_vec();
    if let Some(first) = pinned.first_mut() {
        first.start += in_page_offset & !(host_page_size - 1);
    }
    if let Some(last) = pinned.last_mut() {
        last.end -= unused_tail & !(host_page_size - 1);
    }
    normalize(&mut pinned);
    pinned
}

/// Checks and translates every extent (split where it crosses regions, in whole MR pages),
/// coalescing what is consecutive in one file into runs, and records which part of which
/// region the pages come from. O(extents + regions crossed).
pub(super) fn collect_runs(
    ram: &GuestRamFiles,
    extents: &[Extent],
    page_size: u64,
) -> Result<(Vec<Run>, Vec<Dependency>), MemError> {
    let mut runs: Vec<Run> = Vec::new();
    // Per region: guest-physical hull of the pages taken from it.
    let mut hulls: Vec<Option<(u64, u64)>> = vec![None; ram.regions.len()];
    for extent in extents {
        let mut gpa = extent.start;
        while gpa < extent.end {
            // The longest whole-page prefix of the rest that one region holds; a page that
            // straddles a region's end fails `locate` with the page's own error.
            let rest = extent.end - gpa;
            let inside = ram.room_in_region(gpa).min(rest) & !(page_size - 1);
            let len = if inside == 0 { page_size } else { inside };
            let (region, backing, file_offset) = ram.locate(gpa, len)?;
            // Cannot overflow: `locate` checked that the chunk is inside the region.
            let gpa_end = gpa + len;
            let hull = &mut hulls[region];
            *hull = Some(hull.map_or((gpa, gpa_end), |(start, end)| {
                (start.min(gpa), end.max(gpa_end))
            }));
            let extends_last = runs.last().is_some_and(|run| {
                let last = ram.regions[run.region].backing.as_ref();
                last.is_some_and(|last| last.identity == backing.identity)
                    && run.file_offset + run.len == file_offset
            });
            match runs.last_mut() {
                Some(run) if extends_last => run.len += len,
                _ => runs.push(Run {
                    region,
                    gpa,
                    file_offset,
                    len,
                }),
            }
            gpa = gpa_end;
        }
    }
    let dependencies = hulls
        .iter()
        .zip(&ram.regions)
        .filter_map(|(hull, region)| {
            let (gpa_start, gpa_end) = (*hull)?;
            let backing = region.backing.as_ref()?;
            Some(Dependency {
                gpa_start,
                gpa_end,
                identity: backing.identity,
                file_offset: backing.start + (gpa_start - region.gpa_start),
            })
        })
        .collect();
    Ok((runs, dependencies))
}

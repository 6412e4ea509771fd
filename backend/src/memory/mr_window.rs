// Copyright 2026 The vrdma Authors
// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause

//! Guest memory windows for memory regions (MRs).
//!
//! A guest registers an MR by sending its iova, its length and the list of guest-physical pages
//! that back it. The host kernel can only register memory mapped in our own address space, and
//! the NIC must DMA straight into guest RAM, so we build an [`MrWindow`]: a contiguous range of
//! our address space into which the guest pages are mapped, in order, from the very files
//! (memfd, hugetlbfs, ...) that back guest RAM. Registering `window.addr()..+window.len()` with
//! `hca_va = iova` then makes the NIC see exactly the guest's view of the MR.
//!
//! When the frontend changes the memory map, each window is asked whether it is
//! [still backed](MrWindow::still_backed_by) by the new [`GuestRamFiles`] snapshot.
//!
//! Writes made through a window (by the NIC or by us) bypass vm-memory's dirty bitmap: like any
//! DMA from a passthrough device, they are invisible to dirty logging.

use vm_memory::VolatileSlice;
use vrdma_spec::control::{MAX_PAGE_SHIFT, MIN_PAGE_SHIFT};

use super::error::MemError;
use super::guest_ram::{FileIdentity, GuestRamFiles};
use super::pinned_extents::{normalize, Extent};
use super::reservation::{host_page_size, Reservation};

/// An MR registration request, as sent by the guest.
#[derive(Debug, Clone, Copy)]
pub struct MrPages<'a> {
    /// Address the guest uses for the first byte of the MR.
    pub iova: u64,
    /// Length of the MR in bytes.
    pub length: u64,
    /// log2 of the MR page size.
    pub page_shift: u32,
    /// Guest-physical addresses of the pages covering `[iova, iova + length)`, in order; each
    /// aligned to the page size. The MR starts at offset `iova % page size` in the first page.
    pub pages: &'a [u64],
}

/// A part of guest RAM a window maps: used to tell whether a new memory map still backs it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Dependency {
    /// Guest-physical hull of the pages mapped from one region.
    gpa_start: u64,
    gpa_end: u64,
    identity: FileIdentity,
    /// File offset of `gpa_start`.
    file_offset: u64,
}

/// Pages that are consecutive both in the page list and in one backing file: one mmap.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// Region providing the descriptor to map.
    region: usize,
    /// Guest-physical address of the first page (for error messages).
    gpa: u64,
    file_offset: u64,
    len: u64,
}

/// A planned mmap of one run, relative to the window base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PlannedMap {
    region: usize,
    window_offset: u64,
    file_offset: u64,
    len: u64,
}

/// Where everything goes in the window.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layout {
    /// Alignment of the window base.
    alignment: u64,
    /// Length of the whole reservation.
    reserve_len: u64,
    /// Offset of the first page of the MR from the window base.
    first_page: u64,
    maps: Vec<PlannedMap>,
}

/// Lays `runs` out back to back, honouring each backing's mapping granularity.
///
/// Runs whose backing can be mapped in host pages are mapped exactly. Runs backed by huge pages
/// are widened to whole huge pages; this is only possible when the widened mappings do not
/// overlap their neighbours, i.e. when run boundaries inside the window fall on huge page
/// boundaries. The first page is placed at its offset within its huge page, so the window base
/// can be huge-page aligned.
fn plan_layout(
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

fn align_up(value: u64, alignment: u64) -> Option<u64> {
    debug_assert!(alignment.is_power_of_two());
    value
        .checked_add(alignment - 1)
        .map(|value| value & !(alignment - 1))
}

/// Guest pages mapped contiguously into our address space, ready to be registered with the host
/// RDMA device. Dropping the window unmaps it; deregister the host MR first.
#[derive(Debug)]
pub struct MrWindow {
    reservation: Reservation,
    /// Offset of the MR's first byte from the reservation start.
    mr_offset: usize,
    length: u64,
    iova: u64,
    runs: usize,
    mappings: u64,
    /// Guest-physical bytes the registration pins, normalized.
    pinned: Vec<Extent>,
    dependencies: Vec<Dependency>,
}

impl Layout {
    /// Number of memory mappings (VMAs) the window adds to this process: one per planned map,
    /// plus one per piece of the reservation left inaccessible before, between or after them.
    /// An upper bound: the kernel may merge neighbours that continue each other.
    fn mappings(&self) -> u64 {
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

/// A validated MR registration whose window is planned but not yet mapped: its cost (mappings
/// and pinned guest memory) can be checked against budgets before any mmap is made.
#[derive(Debug)]
pub struct MrPlan<'r> {
    ram: &'r GuestRamFiles,
    layout: Layout,
    dependencies: Vec<Dependency>,
    iova: u64,
    length: u64,
    in_page_offset: u64,
    npages: u64,
    page_size: u64,
    pinned: Vec<Extent>,
}

impl<'r> MrPlan<'r> {
    /// Number of memory mappings the window will add to this process (see
    /// [`MrWindow::mappings`]).
    pub fn mappings(&self) -> u64 {
        self.layout.mappings()
    }

    /// Number of mmaps of guest RAM the window will be made of.
    pub fn runs(&self) -> usize {
        self.layout.maps.len()
    }

    /// The guest-physical bytes the registration pins (see [`MrWindow::pinned_extents`]).
    pub fn pinned_extents(&self) -> &[Extent] {
        &self.pinned
    }

    /// Reserves the window and maps the planned pages into it. The plan keeps its
    /// [`mappings`](Self::mappings) and, if this fails, its
    /// [`pinned_extents`](Self::pinned_extents), so that what was charged for it can be given
    /// back.
    pub fn map(&mut self) -> Result<MrWindow, MemError> {
        let too_large = || MemError::WindowTooLarge {
            pages: self.npages,
            page_size: self.page_size,
        };
        let reserve_len = usize::try_from(self.layout.reserve_len).map_err(|_| too_large())?;
        let alignment = usize::try_from(self.layout.alignment).map_err(|_| too_large())?;
        let reservation = Reservation::new(reserve_len, alignment)?;
        for map in &self.layout.maps {
            let region = &self.ram.regions[map.region];
            let backing = region.backing.as_ref().ok_or(MemError::NotFdBacked {
                region_start: region.gpa_start,
            })?;
            reservation.map_file(&backing.file, map.window_offset, map.file_offset, map.len)?;
        }
        log::debug!(
            "mapped MR window iova {:#x} len {:#x}: {} pages in {} runs ({} mappings)",
            self.iova,
            self.length,
            self.npages,
            self.layout.maps.len(),
            self.layout.mappings()
        );
        Ok(MrWindow {
            reservation,
            // Cannot overflow: both are inside the reservation.
            mr_offset: (self.layout.first_page + self.in_page_offset) as usize,
            length: self.length,
            iova: self.iova,
            runs: self.layout.maps.len(),
            mappings: self.layout.mappings(),
            pinned: std::mem::take(&mut self.pinned),
            dependencies: std::mem::take(&mut self.dependencies),
        })
    }
}

impl MrWindow {
    /// Validates `request` against `ram` and maps its pages into a new window. `max_length` is
    /// the largest MR the caller accepts (e.g. the guest's remaining MR byte quota).
    pub fn map(
        ram: &GuestRamFiles,
        request: &MrPages<'_>,
        max_length: u64,
    ) -> Result<Self, MemError> {
        let mut plan = Self::plan(ram, request, max_length)?;
        plan.map()
    }

    /// Validates `request` against `ram` and plans its window without mapping anything.
    pub fn plan<'r>(
        ram: &'r GuestRamFiles,
        request: &MrPages<'_>,
        max_length: u64,
    ) -> Result<MrPlan<'r>, MemError> {
        let MrPages {
            iova,
            length,
            page_shift,
            pages,
        } = *request;
        let host_page_size = host_page_size();
        if !(MIN_PAGE_SHIFT..=MAX_PAGE_SHIFT).contains(&page_shift)
            || (1u64 << page_shift) < host_page_size
        {
            return Err(MemError::BadPageShift(page_shift));
        }
        let page_size = 1u64 << page_shift;
        if length == 0 {
            return Err(MemError::ZeroLength);
        }
        if length > max_length {
            return Err(MemError::TooLarge {
                length,
                limit: max_length,
            });
        }
        iova.checked_add(length)
            .ok_or(MemError::IovaOverflow { iova, length })?;
        let in_page_offset = iova & (page_size - 1);
        let expected_pages = in_page_offset
            .checked_add(length)
            .ok_or(MemError::IovaOverflow { iova, length })?
            .div_ceil(page_size);
        if pages.len() as u64 != expected_pages {
            return Err(MemError::PageCountMismatch {
                given: pages.len(),
                expected: expected_pages,
            });
        }

        let (runs, dependencies) = collect_runs(ram, pages, page_size)?;
        let layout = plan_layout(
            &runs,
            |region| {
                ram.regions[region]
                    .backing
                    .as_ref()
                    .map_or(host_page_size, |backing| backing.granularity)
            },
            page_size,
            host_page_size,
        )?;
        let pinned = pinned_extents(pages, page_size, in_page_offset, length, host_page_size);
        Ok(MrPlan {
            ram,
            layout,
            dependencies,
            iova,
            length,
            in_page_offset,
            npages: expected_pages,
            page_size,
            pinned,
        })
    }

    /// Address of the MR's first byte in our address space: the `start` to register.
    pub fn addr(&self) -> *mut u8 {
        (self.reservation.addr + self.mr_offset) as *mut u8
    }

    /// Length of the MR in bytes.
    pub fn len(&self) -> u64 {
        self.length
    }

    /// Always false: empty MRs are refused.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// The guest's address of the MR's first byte: the `hca_va` to register.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// Number of mmaps the window is made of (runs of pages contiguous in one backing file).
    pub fn runs(&self) -> usize {
        self.runs
    }

    /// Number of memory mappings (VMAs) the window holds in this process: its runs and the
    /// inaccessible pieces of its reservation around them. Every mapping of the daemon counts
    /// against the host's `vm.max_map_count`.
    pub fn mappings(&self) -> u64 {
        self.mappings
    }

    /// The guest-physical bytes the registration pins: the host pages holding
    /// `[iova, iova + length)`, sorted and merged, so a page repeated in the page list appears
    /// once. (Huge pages mapped whole around the MR are mapped, not pinned.)
    pub fn pinned_extents(&self) -> &[Extent] {
        &self.pinned
    }

    /// The MR's bytes, for the backend's own accesses (e.g. tests and diagnostics).
    pub fn as_volatile_slice(&self) -> VolatileSlice<'_> {
        // SAFETY: `addr()..addr() + len()` lies inside the reservation, which is mapped
        // read/write for as long as `self` lives (the slice borrows `self`). It is shared guest
        // memory, hence volatile access only.
        unsafe { VolatileSlice::new(self.addr(), self.length as usize) }
    }

    /// Whether every page the window maps is still guest RAM in `ram`, at the same place of the
    /// same backing file. Windows for which this is false must be dropped (after deregistering
    /// their MR): they map memory the guest no longer has at those addresses.
    pub fn still_backed_by(&self, ram: &GuestRamFiles) -> bool {
        self.dependencies.iter().all(|dependency| {
            ram.translate(
                dependency.gpa_start,
                dependency.gpa_end - dependency.gpa_start,
            )
            .is_ok_and(|span| {
                span.identity == dependency.identity && span.offset == dependency.file_offset
            })
        })
    }
}

/// The guest-physical extents of the host pages that hold the MR's bytes `[o, o + length)` of
/// the concatenated `pages`, normalized. Only the first and last MR pages can be partly used.
fn pinned_extents(
    pages: &[u64],
    page_size: u64,
    in_page_offset: u64,
    length: u64,
    host_page_size: u64,
) -> Vec<Extent> {
    let last = pages.len().saturating_sub(1);
    // `o + length` fits: checked by the caller; it ends inside the last page.
    let end_in_last = in_page_offset + length - last as u64 * page_size;
    let mut extents: Vec<Extent> = pages
        .iter()
        .enumerate()
        .map(|(i, &gpa)| {
            let from = if i == 0 { in_page_offset } else { 0 };
            let to = if i == last { end_in_last } else { page_size };
            // Cannot overflow: every page was checked to lie inside guest RAM.
            Extent {
                start: gpa + (from & !(host_page_size - 1)),
                end: gpa + to.next_multiple_of(host_page_size),
            }
        })
        .collect();
    normalize(&mut extents);
    extents
}

/// Checks and translates every page, coalescing pages consecutive in one file into runs, and
/// records which part of which region the pages come from.
fn collect_runs(
    ram: &GuestRamFiles,
    pages: &[u64],
    page_size: u64,
) -> Result<(Vec<Run>, Vec<Dependency>), MemError> {
    let mut runs: Vec<Run> = Vec::new();
    // Per region: guest-physical hull of the pages taken from it.
    let mut hulls: Vec<Option<(u64, u64)>> = vec![None; ram.regions.len()];
    for &gpa in pages {
        if gpa & (page_size - 1) != 0 {
            return Err(MemError::UnalignedPage { gpa, page_size });
        }
        let (region, backing, file_offset) = ram.locate(gpa, page_size)?;
        // Cannot overflow: `locate` checked that the page is inside the region.
        let gpa_end = gpa + page_size;
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
            Some(run) if extends_last => run.len += page_size,
            _ => runs.push(Run {
                region,
                gpa,
                file_offset,
                len: page_size,
            }),
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

#[cfg(test)]
mod accounting_tests;
#[cfg(test)]
mod tests;

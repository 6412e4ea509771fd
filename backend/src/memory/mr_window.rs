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
//! An MR whose pages are one run of one region needs no window of its own: it is registered
//! over the daemon's existing mapping of guest RAM, which it then keeps alive
//! ([`GuestRamFiles::mapped`]). Nothing is mapped or unmapped for it, and the page-table entries
//! the kernel fills when pinning it stay for the next registration of the same memory.
//!
//! When the frontend changes the memory map, each window is asked whether it is
//! [still backed](MrWindow::still_backed_by) by the new [`GuestRamFiles`] snapshot.
//!
//! Writes made through a window (by the NIC or by us) bypass vm-memory's dirty bitmap: like any
//! DMA from a passthrough device, they are invisible to dirty logging.

use std::sync::Arc;

use vm_memory::VolatileSlice;
use vrdma_spec::control::{MAX_PAGE_SHIFT, MIN_PAGE_SHIFT};

use super::error::MemError;
use super::guest_ram::{GuestRamFiles, MappedGuestRam};
use super::mr_layout::{
    collect_runs, page_extents, pinned_extents, plan_layout, Dependency, Layout,
};
#[cfg(test)]
use super::mr_layout::{PlannedMap, Run};
use super::pinned_extents::{locked_bytes, Extent};
use super::populated::PopulatedRam;
use super::reservation::{host_page_size, populate, Reservation};

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

/// An MR registration request whose pages are given as guest-physical extents (runs of
/// consecutive pages), as REG_MR_EXTENTS sends them.
#[derive(Debug, Clone, Copy)]
pub struct MrExtents<'a> {
    /// Address the guest uses for the first byte of the MR.
    pub iova: u64,
    /// Length of the MR in bytes.
    pub length: u64,
    /// log2 of the MR page size.
    pub page_shift: u32,
    /// The pages covering `[iova, iova + length)`, in order, as extents; each starts and ends
    /// on a page boundary.
    pub extents: &'a [Extent],
}

impl MrPages<'_> {
    /// The same request with its pages as extents, once the page count and every page's
    /// alignment are checked (the errors [`MrWindow::plan`] reports).
    pub fn to_extents(&self) -> Result<Vec<Extent>, MemError> {
        Ok(self.checked_extents(u64::MAX)?.1)
    }

    /// The checked shape (length at most `max_length`) and the pages as extents.
    fn checked_extents(&self, max_length: u64) -> Result<(MrShape, Vec<Extent>), MemError> {
        let shape = MrShape::check(self.iova, self.length, self.page_shift, max_length)?;
        if self.pages.len() as u64 != shape.npages {
            return Err(MemError::PageCountMismatch {
                given: self.pages.len(),
                expected: shape.npages,
            });
        }
        Ok((shape, page_extents(self.pages, shape.page_size)?))
    }
}

impl MrExtents<'_> {
    /// Pages the extents hold together.
    pub fn pages(&self) -> u64 {
        let page_size = 1u64 << self.page_shift.min(63);
        self.extents.iter().map(|e| e.len() / page_size).sum()
    }
}

/// The checked fixed part of a registration request.
#[derive(Debug, Clone, Copy)]
struct MrShape {
    iova: u64,
    length: u64,
    page_size: u64,
    /// Offset of the MR's first byte in its first page.
    in_page_offset: u64,
    /// Pages `[iova, iova + length)` spans.
    npages: u64,
}

impl MrShape {
    fn check(iova: u64, length: u64, page_shift: u32, max_length: u64) -> Result<Self, MemError> {
        if !(MIN_PAGE_SHIFT..=MAX_PAGE_SHIFT).contains(&page_shift)
            || (1u64 << page_shift) < host_page_size()
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
        let npages = in_page_offset
            .checked_add(length)
            .ok_or(MemError::IovaOverflow { iova, length })?
            .div_ceil(page_size);
        Ok(MrShape {
            iova,
            length,
            page_size,
            in_page_offset,
            npages,
        })
    }
}

/// Guest pages mapped contiguously into our address space, ready to be registered with the host
/// RDMA device. Dropping the window unmaps it; deregister the host MR first.
#[derive(Debug)]
pub struct MrWindow {
    memory: WindowMemory,
    /// Offset of the MR's first byte from the start of `memory`.
    mr_offset: usize,
    length: u64,
    iova: u64,
    runs: usize,
    mappings: u64,
    /// Guest-physical bytes the registration pins, normalized.
    pinned: Vec<Extent>,
    dependencies: Vec<Dependency>,
}

/// The address space an MR window occupies.
#[derive(Debug)]
enum WindowMemory {
    /// A reservation of its own, into which the runs are mapped; unmapped on drop.
    Reserved(Reservation),
    /// The part of the daemon's guest-RAM mapping that holds the MR's single run, starting at
    /// `addr`; the `Arc` keeps that mapping alive while the MR lives.
    GuestMapping {
        addr: usize,
        _ram: Arc<MappedGuestRam>,
    },
}

impl MrWindow {
    /// The window's own reservation (tests of windows that have one).
    #[cfg(test)]
    fn reservation(&self) -> &Reservation {
        match &self.memory {
            WindowMemory::Reserved(reservation) => reservation,
            WindowMemory::GuestMapping { .. } => panic!("the MR is over guest RAM's mapping"),
        }
    }
}

impl WindowMemory {
    fn addr(&self) -> usize {
        match self {
            WindowMemory::Reserved(reservation) => reservation.addr,
            WindowMemory::GuestMapping { addr, .. } => *addr,
        }
    }
}

/// The pages of an MR that is one run inside one region of guest RAM.
#[derive(Debug)]
struct DirectRun {
    /// Guest-physical address of the first page.
    gpa: u64,
    /// The daemon's address of the first page in `ram`.
    addr: usize,
    ram: Arc<MappedGuestRam>,
    /// The unit in which the run's memory is mapped (a huge page on hugetlbfs).
    granularity: u64,
}

/// A validated MR registration whose window is planned but not yet mapped: its cost (mappings
/// and pinned guest memory) can be checked against budgets before any mmap is made.
#[derive(Debug)]
pub struct MrPlan<'r> {
    ram: &'r GuestRamFiles,
    layout: Layout,
    /// For an MR registered over the daemon's guest-RAM mapping: where its pages are.
    direct: Option<DirectRun>,
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
        if self.direct.is_some() {
            0
        } else {
            self.layout.mappings()
        }
    }

    /// Number of runs of guest pages contiguous in one backing file the window is made of.
    pub fn runs(&self) -> usize {
        self.layout.maps.len()
    }

    /// Whether the MR will be registered over the daemon's existing mapping of guest RAM
    /// (nothing to map) rather than over a window of its own.
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// The guest-physical bytes the registration pins (see [`MrWindow::pinned_extents`]).
    pub fn pinned_extents(&self) -> &[Extent] {
        &self.pinned
    }

    /// What the kernel will charge the registration to the daemon's locked memory (see
    /// [`MrWindow::locked_bytes`]).
    pub fn locked_bytes(&self) -> u64 {
        locked_bytes(self.in_page_offset, self.length)
    }

    /// Reserves the window and maps the planned pages into it. The plan keeps its
    /// [`mappings`](Self::mappings) and, if this fails, its
    /// [`pinned_extents`](Self::pinned_extents), so that what was charged for it can be given
    /// back.
    ///
    /// An MR over guest RAM's mapping has the parts of it `populated` does not know yet
    /// populated (and recorded there).
    pub fn map(&mut self, populated: &mut PopulatedRam) -> Result<MrWindow, MemError> {
        let mappings = self.mappings();
        let (memory, first_page) = match self.direct.take() {
            Some(run) => {
                self.populate(&run, populated);
                (
                    WindowMemory::GuestMapping {
                        addr: run.addr,
                        _ram: run.ram,
                    },
                    0,
                )
            }
            None => (
                WindowMemory::Reserved(self.map_runs()?),
                self.layout.first_page,
            ),
        };
        log::debug!(
            "MR iova {:#x} len {:#x}: {} pages in {} runs ({} mappings{})",
            self.iova,
            self.length,
            self.npages,
            self.layout.maps.len(),
            mappings,
            match memory {
                WindowMemory::GuestMapping { .. } => ", over guest RAM's mapping",
                WindowMemory::Reserved(_) => "",
            }
        );
        Ok(MrWindow {
            memory,
            // Cannot overflow: both are inside the window's memory.
            mr_offset: (first_page + self.in_page_offset) as usize,
            length: self.length,
            iova: self.iova,
            runs: self.layout.maps.len(),
            mappings,
            pinned: std::mem::take(&mut self.pinned),
            dependencies: std::mem::take(&mut self.dependencies),
        })
    }

    /// Fills the page tables of the MR's pages in guest RAM's mapping (first page at `addr`)
    /// ahead of the pinning, in the kernel's fault-around batches instead of one write fault
    /// per page; skips what `populated` says is done.
    fn populate(&self, run: &DirectRun, populated: &mut PopulatedRam) {
        // Cannot overflow: the run was located inside guest RAM.
        let range = Extent {
            start: run.gpa,
            end: run.gpa + self.npages * self.page_size,
        };
        for missing in populated.take_missing(&run.ram, range) {
            // Cannot overflow: inside the run, which `addr` maps.
            populate(
                run.addr + (missing.start - run.gpa) as usize,
                missing.len(),
                run.granularity,
            );
        }
    }

    /// Reserves a window and maps the planned runs into it.
    fn map_runs(&self) -> Result<Reservation, MemError> {
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
            reservation.map_file(
                &backing.file,
                map.window_offset,
                map.file_offset,
                map.len,
                backing.granularity,
            )?;
        }
        Ok(reservation)
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
        plan.map(&mut PopulatedRam::default())
    }

    /// Validates `request` against `ram` and plans its window without mapping anything.
    pub fn plan<'r>(
        ram: &'r GuestRamFiles,
        request: &MrPages<'_>,
        max_length: u64,
    ) -> Result<MrPlan<'r>, MemError> {
        let (shape, extents) = request.checked_extents(max_length)?;
        Self::plan_checked(ram, &shape, extents)
    }

    /// Like [`plan`](Self::plan), for a request that gives its pages as extents.
    pub fn plan_extents<'r>(
        ram: &'r GuestRamFiles,
        request: &MrExtents<'_>,
        max_length: u64,
    ) -> Result<MrPlan<'r>, MemError> {
        let shape = MrShape::check(request.iova, request.length, request.page_shift, max_length)?;
        let page_size = shape.page_size;
        let mut covered = 0u64;
        for extent in request.extents {
            if extent.start & (page_size - 1) != 0 || extent.end & (page_size - 1) != 0 {
                return Err(MemError::UnalignedPage {
                    gpa: if extent.start & (page_size - 1) != 0 {
                        extent.start
                    } else {
                        extent.end
                    },
                    page_size,
                });
            }
            if extent.end <= extent.start {
                return Err(MemError::NotInGuestRam {
                    gpa: extent.start,
                    len: 0,
                });
            }
            covered = covered.saturating_add(extent.len() / page_size);
        }
        if covered != shape.npages {
            return Err(MemError::PageCountMismatch {
                given: usize::try_from(covered).unwrap_or(usize::MAX),
                expected: shape.npages,
            });
        }
        Self::plan_checked(ram, &shape, request.extents.to_vec())
    }

    /// Plans the window of a request whose shape and pages (`extents`, in MR order) are
    /// checked.
    fn plan_checked<'r>(
        ram: &'r GuestRamFiles,
        shape: &MrShape,
        extents: Vec<Extent>,
    ) -> Result<MrPlan<'r>, MemError> {
        let host_page_size = host_page_size();
        let MrShape {
            iova,
            length,
            page_size,
            in_page_offset,
            npages: expected_pages,
        } = *shape;
        let (runs, dependencies) = collect_runs(ram, &extents, page_size)?;
        let granularity = |region: usize| {
            ram.regions[region]
                .backing
                .as_ref()
                .map_or(host_page_size, |backing| backing.granularity)
        };
        // One run inside one region is already contiguous in the daemon's mapping of guest RAM.
        let direct = match runs.as_slice() {
            [run] if ram.room_in_region(run.gpa) >= run.len => ram
                .mapped_address(run.region, run.gpa)
                .map(|(addr, mapping)| DirectRun {
                    gpa: run.gpa,
                    addr,
                    ram: Arc::clone(mapping),
                    granularity: granularity(run.region),
                }),
            _ => None,
        };
        let layout = plan_layout(&runs, granularity, page_size, host_page_size)?;
        let pinned = pinned_extents(&extents, in_page_offset, length, host_page_size);
        Ok(MrPlan {
            ram,
            layout,
            direct,
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
        (self.memory.addr() + self.mr_offset) as *mut u8
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

    /// What the kernel charges the registration to the daemon's locked memory: every base page
    /// the MR's range spans in the window, pages repeated in its page list or pinned by other
    /// MRs included ([`locked_bytes`]).
    pub fn locked_bytes(&self) -> u64 {
        locked_bytes(self.mr_offset as u64, self.length)
    }

    /// The MR's bytes, for the backend's own accesses (e.g. tests and diagnostics).
    pub fn as_volatile_slice(&self) -> VolatileSlice<'_> {
        // SAFETY: `addr()..addr() + len()` lies inside the window's memory (its reservation, or
        // the guest-RAM mapping its `Arc` keeps), which is mapped read/write for as long as
        // `self` lives (the slice borrows `self`). It is shared guest
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

#[cfg(test)]
mod accounting_tests;
#[cfg(test)]
mod direct_tests;
#[cfg(test)]
mod tests;

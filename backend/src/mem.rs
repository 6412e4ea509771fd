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
//! [`GuestRam`] is an immutable snapshot of the guest memory map, translating guest-physical
//! ranges to (backing file, file offset). The owner builds a new one whenever the frontend
//! changes the memory map and asks each window whether it is [still backed](MrWindow::still_backed_by)
//! by the new map.
//!
//! Writes made through a window (by the NIC or by us) bypass vm-memory's dirty bitmap: like any
//! DMA from a passthrough device, they are invisible to dirty logging.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use vm_memory::{GuestMemoryBackend, GuestMemoryRegion, VolatileSlice};

/// Smallest MR page size the device accepts (4 KiB).
pub const MIN_PAGE_SHIFT: u32 = 12;
/// Largest MR page size the device accepts (1 GiB).
pub const MAX_PAGE_SHIFT: u32 = 30;

/// Errors building a [`GuestRam`] snapshot or an [`MrWindow`].
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    /// The page size is outside what the device supports or smaller than a host page.
    #[error(
        "page shift {0} is not supported (must be {MIN_PAGE_SHIFT}..={MAX_PAGE_SHIFT} and at least the host page size)"
    )]
    BadPageShift(u32),
    /// A zero-length MR was requested.
    #[error("memory region length is zero")]
    ZeroLength,
    /// The MR is larger than the caller allows.
    #[error("memory region of {length:#x} bytes exceeds the limit of {limit:#x} bytes")]
    TooLarge {
        /// Requested length.
        length: u64,
        /// Largest length allowed.
        limit: u64,
    },
    /// `iova + length` does not fit in 64 bits.
    #[error("iova {iova:#x} + length {length:#x} overflows")]
    IovaOverflow {
        /// Requested iova.
        iova: u64,
        /// Requested length.
        length: u64,
    },
    /// The page list does not exactly cover `[iova, iova + length)`.
    #[error("{given} pages given, but {expected} pages are needed to cover the memory region")]
    PageCountMismatch {
        /// Number of pages in the list.
        given: usize,
        /// Number of pages needed.
        expected: u64,
    },
    /// A page address is not aligned to the page size.
    #[error("guest page {gpa:#x} is not aligned to the page size {page_size:#x}")]
    UnalignedPage {
        /// The offending guest-physical address.
        gpa: u64,
        /// The MR page size.
        page_size: u64,
    },
    /// A guest-physical range is not entirely inside one guest RAM region.
    #[error("guest range {gpa:#x}+{len:#x} is not inside one guest RAM region")]
    NotInGuestRam {
        /// Start of the range.
        gpa: u64,
        /// Length of the range.
        len: u64,
    },
    /// A guest RAM region has no backing file, so it cannot be mapped a second time.
    #[error("guest RAM region at {region_start:#x} is not backed by a file descriptor")]
    NotFdBacked {
        /// Guest-physical start of the region.
        region_start: u64,
    },
    /// The file offset of a guest-physical address does not fit in 64 bits.
    #[error("file offset of guest address {gpa:#x} overflows")]
    FileOffsetOverflow {
        /// The offending guest-physical address.
        gpa: u64,
    },
    /// A guest range lies beyond the end of its backing file: touching it would fault.
    #[error("guest range {gpa:#x}+{len:#x} lies beyond the end of its backing file ({file_len:#x} bytes)")]
    BeyondEndOfFile {
        /// Start of the range.
        gpa: u64,
        /// Length of the range.
        len: u64,
        /// Size of the backing file.
        file_len: u64,
    },
    /// Guest pages backed by huge pages (hugetlbfs) can only be mapped in whole huge pages, and
    /// this page list cannot be laid out contiguously at that granularity.
    #[error(
        "guest pages from {gpa:#x} cannot be mapped contiguously: their backing can only be mapped in units of {granularity:#x} bytes"
    )]
    BackingGranularity {
        /// Guest-physical address of the first page of the offending run.
        gpa: u64,
        /// Mapping granularity of the backing file.
        granularity: u64,
    },
    /// The backing file of a guest RAM region cannot be inspected.
    #[error("cannot inspect the backing file of guest RAM region at {region_start:#x}: {source}")]
    InspectFile {
        /// Guest-physical start of the region.
        region_start: u64,
        /// Underlying error.
        source: io::Error,
    },
    /// The window does not fit in our address space.
    #[error("window of {pages} pages of {page_size:#x} bytes does not fit in the address space")]
    WindowTooLarge {
        /// Number of pages.
        pages: u64,
        /// The MR page size.
        page_size: u64,
    },
    /// Reserving address space for the window failed.
    #[error("cannot reserve {len:#x} bytes of address space: {source}")]
    Reserve {
        /// Size of the reservation.
        len: usize,
        /// Underlying error.
        source: io::Error,
    },
    /// Mapping guest pages into the window failed.
    #[error("cannot map {len:#x} bytes of guest RAM at file offset {file_offset:#x}: {source}")]
    Map {
        /// File offset of the mapping.
        file_offset: u64,
        /// Length of the mapping.
        len: usize,
        /// Underlying error.
        source: io::Error,
    },
}

/// Identity of a file, independent of the descriptor used to reach it: the frontend sends fresh
/// descriptors for the same memory every time it updates the memory map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    /// Device holding the file.
    pub dev: u64,
    /// Inode number of the file.
    pub ino: u64,
}

impl FileIdentity {
    fn of(metadata: &std::fs::Metadata) -> Self {
        FileIdentity {
            dev: metadata.dev(),
            ino: metadata.ino(),
        }
    }
}

/// Where a guest-physical range lives in the file backing guest RAM.
#[derive(Debug, Clone, Copy)]
pub struct FileSpan<'a> {
    /// The backing file.
    pub file: &'a Arc<File>,
    /// Identity of the backing file.
    pub identity: FileIdentity,
    /// File offset of the first byte of the range.
    pub offset: u64,
}

#[derive(Debug, Clone)]
struct Backing {
    file: Arc<File>,
    identity: FileIdentity,
    /// File offset of the first byte of the region.
    start: u64,
    /// Size of the file when the snapshot was taken.
    file_len: u64,
    /// Smallest unit in which the file can be mapped: the host page size, or the huge page size
    /// for hugetlbfs, whose mappings must be huge-page aligned in both file and address space.
    granularity: u64,
}

#[derive(Debug, Clone)]
struct RamRegion {
    gpa_start: u64,
    len: u64,
    backing: Option<Backing>,
}

impl RamRegion {
    fn gpa_end(&self) -> u64 {
        // Cannot overflow: checked when the snapshot was built.
        self.gpa_start + self.len
    }
}

/// Immutable snapshot of the guest memory map, as seen by MR windows.
#[derive(Debug, Clone, Default)]
pub struct GuestRam {
    /// Sorted by `gpa_start`, non-overlapping.
    regions: Vec<RamRegion>,
}

impl GuestRam {
    /// Snapshots the memory map of `mem`, typically `&*GuestMemoryAtomic::memory()` as handed to
    /// `VhostUserBackend::update_memory`. Regions without a backing file are kept (so that errors
    /// name them) but cannot be mapped.
    pub fn new<M: GuestMemoryBackend + ?Sized>(mem: &M) -> Result<Self, MemError> {
        let mut regions = Vec::with_capacity(mem.num_regions());
        for region in mem.iter() {
            let gpa_start = region.start_addr().0;
            let len = region.len();
            if gpa_start.checked_add(len).is_none() {
                return Err(MemError::NotInGuestRam {
                    gpa: gpa_start,
                    len,
                });
            }
            let backing = match region.file_offset() {
                Some(file_offset) => {
                    let file = Arc::clone(file_offset.arc());
                    let inspect = |source| MemError::InspectFile {
                        region_start: gpa_start,
                        source,
                    };
                    let metadata = file.metadata().map_err(inspect)?;
                    let granularity = mapping_granularity(&file).map_err(inspect)?;
                    Some(Backing {
                        identity: FileIdentity::of(&metadata),
                        file_len: metadata.len(),
                        file,
                        start: file_offset.start(),
                        granularity,
                    })
                }
                None => None,
            };
            regions.push(RamRegion {
                gpa_start,
                len,
                backing,
            });
        }
        regions.sort_by_key(|region| region.gpa_start);
        Ok(GuestRam { regions })
    }

    /// Translates the guest-physical range `[gpa, gpa + len)` to its place in guest RAM's backing
    /// file. The range must be non-empty and inside one fd-backed region.
    pub fn translate(&self, gpa: u64, len: u64) -> Result<FileSpan<'_>, MemError> {
        let (_, backing, offset) = self.locate(gpa, len)?;
        Ok(FileSpan {
            file: &backing.file,
            identity: backing.identity,
            offset,
        })
    }

    /// Returns the index of the region holding `[gpa, gpa + len)`, its backing and the file
    /// offset of `gpa`.
    fn locate(&self, gpa: u64, len: u64) -> Result<(usize, &Backing, u64), MemError> {
        let outside = MemError::NotInGuestRam { gpa, len };
        let end = gpa
            .checked_add(len)
            .ok_or(MemError::NotInGuestRam { gpa, len })?;
        if len == 0 {
            return Err(outside);
        }
        // Regions are sorted: the candidate is the last one starting at or below `gpa`.
        let index = self
            .regions
            .partition_point(|region| region.gpa_start <= gpa)
            .checked_sub(1)
            .ok_or(MemError::NotInGuestRam { gpa, len })?;
        let region = &self.regions[index];
        if end > region.gpa_end() {
            return Err(outside);
        }
        let backing = region.backing.as_ref().ok_or(MemError::NotFdBacked {
            region_start: region.gpa_start,
        })?;
        let offset = backing
            .start
            .checked_add(gpa - region.gpa_start)
            .ok_or(MemError::FileOffsetOverflow { gpa })?;
        // The frontend sizes its files to its regions, but a region past the end of its file
        // can be mapped all the same, and touching it raises SIGBUS.
        if offset
            .checked_add(len)
            .is_none_or(|end| end > backing.file_len)
        {
            return Err(MemError::BeyondEndOfFile {
                gpa,
                len,
                file_len: backing.file_len,
            });
        }
        Ok((index, backing, offset))
    }

    /// Treats every fd-backed region as if it could only be mapped in units of `granularity`,
    /// as hugetlbfs-backed memory can. Lets tests exercise the huge page layout on ordinary memfd
    /// memory.
    #[cfg(test)]
    fn force_granularity(&mut self, granularity: u64) {
        for backing in self.regions.iter_mut().filter_map(|r| r.backing.as_mut()) {
            backing.granularity = granularity;
        }
    }
}

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
    dependencies: Vec<Dependency>,
}

impl MrWindow {
    /// Validates `request` against `ram` and maps its pages into a new window. `max_length` is
    /// the largest MR the caller accepts (e.g. the guest's remaining MR byte quota).
    pub fn map(ram: &GuestRam, request: &MrPages<'_>, max_length: u64) -> Result<Self, MemError> {
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
        let too_large = || MemError::WindowTooLarge {
            pages: expected_pages,
            page_size,
        };
        let reserve_len = usize::try_from(layout.reserve_len).map_err(|_| too_large())?;
        let alignment = usize::try_from(layout.alignment).map_err(|_| too_large())?;
        let reservation = Reservation::new(reserve_len, alignment)?;
        for map in &layout.maps {
            let backing =
                ram.regions[map.region]
                    .backing
                    .as_ref()
                    .ok_or(MemError::NotFdBacked {
                        region_start: ram.regions[map.region].gpa_start,
                    })?;
            reservation.map_file(&backing.file, map.window_offset, map.file_offset, map.len)?;
        }
        log::debug!(
            "mapped MR window iova {iova:#x} len {length:#x}: {} pages in {} runs",
            pages.len(),
            layout.maps.len()
        );
        Ok(MrWindow {
            reservation,
            // Cannot overflow: both are inside the reservation.
            mr_offset: (layout.first_page + in_page_offset) as usize,
            length,
            iova,
            runs: layout.maps.len(),
            dependencies,
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
    pub fn still_backed_by(&self, ram: &GuestRam) -> bool {
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

/// Checks and translates every page, coalescing pages consecutive in one file into runs, and
/// records which part of which region the pages come from.
fn collect_runs(
    ram: &GuestRam,
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

/// A range of our address space we own, unmapped on drop.
#[derive(Debug)]
struct Reservation {
    /// Start address; kept as an integer so that windows are `Send` and `Sync`.
    addr: usize,
    len: usize,
}

impl Reservation {
    /// Reserves `len` bytes of inaccessible address space starting at a multiple of `alignment`.
    fn new(len: usize, alignment: usize) -> Result<Self, MemError> {
        let host_page_size = host_page_size() as usize;
        let alignment = alignment.max(host_page_size);
        let oversized = len
            .checked_add(alignment - host_page_size)
            .ok_or(MemError::Reserve {
                len,
                source: io::Error::from_raw_os_error(libc::ENOMEM),
            })?;
        // SAFETY: a new private anonymous mapping at an address of the kernel's choosing does not
        // touch any existing memory.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                oversized,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(MemError::Reserve {
                len: oversized,
                source: io::Error::last_os_error(),
            });
        }
        let start = raw as usize;
        let addr = start.next_multiple_of(alignment);
        // Give back the unaligned head and the tail beyond `len`.
        unmap(start, addr - start);
        unmap(addr + len, start + oversized - (addr + len));
        Ok(Reservation { addr, len })
    }

    /// Maps `len` bytes of `file` from `file_offset` at `offset` into the reservation.
    fn map_file(
        &self,
        file: &File,
        offset: u64,
        file_offset: u64,
        len: u64,
    ) -> Result<(), MemError> {
        let map_error = |source| MemError::Map {
            file_offset,
            len: len as usize,
            source,
        };
        let inside = offset
            .checked_add(len)
            .is_some_and(|end| end <= self.len as u64);
        let file_offset_arg = libc::off_t::try_from(file_offset)
            .map_err(|_| map_error(io::Error::from_raw_os_error(libc::EOVERFLOW)))?;
        if !inside {
            return Err(map_error(io::Error::from_raw_os_error(libc::EINVAL)));
        }
        let target = (self.addr + offset as usize) as *mut libc::c_void;
        // SAFETY: `target..target + len` is inside our reservation (checked above), which no
        // Rust object refers to, so replacing it with a shared mapping of guest RAM invalidates
        // nothing.
        let mapped = unsafe {
            libc::mmap(
                target,
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                file.as_raw_fd(),
                file_offset_arg,
            )
        };
        if mapped == libc::MAP_FAILED {
            return Err(map_error(io::Error::last_os_error()));
        }
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        unmap(self.addr, self.len);
    }
}

/// Unmaps address space this module reserved.
fn unmap(addr: usize, len: usize) {
    if len == 0 {
        return;
    }
    // SAFETY: only called on ranges of reservations made by `Reservation::new`, which nothing
    // else refers to once unmapped.
    if unsafe { libc::munmap(addr as *mut libc::c_void, len) } != 0 {
        log::error!(
            "munmap({addr:#x}, {len:#x}) failed: {}",
            io::Error::last_os_error()
        );
    }
}

fn host_page_size() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size)
        .ok()
        .filter(|size| size.is_power_of_two())
        .unwrap_or(4096)
}

/// The unit in which `file` can be mapped: its huge page size on hugetlbfs, else a host page.
fn mapping_granularity(file: &File) -> io::Result<u64> {
    // SAFETY: statfs is plain old data; all-zero is a valid value.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: the descriptor is valid for the duration of the call (borrowed from `file`) and
    // `stat` is a valid, writable statfs.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // f_type's integer type varies between libcs; the magic numbers are 32-bit.
    if stat.f_type as u32 == libc::HUGETLBFS_MAGIC as u32 {
        u64::try_from(stat.f_bsize)
            .ok()
            .filter(|size| size.is_power_of_two())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
    } else {
        Ok(host_page_size())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;
    use vm_memory::{
        Bytes, FileOffset, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap,
        GuestRegionMmap,
    };

    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    const PAGE: u64 = 4 * KIB;

    fn memfd(name: &CStr, size: u64) -> File {
        // SAFETY: memfd_create only reads the NUL-terminated name.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
        // SAFETY: `fd` is a new descriptor nothing else owns.
        let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        file.set_len(size).unwrap();
        file
    }

    /// (guest-physical start, length, file, file offset) per region.
    fn guest_memory(regions: &[(u64, u64, &Arc<File>, u64)]) -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges_with_files(regions.iter().map(|&(gpa, len, file, offset)| {
            (
                GuestAddress(gpa),
                len as usize,
                Some(FileOffset::from_arc(Arc::clone(file), offset)),
            )
        }))
        .unwrap()
    }

    const LOW: u64 = 0x10_0000;
    const HIGH: u64 = 0x1_0000_0000;

    /// Two 1 MiB regions of one 4 MiB memfd: LOW is file [2M, 3M), HIGH is file [0, 1M).
    fn one_file_two_regions() -> (Arc<File>, GuestMemoryMmap) {
        let file = Arc::new(memfd(c"one-file", 4 * MIB));
        let mem = guest_memory(&[(LOW, MIB, &file, 2 * MIB), (HIGH, MIB, &file, 0)]);
        (file, mem)
    }

    fn fill_pattern(mem: &GuestMemoryMmap, gpa: u64, len: usize, seed: u8) {
        let bytes: Vec<u8> = (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect();
        mem.write_slice(&bytes, GuestAddress(gpa)).unwrap();
    }

    fn window_bytes(window: &MrWindow) -> Vec<u8> {
        let mut bytes = vec![0; window.len() as usize];
        window.as_volatile_slice().copy_to(&mut bytes[..]);
        bytes
    }

    fn guest_bytes(mem: &GuestMemoryMmap, gpa: u64, len: u64) -> Vec<u8> {
        let mut bytes = vec![0; len as usize];
        mem.read_slice(&mut bytes, GuestAddress(gpa)).unwrap();
        bytes
    }

    /// What the window must show: `length` bytes from `in_page_offset` of the concatenated pages.
    fn expected_bytes(mem: &GuestMemoryMmap, request: &MrPages<'_>) -> Vec<u8> {
        let page_size = 1u64 << request.page_shift;
        let mut all = Vec::new();
        for &page in request.pages {
            all.extend(guest_bytes(mem, page, page_size));
        }
        let start = (request.iova & (page_size - 1)) as usize;
        all[start..start + request.length as usize].to_vec()
    }

    fn map_error(ram: &GuestRam, request: MrPages<'_>) -> MemError {
        MrWindow::map(ram, &request, GIB).unwrap_err()
    }

    #[test]
    fn translates_fd_backed_ranges() {
        let (file, mem) = one_file_two_regions();
        let ram = GuestRam::new(&mem).unwrap();
        let identity = FileIdentity::of(&file.metadata().unwrap());

        let span = ram.translate(LOW + 0x1234, 0x10).unwrap();
        assert_eq!(span.offset, 2 * MIB + 0x1234);
        assert_eq!(span.identity, identity);
        assert!(Arc::ptr_eq(span.file, &file));
        let span = ram.translate(HIGH + MIB - 1, 1).unwrap();
        assert_eq!(span.offset, MIB - 1);

        for (gpa, len) in [
            (LOW - 1, 2),
            (LOW + MIB - 1, 2),
            (LOW + MIB, 1),
            (0, 1),
            (LOW, 0),
            (u64::MAX, 2),
        ] {
            assert!(
                matches!(ram.translate(gpa, len), Err(MemError::NotInGuestRam { .. })),
                "{gpa:#x}+{len:#x}"
            );
        }
    }

    #[test]
    fn memfd_granularity_is_the_host_page() {
        let (_, mem) = one_file_two_regions();
        let ram = GuestRam::new(&mem).unwrap();
        for region in &ram.regions {
            assert_eq!(region.backing.as_ref().unwrap().granularity, PAGE);
        }
    }

    #[test]
    fn snapshot_from_guest_memory_atomic() {
        let (_, mem) = one_file_two_regions();
        let atomic = GuestMemoryAtomic::new(mem);
        let ram = GuestRam::new(&*atomic.memory()).unwrap();
        assert_eq!(ram.regions.len(), 2);
        assert_eq!(ram.translate(HIGH, PAGE).unwrap().offset, 0);
    }

    #[test]
    fn scattered_pages_read_and_write_through_the_window() {
        let (_, mem) = one_file_two_regions();
        fill_pattern(&mem, LOW, MIB as usize, 0x5a);
        fill_pattern(&mem, HIGH, MIB as usize, 0xa5);
        let ram = GuestRam::new(&mem).unwrap();
        let pages = [
            HIGH + 3 * PAGE,
            LOW + 5 * PAGE,
            LOW + 6 * PAGE,
            LOW + 7 * PAGE,
            HIGH + PAGE,
        ];
        let request = MrPages {
            iova: 0x7f00_0000_0123,
            length: 5 * PAGE - 0x123 - 0x10,
            page_shift: 12,
            pages: &pages,
        };
        let window = MrWindow::map(&ram, &request, GIB).unwrap();
        assert_eq!(window.runs(), 3);
        assert_eq!(window.iova(), request.iova);
        assert_eq!(window.len(), request.length);
        assert_eq!(window.addr() as u64 % PAGE, 0x123);
        assert_eq!(window_bytes(&window), expected_bytes(&mem, &request));

        // Guest writes show up in the window.
        mem.write_slice(b"guest", GuestAddress(LOW + 6 * PAGE + 7))
            .unwrap();
        let at = (PAGE - 0x123 + PAGE + 7) as usize;
        assert_eq!(&window_bytes(&window)[at..at + 5], b"guest");

        // Window writes land in the guest pages, in page list order.
        let slice = window.as_volatile_slice();
        slice.write_slice(b"first", 0).unwrap();
        slice
            .write_slice(b"last", window.len() as usize - 4)
            .unwrap();
        assert_eq!(guest_bytes(&mem, HIGH + 3 * PAGE + 0x123, 5), b"first");
        assert_eq!(guest_bytes(&mem, HIGH + 2 * PAGE - 0x14, 4), b"last");
    }

    #[test]
    fn contiguous_pages_are_one_mmap() {
        let (_, mem) = one_file_two_regions();
        fill_pattern(&mem, LOW, MIB as usize, 1);
        let ram = GuestRam::new(&mem).unwrap();
        let pages: Vec<u64> = (0..256).map(|i| LOW + i * PAGE).collect();
        let request = MrPages {
            iova: 0x1000,
            length: MIB,
            page_shift: 12,
            pages: &pages,
        };
        let window = MrWindow::map(&ram, &request, GIB).unwrap();
        assert_eq!(window.runs(), 1);
        assert_eq!(window_bytes(&window), expected_bytes(&mem, &request));

        // Reversed order: nothing is file-contiguous any more.
        let reversed: Vec<u64> = pages.iter().rev().copied().collect();
        let request = MrPages {
            pages: &reversed,
            ..request
        };
        let window = MrWindow::map(&ram, &request, GIB).unwrap();
        assert_eq!(window.runs(), 256);
        assert_eq!(window_bytes(&window), expected_bytes(&mem, &request));
    }

    #[test]
    fn runs_coalesce_across_regions_of_one_file() {
        // HIGH is file [0, 1M), LOW2 is file [1M, 2M): the last page of HIGH and the first of
        // LOW2 are consecutive in the file, though far apart in guest-physical space.
        let file = Arc::new(memfd(c"adjacent", 2 * MIB));
        const LOW2: u64 = 0x4000_0000;
        let mem = guest_memory(&[(LOW2, MIB, &file, MIB), (HIGH, MIB, &file, 0)]);
        fill_pattern(&mem, LOW2, MIB as usize, 3);
        fill_pattern(&mem, HIGH, MIB as usize, 4);
        let ram = GuestRam::new(&mem).unwrap();
        let pages = [HIGH + MIB - PAGE, LOW2, LOW2 + PAGE];
        let request = MrPages {
            iova: 0,
            length: 3 * PAGE,
            page_shift: 12,
            pages: &pages,
        };
        let window = MrWindow::map(&ram, &request, GIB).unwrap();
        assert_eq!(window.runs(), 1);
        assert_eq!(window_bytes(&window), expected_bytes(&mem, &request));
        assert_eq!(window.dependencies.len(), 2);
    }

    #[test]
    fn pages_from_two_files() {
        let first = Arc::new(memfd(c"first", MIB));
        let second = Arc::new(memfd(c"second", 2 * MIB));
        // Same file offsets in different files must not coalesce.
        let mem = guest_memory(&[(LOW, MIB, &first, 0), (HIGH, MIB, &second, PAGE)]);
        fill_pattern(&mem, LOW, MIB as usize, 7);
        fill_pattern(&mem, HIGH, (MIB) as usize, 8);
        let ram = GuestRam::new(&mem).unwrap();
        let pages = [LOW, HIGH, LOW + 2 * PAGE];
        let request = MrPages {
            iova: 0xabc,
            length: 2 * PAGE,
            page_shift: 12,
            pages: &pages,
        };
        let window = MrWindow::map(&ram, &request, GIB).unwrap();
        assert_eq!(window.runs(), 3);
        assert_eq!(window_bytes(&window), expected_bytes(&mem, &request));
        window.as_volatile_slice().write_slice(b"x", 0).unwrap();
        assert_eq!(guest_bytes(&mem, LOW + 0xabc, 1), b"x");
    }

    #[test]
    fn two_mib_pages_on_ordinary_memory() {
        let file = Arc::new(memfd(c"big", 8 * MIB));
        const BASE: u64 = 0x4000_0000;
        let mem = guest_memory(&[(BASE, 6 * MIB, &file, 2 * MIB)]);
        fill_pattern(&mem, BASE, 6 * MIB as usize, 9);
        let ram = GuestRam::new(&mem).unwrap();
        let pages = [BASE + 4 * MIB, BASE, BASE + 2 * MIB];
        let request = MrPages {
            iova: 0x20_0000_1000,
            length: 5 * MIB,
            page_shift: 21,
            pages: &pages,
        };
        let window = MrWindow::map(&ram, &request, GIB).unwrap();
        assert_eq!(window.runs(), 2);
        // Same offset modulo the MR page size as the iova: the NIC can use 2 MiB translations.
        assert_eq!(window.addr() as u64 % (2 * MIB), request.iova % (2 * MIB));
        assert_eq!(window_bytes(&window), expected_bytes(&mem, &request));

        // A 2 MiB page straddling the end of the region is refused.
        let straddling = [BASE + 4 * MIB, BASE + 6 * MIB];
        assert!(matches!(
            map_error(
                &ram,
                MrPages {
                    iova: 0,
                    length: 4 * MIB,
                    page_shift: 21,
                    pages: &straddling
                }
            ),
            MemError::NotInGuestRam { .. }
        ));
    }

    /// Guest RAM as it would be on 2 MiB hugetlbfs: mappable only in aligned 2 MiB units.
    fn huge_ram() -> (GuestMemoryMmap, GuestRam) {
        let file = Arc::new(memfd(c"huge", 8 * MIB));
        let mem = guest_memory(&[(0, 8 * MIB, &file, 0)]);
        fill_pattern(&mem, 0, 8 * MIB as usize, 11);
        let mut ram = GuestRam::new(&mem).unwrap();
        ram.force_granularity(2 * MIB);
        (mem, ram)
    }

    #[test]
    fn small_pages_inside_one_huge_page() {
        let (mem, ram) = huge_ram();
        let pages = [2 * MIB + 5 * PAGE, 2 * MIB + 6 * PAGE];
        let request = MrPages {
            iova: 0x9000_0000_0010,
            length: PAGE,
            page_shift: 12,
            pages: &pages,
        };
        let window = MrWindow::map(&ram, &request, GIB).unwrap();
        assert_eq!(window.runs(), 1);
        assert_eq!(window_bytes(&window), expected_bytes(&mem, &request));
        // The huge page is mapped whole, at a huge page boundary.
        assert_eq!(window.addr() as u64 % (2 * MIB), 5 * PAGE + 0x10);
        assert_eq!(window.reservation.addr as u64 % (2 * MIB), 0);
    }

    #[test]
    fn small_pages_across_huge_page_boundaries() {
        let (mem, ram) = huge_ram();
        // Contiguous buffer crossing from the first into the second huge page...
        let contiguous: Vec<u64> = (0..4).map(|i| 2 * MIB - 2 * PAGE + i * PAGE).collect();
        let request = MrPages {
            iova: 0x100,
            length: 4 * PAGE - 0x100,
            page_shift: 12,
            pages: &contiguous,
        };
        let window = MrWindow::map(&ram, &request, GIB).unwrap();
        assert_eq!(window_bytes(&window), expected_bytes(&mem, &request));

        // ...then whole huge pages in any order: boundaries fall on huge pages.
        let tail_then_head = [6 * MIB - PAGE, 0, PAGE];
        let request = MrPages {
            iova: 0,
            length: 3 * PAGE,
            page_shift: 12,
            pages: &tail_then_head,
        };
        let window = MrWindow::map(&ram, &request, GIB).unwrap();
        assert_eq!(window.runs(), 2);
        assert_eq!(window_bytes(&window), expected_bytes(&mem, &request));

        // Scattered small pages cannot be made contiguous out of huge pages.
        let scattered = [2 * MIB, 4 * MIB + PAGE];
        assert!(matches!(
            map_error(
                &ram,
                MrPages {
                    iova: 0,
                    length: 2 * PAGE,
                    page_shift: 12,
                    pages: &scattered
                }
            ),
            MemError::BackingGranularity { gpa, granularity } if gpa == 4 * MIB + PAGE && granularity == 2 * MIB
        ));
        let swapped = [PAGE, 0];
        assert!(matches!(
            map_error(
                &ram,
                MrPages {
                    iova: 0,
                    length: 2 * PAGE,
                    page_shift: 12,
                    pages: &swapped
                }
            ),
            MemError::BackingGranularity { .. }
        ));
    }

    #[test]
    fn layout_of_mixed_granularities() {
        let granularity = |region: usize| if region == 1 { 2 * MIB } else { PAGE };
        let run = |region, file_offset, len| Run {
            region,
            gpa: file_offset,
            file_offset,
            len,
        };
        // A small page, then two huge pages: the small page goes right before a huge boundary.
        let layout = plan_layout(
            &[run(0, 3 * MIB, PAGE), run(1, 4 * MIB, 4 * MIB)],
            granularity,
            PAGE,
            PAGE,
        )
        .unwrap();
        assert_eq!(
            layout,
            Layout {
                alignment: 2 * MIB,
                reserve_len: 6 * MIB,
                first_page: 2 * MIB - PAGE,
                maps: vec![
                    PlannedMap {
                        region: 0,
                        window_offset: 2 * MIB - PAGE,
                        file_offset: 3 * MIB,
                        len: PAGE
                    },
                    PlannedMap {
                        region: 1,
                        window_offset: 2 * MIB,
                        file_offset: 4 * MIB,
                        len: 4 * MIB
                    },
                ],
            }
        );
        // A small page between two huge pages would put the second one off a huge boundary.
        assert!(matches!(
            plan_layout(
                &[
                    run(1, 4 * MIB, 2 * MIB),
                    run(0, 3 * MIB, PAGE),
                    run(1, 8 * MIB, 2 * MIB)
                ],
                granularity,
                PAGE,
                PAGE
            ),
            Err(MemError::BackingGranularity { gpa, granularity }) if gpa == 8 * MIB && granularity == 2 * MIB
        ));
        // Host-page granularity only: no slack before the first page.
        let layout = plan_layout(&[run(0, 5 * PAGE, 2 * MIB)], |_| PAGE, 2 * MIB, PAGE).unwrap();
        assert_eq!((layout.first_page, layout.alignment), (0, 2 * MIB));
        assert_eq!(layout.reserve_len, 2 * MIB);
    }

    #[test]
    fn rejects_bad_requests() {
        let (_, mem) = one_file_two_regions();
        let ram = GuestRam::new(&mem).unwrap();
        let one = [LOW];
        let two = [LOW, LOW + PAGE];
        let base = MrPages {
            iova: 0,
            length: PAGE,
            page_shift: 12,
            pages: &one,
        };

        for page_shift in [0, 11, 31, 64, u32::MAX] {
            assert!(matches!(
                map_error(&ram, MrPages { page_shift, ..base }),
                MemError::BadPageShift(shift) if shift == page_shift
            ));
        }
        assert!(matches!(
            map_error(&ram, MrPages { length: 0, ..base }),
            MemError::ZeroLength
        ));
        assert!(matches!(
            MrWindow::map(&ram, &base, PAGE - 1).unwrap_err(),
            MemError::TooLarge { length: PAGE, limit } if limit == PAGE - 1
        ));
        assert!(MrWindow::map(&ram, &base, PAGE).is_ok());
        assert!(matches!(
            MrWindow::map(
                &ram,
                &MrPages {
                    iova: u64::MAX - 10,
                    length: 11,
                    ..base
                },
                u64::MAX
            )
            .unwrap_err(),
            MemError::IovaOverflow { .. }
        ));
        assert!(matches!(
            MrWindow::map(
                &ram,
                &MrPages {
                    iova: 0,
                    length: u64::MAX,
                    ..base
                },
                u64::MAX
            )
            .unwrap_err(),
            MemError::PageCountMismatch { given: 1, .. }
        ));
        // Too few pages: the iova offset pushes the end into a second page.
        assert!(matches!(
            map_error(&ram, MrPages { iova: 1, ..base }),
            MemError::PageCountMismatch {
                given: 1,
                expected: 2
            }
        ));
        // Too many pages.
        assert!(matches!(
            map_error(
                &ram,
                MrPages {
                    pages: &two,
                    ..base
                }
            ),
            MemError::PageCountMismatch {
                given: 2,
                expected: 1
            }
        ));
        assert!(matches!(
            map_error(&ram, MrPages { pages: &[LOW + 8], ..base }),
            MemError::UnalignedPage { gpa, .. } if gpa == LOW + 8
        ));
        assert!(matches!(
            map_error(
                &ram,
                MrPages {
                    pages: &[LOW + PAGE, LOW + 3 * MIB],
                    length: 2 * PAGE,
                    ..base
                }
            ),
            MemError::NotInGuestRam { gpa, .. } if gpa == LOW + 3 * MIB
        ));
        assert!(matches!(
            map_error(
                &ram,
                MrPages {
                    pages: &[!(PAGE - 1)],
                    ..base
                }
            ),
            MemError::NotInGuestRam { .. }
        ));
        // A 2 MiB page at an address that is 4 KiB aligned only.
        assert!(matches!(
            map_error(
                &ram,
                MrPages {
                    page_shift: 21,
                    pages: &[LOW],
                    ..base
                }
            ),
            MemError::UnalignedPage { .. }
        ));
    }

    #[test]
    fn rejects_memory_without_a_file() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(LOW), MIB as usize)]).unwrap();
        let ram = GuestRam::new(&mem).unwrap();
        assert!(matches!(
            ram.translate(LOW, PAGE),
            Err(MemError::NotFdBacked { region_start: LOW })
        ));
        let request = MrPages {
            iova: 0,
            length: PAGE,
            page_shift: 12,
            pages: &[LOW],
        };
        assert!(matches!(
            map_error(&ram, request),
            MemError::NotFdBacked { region_start: LOW }
        ));
    }

    #[test]
    fn rejects_regions_beyond_the_end_of_their_file() {
        let file = Arc::new(memfd(c"short", MIB));
        let mem = guest_memory(&[(LOW, 2 * MIB, &file, 0)]);
        let ram = GuestRam::new(&mem).unwrap();
        assert!(ram.translate(LOW + MIB - PAGE, PAGE).is_ok());
        assert!(matches!(
            ram.translate(LOW + MIB - PAGE, PAGE + 1),
            Err(MemError::BeyondEndOfFile { file_len, .. }) if file_len == MIB
        ));
        let request = MrPages {
            iova: 0,
            length: 2 * PAGE,
            page_shift: 12,
            pages: &[LOW + MIB - PAGE, LOW + MIB],
        };
        assert!(matches!(
            map_error(&ram, request),
            MemError::BeyondEndOfFile { gpa, .. } if gpa == LOW + MIB
        ));
    }

    #[test]
    fn still_backed_after_memory_changes() {
        let (file, mem) = one_file_two_regions();
        let ram = GuestRam::new(&mem).unwrap();
        let pages = [LOW + PAGE, HIGH];
        let request = MrPages {
            iova: 0,
            length: 2 * PAGE,
            page_shift: 12,
            pages: &pages,
        };
        let window = MrWindow::map(&ram, &request, GIB).unwrap();
        assert!(window.still_backed_by(&ram));

        // The frontend sends the same table again, with fresh descriptors.
        let reopened = Arc::new(file.try_clone().unwrap());
        let same = guest_memory(&[(LOW, MIB, &reopened, 2 * MIB), (HIGH, MIB, &reopened, 0)]);
        assert!(window.still_backed_by(&GuestRam::new(&same).unwrap()));

        // A region is removed (REM_MEM_REG).
        let (removed, _) = mem.remove_region(GuestAddress(HIGH), MIB).unwrap();
        assert!(!window.still_backed_by(&GuestRam::new(&removed).unwrap()));

        // Same addresses, another file.
        let other = Arc::new(memfd(c"other", 4 * MIB));
        let replaced = guest_memory(&[(LOW, MIB, &file, 2 * MIB), (HIGH, MIB, &other, 0)]);
        assert!(!window.still_backed_by(&GuestRam::new(&replaced).unwrap()));

        // Same file, moved within it.
        let moved = guest_memory(&[(LOW, MIB, &file, 3 * MIB), (HIGH, MIB, &file, 0)]);
        assert!(!window.still_backed_by(&GuestRam::new(&moved).unwrap()));

        // A region that shrinks but still holds the pages used keeps the window.
        let shrunk = guest_memory(&[(LOW, 2 * PAGE, &file, 2 * MIB), (HIGH, PAGE, &file, 0)]);
        assert!(window.still_backed_by(&GuestRam::new(&shrunk).unwrap()));
        let too_small = guest_memory(&[(LOW, PAGE, &file, 2 * MIB), (HIGH, PAGE, &file, 0)]);
        assert!(!window.still_backed_by(&GuestRam::new(&too_small).unwrap()));

        // The window keeps working on its own mappings whatever the memory map says.
        window.as_volatile_slice().write_slice(b"ok", 0).unwrap();
        assert_eq!(guest_bytes(&mem, LOW + PAGE, 2), b"ok");
    }

    #[test]
    fn drop_unmaps_the_window() {
        let (file, mem) = one_file_two_regions();
        let ram = GuestRam::new(&mem).unwrap();
        let pages = [LOW, HIGH];
        let request = MrPages {
            iova: 0,
            length: 2 * PAGE,
            page_shift: 12,
            pages: &pages,
        };
        let window = MrWindow::map(&ram, &request, GIB).unwrap();
        let (addr, len) = (window.reservation.addr, window.reservation.len);
        assert!(is_mapped(addr, len));
        assert!(maps_file_in(&file, addr, len));
        drop(window);
        // Other test threads may map something into the freed range at once; only a mapping
        // of the guest-RAM file there would be the window's.
        assert!(!maps_file_in(&file, addr, len));
    }

    /// Whether `/proc/self/maps` shows `file` mapped anywhere in `addr..addr + len`.
    fn maps_file_in(file: &File, addr: usize, len: usize) -> bool {
        use std::os::unix::fs::MetadataExt;
        let inode = file.metadata().unwrap().ino();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines().any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let Some((start, end)) = fields.first().and_then(|r| r.split_once('-')) else {
                return false;
            };
            let start = usize::from_str_radix(start, 16).unwrap();
            let end = usize::from_str_radix(end, 16).unwrap();
            let overlaps = start < addr + len && addr < end;
            overlaps && fields.get(4) == Some(&inode.to_string().as_str())
        })
    }

    /// Whether any page of `addr..addr + len` is mapped, according to mincore().
    fn is_mapped(addr: usize, len: usize) -> bool {
        let mut residency = vec![0u8; len.div_ceil(PAGE as usize)];
        // SAFETY: mincore only writes one byte per page into `residency`, which is large enough.
        let result =
            unsafe { libc::mincore(addr as *mut libc::c_void, len, residency.as_mut_ptr()) };
        if result == 0 {
            return true;
        }
        assert_eq!(
            io::Error::last_os_error().raw_os_error(),
            Some(libc::ENOMEM)
        );
        false
    }

    #[test]
    #[ignore = "needs at least 4 free 2 MiB huge pages (vm.nr_hugepages); run in the test VM"]
    fn hugetlbfs_backed_guest_ram() {
        let flags = libc::MFD_CLOEXEC | libc::MFD_HUGETLB | libc::MFD_HUGE_2MB;
        // SAFETY: memfd_create only reads the NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"hugetlb".as_ptr(), flags) };
        assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
        // SAFETY: `fd` is a new descriptor nothing else owns.
        let file = Arc::new(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) });
        file.set_len(8 * MIB).unwrap();
        const BASE: u64 = 0x8000_0000;
        let mem = guest_memory(&[(BASE, 8 * MIB, &file, 0)]);
        fill_pattern(&mem, BASE, 8 * MIB as usize, 13);
        let ram = GuestRam::new(&mem).unwrap();
        assert_eq!(
            ram.regions[0].backing.as_ref().unwrap().granularity,
            2 * MIB
        );

        // 4 KiB MR pages inside one huge page, and a buffer crossing a huge page boundary.
        for pages in [
            vec![BASE + 2 * MIB + PAGE, BASE + 2 * MIB + 2 * PAGE],
            vec![BASE + 4 * MIB - PAGE, BASE + 4 * MIB],
        ] {
            let request = MrPages {
                iova: 0x10,
                length: 2 * PAGE - 0x10,
                page_shift: 12,
                pages: &pages,
            };
            let window = MrWindow::map(&ram, &request, GIB).unwrap();
            assert_eq!(window_bytes(&window), expected_bytes(&mem, &request));
            window.as_volatile_slice().write_slice(b"huge", 0).unwrap();
            assert_eq!(guest_bytes(&mem, pages[0] + 0x10, 4), b"huge");
        }

        // Scattered 2 MiB MR pages.
        let pages = [BASE + 6 * MIB, BASE + 2 * MIB, BASE];
        let request = MrPages {
            iova: 0,
            length: 6 * MIB,
            page_shift: 21,
            pages: &pages,
        };
        let window = MrWindow::map(&ram, &request, GIB).unwrap();
        assert_eq!(window.runs(), 3);
        assert_eq!(window_bytes(&window), expected_bytes(&mem, &request));

        // Scattered 4 KiB pages cannot be laid out from huge pages.
        let scattered = [BASE + PAGE, BASE + 4 * MIB];
        assert!(matches!(
            map_error(
                &ram,
                MrPages {
                    iova: 0,
                    length: 2 * PAGE,
                    page_shift: 12,
                    pages: &scattered
                }
            ),
            MemError::BackingGranularity { .. }
        ));
    }

    #[test]
    fn guest_region_mmap_is_what_the_frontend_gives() {
        // vhost-user-backend builds regions with GuestRegionMmap::new(MmapRegion::from_file(..)):
        // make sure such regions translate like the ones built by from_ranges_with_files.
        let file = memfd(c"frontend", 2 * MIB);
        let region = GuestRegionMmap::<()>::new(
            vm_memory::MmapRegion::from_file(FileOffset::new(file, MIB), MIB as usize).unwrap(),
            GuestAddress(HIGH),
        )
        .unwrap();
        let mem = GuestMemoryMmap::from_regions(vec![region]).unwrap();
        let ram = GuestRam::new(&mem).unwrap();
        assert_eq!(ram.translate(HIGH + PAGE, PAGE).unwrap().offset, MIB + PAGE);
    }
}

// Copyright 2026 The vrdma Authors
// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause

//! Guest RAM: the daemon's mapping of it, and [`GuestRamFiles`], its snapshot as backing files.
//!
//! [`GuestRamFiles`] is an immutable snapshot of the guest memory map, translating
//! guest-physical ranges to (backing file, file offset). The owner builds a new one whenever the
//! frontend changes the memory map and asks each MR window whether it is still backed by the
//! new map.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use super::error::MemError;
use super::reservation::host_page_size;

/// Guest RAM as the daemon maps it (no dirty-page tracking: the device is not migratable).
pub type MappedGuestRam = vm_memory::GuestMemoryMmap<()>;
/// Guest RAM that the frontend may replace at any time (SET_MEM_TABLE, ADD/REM_MEM_REG).
pub type AtomicGuestRam = vm_memory::GuestMemoryAtomic<MappedGuestRam>;

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
pub(super) struct Backing {
    pub(super) file: Arc<File>,
    pub(super) identity: FileIdentity,
    /// File offset of the first byte of the region.
    pub(super) start: u64,
    /// Size of the file when the snapshot was taken.
    file_len: u64,
    /// Smallest unit in which the file can be mapped: the host page size, or the huge page size
    /// for hugetlbfs, whose mappings must be huge-page aligned in both file and address space.
    pub(super) granularity: u64,
}

#[derive(Debug, Clone)]
pub(super) struct RamRegion {
    pub(super) gpa_start: u64,
    len: u64,
    pub(super) backing: Option<Backing>,
    /// Where the daemon's own mapping of guest RAM holds `gpa_start`, when the snapshot keeps
    /// that mapping alive ([`GuestRamFiles::mapped`]).
    host_base: Option<usize>,
}

impl RamRegion {
    fn gpa_end(&self) -> u64 {
        // Cannot overflow: checked when the snapshot was built.
        self.gpa_start + self.len
    }
}

/// Immutable snapshot of the guest memory map as backing files, as seen by MR windows:
/// translates guest-physical ranges to (backing file, file offset).
#[derive(Debug, Clone, Default)]
pub struct GuestRamFiles {
    /// Sorted by `gpa_start`, non-overlapping.
    pub(super) regions: Vec<RamRegion>,
    /// The daemon's mapping of the same memory, kept mapped for as long as anything holds it.
    mapping: Option<Arc<MappedGuestRam>>,
}

impl GuestRamFiles {
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
                host_base: None,
            });
        }
        regions.sort_by_key(|region| region.gpa_start);
        Ok(GuestRamFiles {
            regions,
            mapping: None,
        })
    }

    /// Snapshots `mem` like [`new`](Self::new) and keeps `mem` itself, so that an MR can be
    /// registered over the daemon's existing mapping of guest RAM (no window of its own) and
    /// keep that mapping alive for as long as the MR lives.
    pub fn mapped(mem: Arc<MappedGuestRam>) -> Result<Self, MemError> {
        let mut files = Self::new(&*mem)?;
        for region in mem.iter() {
            let start = region.start_addr().0;
            if let Some(ram) = files.regions.iter_mut().find(|r| r.gpa_start == start) {
                ram.host_base = Some(region.as_ptr() as usize);
            }
        }
        files.mapping = Some(mem);
        Ok(files)
    }

    /// The daemon's address of `gpa` in region `region` and the mapping that holds it, if this
    /// snapshot keeps the mapping ([`mapped`](Self::mapped)). `gpa` must be in the region.
    pub(super) fn mapped_address(
        &self,
        region: usize,
        gpa: u64,
    ) -> Option<(usize, &Arc<MappedGuestRam>)> {
        let ram = self.regions.get(region)?;
        let base = ram.host_base?;
        let offset = usize::try_from(gpa.checked_sub(ram.gpa_start)?).ok()?;
        Some((base.checked_add(offset)?, self.mapping.as_ref()?))
    }

    /// Bytes from `gpa` to the end of the region holding it (or of its backing file, if that
    /// ends first); 0 if no region holds `gpa`.
    pub(super) fn room_in_region(&self, gpa: u64) -> u64 {
        let Some(index) = self
            .regions
            .partition_point(|region| region.gpa_start <= gpa)
            .checked_sub(1)
        else {
            return 0;
        };
        let region = &self.regions[index];
        let in_region = region.gpa_end().saturating_sub(gpa);
        match &region.backing {
            Some(backing) => {
                let file_offset = backing.start.saturating_add(gpa - region.gpa_start);
                in_region.min(backing.file_len.saturating_sub(file_offset))
            }
            None => in_region,
        }
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
    pub(super) fn locate(&self, gpa: u64, len: u64) -> Result<(usize, &Backing, u64), MemError> {
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
    pub(super) fn force_granularity(&mut self, granularity: u64) {
        for backing in self.regions.iter_mut().filter_map(|r| r.backing.as_mut()) {
            backing.granularity = granularity;
        }
    }
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
    use crate::memory::test_files::*;
    use vm_memory::{
        FileOffset, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap,
        GuestRegionMmap,
    };

    #[test]
    fn translates_fd_backed_ranges() {
        let (file, mem) = one_file_two_regions();
        let ram = GuestRamFiles::new(&mem).unwrap();
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
        let ram = GuestRamFiles::new(&mem).unwrap();
        for region in &ram.regions {
            assert_eq!(region.backing.as_ref().unwrap().granularity, PAGE);
        }
    }

    #[test]
    fn snapshot_from_guest_memory_atomic() {
        let (_, mem) = one_file_two_regions();
        let atomic = GuestMemoryAtomic::new(mem);
        let ram = GuestRamFiles::new(&*atomic.memory()).unwrap();
        assert_eq!(ram.regions.len(), 2);
        assert_eq!(ram.translate(HIGH, PAGE).unwrap().offset, 0);
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
        let ram = GuestRamFiles::new(&mem).unwrap();
        assert_eq!(ram.translate(HIGH + PAGE, PAGE).unwrap().offset, MIB + PAGE);
    }
}

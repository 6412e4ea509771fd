//! Memory of staging rings (spec §9.6–§9.8): the staging file whose extents hold the rings the
//! guest uses instead of host buffers (UD send queues, connected QPs' queues, CQs), each
//! ring's place in it ([`StagingExtent`]), and the device's private mapping of a host queue.
//!
//! The staging file is one memfd per guest, as large as the queue region and sparse: a staged
//! send queue at region offset `o` is the file's bytes at `o`, mapped into the region with
//! SHMEM_MAP at file offset `o`, so extents never collide and the region allocator is the only
//! bookkeeping. The device maps the whole file once and reads staged WQEs through that mapping.
//!
//! A host send queue of a staged QP is mapped by the device alone: rxe lets each queue buffer
//! be mapped exactly once, and the device needs it writable, so the guest never sees it.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;

use vrdma_spec::rxe_v1::{header, GeometryError, RingGeometry};

use crate::memory::budget::MappingCharge;
use crate::memory::queue_region::ShmRange;

/// A shared read/write mapping of a file range in this process, unmapped when dropped.
pub struct SharedMapping {
    addr: NonNull<u8>,
    len: usize,
    /// What the mapping is charged to, given back after it is unmapped (a staged queue's
    /// mapping of its host buffer counts against the guest's and the daemon's mapping budget).
    _charge: Option<MappingCharge>,
}

// SAFETY: the mapping is plain shared memory; every access goes through raw pointers or atomics
// and the owner decides who touches what.
unsafe impl Send for SharedMapping {}
// SAFETY: as above; shared access is only through atomics and raw copies.
unsafe impl Sync for SharedMapping {}

impl SharedMapping {
    /// Maps `len` bytes of `fd` from `offset`, shared and read/write.
    pub fn new(fd: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<Self> {
        Self::map(fd, offset, len, None)
    }

    /// [`new`](Self::new) for a mapping `charge` was taken for: it goes back when the mapping
    /// is unmapped, or at once if the mapping fails.
    pub fn charged(
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        charge: MappingCharge,
    ) -> io::Result<Self> {
        Self::map(fd, offset, len, Some(charge))
    }

    fn map(
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        charge: Option<MappingCharge>,
    ) -> io::Result<Self> {
        let file_offset = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        if len == 0 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: a fresh mapping chosen by the kernel; it aliases nothing of ours.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                file_offset,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let addr = NonNull::new(addr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap at 0"))?;
        Ok(SharedMapping {
            addr,
            len,
            _charge: charge,
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: mappings have at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The byte range `[offset, offset + len)`, or `None` if it leaves the mapping.
    pub fn range(&self, offset: usize, len: usize) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        // SAFETY: `offset <= end <= self.len`, so the pointer stays inside the mapping.
        (end <= self.len).then(|| unsafe { self.addr.as_ptr().add(offset) })
    }

    /// The 32-bit word at `offset` (4-byte aligned, inside the mapping).
    pub fn word(&self, offset: usize) -> Option<&AtomicU32> {
        if !offset.is_multiple_of(4) {
            return None;
        }
        let ptr = self.range(offset, 4)?;
        // SAFETY: inside the mapping (checked), 4-byte aligned (mappings are page aligned and
        // `offset` is a multiple of 4), valid for as long as `self`; any bit pattern is a valid
        // u32, and the other side writes the word concurrently, hence only atomic access.
        Some(unsafe { &*ptr.cast::<AtomicU32>() })
    }
}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        // SAFETY: `addr..addr + len` is the mapping `new` made, and nothing borrows it once its
        // owner is dropped.
        unsafe { libc::munmap(self.addr.as_ptr().cast(), self.len) };
    }
}

/// The guest's staging file (see the module documentation).
pub struct StagingFile {
    file: File,
    mapping: SharedMapping,
}

impl StagingFile {
    /// A sparse staging file of `size` bytes (the queue region's size), mapped here.
    pub fn new(size: u64) -> io::Result<Self> {
        // SAFETY: memfd_create only reads the NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"vrdma-ud-staging".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: memfd_create just returned this fd and nothing else owns it.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        file.set_len(size)?;
        let len = usize::try_from(size).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        let mapping = SharedMapping::new(file.as_fd(), 0, len)?;
        Ok(StagingFile { file, mapping })
    }

    /// The file, to pass with SHMEM_MAP.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Whether `other` is this very file (a memory-table region the frontend hands back).
    pub fn is_same_file(&self, other: &File) -> bool {
        match (self.file.metadata(), other.metadata()) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }

    /// The device's mapping of the whole file.
    pub fn mapping(&self) -> &SharedMapping {
        &self.mapping
    }

    /// Writes an rxe v1 queue header at the start of `range` (geometry, both indices 0), so
    /// that the guest's cross-check of the header (spec §6) holds for the staging ring.
    ///
    /// The slots are left as they are: nothing reads a slot before the guest has produced it
    /// (the device copies only between the indices), a released ring's pages are given back
    /// when it is dropped, and the file belongs to one guest. Punching the range here as well
    /// cost every staged QP an `fallocate`, which unmaps the range from every mapping of the
    /// file (the guest's too) — more than the host's own CREATE_QP under TCG.
    pub fn init_ring(&self, range: ShmRange, geometry: RingGeometry) -> io::Result<()> {
        let base = usize::try_from(range.offset).map_err(|_| io::Error::other("offset"))?;
        let header_len = u64::try_from(header::SIZE).map_err(|_| io::Error::other("header"))?;
        if range.len < header_len {
            return Err(io::Error::other("staging ring smaller than its header"));
        }
        let word = |at: usize| {
            self.mapping
                .word(base + at)
                .ok_or_else(|| io::Error::other("staging ring outside the staging file"))
        };
        use std::sync::atomic::Ordering::{Relaxed, Release};
        for at in (0..header::SIZE).step_by(4) {
            word(at)?.store(0, Relaxed);
        }
        word(header::LOG2_ELEM_SIZE)?.store(geometry.log2_slot_size(), Release);
        word(header::INDEX_MASK)?.store(geometry.index_mask(), Release);
        Ok(())
    }

    /// Gives the pages of `range` back (they read as zero afterwards).
    pub fn punch(&self, range: ShmRange) -> io::Result<()> {
        let (offset, len) = match (
            libc::off_t::try_from(range.offset),
            libc::off_t::try_from(range.len),
        ) {
            (Ok(o), Ok(l)) => (o, l),
            _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
        };
        // SAFETY: fallocate only acts on the file; the mapping sees zero pages afterwards.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                len,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// One staging ring's place in the staging file (spec §9.6–§9.8), seen through the device's
/// mapping of the file; its pages are given back when it is dropped (the extent itself is the
/// region allocator's to release).
pub struct StagingExtent {
    staging: std::sync::Arc<StagingFile>,
    /// Offset of the ring in the staging file (= its region offset).
    offset: usize,
    range: ShmRange,
}

impl StagingExtent {
    /// The ring of `geometry` at `range` of `staging`, if it fits both.
    pub fn new(
        staging: std::sync::Arc<StagingFile>,
        range: ShmRange,
        geometry: RingGeometry,
    ) -> Result<Self, GeometryError> {
        let offset = usize::try_from(range.offset).map_err(|_| GeometryError::Bounds)?;
        let extent_len = usize::try_from(range.len).unwrap_or(usize::MAX);
        geometry.check_len(extent_len)?;
        let ring_len = geometry.buffer_len() as usize;
        if staging.mapping().range(offset, ring_len).is_none() {
            return Err(GeometryError::Bounds);
        }
        Ok(StagingExtent {
            staging,
            offset,
            range,
        })
    }

    /// The word at `at` of the ring (a header index), which `new` checked to lie in it.
    pub fn word(&self, at: usize) -> &AtomicU32 {
        self.staging
            .mapping()
            .word(self.offset + at)
            .expect("staging header inside the staging file")
    }

    /// `len` bytes at `at` of the ring, which the caller keeps within the ring `new` checked.
    pub fn bytes(&self, at: usize, len: usize) -> *mut u8 {
        self.staging
            .mapping()
            .range(self.offset + at, len)
            .expect("staging slot inside the staging file")
    }

    /// The ring's extent of the queue region.
    pub fn range(&self) -> ShmRange {
        self.range
    }
}

impl Drop for StagingExtent {
    fn drop(&mut self) {
        if let Err(e) = self.staging.punch(self.range) {
            log::warn!("staging ring {:#x}: {e}", self.range.offset);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_start_empty_with_their_geometry() {
        let staging = StagingFile::new(1 << 20).unwrap();
        let range = ShmRange {
            offset: 0x2000,
            len: 0x2000,
        };
        let word = |at| {
            staging
                .mapping()
                .word(0x2000 + at)
                .unwrap()
                .load(std::sync::atomic::Ordering::Acquire)
        };
        // Leftovers of an earlier ring in the header are gone; the slots are not read before
        // the guest writes them and stay as they were.
        for at in [
            header::PRODUCER_INDEX,
            header::CONSUMER_INDEX,
            header::SIZE - 4,
        ] {
            staging
                .mapping()
                .word(0x2000 + at)
                .unwrap()
                .store(7, std::sync::atomic::Ordering::Release);
        }
        let slot = staging.mapping().range(0x2000 + header::DATA, 1).unwrap();
        // SAFETY: inside the mapping.
        unsafe { slot.write(0xab) };
        let geometry = RingGeometry::with_index_mask(15, 8).unwrap();
        staging.init_ring(range, geometry).unwrap();
        // SAFETY: inside the mapping.
        assert_eq!(unsafe { slot.read() }, 0xab);
        assert_eq!(word(header::LOG2_ELEM_SIZE), 8);
        assert_eq!(word(header::INDEX_MASK), 15);
        assert_eq!(word(header::PRODUCER_INDEX), 0);
        assert_eq!(word(header::CONSUMER_INDEX), 0);
        assert_eq!(word(header::SIZE - 4), 0);
        assert!(staging
            .init_ring(
                ShmRange {
                    offset: 0x2000,
                    len: 0
                },
                geometry
            )
            .is_err());
        assert!(staging
            .init_ring(
                ShmRange {
                    offset: 1 << 20,
                    len: 0x1000
                },
                geometry
            )
            .is_err());
        assert!(staging.mapping().word(1 << 20).is_none());
        assert!(staging.mapping().word(2).is_none());
        let again = File::from(staging.fd().try_clone_to_owned().unwrap());
        assert!(staging.is_same_file(&again));
        assert!(!staging.is_same_file(&File::open("/dev/null").unwrap()));
    }
}

//! Memory the device can reach.
//!
//! [`DmaMemory`] is how every transport hands it out and translates it; [`DmaBuffer`] is one
//! allocation: zeroed, page aligned, addressed by the device by guest-physical page addresses.
//! [`MemfdRam`] is the process transport's "guest RAM": a sealed memfd mapped shared in this
//! process and given to the backend with SET_MEM_TABLE, with a first-fit page allocator over
//! it. Its guest-physical address space starts at [`GUEST_RAM_BASE`], so that 0 is never a
//! valid address.
//!
//! Guest RAM is `MADV_DONTFORK`: the child of a `fork()` has no mapping of it, so it can
//! neither read the parent's command and ring memory nor write into it (the child's copy of
//! the transport refuses to run commands, see [`crate::transport::process`]).

use std::any::Any;
use std::collections::BTreeMap;
use std::ffi::CStr;
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use parking_lot::Mutex;

/// log2 of [`PAGE_SIZE`].
pub const PAGE_SHIFT: u32 = 12;
/// Granule of guest-physical addresses and of allocations: the pages
/// [`DmaMemory::translate`] returns.
pub const PAGE_SIZE: usize = 1 << PAGE_SHIFT;
/// Guest-physical address of the first byte of the process transport's guest RAM.
pub const GUEST_RAM_BASE: u64 = 1 << 30;
/// Default size of the process transport's guest RAM.
pub const DEFAULT_GUEST_RAM_SIZE: usize = 256 << 20;

/// Errors of DMA memory.
#[derive(Debug, thiserror::Error)]
pub enum DmaError {
    /// Size zero, not a multiple of the page size, or too large.
    #[error("invalid guest RAM size {0:#x}")]
    BadSize(usize),
    /// The memfd could not be created, sized, sealed or mapped.
    #[error("cannot create guest RAM: {0}")]
    Create(#[source] io::Error),
    /// No free range is large enough.
    #[error("out of DMA memory: {len:#x} bytes aligned to {align:#x} requested")]
    OutOfMemory {
        /// Requested length.
        len: usize,
        /// Requested alignment.
        align: usize,
    },
    /// Zero length or an alignment that is not a power of two.
    #[error("invalid allocation: {len:#x} bytes aligned to {align:#x}")]
    BadRequest {
        /// Requested length.
        len: usize,
        /// Requested alignment.
        align: usize,
    },
    /// The range is not inside memory the device can reach.
    #[error("{len:#x} bytes at {addr:#x} are not DMA memory")]
    NotDmaMemory {
        /// Host address.
        addr: usize,
        /// Length.
        len: usize,
    },
    /// A system call of the allocator failed (mapping, locking or translating memory).
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

/// Memory the device can reach by DMA.
pub trait DmaMemory: Send + Sync {
    /// A zeroed buffer of at least `len` bytes, aligned to `align` and at least to a page;
    /// freed when the buffer is dropped.
    fn alloc(&self, len: usize, align: usize) -> Result<DmaBuffer, DmaError>;

    /// Guest-physical address of each 4 KiB page covering `[addr, addr + len)`, in order.
    /// Fails unless the whole range is memory of this allocator's kind.
    fn translate(&self, addr: *const u8, len: usize) -> Result<Vec<u64>, DmaError>;

    /// The same pages as [`translate`](Self::translate), as extents (guest-physical address,
    /// length): runs of consecutive pages merged. Allocators whose memory is contiguous
    /// answer without listing pages.
    fn translate_extents(&self, addr: *const u8, len: usize) -> Result<Vec<(u64, u64)>, DmaError> {
        Ok(page_extents(&self.translate(addr, len)?))
    }
}

/// Merges runs of consecutive 4 KiB pages into (guest-physical address, length) extents, in
/// order.
pub fn page_extents(pages: &[u64]) -> Vec<(u64, u64)> {
    let mut extents: Vec<(u64, u64)> = Vec::new();
    for &page in pages {
        match extents.last_mut() {
            Some((start, len)) if *start + *len == page => *len += PAGE_SIZE as u64,
            _ => extents.push((page, PAGE_SIZE as u64)),
        }
    }
    extents
}

/// A zeroed allocation the device can reach; freed when dropped.
///
/// The bytes are shared with the device: while the device may write them (a buffer posted and
/// not yet completed), only raw-pointer access is sound, not the slice views.
pub struct DmaBuffer {
    ptr: NonNull<u8>,
    len: usize,
    // Keeps the allocation alive; its drop frees it.
    _owner: Box<dyn Any + Send + Sync>,
}

// SAFETY: the buffer is plain memory owned by `_owner` (Send + Sync); the pointer is only an
// address into it, valid from any thread.
unsafe impl Send for DmaBuffer {}
// SAFETY: shared references only give read access (or raw pointers, whose use is unsafe).
unsafe impl Sync for DmaBuffer {}

impl DmaBuffer {
    /// Wraps `len` bytes at `ptr` kept alive (and freed on drop) by `owner`.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes, page aligned and zeroed, for
    /// as long as `owner` lives, and nothing else may hand out the same bytes meanwhile.
    pub unsafe fn from_raw_parts(
        ptr: NonNull<u8>,
        len: usize,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Self {
        DmaBuffer {
            ptr,
            len,
            _owner: owner,
        }
    }

    /// First byte.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// First byte, writable.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// First byte, never null.
    pub fn as_non_null(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty buffer (never returned by an allocator).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, while the device does not write them.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the allocation is valid for `len` bytes while `self` lives (constructor
        // contract); device writes during the borrow are excluded by this method's contract.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable, while the device does not access them.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for `as_slice`, and `&mut self` excludes other views through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl fmt::Debug for DmaBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

/// The process transport's guest RAM: a sealed memfd mapped shared in this process and with
/// the backend, and the page allocator over it.
pub struct MemfdRam {
    memfd: File,
    base: NonNull<u8>,
    len: usize,
    /// Guest-physical address of the first byte.
    guest_base: u64,
    free: Mutex<FreeRanges>,
}

// SAFETY: the mapping is shared memory owned by `MemfdRam` for its whole life; the allocator
// state is behind a mutex.
unsafe impl Send for MemfdRam {}
// SAFETY: see `Send`; no method hands out references that alias mutable ones.
unsafe impl Sync for MemfdRam {}

/// The pages guest RAM is made of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RamPages {
    /// Ordinary (shmem) pages of the host page size.
    #[default]
    Small,
    /// 2 MiB hugetlb pages, taken from the host's reserved pool (`vm.nr_hugepages`); like a VM
    /// whose RAM is on hugetlbfs.
    Huge2M,
}

impl RamPages {
    /// The size guest RAM must be a multiple of.
    pub fn size(self) -> usize {
        match self {
            RamPages::Small => PAGE_SIZE,
            RamPages::Huge2M => 2 << 20,
        }
    }
}

impl MemfdRam {
    /// Creates `len` bytes (a multiple of [`PAGE_SIZE`]) of guest RAM.
    pub fn new(len: usize) -> Result<Arc<Self>, DmaError> {
        Self::with_pages(len, RamPages::Small)
    }

    /// Creates `len` bytes (a multiple of `pages.size()`) of guest RAM made of `pages`.
    pub fn with_pages(len: usize, pages: RamPages) -> Result<Arc<Self>, DmaError> {
        Self::create_at(len, pages, GUEST_RAM_BASE)
    }

    /// Creates `len` bytes (a multiple of `pages.size()`) of guest RAM made of `pages`, at
    /// guest-physical address `guest_base` (a multiple of `pages.size()`).
    pub fn create_at(len: usize, pages: RamPages, guest_base: u64) -> Result<Arc<Self>, DmaError> {
        let fits = len as u64 <= u64::MAX - guest_base;
        if len == 0 || !len.is_multiple_of(pages.size()) || !fits {
            return Err(DmaError::BadSize(len));
        }
        let memfd = create_memfd(c"vrdma-guest-ram", pages).map_err(DmaError::Create)?;
        memfd.set_len(len as u64).map_err(DmaError::Create)?;
        seal_size(&memfd).map_err(DmaError::Create)?;
        Self::map(memfd, len, guest_base)
    }

    /// Guest RAM that another process created (the guest agent gives each application its
    /// own): `memfd` holds `len` bytes (a multiple of [`PAGE_SIZE`]) at guest-physical
    /// address `guest_base`. Fails unless the memfd's size is sealed at exactly `len`, so
    /// that nobody can shrink it under this mapping.
    pub fn adopt(memfd: OwnedFd, len: usize, guest_base: u64) -> Result<Arc<Self>, DmaError> {
        let memfd = File::from(memfd);
        let fits = len as u64 <= u64::MAX - guest_base;
        if len == 0 || !len.is_multiple_of(PAGE_SIZE) || !fits {
            return Err(DmaError::BadSize(len));
        }
        let size = memfd.metadata().map_err(DmaError::Create)?.len();
        if size != len as u64 || !size_sealed(&memfd).map_err(DmaError::Create)? {
            return Err(DmaError::BadSize(len));
        }
        Self::map(memfd, len, guest_base)
    }

    fn map(memfd: File, len: usize, guest_base: u64) -> Result<Arc<Self>, DmaError> {
        let base = map_shared(memfd.as_fd(), len).map_err(DmaError::Create)?;
        let ram = MemfdRam {
            memfd,
            base,
            len,
            guest_base,
            free: Mutex::new(FreeRanges::new(0, len)),
        };
        // SAFETY: the mapping just made, owned by `ram`.
        unsafe { dont_fork(base.as_ptr(), len) }.map_err(DmaError::Create)?;
        Ok(Arc::new(ram))
    }

    /// The memfd (for SET_MEM_TABLE).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }

    /// Where this process mapped the memfd.
    pub fn host_base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: guest RAM has at least one page.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Guest-physical address of the first byte.
    pub fn guest_base(&self) -> u64 {
        self.guest_base
    }

    /// Guest-physical address of `len` bytes at host address `addr`, if they lie in guest RAM.
    pub fn guest_address(&self, addr: *const u8, len: usize) -> Result<u64, DmaError> {
        let start = addr as usize;
        let base = self.base.as_ptr() as usize;
        let inside = start >= base
            && start
                .checked_add(len)
                .is_some_and(|end| end <= base + self.len);
        if !inside {
            return Err(DmaError::NotDmaMemory { addr: start, len });
        }
        Ok(self.guest_base + (start - base) as u64)
    }

    /// Guest-physical address of every 4 KiB page covering `[addr, addr + len)`.
    pub fn translate(&self, addr: *const u8, len: usize) -> Result<Vec<u64>, DmaError> {
        let first = self.guest_address(addr, len)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        let start_page = first & !(PAGE_SIZE as u64 - 1);
        let end = first + len as u64;
        Ok((start_page..end).step_by(PAGE_SIZE).collect())
    }

    /// The pages of `[addr, addr + len)` as one extent: guest RAM is contiguous.
    pub fn translate_extents(
        &self,
        addr: *const u8,
        len: usize,
    ) -> Result<Vec<(u64, u64)>, DmaError> {
        let first = self.guest_address(addr, len)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        let start_page = first & !(PAGE_SIZE as u64 - 1);
        // Inside guest RAM (checked), so rounding up to a page cannot overflow.
        let end = (first + len as u64).next_multiple_of(PAGE_SIZE as u64);
        Ok(vec![(start_page, end - start_page)])
    }

    /// A zeroed buffer of at least `len` bytes (rounded up to pages), aligned to `align`
    /// (at least a page).
    pub fn alloc(self: &Arc<Self>, len: usize, align: usize) -> Result<DmaBuffer, DmaError> {
        if len == 0 || !align.is_power_of_two() {
            return Err(DmaError::BadRequest { len, align });
        }
        let pages_len = len
            .checked_next_multiple_of(PAGE_SIZE)
            .ok_or(DmaError::BadRequest { len, align })?;
        let align = align.max(PAGE_SIZE);
        let offset = self
            .free
            .lock()
            .take(pages_len, align)
            .ok_or(DmaError::OutOfMemory { len, align })?;
        // SAFETY: `offset + pages_len <= self.len` (allocator invariant): inside the mapping.
        let ptr = unsafe { self.base.add(offset) };
        // SAFETY: the range is inside the writable mapping and exclusively ours until freed.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, pages_len) };
        let owner = Allocation {
            ram: self.clone(),
            offset,
            len: pages_len,
        };
        // SAFETY: the range is valid, page aligned and zeroed while `owner` (which keeps the
        // mapping alive and frees the range on drop) lives; the allocator hands it out once.
        Ok(unsafe { DmaBuffer::from_raw_parts(ptr, len, Box::new(owner)) })
    }

    fn release(&self, offset: usize, len: usize) {
        self.free.lock().give_back(offset, len);
    }
}

impl Drop for MemfdRam {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are the mapping made in `new`; every `DmaBuffer` holds an
        // `Arc<MemfdRam>`, so none outlives it.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

struct Allocation {
    ram: Arc<MemfdRam>,
    offset: usize,
    len: usize,
}

impl Drop for Allocation {
    fn drop(&mut self) {
        self.ram.release(self.offset, self.len);
    }
}

/// Free ranges of an address or offset space (start → length), coalesced; first fit. The
/// bookkeeping of every guest-RAM allocator of this project (guest RAM here, the qtest
/// harness's guest RAM file).
#[derive(Debug)]
pub struct FreeRanges {
    ranges: BTreeMap<usize, usize>,
}

impl FreeRanges {
    /// All of `[start, end)` free.
    pub fn new(start: usize, end: usize) -> Self {
        FreeRanges {
            ranges: BTreeMap::from([(start, end - start)]),
        }
    }

    /// Bytes free in total.
    pub fn total(&self) -> usize {
        self.ranges.values().sum()
    }

    /// Takes `len` bytes starting at a multiple of `align` (first fit); their start.
    pub fn take(&mut self, len: usize, align: usize) -> Option<usize> {
        let (start, range_len, offset) = self.ranges.iter().find_map(|(&start, &range_len)| {
            let offset = start.checked_next_multiple_of(align)?;
            let end = offset.checked_add(len)?;
            (end <= start + range_len).then_some((start, range_len, offset))
        })?;
        self.ranges.remove(&start);
        if offset > start {
            self.ranges.insert(start, offset - start);
        }
        let tail = start + range_len - (offset + len);
        if tail > 0 {
            self.ranges.insert(offset + len, tail);
        }
        Some(offset)
    }

    /// Returns `[offset, offset + len)`, which an earlier `take` handed out.
    pub fn give_back(&mut self, offset: usize, len: usize) {
        let end = offset + len;
        let mut start = offset;
        let mut total = len;
        if let Some((&prev, &prev_len)) = self.ranges.range(..offset).next_back() {
            if prev + prev_len == offset {
                self.ranges.remove(&prev);
                start = prev;
                total += prev_len;
            }
        }
        if let Some(next_len) = self.ranges.remove(&end) {
            total += next_len;
        }
        self.ranges.insert(start, total);
    }
}

fn create_memfd(name: &CStr, pages: RamPages) -> io::Result<File> {
    let flags = libc::MFD_CLOEXEC
        | libc::MFD_ALLOW_SEALING
        | match pages {
            RamPages::Small => 0,
            RamPages::Huge2M => libc::MFD_HUGETLB | libc::MFD_HUGE_2MB,
        };
    // SAFETY: `name` is a valid NUL-terminated string; the flags are valid.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Seals the size: the backend maps the whole file, and a shrink would turn its accesses
/// into SIGBUS.
fn seal_size(memfd: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: F_ADD_SEALS on a memfd we own with valid seal flags.
    let rc = unsafe {
        libc::fcntl(
            memfd.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the memfd's size can no longer change (both F_SEAL_SHRINK and F_SEAL_GROW).
fn size_sealed(memfd: &File) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: F_GET_SEALS on a descriptor we own; it only reads the seals.
    let seals = unsafe { libc::fcntl(memfd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 {
        return Err(io::Error::last_os_error());
    }
    let needed = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    Ok(seals & needed == needed)
}

/// Marks `[addr, addr + len)` `MADV_DONTFORK`: a `fork()` child gets no mapping there.
///
/// # Safety
/// The range is page aligned and mapped by the caller, who owns it (the advice changes
/// what a child process inherits, nothing in this process).
pub unsafe fn dont_fork(addr: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: caller contract; MADV_DONTFORK does not change the pages' contents.
    if unsafe { libc::madvise(addr.cast(), len, libc::MADV_DONTFORK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Maps the first `len` bytes of the file `fd` shared and read/write.
pub fn map_shared(fd: BorrowedFd<'_>, len: usize) -> io::Result<NonNull<u8>> {
    map_shared_at(fd, 0, len)
}

/// Maps `len` bytes of the file `fd` from `offset` (page aligned) shared and read/write.
pub fn map_shared_at(
    fd: BorrowedFd<'_>,
    offset: libc::off_t,
    len: usize,
) -> io::Result<NonNull<u8>> {
    use std::os::fd::AsRawFd;
    // SAFETY: a new shared mapping of `len` bytes of a file; no existing memory is affected
    // (the kernel refuses an unaligned offset).
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            offset,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(addr.cast()).ok_or_else(|| io::Error::other("mmap returned NULL"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adopted_ram_must_be_sealed_at_its_size() {
        let owner = MemfdRam::create_at(4 * PAGE_SIZE, RamPages::Small, 3 << 30).unwrap();
        let adopted = MemfdRam::adopt(
            owner.fd().try_clone_to_owned().unwrap(),
            4 * PAGE_SIZE,
            3 << 30,
        )
        .unwrap();
        // Both map the same pages, at the same guest-physical addresses.
        // SAFETY: the first byte of the owner's mapping, which it keeps.
        unsafe { owner.host_base().write_volatile(0x42) };
        // SAFETY: the first byte of the adopted mapping, which it keeps.
        let seen = unsafe { adopted.host_base().read_volatile() };
        assert_eq!(seen, 0x42);
        assert_eq!(
            adopted.guest_address(adopted.host_base(), 1).unwrap(),
            3 << 30
        );
        let wrong_size = MemfdRam::adopt(owner.fd().try_clone_to_owned().unwrap(), PAGE_SIZE, 0);
        assert!(matches!(wrong_size, Err(DmaError::BadSize(_))));
        let unsealed = create_memfd(c"unsealed", RamPages::Small).unwrap();
        unsealed.set_len(PAGE_SIZE as u64).unwrap();
        let unsealed = MemfdRam::adopt(unsealed.into(), PAGE_SIZE, 0);
        assert!(matches!(unsealed, Err(DmaError::BadSize(_))));
    }

    #[test]
    fn allocations_are_zeroed_aligned_and_reused() {
        let ram = MemfdRam::new(16 * PAGE_SIZE).unwrap();
        let mut a = ram.alloc(100, 1).unwrap();
        assert_eq!(a.len(), 100);
        assert!(a.as_slice().iter().all(|&b| b == 0));
        a.as_mut_slice().fill(0xAB);
        let gpa = ram.guest_address(a.as_ptr(), a.len()).unwrap();
        assert_eq!(gpa % PAGE_SIZE as u64, 0);
        assert!(gpa >= GUEST_RAM_BASE);
        drop(a);
        let b = ram.alloc(PAGE_SIZE, 4 * PAGE_SIZE).unwrap();
        assert_eq!(
            (b.as_ptr() as usize - ram.host_base() as usize) % (4 * PAGE_SIZE),
            0
        );
        assert!(
            b.as_slice().iter().all(|&x| x == 0),
            "reused memory is zeroed"
        );
    }

    #[test]
    fn free_ranges_coalesce() {
        let ram = MemfdRam::new(8 * PAGE_SIZE).unwrap();
        let bufs: Vec<_> = (0..8).map(|_| ram.alloc(PAGE_SIZE, 1).unwrap()).collect();
        assert!(matches!(ram.alloc(1, 1), Err(DmaError::OutOfMemory { .. })));
        // Free in an order that needs merging with both neighbours.
        let mut bufs: Vec<Option<DmaBuffer>> = bufs.into_iter().map(Some).collect();
        for i in [1, 3, 2, 0, 7, 5, 6, 4] {
            bufs[i] = None;
        }
        let all = ram.alloc(8 * PAGE_SIZE, 1).unwrap();
        assert_eq!(all.as_ptr(), ram.host_base().cast_const());
    }

    #[test]
    fn extents_merge_consecutive_pages() {
        let p = PAGE_SIZE as u64;
        assert_eq!(
            page_extents(&[p, 2 * p, 3 * p, 7 * p, 5 * p, 6 * p]),
            [(p, 3 * p), (7 * p, p), (5 * p, 2 * p)]
        );
        assert!(page_extents(&[]).is_empty());
        let ram = MemfdRam::new(16 * PAGE_SIZE).unwrap();
        let buffer = ram.alloc(3 * PAGE_SIZE, 1).unwrap();
        // Starting 8 bytes in: the same pages `translate` lists, as one extent.
        // SAFETY: inside the buffer.
        let addr = unsafe { buffer.as_ptr().add(8) };
        let extents = ram.translate_extents(addr, 3 * PAGE_SIZE - 8).unwrap();
        assert_eq!(
            extents,
            page_extents(&ram.translate(addr, 3 * PAGE_SIZE - 8).unwrap())
        );
        assert_eq!(extents.len(), 1);
    }

    #[test]
    fn translate_lists_each_page() {
        let ram = MemfdRam::new(8 * PAGE_SIZE).unwrap();
        let buf = ram.alloc(3 * PAGE_SIZE, 1).unwrap();
        let gpa = ram.guest_address(buf.as_ptr(), 1).unwrap();
        // SAFETY: offset 100 is inside the buffer.
        let inner = unsafe { buf.as_ptr().add(100) };
        let pages = ram.translate(inner, 2 * PAGE_SIZE).unwrap();
        assert_eq!(
            pages,
            vec![gpa, gpa + PAGE_SIZE as u64, gpa + 2 * PAGE_SIZE as u64]
        );
        assert_eq!(ram.translate(buf.as_ptr(), 1).unwrap(), vec![gpa]);
        assert_eq!(ram.translate(buf.as_ptr(), 0).unwrap(), Vec::<u64>::new());
        let outside = [0u8; 8];
        assert!(ram.translate(outside.as_ptr(), 8).is_err());
        // SAFETY: only an address computation, never dereferenced.
        let end = unsafe { ram.host_base().add(ram.len() - 8) };
        assert!(ram.translate(end, 16).is_err());
    }

    #[test]
    fn bad_sizes_are_refused() {
        assert!(matches!(MemfdRam::new(0), Err(DmaError::BadSize(0))));
        assert!(matches!(MemfdRam::new(100), Err(DmaError::BadSize(100))));
        let ram = MemfdRam::new(PAGE_SIZE).unwrap();
        assert!(matches!(ram.alloc(0, 1), Err(DmaError::BadRequest { .. })));
        assert!(matches!(ram.alloc(1, 3), Err(DmaError::BadRequest { .. })));
    }

    #[test]
    fn a_fork_child_has_no_mapping_of_guest_ram() {
        let ram = MemfdRam::new(4 * PAGE_SIZE).unwrap();
        let buf = ram.alloc(PAGE_SIZE, 1).unwrap();
        // SAFETY: the buffer is ours and nothing else accesses it.
        unsafe { buf.as_mut_ptr().write(7) };
        let base = ram.host_base() as usize;
        let status = vrdma_test_support::fork::in_child(|| {
            // mincore fails with ENOMEM on addresses that are not mapped.
            let mut resident = [0u8; 4];
            // SAFETY: `resident` has one byte per page of the range.
            let rc = unsafe {
                libc::mincore(
                    base as *mut libc::c_void,
                    4 * PAGE_SIZE,
                    resident.as_mut_ptr(),
                )
            };
            let errno = std::io::Error::last_os_error().raw_os_error();
            if rc == -1 && errno == Some(libc::ENOMEM) {
                0
            } else {
                1
            }
        });
        assert_eq!(status, 0, "the child still maps guest RAM");
        // SAFETY: as above.
        assert_eq!(unsafe { buf.as_ptr().read() }, 7, "the parent keeps it");
    }

    #[test]
    fn size_is_sealed() {
        let ram = MemfdRam::new(2 * PAGE_SIZE).unwrap();
        let file = File::from(ram.fd().try_clone_to_owned().unwrap());
        assert!(file.set_len(PAGE_SIZE as u64).is_err());
        assert!(file.set_len(4 * PAGE_SIZE as u64).is_err());
    }
}

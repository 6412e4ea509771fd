//! Page-aligned, zeroed buffers for an rsocket's rings (rdma-core's `forksafe_alloc`): whole
//! pages of their own, so that registering them (which in process mode re-backs the pages,
//! and under `RDMAV_FORK_SAFE` marks them `MADV_DONTFORK`) touches nothing else.

use std::ffi::c_void;
use std::io;
use std::ptr::NonNull;

/// An anonymous mapping of whole pages, unmapped on drop.
pub(crate) struct PageBuf {
    ptr: NonNull<u8>,
    /// Bytes the caller asked for.
    len: usize,
    /// Bytes mapped (whole pages).
    mapped: usize,
}

// SAFETY: the buffer is plain memory owned by this value; access is synchronised by its owner.
unsafe impl Send for PageBuf {}
// SAFETY: as above.
unsafe impl Sync for PageBuf {}

impl PageBuf {
    /// `len` zeroed bytes (at least one page).
    pub(crate) fn new(len: usize) -> io::Result<PageBuf> {
        // SAFETY: sysconf has no memory effects.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let mapped = len.max(1).div_ceil(page) * page;
        // SAFETY: a new private anonymous mapping; no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave NULL"))?;
        Ok(PageBuf { ptr, len, mapped })
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn as_void(&self) -> *mut c_void {
        self.ptr.as_ptr().cast()
    }

    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Copies `src` into the buffer at `offset`.
    ///
    /// Panics if the range is outside the buffer (a bookkeeping bug).
    pub(crate) fn write(&self, offset: usize, src: &[u8]) {
        assert!(offset + src.len() <= self.len, "rsocket buffer overrun");
        // SAFETY: inside the mapping (checked); `src` cannot overlap a mapping we own
        // exclusively for the ring.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.as_ptr().add(offset), src.len())
        };
    }

    /// Copies from the buffer at `offset` into `dst`.
    ///
    /// Panics if the range is outside the buffer (a bookkeeping bug).
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) {
        assert!(offset + dst.len() <= self.len, "rsocket buffer overrun");
        // SAFETY: inside the mapping (checked); the device has finished writing these bytes
        // (their completion was polled before they were counted as data).
        unsafe {
            std::ptr::copy_nonoverlapping(self.as_ptr().add(offset), dst.as_mut_ptr(), dst.len())
        };
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once; its MR was deregistered before (the owner
        // drops the MR first).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) };
    }
}

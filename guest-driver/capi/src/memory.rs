//! Registrable application memory in process mode.
//!
//! The process transport's device reaches only its memfd "guest RAM". Applications written for
//! libibverbs register memory they allocated themselves (malloc, posix_memalign, mmap), so
//! [`AppMemory::make_registrable`] *re-backs* such memory in place: it allocates a
//! page-aligned range of the memfd, copies the current contents of the covering pages into it,
//! and maps that memfd range with `MAP_FIXED | MAP_SHARED` over the same virtual addresses.
//! The application's pointers stay valid and now point at shared memory the device can reach.
//!
//! Which memfd page backs an address is read from `/proc/self/maps` (file offset of the
//! mapping), never from bookkeeping of earlier calls: memory the application unmapped and
//! mapped again is seen as ordinary memory again, and re-backed again.
//!
//! Limits (see the README): whole pages are re-backed; writes by other threads to those pages
//! between the copy and the remap are lost; memfd ranges are never given back while the
//! context lives; the calling thread's own stack cannot be re-backed.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use parking_lot::Mutex;
use vrdma::dma::{DmaBuffer, DmaError, DmaMemory, MemfdRam, PAGE_SIZE};

use crate::fork;
use crate::maps::{read_maps, FileId, Mapping};

/// Why memory could not be made registrable.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RebackError {
    /// A page of the range is not mapped, or not readable.
    #[error("{len:#x} bytes at {addr:#x} are not readable mapped memory")]
    NotMapped { addr: usize, len: usize },
    /// The range lies on the calling thread's stack, which cannot be remapped under it.
    #[error("memory on the calling thread's stack cannot be registered in process mode")]
    OnStack,
    /// The memfd has no room left (see VRDMA_RAM_SIZE).
    #[error(transparent)]
    Dma(#[from] DmaError),
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

impl RebackError {
    pub(crate) fn errno(&self) -> i32 {
        match self {
            RebackError::NotMapped { .. } => libc::EFAULT,
            RebackError::OnStack => libc::EINVAL,
            RebackError::Dma(_) => libc::ENOMEM,
            RebackError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

/// DMA memory of the drop-in: the transport's guest RAM, and application memory re-backed
/// with guest-RAM pages.
pub(crate) struct AppMemory {
    ram: Arc<MemfdRam>,
    memfd: FileId,
    /// Guest-RAM ranges now backing application pages; serialises re-backing.
    kept: Mutex<Vec<DmaBuffer>>,
}

impl AppMemory {
    /// Re-backing with pages of `ram`; registers `ram` with the fork handlers, so that a
    /// `fork()` child gets private copies of what it backs (see [`crate::fork`]), for the rest
    /// of the process's life: re-backed pages stay mappings of the memfd after the context is
    /// closed, and the allocator may hand them out again.
    pub(crate) fn new(ram: Arc<MemfdRam>) -> io::Result<Self> {
        let memfd = FileId::of(&ram.fd())?;
        let base = ram.host_base() as usize;
        fork::register_ram(memfd, base..base + ram.len());
        Ok(AppMemory {
            ram,
            memfd,
            kept: Mutex::new(Vec::new()),
        })
    }

    fn is_ours(&self, m: &Mapping) -> bool {
        self.memfd.maps(m)
    }

    /// Makes `[addr, addr + len)` registrable: every covering page that is not already a page
    /// of this guest RAM is re-backed by one, keeping its contents and protection.
    pub(crate) fn make_registrable(&self, addr: usize, len: usize) -> Result<(), RebackError> {
        let not_mapped = RebackError::NotMapped { addr, len };
        if len == 0 {
            return Err(not_mapped);
        }
        let start = addr & !(PAGE_SIZE - 1);
        let end = addr
            .checked_add(len)
            .and_then(|e| e.checked_next_multiple_of(PAGE_SIZE))
            .ok_or(RebackError::NotMapped { addr, len })?;
        let mut kept = self.kept.lock();
        // No fork() between reading the maps and the remaps: the child's copies are planned
        // from the maps.
        let _no_fork = fork::hold_fork();
        let maps = read_maps().map_err(|source| RebackError::Io {
            what: "reading /proc/self/maps",
            source,
        })?;
        let here = &maps as *const _ as usize;
        // Check the whole range before changing anything.
        let mut runs = Vec::new();
        let mut cursor = start;
        for m in maps.iter().filter(|m| m.end > start && m.start < end) {
            if m.start > cursor {
                return Err(not_mapped);
            }
            let run_end = m.end.min(end);
            if !self.is_ours(m) {
                if m.prot & libc::PROT_READ == 0 {
                    return Err(not_mapped);
                }
                if (m.start..m.end).contains(&here) {
                    return Err(RebackError::OnStack);
                }
                runs.push((cursor, run_end - cursor, m.prot));
            }
            cursor = run_end;
        }
        if cursor < end {
            return Err(not_mapped);
        }
        kept.reserve(runs.len());
        for (run_start, run_len, prot) in runs {
            kept.push(self.reback(run_start, run_len, prot)?);
        }
        Ok(())
    }

    /// Replaces the pages `[start, start + len)` (one mapping, protection `prot`) by a new
    /// guest-RAM range holding the same bytes; returns that range.
    fn reback(&self, start: usize, len: usize, prot: i32) -> Result<DmaBuffer, RebackError> {
        let buffer = self.ram.alloc(len, PAGE_SIZE)?;
        let gpa = self.ram.guest_address(buffer.as_ptr(), len)?;
        let offset = libc::off_t::try_from(gpa - self.ram.guest_base()).map_err(|_| {
            RebackError::Dma(DmaError::NotDmaMemory {
                addr: buffer.as_ptr() as usize,
                len,
            })
        })?;
        // From the copy to the remap nothing may allocate or write these pages: they may hold
        // this process's heap.
        // SAFETY: `[start, start + len)` is mapped readable (checked against /proc/self/maps
        // under the lock); `buffer` is a fresh guest-RAM range of at least `len` bytes that
        // nothing else uses.
        unsafe { std::ptr::copy_nonoverlapping(start as *const u8, buffer.as_mut_ptr(), len) };
        // SAFETY: replaces exactly the pages just copied, which belong to one existing
        // mapping, with a shared mapping of the guest-RAM range holding the same bytes; the
        // addresses stay valid memory with the same protection.
        let mapped = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                len,
                prot,
                libc::MAP_SHARED | libc::MAP_FIXED,
                self.ram.fd().as_raw_fd(),
                offset,
            )
        };
        if mapped == libc::MAP_FAILED {
            return Err(RebackError::Io {
                what: "mapping guest RAM over application memory",
                source: io::Error::last_os_error(),
            });
        }
        log::debug!("vrdma: re-backed {len:#x} bytes at {start:#x} with guest RAM {gpa:#x}");
        Ok(buffer)
    }

    /// Guest-physical address of each page of `[addr, addr + len)`, which must be guest RAM
    /// (its own mapping, or pages re-backed by [`Self::make_registrable`]).
    fn translate_pages(&self, addr: usize, len: usize) -> Result<Vec<u64>, DmaError> {
        if let Ok(pages) = self.ram.translate(addr as *const u8, len) {
            return Ok(pages);
        }
        let not_dma = DmaError::NotDmaMemory { addr, len };
        let start = addr & !(PAGE_SIZE - 1);
        let end = addr
            .checked_add(len)
            .and_then(|e| e.checked_next_multiple_of(PAGE_SIZE))
            .ok_or(DmaError::NotDmaMemory { addr, len })?;
        let maps = read_maps().map_err(|_| DmaError::NotDmaMemory { addr, len })?;
        let mut pages = Vec::with_capacity((end - start) / PAGE_SIZE);
        for page in (start..end).step_by(PAGE_SIZE) {
            let m = maps
                .iter()
                .find(|m| (m.start..m.end).contains(&page))
                .filter(|m| self.is_ours(m))
                .ok_or(DmaError::NotDmaMemory { addr, len })?;
            let file_offset = m.offset + (page - m.start) as u64;
            if file_offset >= self.ram.len() as u64 {
                return Err(not_dma);
            }
            pages.push(self.ram.guest_base() + file_offset);
        }
        Ok(pages)
    }
}

impl DmaMemory for AppMemory {
    fn alloc(&self, len: usize, align: usize) -> Result<DmaBuffer, DmaError> {
        self.ram.alloc(len, align)
    }

    fn translate(&self, addr: *const u8, len: usize) -> Result<Vec<u64>, DmaError> {
        self.translate_pages(addr as usize, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct PosixMemalign(*mut u8, usize);

    impl PosixMemalign {
        fn new(len: usize) -> Self {
            let mut ptr = std::ptr::null_mut();
            // SAFETY: valid out pointer, power-of-two alignment.
            assert_eq!(unsafe { libc::posix_memalign(&mut ptr, PAGE_SIZE, len) }, 0);
            PosixMemalign(ptr.cast(), len)
        }
        fn bytes(&mut self) -> &mut [u8] {
            // SAFETY: the allocation is `len` bytes, alive and borrowed exclusively.
            unsafe { std::slice::from_raw_parts_mut(self.0, self.1) }
        }
    }

    impl Drop for PosixMemalign {
        fn drop(&mut self) {
            // SAFETY: allocated by posix_memalign; the pages stay valid memory after re-backing.
            unsafe { libc::free(self.0.cast()) };
        }
    }

    fn maps_line_of(addr: usize) -> String {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .find(|l| Mapping::parse(l).is_some_and(|m| (m.start..m.end).contains(&addr)))
            .unwrap()
            .to_owned()
    }

    #[test]
    fn rebacking_keeps_contents_and_shares_the_pages_with_guest_ram() {
        let ram = MemfdRam::new(64 * PAGE_SIZE).unwrap();
        let memory = AppMemory::new(ram.clone()).unwrap();
        let mut buf = PosixMemalign::new(3 * PAGE_SIZE);
        for (i, b) in buf.bytes().iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        let addr = buf.0 as usize;
        assert!(
            memory.translate_pages(addr, 100).is_err(),
            "heap memory is not guest RAM yet"
        );
        // An unaligned range inside the buffer re-backs all three pages.
        memory
            .make_registrable(addr + 10, 2 * PAGE_SIZE + 100)
            .unwrap();
        assert!(buf
            .bytes()
            .iter()
            .enumerate()
            .all(|(i, &b)| b == (i * 7 + 3) as u8));
        let line = maps_line_of(addr);
        assert!(line.contains("/memfd:vrdma-guest-ram"), "{line}");
        let pages = memory.translate_pages(addr, 3 * PAGE_SIZE).unwrap();
        assert_eq!(pages.len(), 3);
        assert!(pages.windows(2).all(|w| w[1] == w[0] + PAGE_SIZE as u64));
        // The application's pointer and guest RAM now name the same bytes.
        let in_ram = ram.host_base() as usize + (pages[1] - ram.guest_base()) as usize;
        buf.bytes()[PAGE_SIZE + 5] = 0xEE;
        // SAFETY: `in_ram` is inside the guest-RAM mapping (translated above).
        assert_eq!(unsafe { *((in_ram + 5) as *const u8) }, 0xEE);
        // A second registration re-backs nothing more.
        let before = memory.kept.lock().len();
        memory.make_registrable(addr, 3 * PAGE_SIZE).unwrap();
        assert_eq!(memory.kept.lock().len(), before);
    }

    #[test]
    fn unmapped_unreadable_and_stack_memory_are_refused() {
        let ram = MemfdRam::new(16 * PAGE_SIZE).unwrap();
        let memory = AppMemory::new(ram).unwrap();
        // Unmapped: the first page of the address space lies below vm.mmap_min_addr (at
        // least one page), where nothing can be mapped. A range freed with munmap would not
        // do: other test threads may map into it between the munmap and the check.
        assert!(matches!(
            memory.make_registrable(16, 8),
            Err(RebackError::NotMapped { .. })
        ));
        // Mapped but unreadable: a PROT_NONE reservation this test holds until the end.
        // SAFETY: a fresh anonymous mapping, only its address is used, unmapped below.
        let reserved = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * PAGE_SIZE,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(reserved, libc::MAP_FAILED);
        let refused = memory.make_registrable(reserved as usize + 16, 8);
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(reserved, 2 * PAGE_SIZE) };
        assert!(matches!(refused, Err(RebackError::NotMapped { .. })));
        let on_stack = [0u8; 64];
        assert!(matches!(
            memory.make_registrable(on_stack.as_ptr() as usize, on_stack.len()),
            Err(RebackError::OnStack)
        ));
    }

    /// Whether the page at `addr` is mapped (mincore fails with ENOMEM where it is not).
    fn mapped(addr: usize) -> bool {
        let mut resident = 0u8;
        // SAFETY: one page, one byte of result.
        unsafe { libc::mincore(addr as *mut libc::c_void, PAGE_SIZE, &mut resident) == 0 }
    }

    /// The `/proc/self/maps` line of `addr` names the guest-RAM memfd.
    fn backed_by_guest_ram(addr: usize) -> bool {
        Mapping::parse(&maps_line_of(addr)).is_some_and(|m| m.prot != 0)
            && maps_line_of(addr).contains("/memfd:vrdma-guest-ram")
    }

    #[test]
    fn a_fork_child_gets_private_copies_and_the_parent_keeps_guest_ram() {
        let ram = MemfdRam::new(64 * PAGE_SIZE).unwrap();
        let memory = AppMemory::new(ram.clone()).unwrap();
        let mut buf = PosixMemalign::new(2 * PAGE_SIZE);
        buf.bytes().fill(0x11);
        let addr = buf.0 as usize;
        memory.make_registrable(addr, 2 * PAGE_SIZE).unwrap();
        let pages = memory.translate_pages(addr, 2 * PAGE_SIZE).unwrap();
        let in_ram = ram.host_base() as usize + (pages[0] - ram.guest_base()) as usize;

        let status = vrdma_test_support::fork::in_child(|| {
            // SAFETY: the buffer is inherited (private now) and nothing else uses it here.
            let bytes = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, 2 * PAGE_SIZE) };
            if bytes.iter().any(|&b| b != 0x11) {
                return 1; // the contents did not come along
            }
            bytes.fill(0x22);
            // Guest RAM itself is not mapped in the child.
            if mapped(in_ram) {
                return 2;
            }
            0
        });
        assert_eq!(status, 0);
        assert!(
            buf.bytes().iter().all(|&b| b == 0x11),
            "the child's writes reached the parent's registered buffer"
        );
        // The parent's pages are still the device's: same guest RAM, coherent both ways.
        assert!(backed_by_guest_ram(addr));
        assert_eq!(memory.translate_pages(addr, 2 * PAGE_SIZE).unwrap(), pages);
        buf.bytes()[7] = 0x33;
        // SAFETY: `in_ram` is inside the guest-RAM mapping (translated above).
        assert_eq!(unsafe { *((in_ram + 7) as *const u8) }, 0x33);

        // The context gone, the pages are still the memfd's (and, freed, may become the
        // allocator's): children still get copies.
        drop(memory);
        drop(ram);
        assert!(backed_by_guest_ram(addr));
        let status = vrdma_test_support::fork::in_child(|| {
            // SAFETY: inherited (private) memory nothing else uses here.
            unsafe { (addr as *mut u8).write_bytes(0x55, 2 * PAGE_SIZE) };
            0
        });
        assert_eq!(status, 0);
        assert_eq!(buf.bytes()[0], 0x11);
    }

    #[test]
    fn a_fork_child_gets_private_copies_of_read_only_rebacked_memory() {
        let ram = MemfdRam::new(16 * PAGE_SIZE).unwrap();
        let memory = AppMemory::new(ram).unwrap();
        let mut buf = PosixMemalign::new(PAGE_SIZE);
        buf.bytes().fill(0x44);
        let addr = buf.0 as usize;
        memory.make_registrable(addr, PAGE_SIZE).unwrap();
        // SAFETY: the page is ours; made read-only for this test, writable again below.
        let read_only = unsafe { libc::mprotect(buf.0.cast(), PAGE_SIZE, libc::PROT_READ) };
        assert_eq!(read_only, 0);
        let status = vrdma_test_support::fork::in_child(|| {
            let line = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
            let own = line
                .lines()
                .filter_map(Mapping::parse)
                .find(|m| (m.start..m.end).contains(&addr));
            match own {
                // Private (not the memfd), still read-only, same bytes.
                Some(m) if m.inode == 0 && m.prot == libc::PROT_READ => {
                    // SAFETY: mapped readable in the child.
                    i32::from(unsafe { *(addr as *const u8) } != 0x44)
                }
                _ => 2,
            }
        });
        // SAFETY: as above.
        let writable =
            unsafe { libc::mprotect(buf.0.cast(), PAGE_SIZE, libc::PROT_READ | libc::PROT_WRITE) };
        assert_eq!(writable, 0);
        assert_eq!(status, 0);
        assert!(backed_by_guest_ram(addr));
    }

    #[test]
    fn the_memfd_running_out_is_an_allocation_error() {
        let ram = MemfdRam::new(2 * PAGE_SIZE).unwrap();
        let memory = AppMemory::new(ram).unwrap();
        let buf = PosixMemalign::new(4 * PAGE_SIZE);
        let err = memory
            .make_registrable(buf.0 as usize, 4 * PAGE_SIZE)
            .unwrap_err();
        assert_eq!(err.errno(), libc::ENOMEM);
    }
}

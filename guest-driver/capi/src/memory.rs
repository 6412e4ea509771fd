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

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use parking_lot::Mutex;
use vrdma::dma::{DmaBuffer, DmaError, DmaMemory, MemfdRam, GUEST_RAM_BASE, PAGE_SIZE};

/// One line of `/proc/self/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Mapping {
    start: usize,
    end: usize,
    prot: i32,
    offset: u64,
    dev: (u32, u32),
    inode: u64,
}

impl Mapping {
    fn parse(line: &str) -> Option<Mapping> {
        let mut fields = line.split_ascii_whitespace();
        let (start, end) = fields.next()?.split_once('-')?;
        let perms = fields.next()?.as_bytes();
        let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
        let (major, minor) = fields.next()?.split_once(':')?;
        let inode = fields.next()?.parse().ok()?;
        let flag = |i: usize, c: u8, bit: i32| if perms.get(i) == Some(&c) { bit } else { 0 };
        Some(Mapping {
            start: usize::from_str_radix(start, 16).ok()?,
            end: usize::from_str_radix(end, 16).ok()?,
            prot: flag(0, b'r', libc::PROT_READ)
                | flag(1, b'w', libc::PROT_WRITE)
                | flag(2, b'x', libc::PROT_EXEC),
            offset,
            dev: (
                u32::from_str_radix(major, 16).ok()?,
                u32::from_str_radix(minor, 16).ok()?,
            ),
            inode,
        })
    }
}

/// The mappings of this process, in address order.
fn read_maps() -> io::Result<Vec<Mapping>> {
    let text = fs::read_to_string("/proc/self/maps")?;
    Ok(text.lines().filter_map(Mapping::parse).collect())
}

/// Identity of a file as `/proc/self/maps` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileId {
    dev: (u32, u32),
    inode: u64,
}

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
    pub(crate) fn new(ram: Arc<MemfdRam>) -> io::Result<Self> {
        // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: the fd is open for the life of `ram`; `st` is a valid out pointer.
        if unsafe { libc::fstat(ram.fd().as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let memfd = FileId {
            dev: (libc::major(st.st_dev), libc::minor(st.st_dev)),
            inode: st.st_ino,
        };
        Ok(AppMemory {
            ram,
            memfd,
            kept: Mutex::new(Vec::new()),
        })
    }

    fn is_ours(&self, m: &Mapping) -> bool {
        FileId {
            dev: m.dev,
            inode: m.inode,
        } == self.memfd
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
        let offset = libc::off_t::try_from(gpa - GUEST_RAM_BASE).map_err(|_| {
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
            pages.push(GUEST_RAM_BASE + file_offset);
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
        fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .find(|l| Mapping::parse(l).is_some_and(|m| (m.start..m.end).contains(&addr)))
            .unwrap()
            .to_owned()
    }

    #[test]
    fn maps_lines_parse() {
        let m = Mapping::parse(
            "7f12a0000000-7f12a0021000 rw-s 00003000 00:01 2051    /memfd:vrdma (deleted)",
        )
        .unwrap();
        assert_eq!((m.start, m.end), (0x7f12a0000000, 0x7f12a0021000));
        assert_eq!(m.prot, libc::PROT_READ | libc::PROT_WRITE);
        assert_eq!((m.offset, m.dev, m.inode), (0x3000, (0, 1), 2051));
        let anon = Mapping::parse("55d0c4a00000-55d0c4a21000 r-xp 00000000 fd:01 0").unwrap();
        assert_eq!(anon.prot, libc::PROT_READ | libc::PROT_EXEC);
        assert_eq!(anon.dev, (0xfd, 1));
        assert!(Mapping::parse("garbage").is_none());
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
        let in_ram = ram.host_base() as usize + (pages[1] - GUEST_RAM_BASE) as usize;
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

//! Memory the agent hands to processes for the device to reach, when it shares one PCI
//! function among them: a memfd the agent maps, pins for the long term and resolves to
//! guest-physical addresses.
//!
//! The pin is an io_uring fixed-buffer registration of the agent's mapping
//! (`IORING_REGISTER_BUFFERS`): the kernel pins every page with `FOLL_LONGTERM` (Linux 6.1,
//! `io_uring/rsrc.c`, `io_pin_pages`), which first moves pages out of movable zones and CMA,
//! then keeps them from migrating, being reclaimed or being freed for as long as the ring
//! lives, without a kernel module. That is what makes handing guest-physical addresses to the
//! device safe although a process holds the memfd: a process that punches a hole in it
//! (`fallocate`) removes the page from the file, but the pinned page is not freed (its
//! reference count stays up) until the agent has destroyed the process's MRs and closed the
//! ring; the process only loses its own view of it. Addresses are therefore read from
//! `/proc/self/pagemap` after the pin.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use vrdma::dma::{DmaError, MemfdRam, RamPages, PAGE_SIZE};
use vrdma::transport::pci::pagemap::{Pagemap, PagemapReadError};

/// Why memory could not be made reachable.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    /// The memfd could not be created or mapped.
    #[error("cannot allocate {len:#x} bytes of process memory: {source}")]
    Allocate {
        len: usize,
        #[source]
        source: DmaError,
    },
    /// io_uring could not pin it.
    #[error("cannot pin process memory for the device (io_uring): {0}")]
    Pin(#[source] io::Error),
    /// Its guest-physical addresses could not be read.
    #[error("cannot resolve process memory to guest-physical addresses: {0}")]
    Resolve(#[from] PagemapReadError),
}

/// A memfd mapped by the agent, pinned, with the guest-physical address of each 4 KiB page.
pub struct PinnedMemory {
    // Declared first, so dropped first: the pin ends before the agent's mapping does.
    _pin: LongTermPin,
    ram: Arc<MemfdRam>,
    pages: Vec<u64>,
}

impl PinnedMemory {
    /// `len` bytes (a multiple of the page size of `pages`), zeroed, pinned and resolved.
    pub fn new(len: usize, pages: RamPages) -> Result<Self, PinError> {
        let ram = MemfdRam::with_pages(len, pages)
            .map_err(|source| PinError::Allocate { len, source })?;
        let pin = LongTermPin::new(ram.host_base(), ram.len()).map_err(PinError::Pin)?;
        let guest_pages = Pagemap::open()
            .map_err(PagemapReadError::Io)?
            .translate(ram.host_base() as usize, ram.len())?;
        Ok(PinnedMemory {
            _pin: pin,
            ram,
            pages: guest_pages,
        })
    }

    /// The memfd and the agent's mapping of it.
    pub fn ram(&self) -> &Arc<MemfdRam> {
        &self.ram
    }

    /// Guest-physical address of each 4 KiB page, in memfd order.
    pub fn guest_pages(&self) -> &[u64] {
        &self.pages
    }

    /// The guest-physical address of the first page, if the whole memory is contiguous.
    pub fn contiguous_address(&self) -> Option<u64> {
        let first = *self.pages.first()?;
        self.pages
            .iter()
            .enumerate()
            .all(|(i, &page)| page == first + (i * PAGE_SIZE) as u64)
            .then_some(first)
    }
}

/// Largest buffer one io_uring registration entry may cover (`io_buffer_validate`).
const MAX_PIN_CHUNK: usize = 1 << 30;

/// `IORING_REGISTER_BUFFERS` (include/uapi/linux/io_uring.h).
const IORING_REGISTER_BUFFERS: libc::c_uint = 0;

/// The io_uring whose fixed buffers pin a range; closing it unpins.
struct LongTermPin {
    _ring: OwnedFd,
}

impl LongTermPin {
    fn new(base: *mut u8, len: usize) -> io::Result<Self> {
        // struct io_uring_params: 120 bytes the kernel fills in; all zero asks for defaults.
        let mut params = [0u64; 15];
        // SAFETY: io_uring_setup reads and writes the 120-byte params buffer on the stack.
        let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor that nothing else owns.
        let ring = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let iovecs: Vec<libc::iovec> = (0..len)
            .step_by(MAX_PIN_CHUNK)
            .map(|offset| libc::iovec {
                // SAFETY: `offset < len`: inside the caller's mapping.
                iov_base: unsafe { base.add(offset) }.cast(),
                iov_len: (len - offset).min(MAX_PIN_CHUNK),
            })
            .collect();
        // SAFETY: the iovecs describe the caller's mapping, which stays mapped while the ring
        // lives (`PinnedMemory` drops the pin first); the kernel only reads the array.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_io_uring_register,
                fd as libc::c_int,
                IORING_REGISTER_BUFFERS,
                iovecs.as_ptr(),
                iovecs.len() as libc::c_uint,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(LongTermPin { _ring: ring })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_memory_is_resolved_page_by_page() {
        let memory = PinnedMemory::new(64 * PAGE_SIZE, RamPages::Small).unwrap();
        let pages = memory.guest_pages();
        assert_eq!(pages.len(), 64);
        assert!(pages.iter().all(|&p| p != 0 && p % PAGE_SIZE as u64 == 0));
        // Distinct pages.
        let mut sorted = pages.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 64);
    }

    #[test]
    fn a_punched_hole_does_not_free_a_pinned_page() {
        let memory = PinnedMemory::new(4 * PAGE_SIZE, RamPages::Small).unwrap();
        let before = memory.guest_pages()[1];
        // SAFETY: page 1 of the agent's own mapping.
        unsafe { memory.ram().host_base().add(PAGE_SIZE).write(0x5a) };
        // What a process holding the memfd could do.
        // SAFETY: fallocate on the memfd we own.
        let rc = unsafe {
            libc::fallocate(
                std::os::fd::AsRawFd::as_raw_fd(&memory.ram().fd()),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                PAGE_SIZE as libc::off_t,
                PAGE_SIZE as libc::off_t,
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        // The next touch faults a new page into the file (and the agent's mapping); the
        // pinned page, the one the device was given, is not freed, so it cannot be that one.
        // SAFETY: page 1 of the agent's own mapping.
        let reread = unsafe {
            let page = memory.ram().host_base().add(PAGE_SIZE);
            let old = page.read_volatile();
            page.write_volatile(0x77);
            old
        };
        assert_eq!(reread, 0, "the hole reads as zeroes");
        let now = Pagemap::open()
            .unwrap()
            .translate(memory.ram().host_base() as usize + PAGE_SIZE, PAGE_SIZE)
            .unwrap();
        assert_ne!(now[0], before, "the pinned page was freed and reused");
    }
}

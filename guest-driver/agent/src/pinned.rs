//! Memory the agent hands to processes for the device to reach, when it shares one PCI
//! function among them: a memfd the agent maps, pins for the long term where a registration
//! needs it, and resolves to guest-physical addresses.
//!
//! A process's memory ([`ProcessMemory`]) is pinned on demand: the pages of each registration
//! when it is made ([`ProcessMemory::pin`]), charged to the process's user first
//! ([`PinBudget`]), unpinned when it goes. The doorbell area ([`PinnedMemory`]) is pinned whole.
//!
//! A pin is an io_uring fixed-buffer registration of the agent's mapping
//! (`IORING_REGISTER_BUFFERS`): the kernel pins every page with `FOLL_LONGTERM` (Linux 6.1,
//! `io_uring/rsrc.c`, `io_pin_pages`), which first moves pages out of movable zones and CMA,
//! then keeps them from migrating, being reclaimed or being freed for as long as the ring
//! lives, without a kernel module. That is what makes handing guest-physical addresses to the
//! device safe although a process holds the memfd: a process that punches a hole in it
//! (`fallocate`) removes the page from the file, but the pinned page is not freed (its
//! reference count stays up) until the agent has destroyed the process's MRs and closed the
//! ring; the process only loses its own view of it. Addresses are therefore read from
//! `/proc/self/pagemap` after the pin, without touching the memory in between: if the process
//! punched a hole meanwhile, the agent's page table entry is gone (pagemap says not present,
//! and the registration is refused) rather than pointing at a page that is not pinned.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use parking_lot::Mutex;
use vrdma::dma::{DmaError, MemfdRam, RamPages, PAGE_SIZE};
use vrdma::transport::pci::pagemap::{Pagemap, PagemapReadError};
use vrdma_guestd::pin_budget::{OverBudget, PinBudget, PinCharge};
use vrdma_guestd::translate::ProcessRam;
use vrdma_spec::Status;

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
    /// Its user, or the agent, has pinned as much as it may.
    #[error(transparent)]
    OverBudget(#[from] OverBudget),
    /// Every entry of the process's pin table is in use.
    #[error("the process has {0} pinned ranges, as many as it may")]
    TableFull(u32),
}

impl PinError {
    /// The status a process is answered with: `NO_MEMORY` (`ENOMEM`), or `BAD_ADDRESS` when
    /// the memory was not there to pin (a hole the process punched).
    pub fn status(&self) -> Status {
        match self {
            PinError::Resolve(_) => Status::BadAddress,
            PinError::Pin(e) if e.raw_os_error() == Some(libc::EFAULT) => Status::BadAddress,
            _ => Status::NoMemory,
        }
    }
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

/// `IORING_REGISTER_BUFFERS`, `IORING_REGISTER_BUFFERS2`, `IORING_REGISTER_BUFFERS_UPDATE`
/// and `IORING_RSRC_REGISTER_SPARSE` (include/uapi/linux/io_uring.h; sparse tables since
/// Linux 5.19).
const IORING_REGISTER_BUFFERS: libc::c_uint = 0;
const IORING_REGISTER_BUFFERS2: libc::c_uint = 15;
const IORING_REGISTER_BUFFERS_UPDATE: libc::c_uint = 16;
const IORING_RSRC_REGISTER_SPARSE: u32 = 1;

/// `struct io_uring_rsrc_register`.
#[repr(C)]
struct RsrcRegister {
    nr: u32,
    flags: u32,
    resv2: u64,
    data: u64,
    tags: u64,
}

/// `struct io_uring_rsrc_update2`.
#[repr(C)]
struct RsrcUpdate2 {
    offset: u32,
    resv: u32,
    data: u64,
    tags: u64,
    nr: u32,
    resv2: u32,
}

/// A new io_uring with one submission entry (only its buffer table is used).
fn new_ring() -> io::Result<OwnedFd> {
    // struct io_uring_params: 120 bytes the kernel fills in; all zero asks for defaults.
    let mut params = [0u64; 15];
    // SAFETY: io_uring_setup reads and writes the 120-byte params buffer on the stack.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `io_uring_register(ring, opcode, arg, nr)`.
///
/// # Safety
/// `arg` must be what `opcode` reads, with `nr` as the kernel expects; every buffer it names
/// must stay mapped while the ring holds it.
unsafe fn register(
    ring: &OwnedFd,
    opcode: libc::c_uint,
    arg: *const libc::c_void,
    nr: usize,
) -> io::Result<()> {
    // SAFETY: the caller's contract.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_io_uring_register,
            ring.as_raw_fd(),
            opcode,
            arg,
            nr as libc::c_uint,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The io_uring whose fixed buffers pin a range; closing it unpins.
struct LongTermPin {
    _ring: OwnedFd,
}

impl LongTermPin {
    fn new(base: *mut u8, len: usize) -> io::Result<Self> {
        let ring = new_ring()?;
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
        unsafe {
            register(
                &ring,
                IORING_REGISTER_BUFFERS,
                iovecs.as_ptr().cast(),
                iovecs.len(),
            )?
        };
        Ok(LongTermPin { _ring: ring })
    }
}

/// One process's pins: an io_uring whose sparse fixed-buffer table has an entry per pinned
/// range (at most [`MAX_PIN_CHUNK`] each), so that a process costs one descriptor whatever it
/// registers. Setting an entry pins its pages, clearing it unpins them.
struct PinTable {
    ring: OwnedFd,
    entries: u32,
    free: Mutex<Vec<u32>>,
}

/// An entry of a [`PinTable`] holding a pinned range; dropping it unpins.
struct PinEntry {
    table: Arc<PinTable>,
    index: u32,
}

impl PinTable {
    fn new(entries: u32) -> io::Result<Arc<Self>> {
        let ring = new_ring()?;
        let sparse = RsrcRegister {
            nr: entries,
            flags: IORING_RSRC_REGISTER_SPARSE,
            resv2: 0,
            data: 0,
            tags: 0,
        };
        // SAFETY: a sparse table names no buffer; the kernel reads the struct on the stack.
        unsafe {
            register(
                &ring,
                IORING_REGISTER_BUFFERS2,
                (&raw const sparse).cast(),
                size_of::<RsrcRegister>(),
            )?
        };
        Ok(Arc::new(PinTable {
            ring,
            entries,
            free: Mutex::new((0..entries).rev().collect()),
        }))
    }

    /// Sets entry `index` to `iovec` (an empty one clears it).
    ///
    /// # Safety
    /// A non-empty `iovec` must lie in memory mapped now.
    unsafe fn set(&self, index: u32, iovec: libc::iovec) -> io::Result<()> {
        let update = RsrcUpdate2 {
            offset: index,
            resv: 0,
            data: (&raw const iovec) as u64,
            tags: 0,
            nr: 1,
            resv2: 0,
        };
        // SAFETY: one iovec, as the caller promises; the kernel reads both structs.
        unsafe {
            register(
                &self.ring,
                IORING_REGISTER_BUFFERS_UPDATE,
                (&raw const update).cast(),
                size_of::<RsrcUpdate2>(),
            )
        }
    }

    /// Pins `len` bytes (at most [`MAX_PIN_CHUNK`]) at `base` in a free entry.
    ///
    /// # Safety
    /// The range must be mapped now. (The entry holds the pages the mapping had, not the
    /// mapping: unmapping it later unpins nothing.)
    unsafe fn pin(self: &Arc<Self>, base: *mut u8, len: usize) -> Result<PinEntry, PinError> {
        let index = self
            .free
            .lock()
            .pop()
            .ok_or(PinError::TableFull(self.entries))?;
        let iovec = libc::iovec {
            iov_base: base.cast(),
            iov_len: len,
        };
        // SAFETY: the caller's contract.
        if let Err(e) = unsafe { self.set(index, iovec) } {
            self.free.lock().push(index);
            return Err(PinError::Pin(e));
        }
        Ok(PinEntry {
            table: self.clone(),
            index,
        })
    }
}

impl Drop for PinEntry {
    fn drop(&mut self) {
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        // SAFETY: an empty iovec names no memory.
        match unsafe { self.table.set(self.index, empty) } {
            Ok(()) => self.table.free.lock().push(self.index),
            // The entry stays set (its pages pinned, never reused) and out of the free list.
            Err(e) => log::warn!("cannot unpin entry {}: {e}", self.index),
        }
    }
}

/// A process's registrable memory: a memfd the agent maps and the process names by process
/// addresses from `base`, pinned only where its registrations need it.
pub struct ProcessMemory {
    ram: Arc<MemfdRam>,
    base: u64,
    table: Arc<PinTable>,
    pagemap: Pagemap,
    budget: Arc<PinBudget>,
    uid: u32,
}

/// The pages of one registration, pinned and charged, with their guest-physical addresses;
/// dropping it unpins them and gives the charge back.
pub struct RegistrationPin {
    // Declared first, so dropped first: the pages are unpinned before the charge goes.
    _entries: Vec<PinEntry>,
    charge: PinCharge,
    /// Each pinned run's process address and the guest-physical address of each of its pages,
    /// in address order.
    runs: Vec<(u64, Vec<u64>)>,
}

impl ProcessMemory {
    /// `len` bytes of memory for a process of user `uid`, at process address `base`, nothing
    /// pinned; at most `entries` pinned ranges at once (a registration takes one per run of
    /// consecutive pages, per GiB).
    pub fn new(
        len: usize,
        base: u64,
        uid: u32,
        budget: Arc<PinBudget>,
        entries: u32,
    ) -> Result<Self, PinError> {
        let ram = MemfdRam::with_pages(len, RamPages::Small)
            .map_err(|source| PinError::Allocate { len, source })?;
        let table = PinTable::new(entries).map_err(PinError::Pin)?;
        let pagemap = Pagemap::open().map_err(PagemapReadError::Io)?;
        Ok(ProcessMemory {
            ram,
            base,
            table,
            pagemap,
            budget,
            uid,
        })
    }

    /// The memfd and the agent's mapping of it.
    pub fn ram(&self) -> &Arc<MemfdRam> {
        &self.ram
    }

    /// The memory as the process names it.
    pub fn process_ram(&self) -> ProcessRam {
        ProcessRam::new(self.base, (self.ram.len() / PAGE_SIZE) as u64)
    }

    /// Pins `runs` (process address, bytes; page aligned, inside the memory, as
    /// `Registration::runs` gives them), charging their bytes first.
    pub fn pin(&self, runs: &[(u64, u64)]) -> Result<RegistrationPin, PinError> {
        let bytes = runs.iter().map(|&(_, len)| len).sum();
        let charge = self.budget.charge(self.uid, bytes)?;
        let mut entries = Vec::with_capacity(runs.len());
        let mut resolved = Vec::with_capacity(runs.len());
        for &(start, len) in runs {
            let offset = start
                .checked_sub(self.base)
                .filter(|offset| offset.saturating_add(len) <= self.ram.len() as u64)
                .ok_or(PinError::Pin(io::Error::from_raw_os_error(libc::EFAULT)))?
                as usize;
            // SAFETY: inside the agent's mapping of the memfd, checked just above.
            let host = unsafe { self.ram.host_base().add(offset) };
            for chunk in (0..len as usize).step_by(MAX_PIN_CHUNK) {
                let chunk_len = (len as usize - chunk).min(MAX_PIN_CHUNK);
                // SAFETY: inside the agent's mapping, which `self` holds.
                entries.push(unsafe { self.table.pin(host.add(chunk), chunk_len)? });
            }
            // Read only now, after the pin, and nothing touched the memory in between.
            resolved.push((start, self.pagemap.translate(host as usize, len as usize)?));
        }
        Ok(RegistrationPin {
            _entries: entries,
            charge,
            runs: resolved,
        })
    }
}

impl RegistrationPin {
    /// The guest-physical address of the pinned 4 KiB page at process address `addr`.
    pub fn guest_page(&self, addr: u64) -> Option<u64> {
        let at = self.runs.partition_point(|(start, _)| *start <= addr);
        let (start, pages) = self.runs.get(at.checked_sub(1)?)?;
        pages
            .get(usize::try_from((addr - start) / PAGE_SIZE as u64).ok()?)
            .copied()
            .filter(|_| (addr - start).is_multiple_of(PAGE_SIZE as u64))
    }

    /// Bytes pinned (and charged).
    pub fn bytes(&self) -> u64 {
        self.charge.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_memory_is_resolved_page_by_page() {
        let memory = PinnedMemory::new(64 * PAGE_SIZE, RamPages::Small).unwrap();
        let pages = &memory.pages;
        assert_eq!(pages.len(), 64);
        assert!(pages.iter().all(|&p| p != 0 && p % PAGE_SIZE as u64 == 0));
        // Distinct pages.
        let mut sorted = pages.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 64);
    }

    const MIB: u64 = 1 << 20;

    fn process_memory(budget: u64, entries: u32) -> ProcessMemory {
        let limits = vrdma_guestd::pin_budget::PinLimits {
            per_user: budget,
            total: budget,
        };
        ProcessMemory::new(
            4 * MIB as usize,
            GUEST_BASE,
            1000,
            PinBudget::new(limits),
            entries,
        )
        .unwrap()
    }

    const GUEST_BASE: u64 = 1 << 30;
    const PAGE: u64 = PAGE_SIZE as u64;

    fn resident(memory: &ProcessMemory, offset: usize) -> bool {
        // SAFETY: only the address is formed; the memory is not touched.
        let addr = unsafe { memory.ram().host_base().add(offset) } as usize;
        memory.pagemap.translate(addr, PAGE_SIZE).is_ok()
    }

    #[test]
    fn process_memory_is_pinned_only_where_registrations_need_it() {
        let memory = process_memory(MIB, 8);
        assert!(
            !resident(&memory, 0),
            "nothing is allocated before a registration"
        );
        // Two runs: pages 1..3 and 10.
        let pin = memory
            .pin(&[
                (GUEST_BASE + PAGE, 2 * PAGE),
                (GUEST_BASE + 10 * PAGE, PAGE),
            ])
            .unwrap();
        assert_eq!(pin.bytes(), 3 * PAGE);
        let pages: Vec<u64> = [1, 2, 10]
            .map(|i| pin.guest_page(GUEST_BASE + i * PAGE).unwrap())
            .to_vec();
        assert!(pages.iter().all(|&p| p != 0 && p % PAGE == 0));
        assert!(pages[0] != pages[1] && pages[1] != pages[2]);
        for unpinned in [0, 3, 9, 11] {
            assert_eq!(pin.guest_page(GUEST_BASE + unpinned * PAGE), None);
        }
        assert_eq!(
            pin.guest_page(GUEST_BASE + PAGE + 8),
            None,
            "not a page address"
        );
        assert!(resident(&memory, PAGE_SIZE) && !resident(&memory, 5 * PAGE_SIZE));
        assert_eq!(memory.budget.charged(1000).0, 3 * PAGE);
        drop(pin);
        assert_eq!(memory.budget.charged(1000).0, 0);
    }

    #[test]
    fn a_pin_past_the_budget_is_refused_and_pins_nothing() {
        let memory = process_memory(16 * PAGE, 8);
        let first = memory.pin(&[(GUEST_BASE, 12 * PAGE)]).unwrap();
        // The same range again is charged again.
        let again = memory.pin(&[(GUEST_BASE, 12 * PAGE)]);
        assert!(
            matches!(again, Err(PinError::OverBudget(_))),
            "{:?}",
            again.err()
        );
        assert_eq!(again.err().unwrap().status(), Status::NoMemory);
        assert!(!resident(&memory, 12 * PAGE_SIZE));
        assert_eq!(memory.table.free.lock().len(), 7);
        drop(first);
        memory.pin(&[(GUEST_BASE, 16 * PAGE)]).unwrap();
    }

    #[test]
    fn pin_table_entries_are_bounded_and_reused() {
        let memory = process_memory(MIB, 2);
        let a = memory.pin(&[(GUEST_BASE, PAGE)]).unwrap();
        let b = memory.pin(&[(GUEST_BASE + PAGE, PAGE)]).unwrap();
        let full = memory.pin(&[(GUEST_BASE + 2 * PAGE, PAGE)]);
        assert!(
            matches!(full, Err(PinError::TableFull(2))),
            "{:?}",
            full.err()
        );
        assert_eq!(
            memory.budget.charged(1000).0,
            2 * PAGE,
            "the refused pin is not charged"
        );
        drop(a);
        let c = memory.pin(&[(GUEST_BASE + 2 * PAGE, PAGE)]).unwrap();
        drop((b, c));
        assert_eq!(memory.table.free.lock().len(), 2);
    }

    #[test]
    fn memory_outside_the_process_is_not_pinned() {
        let memory = process_memory(8 * MIB, 8);
        for run in [
            (GUEST_BASE - PAGE, PAGE),
            (GUEST_BASE + 4 * MIB - PAGE, 2 * PAGE),
        ] {
            let err = memory.pin(&[run]).err().unwrap();
            assert_eq!(err.status(), Status::BadAddress, "{run:x?}: {err}");
        }
        assert_eq!(memory.budget.charged(1000).0, 0);
    }

    /// Punches page `index` out of `ram`'s memfd, as a process holding it could.
    fn punch_page(ram: &MemfdRam, index: usize) {
        // SAFETY: fallocate on the memfd we own.
        let rc = unsafe {
            libc::fallocate(
                std::os::fd::AsRawFd::as_raw_fd(&ram.fd()),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                (index * PAGE_SIZE) as libc::off_t,
                PAGE_SIZE as libc::off_t,
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
    }

    #[test]
    fn a_hole_punched_under_a_registration_does_not_free_its_page() {
        let memory = process_memory(MIB, 8);
        let pin = memory.pin(&[(GUEST_BASE, 2 * PAGE)]).unwrap();
        let before = pin.guest_page(GUEST_BASE + PAGE).unwrap();
        punch_page(memory.ram(), 1);
        // The agent's entry is gone with the hole; a new registration pins (and names) a new
        // page, and the first one's page is not freed while it is pinned.
        assert!(!resident(&memory, PAGE_SIZE));
        let second = memory.pin(&[(GUEST_BASE + PAGE, PAGE)]).unwrap();
        assert_ne!(second.guest_page(GUEST_BASE + PAGE).unwrap(), before);
    }

    #[test]
    fn a_punched_hole_does_not_free_a_pinned_page() {
        let memory = PinnedMemory::new(4 * PAGE_SIZE, RamPages::Small).unwrap();
        let before = memory.pages[1];
        // SAFETY: page 1 of the agent's own mapping.
        unsafe { memory.ram().host_base().add(PAGE_SIZE).write(0x5a) };
        // What a process holding the memfd could do.
        punch_page(memory.ram(), 1);
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

//! `ibv_fork_init`'s madvise mode, as rdma-core's `memory.c`: once enabled, every registered
//! range is `MADV_DONTFORK` while at least one registration covers it (counted per page by
//! [`RangeCounts`]), so a `fork()` child gets no mapping of it and the parent's pages never
//! become copy-on-write. Before it is enabled, counting calls only note that it is now too
//! late to enable it (memory was registered without the advice).

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use vrdma::dma::PAGE_SIZE;

use super::ranges::RangeCounts;
use crate::maps::kernel_page_size;

/// The process's fork support state (one instance, [`FORK_SUPPORT`]; tests make their own).
pub(crate) struct ForkSupport {
    enabled: AtomicBool,
    too_late: AtomicBool,
    huge_pages: AtomicBool,
    counts: Mutex<RangeCounts>,
}

/// The state behind the exported functions.
pub(crate) static FORK_SUPPORT: ForkSupport = ForkSupport::new();

/// What `ibv_fork_init` reads from the environment.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ForkEnv {
    /// `RDMAV_HUGEPAGES_SAFE` is set: ranges are rounded to the kernel page size of their
    /// mapping rather than to 4 KiB.
    pub(crate) hugepages_safe: bool,
    /// `RDMAV_USE_MADVISE` is set (and not "0"): madvise mode even where it is unneeded.
    pub(crate) use_madvise: bool,
}

impl ForkSupport {
    pub(crate) const fn new() -> Self {
        ForkSupport {
            enabled: AtomicBool::new(false),
            too_late: AtomicBool::new(false),
            huge_pages: AtomicBool::new(false),
            counts: Mutex::new(RangeCounts::new()),
        }
    }

    /// `ibv_fork_init`: 0 or an errno value. `copy_on_fork`: children get copies of
    /// registered memory without the advice, so madvise mode is unneeded (and only entered
    /// with `RDMAV_USE_MADVISE`).
    pub(crate) fn init(&self, env: ForkEnv, copy_on_fork: bool) -> i32 {
        if env.hugepages_safe {
            self.huge_pages.store(true, Ordering::Relaxed);
        }
        let mut counts = self.counts.lock();
        if self.enabled.load(Ordering::Acquire) {
            return 0;
        }
        if !env.use_madvise && copy_on_fork {
            return 0;
        }
        if self.too_late.load(Ordering::Acquire) {
            return libc::EINVAL;
        }
        if let Err(e) = probe_madvise() {
            log::warn!("vrdma: ibv_fork_init: MADV_DONTFORK does not work here: {e}");
            return libc::ENOSYS;
        }
        *counts = RangeCounts::new();
        self.enabled.store(true, Ordering::Release);
        0
    }

    /// Whether madvise mode is on.
    pub(crate) fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    /// `ibv_dontfork_range`: counts one more registration of the pages of
    /// `[base, base + size)` and advises the newly covered ones `MADV_DONTFORK`. Without
    /// madvise mode, only notes that `ibv_fork_init` comes too late from now on.
    pub(crate) fn dont_fork(&self, base: usize, size: usize) -> io::Result<()> {
        let Some(range) = self.page_range(base, size) else {
            return Ok(());
        };
        let mut counts = self.counts.lock();
        if !self.is_enabled() {
            self.too_late.store(true, Ordering::Release);
            return Ok(());
        }
        let fresh = counts.increment(range.clone());
        for (done, part) in fresh.iter().enumerate() {
            if let Err(e) = advise(part, libc::MADV_DONTFORK) {
                // Undo: the counts, and the advice already given.
                counts.decrement(range);
                for undone in &fresh[..done] {
                    let _ = advise_per_page(undone, libc::MADV_DOFORK);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// `ibv_dofork_range`: counts one registration less of the pages of `[base, base + size)`
    /// and advises the ones no registration covers any more `MADV_DOFORK`. Pages no longer
    /// mapped are skipped (the application may have unmapped them), as rdma-core does.
    pub(crate) fn do_fork(&self, base: usize, size: usize) {
        let Some(range) = self.page_range(base, size) else {
            return;
        };
        let mut counts = self.counts.lock();
        if !self.is_enabled() {
            self.too_late.store(true, Ordering::Release);
            return;
        }
        for part in counts.decrement(range) {
            if advise(&part, libc::MADV_DOFORK).is_err() {
                let _ = advise_per_page(&part, libc::MADV_DOFORK);
            }
        }
    }

    /// The ranges now `MADV_DONTFORK` by this mode (none without it).
    pub(crate) fn dont_fork_ranges(&self) -> Vec<Range<usize>> {
        self.counts.lock().counted().collect()
    }

    /// The registration count at `addr` (tests).
    #[cfg(test)]
    pub(crate) fn count_at(&self, addr: usize) -> u32 {
        self.counts.lock().count_at(addr)
    }

    /// `[base, base + size)` widened to whole pages (of the mapping's kernel page size with
    /// `RDMAV_HUGEPAGES_SAFE`); `None` for an empty or NULL range, as rdma-core ignores those.
    fn page_range(&self, base: usize, size: usize) -> Option<Range<usize>> {
        if base == 0 || size == 0 {
            return None;
        }
        let page = if self.huge_pages.load(Ordering::Relaxed) {
            kernel_page_size(base).unwrap_or(PAGE_SIZE)
        } else {
            PAGE_SIZE
        };
        let start = base & !(page - 1);
        let end = base
            .checked_add(size)
            .and_then(|end| end.checked_next_multiple_of(page))
            .unwrap_or(usize::MAX & !(page - 1));
        Some(start..end)
    }
}

/// Whether this kernel knows MADV_DONTFORK, on a page of our own.
fn probe_madvise() -> io::Result<()> {
    let mut page = std::ptr::null_mut();
    // SAFETY: valid out pointer, power-of-two alignment that is a multiple of the pointer size.
    if unsafe { libc::posix_memalign(&mut page, PAGE_SIZE, PAGE_SIZE) } != 0 {
        return Err(io::Error::from_raw_os_error(libc::ENOMEM));
    }
    let range = page as usize..page as usize + PAGE_SIZE;
    let result =
        advise(&range, libc::MADV_DONTFORK).and_then(|()| advise(&range, libc::MADV_DOFORK));
    // SAFETY: allocated above and no longer used.
    unsafe { libc::free(page) };
    result
}

fn advise(range: &Range<usize>, advice: i32) -> io::Result<()> {
    // SAFETY: fork advice changes only what a child inherits, never this process's memory;
    // the kernel checks that the range is mapped.
    let rc = unsafe { libc::madvise(range.start as *mut libc::c_void, range.len(), advice) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Advises each page on its own, so that unmapped pages do not keep the others from it.
fn advise_per_page(range: &Range<usize>, advice: i32) -> io::Result<()> {
    let mut result = Ok(());
    for page in range.clone().step_by(PAGE_SIZE) {
        if let Err(e) = advise(&(page..page + PAGE_SIZE), advice) {
            result = Err(e);
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_after_a_registration_is_too_late_unless_unneeded() {
        let support = ForkSupport::new();
        let buf = vec![0u8; 3 * PAGE_SIZE];
        support.dont_fork(buf.as_ptr() as usize, 100).unwrap();
        assert!(!support.is_enabled());
        // Where children get copies anyway, init succeeds without madvise mode.
        assert_eq!(support.init(ForkEnv::default(), true), 0);
        assert!(!support.is_enabled());
        assert_eq!(support.init(ForkEnv::default(), false), libc::EINVAL);
        let madvise = ForkEnv {
            use_madvise: true,
            ..ForkEnv::default()
        };
        assert_eq!(support.init(madvise, true), libc::EINVAL);
        assert!(!support.is_enabled());
    }

    #[test]
    fn init_before_any_registration_enables_madvise_mode_once() {
        let support = ForkSupport::new();
        assert_eq!(support.init(ForkEnv::default(), false), 0);
        assert!(support.is_enabled());
        assert_eq!(support.init(ForkEnv::default(), false), 0, "again: still 0");
        let support = ForkSupport::new();
        let madvise = ForkEnv {
            use_madvise: true,
            ..ForkEnv::default()
        };
        assert_eq!(support.init(madvise, true), 0);
        assert!(support.is_enabled());
    }

    /// Whether the mapping holding `addr` is MADV_DONTFORK ("dc" in its smaps VmFlags).
    fn dont_copy(addr: usize) -> bool {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            if let Some(m) = crate::maps::Mapping::parse(line) {
                inside = (m.start..m.end).contains(&addr);
            } else if inside {
                if let Some(flags) = line.strip_prefix("VmFlags:") {
                    return flags.split_whitespace().any(|f| f == "dc");
                }
            }
        }
        panic!("{addr:#x} is not mapped")
    }

    /// `pages` pages of fresh anonymous memory, unmapped on drop.
    struct Pages(usize, usize);

    impl Pages {
        fn new(pages: usize) -> Self {
            let len = pages * PAGE_SIZE;
            // SAFETY: a new private anonymous mapping.
            let addr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(addr, libc::MAP_FAILED);
            Pages(addr as usize, len)
        }
        fn page(&self, i: usize) -> usize {
            self.0 + i * PAGE_SIZE
        }
    }

    impl Drop for Pages {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`.
            unsafe { libc::munmap(self.0 as *mut libc::c_void, self.1) };
        }
    }

    #[test]
    fn advice_follows_the_registration_counts() {
        let support = ForkSupport::new();
        assert_eq!(support.init(ForkEnv::default(), false), 0);
        let pages = Pages::new(4);
        // Two overlapping registrations: pages 0-1 and 1-2 (unaligned bounds widen to pages).
        support
            .dont_fork(pages.page(0) + 10, 2 * PAGE_SIZE - 20)
            .unwrap();
        support.dont_fork(pages.page(1), 2 * PAGE_SIZE).unwrap();
        assert_eq!(support.count_at(pages.page(1)), 2);
        assert!((0..3).all(|i| dont_copy(pages.page(i))));
        assert!(!dont_copy(pages.page(3)));
        // The first one goes: page 0 is copied to children again, page 1 is still covered.
        support.do_fork(pages.page(0) + 10, 2 * PAGE_SIZE - 20);
        assert!(!dont_copy(pages.page(0)));
        assert!(dont_copy(pages.page(1)) && dont_copy(pages.page(2)));
        // A child has no mapping of the covered pages and its own copy of the others.
        let (covered, free) = (pages.page(1), pages.page(0));
        // SAFETY: page 0 is mapped and ours.
        unsafe { (free as *mut u8).write(9) };
        let status = vrdma_test_support::fork::in_child(|| {
            let mut resident = [0u8; 2];
            // SAFETY: `resident` has a byte per page.
            let gone = unsafe {
                libc::mincore(
                    covered as *mut libc::c_void,
                    2 * PAGE_SIZE,
                    resident.as_mut_ptr(),
                )
            } == -1;
            // SAFETY: page 0 is inherited.
            let kept = unsafe { (free as *const u8).read() } == 9;
            if gone && kept {
                0
            } else {
                1
            }
        });
        assert_eq!(status, 0);
        support.do_fork(pages.page(1), 2 * PAGE_SIZE);
        assert!((0..4).all(|i| !dont_copy(pages.page(i))));
        assert!(support.dont_fork_ranges().is_empty());
    }

    #[test]
    fn unmapped_ranges_fail_and_leave_no_count() {
        let support = ForkSupport::new();
        assert_eq!(support.init(ForkEnv::default(), false), 0);
        // The first page of the address space is never mapped.
        let err = support.dont_fork(16, 8).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOMEM));
        assert_eq!(support.count_at(16), 0);
        assert!(support.dont_fork_ranges().is_empty());
        // NULL or empty: nothing to do, as rdma-core.
        support.dont_fork(0, 100).unwrap();
        support.dont_fork(4096, 0).unwrap();
    }
}

//! What a `fork()` child gets of re-backed application memory.
//!
//! Re-backing (see [`crate::memory`]) turns private application pages into `MAP_SHARED`
//! mappings of the guest-RAM memfd. Left alone, a child would share them with its parent: the
//! child's writes would appear in the parent's registered buffers. Instead, as a kernel with
//! copy-on-fork for pinned pages does for native rdma-core, the child gets private copies and
//! the parent keeps its pages (which the device reaches) untouched:
//!
//! - the prepare handler (in the parent, just before `fork`) takes the registry lock (so no
//!   re-backing runs concurrently) and lists, from `/proc/self/maps`, every mapping of a
//!   registered guest RAM outside the RAM's own mapping, minus the ranges madvise mode made
//!   `MADV_DONTFORK` (absent in the child);
//! - the child handler replaces each listed range with a private anonymous mapping holding the
//!   same bytes: a fresh mapping, a copy, `mremap` over the original, the protection restored.
//!   Only system calls and memory copies run there: no allocation, no lock but the registry's
//!   own, held by this very thread since the prepare handler;
//! - both the parent and the child handler release the registry lock.
//!
//! The lock is a `pthread_mutex_t`, whose unlock in the child is the pattern POSIX designed
//! `pthread_atfork` for.

use std::cell::UnsafeCell;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

use super::madvise::FORK_SUPPORT;
use crate::maps::{read_maps, FileId};

/// One guest RAM whose pages may back application memory.
struct RegisteredRam {
    file: FileId,
    /// The RAM's own mapping (`MADV_DONTFORK`, absent in a child), or where it was: once the
    /// RAM is unmapped, no mapping of this memfd can appear there again.
    own: Range<usize>,
}

/// A range the child handler makes private.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PrivateCopy {
    range: Range<usize>,
    prot: i32,
}

struct Registry {
    rams: Vec<RegisteredRam>,
    /// Built by the prepare handler for the child handler.
    plan: Vec<PrivateCopy>,
}

/// The registry behind a `pthread_mutex_t`.
struct Locked {
    mutex: UnsafeCell<libc::pthread_mutex_t>,
    registry: UnsafeCell<Registry>,
}

// SAFETY: `registry` is only reached while `mutex` is held (through `Guard`, or by the atfork
// handlers between their lock and unlock).
unsafe impl Sync for Locked {}

static REGISTRY: Locked = Locked {
    mutex: UnsafeCell::new(libc::PTHREAD_MUTEX_INITIALIZER),
    registry: UnsafeCell::new(Registry {
        rams: Vec::new(),
        plan: Vec::new(),
    }),
};

static INSTALL_HANDLERS: Once = Once::new();

/// The registry, locked: while it is held no `fork()` of this process proceeds (the prepare
/// handler waits for it).
pub(crate) struct Guard(());

impl Guard {
    fn registry(&mut self) -> &mut Registry {
        // SAFETY: the mutex is held for the guard's life; `&mut self` makes this the only
        // reference.
        unsafe { &mut *REGISTRY.registry.get() }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        unlock();
    }
}

fn lock() {
    // SAFETY: a statically initialised default mutex; never destroyed.
    unsafe { libc::pthread_mutex_lock(REGISTRY.mutex.get()) };
}

fn unlock() {
    // SAFETY: called by the thread that locked it (a guard's owner, or the forking thread
    // in the parent and in the child).
    unsafe { libc::pthread_mutex_unlock(REGISTRY.mutex.get()) };
}

/// Holds off `fork()` (for the duration of a re-backing).
pub(crate) fn hold() -> Guard {
    lock();
    Guard(())
}

/// Registers a guest RAM whose pages back application memory (the memfd `file`, mapped at
/// `own`), and installs the fork handlers the first time. Never unregistered: the re-backed
/// mappings outlive the context (and once the application frees such memory, the allocator
/// may reuse those pages for anything, its own bookkeeping included, which a child must not
/// write into the parent's pages either).
pub(crate) fn register_ram(file: FileId, own: Range<usize>) {
    INSTALL_HANDLERS.call_once(|| {
        // SAFETY: the handlers are `extern "C"` functions of this library that never unwind.
        let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
        if rc != 0 {
            log::error!(
                "vrdma: cannot install fork handlers ({}): fork() children will share \
                 registered memory with their parent",
                std::io::Error::from_raw_os_error(rc)
            );
        }
    });
    hold().registry().rams.push(RegisteredRam { file, own });
}

extern "C" fn prepare() {
    lock();
    // SAFETY: the mutex is held until the parent or child handler.
    let registry = unsafe { &mut *REGISTRY.registry.get() };
    if catch_unwind(AssertUnwindSafe(|| plan(registry))).is_err() {
        registry.plan.clear();
    }
}

extern "C" fn parent() {
    unlock();
}

extern "C" fn child() {
    // SAFETY: the forking thread holds the mutex since `prepare`; it is the only thread of
    // the child.
    let registry = unsafe { &*REGISTRY.registry.get() };
    for copy in &registry.plan {
        make_private(copy);
    }
    unlock();
}

/// Lists the ranges the child handler makes private.
fn plan(registry: &mut Registry) {
    registry.plan.clear();
    if registry.rams.is_empty() {
        return;
    }
    let maps = match read_maps() {
        Ok(maps) => maps,
        Err(e) => {
            log::warn!(
                "vrdma: reading /proc/self/maps before fork(): {e}; the child shares \
                 registered memory with this process"
            );
            return;
        }
    };
    let absent = FORK_SUPPORT.dont_fork_ranges();
    for mapping in &maps {
        let Some(ram) = registry.rams.iter().find(|ram| ram.file.maps(mapping)) else {
            continue;
        };
        if ram.own.start <= mapping.start && mapping.end <= ram.own.end {
            continue;
        }
        for range in subtract(mapping.start..mapping.end, &absent) {
            registry.plan.push(PrivateCopy {
                range,
                prot: mapping.prot,
            });
        }
    }
}

/// The parts of `range` outside every range of `holes` (sorted, disjoint).
fn subtract(range: Range<usize>, holes: &[Range<usize>]) -> Vec<Range<usize>> {
    let mut parts = Vec::new();
    let mut cursor = range.start;
    for hole in holes
        .iter()
        .filter(|h| h.end > range.start && h.start < range.end)
    {
        if hole.start > cursor {
            parts.push(cursor..hole.start);
        }
        cursor = cursor.max(hole.end);
    }
    if cursor < range.end {
        parts.push(cursor..range.end);
    }
    parts
}

/// In the child: replaces the shared pages of `copy` with private ones holding the same bytes.
/// Best effort: a range that cannot be copied stays shared.
fn make_private(copy: &PrivateCopy) {
    let (start, len) = (copy.range.start, copy.range.len());
    // SAFETY: a new private anonymous mapping; nothing else is affected.
    let fresh = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if fresh == libc::MAP_FAILED {
        return;
    }
    if copy.prot & libc::PROT_READ == 0 {
        // SAFETY: the range is mapped (listed from /proc/self/maps just before the fork);
        // readable only for the copy, its protection is restored below.
        unsafe { libc::mprotect(start as *mut libc::c_void, len, libc::PROT_READ) };
    }
    // SAFETY: both ranges are mapped readable (the fresh one writable) for `len` bytes and
    // do not overlap; no other thread exists in the child.
    unsafe { std::ptr::copy_nonoverlapping(start as *const u8, fresh.cast::<u8>(), len) };
    // SAFETY: moves the fresh private pages over exactly the listed range, which replaces
    // its shared mapping in one step: the addresses stay valid memory with the same bytes.
    let moved = unsafe {
        libc::mremap(
            fresh,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            start as *mut libc::c_void,
        )
    };
    if moved == libc::MAP_FAILED {
        // SAFETY: the fresh mapping made above, unused.
        unsafe { libc::munmap(fresh, len) };
        return;
    }
    if copy.prot != libc::PROT_READ | libc::PROT_WRITE {
        // SAFETY: the range just mapped; back to the protection the application had.
        unsafe { libc::mprotect(start as *mut libc::c_void, len, copy.prot) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holes_are_cut_out() {
        assert_eq!(subtract(0..100, &[]), vec![0..100]);
        assert_eq!(
            subtract(10..100, &[0..20, 50..60, 90..200]),
            vec![20..50, 60..90]
        );
        let whole: Vec<Range<usize>> = std::iter::once(0..200).collect();
        assert_eq!(subtract(10..100, &whole), Vec::<Range<usize>>::new());
        let beyond: Vec<Range<usize>> = std::iter::once(30..40).collect();
        assert_eq!(subtract(10..20, &beyond), vec![10..20]);
    }
}

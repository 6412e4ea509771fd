// Copyright 2026 The vrdma Authors
// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause

//! Address-space reservations: ranges of this process's address space reserved inaccessible
//! and then filled with file mappings at fixed offsets (the building block of MR windows).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use super::error::MemError;

/// A range of our address space we own, unmapped on drop.
#[derive(Debug)]
pub(super) struct Reservation {
    /// Start address; kept as an integer so that windows are `Send` and `Sync`.
    pub(super) addr: usize,
    pub(super) len: usize,
}

impl Reservation {
    /// Reserves `len` bytes of inaccessible address space starting at a multiple of `alignment`.
    pub(super) fn new(len: usize, alignment: usize) -> Result<Self, MemError> {
        let host_page_size = host_page_size() as usize;
        let alignment = alignment.max(host_page_size);
        let oversized = len
            .checked_add(alignment - host_page_size)
            .ok_or(MemError::Reserve {
                len,
                source: io::Error::from_raw_os_error(libc::ENOMEM),
            })?;
        // SAFETY: a new private anonymous mapping at an address of the kernel's choosing does not
        // touch any existing memory.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                oversized,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(MemError::Reserve {
                len: oversized,
                source: io::Error::last_os_error(),
            });
        }
        let start = raw as usize;
        let addr = start.next_multiple_of(alignment);
        // Give back the unaligned head and the tail beyond `len`.
        unmap(start, addr - start);
        unmap(addr + len, start + oversized - (addr + len));
        Ok(Reservation { addr, len })
    }

    /// Maps `len` bytes of `file` from `file_offset` at `offset` into the reservation.
    pub(super) fn map_file(
        &self,
        file: &File,
        offset: u64,
        file_offset: u64,
        len: u64,
    ) -> Result<(), MemError> {
        let map_error = |source| MemError::Map {
            file_offset,
            len: len as usize,
            source,
        };
        let inside = offset
            .checked_add(len)
            .is_some_and(|end| end <= self.len as u64);
        let file_offset_arg = libc::off_t::try_from(file_offset)
            .map_err(|_| map_error(io::Error::from_raw_os_error(libc::EOVERFLOW)))?;
        if !inside {
            return Err(map_error(io::Error::from_raw_os_error(libc::EINVAL)));
        }
        let target = (self.addr + offset as usize) as *mut libc::c_void;
        // MAP_POPULATE: a shared mapping is populated with read faults, which the kernel batches
        // (fault-around), so the pinning that follows finds the pages mapped instead of taking
        // one write fault per page.
        // SAFETY: `target..target + len` is inside our reservation (checked above), which no
        // Rust object refers to, so replacing it with a shared mapping of guest RAM invalidates
        // nothing.
        let mapped = unsafe {
            libc::mmap(
                target,
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_POPULATE,
                file.as_raw_fd(),
                file_offset_arg,
            )
        };
        if mapped == libc::MAP_FAILED {
            return Err(map_error(io::Error::last_os_error()));
        }
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        unmap(self.addr, self.len);
    }
}

/// Unmaps address space this module reserved.
pub(super) fn unmap(addr: usize, len: usize) {
    if len == 0 {
        return;
    }
    // SAFETY: only called on ranges of reservations made by `Reservation::new`, which nothing
    // else refers to once unmapped.
    if unsafe { libc::munmap(addr as *mut libc::c_void, len) } != 0 {
        log::error!(
            "munmap({addr:#x}, {len:#x}) failed: {}",
            io::Error::last_os_error()
        );
    }
}

/// The host page size.
pub(super) fn host_page_size() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size)
        .ok()
        .filter(|size| size.is_power_of_two())
        .unwrap_or(4096)
}

/// Fills this process's page tables for `addr..addr + len` (rounded out to host pages) with
/// read faults, which the kernel batches (fault-around), so that pinning the range afterwards
/// finds its pages mapped. Best effort: on failure the pinning faults the pages itself.
pub(super) fn populate(addr: usize, len: u64) {
    let page = host_page_size() as usize;
    let start = addr & !(page - 1);
    let Some(len) = usize::try_from(len)
        .ok()
        .and_then(|len| (addr - start).checked_add(len))
    else {
        return;
    };
    // SAFETY: MADV_POPULATE_READ only faults pages of existing mappings in (as reading them
    // would); it changes no memory contents and fails on holes instead of mapping anything.
    let rc = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_POPULATE_READ) };
    if rc != 0 {
        log::debug!(
            "populating {len:#x} bytes at {start:#x}: {}",
            io::Error::last_os_error()
        );
    }
}

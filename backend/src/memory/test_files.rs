// Copyright 2026 The vrdma Authors
// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause

//! Guest RAM for the memory layer's tests: memfd files and guest memory maps built on them.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::sync::Arc;

use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap};

pub(super) const KIB: u64 = 1 << 10;
pub(super) const MIB: u64 = 1 << 20;
pub(super) const GIB: u64 = 1 << 30;
pub(super) const PAGE: u64 = 4 * KIB;

pub(super) fn memfd(name: &CStr, size: u64) -> File {
    // SAFETY: memfd_create only reads the NUL-terminated name.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
    // SAFETY: `fd` is a new descriptor nothing else owns.
    let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    file.set_len(size).unwrap();
    file
}

/// (guest-physical start, length, file, file offset) per region.
pub(super) fn guest_memory(regions: &[(u64, u64, &Arc<File>, u64)]) -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges_with_files(regions.iter().map(|&(gpa, len, file, offset)| {
        (
            GuestAddress(gpa),
            len as usize,
            Some(FileOffset::from_arc(Arc::clone(file), offset)),
        )
    }))
    .unwrap()
}

pub(super) const LOW: u64 = 0x10_0000;
pub(super) const HIGH: u64 = 0x1_0000_0000;

/// Two 1 MiB regions of one 4 MiB memfd: LOW is file [2M, 3M), HIGH is file [0, 1M).
pub(super) fn one_file_two_regions() -> (Arc<File>, GuestMemoryMmap) {
    let file = Arc::new(memfd(c"one-file", 4 * MIB));
    let mem = guest_memory(&[(LOW, MIB, &file, 2 * MIB), (HIGH, MIB, &file, 0)]);
    (file, mem)
}

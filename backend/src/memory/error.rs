// Copyright 2026 The vrdma Authors
// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause

//! Why guest memory could not be used as a guest asked: the errors of the guest RAM snapshot
//! and of MR windows.

use std::io;

use vrdma_spec::control::{MAX_PAGE_SHIFT, MIN_PAGE_SHIFT};

/// Errors building a [`GuestRamFiles`](super::guest_ram::GuestRamFiles) snapshot or an [`MrWindow`](super::mr_window::MrWindow).
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    /// The page size is outside what the device supports or smaller than a host page.
    #[error(
        "page shift {0} is not supported (must be {MIN_PAGE_SHIFT}..={MAX_PAGE_SHIFT} and at least the host page size)"
    )]
    BadPageShift(u32),
    /// A zero-length MR was requested.
    #[error("memory region length is zero")]
    ZeroLength,
    /// The MR is larger than the caller allows.
    #[error("memory region of {length:#x} bytes exceeds the limit of {limit:#x} bytes")]
    TooLarge {
        /// Requested length.
        length: u64,
        /// Largest length allowed.
        limit: u64,
    },
    /// `iova + length` does not fit in 64 bits.
    #[error("iova {iova:#x} + length {length:#x} overflows")]
    IovaOverflow {
        /// Requested iova.
        iova: u64,
        /// Requested length.
        length: u64,
    },
    /// The page list does not exactly cover `[iova, iova + length)`.
    #[error("{given} pages given, but {expected} pages are needed to cover the memory region")]
    PageCountMismatch {
        /// Number of pages in the list.
        given: usize,
        /// Number of pages needed.
        expected: u64,
    },
    /// A page address is not aligned to the page size.
    #[error("guest page {gpa:#x} is not aligned to the page size {page_size:#x}")]
    UnalignedPage {
        /// The offending guest-physical address.
        gpa: u64,
        /// The MR page size.
        page_size: u64,
    },
    /// A guest-physical range is not entirely inside one guest RAM region.
    #[error("guest range {gpa:#x}+{len:#x} is not inside one guest RAM region")]
    NotInGuestRam {
        /// Start of the range.
        gpa: u64,
        /// Length of the range.
        len: u64,
    },
    /// A guest RAM region has no backing file, so it cannot be mapped a second time.
    #[error("guest RAM region at {region_start:#x} is not backed by a file descriptor")]
    NotFdBacked {
        /// Guest-physical start of the region.
        region_start: u64,
    },
    /// The file offset of a guest-physical address does not fit in 64 bits.
    #[error("file offset of guest address {gpa:#x} overflows")]
    FileOffsetOverflow {
        /// The offending guest-physical address.
        gpa: u64,
    },
    /// A guest range lies beyond the end of its backing file: touching it would fault.
    #[error("guest range {gpa:#x}+{len:#x} lies beyond the end of its backing file ({file_len:#x} bytes)")]
    BeyondEndOfFile {
        /// Start of the range.
        gpa: u64,
        /// Length of the range.
        len: u64,
        /// Size of the backing file.
        file_len: u64,
    },
    /// Guest pages backed by huge pages (hugetlbfs) can only be mapped in whole huge pages, and
    /// this page list cannot be laid out contiguously at that granularity.
    #[error(
        "guest pages from {gpa:#x} cannot be mapped contiguously: their backing can only be mapped in units of {granularity:#x} bytes"
    )]
    BackingGranularity {
        /// Guest-physical address of the first page of the offending run.
        gpa: u64,
        /// Mapping granularity of the backing file.
        granularity: u64,
    },
    /// The backing file of a guest RAM region cannot be inspected.
    #[error("cannot inspect the backing file of guest RAM region at {region_start:#x}: {source}")]
    InspectFile {
        /// Guest-physical start of the region.
        region_start: u64,
        /// Underlying error.
        source: io::Error,
    },
    /// The window does not fit in our address space.
    #[error("window of {pages} pages of {page_size:#x} bytes does not fit in the address space")]
    WindowTooLarge {
        /// Number of pages.
        pages: u64,
        /// The MR page size.
        page_size: u64,
    },
    /// Reserving address space for the window failed.
    #[error("cannot reserve {len:#x} bytes of address space: {source}")]
    Reserve {
        /// Size of the reservation.
        len: usize,
        /// Underlying error.
        source: io::Error,
    },
    /// Mapping guest pages into the window failed.
    #[error("cannot map {len:#x} bytes of guest RAM at file offset {file_offset:#x}: {source}")]
    Map {
        /// File offset of the mapping.
        file_offset: u64,
        /// Length of the mapping.
        len: usize,
        /// Underlying error.
        source: io::Error,
    },
}

// Copyright 2026 The vrdma Authors
// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause

//! Tests of MR windows over memfd-backed (and, where the host has it, hugetlbfs-backed) guest RAM.

use super::*;
use crate::memory::guest_ram::GuestRamFiles;
use crate::memory::test_files::*;
use std::fs::File;
use std::io;
use std::sync::Arc;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

fn fill_pattern(mem: &GuestMemoryMmap, gpa: u64, len: usize, seed: u8) {
    let bytes: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect();
    mem.write_slice(&bytes, GuestAddress(gpa)).unwrap();
}

fn window_bytes(window: &MrWindow) -> Vec<u8> {
    let mut bytes = vec![0; window.len() as usize];
    window.as_volatile_slice().copy_to(&mut bytes[..]);
    bytes
}

fn guest_bytes(mem: &GuestMemoryMmap, gpa: u64, len: u64) -> Vec<u8> {
    let mut bytes = vec![0; len as usize];
    mem.read_slice(&mut bytes, GuestAddress(gpa)).unwrap();
    bytes
}

/// What the window must show: `length` bytes from `in_page_offset` of the concatenated pages.
fn expected_bytes(mem: &GuestMemoryMmap, request: &MrPages<'_>) -> Vec<u8> {
    let page_size = 1u64 << request.page_shift;
    let mut all = Vec::new();
    for &page in request.pages {
        all.extend(guest_bytes(mem, page, page_size));
    }
    let start = (request.iova & (page_size - 1)) as usize;
    all[start..start + request.length as usize].to_vec()
}

fn map_error(ram: &GuestRamFiles, request: MrPages<'_>) -> MemError {
    MrWindow::map(ram, &request, GIB).unwrap_err()
}

#[test]
fn scattered_pages_read_and_write_through_the_window() {
    let (_, mem) = one_file_two_regions();
    fill_pattern(&mem, LOW, MIB as usize, 0x5a);
    fill_pattern(&mem, HIGH, MIB as usize, 0xa5);
    let ram = GuestRamFiles::new(&mem).unwrap();
    let pages = [
        HIGH + 3 * PAGE,
        LOW + 5 * PAGE,
        LOW + 6 * PAGE,
        LOW + 7 * PAGE,
        HIGH + PAGE,
    ];
    let request = MrPages {
        iova: 0x7f00_0000_0123,
        length: 5 * PAGE - 0x123 - 0x10,
        page_shift: 12,
        pages: &pages,
    };
    let window = MrWindow::map(&ram, &request, GIB).unwrap();
    assert_eq!(window.runs(), 3);
    assert_eq!(window.iova(), request.iova);
    assert_eq!(window.len(), request.length);
    assert_eq!(window.addr() as u64 % PAGE, 0x123);
    assert_eq!(window_bytes(&window), expected_bytes(&mem, &request));

    // Guest writes show up in the window.
    mem.write_slice(b"guest", GuestAddress(LOW + 6 * PAGE + 7))
        .unwrap();
    let at = (PAGE - 0x123 + PAGE + 7) as usize;
    assert_eq!(&window_bytes(&window)[at..at + 5], b"guest");

    // Window writes land in the guest pages, in page list order.
    let slice = window.as_volatile_slice();
    slice.write_slice(b"first", 0).unwrap();
    slice
        .write_slice(b"last", window.len() as usize - 4)
        .unwrap();
    assert_eq!(guest_bytes(&mem, HIGH + 3 * PAGE + 0x123, 5), b"first");
    assert_eq!(guest_bytes(&mem, HIGH + 2 * PAGE - 0x14, 4), b"last");
}

#[test]
fn contiguous_pages_are_one_mmap() {
    let (_, mem) = one_file_two_regions();
    fill_pattern(&mem, LOW, MIB as usize, 1);
    let ram = GuestRamFiles::new(&mem).unwrap();
    let pages: Vec<u64> = (0..256).map(|i| LOW + i * PAGE).collect();
    let request = MrPages {
        iova: 0x1000,
        length: MIB,
        page_shift: 12,
        pages: &pages,
    };
    let window = MrWindow::map(&ram, &request, GIB).unwrap();
    assert_eq!(window.runs(), 1);
    assert_eq!(window_bytes(&window), expected_bytes(&mem, &request));

    // Reversed order: nothing is file-contiguous any more.
    let reversed: Vec<u64> = pages.iter().rev().copied().collect();
    let request = MrPages {
        pages: &reversed,
        ..request
    };
    let window = MrWindow::map(&ram, &request, GIB).unwrap();
    assert_eq!(window.runs(), 256);
    assert_eq!(window_bytes(&window), expected_bytes(&mem, &request));
}

#[test]
fn runs_coalesce_across_regions_of_one_file() {
    // HIGH is file [0, 1M), LOW2 is file [1M, 2M): the last page of HIGH and the first of
    // LOW2 are consecutive in the file, though far apart in guest-physical space.
    let file = Arc::new(memfd(c"adjacent", 2 * MIB));
    const LOW2: u64 = 0x4000_0000;
    let mem = guest_memory(&[(LOW2, MIB, &file, MIB), (HIGH, MIB, &file, 0)]);
    fill_pattern(&mem, LOW2, MIB as usize, 3);
    fill_pattern(&mem, HIGH, MIB as usize, 4);
    let ram = GuestRamFiles::new(&mem).unwrap();
    let pages = [HIGH + MIB - PAGE, LOW2, LOW2 + PAGE];
    let request = MrPages {
        iova: 0,
        length: 3 * PAGE,
        page_shift: 12,
        pages: &pages,
    };
    let window = MrWindow::map(&ram, &request, GIB).unwrap();
    assert_eq!(window.runs(), 1);
    assert_eq!(window_bytes(&window), expected_bytes(&mem, &request));
    assert_eq!(window.dependencies.len(), 2);
}

#[test]
fn pages_from_two_files() {
    let first = Arc::new(memfd(c"first", MIB));
    let second = Arc::new(memfd(c"second", 2 * MIB));
    // Same file offsets in different files must not coalesce.
    let mem = guest_memory(&[(LOW, MIB, &first, 0), (HIGH, MIB, &second, PAGE)]);
    fill_pattern(&mem, LOW, MIB as usize, 7);
    fill_pattern(&mem, HIGH, (MIB) as usize, 8);
    let ram = GuestRamFiles::new(&mem).unwrap();
    let pages = [LOW, HIGH, LOW + 2 * PAGE];
    let request = MrPages {
        iova: 0xabc,
        length: 2 * PAGE,
        page_shift: 12,
        pages: &pages,
    };
    let window = MrWindow::map(&ram, &request, GIB).unwrap();
    assert_eq!(window.runs(), 3);
    assert_eq!(window_bytes(&window), expected_bytes(&mem, &request));
    window.as_volatile_slice().write_slice(b"x", 0).unwrap();
    assert_eq!(guest_bytes(&mem, LOW + 0xabc, 1), b"x");
}

#[test]
fn two_mib_pages_on_ordinary_memory() {
    let file = Arc::new(memfd(c"big", 8 * MIB));
    const BASE: u64 = 0x4000_0000;
    let mem = guest_memory(&[(BASE, 6 * MIB, &file, 2 * MIB)]);
    fill_pattern(&mem, BASE, 6 * MIB as usize, 9);
    let ram = GuestRamFiles::new(&mem).unwrap();
    let pages = [BASE + 4 * MIB, BASE, BASE + 2 * MIB];
    let request = MrPages {
        iova: 0x20_0000_1000,
        length: 5 * MIB,
        page_shift: 21,
        pages: &pages,
    };
    let window = MrWindow::map(&ram, &request, GIB).unwrap();
    assert_eq!(window.runs(), 2);
    // Same offset modulo the MR page size as the iova: the NIC can use 2 MiB translations.
    assert_eq!(window.addr() as u64 % (2 * MIB), request.iova % (2 * MIB));
    assert_eq!(window_bytes(&window), expected_bytes(&mem, &request));

    // A 2 MiB page straddling the end of the region is refused.
    let straddling = [BASE + 4 * MIB, BASE + 6 * MIB];
    assert!(matches!(
        map_error(
            &ram,
            MrPages {
                iova: 0,
                length: 4 * MIB,
                page_shift: 21,
                pages: &straddling
            }
        ),
        MemError::NotInGuestRam { .. }
    ));
}

/// Guest RAM as it would be on 2 MiB hugetlbfs: mappable only in aligned 2 MiB units.
fn huge_ram() -> (GuestMemoryMmap, GuestRamFiles) {
    let file = Arc::new(memfd(c"huge", 8 * MIB));
    let mem = guest_memory(&[(0, 8 * MIB, &file, 0)]);
    fill_pattern(&mem, 0, 8 * MIB as usize, 11);
    let mut ram = GuestRamFiles::new(&mem).unwrap();
    ram.force_granularity(2 * MIB);
    (mem, ram)
}

#[test]
fn small_pages_inside_one_huge_page() {
    let (mem, ram) = huge_ram();
    let pages = [2 * MIB + 5 * PAGE, 2 * MIB + 6 * PAGE];
    let request = MrPages {
        iova: 0x9000_0000_0010,
        length: PAGE,
        page_shift: 12,
        pages: &pages,
    };
    let window = MrWindow::map(&ram, &request, GIB).unwrap();
    assert_eq!(window.runs(), 1);
    assert_eq!(window_bytes(&window), expected_bytes(&mem, &request));
    // The huge page is mapped whole, at a huge page boundary.
    assert_eq!(window.addr() as u64 % (2 * MIB), 5 * PAGE + 0x10);
    assert_eq!(window.reservation().addr as u64 % (2 * MIB), 0);
}

#[test]
fn small_pages_across_huge_page_boundaries() {
    let (mem, ram) = huge_ram();
    // Contiguous buffer crossing from the first into the second huge page...
    let contiguous: Vec<u64> = (0..4).map(|i| 2 * MIB - 2 * PAGE + i * PAGE).collect();
    let request = MrPages {
        iova: 0x100,
        length: 4 * PAGE - 0x100,
        page_shift: 12,
        pages: &contiguous,
    };
    let window = MrWindow::map(&ram, &request, GIB).unwrap();
    assert_eq!(window_bytes(&window), expected_bytes(&mem, &request));

    // ...then whole huge pages in any order: boundaries fall on huge pages.
    let tail_then_head = [6 * MIB - PAGE, 0, PAGE];
    let request = MrPages {
        iova: 0,
        length: 3 * PAGE,
        page_shift: 12,
        pages: &tail_then_head,
    };
    let window = MrWindow::map(&ram, &request, GIB).unwrap();
    assert_eq!(window.runs(), 2);
    assert_eq!(window_bytes(&window), expected_bytes(&mem, &request));

    // Scattered small pages cannot be made contiguous out of huge pages.
    let scattered = [2 * MIB, 4 * MIB + PAGE];
    assert!(matches!(
        map_error(
            &ram,
            MrPages {
                iova: 0,
                length: 2 * PAGE,
                page_shift: 12,
                pages: &scattered
            }
        ),
        MemError::BackingGranularity { gpa, granularity } if gpa == 4 * MIB + PAGE && granularity == 2 * MIB
    ));
    let swapped = [PAGE, 0];
    assert!(matches!(
        map_error(
            &ram,
            MrPages {
                iova: 0,
                length: 2 * PAGE,
                page_shift: 12,
                pages: &swapped
            }
        ),
        MemError::BackingGranularity { .. }
    ));
}

#[test]
fn layout_of_mixed_granularities() {
    let granularity = |region: usize| if region == 1 { 2 * MIB } else { PAGE };
    let run = |region, file_offset, len| Run {
        region,
        gpa: file_offset,
        file_offset,
        len,
    };
    // A small page, then two huge pages: the small page goes right before a huge boundary.
    let layout = plan_layout(
        &[run(0, 3 * MIB, PAGE), run(1, 4 * MIB, 4 * MIB)],
        granularity,
        PAGE,
        PAGE,
    )
    .unwrap();
    assert_eq!(
        layout,
        Layout {
            alignment: 2 * MIB,
            reserve_len: 6 * MIB,
            first_page: 2 * MIB - PAGE,
            maps: vec![
                PlannedMap {
                    region: 0,
                    window_offset: 2 * MIB - PAGE,
                    file_offset: 3 * MIB,
                    len: PAGE
                },
                PlannedMap {
                    region: 1,
                    window_offset: 2 * MIB,
                    file_offset: 4 * MIB,
                    len: 4 * MIB
                },
            ],
        }
    );
    // A small page between two huge pages would put the second one off a huge boundary.
    assert!(matches!(
        plan_layout(
            &[
                run(1, 4 * MIB, 2 * MIB),
                run(0, 3 * MIB, PAGE),
                run(1, 8 * MIB, 2 * MIB)
            ],
            granularity,
            PAGE,
            PAGE
        ),
        Err(MemError::BackingGranularity { gpa, granularity }) if gpa == 8 * MIB && granularity == 2 * MIB
    ));
    // Host-page granularity only: no slack before the first page.
    let layout = plan_layout(&[run(0, 5 * PAGE, 2 * MIB)], |_| PAGE, 2 * MIB, PAGE).unwrap();
    assert_eq!((layout.first_page, layout.alignment), (0, 2 * MIB));
    assert_eq!(layout.reserve_len, 2 * MIB);
}

#[test]
fn rejects_bad_requests() {
    let (_, mem) = one_file_two_regions();
    let ram = GuestRamFiles::new(&mem).unwrap();
    let one = [LOW];
    let two = [LOW, LOW + PAGE];
    let base = MrPages {
        iova: 0,
        length: PAGE,
        page_shift: 12,
        pages: &one,
    };

    for page_shift in [0, 11, 31, 64, u32::MAX] {
        assert!(matches!(
            map_error(&ram, MrPages { page_shift, ..base }),
            MemError::BadPageShift(shift) if shift == page_shift
        ));
    }
    assert!(matches!(
        map_error(&ram, MrPages { length: 0, ..base }),
        MemError::ZeroLength
    ));
    assert!(matches!(
        MrWindow::map(&ram, &base, PAGE - 1).unwrap_err(),
        MemError::TooLarge { length: PAGE, limit } if limit == PAGE - 1
    ));
    assert!(MrWindow::map(&ram, &base, PAGE).is_ok());
    assert!(matches!(
        MrWindow::map(
            &ram,
            &MrPages {
                iova: u64::MAX - 10,
                length: 11,
                ..base
            },
            u64::MAX
        )
        .unwrap_err(),
        MemError::IovaOverflow { .. }
    ));
    assert!(matches!(
        MrWindow::map(
            &ram,
            &MrPages {
                iova: 0,
                length: u64::MAX,
                ..base
            },
            u64::MAX
        )
        .unwrap_err(),
        MemError::PageCountMismatch { given: 1, .. }
    ));
    // Too few pages: the iova offset pushes the end into a second page.
    assert!(matches!(
        map_error(&ram, MrPages { iova: 1, ..base }),
        MemError::PageCountMismatch {
            given: 1,
            expected: 2
        }
    ));
    // Too many pages.
    assert!(matches!(
        map_error(
            &ram,
            MrPages {
                pages: &two,
                ..base
            }
        ),
        MemError::PageCountMismatch {
            given: 2,
            expected: 1
        }
    ));
    assert!(matches!(
        map_error(&ram, MrPages { pages: &[LOW + 8], ..base }),
        MemError::UnalignedPage { gpa, .. } if gpa == LOW + 8
    ));
    assert!(matches!(
        map_error(
            &ram,
            MrPages {
                pages: &[LOW + PAGE, LOW + 3 * MIB],
                length: 2 * PAGE,
                ..base
            }
        ),
        MemError::NotInGuestRam { gpa, .. } if gpa == LOW + 3 * MIB
    ));
    assert!(matches!(
        map_error(
            &ram,
            MrPages {
                pages: &[!(PAGE - 1)],
                ..base
            }
        ),
        MemError::NotInGuestRam { .. }
    ));
    // A 2 MiB page at an address that is 4 KiB aligned only.
    assert!(matches!(
        map_error(
            &ram,
            MrPages {
                page_shift: 21,
                pages: &[LOW],
                ..base
            }
        ),
        MemError::UnalignedPage { .. }
    ));
}

#[test]
fn rejects_memory_without_a_file() {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(LOW), MIB as usize)]).unwrap();
    let ram = GuestRamFiles::new(&mem).unwrap();
    assert!(matches!(
        ram.translate(LOW, PAGE),
        Err(MemError::NotFdBacked { region_start: LOW })
    ));
    let request = MrPages {
        iova: 0,
        length: PAGE,
        page_shift: 12,
        pages: &[LOW],
    };
    assert!(matches!(
        map_error(&ram, request),
        MemError::NotFdBacked { region_start: LOW }
    ));
}

#[test]
fn rejects_regions_beyond_the_end_of_their_file() {
    let file = Arc::new(memfd(c"short", MIB));
    let mem = guest_memory(&[(LOW, 2 * MIB, &file, 0)]);
    let ram = GuestRamFiles::new(&mem).unwrap();
    assert!(ram.translate(LOW + MIB - PAGE, PAGE).is_ok());
    assert!(matches!(
        ram.translate(LOW + MIB - PAGE, PAGE + 1),
        Err(MemError::BeyondEndOfFile { file_len, .. }) if file_len == MIB
    ));
    let request = MrPages {
        iova: 0,
        length: 2 * PAGE,
        page_shift: 12,
        pages: &[LOW + MIB - PAGE, LOW + MIB],
    };
    assert!(matches!(
        map_error(&ram, request),
        MemError::BeyondEndOfFile { gpa, .. } if gpa == LOW + MIB
    ));
}

#[test]
fn still_backed_after_memory_changes() {
    let (file, mem) = one_file_two_regions();
    let ram = GuestRamFiles::new(&mem).unwrap();
    let pages = [LOW + PAGE, HIGH];
    let request = MrPages {
        iova: 0,
        length: 2 * PAGE,
        page_shift: 12,
        pages: &pages,
    };
    let window = MrWindow::map(&ram, &request, GIB).unwrap();
    assert!(window.still_backed_by(&ram));

    // The frontend sends the same table again, with fresh descriptors.
    let reopened = Arc::new(file.try_clone().unwrap());
    let same = guest_memory(&[(LOW, MIB, &reopened, 2 * MIB), (HIGH, MIB, &reopened, 0)]);
    assert!(window.still_backed_by(&GuestRamFiles::new(&same).unwrap()));

    // A region is removed (REM_MEM_REG).
    let (removed, _) = mem.remove_region(GuestAddress(HIGH), MIB).unwrap();
    assert!(!window.still_backed_by(&GuestRamFiles::new(&removed).unwrap()));

    // Same addresses, another file.
    let other = Arc::new(memfd(c"other", 4 * MIB));
    let replaced = guest_memory(&[(LOW, MIB, &file, 2 * MIB), (HIGH, MIB, &other, 0)]);
    assert!(!window.still_backed_by(&GuestRamFiles::new(&replaced).unwrap()));

    // Same file, moved within it.
    let moved = guest_memory(&[(LOW, MIB, &file, 3 * MIB), (HIGH, MIB, &file, 0)]);
    assert!(!window.still_backed_by(&GuestRamFiles::new(&moved).unwrap()));

    // A region that shrinks but still holds the pages used keeps the window.
    let shrunk = guest_memory(&[(LOW, 2 * PAGE, &file, 2 * MIB), (HIGH, PAGE, &file, 0)]);
    assert!(window.still_backed_by(&GuestRamFiles::new(&shrunk).unwrap()));
    let too_small = guest_memory(&[(LOW, PAGE, &file, 2 * MIB), (HIGH, PAGE, &file, 0)]);
    assert!(!window.still_backed_by(&GuestRamFiles::new(&too_small).unwrap()));

    // The window keeps working on its own mappings whatever the memory map says.
    window.as_volatile_slice().write_slice(b"ok", 0).unwrap();
    assert_eq!(guest_bytes(&mem, LOW + PAGE, 2), b"ok");
}

#[test]
fn drop_unmaps_the_window() {
    let (file, mem) = one_file_two_regions();
    let ram = GuestRamFiles::new(&mem).unwrap();
    let pages = [LOW, HIGH];
    let request = MrPages {
        iova: 0,
        length: 2 * PAGE,
        page_shift: 12,
        pages: &pages,
    };
    let window = MrWindow::map(&ram, &request, GIB).unwrap();
    let (addr, len) = (window.reservation().addr, window.reservation().len);
    assert!(is_mapped(addr, len));
    assert!(maps_file_in(&file, addr, len));
    drop(window);
    // Other test threads may map something into the freed range at once; only a mapping
    // of the guest-RAM file there would be the window's.
    assert!(!maps_file_in(&file, addr, len));
}

/// Whether `/proc/self/maps` shows `file` mapped anywhere in `addr..addr + len`.
fn maps_file_in(file: &File, addr: usize, len: usize) -> bool {
    use std::os::unix::fs::MetadataExt;
    let inode = file.metadata().unwrap().ino();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let Some((start, end)) = fields.first().and_then(|r| r.split_once('-')) else {
            return false;
        };
        let start = usize::from_str_radix(start, 16).unwrap();
        let end = usize::from_str_radix(end, 16).unwrap();
        let overlaps = start < addr + len && addr < end;
        overlaps && fields.get(4) == Some(&inode.to_string().as_str())
    })
}

/// Whether any page of `addr..addr + len` is mapped, according to mincore().
fn is_mapped(addr: usize, len: usize) -> bool {
    let mut residency = vec![0u8; len.div_ceil(PAGE as usize)];
    // SAFETY: mincore only writes one byte per page into `residency`, which is large enough.
    let result = unsafe { libc::mincore(addr as *mut libc::c_void, len, residency.as_mut_ptr()) };
    if result == 0 {
        return true;
    }
    assert_eq!(
        io::Error::last_os_error().raw_os_error(),
        Some(libc::ENOMEM)
    );
    false
}

#[test]
#[ignore = "needs at least 4 free 2 MiB huge pages (vm.nr_hugepages); run in the test VM"]
fn hugetlbfs_backed_guest_ram() {
    let flags = libc::MFD_CLOEXEC | libc::MFD_HUGETLB | libc::MFD_HUGE_2MB;
    // SAFETY: memfd_create only reads the NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"hugetlb".as_ptr(), flags) };
    assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
    // SAFETY: `fd` is a new descriptor nothing else owns.
    let file = Arc::new(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    file.set_len(8 * MIB).unwrap();
    const BASE: u64 = 0x8000_0000;
    let mem = guest_memory(&[(BASE, 8 * MIB, &file, 0)]);
    fill_pattern(&mem, BASE, 8 * MIB as usize, 13);
    let ram = GuestRamFiles::new(&mem).unwrap();
    assert_eq!(
        ram.regions[0].backing.as_ref().unwrap().granularity,
        2 * MIB
    );

    // 4 KiB MR pages inside one huge page, and a buffer crossing a huge page boundary.
    for pages in [
        vec![BASE + 2 * MIB + PAGE, BASE + 2 * MIB + 2 * PAGE],
        vec![BASE + 4 * MIB - PAGE, BASE + 4 * MIB],
    ] {
        let request = MrPages {
            iova: 0x10,
            length: 2 * PAGE - 0x10,
            page_shift: 12,
            pages: &pages,
        };
        let window = MrWindow::map(&ram, &request, GIB).unwrap();
        assert_eq!(window_bytes(&window), expected_bytes(&mem, &request));
        window.as_volatile_slice().write_slice(b"huge", 0).unwrap();
        assert_eq!(guest_bytes(&mem, pages[0] + 0x10, 4), b"huge");
    }

    // Scattered 2 MiB MR pages.
    let pages = [BASE + 6 * MIB, BASE + 2 * MIB, BASE];
    let request = MrPages {
        iova: 0,
        length: 6 * MIB,
        page_shift: 21,
        pages: &pages,
    };
    let window = MrWindow::map(&ram, &request, GIB).unwrap();
    assert_eq!(window.runs(), 3);
    assert_eq!(window_bytes(&window), expected_bytes(&mem, &request));

    // Scattered 4 KiB pages cannot be laid out from huge pages.
    let scattered = [BASE + PAGE, BASE + 4 * MIB];
    assert!(matches!(
        map_error(
            &ram,
            MrPages {
                iova: 0,
                length: 2 * PAGE,
                page_shift: 12,
                pages: &scattered
            }
        ),
        MemError::BackingGranularity { .. }
    ));
}

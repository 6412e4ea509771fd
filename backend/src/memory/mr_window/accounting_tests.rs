// Copyright 2026 The vrdma Authors
// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause

//! Tests of what a window costs: its mappings, counted before anything is mapped and checked
//! against the kernel's view, and the guest bytes its registration pins.

use super::*;
use crate::memory::test_files::*;
use std::sync::Arc;

/// Mappings (VMAs) `/proc/self/maps` shows inside `addr..addr + len`.
fn vmas_in(addr: usize, len: usize) -> u64 {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter(|line| {
            let range = line.split_whitespace().next().unwrap();
            let (start, end) = range.split_once('-').unwrap();
            let start = usize::from_str_radix(start, 16).unwrap();
            let end = usize::from_str_radix(end, 16).unwrap();
            start < addr + len && addr < end
        })
        .count() as u64
}

fn request(pages: &[u64]) -> MrPages<'_> {
    MrPages {
        iova: 0,
        length: pages.len() as u64 * PAGE,
        page_shift: 12,
        pages,
    }
}

#[test]
fn scattered_pages_cost_one_mapping_each_as_the_kernel_counts() {
    let (_file, mem) = one_file_two_regions();
    let ram = GuestRamFiles::new(&mem).unwrap();
    // Backwards: no two neighbours continue each other in the file.
    let scattered: Vec<u64> = (0..5).rev().map(|i| LOW + i * PAGE).collect();
    let mut plan = MrWindow::plan(&ram, &request(&scattered), GIB).unwrap();
    assert_eq!((plan.runs(), plan.mappings()), (5, 5));
    let window = plan.map(&mut PopulatedRam::default()).unwrap();
    assert_eq!(window.mappings(), 5);
    let (addr, len) = (window.reservation().addr, window.reservation().len);
    assert_eq!(vmas_in(addr, len), 5);
}

#[test]
fn file_adjacent_pages_coalesce_into_one_mapping() {
    let (_file, mem) = one_file_two_regions();
    let ram = GuestRamFiles::new(&mem).unwrap();
    // 64 pages that follow each other in guest RAM and in its file.
    let contiguous: Vec<u64> = (0..64).map(|i| HIGH + i * PAGE).collect();
    let mut plan = MrWindow::plan(&ram, &request(&contiguous), GIB).unwrap();
    assert_eq!(plan.mappings(), 1);
    let window = plan.map(&mut PopulatedRam::default()).unwrap();
    let (addr, len) = (window.reservation().addr, window.reservation().len);
    assert_eq!(vmas_in(addr, len), 1);

    // Two runs of the same file in the wrong order stay two; in order they are one.
    let swapped: Vec<u64> = (32..64).chain(0..32).map(|i| HIGH + i * PAGE).collect();
    assert_eq!(
        MrWindow::plan(&ram, &request(&swapped), GIB)
            .unwrap()
            .mappings(),
        2
    );
}

#[test]
fn huge_granularity_counts_the_reservation_left_around_the_maps() {
    let granularity = |region: usize| if region == 1 { 2 * MIB } else { PAGE };
    let run = |region, file_offset, len| Run {
        region,
        gpa: file_offset,
        file_offset,
        len,
    };
    // A small page placed right before a huge boundary leaves the start of the reservation
    // inaccessible: one more mapping than maps.
    let layout = plan_layout(
        &[run(0, 3 * MIB, PAGE), run(1, 4 * MIB, 4 * MIB)],
        granularity,
        PAGE,
        PAGE,
    )
    .unwrap();
    assert_eq!((layout.maps.len(), layout.mappings()), (2, 3));

    // Small pages inside one huge page: the huge page is mapped whole, nothing is left.
    let file = Arc::new(memfd(c"huge-count", 4 * MIB));
    let mem = guest_memory(&[(0, 4 * MIB, &file, 0)]);
    let mut ram = GuestRamFiles::new(&mem).unwrap();
    ram.force_granularity(2 * MIB);
    let pages = [2 * MIB + 5 * PAGE, 2 * MIB + 6 * PAGE];
    let plan = MrWindow::plan(&ram, &request(&pages), GIB).unwrap();
    assert_eq!(plan.mappings(), 1);
    // ...but only the registered pages are pinned.
    assert_eq!(
        plan.pinned_extents(),
        &[Extent {
            start: 2 * MIB + 5 * PAGE,
            end: 2 * MIB + 7 * PAGE
        }]
    );
}

#[test]
fn pinned_extents_are_the_host_pages_of_the_registered_bytes() {
    let file = Arc::new(memfd(c"pinned", 8 * MIB));
    const BASE: u64 = 0x4000_0000;
    let mem = guest_memory(&[(BASE, 8 * MIB, &file, 0)]);
    let ram = GuestRamFiles::new(&mem).unwrap();
    // 12 KiB from 0x1800 into a 2 MiB page: host pages 0x1000..0x5000 of it.
    let one = [BASE + 2 * MIB];
    let plan = MrWindow::plan(
        &ram,
        &MrPages {
            iova: 0x1800,
            length: 0x3000,
            page_shift: 21,
            pages: &one,
        },
        GIB,
    )
    .unwrap();
    assert_eq!(
        plan.pinned_extents(),
        &[Extent {
            start: BASE + 2 * MIB + 0x1000,
            end: BASE + 2 * MIB + 0x5000
        }]
    );
    // 4 KiB across the boundary of two 2 MiB pages listed high first: the last host page of
    // the first, the first of the second, sorted.
    let two = [BASE + 6 * MIB, BASE];
    let plan = MrWindow::plan(
        &ram,
        &MrPages {
            iova: 2 * MIB - 0x800,
            length: 0x1000,
            page_shift: 21,
            pages: &two,
        },
        GIB,
    )
    .unwrap();
    assert_eq!(
        plan.pinned_extents(),
        &[
            Extent {
                start: BASE,
                end: BASE + PAGE
            },
            Extent {
                start: BASE + 8 * MIB - PAGE,
                end: BASE + 8 * MIB
            }
        ]
    );
}

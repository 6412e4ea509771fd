// Copyright 2026 The vrdma Authors
// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause

//! MRs registered over the daemon's own mapping of guest RAM (one run inside one region).

use super::*;
use crate::memory::guest_ram::GuestRamFiles;
use crate::memory::test_files::*;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

fn request(pages: &[u64], iova: u64, length: u64) -> MrPages<'_> {
    MrPages {
        iova,
        length,
        page_shift: 12,
        pages,
    }
}

fn host_address(mem: &GuestMemoryMmap, gpa: u64) -> usize {
    mem.get_host_address(GuestAddress(gpa)).unwrap() as usize
}

#[test]
fn one_run_uses_guest_rams_mapping_and_keeps_it_alive() {
    let (_, mem) = one_file_two_regions();
    mem.write_slice(b"vrdma", GuestAddress(LOW + 0x1234))
        .unwrap();
    let expected_addr = host_address(&mem, LOW + 0x1234);
    let mem = Arc::new(mem);
    let ram = GuestRamFiles::mapped(Arc::clone(&mem)).unwrap();
    let pages: Vec<u64> = (0..16).map(|i| LOW + PAGE + i * PAGE).collect();
    let mut plan = MrWindow::plan(&ram, &request(&pages, 0x7000_0234, 15 * PAGE), GIB).unwrap();
    assert!(plan.is_direct());
    assert_eq!(plan.mappings(), 0, "nothing of its own is mapped");
    let mut populated = PopulatedRam::default();
    let window = plan.map(&mut populated).unwrap();
    assert_eq!(window.addr() as usize, expected_addr);
    assert_eq!(window.mappings(), 0);
    assert_eq!(window.runs(), 1);
    assert!(
        populated
            .take_missing(
                &mem,
                Extent {
                    start: LOW + PAGE,
                    end: LOW + 17 * PAGE
                }
            )
            .is_empty(),
        "mapping the MR recorded its pages as populated"
    );

    // The window outlives every other reference to the mapping and still reaches guest RAM.
    drop(ram);
    drop(mem);
    let mut bytes = [0u8; 5];
    window.as_volatile_slice().copy_to(&mut bytes[..]);
    assert_eq!(&bytes, b"vrdma");
}

#[test]
fn what_one_mapping_does_not_hold_gets_a_window() {
    // Two regions adjacent in guest-physical space and in one file: one run, two mappings.
    let file = Arc::new(memfd(c"adjacent", 2 * MIB));
    let mem = guest_memory(&[(LOW, MIB, &file, 0), (LOW + MIB, MIB, &file, MIB)]);
    mem.write_slice(b"ab", GuestAddress(LOW + MIB - 1)).unwrap();
    let ram = GuestRamFiles::mapped(Arc::new(mem)).unwrap();
    let across = [LOW + MIB - PAGE, LOW + MIB];
    let plan = MrWindow::plan(&ram, &request(&across, PAGE - 1, 2), GIB).unwrap();
    assert_eq!(plan.runs(), 1);
    assert!(!plan.is_direct(), "one run, but across two mappings");
    let window = MrWindow::map(&ram, &request(&across, PAGE - 1, 2), GIB).unwrap();
    let mut bytes = [0u8; 2];
    window.as_volatile_slice().copy_to(&mut bytes[..]);
    assert_eq!(&bytes, b"ab");

    // Scattered pages, and snapshots that do not keep the mapping, get windows too.
    let scattered = [LOW + 2 * PAGE, LOW];
    assert!(
        !MrWindow::plan(&ram, &request(&scattered, 0, 2 * PAGE), GIB)
            .unwrap()
            .is_direct()
    );
    let (_, mem) = one_file_two_regions();
    let unmapped = GuestRamFiles::new(&mem).unwrap();
    let one = [LOW];
    let plan = MrWindow::plan(&unmapped, &request(&one, 0, PAGE), GIB).unwrap();
    assert!(!plan.is_direct());
    assert!(plan.mappings() > 0);
}

//! This process's mappings as `/proc/self/maps` lists them, and the page size the kernel
//! uses for one of them (`/proc/self/smaps`): how re-backing finds which memory is guest RAM,
//! and how fork support finds re-backed ranges and hugepage boundaries.

use std::fs;
use std::io;
use std::os::fd::AsRawFd;

/// One line of `/proc/self/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mapping {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) prot: i32,
    pub(crate) offset: u64,
    pub(crate) dev: (u32, u32),
    pub(crate) inode: u64,
}

impl Mapping {
    pub(crate) fn parse(line: &str) -> Option<Mapping> {
        let mut fields = line.split_ascii_whitespace();
        let (start, end) = fields.next()?.split_once('-')?;
        let perms = fields.next()?.as_bytes();
        let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
        let (major, minor) = fields.next()?.split_once(':')?;
        let inode = fields.next()?.parse().ok()?;
        let flag = |i: usize, c: u8, bit: i32| if perms.get(i) == Some(&c) { bit } else { 0 };
        Some(Mapping {
            start: usize::from_str_radix(start, 16).ok()?,
            end: usize::from_str_radix(end, 16).ok()?,
            prot: flag(0, b'r', libc::PROT_READ)
                | flag(1, b'w', libc::PROT_WRITE)
                | flag(2, b'x', libc::PROT_EXEC),
            offset,
            dev: (
                u32::from_str_radix(major, 16).ok()?,
                u32::from_str_radix(minor, 16).ok()?,
            ),
            inode,
        })
    }
}

/// The mappings of this process, in address order.
pub(crate) fn read_maps() -> io::Result<Vec<Mapping>> {
    let text = fs::read_to_string("/proc/self/maps")?;
    Ok(text.lines().filter_map(Mapping::parse).collect())
}

/// Identity of a file as `/proc/self/maps` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileId {
    pub(crate) dev: (u32, u32),
    pub(crate) inode: u64,
}

impl FileId {
    /// The identity of the open file `fd`.
    pub(crate) fn of(fd: &impl AsRawFd) -> io::Result<FileId> {
        // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: the fd is open while `fd` is borrowed; `st` is a valid out pointer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(FileId {
            dev: (libc::major(st.st_dev), libc::minor(st.st_dev)),
            inode: st.st_ino,
        })
    }

    /// Whether `mapping` maps this file.
    pub(crate) fn maps(&self, mapping: &Mapping) -> bool {
        mapping.dev == self.dev && mapping.inode == self.inode
    }
}

/// The page size the kernel uses for the mapping holding `addr` (its `KernelPageSize` in
/// `/proc/self/smaps`), if it is mapped and the file says.
pub(crate) fn kernel_page_size(addr: usize) -> Option<usize> {
    let text = fs::read_to_string("/proc/self/smaps").ok()?;
    kernel_page_size_in(&text, addr)
}

fn kernel_page_size_in(smaps: &str, addr: usize) -> Option<usize> {
    let mut inside = false;
    for line in smaps.lines() {
        if let Some(mapping) = Mapping::parse(line) {
            inside = (mapping.start..mapping.end).contains(&addr);
        } else if inside {
            if let Some(size) = line.strip_prefix("KernelPageSize:") {
                let kib: usize = size.trim().strip_suffix("kB")?.trim().parse().ok()?;
                return kib.checked_mul(1024).filter(|s| s.is_power_of_two());
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_parse() {
        let m = Mapping::parse(
            "7f12a0000000-7f12a0021000 rw-s 00003000 00:01 2051    /memfd:vrdma (deleted)",
        )
        .unwrap();
        assert_eq!((m.start, m.end), (0x7f12a0000000, 0x7f12a0021000));
        assert_eq!(m.prot, libc::PROT_READ | libc::PROT_WRITE);
        assert_eq!((m.offset, m.dev, m.inode), (0x3000, (0, 1), 2051));
        let anon = Mapping::parse("55d0c4a00000-55d0c4a21000 r-xp 00000000 fd:01 0").unwrap();
        assert_eq!(anon.prot, libc::PROT_READ | libc::PROT_EXEC);
        assert_eq!(anon.dev, (0xfd, 1));
        assert!(Mapping::parse("garbage").is_none());
    }

    #[test]
    fn smaps_page_sizes_are_found_per_mapping() {
        let smaps = "\
7f0000000000-7f0000200000 rw-p 00000000 00:00 0
Size:               2048 kB
KernelPageSize:        4 kB
7f0000200000-7f0000600000 rw-s 00000000 00:0f 99   /anon_hugepage (deleted)
Size:               4096 kB
KernelPageSize:     2048 kB
";
        assert_eq!(kernel_page_size_in(smaps, 0x7f0000000010), Some(4096));
        assert_eq!(kernel_page_size_in(smaps, 0x7f0000300000), Some(2 << 20));
        assert_eq!(kernel_page_size_in(smaps, 0x10), None);
        let local = 0u8;
        assert_eq!(kernel_page_size(&local as *const u8 as usize), Some(4096));
    }
}

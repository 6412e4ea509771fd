//! [`SysfsPciFunction`]: the vrdma device of a real guest, reached through sysfs.
//!
//! The function is found under `/sys/bus/pci/devices` by its IDs (1af4:106a, or 1af4:1066
//! under QEMU 11.1, spec 2.1) and its configuration magic "vRDM". A kernel driver bound to it
//! (virtio-pci binds every virtio function) is unbound first. Configuration space goes
//! through the `config` file, BARs are mapped from the `resourceN` files and accessed with
//! volatile loads and stores of the register's width. There is no interrupt delivery:
//! [`PciFunction::wait_interrupt`] sleeps briefly, and the driver polls. Needs root.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use log::{debug, info, warn};

use super::function::{PciError, PciFunction};
use super::hugepage::HugepageDma;
use super::virtio::{has_vrdma_magic, VRDMA_DEVICE_IDS};
use crate::dma::{map_shared, DmaMemory};
use crate::transport::SharedMemory;
use vrdma_spec::PCI_VENDOR_ID;

/// Where sysfs keeps the PCI bus.
pub const SYSFS_PCI: &str = "/sys/bus/pci";
/// How long [`PciFunction::wait_interrupt`] sleeps: the polling interval of every wait.
pub const POLL_INTERVAL: Duration = Duration::from_micros(200);

const IORESOURCE_MEM: u64 = 0x200;
const NUM_BARS: usize = 6;

/// A full PCI address `dddd:bb:dd.f` from `text`, which may omit the domain.
pub fn normalize_address(text: &str) -> Option<String> {
    let text = text.trim();
    let full = match text.matches(':').count() {
        1 => format!("0000:{text}"),
        2 => text.to_string(),
        _ => return None,
    };
    let (domain, rest) = full.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (slot, function) = rest.split_once('.')?;
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    let valid = hex(domain, 4)
        && hex(bus, 2)
        && hex(slot, 2)
        && function.len() == 1
        && matches!(function.as_bytes()[0], b'0'..=b'7');
    valid.then(|| full.to_ascii_lowercase())
}

/// The memory BARs (index, length) listed in a sysfs `resource` file.
pub fn parse_resources(text: &str) -> Vec<(u8, u64)> {
    text.lines()
        .take(NUM_BARS)
        .enumerate()
        .filter_map(|(index, line)| {
            let mut fields = line
                .split_ascii_whitespace()
                .map(|field| u64::from_str_radix(field.trim_start_matches("0x"), 16).ok());
            let (start, end, flags) = (fields.next()??, fields.next()??, fields.next()??);
            (flags & IORESOURCE_MEM != 0 && end > start).then(|| (index as u8, end - start + 1))
        })
        .collect()
}

fn read_id(device: &Path, name: &str) -> Option<u16> {
    let text = fs::read_to_string(device.join(name)).ok()?;
    u16::from_str_radix(text.trim().trim_start_matches("0x"), 16).ok()
}

fn is_candidate(device: &Path) -> bool {
    read_id(device, "vendor") == Some(PCI_VENDOR_ID)
        && read_id(device, "device").is_some_and(|id| VRDMA_DEVICE_IDS.contains(&id))
}

/// Functions under `<sysfs_pci>/devices` with a vrdma vendor and device ID, by address; or
/// only `address`, which must be one.
pub fn find_candidates(sysfs_pci: &Path, address: Option<&str>) -> Result<Vec<PathBuf>, PciError> {
    let devices = sysfs_pci.join("devices");
    let ids = format!(
        "{PCI_VENDOR_ID:04x}:{:04x} or {PCI_VENDOR_ID:04x}:{:04x}",
        VRDMA_DEVICE_IDS[0], VRDMA_DEVICE_IDS[1]
    );
    if let Some(address) = address {
        let normalized = normalize_address(address)
            .ok_or_else(|| PciError::NotFound(format!("{address:?} is not a PCI address")))?;
        let device = devices.join(&normalized);
        if !device.exists() {
            return Err(PciError::NotFound(format!(
                "{} does not exist",
                device.display()
            )));
        }
        if !is_candidate(&device) {
            return Err(PciError::NotFound(format!("{normalized} is not {ids}")));
        }
        return Ok(vec![device]);
    }
    let entries = fs::read_dir(&devices).map_err(|source| PciError::Io {
        what: format!("listing {}", devices.display()),
        source,
    })?;
    let mut scanned = 0;
    let mut found: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .inspect(|_| scanned += 1)
        .filter(|device| is_candidate(device))
        .collect();
    if found.is_empty() {
        return Err(PciError::NotFound(format!(
            "none of the {scanned} functions under {} is {ids}",
            devices.display()
        )));
    }
    found.sort();
    Ok(found)
}

/// One mapped memory BAR; unmapped on drop.
struct BarMapping {
    base: NonNull<u8>,
    len: usize,
}

impl Drop for BarMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map_bar`; nothing refers to it once the function,
        // which owns it, is gone.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// The vrdma device's PCI function, through sysfs.
pub struct SysfsPciFunction {
    address: String,
    config: File,
    bars: [Option<BarMapping>; NUM_BARS],
    dma: Arc<dyn DmaMemory>,
}

// SAFETY: the BAR mappings are device memory owned by this value for its whole life; every
// access through them is a single volatile load or store.
unsafe impl Send for SysfsPciFunction {}
// SAFETY: see Send; no method hands out references into the mappings.
unsafe impl Sync for SysfsPciFunction {}

impl SysfsPciFunction {
    /// Opens the vrdma device at `address` (`dddd:bb:dd.f` or `bb:dd.f`), or the first one
    /// found, with hugepage DMA memory.
    pub fn open(address: Option<&str>) -> Result<Self, PciError> {
        // A missing device says more than missing hugepages: look for it first.
        find_candidates(Path::new(SYSFS_PCI), address)?;
        let dma = Arc::new(HugepageDma::new()?);
        Self::open_in(Path::new(SYSFS_PCI), address, dma)
    }

    /// As [`SysfsPciFunction::open`], with the PCI bus at `sysfs_pci` and the given DMA
    /// memory.
    pub fn open_in(
        sysfs_pci: &Path,
        address: Option<&str>,
        dma: Arc<dyn DmaMemory>,
    ) -> Result<Self, PciError> {
        let candidates = find_candidates(sysfs_pci, address)?;
        let mut rejected = Vec::new();
        let mut busy = Vec::new();
        for device in candidates {
            let released = release_from_kernel(&device)?;
            let function = match Self::open_device(&device, dma.clone()) {
                Ok(function) => function,
                Err(PciError::Busy(why)) => {
                    busy.push(why);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if has_vrdma_magic(&function) {
                info!("vrdma device at {}", function.address);
                return Ok(function);
            }
            warn!("{} has no vrdma configuration magic", function.address);
            if released {
                give_back_to_kernel(sysfs_pci, &function.address);
            }
            rejected.push(function.address);
        }
        if !busy.is_empty() {
            return Err(PciError::Busy(busy.join("; ")));
        }
        Err(PciError::NotFound(format!(
            "{} lack the vrdma configuration magic \"vRDM\"",
            rejected.join(", ")
        )))
    }

    /// Opens the function at sysfs directory `device` without checking what it is.
    fn open_device(device: &Path, dma: Arc<dyn DmaMemory>) -> Result<Self, PciError> {
        let address = device
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        let config = open_rw(&device.join("config"))?;
        lock_exclusively(&config, &address)?;
        write_attribute(&device.join("enable"), "1")?;
        let resources = device.join("resource");
        let text = fs::read_to_string(&resources).map_err(io_error(&resources))?;
        let mut bars: [Option<BarMapping>; NUM_BARS] = Default::default();
        for (index, len) in parse_resources(&text) {
            bars[usize::from(index)] =
                Some(map_bar(&device.join(format!("resource{index}")), len)?);
        }
        debug!("{address}: memory BARs {:?}", parse_resources(&text));
        Ok(SysfsPciFunction {
            address,
            config,
            bars,
            dma,
        })
    }

    /// The function's PCI address.
    pub fn address(&self) -> &str {
        &self.address
    }

    fn register(&self, bar: u8, offset: u64, len: usize) -> Result<*mut u8, PciError> {
        let invalid = || {
            PciError::InvalidAccess(format!(
                "{len} bytes at {offset:#x} of BAR {bar} of {}",
                self.address
            ))
        };
        let mapping = self
            .bars
            .get(usize::from(bar))
            .and_then(Option::as_ref)
            .ok_or_else(invalid)?;
        let offset = usize::try_from(offset).map_err(|_| invalid())?;
        let inside = matches!(len, 1 | 2 | 4 | 8)
            && offset.is_multiple_of(len)
            && offset
                .checked_add(len)
                .is_some_and(|end| end <= mapping.len);
        if !inside {
            return Err(invalid());
        }
        // SAFETY: `offset + len <= mapping.len`: inside the mapping.
        Ok(unsafe { mapping.base.as_ptr().add(offset) })
    }
}

impl PciFunction for SysfsPciFunction {
    fn config_read(&self, offset: u16, buf: &mut [u8]) -> Result<(), PciError> {
        check_config_access(offset, buf.len())?;
        self.config
            .read_exact_at(buf, u64::from(offset))
            .map_err(|source| PciError::Io {
                what: format!("reading configuration space of {}", self.address),
                source,
            })
    }

    fn config_write(&self, offset: u16, data: &[u8]) -> Result<(), PciError> {
        check_config_access(offset, data.len())?;
        self.config
            .write_all_at(data, u64::from(offset))
            .map_err(|source| PciError::Io {
                what: format!("writing configuration space of {}", self.address),
                source,
            })
    }

    fn bar_read(&self, bar: u8, offset: u64, buf: &mut [u8]) -> Result<(), PciError> {
        let register = self.register(bar, offset, buf.len())?;
        // SAFETY: `register` is a naturally aligned register of `buf.len()` bytes inside the
        // BAR mapping (checked by `register`); device memory is read with one access.
        unsafe {
            match buf.len() {
                1 => buf.copy_from_slice(&register.read_volatile().to_ne_bytes()),
                2 => buf.copy_from_slice(&register.cast::<u16>().read_volatile().to_ne_bytes()),
                4 => buf.copy_from_slice(&register.cast::<u32>().read_volatile().to_ne_bytes()),
                _ => buf.copy_from_slice(&register.cast::<u64>().read_volatile().to_ne_bytes()),
            }
        }
        Ok(())
    }

    fn bar_write(&self, bar: u8, offset: u64, data: &[u8]) -> Result<(), PciError> {
        let register = self.register(bar, offset, data.len())?;
        // SAFETY: as in `bar_read`; one store of the register's width. The slices have the
        // length of the matched arm, so the conversions cannot fail.
        unsafe {
            match data {
                [b] => register.write_volatile(*b),
                [a, b] => register
                    .cast::<u16>()
                    .write_volatile(u16::from_ne_bytes([*a, *b])),
                [a, b, c, d] => register
                    .cast::<u32>()
                    .write_volatile(u32::from_ne_bytes([*a, *b, *c, *d])),
                [a, b, c, d, e, f, g, h] => register
                    .cast::<u64>()
                    .write_volatile(u64::from_ne_bytes([*a, *b, *c, *d, *e, *f, *g, *h])),
                _ => {}
            }
        }
        Ok(())
    }

    fn bar_region(&self, bar: u8, offset: u64, len: u64) -> Result<SharedMemory, PciError> {
        let invalid = || {
            PciError::InvalidAccess(format!(
                "region of {len:#x} bytes at {offset:#x} of BAR {bar} of {}",
                self.address
            ))
        };
        let mapping = self
            .bars
            .get(usize::from(bar))
            .and_then(Option::as_ref)
            .ok_or_else(invalid)?;
        let (offset, len) = (
            usize::try_from(offset).map_err(|_| invalid())?,
            usize::try_from(len).map_err(|_| invalid())?,
        );
        if offset.checked_add(len).is_none_or(|end| end > mapping.len) {
            return Err(invalid());
        }
        // SAFETY: `offset + len <= mapping.len`: inside the mapping, which lives as long as
        // this function (the transport that hands the region out holds it).
        let base = unsafe { mapping.base.add(offset) };
        Ok(SharedMemory::new(Some(base), len))
    }

    fn dma(&self) -> Arc<dyn DmaMemory> {
        self.dma.clone()
    }

    fn wait_interrupt(&self, timeout: Duration) -> Result<bool, PciError> {
        thread::sleep(timeout.min(POLL_INTERVAL));
        Ok(true)
    }
}

fn check_config_access(offset: u16, len: usize) -> Result<(), PciError> {
    let aligned = matches!(len, 1 | 2 | 4) && usize::from(offset).is_multiple_of(len);
    if aligned && usize::from(offset) + len <= 4096 {
        Ok(())
    } else {
        Err(PciError::InvalidAccess(format!(
            "{len} bytes at {offset:#x} of configuration space"
        )))
    }
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> PciError + '_ {
    move |source| {
        if source.kind() == io::ErrorKind::PermissionDenied {
            PciError::PermissionDenied(format!("{}: {source}", path.display()))
        } else {
            PciError::Io {
                what: path.display().to_string(),
                source,
            }
        }
    }
}

/// Takes the function for this process: an exclusive lock on its configuration file, held
/// while the file is open (so until this process lets go of the function or exits). Every
/// driver of this library takes it, the guest agent's included, so a program started while
/// another drives the function is refused instead of resetting the device under it.
fn lock_exclusively(config: &File, address: &str) -> Result<(), PciError> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock only reads the descriptor, which `config` keeps open.
    if unsafe { libc::flock(config.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(());
    }
    let source = std::io::Error::last_os_error();
    if source.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Err(PciError::Busy(format!(
            "{address} is driven by another process (the guest agent, or a program on the PCI \
             transport): use the agent (VRDMA_AGENT) or wait until it lets go"
        )));
    }
    Err(PciError::Io {
        what: format!("locking the configuration of {address}"),
        source,
    })
}

fn open_rw(path: &Path) -> Result<File, PciError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io_error(path))
}

fn write_attribute(path: &Path, value: &str) -> Result<(), PciError> {
    fs::write(path, value).map_err(io_error(path))
}

/// Unbinds the kernel driver bound to `device`, if any. Returns whether there was one.
fn release_from_kernel(device: &Path) -> Result<bool, PciError> {
    let driver = device.join("driver");
    if !driver.exists() {
        return Ok(false);
    }
    let address = device.file_name().unwrap_or_default().to_string_lossy();
    let name = fs::read_link(&driver)
        .ok()
        .and_then(|target| target.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    info!("unbinding {address} from its kernel driver {name}");
    write_attribute(&driver.join("unbind"), &address)?;
    Ok(true)
}

/// Lets the kernel bind a driver to a function this library released but does not use.
fn give_back_to_kernel(sysfs_pci: &Path, address: &str) {
    if let Err(e) = fs::write(sysfs_pci.join("drivers_probe"), address) {
        warn!("cannot hand {address} back to the kernel: {e}");
    }
}

fn map_bar(path: &Path, len: u64) -> Result<BarMapping, PciError> {
    let file = open_rw(path)?;
    let len = usize::try_from(len)
        .map_err(|_| PciError::InvalidAccess(format!("{} is too large to map", path.display())))?;
    // The mapping stays valid after the file is closed.
    let base = map_shared(file.as_fd(), len).map_err(io_error(path))?;
    Ok(BarMapping { base, len })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_normalized() {
        assert_eq!(
            normalize_address("00:03.0").as_deref(),
            Some("0000:00:03.0")
        );
        assert_eq!(
            normalize_address(" 0001:0A:1f.7\n").as_deref(),
            Some("0001:0a:1f.7")
        );
        for bad in [
            "",
            "03.0",
            "00:03",
            "00:03.8",
            "0:03.0",
            "0000:00:03.0:1",
            "zz:03.0",
        ] {
            assert_eq!(normalize_address(bad), None, "{bad}");
        }
    }

    #[test]
    fn resource_files_list_the_memory_bars() {
        let text = "\
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x00000000fe800000 0x00000000fe800fff 0x0000000000040200
0x0000000000001000 0x000000000000101f 0x0000000000040101
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000000800000000 0x0000000bffffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x00000000fe840000 0x00000000fe87ffff 0x0000000000046200
";
        // BAR 2 is I/O, entry 6 is the ROM: neither is mapped.
        assert_eq!(parse_resources(text), vec![(1, 0x1000), (4, 0x4_0000_0000)]);
        assert_eq!(parse_resources("garbage\n"), vec![]);
    }
}

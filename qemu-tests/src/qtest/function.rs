//! The vrdma PCI function of a qtest machine, as the virtio-pci driver sees it.
//!
//! No firmware runs under qtest, so this plays firmware: it finds the function on bus 0
//! through the configuration mechanism #1 ports (0xcf8/0xcfc), sizes its BARs and assigns
//! them: I/O BARs from 0xc000, 32-bit memory BARs from 0xe000_0000 (the windows QEMU's libqos
//! uses on pc/q35), 64-bit memory BARs from 4 GiB (q35 routes every address that is not RAM
//! to PCI). Register accesses are qtest memory accesses at BAR base + offset; DMA memory is
//! the machine's guest RAM; interrupts are the IOAPIC's input lines, intercepted.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use vrdma::dma::DmaMemory;

use vrdma::spec::PCI_VENDOR_ID;
use vrdma::transport::pci::virtio::VRDMA_DEVICE_IDS;
use vrdma::transport::pci::{PciError, PciFunction};
use vrdma::transport::{RegionAccess, SharedMemory};

use super::client::Qtest;
use super::error::QtestError;
use super::memory::GuestMemory;

/// Vendor and device IDs a vrdma function may have: RDMA's own (virtio ID 42) and the carrier
/// ID 38 QEMU 11.1 can instantiate.
pub const VRDMA_IDS: [(u16, u16); 2] = [
    (PCI_VENDOR_ID, VRDMA_DEVICE_IDS[0]),
    (PCI_VENDOR_ID, VRDMA_DEVICE_IDS[1]),
];
/// PCI capability ID of virtio's vendor-specific capabilities.
const CAP_VENDOR_SPECIFIC: u8 = 0x09;
const PCI_STATUS: u16 = 0x06;
const STATUS_CAPABILITIES: u32 = 1 << 4;
const PCI_CAPABILITY_LIST: u16 = 0x34;

const CONFIG_ADDRESS: u16 = 0xcf8;
const CONFIG_DATA: u16 = 0xcfc;
/// Conventional configuration space: what mechanism #1 reaches.
const CONFIG_SPACE: u16 = 256;
const PCI_COMMAND: u16 = 0x04;
const PCI_HEADER_TYPE: u16 = 0x0e;
const PCI_BAR0: u16 = 0x10;
const COMMAND_IO: u16 = 1 << 0;
const COMMAND_MEMORY: u16 = 1 << 1;

/// Where BARs go.
const IO_WINDOW: (u64, u64) = (0xc000, 0x1_0000);
const MEM32_WINDOW: (u64, u64) = (0xe000_0000, 0xfec0_0000);
const MEM64_WINDOW: (u64, u64) = (0x1_0000_0000, 0x100_0000_0000);

/// The IOAPIC's QOM path on pc and q35, as QEMU's own qtests name it.
const IOAPIC: &str = "ioapic";

/// What a BAR decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarKind {
    Io,
    Mem32,
    Mem64,
}

/// One assigned BAR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bar {
    pub kind: BarKind,
    pub prefetchable: bool,
    pub base: u64,
    pub size: u64,
}

/// Where the function sits and what it decodes.
#[derive(Debug, Clone)]
pub struct FunctionInfo {
    /// Device (slot) and function number on bus 0.
    pub slot: u8,
    pub function: u8,
    pub vendor: u16,
    pub device: u16,
    pub bars: [Option<Bar>; 6],
}

/// The vrdma function of a qtest machine.
pub struct QtestPciFunction {
    qtest: Arc<Qtest>,
    memory: GuestMemory,
    info: FunctionInfo,
    /// Serialises the address/data port pairs of configuration accesses.
    config: Mutex<()>,
    /// Raises seen by the last `wait_interrupt`.
    raises_seen: AtomicU64,
}

impl std::fmt::Debug for QtestPciFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QtestPciFunction")
            .field("info", &self.info)
            .finish()
    }
}

fn qtest_error(what: &str) -> impl FnOnce(QtestError) -> PciError + '_ {
    move |e| PciError::Io {
        what: what.to_string(),
        source: std::io::Error::other(e),
    }
}

fn invalid(what: String) -> PciError {
    PciError::InvalidAccess(what)
}

/// Configuration mechanism #1 address of `offset` in bus 0's `slot`.`function`.
fn config_address(slot: u8, function: u8, offset: u16) -> u32 {
    0x8000_0000 | u32::from(slot) << 11 | u32::from(function) << 8 | u32::from(offset & 0xfc)
}

fn check_size_alignment(offset: u64, len: usize, sizes: &[usize]) -> Result<(), PciError> {
    if !sizes.contains(&len) || !offset.is_multiple_of(len as u64) {
        return Err(invalid(format!(
            "{len}-byte access at {offset:#x} (sizes {sizes:?}, naturally aligned)"
        )));
    }
    Ok(())
}

/// Bump allocator of one address window.
struct Window {
    next: u64,
    end: u64,
}

impl Window {
    fn new((start, end): (u64, u64)) -> Self {
        Window { next: start, end }
    }

    fn take(&mut self, size: u64) -> Option<u64> {
        let base = self.next.checked_next_multiple_of(size)?;
        let end = base.checked_add(size)?;
        (end <= self.end).then(|| {
            self.next = end;
            base
        })
    }
}

impl QtestPciFunction {
    /// Finds the vrdma function on bus 0 of the machine behind `qtest`, assigns its BARs and
    /// intercepts the IOAPIC's inputs. `memory` is the machine's guest RAM.
    pub fn probe(qtest: Arc<Qtest>, memory: GuestMemory) -> Result<Self, PciError> {
        Self::probe_ids(qtest, memory, &VRDMA_IDS)
    }

    /// Like [`QtestPciFunction::probe`], for the first function with one of `ids`.
    pub fn probe_ids(
        qtest: Arc<Qtest>,
        memory: GuestMemory,
        ids: &[(u16, u16)],
    ) -> Result<Self, PciError> {
        let mut function = QtestPciFunction {
            qtest,
            memory,
            info: FunctionInfo {
                slot: 0,
                function: 0,
                vendor: 0,
                device: 0,
                bars: [None; 6],
            },
            config: Mutex::new(()),
            raises_seen: AtomicU64::new(0),
        };
        let (slot, func, vendor, device) = function.find(ids)?;
        function.info.slot = slot;
        function.info.function = func;
        function.info.vendor = vendor;
        function.info.device = device;
        function.info.bars = function.assign_bars()?;
        function
            .qtest
            .irq_intercept_in(IOAPIC)
            .map_err(qtest_error("intercepting the IOAPIC's interrupt lines"))?;
        log::info!(
            "vrdma function at 00:{slot:02x}.{func} ({vendor:04x}:{device:04x}), BARs {:x?}",
            function.info.bars
        );
        Ok(function)
    }

    /// Where the function is and what it decodes.
    pub fn info(&self) -> &FunctionInfo {
        &self.info
    }

    /// The machine's guest RAM.
    pub fn memory(&self) -> &GuestMemory {
        &self.memory
    }

    /// The qtest connection.
    pub fn qtest(&self) -> &Arc<Qtest> {
        &self.qtest
    }

    fn read_config_at(&self, slot: u8, func: u8, offset: u16, len: usize) -> Result<u32, PciError> {
        let _pair = self.config.lock();
        self.qtest
            .port_write(CONFIG_ADDRESS, 4, config_address(slot, func, offset))
            .and_then(|()| self.qtest.port_read(CONFIG_DATA + (offset & 3), len))
            .map_err(qtest_error("reading configuration space"))
    }

    fn write_config_at(
        &self,
        slot: u8,
        func: u8,
        offset: u16,
        len: usize,
        value: u32,
    ) -> Result<(), PciError> {
        let _pair = self.config.lock();
        self.qtest
            .port_write(CONFIG_ADDRESS, 4, config_address(slot, func, offset))
            .and_then(|()| {
                self.qtest
                    .port_write(CONFIG_DATA + (offset & 3), len, value)
            })
            .map_err(qtest_error("writing configuration space"))
    }

    fn read32(&self, offset: u16) -> Result<u32, PciError> {
        self.read_config_at(self.info.slot, self.info.function, offset, 4)
    }

    fn write32(&self, offset: u16, value: u32) -> Result<(), PciError> {
        self.write_config_at(self.info.slot, self.info.function, offset, 4, value)
    }

    /// The first function on bus 0 with one of `ids`.
    fn find(&self, ids: &[(u16, u16)]) -> Result<(u8, u8, u16, u16), PciError> {
        let mut seen = Vec::new();
        for slot in 0..32u8 {
            let mut functions = 1;
            let mut func = 0;
            while func < functions {
                let id = self.read_config_at(slot, func, 0, 4)?;
                let (vendor, device) = (id as u16, (id >> 16) as u16);
                if vendor == 0xffff {
                    if func == 0 {
                        break;
                    }
                    func += 1;
                    continue;
                }
                if func == 0 {
                    let header = self.read_config_at(slot, 0, PCI_HEADER_TYPE, 1)?;
                    if header & 0x80 != 0 {
                        functions = 8;
                    }
                }
                if ids.contains(&(vendor, device)) {
                    return Ok((slot, func, vendor, device));
                }
                seen.push(format!("00:{slot:02x}.{func} {vendor:04x}:{device:04x}"));
                func += 1;
            }
        }
        Err(PciError::NotFound(format!(
            "none of {ids:04x?} on bus 0 (found {})",
            seen.join(", ")
        )))
    }

    /// Sizes every BAR (decoding off meanwhile) and assigns it an address.
    fn assign_bars(&self) -> Result<[Option<Bar>; 6], PciError> {
        let command = self.read_config_at(self.info.slot, self.info.function, PCI_COMMAND, 2)?;
        let decoding = (COMMAND_IO | COMMAND_MEMORY) as u32;
        self.write_config_at(
            self.info.slot,
            self.info.function,
            PCI_COMMAND,
            2,
            command & !decoding,
        )?;
        let mut io = Window::new(IO_WINDOW);
        let mut mem32 = Window::new(MEM32_WINDOW);
        let mut mem64 = Window::new(MEM64_WINDOW);
        let mut bars = [None; 6];
        let mut index = 0;
        while index < 6 {
            let offset = PCI_BAR0 + 4 * index as u16;
            let original = self.read32(offset)?;
            self.write32(offset, u32::MAX)?;
            let mask = self.read32(offset)?;
            let (kind, prefetchable) = if original & 1 == 1 {
                (BarKind::Io, false)
            } else if (original >> 1) & 3 == 2 {
                (BarKind::Mem64, original & 8 != 0)
            } else {
                (BarKind::Mem32, original & 8 != 0)
            };
            let mut size_mask = match kind {
                BarKind::Io => u64::from(mask & !0x3) | 0xffff_ffff_0000_0000,
                _ => u64::from(mask & !0xf) | 0xffff_ffff_0000_0000,
            };
            if kind == BarKind::Mem64 {
                if index == 5 {
                    return Err(invalid(
                        "BAR5 claims to be the low half of a 64-bit BAR".into(),
                    ));
                }
                self.write32(offset + 4, u32::MAX)?;
                let high = self.read32(offset + 4)?;
                size_mask = (size_mask & 0xffff_ffff) | u64::from(high) << 32;
            }
            let unimplemented = mask == 0 || (kind == BarKind::Io && mask & !0x3 == 0);
            if unimplemented {
                self.write32(offset, original)?;
                index += 1;
                continue;
            }
            let size = (!size_mask).wrapping_add(1);
            let base = match kind {
                BarKind::Io => io.take(size),
                BarKind::Mem32 => mem32.take(size),
                BarKind::Mem64 => mem64.take(size),
            }
            .ok_or_else(|| {
                invalid(format!(
                    "no room for BAR{index} ({kind:?}, {size:#x} bytes)"
                ))
            })?;
            self.write32(offset, (base as u32) | (original & 0xf))?;
            if kind == BarKind::Mem64 {
                self.write32(offset + 4, (base >> 32) as u32)?;
            }
            bars[index] = Some(Bar {
                kind,
                prefetchable,
                base,
                size,
            });
            index += if kind == BarKind::Mem64 { 2 } else { 1 };
        }
        // Decoding stays off: the driver turns on memory space itself.
        Ok(bars)
    }

    /// The first virtio vendor capability of `cfg_type` (virtio 1.x §4.1.4): its BAR, offset
    /// and length.
    pub fn virtio_capability(&self, cfg_type: u8) -> Result<Option<(u8, u32, u32)>, PciError> {
        let (slot, func) = (self.info.slot, self.info.function);
        if self.read_config_at(slot, func, PCI_STATUS, 2)? & STATUS_CAPABILITIES == 0 {
            return Ok(None);
        }
        let mut next = self.read_config_at(slot, func, PCI_CAPABILITY_LIST, 1)? as u16 & 0xfc;
        // A list can hold at most 48 capabilities in 192 bytes; more means a loop.
        for _ in 0..48 {
            if next == 0 {
                break;
            }
            let head = self.read32(next)?;
            let (id, following, kind) = (head as u8, (head >> 8) as u16 & 0xfc, (head >> 24) as u8);
            if id == CAP_VENDOR_SPECIFIC && kind == cfg_type {
                let bar = self.read32(next + 4)? as u8;
                let offset = self.read32(next + 8)?;
                let length = self.read32(next + 12)?;
                return Ok(Some((bar, offset, length)));
            }
            next = following;
        }
        Ok(None)
    }

    /// The memory BAR `bar` and the bounds check of `[offset, offset + len)` in it.
    fn mem_bar(&self, bar: u8, offset: u64, len: u64) -> Result<Bar, PciError> {
        let found = self
            .info
            .bars
            .get(usize::from(bar))
            .copied()
            .flatten()
            .filter(|b| b.kind != BarKind::Io)
            .ok_or_else(|| invalid(format!("BAR{bar} is not a memory BAR")))?;
        if offset.checked_add(len).is_none_or(|end| end > found.size) {
            return Err(invalid(format!(
                "{len:#x} bytes at {offset:#x} lie outside BAR{bar} ({:#x} bytes)",
                found.size
            )));
        }
        Ok(found)
    }
}

impl PciFunction for QtestPciFunction {
    fn config_read(&self, offset: u16, buf: &mut [u8]) -> Result<(), PciError> {
        check_size_alignment(u64::from(offset), buf.len(), &[1, 2, 4])?;
        if offset >= CONFIG_SPACE {
            return Err(invalid(format!(
                "configuration offset {offset:#x} needs extended configuration access"
            )));
        }
        let value = self.read_config_at(self.info.slot, self.info.function, offset, buf.len())?;
        buf.copy_from_slice(&value.to_le_bytes()[..buf.len()]);
        Ok(())
    }

    fn config_write(&self, offset: u16, data: &[u8]) -> Result<(), PciError> {
        check_size_alignment(u64::from(offset), data.len(), &[1, 2, 4])?;
        if offset >= CONFIG_SPACE {
            return Err(invalid(format!(
                "configuration offset {offset:#x} needs extended configuration access"
            )));
        }
        let mut bytes = [0u8; 4];
        bytes[..data.len()].copy_from_slice(data);
        self.write_config_at(
            self.info.slot,
            self.info.function,
            offset,
            data.len(),
            u32::from_le_bytes(bytes),
        )
    }

    fn bar_read(&self, bar: u8, offset: u64, buf: &mut [u8]) -> Result<(), PciError> {
        check_size_alignment(offset, buf.len(), &[1, 2, 4, 8])?;
        let found = self.mem_bar(bar, offset, buf.len() as u64)?;
        let value = self
            .qtest
            .mem_read(found.base + offset, buf.len())
            .map_err(qtest_error("reading a BAR register"))?;
        buf.copy_from_slice(&value.to_le_bytes()[..buf.len()]);
        Ok(())
    }

    fn bar_write(&self, bar: u8, offset: u64, data: &[u8]) -> Result<(), PciError> {
        check_size_alignment(offset, data.len(), &[1, 2, 4, 8])?;
        let found = self.mem_bar(bar, offset, data.len() as u64)?;
        let mut bytes = [0u8; 8];
        bytes[..data.len()].copy_from_slice(data);
        self.qtest
            .mem_write(found.base + offset, data.len(), u64::from_le_bytes(bytes))
            .map_err(qtest_error("writing a BAR register"))
    }

    fn bar_region(&self, bar: u8, offset: u64, len: u64) -> Result<SharedMemory, PciError> {
        let found = self.mem_bar(bar, offset, len)?;
        let region_len =
            usize::try_from(len).map_err(|_| invalid(format!("a region of {len:#x} bytes")))?;
        let access = QtestRegion {
            qtest: self.qtest.clone(),
            base: found.base + offset,
            len,
            failed: AtomicBool::new(false),
        };
        Ok(SharedMemory::accessed(Arc::new(access), region_len))
    }

    fn dma(&self) -> Arc<dyn DmaMemory> {
        Arc::new(self.memory.clone())
    }

    fn wait_interrupt(&self, timeout: Duration) -> Result<bool, PciError> {
        let seen = self.raises_seen.load(Ordering::Acquire);
        let state = self
            .qtest
            .wait_irq(seen, timeout)
            .map_err(qtest_error("waiting for an interrupt"))?;
        match state {
            Some(state) => {
                self.raises_seen.fetch_max(state.raises, Ordering::AcqRel);
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// A BAR range reached through qtest memory accesses.
struct QtestRegion {
    qtest: Arc<Qtest>,
    base: u64,
    len: u64,
    /// Whether a failure was logged already (only the first is).
    failed: AtomicBool,
}

impl QtestRegion {
    fn inside(&self, offset: u64, len: usize) -> bool {
        offset
            .checked_add(len as u64)
            .is_some_and(|end| end <= self.len)
    }

    fn note_failure(&self, what: &str, offset: u64, error: &dyn std::fmt::Display) {
        if !self.failed.swap(true, Ordering::Relaxed) {
            log::error!(
                "shared-memory {what} at {offset:#x} failed (later failures are not logged): {error}"
            );
        }
    }
}

impl RegionAccess for QtestRegion {
    fn read(&self, offset: u64, buf: &mut [u8]) {
        let result = if self.inside(offset, buf.len()) {
            self.qtest
                .read_bytes(self.base + offset, buf)
                .map_err(|e| e.to_string())
        } else {
            Err(format!("{} bytes outside the region", buf.len()))
        };
        if let Err(e) = result {
            self.note_failure("read", offset, &e);
            buf.fill(0xff);
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        let result = if self.inside(offset, data.len()) {
            self.qtest
                .write_bytes(self.base + offset, data)
                .map_err(|e| e.to_string())
        } else {
            Err(format!("{} bytes outside the region", data.len()))
        };
        if let Err(e) = result {
            self.note_failure("write", offset, &e);
        }
    }

    fn load_u32(&self, offset: u64) -> u32 {
        // Each request completes (QEMU answered) before the next is sent, and QEMU performs
        // them in order: the load is ordered before every later access.
        let result = if self.inside(offset, 4) && offset.is_multiple_of(4) {
            self.qtest
                .mem_read(self.base + offset, 4)
                .map(|v| v as u32)
                .map_err(|e| e.to_string())
        } else {
            Err("a misplaced 32-bit load".to_string())
        };
        match result {
            Ok(value) => value,
            Err(e) => {
                self.note_failure("load", offset, &e);
                u32::MAX
            }
        }
    }

    fn store_u32(&self, offset: u64, value: u32) {
        // Earlier accesses through qtest completed before this request is sent; earlier
        // stores to guest RAM by this thread are made visible by the socket write.
        let result = if self.inside(offset, 4) && offset.is_multiple_of(4) {
            self.qtest
                .mem_write(self.base + offset, 4, u64::from(value))
                .map_err(|e| e.to_string())
        } else {
            Err("a misplaced 32-bit store".to_string())
        };
        if let Err(e) = result {
            self.note_failure("store", offset, &e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_addresses_follow_mechanism_one() {
        assert_eq!(config_address(0, 0, 0), 0x8000_0000);
        assert_eq!(config_address(1, 0, 0x10), 0x8000_0810);
        assert_eq!(config_address(0x1f, 7, 0xff), 0x8000_fffc);
    }

    #[test]
    fn windows_align_and_fill() {
        let mut w = Window::new((0xe000_0000, 0xe001_0000));
        assert_eq!(w.take(0x1000), Some(0xe000_0000));
        assert_eq!(w.take(0x4000), Some(0xe000_4000));
        assert_eq!(w.take(0x8000), Some(0xe000_8000));
        assert_eq!(w.take(0x1000), None);
        let mut high = Window::new(MEM64_WINDOW);
        assert_eq!(high.take(1 << 27), Some(0x1_0000_0000));
        assert_eq!(high.take(0x4000), Some(0x1_0800_0000));
    }

    #[test]
    fn accesses_must_be_sized_and_aligned() {
        assert!(check_size_alignment(4, 4, &[1, 2, 4]).is_ok());
        assert!(check_size_alignment(6, 2, &[1, 2, 4]).is_ok());
        assert!(check_size_alignment(2, 4, &[1, 2, 4]).is_err());
        assert!(check_size_alignment(0, 8, &[1, 2, 4]).is_err());
        assert!(check_size_alignment(0, 3, &[1, 2, 4, 8]).is_err());
    }
}

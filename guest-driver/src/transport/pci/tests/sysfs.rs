//! Discovery of the vrdma function in a fake sysfs PCI bus: unbinding, the magic check, and the
//! mapped BARs.

use std::sync::Arc;

use crate::dma::DmaMemory;
use crate::transport::pci::function::{PciError, PciFunction};
use crate::transport::process::ProcessDma;

use super::fake_device::*;

/// A sysfs PCI bus in a temporary directory, removed on drop.
struct FakeSysfs {
    root: std::path::PathBuf,
}

impl FakeSysfs {
    fn new(name: &str) -> Self {
        let root = std::env::temp_dir().join(format!("vrdma-sysfs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("devices")).unwrap();
        std::fs::write(root.join("drivers_probe"), "").unwrap();
        FakeSysfs { root }
    }

    /// A function at `address` with IDs `vendor:device`, the virtio capabilities of
    /// [`FakeDevice`], a bound driver, and `magic` in its device configuration.
    fn add(&self, address: &str, ids: (u16, u16), magic: &[u8; 4]) -> std::path::PathBuf {
        let dir = self.root.join("devices").join(address);
        std::fs::create_dir_all(dir.join("driver")).unwrap();
        std::fs::write(dir.join("driver/unbind"), "").unwrap();
        std::fs::write(dir.join("vendor"), format!("{:#06x}\n", ids.0)).unwrap();
        std::fs::write(dir.join("device"), format!("{:#06x}\n", ids.1)).unwrap();
        std::fs::write(dir.join("enable"), "0").unwrap();
        std::fs::write(dir.join("config"), FakeDevice::new().config_space).unwrap();
        let zero = "0x0000000000000000 0x0000000000000000 0x0000000000000000\n";
        let bar2 = "0x00000000fe000000 0x00000000fe003fff 0x0000000000140204\n";
        std::fs::write(
            dir.join("resource"),
            format!("{zero}{zero}{bar2}{zero}{zero}{zero}{zero}"),
        )
        .unwrap();
        let mut bar = vec![0u8; 0x4000];
        put(&mut bar, DEVICE_OFFSET as usize, magic);
        std::fs::write(dir.join("resource2"), bar).unwrap();
        dir
    }

    fn read(&self, path: &str) -> String {
        std::fs::read_to_string(self.root.join(path)).unwrap()
    }
}

impl Drop for FakeSysfs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

#[test]
fn sysfs_discovery_unbinds_checks_the_magic_and_maps_the_bars() {
    use crate::transport::pci::sysfs::SysfsPciFunction;
    let sysfs = FakeSysfs::new("discovery");
    sysfs.add("0000:00:01.0", (0x1af4, 0x106a), b"XXXX");
    sysfs.add("0000:00:02.0", (0x8086, 0x1066), b"vRDM");
    let vrdma = sysfs.add("0000:00:03.0", (0x1af4, 0x1066), b"vRDM");
    let dma: Arc<dyn DmaMemory> = Arc::new(ProcessDma::new(1 << 20).unwrap());
    let function = SysfsPciFunction::open_in(&sysfs.root, None, dma.clone()).unwrap();
    assert_eq!(function.address(), "0000:00:03.0");
    // The function without the magic was released and handed back; the other one kept.
    assert_eq!(
        sysfs.read("devices/0000:00:01.0/driver/unbind"),
        "0000:00:01.0"
    );
    assert_eq!(sysfs.read("drivers_probe"), "0000:00:01.0");
    assert_eq!(
        sysfs.read("devices/0000:00:03.0/driver/unbind"),
        "0000:00:03.0"
    );
    assert_eq!(sysfs.read("devices/0000:00:03.0/enable"), "1");
    assert_eq!(sysfs.read("devices/0000:00:02.0/driver/unbind"), "");

    // Registers are the mapped resource file.
    function
        .bar_write(2, 0x18, &0x1234u16.to_le_bytes())
        .unwrap();
    function
        .bar_write(2, 0x20, &u64::MAX.to_le_bytes())
        .unwrap();
    let mut word = [0u8; 4];
    function.bar_read(2, DEVICE_OFFSET, &mut word).unwrap();
    assert_eq!(&word, b"vRDM");
    let file = std::fs::read(vrdma.join("resource2")).unwrap();
    assert_eq!(&file[0x18..0x1a], &[0x34, 0x12]);
    assert_eq!(&file[0x20..0x28], &[0xff; 8]);
    let mut id = [0u8; 2];
    function.config_read(2, &mut id).unwrap();
    assert_eq!(u16::from_le_bytes(id), 0x1066);
    for (bar, offset, len) in [(2, 0x4000, 4), (2, 2, 4), (0, 0, 4), (2, 0, 3), (7, 0, 1)] {
        assert!(
            matches!(
                function.bar_read(bar, offset, &mut vec![0; len]),
                Err(PciError::InvalidAccess(_))
            ),
            "BAR {bar} offset {offset:#x} len {len}"
        );
    }
    let region = function.bar_region(2, 0x1000, 0x3000).unwrap();
    assert_eq!(region.len(), 0x3000);
    assert!(function.bar_region(2, 0x1000, 0x3001).is_err());

    // An explicit address must name a vrdma function.
    let error = SysfsPciFunction::open_in(&sysfs.root, Some("00:02.0"), dma.clone())
        .err()
        .unwrap();
    assert!(matches!(error, PciError::NotFound(_)), "{error}");
    // (The first open let go of it: one driver at a time.)
    drop(function);
    let chosen = SysfsPciFunction::open_in(&sysfs.root, Some("00:03.0"), dma).unwrap();
    assert_eq!(chosen.address(), "0000:00:03.0");
}

#[test]
fn sysfs_discovery_says_what_it_scanned() {
    use crate::transport::pci::sysfs::SysfsPciFunction;
    let sysfs = FakeSysfs::new("absent");
    sysfs.add("0000:00:02.0", (0x8086, 0x1234), b"vRDM");
    let dma: Arc<dyn DmaMemory> = Arc::new(ProcessDma::new(1 << 20).unwrap());
    let error = SysfsPciFunction::open_in(&sysfs.root, None, dma.clone())
        .err()
        .unwrap();
    let text = error.to_string();
    assert!(
        text.contains("none of the 1 functions") && text.contains("1af4:106a"),
        "{text}"
    );
    sysfs.add("0000:00:05.0", (0x1af4, 0x1066), b"nope");
    let error = SysfsPciFunction::open_in(&sysfs.root, None, dma)
        .err()
        .unwrap();
    assert!(error.to_string().contains("0000:00:05.0"), "{error}");
}

#[test]
fn a_function_another_driver_holds_is_refused_until_it_lets_go() {
    use crate::transport::pci::sysfs::SysfsPciFunction;
    let sysfs = FakeSysfs::new("busy");
    sysfs.add("0000:00:03.0", (0x1af4, 0x1066), b"vRDM");
    let dma: Arc<dyn DmaMemory> = Arc::new(ProcessDma::new(1 << 20).unwrap());
    let first = SysfsPciFunction::open_in(&sysfs.root, None, dma.clone()).unwrap();
    // A second driver (here: a second open file of the same process, as another process's
    // would be) is refused, by address and by search.
    for address in [Some("00:03.0"), None] {
        match SysfsPciFunction::open_in(&sysfs.root, address, dma.clone()) {
            Err(PciError::Busy(why)) => assert!(why.contains("0000:00:03.0"), "{why}"),
            other => panic!("{address:?}: {:?}", other.map(|f| f.address().to_string())),
        }
    }
    drop(first);
    let again = SysfsPciFunction::open_in(&sysfs.root, None, dma).unwrap();
    assert_eq!(again.address(), "0000:00:03.0");
}

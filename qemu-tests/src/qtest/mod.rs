//! The real QEMU vrdma device driven through QEMU's qtest protocol.
//!
//! QEMU runs the `vhost-user-test-device-pci` device backed by vrdma-backend with no guest CPU
//! (`-accel qtest`); the test process is the guest: it plays firmware and driver through
//! qtest requests ([`client`], speaking the line format of [`protocol`], failing with the
//! errors of [`error`]), reaches guest RAM directly through the shared memory-backend file
//! ([`memory`]) and offers the device to the library's PCI transport as a
//! [`PciFunction`](vrdma::transport::pci::PciFunction) ([`function`]).

#[allow(unsafe_code)] // the parent-death signal of the QEMU child
pub mod client;
pub mod error;
pub mod function;
#[allow(unsafe_code)] // mmap of the guest-RAM file
pub mod memory;
pub mod protocol;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use client::{QemuCommand, Qtest};
pub use error::QtestError;
pub use function::QtestPciFunction;
pub use memory::GuestMemory;

/// The virtio device ID QEMU 11.1.3 can instantiate for vrdma (42 aborts it; see the spec).
pub const CARRIER_VIRTIO_ID: u16 = 38;

/// Errors of starting a qtest machine.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    #[error("guest RAM file {path}: {source}")]
    Memory {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Qtest(#[from] QtestError),
    #[error(transparent)]
    Pci(#[from] vrdma::transport::pci::PciError),
}

/// What machine to start.
#[derive(Debug, Clone)]
pub struct MachineConfig {
    /// The QEMU binary.
    pub qemu: std::ffi::OsString,
    /// The backend's vhost-user socket.
    pub backend_socket: PathBuf,
    /// Guest RAM in MiB.
    pub memory_mib: u32,
    /// Virtqueue size the device offers.
    pub vq_size: u16,
    /// Bound of each qtest reply.
    pub reply_timeout: Duration,
}

impl MachineConfig {
    /// A machine with 256 MiB of RAM and 256-entry queues, vrdma at `backend_socket`.
    pub fn new(backend_socket: &Path) -> Self {
        MachineConfig {
            qemu: QemuCommand::default_binary(),
            backend_socket: backend_socket.to_path_buf(),
            memory_mib: 256,
            vq_size: 256,
            reply_timeout: Duration::from_secs(30),
        }
    }
}

/// A directory for the guest-RAM file: /dev/shm where it exists, else the temp dir.
fn ram_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// The QEMU arguments of a q35 machine with RAM from `ram` and no devices.
pub fn machine_args(config: &MachineConfig, ram: &Path) -> Vec<String> {
    let mib = config.memory_mib;
    vec![
        "-machine".into(),
        "q35".into(),
        "-display".into(),
        "none".into(),
        "-nodefaults".into(),
        "-m".into(),
        format!("{mib}M"),
        "-object".into(),
        format!(
            "memory-backend-file,id=mem,size={mib}M,mem-path={},share=on",
            ram.display()
        ),
        "-numa".into(),
        "node,memdev=mem".into(),
    ]
}

/// The QEMU arguments of the vrdma device on the backend at `config.backend_socket`.
pub fn vrdma_device_args(config: &MachineConfig) -> Vec<String> {
    vec![
        "-chardev".into(),
        format!("socket,id=vrdma,path={}", config.backend_socket.display()),
        "-device".into(),
        format!(
            "vhost-user-test-device-pci,chardev=vrdma,virtio-id={CARRIER_VIRTIO_ID},num_vqs=3,\
             config_size=64,vq_size={}",
            config.vq_size
        ),
    ]
}

/// A running QEMU with the vrdma device and its guest RAM.
pub struct Machine {
    pub qtest: Arc<Qtest>,
    pub memory: GuestMemory,
}

impl Machine {
    /// Creates guest RAM, starts QEMU with the vrdma device and waits for its qtest
    /// connection.
    pub fn start(config: &MachineConfig) -> Result<Machine, MachineError> {
        Self::start_with(config, vrdma_device_args(config))
    }

    /// Like [`Machine::start`], with `devices` (QEMU arguments) instead of the vrdma device.
    pub fn start_with(
        config: &MachineConfig,
        devices: Vec<String>,
    ) -> Result<Machine, MachineError> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let path = ram_dir().join(format!(
            "vrdma-qtest-ram-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let len = usize::try_from(config.memory_mib).unwrap_or(0) << 20;
        let memory = GuestMemory::create(&path, len).map_err(|source| MachineError::Memory {
            path: path.clone(),
            source,
        })?;
        let command = QemuCommand {
            binary: config.qemu.clone(),
            args: [machine_args(config, &path), devices].concat(),
            connect_timeout: Duration::from_secs(60),
            reply_timeout: config.reply_timeout,
        };
        // Once QEMU answers a request the machine is built and the file mapped: its name can
        // go then, so that nothing is left behind in /dev/shm whatever happens later.
        let qtest = match Qtest::spawn(&command) {
            Ok(qtest) => qtest,
            Err(e) => {
                let _ = memory.unlink();
                return Err(e.into());
            }
        };
        let endianness = qtest.request("endianness");
        let _ = memory.unlink();
        let endianness = endianness?;
        // Register values cross the protocol as numbers in the target's byte order.
        if endianness != "little" {
            return Err(QtestError::BadReply {
                command: "endianness".into(),
                reply: endianness,
            }
            .into());
        }
        Ok(Machine {
            qtest: Arc::new(qtest),
            memory,
        })
    }

    /// The vrdma PCI function, BARs assigned.
    pub fn function(&self) -> Result<QtestPciFunction, MachineError> {
        Ok(QtestPciFunction::probe(
            self.qtest.clone(),
            self.memory.clone(),
        )?)
    }

    /// Kills QEMU (SIGKILL), as a crash would end it.
    pub fn kill(&self) {
        self.qtest.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vrdma::transport::pci::PciFunction;

    /// Any QEMU can run this: a modern virtio-rng function stands in for vrdma, so the
    /// client, BAR assignment (32- and 64-bit), BAR accesses and guest RAM are checked on the
    /// host; the vrdma device itself needs QEMU 11.1 and runs in the rxe VM.
    #[test]
    fn drives_a_virtio_function_on_q35() {
        let config = MachineConfig::new(Path::new("/nonexistent"));
        if !client::supports_qtest(&config.qemu) {
            eprintln!(
                "skipped: {} is missing or lacks the qtest accelerator",
                config.qemu.to_string_lossy()
            );
            return;
        }
        let machine = Machine::start_with(
            &MachineConfig {
                memory_mib: 64,
                ..config
            },
            vec!["-device".into(), "virtio-rng-pci,disable-legacy=on".into()],
        )
        .unwrap();
        assert!(!machine.memory.path().exists(), "the RAM file is unlinked");
        let function = QtestPciFunction::probe_ids(
            machine.qtest.clone(),
            machine.memory.clone(),
            &[(vrdma::spec::PCI_VENDOR_ID, 0x1044)],
        )
        .unwrap();
        let bars = function.info().bars;
        let mem64 = bars
            .iter()
            .flatten()
            .find(|b| b.kind == function::BarKind::Mem64)
            .expect("a 64-bit BAR");
        assert!(mem64.base >= 1 << 32, "{bars:x?}");
        let mut command = [0u8; 2];
        function.config_read(4, &mut command).unwrap();
        command[0] |= 0x6; // memory space, bus master
        function.config_write(4, &command).unwrap();

        let (bar, offset, len) = function.virtio_capability(1).unwrap().expect("common cfg");
        assert!(len >= 0x38);
        // num_queues (le16 at 0x12) of virtio-rng is 1; device_status (0x14) starts at 0.
        let mut num_queues = [0u8; 2];
        function
            .bar_read(bar, u64::from(offset) + 0x12, &mut num_queues)
            .unwrap();
        assert_eq!(u16::from_le_bytes(num_queues), 1);
        let region = function
            .bar_region(bar, u64::from(offset), u64::from(len))
            .unwrap();
        let access = region.access().expect("reached through qtest");
        // device_feature_select (0x00) is read/write: a store and a load round-trip.
        access.store_u32(0, 1);
        assert_eq!(access.load_u32(0), 1);
        let mut bytes = [0u8; 4];
        access.read(0, &mut bytes);
        assert_eq!(u32::from_le_bytes(bytes), 1);
        // Out of the region: all-ones, like a master abort.
        assert_eq!(access.load_u32(u64::from(len)), u32::MAX);
        assert!(function.bar_read(bar, mem64.size, &mut bytes).is_err());

        // Guest RAM: what the test writes at a bus address is what QEMU reads there.
        let dma = function.dma();
        let mut buffer = dma.alloc(64, 1).unwrap();
        let bus = dma.translate(buffer.as_ptr(), 64).unwrap()[0];
        assert!(bus >= memory::RESERVED_LOW as u64);
        buffer.as_mut_slice()[..6].copy_from_slice(b"qtest!");
        let mut seen = [0u8; 6];
        machine.qtest.read_bytes(bus, &mut seen).unwrap();
        assert_eq!(&seen, b"qtest!");
        machine.qtest.write_bytes(bus + 8, b"back").unwrap();
        assert_eq!(&buffer.as_slice()[8..12], b"back");

        // No interrupt is pending on an idle machine; a dead QEMU is an error, not a hang.
        assert!(!function.wait_interrupt(Duration::from_millis(20)).unwrap());
        machine.kill();
        assert!(function.wait_interrupt(Duration::from_secs(5)).is_err());
        assert_eq!(access.load_u32(0), u32::MAX);
        assert!(machine.qtest.exit_status().is_some());
    }
}

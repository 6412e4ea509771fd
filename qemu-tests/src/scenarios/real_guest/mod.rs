//! The real-guest suite: a Linux guest booted under QEMU 11.1 with the vrdma device (inside
//! the rxe VM, under KVM where it works and nested TCG otherwise) runs, against native peers
//! on the rxe VM's rxe0:
//! - `ibv_devinfo` and unmodified perftest over the drop-in `libibverbs.so.1` (PCI transport),
//!   the same perftest cases natively beside them. The guest runs perftest's server side and
//!   the native client measures: perftest calibrates its cycle counter against the clock at
//!   start-up and gives up (reporting `inf`) at random under nested TCG, while the rxe VM's
//!   clock is steady. The guest still sends half of every `ib_send_lat` exchange, and
//!   `ib_write_bw`'s payload lands in its registered pages;
//! - `vrdma-pingpong --pci`, every byte verified;
//! - unmodified `rping -V` over the drop-in librdmacm (the connection set up by the device's
//!   connection manager, no TCP at all) against a native rping server;
//! - the bypass proof: the backend stopped (SIGSTOP) while a native peer writes and sends into
//!   the guest, which verifies every message;
//! - a reboot (`reboot -f`) with a live RDMA application (QPs, MRs, mappings): QEMU must stay
//!   up, the backend must release everything, and the device must work in the next boot.
//!
//! The guest has no network. Each TCP exchange travels over its own virtio-serial port
//! ([`crate::relay`]); one more port carries the guest's requests to the host side (stop the
//! backend, check the device is idle) ([`control`]).
//!
//! [`host::run`] runs in the rxe VM, [`guest::run`] in the nested guest, once per boot.

pub mod control;
pub mod guest;
pub mod host;
pub mod installed;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::inside::ResourceCounts;
use crate::perftest::{Case, Row, Tool};

/// One TCP exchange carried over a virtio-serial port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// The virtio-serial port's name in the guest (and the chardev's id on the QEMU side).
    pub serial: &'static str,
    /// The TCP port, the same on both sides.
    pub tcp: u16,
}

/// The serial port of the guest's requests to the host side.
pub const CONTROL_PORT: &str = "vrdma-ctl";

/// How long the guest may take, both boots included: a hang bound, not a performance one
/// (under nested TCG here the guest took 10 to 30 minutes, its boots 3 to 12 of them). A hang
/// must end the suite, its diagnostics printed, well within CI's limit of the whole test
/// command (90 minutes, of which the other suites take about 15).
pub const GUEST_TIMEOUT: Duration = Duration::from_secs(2400);

/// How long the rxe VM around the guest may take by default: the guest's bound, and the
/// native runs and releases before and after it.
pub const RXE_VM_TIMEOUT: Duration = Duration::from_secs(GUEST_TIMEOUT.as_secs() + 600);
/// `vrdma-pingpong --pci` against the native server.
pub const PINGPONG: Link = Link {
    serial: "vrdma-pp",
    tcp: 18800,
};
/// The one-way run into the guest with the backend stopped (the guest is the server).
pub const BYPASS: Link = Link {
    serial: "vrdma-bypass",
    tcp: 18801,
};
/// The application that is running when the guest reboots.
pub const LIVE: Link = Link {
    serial: "vrdma-live",
    tcp: 18802,
};
/// The ping-pong in the boot after the reboot.
pub const AFTER_REBOOT: Link = Link {
    serial: "vrdma-after",
    tcp: 18803,
};
/// The unprivileged ping-pongs through the guest agent (`vrdma-guestd --pci`), at once.
pub const THROUGH_AGENT: [Link; 2] = [
    Link {
        serial: "vrdma-agent-a",
        tcp: 18804,
    },
    Link {
        serial: "vrdma-agent-b",
        tcp: 18805,
    },
];
/// A third process through the agent, SIGKILLed in mid-traffic while the two others run.
pub const AGENT_VICTIM: Link = Link {
    serial: "vrdma-agent-victim",
    tcp: 18806,
};
/// The application running when the back-end is killed under the guest (behind the keeper).
pub const RESTART_LIVE: Link = Link {
    serial: "vrdma-restart",
    tcp: 18807,
};
/// The ping-pong on the next back-end, in the same boot.
pub const AFTER_RESTART: Link = Link {
    serial: "vrdma-after-restart",
    tcp: 18808,
};
/// Operations and sizes of the ping-pongs through the agent.
pub const AGENT_OPS: &str = "send,write,read";
pub const AGENT_SIZES: &str = "64,4096";
/// Registrable memory of each process of the agent, in MiB (pinned where registered).
pub const AGENT_PROCESS_MIB: u32 = 16;
/// What the agent may pin for one user's registrations (`--max-pinned-mib-per-user`), in MiB:
/// enough for the package user's processes, and what the hostile root process runs into.
pub const AGENT_PIN_BUDGET_MIB: u64 = 6;

/// Unmodified perftest: server in the guest over the drop-in, client native (it measures);
/// the same cases run natively beside it.
pub const PERFTEST: &[(Case, Link)] = &[
    (
        Case {
            tool: Tool::IbSendLat,
            size: 2,
            iterations: 200,
        },
        Link {
            serial: "vrdma-lat",
            tcp: 18810,
        },
    ),
    (
        Case {
            tool: Tool::IbWriteBw,
            size: 65536,
            iterations: 300,
        },
        Link {
            serial: "vrdma-bw64k",
            tcp: 18811,
        },
    ),
];

/// Unmodified perftest with its server in the guest as the package's user through the guest agent over
/// the same PCI function, native client measuring: compared with the same case of
/// [`PERFTEST`], whose server is a root process on the PCI transport, in the same boot.
pub const AGENT_PERFTEST: &[(Case, Link)] = &[(
    Case {
        tool: Tool::IbSendLat,
        size: 2,
        iterations: 200,
    },
    Link {
        serial: "vrdma-agent-lat",
        tcp: 18813,
    },
)];

/// Every link, in the order the guest uses them.
pub fn links() -> Vec<Link> {
    let mut links = vec![PINGPONG];
    links.extend(PERFTEST.iter().map(|(_, link)| *link));
    links.extend([BYPASS, RESTART_LIVE, AFTER_RESTART, LIVE, AFTER_REBOOT]);
    links.extend(THROUGH_AGENT);
    links.push(AGENT_VICTIM);
    links.extend(AGENT_PERFTEST.iter().map(|(_, link)| *link));
    links
}

/// rping's server port on the rxe VM, and the pings (each checked with `-V`).
pub const RPING_PORT: u16 = 7600;
pub const RPING_COUNT: u32 = 10;
/// The native rping server the guest's rping as the package's user through the agent meets.
pub const AGENT_RPING_PORT: u16 = 7601;
/// The port of the guest's rping server as the package's user through the agent (a native client
/// connects to it).
pub const AGENT_RPING_SERVER_PORT: u16 = 7602;
/// The native ucmatose server the guest's ucmatose as the package's user through the agent meets, and
/// the port of the guest's ucmatose server a native client connects to.
pub const AGENT_UCMATOSE_PORT: u16 = 7603;
pub const AGENT_UCMATOSE_SERVER_PORT: u16 = 7604;
/// The native rstream server the guest's rstream as the package's user through the agent
/// meets.
pub const AGENT_RSTREAM_PORT: u16 = 7605;

/// Operations and sizes of the verified ping-pong.
pub const PINGPONG_OPS: &str = "send,send_imm,write,write_imm,read";
/// Inline, one page, and sixteen pages (a message crossing page boundaries of guest memory).
pub const PINGPONG_SIZES: &str = "64,4096,65536";
/// The one-way run into the guest.
pub const BYPASS_OPS: &str = "write,send,write_imm,send_imm";
pub const BYPASS_SIZES: &str = "64,65536";
/// Messages per op and size of the one-way run (each one is acknowledged over the serial
/// relay, a slow round trip in a nested guest).
pub const BYPASS_MESSAGES: u32 = 10;
/// The live application: far more iterations than it can finish before the reboot.
pub const LIVE_ITERS: u32 = 1_000_000;

/// Guest RAM in MiB (shared with the backend through a memfd).
pub const GUEST_MEMORY_MIB: u32 = 1024;
/// 2 MiB hugepages reserved in the guest for the driver's ring memory.
pub const GUEST_HUGEPAGES: u32 = 64;

/// What to run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The prepared root file system (shared into the rxe VM at its host path).
    pub root_dir: PathBuf,
    /// Directory with the drop-in as libibverbs.so.1.
    pub library_dir: PathBuf,
    /// The `vrdma-guest` Debian package the guest installs.
    pub guest_package: PathBuf,
    /// Iterations per operation and size of the verified ping-pong.
    pub iters: u32,
    /// End with the reboot with a live application (a second boot).
    pub reboot: bool,
    /// Bound on the whole guest run.
    pub timeout: Duration,
}

/// What the guest showed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// How QEMU ran the guest ("Kvm" or "Tcg").
    pub accel: String,
    /// The guest's boots, from QEMU's start to its exit.
    pub elapsed_secs: f64,
    pub first_boot: FirstBoot,
    /// perftest with its server in the guest over vrdma next to the same case natively in
    /// the rxe VM, in [`PERFTEST`] order.
    pub perftest: Vec<Comparison>,
    /// The reboot with a live application, when it was asked for.
    pub reboot: Option<Reboot>,
    /// perftest with its server in the guest through the agent (`vrdma`, as the package's user) next
    /// to the same case with a root process on the PCI transport (`native` holds that row),
    /// in [`AGENT_PERFTEST`] order.
    #[serde(default)]
    pub through_agent: Vec<Comparison>,
    /// The `vrdma-guest` package the guest ran from (the steps through the agent): installed
    /// into its root before it booted, purged after it.
    #[serde(default)]
    pub package: installed::PackageRecord,
}

/// What the guest's first boot left in the result directory.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FirstBoot {
    /// Where the time went: (phase, seconds); the first ones ("boot: …") add up to the guest's
    /// uptime when the suite started.
    pub phases: Vec<(String, f64)>,
    /// `ibv_devinfo` over the drop-in.
    pub devinfo: String,
    /// vrdma-pingpong's table.
    pub pingpong: String,
    /// Messages per op and size verified with the backend stopped.
    pub bypass_messages: u32,
    /// The pings unmodified `rping -V` in the guest printed, each one checked by rping.
    #[serde(default)]
    pub rping_pings: u32,
    /// The tables of the unprivileged ping-pongs that ran at once through the guest agent.
    #[serde(default)]
    pub through_agent: Vec<String>,
    /// What the agent said when it released the objects of the process killed among them.
    #[serde(default)]
    pub agent_victim_released: String,
    /// Pings verified by unmodified `rping -V` as the package's user through the agent: the guest's
    /// client against a native server, and the guest's server against a native client.
    #[serde(default)]
    pub agent_rping_pings: [u32; 2],
    /// Unmodified ucmatose as the package's user through the agent: what the guest's client printed
    /// against a native server, and what the host side saw of its native client against the
    /// guest's server.
    #[serde(default)]
    pub agent_ucmatose: Vec<String>,
    /// Unmodified rstream (rsockets, every byte checked) as the package's user through the
    /// agent against a native rstream server: the guest client's result line.
    #[serde(default)]
    pub agent_rstream: String,
    /// What the agent published at the system paths for discovery, as `(path, what it holds)`
    /// ([`crate::scenarios::discovery::published_in_vm`]).
    #[serde(default)]
    pub agent_published: Vec<(String, String)>,
    /// Registrations a hostile process of another user made through the agent before it was
    /// refused at the pin budget, while the package user's ping-pongs ran; and what it saw.
    #[serde(default)]
    pub agent_pin_registered: u64,
    #[serde(default)]
    pub agent_pin_budget: String,
    /// The back-end killed under a running application and replaced, in the same boot.
    #[serde(default)]
    pub daemon_restart: DaemonRestart,
}

/// The back-end killed under the guest (QEMU behind vrdma-keeper, spec §11.5).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DaemonRestart {
    /// How the application running at the kill ended (its last words).
    pub interrupted: String,
    /// Whether it exited with success (it must not: its device state is gone).
    pub interrupted_succeeded: bool,
    /// What the host side saw: rxe0 idle with no daemon, the next daemon started.
    pub host: String,
    /// vrdma-pingpong's table on the next daemon.
    pub pingpong: String,
}

/// What the boot after the reboot left.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SecondBoot {
    pub phases: Vec<(String, f64)>,
    /// vrdma-pingpong's table after the reboot.
    pub pingpong: String,
}

/// The reboot with a live application.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Reboot {
    /// What rxe0 held while the live application ran (its native peer's objects included).
    pub live: ResourceCounts,
    /// From the guest's report of its new boot to rxe0 being idle, in ms.
    pub release_ms: u64,
    /// What the boot after the reboot did.
    pub after: SecondBoot,
}

/// One perftest case in the guest next to the same case natively.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub native: Row,
    pub vrdma: Row,
}

impl Comparison {
    /// vrdma's figure over native's: for latency lower is better, for bandwidth higher.
    pub fn ratio(&self) -> f64 {
        let native = self.native.measurement.headline();
        if native > 0.0 {
            self.vrdma.measurement.headline() / native
        } else {
            f64::NAN
        }
    }
}

/// The comparison table.
pub fn render_comparison(rows: &[Comparison]) -> String {
    render_columns(rows, ("native", "vrdma-guest"))
}

/// A comparison table whose two figures are headed `columns` (what `native` and `vrdma`
/// hold).
pub fn render_columns(rows: &[Comparison], columns: (&str, &str)) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<14} {:>8} {:>6} {:>11} {:>12} {:>12} {:>7}",
        "tool", "size", "iters", "unit", columns.0, columns.1, "ratio"
    );
    for row in rows {
        let tool = row.native.tool;
        let _ = writeln!(
            out,
            "{:<14} {:>8} {:>6} {:>11} {:>12} {:>12} {:>7}",
            tool.command(),
            row.native.size,
            row.native.iterations,
            tool.headline_unit(),
            // An untimed run (a figure perftest could not give) shows as such.
            row.native.measurement.headline_text(),
            row.vrdma.measurement.headline_text(),
            format!("{:.2}", row.ratio())
        );
    }
    out
}

/// Where the guest's time went, one line.
pub fn render_phases(phases: &[(String, f64)]) -> String {
    phases
        .iter()
        .map(|(name, secs)| format!("{name} {secs:.0} s"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The QEMU arguments that give the guest shared RAM, the vrdma device and the serial ports,
/// each port's chardev a server socket `<dir>/<name>.sock`.
pub fn guest_device_args(backend_socket: &Path, chardev_dir: &Path) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "-object".into(),
        format!("memory-backend-memfd,id=mem,size={GUEST_MEMORY_MIB}M,share=on"),
        "-machine".into(),
        "memory-backend=mem".into(),
        "-chardev".into(),
        format!("socket,id=vrdma0,path={}", backend_socket.display()),
        "-device".into(),
        "vhost-user-test-device-pci,chardev=vrdma0,virtio-id=38,num_vqs=3,vq_size=256,config_size=64"
            .into(),
        "-device".into(),
        "virtio-serial-pci".into(),
    ];
    let ports = std::iter::once(CONTROL_PORT).chain(links().into_iter().map(|l| l.serial));
    for name in ports {
        args.extend([
            "-chardev".into(),
            format!(
                "socket,id={name},path={},server=on,wait=off",
                chardev_path(chardev_dir, name).display()
            ),
            "-device".into(),
            format!("virtserialport,chardev={name},name={name}"),
        ]);
    }
    args
}

/// The QEMU chardev socket of the serial port `name`.
pub fn chardev_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.sock"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perftest::Measurement;

    #[test]
    fn the_guest_gets_shared_ram_the_device_and_a_port_per_link() {
        let args = guest_device_args(Path::new("/run/b.sock"), Path::new("/run/c"));
        let joined = args.join(" ");
        assert!(joined.contains("memory-backend-memfd,id=mem,size=1024M,share=on"));
        assert!(joined.contains("path=/run/b.sock"));
        assert!(joined.contains("virtio-id=38,num_vqs=3"));
        for name in std::iter::once(CONTROL_PORT).chain(links().iter().map(|l| l.serial)) {
            assert!(
                joined.contains(&format!("path=/run/c/{name}.sock,server=on,wait=off")),
                "{name}"
            );
            assert!(joined.contains(&format!("name={name}")), "{name}");
        }
    }

    #[test]
    fn links_do_not_share_ports_or_names() {
        let links = links();
        for (i, a) in links.iter().enumerate() {
            for b in &links[i + 1..] {
                assert_ne!(a.tcp, b.tcp);
                assert_ne!(a.serial, b.serial);
            }
            assert_ne!(a.serial, CONTROL_PORT);
        }
    }

    #[test]
    fn ratios_divide_by_native() {
        let row = |tool, value| Row {
            label: String::new(),
            tool,
            size: 2,
            iterations: 1,
            measurement: if tool == Tool::IbSendLat {
                Measurement::Latency {
                    typical_us: value,
                    avg_us: value,
                    min_us: Some(value),
                    max_us: None,
                    stdev_us: None,
                    p99_us: None,
                    p99_9_us: None,
                }
            } else {
                Measurement::Bandwidth {
                    avg_mib_s: value,
                    peak_mib_s: None,
                    msg_rate_mpps: None,
                }
            },
        };
        let lat = Comparison {
            native: row(Tool::IbSendLat, 10.0),
            vrdma: row(Tool::IbSendLat, 25.0),
        };
        assert_eq!(lat.ratio(), 2.5);
        let table = render_comparison(&[lat]);
        assert!(
            table.contains("ib_send_lat") && table.contains("2.50"),
            "{table}"
        );
    }
}

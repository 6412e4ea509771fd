//! `real-guest` and the demo: a real Linux guest under QEMU with the vrdma device, against
//! native peers.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::guest_suite::{deliver_results, run_guest_suite};
use super::host::{dropin_library, prepared_root, target_dir};
use super::vm_args::VmArgs;
use crate::error::{Error, Result};
use crate::native;
use crate::scenarios::{binaries, perftest_over_vrdma, real_guest};
use crate::vm::shares_for;

/// `vrdma-vm test real-guest` (with the reboot) and `vrdma-vm demo` (without).
pub fn test(vm_args: &VmArgs, json: Option<PathBuf>, reboot: bool) -> Result<()> {
    let (outcome_elapsed, rxe_vm_accel, report) = run_suite(vm_args, json, reboot)?;
    print_report(&report, &format!("{rxe_vm_accel:?}"), outcome_elapsed);
    Ok(())
}

/// Runs the real-guest suite; returns how long the VM ran, how it was accelerated and the
/// guest's report.
pub fn run_suite(
    vm_args: &VmArgs,
    json: Option<PathBuf>,
    reboot: bool,
) -> Result<(Duration, crate::accel::Accel, real_guest::Report)> {
    let root = prepared_root()?;
    let target = target_dir()?;
    let native_peer = native::build(&target)?;
    let (_, library) = dropin_library()?;
    let library_dir = perftest_over_vrdma::prepare_library_dir(&target, &library)?;
    let guest_package = crate::guest_package::build(
        &super::host::profile_dir()?,
        &library,
        &target.join("vrdma-guest-package"),
    )?;
    let root_dir = root
        .tree
        .parent()
        .ok_or_else(|| Error::Usage("the root file system has no parent directory".into()))?
        .to_path_buf();
    let mut config = vm_args.config_lasting(&root, real_guest::RXE_VM_TIMEOUT)?;
    let mut shares: Vec<PathBuf> = config.shares.drain(..).map(|s| s.host_path).collect();
    shares.push(root_dir.clone());
    config.shares = shares_for(shares);
    let mut args = vec![
        "--native".into(),
        native_peer.to_string_lossy().into_owned(),
        "--root-dir".into(),
        root_dir.to_string_lossy().into_owned(),
        "--library-dir".into(),
        library_dir.to_string_lossy().into_owned(),
        "--guest-package".into(),
        guest_package.to_string_lossy().into_owned(),
    ];
    if reboot {
        args.push("--reboot".into());
    }
    let (outcome, report): (_, real_guest::Report) =
        run_guest_suite(&root, &config, "real-guest", args, json.as_deref())?;
    Ok((outcome.elapsed, config.accel, report))
}

/// Prints what the real-guest suite showed.
fn print_report(report: &real_guest::Report, rxe_vm_accel: &str, vm_run: Duration) {
    println!(
        "\n== vrdma in a real guest: Linux under QEMU 11.1 ({} guest inside the {rxe_vm_accel} rxe VM; \
         guest {:.0} s, VM run {:.0?})",
        report.accel, report.elapsed_secs, vm_run
    );
    println!(
        "\nunmodified perftest: server in the guest over vrdma's drop-in libibverbs.so.1 (PCI \
         transport), native client measuring, next to both sides native on rxe0 (latency: \
         typical µs, lower is better; bandwidth: MiB/s, higher is better):"
    );
    print!("{}", real_guest::render_comparison(&report.perftest));
    if report.accel == "Tcg" {
        println!(
            "(the guest's CPU is emulated inside an emulated CPU: its latency says how slow \
             nested TCG is, not vrdma; the bandwidth is the NIC's DMA into guest pages)"
        );
    }
    println!(
        "\nthrough the guest agent (vrdma-guestd --pci, one PCI function shared): perftest's \
         server in the guest as a member of rdma through the installed agent, next to the same case as a root \
         process on the PCI transport, same boot:"
    );
    print!(
        "{}",
        real_guest::render_columns(&report.through_agent, ("root PCI", "agent"))
    );
    let package = &report.package;
    println!(
        "installed with dpkg into the guest's root ({:.1} s in the rxe VM): {}; a program's \
         libraries: {}; purged ({:.1} s): {}",
        package.install_secs,
        package.status.trim(),
        package.resolved.join(", "),
        package.purge_secs,
        package.purged.join(", ")
    );
    println!(
        "a third process SIGKILLed in mid-traffic while the two below ran: {}",
        report.first_boot.agent_victim_released.trim()
    );
    println!(
        "a hostile root process pinning through the agent meanwhile: {}",
        report.first_boot.agent_pin_budget
    );
    for table in &report.first_boot.through_agent {
        println!(
            "vrdma-pingpong as a member of rdma through the installed agent (two at once), every byte verified:\n{}",
            table.trim_end()
        );
    }
    println!(
        "\nvrdma-pingpong --pci in the guest against the native peer, every byte verified:\n{}",
        report.first_boot.pingpong.trim_end()
    );
    println!(
        "\nunmodified rping -V over the drop-in librdmacm against a native rping: {} pings \
         verified",
        report.first_boot.rping_pings
    );
    let [client, server] = report.first_boot.agent_rping_pings;
    println!(
        "unmodified rping -V as a member of rdma through the installed agent (rdma_cm through vrdma-guestd): the \
         guest's client {client} pings verified against a native server, the guest's server \
         {server} against a native client"
    );
    let roce_v2 = report
        .first_boot
        .agent_published
        .iter()
        .filter(|(_, text)| text == "RoCE v2")
        .count();
    println!(
        "the agent published /dev/infiniband/vrdma0 and /sys/class/infiniband/vrdma0 ({roce_v2} \
         RoCE v2 GIDs), what UCX reads to find the device"
    );
    if let [client, server] = report.first_boot.agent_ucmatose.as_slice() {
        println!(
            "unmodified ucmatose as a member of rdma through the installed agent (two RC connections each way): the \
             guest's client against a native server: {client}; the guest's server against {server}"
        );
    }
    println!(
        "\nbypass: backend stopped (SIGSTOP); {} messages per op and size written and sent into \
         the guest and verified there",
        report.first_boot.bypass_messages
    );
    println!(
        "\nwhere the guest's time went: {}",
        real_guest::render_phases(&report.first_boot.phases)
    );
    if let Some(reboot) = &report.reboot {
        println!(
            "\nreboot -f with a live application ({} QPs, {} MRs on rxe0): QEMU stayed up, rxe0 \
             idle {} ms after the new boot reported, and the ping-pong ran again:\n{}",
            reboot.live.qp,
            reboot.live.mr,
            reboot.release_ms,
            reboot.after.pingpong.trim_end()
        );
        println!(
            "the boot after the reboot: {}",
            real_guest::render_phases(&reboot.after.phases)
        );
    }
}

/// `vrdma-vm guest real-guest`.
pub fn guest(
    native: PathBuf,
    root_dir: PathBuf,
    library_dir: PathBuf,
    guest_package: PathBuf,
    reboot: bool,
) -> Result<()> {
    let binaries = binaries::Binaries::beside_current_exe(native)?;
    let nested_tcg = !std::env::var("VRDMA_GUEST_ACCEL").is_ok_and(|a| a == "kvm");
    let settings = real_guest::Settings {
        root_dir,
        library_dir,
        guest_package,
        iters: if nested_tcg { 5 } else { 50 },
        reboot,
        timeout: real_guest::GUEST_TIMEOUT,
    };
    let report = real_guest::host::run(&binaries, &settings)?;
    deliver_results("real-guest", &report, || {
        real_guest::render_comparison(&report.perftest)
    })
}

/// `vrdma-vm guest real-guest-inside`: inside the nested guest, this boot's part of the suite.
pub fn guest_inside(
    library_dir: PathBuf,
    iters: u32,
    reboot: bool,
    rping_server: String,
) -> Result<()> {
    let exe = std::env::current_exe().map_err(|e| Error::Usage(format!("current_exe: {e}")))?;
    let result_dir = std::env::var_os("VRDMA_RESULT_DIR")
        .ok_or_else(|| Error::Usage("VRDMA_RESULT_DIR is not set".into()))?;
    let paths = real_guest::guest::GuestPaths {
        pingpong: exe
            .parent()
            .unwrap_or(Path::new("."))
            .join("vrdma-pingpong"),
        library_dir,
        rping_server,
        result_dir: result_dir.into(),
    };
    real_guest::guest::run(&paths, iters, reboot)
}

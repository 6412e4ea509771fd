//! `two-hosts`: two rxe VMs joined by a link, vrdma and native peers across it, with faults
//! (issue 16).

use std::path::{Path, PathBuf};

use super::guest_suite::deliver_results;
use super::host::{dropin_library, prepared_root, target_dir};
use super::vm_args::VmArgs;
use crate::error::{Error, Result};
use crate::native;
use crate::perftest::Case;
use crate::rootfs::PreparedRoot;
use crate::scenarios::binaries::Binaries;
use crate::scenarios::perftest_over_vrdma;
use crate::scenarios::two_hosts::{self, perftest_across, steps, HostReport, Results};
use crate::vm::{RunOutcome, VmConfig};
use crate::vm_link::Host;
use crate::vm_pair;

/// Memory of each host VM: two run at once.
const HOST_MEMORY_MIB: u32 = 2048;

/// Which steps the hosts run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// The matrix, the link failure and the backend restart (`two-hosts`).
    Short,
    /// Loss and reordering too (`two-hosts-faults`).
    Faults,
    /// The goodput streams of `vrdma-vm bench`.
    Goodput,
    /// Debian's perftest across the link, every baseline case in every pairing
    /// (`two-hosts-perftest`).
    Perftest,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Short => "short",
            Mode::Faults => "faults",
            Mode::Goodput => "goodput",
            Mode::Perftest => "perftest",
        }
    }
}

/// `vrdma-vm test two-hosts`, or `two-hosts-faults` with [`Mode::Faults`].
pub fn test(vm_args: &VmArgs, json: Option<PathBuf>, mode: Mode) -> Result<()> {
    let root = prepared_root()?;
    let config = host_config(&vm_args.config(&root)?);
    let results = run_hosts(&root, &config, mode)?;
    if let Some(path) = json {
        let data =
            serde_json::to_vec_pretty(&results).map_err(|e| Error::Scenario(e.to_string()))?;
        std::fs::write(&path, data)
            .map_err(|e| Error::Usage(format!("writing {}: {e}", path.display())))?;
    }
    println!(
        "\ntwo rxe hosts joined by a link ({:?}, {} vCPUs each):",
        config.accel, config.cpus
    );
    print!("{}", two_hosts::render(&results));
    if mode == Mode::Goodput {
        print!(
            "\n{}",
            crate::bench::goodput::table(&crate::bench::goodput::rows(&results))
        );
    }
    Ok(())
}

/// The configuration of each host's VM, from that of one VM: the two share this machine's
/// CPUs, and need less memory.
pub fn host_config(one_vm: &VmConfig) -> VmConfig {
    let mut config = one_vm.clone();
    config.cpus = config.cpus.div_ceil(2).max(1);
    config.memory_mib = config.memory_mib.min(HOST_MEMORY_MIB);
    config
}

/// Boots hosts A and B with `config` (each), runs `mode`'s steps on both and returns their
/// reports.
pub fn run_hosts(root: &PreparedRoot, config: &VmConfig, mode: Mode) -> Result<Results> {
    let target = target_dir()?;
    let native_peer = native::build(&target)?;
    let (_, library) = dropin_library()?;
    let library_dir = perftest_over_vrdma::prepare_library_dir(&target, &library)?;
    let exe = std::env::current_exe().map_err(|e| Error::Usage(format!("current_exe: {e}")))?;
    let run = |host: Host| {
        let command = vec![
            exe.to_string_lossy().into_owned(),
            "guest".into(),
            "two-hosts".into(),
            "--host".into(),
            host.name().into(),
            "--native".into(),
            native_peer.to_string_lossy().into_owned(),
            "--library-dir".into(),
            library_dir.to_string_lossy().into_owned(),
            "--mode".into(),
            mode.name().into(),
        ];
        (config.clone(), command)
    };
    let [a, b] = vm_pair::run_linked(root, [run(Host::A), run(Host::B)])?;
    match (host_report(Host::A, a), host_report(Host::B, b)) {
        (Ok(a), Ok(b)) => Ok(Results { a, b }),
        (a, b) => {
            let failures: Vec<String> = [a.err(), b.err()]
                .into_iter()
                .flatten()
                .map(|e| e.to_string())
                .collect();
            Err(Error::Scenario(failures.join("\n")))
        }
    }
}

/// The report a host's VM left, or why there is none.
fn host_report(host: Host, outcome: Result<RunOutcome>) -> Result<HostReport> {
    let outcome = outcome?;
    if outcome.status != 0 {
        return Err(Error::Scenario(format!(
            "two-hosts failed on host {} (status {})",
            host.name(),
            outcome.status
        )));
    }
    let file = format!("{}.json", result_file(host));
    let data = outcome
        .results
        .iter()
        .find(|(name, _)| *name == file)
        .map(|(_, data)| data)
        .ok_or_else(|| Error::Scenario(format!("host {} left no {file}", host.name())))?;
    serde_json::from_slice(data).map_err(|e| Error::Scenario(format!("{file}: {e}")))
}

/// The suite name a host delivers its report under (as `NAME.json`).
fn result_file(host: Host) -> String {
    format!("two-hosts-{}", host.name())
}

/// `vrdma-vm guest two-hosts`: this host's half.
pub fn guest(host: &str, native: &Path, library_dir: &Path, mode: Mode) -> Result<()> {
    let host = Host::parse(host).ok_or_else(|| Error::Usage(format!("--host {host}: a or b")))?;
    let binaries = Binaries::beside_current_exe(native.to_path_buf())?;
    let only = std::env::var("VRDMA_TWO_HOSTS_ONLY").ok();
    let steps = match mode {
        Mode::Short => steps::plan(false, only.as_deref()),
        Mode::Faults => steps::plan(true, only.as_deref()),
        Mode::Goodput => steps::goodput(),
        Mode::Perftest => Vec::new(),
    };
    // VRDMA_TWO_HOSTS_ONLY="link failure" (or "perftest", "RNR") runs only that phase.
    let phase = |name: &str| only.as_deref().is_none_or(|only| name.contains(only));
    let perftest: &[Case] = match mode {
        Mode::Short if phase("perftest") => perftest_across::SHORT_CASES,
        Mode::Perftest => perftest_across::FULL_CASES,
        _ => &[],
    };
    let phases = two_hosts::Phases {
        library_dir,
        perftest,
        rnr: mode == Mode::Short && phase("RNR"),
        failures: matches!(mode, Mode::Short | Mode::Faults) && phase("link failure"),
    };
    let report = two_hosts::run(host, &binaries, &steps, &phases)?;
    deliver_results(&result_file(host), &report, || format!("{report:#?}\n"))
}

//! `vrdma-vm bench`: vrdma against native Soft-RoCE, the same measurements in one boot of the
//! rxe VM.
//!
//! * [`matrix`]: Debian's unmodified perftest (`ib_send_lat`, `ib_write_lat`, `ib_write_bw`,
//!   `ib_send_bw`, `ib_read_bw` at several sizes) with both processes on rxe0 natively and
//!   with both over vrdma's drop-in `libibverbs.so.1`, alternating, for several rounds;
//!   the small sizes also with the host kick turned off, every send ringing the backend's
//!   doorbell as in a VM;
//! * [`control`]: CQ and QP creation and destruction, QP transitions to RTS and MR
//!   registration per GiB, through vrdma's verbs API (`vrdma-ctlbench`) and natively
//!   (`native/ctlbench.c`);
//! * [`cm_setup`]: connection setup through rdma_cm (Debian's `cmtime`), both sides native
//!   and both over vrdma's drop-in `librdmacm.so.1`;
//! * [`rsockets`]: Debian's `rstream` latency and bandwidth, both sides native and both over
//!   the drop-in's rsockets;
//! * [`scale`]: the cost of one send (WQE and doorbell) with 1 to 1024 QPs in a guest and with
//!   8 guests on one backend;
//! * [`goodput`] (not in `--quick`): a stream across the two-host link, clean and under 1 %
//!   loss, natively and over vrdma (two more VMs, booted after the first).
//!
//! On the host, [`run_on_host`] builds the native program, prepares the drop-in's directory and
//! boots the VM once through the caller's suite runner, which runs `vrdma-vm guest bench`
//! ([`run_in_guest`]) inside. Under TCG absolute times mean little; the ratios from one run
//! are what count.

pub mod cm_setup;
pub mod control;
pub mod ctlbench;
pub mod goodput;
pub mod machine;
pub mod matrix;
pub mod report;
pub mod rsockets;
pub mod scale;
pub mod stats;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::inside::DEVICE;
use crate::perftest::{Case, Side};
use crate::scenarios::backend::Backend;
use crate::scenarios::perftest_over_vrdma::prepare_library_dir;
use crate::vm::{RunOutcome, VmConfig};
use ctlbench::{ControlPlan, Programs};
use machine::{Machine, SystemInfo};

/// Name of the guest suite (`vrdma-vm guest bench`) and of its result file.
pub const SUITE: &str = "bench";

/// What to run (the `vrdma-vm bench` options).
#[derive(Debug, Clone, PartialEq, Eq, clap::Args, Serialize, Deserialize)]
pub struct Settings {
    /// Rounds of the perftest matrix; each runs every case natively and over vrdma.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
    /// Short form: one round, one size per perftest tool, fewer repetitions, a small curve.
    #[arg(long)]
    pub quick: bool,
}

impl Settings {
    /// The arguments that give these settings to `vrdma-vm guest bench`.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec!["--rounds".into(), self.rounds.to_string()];
        if self.quick {
            args.push("--quick".into());
        }
        args
    }
}

/// Everything the settings decide.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub rounds: u32,
    pub quick: bool,
    pub perftest: Vec<Case>,
    pub control: ControlPlan,
    pub cm_setup: cm_setup::CmSetupPlan,
    #[serde(default)]
    pub rsockets: rsockets::RsocketsPlan,
    pub scale: Vec<scale::ScaleConfig>,
    /// Timed messages of each scale guest.
    pub scale_messages: u32,
    /// The perftest cases run through the guest agent and directly.
    #[serde(default)]
    pub agent: Vec<Case>,
    /// The perftest cases run through staging rings and directly.
    #[serde(default)]
    pub staged: Vec<Case>,
    /// The perftest cases run with staged CQs and with CQs mapped directly.
    #[serde(default)]
    pub staged_cqs: Vec<Case>,
    /// The perftest cases run with the backend's doorbell and with the host kick.
    #[serde(default)]
    pub doorbell: Vec<Case>,
}

impl Plan {
    pub fn new(settings: &Settings) -> Plan {
        let quick = settings.quick;
        Plan {
            rounds: if quick { 1 } else { settings.rounds },
            quick,
            perftest: matrix::cases(quick),
            control: if quick {
                ControlPlan {
                    reps: 10,
                    // As large as the full plan's: a smaller MR's rows show the fixed control
                    // round trip (~0.4 ms under TCG) more than the per-GiB cost (32 MiB: 1.3×
                    // where 256 MiB is 1.0×).
                    mr_bytes: 256 << 20,
                    // Twice: the first registration is a row of its own.
                    mr_reps: 2,
                    huge_pages: false,
                    shared_memory: false,
                }
            } else {
                ControlPlan {
                    reps: 50,
                    mr_bytes: 256 << 20,
                    mr_reps: 3,
                    huge_pages: false,
                    shared_memory: false,
                }
            },
            cm_setup: cm_setup::CmSetupPlan {
                connections: if quick { 20 } else { 100 },
                rounds: if quick { 1 } else { settings.rounds },
            },
            rsockets: rsockets::RsocketsPlan {
                latency_iterations: if quick { 200 } else { 2000 },
                bandwidth_transfers: if quick { 50 } else { 500 },
                rounds: if quick { 1 } else { settings.rounds },
            },
            scale: scale::configs(quick),
            scale_messages: if quick { 400 } else { 4000 },
            agent: matrix::agent_cases(quick),
            staged: matrix::staged_cases(quick),
            staged_cqs: matrix::staged_cq_cases(quick),
            doorbell: matrix::doorbell_cases(quick),
        }
    }
}

/// The arguments of `vrdma-vm guest bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct GuestArgs {
    /// Directory with the drop-in as libibverbs.so.1.
    #[arg(long)]
    pub library_dir: PathBuf,
    /// The native control-path bench (built on the host).
    #[arg(long)]
    pub native_ctlbench: PathBuf,
    /// Debian 12's `cmtime` (copied from the host).
    #[arg(long)]
    pub cmtime: PathBuf,
    #[command(flatten)]
    pub settings: Settings,
}

/// What the VM measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GuestResults {
    pub guest: SystemInfo,
    pub plan: Plan,
    pub perftest: Vec<matrix::MatrixRow>,
    pub control: Vec<control::ControlRow>,
    pub cm_setup: Vec<cm_setup::CmSetupRow>,
    /// rstream natively against rstream over the drop-in's rsockets.
    #[serde(default)]
    pub rsockets: Vec<control::ControlRow>,
    pub scale: Vec<scale::ScaleRow>,
    /// perftest through the guest agent (`vrdma`) against direct front-ends (`native`).
    #[serde(default)]
    pub agent: Vec<matrix::MatrixRow>,
    /// perftest through staging rings (`vrdma`) against directly mapped queues (`native`).
    #[serde(default)]
    pub staged: Vec<matrix::MatrixRow>,
    /// perftest with staged CQs (`vrdma`) against directly mapped CQs (`native`).
    #[serde(default)]
    pub staged_cqs: Vec<matrix::MatrixRow>,
    /// perftest with the backend's doorbell (`vrdma`) against the host kick (`native`).
    #[serde(default)]
    pub doorbell: Vec<matrix::MatrixRow>,
    /// Seconds the measurements took inside the VM.
    pub elapsed_s: f64,
}

/// A complete result: what the VM measured and where.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    pub machine: Machine,
    pub plan: Plan,
    pub perftest: Vec<matrix::MatrixRow>,
    pub control: Vec<control::ControlRow>,
    pub cm_setup: Vec<cm_setup::CmSetupRow>,
    /// rstream natively against rstream over the drop-in's rsockets.
    #[serde(default)]
    pub rsockets: Vec<control::ControlRow>,
    pub scale: Vec<scale::ScaleRow>,
    /// perftest through the guest agent (`vrdma`) against direct front-ends (`native`).
    #[serde(default)]
    pub agent: Vec<matrix::MatrixRow>,
    /// perftest through staging rings (`vrdma`) against directly mapped queues (`native`).
    #[serde(default)]
    pub staged: Vec<matrix::MatrixRow>,
    /// perftest with staged CQs (`vrdma`) against directly mapped CQs (`native`).
    #[serde(default)]
    pub staged_cqs: Vec<matrix::MatrixRow>,
    /// perftest with the backend's doorbell (`vrdma`) against the host kick (`native`).
    #[serde(default)]
    pub doorbell: Vec<matrix::MatrixRow>,
    /// In a real guest (nested under QEMU 11.1, empty in `--quick`): perftest's server as
    /// `nobody` through the guest agent on the PCI function (`vrdma`) against a root process
    /// on the PCI transport (`native`), same boot.
    #[serde(default)]
    pub agent_pci: Vec<crate::scenarios::real_guest::Comparison>,
    /// Why the real-guest rows are missing when their run failed.
    #[serde(default)]
    pub agent_pci_error: Option<String>,
    /// Goodput across the two-host link (empty in `--quick`).
    #[serde(default)]
    pub goodput: Vec<goodput::GoodputRow>,
    /// Why the goodput rows are missing when their run failed: the VMs' own rxe can crash
    /// under load across the link (see the README); the other rows stand.
    #[serde(default)]
    pub goodput_error: Option<String>,
    /// Seconds the measurements took inside the VM.
    pub bench_s: f64,
    /// Seconds of the whole VM run (boot included).
    pub vm_s: f64,
}

/// On the host: builds the native bench program (into `<target>/native/`) and the drop-in's
/// directory (around `dropin`, the `libvrdma_ibverbs.so` cargo built), then boots the VM once
/// through `boot`, which must run `vrdma-vm guest bench ARGS…` and return its [`SUITE`]
/// results (the suite runner of `vrdma-vm`).
pub fn run_on_host(
    settings: &Settings,
    config: &VmConfig,
    dropin: &Path,
    boot: impl FnOnce(Vec<String>) -> Result<(RunOutcome, GuestResults)>,
) -> Result<Results> {
    let target = crate::native::default_target_dir()
        .ok_or_else(|| Error::Usage("cannot find the cargo target directory".into()))?;
    let native =
        crate::native::build_program(&target, &ctlbench::native_source(), ctlbench::NATIVE_NAME)?;
    // The drop-in's directory links to it: the link must hold wherever the VM runs it.
    let dropin = dropin
        .canonicalize()
        .context(|| format!("locating {}", dropin.display()))?;
    let library_dir = prepare_library_dir(&target, &dropin)?;
    let cmtime = cm_setup::host_cmtime(&target)?;
    let mut args = vec![
        "--cmtime".into(),
        cmtime.to_string_lossy().into_owned(),
        "--library-dir".into(),
        library_dir.to_string_lossy().into_owned(),
        "--native-ctlbench".into(),
        native.to_string_lossy().into_owned(),
    ];
    args.extend(settings.to_args());
    let (outcome, guest) = boot(args)?;
    Ok(Results {
        machine: Machine::describe(config, guest.guest),
        plan: guest.plan,
        perftest: guest.perftest,
        control: guest.control,
        cm_setup: guest.cm_setup,
        rsockets: guest.rsockets,
        scale: guest.scale,
        agent: guest.agent,
        staged: guest.staged,
        staged_cqs: guest.staged_cqs,
        doorbell: guest.doorbell,
        agent_pci: Vec::new(),
        agent_pci_error: None,
        goodput: Vec::new(),
        goodput_error: None,
        bench_s: guest.elapsed_s,
        vm_s: outcome.elapsed.as_secs_f64(),
    })
}

/// Writes `results` as pretty JSON to `path`.
pub fn write_json(results: &Results, path: &Path) -> Result<()> {
    let json = serde_json::to_vec_pretty(results).map_err(|e| Error::Scenario(e.to_string()))?;
    std::fs::write(path, json).context(|| format!("writing {}", path.display()))
}

/// Inside the VM: runs the perftest matrix, the control path and the scale curve, each against
/// a vrdma-backend of its own on rxe0 (the binaries next to this executable).
pub fn run_in_guest(args: &GuestArgs) -> Result<GuestResults> {
    let started = Instant::now();
    let plan = Plan::new(&args.settings);
    let exe = std::env::current_exe().context(|| "locating this executable".into())?;
    let bin_dir = exe.parent().unwrap_or(Path::new(".")).to_path_buf();
    let backend_binary = bin_dir.join("vrdma-backend");
    let programs = Programs {
        native: args.native_ctlbench.clone(),
        vrdma: bin_dir.join("vrdma-ctlbench"),
        device: DEVICE.into(),
    };
    for program in [
        &backend_binary,
        &programs.vrdma,
        &programs.native,
        &args.cmtime,
    ] {
        if !program.is_file() {
            return Err(Error::Usage(format!(
                "{} is missing: build the workspace first",
                program.display()
            )));
        }
    }

    let mut backend = Backend::start(&backend_binary, "vrdma-bench", &[], "warn")?;
    let native = Side::native(DEVICE);
    let vrdma = Side::over_dropin(&backend.socket, &args.library_dir);
    let perftest = matrix::run(&plan.perftest, plan.rounds, &native, &vrdma)?;
    let rung = Side::over_dropin_doorbell(&backend.socket, &args.library_dir);
    let doorbell = matrix::run(&plan.doorbell, plan.rounds, &vrdma, &rung)?;
    let mut staging = Backend::start(
        &backend_binary,
        "vrdma-bench-staged",
        &["--staged-rings", "always"],
        "warn",
    )?;
    let control = control::run(
        &programs,
        &backend.socket,
        Some(&staging.socket),
        &plan.control,
    )?;
    let cm_setup = cm_setup::run(&args.cmtime, &plan.cm_setup, &native, &vrdma)?;
    let rsockets = rsockets::run(&plan.rsockets, &native, &vrdma)?;
    let agent = {
        let agent_socket = std::env::temp_dir()
            .join("vrdma-bench-agent")
            .join("agent.sock");
        let _agent = crate::scenarios::agent::start_agent(
            &bin_dir.join("vrdma-guestd"),
            &backend.socket,
            &agent_socket,
        )?;
        let (uid, gid) = crate::inside::NOBODY;
        let through = Side::through_agent(&agent_socket, &args.library_dir, uid, gid);
        matrix::run(&plan.agent, plan.rounds, &vrdma, &through)?
    };
    let staged = {
        let through = Side {
            label: "vrdma-staged".into(),
            ..Side::over_dropin(&staging.socket, &args.library_dir)
        };
        matrix::run(&plan.staged, plan.rounds, &vrdma, &through)?
    };
    staging.check_alive("the bench")?;
    drop(staging);
    let staged_cqs = {
        let mut staging = Backend::start(
            &backend_binary,
            "vrdma-bench-staged-cqs",
            &["--staged-cqs", "always"],
            "warn",
        )?;
        let through = Side {
            label: "vrdma-staged-cqs".into(),
            ..Side::over_dropin(&staging.socket, &args.library_dir)
        };
        let rows = matrix::run(&plan.staged_cqs, plan.rounds, &vrdma, &through)?;
        staging.check_alive("the bench")?;
        rows
    };
    backend.check_alive("the bench")?;
    drop(backend);

    let mut backend = Backend::start(
        &backend_binary,
        "vrdma-bench-scale",
        scale::BACKEND_ARGS,
        "warn",
    )?;
    let scale = scale::run(&programs, &backend.socket, &plan.scale, plan.scale_messages)?;
    backend.check_alive("the bench")?;

    Ok(GuestResults {
        guest: SystemInfo::this_machine(),
        plan,
        perftest,
        control,
        cm_setup,
        rsockets,
        scale,
        agent,
        staged,
        staged_cqs,
        doorbell,
        elapsed_s: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_travel_to_the_guest_and_decide_the_plan() {
        let full = Settings {
            rounds: 5,
            quick: false,
        };
        assert_eq!(full.to_args(), ["--rounds", "5"]);
        let plan = Plan::new(&full);
        assert_eq!(plan.rounds, 5);
        assert_eq!(plan.control.mr_bytes, 256 << 20);
        let quick = Settings {
            rounds: 3,
            quick: true,
        };
        assert_eq!(quick.to_args(), ["--rounds", "3", "--quick"]);
        let plan = Plan::new(&quick);
        assert_eq!(plan.rounds, 1);
        assert!(plan.perftest.len() < matrix::cases(false).len());
    }
}

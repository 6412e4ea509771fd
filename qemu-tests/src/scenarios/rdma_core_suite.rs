//! rdma-core's own test suite (Debian's `python3-pyverbs` ships it under
//! `/usr/share/doc/rdma-core/tests`), unmodified: every generic module ([`MODULES`]: not the
//! mlx5, EFA or CUDA ones) natively on rxe0 as root (the baseline), then on vrdma0 as `nobody`
//! over the drop-in and the agent, in a container's mount namespace with the agent's
//! publication mounted where the suite looks (it finds the port's address through
//! `device/net` and reads the port files).
//!
//! [`RDMA_CORE_TESTS`] runs each module as the suite's own `run_tests.py` does, recording
//! each test's outcome as it ends, so a module that crashes the interpreter still reports
//! the tests before the crash and names the one that crashed. Several tests draw random QP
//! capabilities and sizes: the runner seeds Python's generator the same way on both sides.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::host::run_checked;
use crate::inside::Proc;
use crate::scenarios::discovery::{
    as_nobody, container_setup, dropin_env, in_container, StackSide,
};
use crate::vm::shell_quote;

/// The runner, ours: the suite's `run_tests.py` with outcomes recorded.
pub const RDMA_CORE_TESTS: &str = include_str!("rdma_core_tests.py");

/// Where Debian installs the suite (gzipped in part).
const SHIPPED: &str = "/usr/share/doc/rdma-core/tests";

/// rdma-core's generic test modules: everything but the provider-specific (mlx5, efa) and
/// GPU (cuda) ones.
pub const MODULES: &[&str] = &[
    "test_addr",
    "test_atomic",
    "test_cq",
    "test_cq_events",
    "test_cqex",
    "test_device",
    "test_flow",
    "test_fork",
    "test_mr",
    "test_odp",
    "test_parent_domain",
    "test_pd",
    "test_qp",
    "test_qpex",
    "test_rdmacm",
    "test_relaxed_ordering",
    "test_rss_traffic",
    "test_shared_pd",
    "test_srq",
    "test_tag_matching",
];

/// The tests native rxe passes that vrdma does not carry yet, each with the reason (the
/// README lists them). The agent suite fails on any other test native rxe passes and vrdma
/// does not.
pub const NOT_YET_OVER_VRDMA: &[(&str, &str)] = &[
    (
        "tests.test_odp.OdpTestCase.test_odp_rc_atomic_cmp_and_swp",
        ODP,
    ),
    (
        "tests.test_odp.OdpTestCase.test_odp_rc_atomic_fetch_and_add",
        ODP,
    ),
    ("tests.test_odp.OdpTestCase.test_odp_rc_mixed_mr", ODP),
    ("tests.test_odp.OdpTestCase.test_odp_rc_rdma_read", ODP),
    ("tests.test_odp.OdpTestCase.test_odp_rc_rdma_write", ODP),
    ("tests.test_odp.OdpTestCase.test_odp_rc_traffic", ODP),
    ("tests.test_odp.OdpTestCase.test_odp_ud_traffic", ODP),
];

/// Tests native rxe skips and vrdma does not pass, each with the reason (the README lists
/// them). The agent suite fails on any other test that native rxe skips and that fails,
/// errors or crashes over vrdma.
pub const FAILING_WHERE_NATIVE_SKIPS: &[(&str, &str)] = &[
    ("tests.test_mr.MRTest.test_mr_rereg_access", REREG),
    ("tests.test_mr.MRTest.test_mr_rereg_addr", REREG),
    ("tests.test_mr.MRTest.test_mr_rereg_atomic", REREG),
    ("tests.test_mr.MRTest.test_mr_rereg_pd", REREG),
];

const REREG: &str = "rdma-core's rxe provider has no rereg_mr (native skips with EOPNOTSUPP); \
     vrdma re-registers with new keys, which ibv_rereg_mr allows, while the tests keep the peer's \
     first rkey and expect a QP reset to purge its CQ (as mlx5 does, rxe does not)";

/// Tests whose outcome on rxe depends on timing, natively as over vrdma, each with the reason:
/// their outcomes are reported but not compared.
pub const TIMING_DEPENDENT: &[(&str, &str)] = &[(
    "tests.test_cq.CQTest.test_resize_cq",
    "posts six UD sends and, without polling their completions, resizes the CQ to one entry \
     expecting EINVAL: rxe completes sends on a work queue, so the resize succeeds whenever it \
     runs before most of them completed, and the CQ overflows (natively it times out in some \
     runs and passes in others)",
)];

const ODP: &str = "on-demand paging: rxe's ODP serves only MRs whose iova is their address, \
     which a guest's MR never is, so the device does not offer it on rxe (spec §7.4)";
/// How long one module may take: a hang bound (the slowest take seconds under TCG).
const MODULE_TIMEOUT: Duration = Duration::from_secs(300);

/// What became of one test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Ok,
    Skip,
    Fail,
    Error,
    /// It began and the interpreter died before it ended.
    Crashed,
}

/// One test's outcome and what it said (a skip's reason, a failure's exception).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestOutcome {
    pub outcome: Outcome,
    pub detail: String,
}

/// Every test's outcome by its unittest id (`tests.test_x.Class.test_y`), on one side.
pub type SuiteRun = BTreeMap<String, TestOutcome>;

/// The suite on both sides.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaCoreRuns {
    pub native: SuiteRun,
    pub vrdma: SuiteRun,
}

impl RdmaCoreRuns {
    /// How many tests of `run` had `outcome`.
    pub fn count(run: &SuiteRun, outcome: Outcome) -> usize {
        run.values().filter(|t| t.outcome == outcome).count()
    }

    /// The tests native rxe skips that fail, error or crash over vrdma, with what vrdma did.
    pub fn failed_only_over_vrdma(&self) -> Vec<(&str, &TestOutcome)> {
        self.native
            .iter()
            .filter(|(_, t)| t.outcome == Outcome::Skip)
            .filter_map(|(id, _)| {
                let t = self.vrdma.get(id)?;
                matches!(t.outcome, Outcome::Fail | Outcome::Error | Outcome::Crashed)
                    .then_some((id.as_str(), t))
            })
            .collect()
    }

    /// The tests native rxe passes that vrdma does not, with what vrdma did.
    pub fn passed_only_natively(&self) -> Vec<(&str, &TestOutcome)> {
        self.native
            .iter()
            .filter(|(_, t)| t.outcome == Outcome::Ok)
            .filter_map(|(id, _)| match self.vrdma.get(id) {
                Some(t) if t.outcome == Outcome::Ok => None,
                Some(t) => Some((id.as_str(), t)),
                None => Some((id.as_str(), &NOT_RUN)),
            })
            .collect()
    }
}

/// The counts of one side, for a line of output.
fn counts(run: &SuiteRun) -> String {
    let of = |outcome| RdmaCoreRuns::count(run, outcome);
    format!(
        "{} ok, {} skipped, {} failed, {} errors, {} crashed",
        of(Outcome::Ok),
        of(Outcome::Skip),
        of(Outcome::Fail),
        of(Outcome::Error),
        of(Outcome::Crashed)
    )
}

/// The tests of `run` that failed, errored or crashed.
fn not_passing(run: &SuiteRun) -> Vec<&str> {
    run.iter()
        .filter(|(_, t)| matches!(t.outcome, Outcome::Fail | Outcome::Error | Outcome::Crashed))
        .map(|(id, _)| id.as_str())
        .collect()
}

/// Both sides' counts, the tests only native passes, and each side's failing tests by name
/// (so a run's log says which they were), one line.
pub fn summary(runs: &RdmaCoreRuns) -> String {
    let only: Vec<&str> = runs
        .passed_only_natively()
        .iter()
        .map(|(id, _)| *id)
        .collect();
    let why: Vec<String> = not_passing(&runs.vrdma)
        .into_iter()
        .map(|id| format!("{id}: {}", last_words(&runs.vrdma[id].detail)))
        .collect();
    format!(
        "native {}; vrdma {}; passed natively only: {:?}; not passing natively: {:?}; \
         not passing over vrdma: {:?}; why, over vrdma: {why:?}",
        counts(&runs.native),
        counts(&runs.vrdma),
        only,
        not_passing(&runs.native),
        not_passing(&runs.vrdma)
    )
}

/// The last line of a test's detail (a traceback ends with the exception), at most 200
/// characters of it.
fn last_words(detail: &str) -> String {
    let line = detail.trim().lines().last().unwrap_or_default();
    line.chars().take(200).collect()
}

/// What a test that never started (its module crashed earlier) counts as.
static NOT_RUN: TestOutcome = TestOutcome {
    outcome: Outcome::Crashed,
    detail: String::new(),
};

/// The runner's records (one JSON object per line, `started` before each outcome): each
/// test's last word, a test that started and never ended counting as crashed.
pub fn parse_records(records: &str) -> SuiteRun {
    #[derive(Deserialize)]
    struct Record {
        id: String,
        outcome: String,
        #[serde(default)]
        detail: String,
    }
    let mut run = SuiteRun::new();
    for record in records
        .lines()
        .filter_map(|line| serde_json::from_str::<Record>(line).ok())
    {
        let outcome = match record.outcome.as_str() {
            "ok" => Outcome::Ok,
            "skip" => Outcome::Skip,
            "fail" => Outcome::Fail,
            "error" => Outcome::Error,
            _ => Outcome::Crashed,
        };
        run.insert(
            record.id,
            TestOutcome {
                outcome,
                detail: record.detail,
            },
        );
    }
    run
}

fn work_dir() -> PathBuf {
    std::env::temp_dir().join("vrdma-rdma-core-tests")
}

/// A copy of the shipped suite with its gzipped files unpacked, readable by everyone, and the
/// runner beside it; the copy's `tests` directory.
fn prepare_copy() -> Result<PathBuf> {
    let dir = work_dir();
    if dir.exists() {
        std::fs::remove_dir_all(&dir).context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).context(|| format!("creating {}", dir.display()))?;
    run_checked(Command::new("cp").arg("-a").arg(SHIPPED).arg(&dir))?;
    let tests = dir.join("tests");
    run_checked(Command::new("sh").arg("-c").arg(format!(
        "gunzip {dir}/*.gz && chmod -R a+rX {top} && chmod 1777 {top}",
        dir = shell_quote(&tests.to_string_lossy()),
        top = shell_quote(&dir.to_string_lossy()),
    )))?;
    std::fs::write(dir.join("rdma_core_tests.py"), RDMA_CORE_TESTS)
        .context(|| format!("writing the runner into {}", dir.display()))?;
    run_checked(
        Command::new("chmod")
            .arg("644")
            .arg(dir.join("rdma_core_tests.py")),
    )?;
    Ok(tests)
}

/// The runner's command line for `module` on `device`, recording into `records`.
fn runner_args(tests: &Path, records: &Path, module: &str, device: &str) -> Vec<String> {
    vec![
        "python3".into(),
        work_dir()
            .join("rdma_core_tests.py")
            .to_string_lossy()
            .into_owned(),
        tests.to_string_lossy().into_owned(),
        records.to_string_lossy().into_owned(),
        module.into(),
        "--dev".into(),
        device.into(),
    ]
}

/// Runs every module on one side; `command` makes the process for the runner's arguments.
fn run_side(
    side: StackSide,
    tests: &Path,
    device: &str,
    command: &dyn Fn(&[String]) -> Command,
) -> Result<SuiteRun> {
    let records = work_dir().join(format!("{}.jsonl", side.name()));
    for module in MODULES {
        let args = runner_args(tests, &records, module, device);
        let name = format!("rdma-core-{}-{module}", side.name());
        let mut process = Proc::spawn(&name, &mut command(&args))?;
        // Failing and crashing tests are outcomes, recorded; only a hang is an error.
        process.wait_exit(MODULE_TIMEOUT)?;
    }
    let text = std::fs::read_to_string(&records).unwrap_or_default();
    let run = parse_records(&text);
    if run.is_empty() {
        return Err(Error::Scenario(format!(
            "rdma-core's tests recorded nothing on {device}"
        )));
    }
    Ok(run)
}

/// The suite natively on rxe0 as root, then as `nobody` over the drop-in in `library_dir` and
/// the agent at `agent_socket`, with the agent's publication in `published` mounted.
pub fn run(published: &Path, agent_socket: &Path, library_dir: &Path) -> Result<RdmaCoreRuns> {
    let tests = prepare_copy()?;
    let native = run_side(StackSide::Native, &tests, crate::inside::DEVICE, &|args| {
        let mut command = Command::new(&args[0]);
        command.args(&args[1..]).current_dir(work_dir());
        command
    })?;
    let env = dropin_env(agent_socket, library_dir);
    let vrdma = run_side(
        StackSide::Vrdma,
        &tests,
        crate::perftest::DROPIN_DEVICE,
        &|args| {
            let quoted: Vec<String> = args.iter().map(|a| shell_quote(a)).collect();
            let setup = format!(
                "{}cd {}\n",
                container_setup(published),
                shell_quote(&work_dir().to_string_lossy())
            );
            in_container(as_nobody(&setup, &env, &quoted.join(" ")))
        },
    )?;
    Ok(RdmaCoreRuns { native, vrdma })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_give_each_test_its_last_word_and_a_test_left_started_crashed() {
        let records = concat!(
            r#"{"id": "tests.test_a.A.test_1", "outcome": "started", "detail": ""}"#,
            "\n",
            r#"{"id": "tests.test_a.A.test_1", "outcome": "ok", "detail": ""}"#,
            "\n",
            r#"{"id": "tests.test_a.A.test_2", "outcome": "started", "detail": ""}"#,
            "\n",
            r#"{"id": "tests.test_a.A.test_2", "outcome": "skip", "detail": "no ODP"}"#,
            "\n",
            r#"{"id": "tests.test_a.A.test_3", "outcome": "started", "detail": ""}"#,
            "\n",
            "corrupted size vs. prev_size\n",
        );
        let run = parse_records(records);
        assert_eq!(run["tests.test_a.A.test_1"].outcome, Outcome::Ok);
        assert_eq!(run["tests.test_a.A.test_2"].detail, "no ODP");
        assert_eq!(run["tests.test_a.A.test_3"].outcome, Outcome::Crashed);
        assert_eq!(RdmaCoreRuns::count(&run, Outcome::Ok), 1);
    }

    #[test]
    fn a_test_passed_natively_and_missing_over_vrdma_is_a_difference() {
        let ok = TestOutcome {
            outcome: Outcome::Ok,
            detail: String::new(),
        };
        let runs = RdmaCoreRuns {
            native: SuiteRun::from([("a".into(), ok.clone()), ("b".into(), ok.clone())]),
            vrdma: SuiteRun::from([("a".into(), ok)]),
        };
        let only = runs.passed_only_natively();
        assert_eq!(only.len(), 1);
        assert_eq!(only[0].0, "b");
        assert_eq!(only[0].1.outcome, Outcome::Crashed);
    }

    #[test]
    fn a_test_native_skips_and_vrdma_errors_is_a_difference() {
        let outcome = |outcome| TestOutcome {
            outcome,
            detail: String::new(),
        };
        let runs = RdmaCoreRuns {
            native: SuiteRun::from([
                ("a".into(), outcome(Outcome::Skip)),
                ("b".into(), outcome(Outcome::Skip)),
                ("c".into(), outcome(Outcome::Skip)),
                ("d".into(), outcome(Outcome::Error)),
            ]),
            vrdma: SuiteRun::from([
                ("a".into(), outcome(Outcome::Skip)),
                ("b".into(), outcome(Outcome::Error)),
                ("c".into(), outcome(Outcome::Ok)),
                ("d".into(), outcome(Outcome::Error)),
            ]),
        };
        let only = runs.failed_only_over_vrdma();
        assert_eq!(only.len(), 1);
        assert_eq!(only[0].0, "b");
    }

    #[test]
    fn the_summary_names_each_sides_failing_tests() {
        let of = |outcome| TestOutcome {
            outcome,
            detail: String::new(),
        };
        let runs = RdmaCoreRuns {
            native: SuiteRun::from([
                ("a".into(), of(Outcome::Ok)),
                ("b".into(), of(Outcome::Error)),
            ]),
            vrdma: SuiteRun::from([
                (
                    "a".into(),
                    TestOutcome {
                        outcome: Outcome::Fail,
                        detail: "Traceback:\n  line 1\nAssertionError: 1 != 2\n".into(),
                    },
                ),
                ("b".into(), of(Outcome::Skip)),
            ]),
        };
        let line = summary(&runs);
        assert!(
            line.ends_with(
                "passed natively only: [\"a\"]; not passing natively: [\"b\"]; \
             not passing over vrdma: [\"a\"]; why, over vrdma: [\"a: AssertionError: 1 != 2\"]"
            ),
            "{line}"
        );
    }
}

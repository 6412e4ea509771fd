//! Open MPI over UCX with a rank over vrdma: Debian's unmodified `mpirun` (Open MPI 5, `pml
//! ucx`, UCX restricted to its verbs transports) runs a two-rank job whose program
//! ([`MPI_CHECK`], mpi4py) checks every byte it receives: point-to-point messages across UCX's
//! eager and rendezvous sizes both ways, a broadcast and an allreduce. Each rank is native on
//! rxe0 or `nobody` over the drop-in and the agent, in the pairings [`PAIRINGS`], the
//! native pair first as the baseline.
//!
//! Open MPI starts the ranks itself, so both run in one mount namespace, a container given
//! both rxe0 and vrdma0 (`discovery::container_with_native_setup`), all as `nobody`. A
//! launcher script picks each rank's side by its `OMPI_COMM_WORLD_RANK`: Debian's prterun
//! crashes (SIGSEGV) on a command line of several application contexts (`-np 1 a : -np 1 b`).
//! Each rank reports the libibverbs it loaded, so a rank that was meant to be over vrdma is
//! shown to be; and rxe0's packet counter shows the bytes crossed the device (UCX is limited
//! to `rc_verbs,ud_verbs,self`: no shared-memory path between the ranks).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::inside::{rxe_counters, Proc};
use crate::scenarios::discovery::{
    as_nobody, container_with_native_setup, dropin_env, in_container, shell_env, StackSide,
};
use crate::vm::shell_quote;

/// The program every rank runs.
pub const MPI_CHECK: &str = include_str!("mpi_check.py");

/// The sides of rank 0 and rank 1 in each job.
pub const PAIRINGS: [[StackSide; 2]; 3] = [
    [StackSide::Native, StackSide::Native],
    [StackSide::Native, StackSide::Vrdma],
    [StackSide::Vrdma, StackSide::Vrdma],
];

/// Point-to-point message sizes: eager (small), and rendezvous up to 4 MiB.
pub const MESSAGE_SIZES: &[u64] = &[1, 64, 4096, 65536, 1 << 20, 4 << 20];

/// How many times each size goes each way.
pub const ROUNDS: u64 = 3;

/// The bytes each rank receives point-to-point.
pub fn point_to_point_bytes() -> u64 {
    MESSAGE_SIZES.iter().sum::<u64>() * ROUNDS
}

/// UCX's transports for the job: the verbs ones, and `self` for a rank's messages to itself.
const UCX_TLS: &str = "rc_verbs,ud_verbs,self";

/// How long one job may take: a hang bound.
const JOB_TIMEOUT: Duration = Duration::from_secs(300);

/// Where the program and the launcher go (readable by `nobody`).
fn job_dir() -> PathBuf {
    std::env::temp_dir().join("vrdma-mpi")
}

/// What one rank reported.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankReport {
    pub side: StackSide,
    /// Point-to-point bytes it received and checked.
    pub verified_bytes: u64,
    /// Whether its broadcast and allreduce results checked.
    pub collectives_verified: bool,
    /// The libibverbs it had loaded, as it listed it.
    pub libibverbs: String,
}

/// One job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpiRun {
    /// Rank 0, then rank 1.
    pub ranks: Vec<RankReport>,
    /// rxe0's sent packets during the job.
    pub rxe_sent_packets: u64,
}

/// The value of `rank R: <what> <value>` lines of `output` for `rank`.
fn reported<'a>(output: &'a str, rank: usize, what: &str) -> Option<&'a str> {
    let prefix = format!("rank {rank}: {what}");
    output
        .lines()
        .find_map(|line| line.trim().strip_prefix(prefix.as_str()))
        .map(str::trim)
}

/// Rank `rank`'s report in the job's `output`, if it printed every line.
fn rank_report(output: &str, rank: usize, side: StackSide) -> Option<RankReport> {
    let verified = reported(output, rank, "point-to-point verified,")?;
    let verified_bytes = verified
        .strip_suffix("bytes received")?
        .trim()
        .parse()
        .ok()?;
    Some(RankReport {
        side,
        verified_bytes,
        collectives_verified: reported(output, rank, "collectives verified").is_some(),
        libibverbs: reported(output, rank, "libibverbs")?.to_string(),
    })
}

/// Whether `report`'s libibverbs is the one its side must have loaded: the drop-in over vrdma,
/// rdma-core's own natively.
fn loaded_its_library(report: &RankReport) -> bool {
    let drop_in = report.libibverbs.ends_with("libvrdma_ibverbs.so");
    let system = report.libibverbs.contains("/libibverbs.so.1");
    match report.side {
        StackSide::Vrdma => drop_in && !report.libibverbs.contains(','),
        StackSide::Native => system && !drop_in,
    }
}

/// The launcher every rank runs: its side's environment by its rank, then the program.
fn launcher(sides: [StackSide; 2], agent_socket: &Path, library_dir: &Path) -> String {
    let rank_env = |side: StackSide| {
        let mut env = vec![("UCX_NET_DEVICES", side.ucx_device())];
        if side == StackSide::Vrdma {
            env.extend(dropin_env(agent_socket, library_dir));
        }
        format!("export{}", shell_env(&env))
    };
    let sizes: Vec<String> = MESSAGE_SIZES.iter().map(u64::to_string).collect();
    format!(
        "case \"$OMPI_COMM_WORLD_RANK\" in\n\
         0) {rank0} ;;\n\
         1) {rank1} ;;\n\
         *) echo \"unexpected rank $OMPI_COMM_WORLD_RANK\" >&2; exit 2 ;;\n\
         esac\n\
         exec python3 {program} {ROUNDS} {sizes}\n",
        rank0 = rank_env(sides[0]),
        rank1 = rank_env(sides[1]),
        program = shell_quote(&job_dir().join("mpi_check.py").to_string_lossy()),
        sizes = sizes.join(" "),
    )
}

/// `mpirun` for two ranks of `launcher`, as `nobody` in a container with rxe0 and vrdma0.
fn mpirun(published: &Path, launcher: &Path) -> Command {
    let command = format!(
        "mpirun --mca pml ucx --mca pml_ucx_devices any --mca btl self -x UCX_TLS={UCX_TLS} \
         --map-by :OVERSUBSCRIBE -np 2 sh {launcher}",
        launcher = shell_quote(&launcher.to_string_lossy()),
    );
    // HOME: nobody's does not exist, and Open MPI looks for its per-user settings there.
    let env = [("HOME", std::env::temp_dir().to_string_lossy().into_owned())];
    in_container(as_nobody(
        &container_with_native_setup(published),
        &env,
        &command,
    ))
}

fn write_readable(path: &Path, contents: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, contents).context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
        .context(|| format!("chmod {}", path.display()))
}

fn sent_packets() -> Result<u64> {
    Ok(rxe_counters()?.get("sent_pkts").copied().unwrap_or(0))
}

/// Runs one job with ranks on `sides`; the job must exit 0 and each rank report every byte
/// verified, both collectives verified and its side's libibverbs, and rxe0 must have sent at
/// least a packet per 4 KiB (its largest MTU) of the point-to-point bytes.
fn run_job(
    sides: [StackSide; 2],
    published: &Path,
    agent_socket: &Path,
    library_dir: &Path,
) -> Result<MpiRun> {
    let dir = job_dir();
    std::fs::create_dir_all(&dir).context(|| format!("creating {}", dir.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
            .context(|| format!("chmod {}", dir.display()))?;
    }
    write_readable(&dir.join("mpi_check.py"), MPI_CHECK)?;
    let launcher_path = dir.join("rank.sh");
    write_readable(&launcher_path, &launcher(sides, agent_socket, library_dir))?;
    let name = format!("mpirun-{}-{}", sides[0].name(), sides[1].name());
    let before = sent_packets()?;
    let mut job = Proc::spawn(&name, &mut mpirun(published, &launcher_path))?;
    job.wait_success(JOB_TIMEOUT)?;
    let rxe_sent_packets = sent_packets()?.saturating_sub(before);
    let output = job.output();
    let mut ranks = Vec::new();
    for (rank, side) in sides.into_iter().enumerate() {
        let report = rank_report(&output, rank, side)
            .ok_or_else(|| job.failure(&format!("rank {rank} did not report every check")))?;
        if report.verified_bytes != point_to_point_bytes() || !report.collectives_verified {
            return Err(job.failure(&format!("rank {rank} reported {report:?}")));
        }
        if !loaded_its_library(&report) {
            return Err(job.failure(&format!(
                "rank {rank} ({}) loaded {}",
                side.name(),
                report.libibverbs
            )));
        }
        ranks.push(report);
    }
    if rxe_sent_packets < point_to_point_bytes() / 4096 {
        return Err(Error::Scenario(format!(
            "{name}: {} sent {rxe_sent_packets} packets for {} bytes each way",
            crate::inside::DEVICE,
            point_to_point_bytes()
        )));
    }
    Ok(MpiRun {
        ranks,
        rxe_sent_packets,
    })
}

/// Process mode: the jobs of [`PAIRINGS`], with the agent's publication in `published`.
pub fn mpi_traffic(
    published: &Path,
    agent_socket: &Path,
    library_dir: &Path,
) -> Result<Vec<MpiRun>> {
    PAIRINGS
        .into_iter()
        .map(|sides| {
            let run = run_job(sides, published, agent_socket, library_dir)?;
            println!(
                "  ok: Open MPI, ranks {} and {}: {} bytes point-to-point each way, bcast and \
                 allreduce verified, {} packets on rxe0",
                sides[0].name(),
                sides[1].name(),
                point_to_point_bytes(),
                run.rxe_sent_packets
            );
            Ok(run)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUTPUT: &str = "\
rank 1: point-to-point verified, 15937731 bytes received
rank 0: point-to-point verified, 15937731 bytes received
rank 0: collectives verified (bcast, allreduce)
rank 1: collectives verified (bcast, allreduce)
rank 1: libibverbs /work/main/target/release/libvrdma_ibverbs.so
rank 0: libibverbs /usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.56.1
";

    #[test]
    fn each_rank_is_read_from_its_own_lines() {
        let rank0 = rank_report(OUTPUT, 0, StackSide::Native).unwrap();
        let rank1 = rank_report(OUTPUT, 1, StackSide::Vrdma).unwrap();
        assert_eq!(rank0.verified_bytes, 15937731);
        assert!(rank0.collectives_verified && rank1.collectives_verified);
        assert!(loaded_its_library(&rank0) && loaded_its_library(&rank1));
        // The sides swapped: neither loaded what it should have.
        let swapped0 = RankReport {
            side: StackSide::Vrdma,
            ..rank0
        };
        assert!(!loaded_its_library(&swapped0));
        let swapped1 = RankReport {
            side: StackSide::Native,
            ..rank1
        };
        assert!(!loaded_its_library(&swapped1));
        assert_eq!(rank_report(OUTPUT, 2, StackSide::Native), None);
    }

    #[test]
    fn a_rank_that_did_not_finish_has_no_report() {
        let cut: String = OUTPUT.lines().take(3).collect::<Vec<_>>().join("\n");
        assert_eq!(rank_report(&cut, 1, StackSide::Vrdma), None);
    }

    #[test]
    fn the_sizes_are_those_the_program_checked_here() {
        assert_eq!(point_to_point_bytes(), 15937731);
    }
}

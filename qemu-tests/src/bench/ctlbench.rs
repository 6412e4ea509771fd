//! The two control-path bench programs, run inside the VM: `vrdma-ctlbench` (the vrdma verbs
//! API over the process transport) and `vrdma-native-ctlbench` (`native/ctlbench.c`, rdma-core
//! on rxe0). Both take the same measurements and print the same JSON.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::inside::Proc;

/// File name of the native program under `<target>/native/`.
pub const NATIVE_NAME: &str = "vrdma-native-ctlbench";
/// Source of the native program.
pub fn native_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("native/ctlbench.c")
}

/// Which implementation of the verbs a measurement goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// rdma-core on the host device.
    Native,
    /// vrdma's verbs API, process transport, one backend.
    Vrdma,
}

impl Via {
    pub fn label(self) -> &'static str {
        match self {
            Via::Native => "native",
            Via::Vrdma => "vrdma",
        }
    }
}

/// Where the two programs are, and what they use.
#[derive(Debug, Clone)]
pub struct Programs {
    /// `vrdma-native-ctlbench`.
    pub native: PathBuf,
    /// `vrdma-ctlbench`.
    pub vrdma: PathBuf,
    /// The host RDMA device (native side).
    pub device: String,
}

/// What the control measurement does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlPlan {
    /// Repetitions of each CQ and QP measurement.
    pub reps: u32,
    /// Bytes of the registered buffer.
    pub mr_bytes: u64,
    /// Repetitions of the registration.
    pub mr_reps: u32,
    /// Register memory of 2 MiB hugetlb pages (vrdma: guest RAM of them) instead of ordinary
    /// pages.
    #[serde(default)]
    pub huge_pages: bool,
    /// Native only: register pages of a shared memfd (the memory a vhost-user VM's RAM is)
    /// instead of private anonymous memory. vrdma's guest RAM is always a shared memfd.
    #[serde(default)]
    pub shared_memory: bool,
}

/// Fewest registrations over huge pages in each process. Each costs ~10 ms under TCG, and a
/// process's second registration of its huge pages still runs 10–40 % slower than the later
/// ones over vrdma (measured: 11.0, 9.5, 8.8, 8.8 ms after a first of 19.2 against
/// native's 7.2–8.0), so a median of one or two later registrations showed that warm-up, not
/// the steady cost. The larger effect is per process (under TCG a process registers at one
/// of two speeds, natively too): that one is averaged out by taking the samples from several
/// processes (`control::MR_PROCESSES`).
pub const HUGE_MR_REPS: u32 = 5;

impl ControlPlan {
    /// The registrations of this plan over ordinary pages (and the object measurements once,
    /// as the programs always make them).
    pub fn registrations_only(&self) -> ControlPlan {
        ControlPlan {
            reps: 1,
            huge_pages: false,
            shared_memory: false,
            ..*self
        }
    }

    /// The registrations of this plan over huge pages (and the object measurements once, as
    /// the programs always make them), at least [`HUGE_MR_REPS`] of them.
    pub fn over_huge_pages(&self) -> ControlPlan {
        ControlPlan {
            reps: 1,
            mr_reps: self.mr_reps.max(HUGE_MR_REPS),
            huge_pages: true,
            ..*self
        }
    }
}

/// What one scale process does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleJob {
    /// Sending QPs (each with a peer QP of its own).
    pub qps: u32,
    /// Timed messages.
    pub messages: u32,
    /// Most messages in flight.
    pub window: u32,
    /// Bytes per message.
    pub size: u32,
}

/// What a program printed: raw samples in nanoseconds by name, and its parameters.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Output {
    pub samples_ns: BTreeMap<String, Vec<u64>>,
    #[serde(default)]
    pub mr_bytes: Option<u64>,
    #[serde(default)]
    pub elapsed_ns: Option<u64>,
    #[serde(default)]
    pub setup_ns: Option<u64>,
    #[serde(default)]
    pub messages: Option<u64>,
}

impl Output {
    /// The samples named `name`, which must be there and not empty.
    pub fn series(&self, name: &str) -> Result<&[u64]> {
        self.samples_ns
            .get(name)
            .filter(|s| !s.is_empty())
            .map(Vec::as_slice)
            .ok_or_else(|| Error::Scenario(format!("bench output has no {name} samples")))
    }
}

/// Reads the JSON object a program printed as its last line starting with `{` (log lines
/// on stderr may come before it).
pub fn parse_output(text: &str) -> Result<Output> {
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| Error::Scenario("the bench program printed no result".into()))?;
    serde_json::from_str(line).map_err(|e| Error::Scenario(format!("bench result: {e}")))
}

impl Programs {
    fn base(&self, via: Via, socket: Option<&Path>, bench: &str) -> Result<Command> {
        Ok(match via {
            Via::Native => {
                let mut cmd = Command::new(&self.native);
                cmd.arg(bench).args(["-d", &self.device]);
                cmd
            }
            Via::Vrdma => {
                let socket = socket.ok_or_else(|| {
                    Error::Scenario("the vrdma side needs a backend socket".into())
                })?;
                let mut cmd = Command::new(&self.vrdma);
                cmd.arg("--socket").arg(socket).arg(bench);
                cmd
            }
        })
    }

    /// The control measurement's command.
    pub fn control(&self, via: Via, socket: Option<&Path>, plan: &ControlPlan) -> Result<Command> {
        let mut cmd = self.base(via, socket, "control")?;
        let (reps, bytes, mr_reps) = (
            plan.reps.to_string(),
            plan.mr_bytes.to_string(),
            plan.mr_reps.to_string(),
        );
        match via {
            Via::Native => cmd.args(["-r", &reps, "-m", &bytes, "-R", &mr_reps]),
            Via::Vrdma => cmd.args(["--reps", &reps, "--mr-bytes", &bytes, "--mr-reps", &mr_reps]),
        };
        if plan.shared_memory && via == Via::Native {
            cmd.arg("-S");
        }
        if plan.huge_pages {
            cmd.arg(match via {
                Via::Native => "-H",
                Via::Vrdma => "--huge-pages",
            });
        }
        Ok(cmd)
    }

    /// One scale process's command; with `barrier` (ready file, start file) it waits for the
    /// start file once set up.
    pub fn scale(
        &self,
        via: Via,
        socket: Option<&Path>,
        job: &ScaleJob,
        barrier: Option<(&Path, &Path)>,
    ) -> Result<Command> {
        let mut cmd = self.base(via, socket, "scale")?;
        let values = [
            job.qps.to_string(),
            job.messages.to_string(),
            job.window.to_string(),
            job.size.to_string(),
        ];
        let flags: [&str; 4] = match via {
            Via::Native => ["-q", "-n", "-w", "-s"],
            Via::Vrdma => ["--qps", "--messages", "--window", "--size"],
        };
        for (flag, value) in flags.iter().zip(&values) {
            cmd.args([*flag, value.as_str()]);
        }
        if let Some((ready, start)) = barrier {
            let (ready_flag, start_flag) = match via {
                Via::Native => ("-y", "-g"),
                Via::Vrdma => ("--ready-file", "--start-file"),
            };
            cmd.arg(ready_flag).arg(ready).arg(start_flag).arg(start);
        }
        Ok(cmd)
    }
}

/// Runs `cmd` to completion within `timeout` and reads its result.
pub fn run_to_output(name: &str, cmd: &mut Command, timeout: Duration) -> Result<Output> {
    let mut proc = Proc::spawn(name, cmd)?;
    proc.wait_success(timeout)?;
    parse_output(&proc.output()).map_err(|e| proc.failure(&e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn programs() -> Programs {
        Programs {
            native: "/t/native/vrdma-native-ctlbench".into(),
            vrdma: "/t/debug/vrdma-ctlbench".into(),
            device: "rxe0".into(),
        }
    }

    fn args(cmd: &Command) -> String {
        cmd.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn both_programs_get_the_same_plan() {
        let plan = ControlPlan {
            reps: 7,
            mr_bytes: 1 << 20,
            mr_reps: 2,
            huge_pages: false,
            shared_memory: false,
        };
        let p = programs();
        let native = p.control(Via::Native, None, &plan).unwrap();
        assert_eq!(args(&native), "control -d rxe0 -r 7 -m 1048576 -R 2");
        let sock = Path::new("/tmp/s");
        let vrdma = p.control(Via::Vrdma, Some(sock), &plan).unwrap();
        assert_eq!(
            args(&vrdma),
            "--socket /tmp/s control --reps 7 --mr-bytes 1048576 --mr-reps 2"
        );
        assert!(p.control(Via::Vrdma, None, &plan).is_err());
        let shared = ControlPlan {
            shared_memory: true,
            ..plan.registrations_only()
        };
        let native = p.control(Via::Native, None, &shared).unwrap();
        assert_eq!(args(&native), "control -d rxe0 -r 1 -m 1048576 -R 2 -S");
        let huge = plan.over_huge_pages();
        let native = p.control(Via::Native, None, &huge).unwrap();
        assert_eq!(args(&native), "control -d rxe0 -r 1 -m 1048576 -R 5 -H");
        let vrdma = p.control(Via::Vrdma, Some(sock), &huge).unwrap();
        assert_eq!(
            args(&vrdma),
            "--socket /tmp/s control --reps 1 --mr-bytes 1048576 --mr-reps 5 --huge-pages"
        );
        let job = ScaleJob {
            qps: 64,
            messages: 100,
            window: 16,
            size: 64,
        };
        let barrier = Some((Path::new("/r"), Path::new("/s")));
        let native = p.scale(Via::Native, None, &job, barrier).unwrap();
        assert_eq!(
            args(&native),
            "scale -d rxe0 -q 64 -n 100 -w 16 -s 64 -y /r -g /s"
        );
        let vrdma = p.scale(Via::Vrdma, Some(sock), &job, None).unwrap();
        assert_eq!(
            args(&vrdma),
            "--socket /tmp/s scale --qps 64 --messages 100 --window 16 --size 64"
        );
    }

    #[test]
    fn reads_the_last_json_line() {
        let text = "[WARN vrdma] something\n{\"samples_ns\":{\"a\":[1,2]},\"mr_bytes\":4096}\n";
        let out = parse_output(text).unwrap();
        assert_eq!(out.series("a").unwrap(), [1, 2]);
        assert_eq!(out.mr_bytes, Some(4096));
        assert!(out.series("b").is_err());
        let empty = parse_output("{\"samples_ns\":{\"a\":[]}}").unwrap();
        assert!(empty.series("a").is_err());
        assert!(parse_output("error: no device\n").is_err());
        assert!(parse_output("{\"samples_ns\": 3}").is_err());
    }
}

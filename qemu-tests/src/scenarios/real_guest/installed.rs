//! The guest side installed as a Debian user installs it: `dpkg -i` of the `vrdma-guest`
//! package (`vrdma-deb`), the agent started the way its installed systemd unit says, programs
//! run by a member of the group `rdma` with no vrdma variable and no `LD_LIBRARY_PATH`, and
//! `dpkg --purge` undoing it all.
//!
//! dpkg runs in the rxe VM, on the nested guest's root before it boots ([`InstalledRoot`]: an
//! overlay over the shared tree, which the guest then boots from): under nested TCG, dpkg's
//! reading of its database and the loader-cache trigger took minutes of every CI run, for
//! the same files. The package's own checks run there too, chrooted into the guest's root
//! (the loader's view, Python loading the library, `systemd-analyze verify`), and the purge
//! once the guest has gone. The nested guest runs no systemd (the suite is its init), so
//! [`ServiceUnit`] does what systemd would with the unit's `EnvironmentFile`, `ExecStartPre`,
//! `ExecStart` and `ExecStopPost` lines.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::host::run_checked;
use crate::inside::Proc;
use crate::rootfs::PreparedRoot;

/// Where the package puts the drop-in (ahead of rdma-core's in the loader's cache).
pub const LIBRARY_DIR: &str = "/usr/lib/x86_64-linux-gnu/vrdma";
/// The agent's socket, as its unit has it listen (the drop-in's default).
pub const AGENT_SOCKET: &str = "/run/vrdma/agent.sock";
/// The package's name.
const PACKAGE: &str = "vrdma-guest";
/// The agent's unit as the package installs it.
const UNIT: &str = "/usr/lib/systemd/system/vrdma-guestd.service";
/// The ordinary user who runs the programs: a member of `rdma`, as an administrator makes one.
const USER: &str = "vrdma-user";
/// A program linked against both of rdma-core's libraries.
const PROBE_PROGRAM: &str = "/usr/bin/rping";
/// systemd's search path for services.
const SERVICE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin";
/// Where the rxe VM builds the nested guest's root.
const GUEST_ROOT_DIR: &str = "/run/vrdma-guest-root";

/// What installing and purging the package showed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PackageRecord {
    /// `dpkg-query`'s status line of the installed package.
    pub status: String,
    /// Where a program's libibverbs.so.1 and librdmacm.so.1 came from, installed (`ldd`).
    pub resolved: Vec<String>,
    /// The same after `dpkg --purge`.
    pub purged: Vec<String>,
    /// The package's files still present after the purge (none expected).
    pub left_after_purge: Vec<String>,
    /// How long installing (with its checks) and purging took in the rxe VM, in seconds.
    pub install_secs: f64,
    pub purge_secs: f64,
}

/// The nested guest's root with the package installed: the shared tree below, a tmpfs above,
/// merged by overlayfs; unmounted when dropped.
pub struct InstalledRoot {
    /// The tmpfs holding the overlay's upper and work directories, and its mount point.
    dir: PathBuf,
    merged: PathBuf,
    root: PreparedRoot,
}

impl InstalledRoot {
    /// Installs `deb` with dpkg into an overlay over `root`'s tree, checks it as the
    /// guest will see it and makes the ordinary user.
    pub fn install(root: &PreparedRoot, deb: &Path, record: &mut PackageRecord) -> Result<Self> {
        let started = Instant::now();
        let dir = PathBuf::from(GUEST_ROOT_DIR);
        let merged = dir.join("merged");
        // A run that did not get to unmount left these behind.
        let _ = Command::new("umount").arg(&merged).status();
        let _ = Command::new("umount").arg(&dir).status();
        std::fs::create_dir_all(&dir).context(|| format!("creating {}", dir.display()))?;
        run_checked(
            Command::new("mount")
                .args(["-t", "tmpfs", "tmpfs"])
                .arg(&dir),
        )?;
        let installed = InstalledRoot {
            merged: merged.clone(),
            root: root.layered_over(merged.clone()),
            dir: dir.clone(),
        };
        for sub in ["upper", "work", "merged"] {
            std::fs::create_dir(dir.join(sub)).context(|| format!("creating {sub}"))?;
        }
        let layers = format!(
            "lowerdir={},upperdir={},workdir={}",
            root.tree.display(),
            dir.join("upper").display(),
            dir.join("work").display()
        );
        run_checked(
            Command::new("mount")
                .args(["-t", "overlay", "overlay", "-o", &layers])
                .arg(&merged),
        )?;
        let output = run_checked(
            Command::new("dpkg")
                .arg("--root")
                .arg(&merged)
                .arg("-i")
                .arg(deb),
        )?;
        println!(
            "{}",
            crate::error::tail(&String::from_utf8_lossy(&output.stdout), 4)
        );
        record.status = installed.query_status()?;
        record.resolved = installed.resolved_libraries()?;
        // Loaded at run time too, as UCX's, libfabric's and Python's modules load it: glibc
        // refuses a library that would need an executable stack.
        installed.chrooted(&[
            "python3",
            "-c",
            "import ctypes; ctypes.CDLL('librdmacm.so.1').rdma_create_event_channel",
        ])?;
        // systemd's own reading of the installed unit (the guest's systemd, offline).
        installed.chrooted(&["systemd-analyze", "verify", UNIT])?;
        if installed.chrooted(&["id", "-u", USER]).is_err() {
            installed.chrooted(&[
                "useradd",
                "--system",
                "--no-create-home",
                "--gid",
                "rdma",
                "--shell",
                "/usr/sbin/nologin",
                USER,
            ])?;
        }
        record.install_secs = started.elapsed().as_secs_f64();
        Ok(installed)
    }

    /// The root the nested guest boots from.
    pub fn root(&self) -> &PreparedRoot {
        &self.root
    }

    /// Purges the package (after the guest has gone) and records what is left.
    pub fn purge(&self, record: &mut PackageRecord) -> Result<()> {
        let started = Instant::now();
        run_checked(
            Command::new("dpkg")
                .arg("--root")
                .arg(&self.merged)
                .args(["--purge", PACKAGE]),
        )?;
        record.purged = self.resolved_libraries()?;
        record.left_after_purge = [
            LIBRARY_DIR,
            UNIT,
            "/etc/ld.so.conf.d/00-vrdma.conf",
            "/usr/sbin/vrdma-guestd",
            "/etc/default/vrdma-guestd",
            "/etc/systemd/system/multi-user.target.wants/vrdma-guestd.service",
            AGENT_SOCKET,
        ]
        .into_iter()
        .filter(|path| self.merged.join(path.trim_start_matches('/')).exists())
        .map(String::from)
        .collect();
        record.purge_secs = started.elapsed().as_secs_f64();
        Ok(())
    }

    /// Runs `words` chrooted into the guest's root.
    fn chrooted(&self, words: &[&str]) -> Result<std::process::Output> {
        run_checked(Command::new("chroot").arg(&self.merged).args(words))
    }

    fn query_status(&self) -> Result<String> {
        let output = run_checked(
            Command::new("dpkg-query")
                .arg("--root")
                .arg(&self.merged)
                .args(["-W", "-f", "${Package} ${Version} ${Status}", PACKAGE]),
        )?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// `ldd`'s lines for rdma-core's two libraries in a program linked against both.
    fn resolved_libraries(&self) -> Result<Vec<String>> {
        let output = self.chrooted(&["ldd", PROBE_PROGRAM])?;
        Ok(String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter(|line| line.contains("libibverbs.so.1") || line.contains("librdmacm.so.1"))
            .map(|line| line.trim().to_string())
            .collect())
    }
}

impl Drop for InstalledRoot {
    fn drop(&mut self) {
        for mount in [&self.merged, &self.dir] {
            if let Err(e) = run_checked(Command::new("umount").arg(mount)) {
                log::warn!("{e}");
            }
        }
    }
}

/// The ordinary user's uid and gid, in the guest (its primary group is `rdma`).
pub fn user() -> Result<(u32, u32)> {
    let id = |flag: &str| -> Result<u32> {
        let output = run_checked(Command::new("id").arg(flag).arg(USER))?;
        let text = String::from_utf8_lossy(&output.stdout);
        text.trim()
            .parse()
            .map_err(|_| Error::Scenario(format!("id {flag} {USER} printed {text:?}")))
    };
    Ok((id("-u")?, id("-g")?))
}

/// Sets the agent's options the way an operator does: in its settings file.
pub fn configure(unit: &ServiceUnit, settings: &[(&str, String)]) -> Result<()> {
    let Some(file) = &unit.environment_file else {
        return Err(Error::Scenario(format!("{UNIT} reads no settings file")));
    };
    let mut text =
        std::fs::read_to_string(file).context(|| format!("reading {}", file.display()))?;
    for (name, value) in settings {
        text.push_str(&format!("{name}={value}\n"));
    }
    std::fs::write(file, text).context(|| format!("writing {}", file.display()))
}

/// A command line of the unit: its words and whether a failure is ignored (`-`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct UnitCommand {
    line: String,
    ignore_failure: bool,
}

impl UnitCommand {
    fn new(value: &str) -> Self {
        match value.strip_prefix('-') {
            Some(rest) => Self {
                line: rest.into(),
                ignore_failure: true,
            },
            None => Self {
                line: value.into(),
                ignore_failure: false,
            },
        }
    }
}

/// What of a systemd service unit starts and stops its program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceUnit {
    environment_file: Option<PathBuf>,
    start_pre: Vec<UnitCommand>,
    start: UnitCommand,
    stop_post: Vec<UnitCommand>,
}

impl ServiceUnit {
    /// The installed agent's unit.
    pub fn installed_agent() -> Result<Self> {
        let text = std::fs::read_to_string(UNIT).context(|| format!("reading {UNIT}"))?;
        Self::parse(&text)
    }

    fn parse(text: &str) -> Result<Self> {
        let mut environment_file = None;
        let mut start_pre = Vec::new();
        let mut start = None;
        let mut stop_post = Vec::new();
        for line in text.lines().map(str::trim) {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            match key {
                // "-": a missing file is no error (it always exists here: the package has it).
                "EnvironmentFile" => {
                    environment_file = Some(PathBuf::from(value.trim_start_matches('-')))
                }
                "ExecStartPre" => start_pre.push(UnitCommand::new(value)),
                "ExecStart" => start = Some(UnitCommand::new(value)),
                "ExecStopPost" => stop_post.push(UnitCommand::new(value)),
                _ => {}
            }
        }
        Ok(Self {
            environment_file,
            start_pre,
            start: start.ok_or_else(|| Error::Scenario("the unit has no ExecStart".into()))?,
            stop_post,
        })
    }

    /// The service's environment: systemd's PATH and the settings file's assignments.
    fn environment(&self) -> Result<Vec<(String, String)>> {
        let mut env = vec![("PATH".to_string(), SERVICE_PATH.to_string())];
        if let Some(file) = &self.environment_file {
            let text =
                std::fs::read_to_string(file).context(|| format!("reading {}", file.display()))?;
            env.extend(assignments(&text));
        }
        Ok(env)
    }

    fn command(&self, unit_command: &UnitCommand, env: &[(String, String)]) -> Result<Command> {
        let words = expand(&unit_command.line, env)?;
        let (program, args) = words
            .split_first()
            .ok_or_else(|| Error::Scenario(format!("empty command {:?}", unit_command.line)))?;
        let mut command = Command::new(program);
        command.args(args).env_clear().envs(env.iter().cloned());
        Ok(command)
    }

    fn run_all(&self, commands: &[UnitCommand], env: &[(String, String)]) -> Result<()> {
        for unit_command in commands {
            let result = run_checked(&mut self.command(unit_command, env)?);
            if let Err(e) = result {
                if !unit_command.ignore_failure {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Starts the service as `systemctl start` does.
    pub fn start(&self, name: &str) -> Result<Proc> {
        let env = self.environment()?;
        self.run_all(&self.start_pre, &env)?;
        Proc::spawn(name, &mut self.command(&self.start, &env)?)
    }

    /// Stops the service as `systemctl stop` does: SIGTERM, then the stop-post commands.
    pub fn stop(&self, service: &mut Proc, timeout: Duration) -> Result<()> {
        service.signal("TERM")?;
        service.wait_exit(timeout)?;
        self.run_all(&self.stop_post, &self.environment()?)
    }
}

/// The `NAME=value` assignments of an environment file (comments and blank lines skipped,
/// one pair of enclosing quotes removed).
fn assignments(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(|line| {
            let (name, value) = line.split_once('=')?;
            let value = value.trim();
            let unquoted = ['"', '\'']
                .iter()
                .find_map(|q| value.strip_prefix(*q)?.strip_suffix(*q))
                .unwrap_or(value);
            Some((name.trim().to_string(), unquoted.to_string()))
        })
        .collect()
}

/// A unit's command line in words, as systemd splits it: `$NAME` becomes the words of the
/// variable's value (none when unset), `${NAME}` one word. Quoting is not used by the units
/// here and is refused.
fn expand(line: &str, env: &[(String, String)]) -> Result<Vec<String>> {
    if line.contains(['"', '\'', '\\']) {
        return Err(Error::Scenario(format!("quoting in {line:?}")));
    }
    let lookup = |name: &str| {
        env.iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let mut words = Vec::new();
    for word in line.split_whitespace() {
        if let Some(name) = word.strip_prefix("${").and_then(|w| w.strip_suffix('}')) {
            words.push(lookup(name).unwrap_or_default().to_string());
        } else if let Some(name) = word.strip_prefix('$') {
            words.extend(
                lookup(name)
                    .unwrap_or_default()
                    .split_whitespace()
                    .map(String::from),
            );
        } else if word.contains('$') {
            return Err(Error::Scenario(format!("a variable inside {word:?}")));
        } else {
            words.push(word.to_string());
        }
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGENT_UNIT: &str = include_str!("../../../../guest-driver/agent/vrdma-guestd.service");
    const AGENT_SETTINGS: &str =
        include_str!("../../../../guest-driver/agent/vrdma-guestd.default");

    #[test]
    fn the_agents_unit_is_read_as_systemd_reads_it() {
        let unit = ServiceUnit::parse(AGENT_UNIT).unwrap();
        assert_eq!(
            unit.environment_file.as_deref(),
            Some(Path::new("/etc/default/vrdma-guestd"))
        );
        assert!(unit.start_pre.iter().any(|c| c.ignore_failure));
        assert_eq!(unit.stop_post.len(), 1);
        let mut env = assignments(AGENT_SETTINGS);
        assert_eq!(env, [("VRDMA_PCI_DEVICE".to_string(), "auto".to_string())]);
        env.push((
            "VRDMA_GUESTD_ARGS".into(),
            "--guest-ram-mib=64 --max-pinned-mib-per-user=8".into(),
        ));
        let words = expand(&unit.start.line, &env).unwrap();
        assert_eq!(words[0], "/usr/sbin/vrdma-guestd");
        assert!(
            words.windows(2).any(|w| w == ["--socket", AGENT_SOCKET]),
            "{words:?}"
        );
        assert_eq!(
            &words[words.len() - 2..],
            ["--guest-ram-mib=64", "--max-pinned-mib-per-user=8"]
        );
        // Unset, the variable gives no word.
        let bare = expand(&unit.start.line, &[]).unwrap();
        assert_eq!(bare.len(), words.len() - 2);
    }

    #[test]
    fn settings_files_lose_comments_and_one_pair_of_quotes() {
        let env = assignments("# c\n\nA=1\nB=\"two words\"\n C = 'x' \n");
        assert_eq!(
            env,
            [
                ("A".into(), "1".into()),
                ("B".into(), "two words".into()),
                ("C".into(), "x".into())
            ]
        );
        assert!(expand("prog \"quoted\"", &env).is_err());
        assert_eq!(
            expand("prog ${B} $B", &env).unwrap(),
            ["prog", "two words", "two", "words"]
        );
    }
}

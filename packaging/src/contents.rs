//! What the `vrdma-guest` package installs, and where.
//!
//! Paths that the agent's systemd unit names (the agent's program, its settings file, its
//! socket) are read from the unit, so the unit is where they are defined.

use crate::error::{Error, Result};

/// The package's name.
pub const PACKAGE: &str = "vrdma-guest";
/// The drop-in library as cargo builds it.
pub const DROPIN_ARTIFACT: &str = "libvrdma_ibverbs.so";
/// The guest agent as cargo builds it.
pub const AGENT_ARTIFACT: &str = "vrdma-guestd";
/// The agent's systemd unit.
pub const AGENT_UNIT_NAME: &str = "vrdma-guestd.service";
const AGENT_UNIT: &str = include_str!("../../guest-driver/agent/vrdma-guestd.service");
const AGENT_DEFAULTS: &str = include_str!("../../guest-driver/agent/vrdma-guestd.default");
const AGENT_README: &str = include_str!("../../guest-driver/agent/README.md");
const DROPIN_README: &str = include_str!("../../guest-driver/capi/README.md");
/// The soname the drop-in has (and rdma-core's libibverbs).
pub const DROPIN_SONAME: &str = "libibverbs.so.1";

/// The target the package is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// Debian's architecture name.
    pub arch: &'static str,
    /// Its multiarch library directory name.
    pub triplet: &'static str,
}

impl Target {
    /// The target of this build of the tool (the drop-in's data path is x86-64 only).
    pub fn host() -> Result<Self> {
        match std::env::consts::ARCH {
            "x86_64" => Ok(Self {
                arch: "amd64",
                triplet: "x86_64-linux-gnu",
            }),
            other => Err(Error::Input(format!("no package for {other}"))),
        }
    }

    /// Where the drop-in's libraries go: a directory of their own, which the loader's cache
    /// lists before the system's (see [`LD_SO_CONF`]).
    pub fn library_dir(&self) -> String {
        format!("/usr/lib/{}/vrdma", self.triplet)
    }
}

/// The loader configuration that puts the drop-in before rdma-core's libraries: `ldconfig`
/// reads `/etc/ld.so.conf.d/*.conf` in name order, and the cache lists a soname's entries in
/// the order their directories were read, so this file sorts before Debian's
/// `<triplet>.conf`, which names the system directories.
pub const LD_SO_CONF: &str = "/etc/ld.so.conf.d/00-vrdma.conf";

/// How a packaged file is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A file of the build (in the artifacts directory).
    Artifact(&'static str),
    /// The `librdmacm.so.1` forwarder, linked against the staged drop-in.
    RdmacmForwarder,
    /// Text.
    Text(String),
    /// A symbolic link to this target.
    Symlink(String),
}

/// One file of the package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its absolute path once installed.
    pub path: String,
    pub source: Source,
    /// Its mode (ignored for links).
    pub mode: u32,
    /// A configuration file: kept (and the administrator's changes to it) until purged.
    pub conffile: bool,
    /// An ELF file to strip of its debugging information.
    pub strip: bool,
}

impl Entry {
    fn new(path: impl Into<String>, source: Source, mode: u32) -> Self {
        let strip = matches!(source, Source::Artifact(_));
        Self {
            path: path.into(),
            source,
            mode,
            conffile: false,
            strip,
        }
    }

    fn conffile(mut self) -> Self {
        self.conffile = true;
        self
    }
}

/// The value of the unit's first `key=` line.
fn unit_value(key: &str) -> Result<&'static str> {
    AGENT_UNIT
        .lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
        .ok_or_else(|| Error::Input(format!("{AGENT_UNIT_NAME} has no {key}")))
}

/// The agent's program path, as the unit starts it.
pub fn agent_program() -> Result<&'static str> {
    let command = unit_value("ExecStart")?;
    command
        .split_whitespace()
        .next()
        .ok_or_else(|| Error::Input(format!("{AGENT_UNIT_NAME} starts nothing")))
}

/// The agent's socket, as the unit has it listen.
pub fn agent_socket() -> Result<&'static str> {
    let command = unit_value("ExecStart")?;
    let mut words = command.split_whitespace();
    words.find(|word| *word == "--socket");
    words
        .next()
        .ok_or_else(|| Error::Input(format!("{AGENT_UNIT_NAME} gives the agent no --socket")))
}

/// The agent's settings file, as the unit reads it (optional there, `-`).
pub fn agent_settings() -> Result<&'static str> {
    Ok(unit_value("EnvironmentFile")?.trim_start_matches('-'))
}

/// The copyright file Debian's policy asks for.
fn copyright() -> String {
    format!(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
         Upstream-Name: vrdma\n\n\
         Files: *\n\
         Copyright: the vrdma authors\n\
         License: {}\n \
         Apache License 2.0 (/usr/share/common-licenses/Apache-2.0) or the BSD 3-clause\n \
         license (/usr/share/common-licenses/BSD), at the user's choice.\n",
        env!("CARGO_PKG_LICENSE")
    )
}

/// Every file of the package, for `target` at `version`.
pub fn guest_package(target: Target, version: &str) -> Result<Vec<Entry>> {
    let libs = target.library_dir();
    let dropin_file = format!("libvrdma-ibverbs.so.{version}");
    let forwarder_file = format!("libvrdma-rdmacm.so.{version}");
    let doc = format!("/usr/share/doc/{PACKAGE}");
    Ok(vec![
        Entry::new(
            format!("{libs}/{dropin_file}"),
            Source::Artifact(DROPIN_ARTIFACT),
            0o644,
        ),
        // The soname links ldconfig would make, shipped so that dpkg owns them.
        Entry::new(
            format!("{libs}/{DROPIN_SONAME}"),
            Source::Symlink(dropin_file),
            0o777,
        ),
        Entry::new(
            format!("{libs}/{forwarder_file}"),
            Source::RdmacmForwarder,
            0o644,
        ),
        Entry::new(
            format!("{libs}/{}", crate::rdmacm_forwarder::SONAME),
            Source::Symlink(forwarder_file),
            0o777,
        ),
        Entry::new(
            LD_SO_CONF,
            Source::Text(format!(
                "# vrdma's drop-in libibverbs.so.1 and librdmacm.so.1 (package {PACKAGE}), \
                 before rdma-core's.\n{libs}\n"
            )),
            0o644,
        )
        .conffile(),
        Entry::new(agent_program()?, Source::Artifact(AGENT_ARTIFACT), 0o755),
        Entry::new(
            format!("/usr/lib/systemd/system/{AGENT_UNIT_NAME}"),
            Source::Text(AGENT_UNIT.into()),
            0o644,
        ),
        Entry::new(
            agent_settings()?,
            Source::Text(AGENT_DEFAULTS.into()),
            0o644,
        )
        .conffile(),
        Entry::new(
            format!("{doc}/README.md"),
            Source::Text(AGENT_README.into()),
            0o644,
        ),
        Entry::new(
            format!("{doc}/README.drop-in.md"),
            Source::Text(DROPIN_README.into()),
            0o644,
        ),
        Entry::new(format!("{doc}/copyright"), Source::Text(copyright()), 0o644),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unit_names_the_paths_the_package_installs() {
        assert_eq!(agent_program().unwrap(), "/usr/sbin/vrdma-guestd");
        assert_eq!(agent_socket().unwrap(), "/run/vrdma/agent.sock");
        assert_eq!(agent_settings().unwrap(), "/etc/default/vrdma-guestd");
        let entries = guest_package(Target::host().unwrap(), "0.1.0").unwrap();
        for path in [agent_program().unwrap(), agent_settings().unwrap()] {
            assert!(entries.iter().any(|e| e.path == path), "{path}");
        }
        // The unit removes the very socket it has the agent create.
        assert!(AGENT_UNIT.contains(&format!(
            "ExecStopPost=/bin/rm -f {}",
            agent_socket().unwrap()
        )));
    }

    #[test]
    fn files_in_etc_are_conffiles_and_paths_are_unique_and_absolute() {
        let entries = guest_package(Target::host().unwrap(), "0.1.0").unwrap();
        for entry in &entries {
            assert!(entry.path.starts_with('/'), "{entry:?}");
            assert_eq!(entry.conffile, entry.path.starts_with("/etc/"), "{entry:?}");
        }
        let mut paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
        paths.sort_unstable();
        paths.dedup();
        assert_eq!(paths.len(), entries.len());
    }

    #[test]
    fn the_loader_configuration_sorts_before_the_system_directories() {
        let name = LD_SO_CONF.rsplit('/').next().unwrap();
        let target = Target::host().unwrap();
        assert!(name < format!("{}.conf", target.triplet).as_str());
        assert!(name < "libc.conf");
    }
}

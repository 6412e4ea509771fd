//! Assembles the package: stages its files under a directory, writes the control files, and
//! has `dpkg-deb` build the archive (owned by root, whoever builds it).

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::contents::{self, Entry, Source, Target, DROPIN_SONAME, PACKAGE};
use crate::control::{self, Control};
use crate::error::{at, run, Error, Result};
use crate::{elf, rdmacm_forwarder};

/// How `dpkg-deb` compresses the archive's members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Compression {
    Xz,
    Gzip,
    None,
}

impl Compression {
    fn dpkg_args(self) -> &'static [&'static str] {
        match self {
            // Debian's default.
            Self::Xz => &["-Zxz"],
            // Quick, for test builds of large debug binaries.
            Self::Gzip => &["-Zgzip", "-z1"],
            Self::None => &["-Znone"],
        }
    }
}

/// What to build from where.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where cargo put the drop-in and the agent (`target/release`, `target/debug`).
    pub artifacts: PathBuf,
    /// Where the package (and its staging directory) goes.
    pub out: PathBuf,
    pub version: String,
    pub compression: Compression,
    /// Strip debugging information off the binaries (as Debian's packages do).
    pub strip: bool,
    /// The C compiler that links the librdmacm forwarder.
    pub cc: String,
}

/// Builds the `vrdma-guest` package; returns its path.
pub fn build_guest_package(options: &Options) -> Result<PathBuf> {
    let target = Target::host()?;
    let entries = contents::guest_package(target, &options.version)?;
    let name = format!("{PACKAGE}_{}_{}", options.version, target.arch);
    let stage = options.out.join(&name);
    if stage.exists() {
        fs::remove_dir_all(&stage).map_err(at(&stage))?;
    }
    let debian = stage.join("DEBIAN");
    fs::create_dir_all(&debian).map_err(at(&debian))?;

    let mut elves = Vec::new();
    let mut dropin_path = None;
    for entry in &entries {
        stage_entry(options, &stage, entry, &mut elves, &mut dropin_path)?;
    }

    let mut needed = Vec::new();
    let mut glibc = None;
    for file in &elves {
        needed.extend(elf::needed(file)?);
        glibc = glibc.max(elf::newest_glibc(file)?);
    }
    needed.sort_unstable();
    needed.dedup();
    let shipped = [
        DROPIN_SONAME.to_string(),
        rdmacm_forwarder::SONAME.to_string(),
    ];
    let control = Control {
        package: PACKAGE.into(),
        version: options.version.clone(),
        arch: target.arch.into(),
        installed_kib: installed_kib(&stage)?,
        depends: elf::depends(&needed, &shipped, glibc)?
            .into_iter()
            .chain(control::SCRIPT_DEPENDS.iter().map(|d| d.to_string()))
            .collect(),
    };
    let unit = contents::AGENT_UNIT_NAME;
    let conffiles: String = entries
        .iter()
        .filter(|e| e.conffile)
        .map(|e| format!("{}\n", e.path))
        .collect();
    // md5sums lists the installed files (dpkg --verify), relative to the root.
    let md5sums = md5sums(&stage, &entries)?;
    for (file, text, mode) in [
        ("control", control.render(), 0o644),
        ("conffiles", conffiles, 0o644),
        ("triggers", control::TRIGGERS.to_string(), 0o644),
        ("md5sums", md5sums, 0o644),
        ("postinst", control::postinst(unit), 0o755),
        ("prerm", control::prerm(unit), 0o755),
        (
            "postrm",
            control::postrm(unit, contents::agent_socket()?),
            0o755,
        ),
    ] {
        write_file(&debian.join(file), text.as_bytes(), mode)?;
    }

    let deb = options.out.join(format!("{name}.deb"));
    run(Command::new("dpkg-deb")
        .arg("--root-owner-group")
        .args(options.compression.dpkg_args())
        .arg("--build")
        .arg(&stage)
        .arg(&deb))?;
    Ok(deb)
}

/// Puts one entry in the staging directory; ELF files made are added to `elves`, and the
/// staged drop-in's path is kept in `dropin_path` (the forwarder links against it).
fn stage_entry(
    options: &Options,
    stage: &Path,
    entry: &Entry,
    elves: &mut Vec<PathBuf>,
    dropin_path: &mut Option<PathBuf>,
) -> Result<()> {
    let path = stage.join(entry.path.trim_start_matches('/'));
    let parent = path.parent().expect("entries are files under the root");
    fs::create_dir_all(parent).map_err(at(parent))?;
    // Directories as Debian ships them, whatever the builder's umask.
    for dir in parent
        .ancestors()
        .take_while(|dir| dir.starts_with(stage) && *dir != stage)
    {
        set_mode(dir, 0o755)?;
    }
    match &entry.source {
        Source::Artifact(name) => {
            if *name == contents::DROPIN_ARTIFACT {
                *dropin_path = Some(path.clone());
            }
            let from = options.artifacts.join(name);
            fs::copy(&from, &path).map_err(at(&from))?;
            set_mode(&path, entry.mode)?;
            if entry.strip && options.strip {
                run(Command::new("strip")
                    .args(["--strip-unneeded", "--remove-section=.comment"])
                    .arg(&path))?;
            }
            elves.push(path);
        }
        Source::RdmacmForwarder => {
            // The drop-in as staged (entries are staged in order).
            let dropin = dropin_path
                .clone()
                .ok_or_else(|| Error::Input("the forwarder is listed before the drop-in".into()))?;
            rdmacm_forwarder::build(&options.cc, &dropin, &path, &options.out)?;
            set_mode(&path, entry.mode)?;
            elves.push(path);
        }
        Source::Text(text) => write_file(&path, text.as_bytes(), entry.mode)?,
        Source::Symlink(target) => symlink(target, &path).map_err(at(&path))?,
    }
    Ok(())
}

fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    fs::write(path, bytes).map_err(at(path))?;
    set_mode(path, mode)
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(at(path))
}

/// The installed size: every staged file's bytes, in KiB, rounded up (as dpkg-gencontrol).
fn installed_kib(stage: &Path) -> Result<u64> {
    fn walk(dir: &Path, total: &mut u64) -> Result<()> {
        for entry in fs::read_dir(dir).map_err(at(dir))? {
            let entry = entry.map_err(at(dir))?;
            let meta = fs::symlink_metadata(entry.path()).map_err(at(entry.path()))?;
            if meta.is_dir() {
                if entry.file_name() != "DEBIAN" {
                    walk(&entry.path(), total)?;
                }
            } else {
                *total += meta.len().div_ceil(1024);
            }
        }
        Ok(())
    }
    let mut total = 0;
    walk(stage, &mut total)?;
    Ok(total)
}

/// `DEBIAN/md5sums` for the regular files that are not conffiles (dpkg tracks those itself).
fn md5sums(stage: &Path, entries: &[Entry]) -> Result<String> {
    let files: Vec<&str> = entries
        .iter()
        .filter(|e| !e.conffile && !matches!(e.source, Source::Symlink(_)))
        .map(|e| e.path.trim_start_matches('/'))
        .collect();
    run(Command::new("md5sum").args(&files).current_dir(stage))
}

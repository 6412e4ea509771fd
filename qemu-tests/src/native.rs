//! The native peer of `vrdma-pingpong` (`native/pingpong.c`): the same protocol over rdma-core's
//! libibverbs, built on the host with the system C compiler into `<target>/native/` and run in
//! the rxe VM against itself or against a vrdma process.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, IoContext, Result};
use crate::host::{ensure_tools, is_root, run_checked, Tool};

/// File name of the built peer.
pub const BINARY_NAME: &str = "vrdma-native-pingpong";

/// Compiler flags; a change rebuilds the peer like a change of the source does.
const CFLAGS: &[&str] = &["-O2", "-g", "-std=gnu11", "-Wall", "-Wextra", "-Werror"];
const LIBS: &[&str] = &["-libverbs"];

/// The C compiler.
const COMPILER: Tool = Tool {
    command: "cc",
    package: "gcc",
};
/// Package with the verbs headers and the `libibverbs.so` link.
const VERBS_DEV_PACKAGE: &str = "libibverbs-dev";
/// The rdma_cm headers (the drop-in librdmacm's layout check compiles against them).
const RDMACM_DEV_PACKAGE: &str = "librdmacm-dev";

/// The peer's source in this repository.
pub fn source_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("native/pingpong.c")
}

/// The cargo target directory: `$CARGO_TARGET_DIR`, else the one (marked by its CACHEDIR.TAG)
/// that holds this executable.
pub fn default_target_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return Some(PathBuf::from(dir));
    }
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .skip(1)
        .find(|dir| dir.join("CACHEDIR.TAG").is_file())
        .map(Path::to_path_buf)
}

/// Where [`build`] puts the peer under `target_dir`.
pub fn binary_path(target_dir: &Path) -> PathBuf {
    target_dir.join("native").join(BINARY_NAME)
}

/// Whether the compiler finds `<infiniband/verbs.h>`, `<rdma/rdma_cma.h>` and the
/// `libibverbs.so` link.
fn verbs_dev_present() -> bool {
    let header = Command::new(COMPILER.command)
        .args(["-E", "-x", "c", "-o", "/dev/null", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            if let Some(mut stdin) = child.stdin.take() {
                stdin.write_all(b"#include <infiniband/verbs.h>\n#include <rdma/rdma_cma.h>\n")?;
            }
            child.wait()
        })
        .is_ok_and(|status| status.success());
    // `-print-file-name` echoes the bare name back when the library is not found.
    let library = Command::new(COMPILER.command)
        .arg("-print-file-name=libibverbs.so")
        .output()
        .is_ok_and(|out| Path::new(String::from_utf8_lossy(&out.stdout).trim()).is_absolute());
    header && library
}

/// Installs the compiler and the verbs development files with apt-get when missing.
pub fn ensure_prerequisites() -> Result<()> {
    ensure_tools(&[COMPILER])?;
    if verbs_dev_present() {
        return Ok(());
    }
    if !is_root() {
        return Err(Error::Prerequisite(format!(
            "the libibverbs or librdmacm headers or libibverbs.so are missing; install as root: \
             apt-get install --no-install-recommends {VERBS_DEV_PACKAGE} {RDMACM_DEV_PACKAGE}"
        )));
    }
    crate::host::apt_install(&[VERBS_DEV_PACKAGE, RDMACM_DEV_PACKAGE])?;
    if !verbs_dev_present() {
        return Err(Error::Prerequisite(format!(
            "verbs headers still missing after installing {VERBS_DEV_PACKAGE} and \
             {RDMACM_DEV_PACKAGE}"
        )));
    }
    Ok(())
}

/// Builds the peer into `<target_dir>/native/` (installing prerequisites first) unless the
/// binary there was built from the same source with the same flags; returns its path.
pub fn build(target_dir: &Path) -> Result<PathBuf> {
    build_program(target_dir, &source_path(), BINARY_NAME)
}

/// Builds the verbs program `source` (C, against the system's rdma-core) into
/// `<target_dir>/native/NAME` the same way as the peer.
pub fn build_program(target_dir: &Path, source: &Path, name: &str) -> Result<PathBuf> {
    let mut text = std::fs::read(source).context(|| format!("reading {}", source.display()))?;
    text.extend(local_headers(source)?);
    let out_dir = target_dir.join("native");
    let binary = out_dir.join(name);
    let stamp = out_dir.join(format!("{name}.stamp"));
    let fingerprint = fingerprint(&text);
    if binary.is_file() && std::fs::read(&stamp).is_ok_and(|old| old == fingerprint) {
        log::debug!("{} is up to date", binary.display());
        return Ok(binary);
    }
    ensure_prerequisites()?;
    std::fs::create_dir_all(&out_dir).context(|| format!("creating {}", out_dir.display()))?;
    // Build under a private name and rename, so that concurrent builds never leave a partial
    // binary behind.
    let partial = out_dir.join(format!("{name}.{}.tmp", std::process::id()));
    let result = run_checked(
        Command::new(COMPILER.command)
            .args(CFLAGS)
            .arg("-o")
            .arg(&partial)
            .arg(source)
            .args(LIBS),
    );
    if let Err(e) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, &binary).context(|| format!("installing {}", binary.display()))?;
    std::fs::write(&stamp, &fingerprint).context(|| format!("writing {}", stamp.display()))?;
    log::info!("built {}", binary.display());
    Ok(binary)
}

/// Flags of [`build_shared_object`] besides the version script and soname.
const SHARED_CFLAGS: &[&str] = &[
    "-O2",
    "-std=gnu11",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-shared",
    "-fPIC",
];

/// Builds the shared object `source` (C, needing no headers beyond libc's) with the linker
/// version script `version_script` and soname `soname` into `<out_dir>/<soname>`, unless the
/// file there was built from the same inputs; returns its path.
pub fn build_shared_object(
    out_dir: &Path,
    source: &Path,
    version_script: &Path,
    soname: &str,
) -> Result<PathBuf> {
    let mut text = std::fs::read(source).context(|| format!("reading {}", source.display()))?;
    text.extend(local_headers(source)?);
    let script = std::fs::read(version_script)
        .context(|| format!("reading {}", version_script.display()))?;
    let library = out_dir.join(soname);
    let stamp = out_dir.join(format!("{soname}.stamp"));
    let mut fingerprint =
        format!("{} {}\n", COMPILER.command, SHARED_CFLAGS.join(" ")).into_bytes();
    fingerprint.extend_from_slice(&text);
    fingerprint.extend_from_slice(&script);
    if library.is_file() && std::fs::read(&stamp).is_ok_and(|old| old == fingerprint) {
        log::debug!("{} is up to date", library.display());
        return Ok(library);
    }
    ensure_tools(&[COMPILER])?;
    std::fs::create_dir_all(out_dir).context(|| format!("creating {}", out_dir.display()))?;
    let partial = out_dir.join(format!("{soname}.{}.tmp", std::process::id()));
    let mut script_arg = std::ffi::OsString::from("-Wl,--version-script=");
    script_arg.push(version_script);
    let result = run_checked(
        Command::new(COMPILER.command)
            .args(SHARED_CFLAGS)
            .arg(script_arg)
            .arg(format!("-Wl,-soname,{soname}"))
            .arg("-o")
            .arg(&partial)
            .arg(source),
    );
    if let Err(e) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, &library).context(|| format!("installing {}", library.display()))?;
    std::fs::write(&stamp, &fingerprint).context(|| format!("writing {}", stamp.display()))?;
    log::info!("built {}", library.display());
    Ok(library)
}

/// The compiler command line followed by the source: the binary is current if this matches.
/// The text of every `*.h` beside `source`, in name order: the headers a program may include
/// with `#include "…"`, so that editing one rebuilds it.
fn local_headers(source: &Path) -> Result<Vec<u8>> {
    let dir = source.parent().unwrap_or(Path::new("."));
    let mut headers: Vec<PathBuf> = std::fs::read_dir(dir)
        .context(|| format!("listing {}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "h"))
        .collect();
    headers.sort();
    let mut text = Vec::new();
    for header in headers {
        text.extend(std::fs::read(&header).context(|| format!("reading {}", header.display()))?);
    }
    Ok(text)
}

fn fingerprint(source: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "{} {} {}\n",
        COMPILER.command,
        CFLAGS.join(" "),
        LIBS.join(" ")
    )
    .into_bytes();
    out.extend_from_slice(source);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    /// The target directory, or `None` (with the reason printed) when the host cannot build
    /// the peer; in CI a missing prerequisite fails instead.
    fn buildable_target() -> Option<PathBuf> {
        // The project installs what the peer needs where it can (as root), as the
        // integration tests do; what is still missing then skips, or fails in CI.
        if let Err(e) = ensure_prerequisites() {
            let reason = format!("cannot build the native peer: {e}");
            assert!(std::env::var_os("CI").is_none(), "{reason}");
            eprintln!("skipped: {reason}");
            return None;
        }
        Some(default_target_dir().expect("tests run from a cargo target directory"))
    }

    #[test]
    fn builds_the_native_peer_once_and_its_selftest_passes() {
        let Some(target) = buildable_target() else {
            return;
        };
        let binary = build(&target).unwrap();
        assert_eq!(binary, binary_path(&target));
        let built = binary.metadata().unwrap().modified().unwrap();
        // Unchanged source: no rebuild.
        assert_eq!(build(&target).unwrap(), binary);
        assert_eq!(binary.metadata().unwrap().modified().unwrap(), built);
        let out = run_checked(Command::new(&binary).arg("selftest")).unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "selftest: ok\n");
        // Nonsense on the command line is refused with the usage.
        let out = Command::new(&binary).arg("sideways").output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("usage:"));
    }

    #[test]
    fn fingerprint_follows_source_and_flags() {
        assert_ne!(fingerprint(b"int main;"), fingerprint(b"int main; "));
        assert!(fingerprint(b"x").starts_with(b"cc -O2"));
    }

    /// Runs server and client of the native peer against each other on rxe0; returns
    /// whether each succeeded and what both printed.
    fn run_pair(
        binary: &Path,
        port: u16,
        server_args: &[&str],
        args: &[&str],
    ) -> (bool, bool, String) {
        let port = port.to_string();
        let mut server = Command::new(binary)
            .args(["server", "-d", "rxe0", "-p", &port])
            .args(server_args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let client = Command::new(binary)
            .args(["client", "-d", "rxe0", "-p", &port])
            .args(args)
            .output()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while server.try_wait().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = server.kill();
        let server = server.wait_with_output().unwrap();
        let text = format!(
            "client ({}):\n{}{}\nserver ({}):\n{}{}",
            client.status,
            String::from_utf8_lossy(&client.stdout),
            String::from_utf8_lossy(&client.stderr),
            server.status,
            String::from_utf8_lossy(&server.stdout),
            String::from_utf8_lossy(&server.stderr),
        );
        (client.status.success(), server.status.success(), text)
    }

    #[test]
    #[ignore = "needs Soft-RoCE (rxe0): run inside the VM (vrdma-vm run)"]
    fn native_peers_verify_every_operation_on_rxe() {
        let binary = binary_path(&default_target_dir().unwrap());
        let (client_ok, server_ok, text) = run_pair(
            &binary,
            18611,
            &[],
            &["-s", "1,64,1024,4096,65536", "-n", "20"],
        );
        assert!(client_ok && server_ok, "{text}");
        for op in ["send", "send_imm", "write", "write_imm", "read", "ud_send"] {
            let rows = text
                .lines()
                .filter(|l| l.split_whitespace().next() == Some(op))
                .count();
            // ud_send skips the sizes above the MTU.
            let expected = if op == "ud_send" { 3 } else { 5 };
            assert_eq!(rows, expected, "{op}:\n{text}");
        }
        let bw = ["-o", "send,write", "-s", "65536", "-n", "200", "--bw"];
        let (client_ok, server_ok, text) = run_pair(&binary, 18612, &[], &bw);
        assert!(client_ok && server_ok, "{text}");
        assert_eq!(
            text.lines().filter(|l| l.contains(" 65536 ")).count(),
            2,
            "{text}"
        );
    }

    #[test]
    #[ignore = "needs Soft-RoCE (rxe0): run inside the VM (vrdma-vm run)"]
    fn native_server_refuses_a_plan_above_its_area() {
        let binary = binary_path(&default_target_dir().unwrap());
        let (client_ok, server_ok, text) = run_pair(
            &binary,
            18613,
            &["-l", "4096"],
            &["-o", "send", "-s", "65536"],
        );
        assert!(!client_ok && !server_ok, "{text}");
        assert!(
            text.contains("peer failed: refusing plan send:65536:100:verify"),
            "{text}"
        );
    }
}

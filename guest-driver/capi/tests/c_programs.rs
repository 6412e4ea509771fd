//! The C programs of `tests/c/` (run against real rxe by `vrdma-vm test dropin`) compile and
//! link cleanly against the system's rdma-core headers and libibverbs, so a broken program is
//! caught on the host, without a VM. Skipped, with a message, when `cc` or the headers are
//! missing and `CI` is not set.

use std::path::{Path, PathBuf};
use std::process::Command;

fn programs() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "c"))
        .collect();
    found.sort();
    found
}

#[test]
fn c_programs_build_against_the_system_headers() {
    if !Path::new("/usr/include/infiniband/verbs.h").exists() {
        let reason = "the rdma-core headers (libibverbs-dev) are not installed";
        assert!(
            std::env::var_os("CI").is_none_or(|v| v.is_empty()),
            "CI is set but {reason}"
        );
        eprintln!("SKIPPED C program build: {reason}");
        return;
    }
    let out_dir = std::env::temp_dir().join(format!("vrdma-capi-c-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let programs = programs();
    assert!(programs.iter().any(|p| p.ends_with("cq_ex_loopback.c")));
    for program in programs {
        let binary = out_dir.join(program.file_stem().unwrap());
        let out = Command::new("cc")
            .args(["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&binary)
            .arg(&program)
            .arg("-libverbs")
            .output()
            .expect("cc runs");
        assert!(
            out.status.success(),
            "{} does not build:\n{}",
            program.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::remove_dir_all(&out_dir).unwrap();
}

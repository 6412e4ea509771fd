//! `vrdma-vm run`: a real boot of the rxe VM, its exit status, output and shares.

mod common;

use std::process::Command;

fn run_in_vm(script: &str) -> Option<(i32, String)> {
    common::vrdma_vm(&["prepare"])?;
    let output = Command::new(env!("CARGO_BIN_EXE_vrdma-vm"))
        .args(["run", "--timeout", "300", "--", "sh", "-c", script])
        .output()
        .expect("vrdma-vm starts");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    eprintln!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    Some((output.status.code().expect("exited"), stdout))
}

#[test]
fn command_runs_with_rxe_and_its_status_and_output_come_back() {
    // The workspace is shared read-only at its host path; rxe0 is up on the dummy netdev with
    // an IPv6 link-local GID (fe80::/64) at index 0 and no IPv4 address anywhere.
    let manifest = env!("CARGO_MANIFEST_DIR");
    let script = format!(
        "rdma link show rxe0/1; cat /sys/class/infiniband/rxe0/ports/1/gids/0; \
         test -f {manifest}/Cargo.toml && echo shared-ok; \
         touch {manifest}/x 2>/dev/null || echo read-only-ok; \
         ip -4 addr show d0 | grep -q inet || echo no-ipv4-ok; \
         echo 'it'\"'\"'s quoted'; exit 7"
    );
    let Some((status, out)) = run_in_vm(&script) else {
        return;
    };
    assert_eq!(status, 7, "{out}");
    assert!(out.contains("state ACTIVE"), "{out}");
    assert!(out.contains("fe80:0000:0000:0000:"), "{out}");
    assert!(out.contains("shared-ok"), "{out}");
    assert!(out.contains("read-only-ok"), "{out}");
    assert!(out.contains("no-ipv4-ok"), "{out}");
    assert!(out.contains("it's quoted"), "{out}");
}

/// A build in the same clone while a VM runs: files of the target directory replaced the ways
/// cargo and a linker replace them (a new file renamed over the old one; the old one removed
/// and a new one written), after `vrdma-vm` has frozen them and while the VM boots and runs.
/// The VM runs what it was started with.
#[test]
fn files_replaced_in_the_target_directory_while_a_vm_runs_do_not_reach_it() {
    use std::io::BufRead;
    use std::os::unix::fs::PermissionsExt;
    use std::process::Stdio;

    if common::vrdma_vm(&["prepare"]).is_none() {
        return;
    }
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_vrdma-vm"));
    let target = vrdma_qemu_tests::vm::find_target_dir(exe).expect("a cargo target directory");
    let dir = target.join("native");
    std::fs::create_dir_all(&dir).unwrap();
    let probe = |how: &str| dir.join(format!("snapshot-probe-{}-{how}", std::process::id()));
    let write_script = |path: &std::path::Path, text: &str| {
        std::fs::write(path, format!("#!/bin/sh\necho {text}\n")).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    let (renamed, rewritten) = (probe("renamed"), probe("rewritten"));
    write_script(&renamed, "renamed-original");
    write_script(&rewritten, "rewritten-original");

    let script = format!(
        "{} && {} && cat {} {}",
        renamed.display(),
        rewritten.display(),
        renamed.display(),
        rewritten.display()
    );
    let mut child = Command::new(exe)
        .args(["run", "--timeout", "300", "--", "sh", "-c", &script])
        // The test waits for an info line.
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("vrdma-vm starts");
    let stderr = child.stderr.take().unwrap();
    let (renamed_at, rewritten_at) = (renamed.clone(), rewritten.clone());
    let replacer = std::thread::spawn(move || {
        let mut replaced = false;
        let mut log = String::new();
        for line in std::io::BufReader::new(stderr).lines() {
            let line = line.unwrap();
            if !replaced && line.contains(vrdma_qemu_tests::vm::SNAPSHOT_TAKEN) {
                let partial = renamed_at.with_extension("partial");
                write_script(&partial, "renamed-REPLACED");
                std::fs::rename(&partial, &renamed_at).unwrap();
                std::fs::remove_file(&rewritten_at).unwrap();
                write_script(&rewritten_at, "rewritten-REPLACED");
                replaced = true;
            }
            log.push_str(&line);
            log.push('\n');
        }
        (replaced, log)
    });
    let output = child.wait_with_output().unwrap();
    let (replaced, log) = replacer.join().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    eprintln!("{stdout}{log}");
    for path in [&renamed, &rewritten] {
        std::fs::remove_file(path).unwrap();
    }
    assert!(output.status.success(), "{stdout}");
    assert!(replaced, "no snapshot was taken:\n{log}");
    for original in ["renamed-original", "rewritten-original"] {
        assert_eq!(stdout.matches(original).count(), 2, "{original}:\n{stdout}");
    }
    assert!(!stdout.contains("REPLACED"), "{stdout}");
}

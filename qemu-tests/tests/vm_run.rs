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

//! The agent's start-up as an operator meets it: a missing backend or group is a clear error
//! and an exit status, before any socket is created. (These tests also make `cargo test`
//! build the binary the VM scenarios run.)

use std::process::Command;

fn agent(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vrdma-guestd"))
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .expect("vrdma-guestd starts");
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), text)
}

fn scratch(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("vrdma-guestd-start-{}-{name}", std::process::id()))
}

#[test]
fn a_missing_backend_is_named_and_no_socket_is_left() {
    let socket = scratch("agent.sock");
    let backend = scratch("no-backend.sock");
    let (ok, text) = agent(&[
        "--backend",
        backend.to_str().unwrap(),
        "--socket",
        socket.to_str().unwrap(),
    ]);
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!(
            "the vrdma backend at {} is not usable",
            backend.display()
        )),
        "{text}"
    );
    assert!(!socket.exists());
}

#[test]
fn bad_options_are_refused_with_their_reason() {
    for (args, reason) in [
        (
            &["--backend", "/b", "--mode", "999"][..],
            "not an octal mode",
        ),
        (
            &["--backend", "/b", "--guest-ram-mib", "0"][..],
            "--guest-ram-mib must be a positive size",
        ),
        (&["--socket", "/s"][..], "--backend"),
        (
            &["--backend", "/b", "--max-processes-per-user", "0"][..],
            "invalid value '0' for '--max-processes-per-user",
        ),
    ] {
        let (ok, text) = agent(args);
        assert!(!ok && text.contains(reason), "{args:?}: {text}");
    }
}

#[test]
fn vm_mode_without_the_device_is_a_clear_error() {
    let socket = scratch("pci-agent.sock");
    let (ok, text) = agent(&[
        "--pci",
        "0000:ff:1f.7",
        "--socket",
        socket.to_str().unwrap(),
    ]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("cannot open the vrdma PCI device: no vrdma PCI device found"),
        "{text}"
    );
    assert!(!socket.exists());
    // One mode at a time.
    let (ok, text) = agent(&["--pci", "--backend", "/run/none.sock"]);
    assert!(!ok && text.contains("cannot be used with"), "{text}");
}

//! The tools' command lines, run as the VM suites run them (they also make `cargo test` build
//! the binaries the suites start): arguments are checked before anything is opened, and a
//! backend that is not there is one clear error naming its socket, not a hang or a panic.

use std::process::{Command, Output};

fn run(binary: &str, args: &[&str]) -> Output {
    Command::new(binary)
        .args(args)
        .env_remove("VRDMA_SOCKET")
        .env_remove("RUST_LOG")
        .output()
        .unwrap_or_else(|e| panic!("{binary}: {e}"))
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

const PINGPONG: &str = env!("CARGO_BIN_EXE_vrdma-pingpong");
const CTLBENCH: &str = env!("CARGO_BIN_EXE_vrdma-ctlbench");
const MISSING_SOCKET: &str = "/nonexistent/vrdma-tools-test.sock";

#[test]
fn pingpong_needs_a_transport_and_names_a_missing_backend() {
    let help = run(PINGPONG, &["--help"]);
    assert!(help.status.success(), "{}", stderr(&help));
    let usage = String::from_utf8_lossy(&help.stdout);
    assert!(
        usage.contains("server") && usage.contains("client"),
        "{usage}"
    );

    let no_transport = run(PINGPONG, &["client"]);
    assert_eq!(
        no_transport.status.code(),
        Some(2),
        "{}",
        stderr(&no_transport)
    );
    assert!(
        stderr(&no_transport).contains("--socket"),
        "{}",
        stderr(&no_transport)
    );

    let no_backend = run(PINGPONG, &["client", "--socket", MISSING_SOCKET]);
    assert_eq!(no_backend.status.code(), Some(1), "{}", stderr(&no_backend));
    let message = stderr(&no_backend);
    assert!(message.contains(MISSING_SOCKET), "{message}");
    assert!(!message.contains("panicked"), "{message}");
}

#[test]
fn ctlbench_needs_a_command_and_names_a_missing_backend() {
    let no_command = run(CTLBENCH, &["--socket", MISSING_SOCKET]);
    assert_eq!(no_command.status.code(), Some(2), "{}", stderr(&no_command));

    let no_backend = run(CTLBENCH, &["--socket", MISSING_SOCKET, "control"]);
    assert!(!no_backend.status.success());
    let message = stderr(&no_backend);
    assert!(message.contains(MISSING_SOCKET), "{message}");
    assert!(!message.contains("panicked"), "{message}");
}

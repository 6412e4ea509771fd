//! The data path bypasses the backend: with the backend stopped (SIGSTOP), a native peer
//! RDMA-WRITEs into and SENDs to a vrdma process that posted its receives beforehand.

use crate::scenarios::pingpong_peer::PEER_TIMEOUT_S;
use std::time::Duration;

use super::pair::{bypass_start_file, pingpong, start_pair, Impl, Plan};
use crate::error::{Error, Result};
use crate::scenarios::backend::Backend;
use crate::scenarios::binaries::Binaries;

/// The vrdma server posts its receives and reports READY; the backend is then stopped and the
/// native client RDMA-WRITEs and SENDs one way. The vrdma server verifies every message with
/// the backend stopped; then the backend resumes and a normal exchange (vrdma sends) works.
pub(super) fn run(binaries: &Binaries, backend: &Backend, port: u16) -> Result<u32> {
    const MESSAGES: u32 = 50;
    let plan = Plan {
        ops: "write,send,write_imm,send_imm",
        sizes: "64,4096,65536",
        iters: MESSAGES,
        bw: false,
        oneway: true,
        timeout_s: PEER_TIMEOUT_S,
        tool_args: &[],
    };
    let (mut server, mut client) = start_pair(
        binaries,
        backend,
        (Impl::Vrdma, Impl::Native),
        &plan,
        port,
        "bypass",
        &[],
    )?;
    // The vrdma side prints READY once its QP is connected and every receive is posted; only
    // then is the backend stopped, and only then does it let the client send.
    server.wait_for_output("READY", Duration::from_secs(120))?;
    backend.proc.signal("STOP")?;
    backend.proc.wait_state('T', Duration::from_secs(30))?;
    let go = bypass_start_file();
    std::fs::write(&go, b"go")
        .map_err(|e| Error::Scenario(format!("writing {}: {e}", go.display())))?;
    let outcome = client
        .wait_success(Duration::from_secs(300))
        .and_then(|()| server.wait_success(Duration::from_secs(60)));
    let still_stopped = backend.proc.state() == Some('T');
    backend.proc.signal("CONT")?;
    let _ = std::fs::remove_file(&go);
    outcome?;
    if !still_stopped {
        return Err(Error::Scenario(
            "the backend was not stopped for the whole one-way run".into(),
        ));
    }
    println!("  ok: {MESSAGES} messages per op/size landed and completed with the backend stopped");
    // Resumed: the next send from vrdma works.
    let plan = Plan {
        ops: "send",
        sizes: "64",
        iters: 10,
        bw: false,
        oneway: false,
        timeout_s: PEER_TIMEOUT_S,
        tool_args: &[],
    };
    pingpong(
        binaries,
        backend,
        (Impl::Native, Impl::Vrdma),
        &plan,
        port + 1000,
        "after-bypass",
    )?;
    println!("  ok: after SIGCONT the next vrdma send works");
    Ok(MESSAGES)
}

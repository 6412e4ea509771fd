//! A UD exchange: a vrdma client against a native server, every byte verified.

use super::pair::{pingpong, Impl, Plan};
use super::settings::Settings;
use crate::error::Result;
use crate::scenarios::backend::Backend;
use crate::scenarios::binaries::Binaries;
use crate::scenarios::pingpong_peer::PingpongRow;
use crate::scenarios::pingpong_peer::PEER_TIMEOUT_S;

/// Runs the UD ping-pong on `port`; returns the vrdma client's rows.
pub(super) fn run(
    binaries: &Binaries,
    backend: &Backend,
    settings: &Settings,
    port: u16,
) -> Result<Vec<PingpongRow>> {
    let plan = Plan {
        ops: "ud_send",
        sizes: "1,64,512",
        iters: settings.small_iters,
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
        port,
        "ud",
    )
}

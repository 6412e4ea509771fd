//! Verified ping-pongs between the four pairings of vrdma and native peers: every operation
//! and size with every byte checked, then a bandwidth stream.

use super::pair::{pingpong, Impl, Plan};
use super::settings::Settings;
use crate::error::Result;
use crate::scenarios::backend::Backend;
use crate::scenarios::binaries::Binaries;
use crate::scenarios::pingpong_peer::PingpongRow;
use crate::scenarios::pingpong_peer::PEER_TIMEOUT_S;

const VERIFY_OPS: &str = "send,send_imm,write,write_imm,read";
const SMALL_SIZES: &str = "1,64,4096";
const LARGE_SIZES: &str = "65536,1048576";

/// The pairings by label "client-over-server", as (server, client).
pub(super) const PAIRS: [(&str, (Impl, Impl)); 4] = [
    ("native-over-native", (Impl::Native, Impl::Native)),
    ("vrdma-over-native", (Impl::Native, Impl::Vrdma)),
    ("native-over-vrdma", (Impl::Vrdma, Impl::Native)),
    ("vrdma-over-vrdma", (Impl::Vrdma, Impl::Vrdma)),
];

/// Runs the verified ping-pongs (small then large sizes) and the bandwidth stream between
/// `pair`; returns the client's rows.
pub(super) fn run(
    binaries: &Binaries,
    backend: &Backend,
    pair: (Impl, Impl),
    settings: &Settings,
    label: &str,
    next_port: &mut dyn FnMut() -> u16,
) -> Result<Vec<PingpongRow>> {
    println!("== {label}: verified ping-pong");
    let mut rows = Vec::new();
    for (sizes, iters) in [
        (SMALL_SIZES, settings.small_iters),
        (LARGE_SIZES, settings.large_iters),
    ] {
        let plan = Plan {
            ops: VERIFY_OPS,
            sizes,
            iters,
            bw: false,
            oneway: false,
            timeout_s: PEER_TIMEOUT_S,
            tool_args: &[],
        };
        rows.extend(pingpong(
            binaries,
            backend,
            pair,
            &plan,
            next_port(),
            label,
        )?);
    }
    let plan = Plan {
        ops: "write,send",
        sizes: "4096,65536,1048576",
        iters: settings.large_iters * 10,
        bw: true,
        oneway: false,
        timeout_s: PEER_TIMEOUT_S,
        tool_args: &[],
    };
    println!("== {label}: bandwidth");
    rows.extend(pingpong(
        binaries,
        backend,
        pair,
        &plan,
        next_port(),
        label,
    )?);
    Ok(rows)
}

//! rsockets: Debian's unmodified `rstream` (rdmacm-utils) with both sides native (rdma-core's
//! rsockets on rxe0) and with both over vrdma's drop-in `librdmacm.so.1` (two sessions of
//! one backend), alternating for the plan's rounds: the latency of a 64-byte ping-pong and
//! the bandwidth of 64 KiB transfers, blocking calls (`-T b`: `MSG_WAITALL`, no busy retry,
//! which on two vCPUs would have the two sides' spinning compete with the work).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::control::ControlRow;
use super::stats::Summary;
use crate::error::Result;
use crate::inside::Proc;
use crate::perftest::Side;
use crate::scenarios::rdmacm_utils::{command, link_local_address, wait_cm_listening};

/// What the rsockets measurement does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RsocketsPlan {
    /// Ping-pong iterations of the latency row.
    pub latency_iterations: u32,
    /// Transfers of the bandwidth row.
    pub bandwidth_transfers: u32,
    /// Runs of each side (native and vrdma alternating).
    pub rounds: u32,
}

/// The latency row: microseconds per 64-byte transfer as rstream reports it.
pub const LATENCY: &str = "rstream_lat_64";
/// The bandwidth row: Gbit/s of 64 KiB transfers as rstream reports it.
pub const BANDWIDTH: &str = "rstream_bw_64k";

/// What rstream's "custom" line says: Gbit/s and microseconds per transfer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    pub gbit_per_s: f64,
    pub us_per_xfer: f64,
}

/// Reads rstream's result line (`custom <bytes> <xfers> <iters> <total> <time>s <Gb/sec>
/// <usec/xfer>`).
pub fn parse(output: &str) -> std::result::Result<Measured, String> {
    let line = output
        .lines()
        .find(|l| l.starts_with("custom"))
        .ok_or_else(|| "rstream printed no result line".to_string())?;
    let fields: Vec<&str> = line.split_whitespace().collect();
    let number = |i: usize| -> std::result::Result<f64, String> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| format!("rstream line {line:?}: field {i} is not a number"))
    };
    Ok(Measured {
        gbit_per_s: number(6)?,
        us_per_xfer: number(7)?,
    })
}

/// One rstream server and client, both on `side`: the client's figures.
fn run_pair(side: &Side, address: &str, port: u16, args: &[String]) -> Result<Measured> {
    let name = |role: &str| format!("rstream-bench-{}-{role}", side.label);
    let port_arg = port.to_string();
    let mut server_args: Vec<String> = ["-b", address, "-p", &port_arg].map(String::from).into();
    server_args.extend_from_slice(args);
    let mut server = Proc::spawn(&name("server"), &mut command("rstream", side, &server_args))?;
    wait_cm_listening(&mut server, port, Duration::from_secs(60))?;
    let mut client_args: Vec<String> = ["-s", address, "-p", &port_arg].map(String::from).into();
    client_args.extend_from_slice(args);
    let mut client = Proc::spawn(&name("client"), &mut command("rstream", side, &client_args))?;
    client.wait_success(Duration::from_secs(300))?;
    server.wait_success(Duration::from_secs(60))?;
    parse(&client.output()).map_err(|why| client.failure(&why))
}

/// Runs the plan: per round, the latency and the bandwidth case, each natively and over vrdma.
pub fn run(plan: &RsocketsPlan, native: &Side, vrdma: &Side) -> Result<Vec<ControlRow>> {
    let address = link_local_address()?;
    println!(
        "rsockets: rstream, {} ping-pongs and {} transfers x{} …",
        plan.latency_iterations, plan.bandwidth_transfers, plan.rounds
    );
    let latency: Vec<String> = [
        "-S".into(),
        "64".into(),
        "-C".into(),
        "1".into(),
        "-I".into(),
        plan.latency_iterations.to_string(),
        "-T".into(),
        "b".into(),
    ]
    .into();
    let bandwidth: Vec<String> = [
        "-S".into(),
        "65536".into(),
        "-C".into(),
        plan.bandwidth_transfers.to_string(),
        "-I".into(),
        "1".into(),
        "-T".into(),
        "b".into(),
    ]
    .into();
    let mut lat = (Vec::new(), Vec::new());
    let mut bw = (Vec::new(), Vec::new());
    let mut port = 7800;
    for _ in 0..plan.rounds {
        for (i, side) in [native, vrdma].into_iter().enumerate() {
            let l = run_pair(side, &address, port, &latency)?;
            let b = run_pair(side, &address, port + 1, &bandwidth)?;
            port += 2;
            let (lat_side, bw_side) = if i == 0 {
                (&mut lat.0, &mut bw.0)
            } else {
                (&mut lat.1, &mut bw.1)
            };
            lat_side.push(l.us_per_xfer);
            bw_side.push(b.gbit_per_s);
        }
    }
    Ok(vec![
        ControlRow::compare(
            LATENCY,
            "us_per_xfer",
            Summary::of(&lat.0),
            Summary::of(&lat.1),
        )?,
        ControlRow::compare(
            BANDWIDTH,
            "gbit_per_s",
            Summary::of(&bw.0),
            Summary::of(&bw.1),
        )?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rstream_result_lines_are_read() {
        let out = "name      bytes   xfers   iters   total       time     Gb/sec    usec/xfer\n\
                   custom    64k     20      2       5m          0.19s      0.22    2396.21\n";
        assert_eq!(
            parse(out),
            Ok(Measured {
                gbit_per_s: 0.22,
                us_per_xfer: 2396.21
            })
        );
        assert!(parse("name bytes\n").is_err());
        assert!(parse("custom 64k 20 2 5m 0.19s fast\n").is_err());
    }
}

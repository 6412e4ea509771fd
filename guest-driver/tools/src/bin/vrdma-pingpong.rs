//! `vrdma-pingpong`: proves and measures vrdma's data path.
//!
//! Runs the protocol of [`vrdma_tools::pingpong`] over the vrdma verbs API, as server or client,
//! against another `vrdma-pingpong` or the native peer `vrdma-native-pingpong`; every received
//! byte is verified and the client prints latency and bandwidth per operation and size.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use vrdma::verbs::Context;
use vrdma_tools::pingpong::options::{Options, PathAttrs};
use vrdma_tools::pingpong::runner::{run_client, run_server};
use vrdma_tools::pingpong::wait::Completion;
use vrdma_tools::pingpong::{Plan, DEFAULT_PORT, DEFAULT_TIMEOUT_SECS};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Role {
    /// Listen for one client and run its plan.
    Server,
    /// Connect to a server, run the plan and print the results.
    Client,
}

#[derive(Parser, Debug)]
#[command(version, about = "Verify and measure vrdma's data path against a peer")]
struct Cli {
    role: Role,
    /// The vrdma backend's vhost-user socket (process transport).
    #[arg(long, env = "VRDMA_SOCKET", required_unless_present_any = ["pci", "agent"])]
    socket: Option<PathBuf>,
    /// The guest agent's socket (agent transport: vrdma-guestd drives the device). A backend
    /// socket, if also given, wins, as in the drop-in.
    #[arg(long, env = "VRDMA_AGENT")]
    agent: Option<PathBuf>,
    /// Use the vrdma PCI device of this guest (PCI transport; needs root and hugepages),
    /// the one at this address (dddd:bb:dd.f) or the first one found.
    #[arg(long, value_name = "ADDRESS", num_args = 0..=1, default_missing_value = "")]
    pci: Option<String>,
    /// TCP port of the out-of-band exchange.
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Address to listen on (server) or connect to (client).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Operations, comma-separated: send, send_imm, write, write_imm, read, ud_send.
    #[arg(long, default_value = "send,send_imm,write,write_imm,read,ud_send")]
    ops: String,
    /// Message sizes in bytes, comma-separated (1..=1048576).
    #[arg(long, default_value = "1,64,4096,65536,1048576")]
    sizes: String,
    /// Iterations per operation and size (messages in --bw mode).
    #[arg(long, default_value_t = 100)]
    iters: u32,
    /// Bandwidth mode: stream messages (send and write only) instead of ping-pong.
    #[arg(long)]
    bw: bool,
    /// One-way mode: only the client sends (not read); the server verifies each message and
    /// acknowledges it over TCP, posting no send itself.
    #[arg(long, conflicts_with = "bw")]
    oneway: bool,
    /// Once the queue pairs are ready (after printing READY on stderr), wait for this file to
    /// exist before starting.
    #[arg(long)]
    start_file: Option<PathBuf>,
    /// Outstanding messages in --bw mode.
    #[arg(long, default_value_t = 16)]
    window: u32,
    /// Area size in bytes: the server refuses plans that need more, the client uses at
    /// least what its plan needs [default: what this side's own --ops/--sizes need].
    #[arg(long)]
    len: Option<u64>,
    /// Bound of every wait, in seconds.
    #[arg(long, default_value_t = DEFAULT_TIMEOUT_SECS)]
    timeout: u64,
    /// Wait for completions by sleeping on completion events (arm the CQ, poll once more,
    /// sleep until its event) instead of busy polling.
    #[arg(long)]
    events: bool,
    /// Also write the results as JSON to this file (client).
    #[arg(long)]
    json: Option<PathBuf>,
    /// RC path MTU in bytes: 256, 512, 1024, 2048 or 4096.
    #[arg(long, default_value_t = 1024)]
    mtu: u32,
    /// RC local ACK timeout: 4.096 us * 2^N.
    #[arg(long, default_value_t = 14, value_parser = clap::value_parser!(u8).range(0..=31))]
    qp_timeout: u8,
    /// RC transport retries before a send fails (0-7; rxe retries for ever at 7).
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u8).range(0..=7))]
    retry_cnt: u8,
    /// RC RNR retries before a send fails (0-7; 7 retries for ever).
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u8).range(0..=7))]
    rnr_retry: u8,
    /// RNR NAK timer this side's QP asks its peer to wait (IB encoding 0-31: 1 = 0.01 ms,
    /// 14 = 1.28 ms, 31 = 491.52 ms, 0 = 655.36 ms).
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u8).range(0..=31))]
    min_rnr_timer: u8,
    /// Post the RC receives only once this file exists (after the ready exchange): the
    /// peer's sends meet RNR NAKs until then.
    #[arg(long)]
    receives_after: Option<PathBuf>,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("vrdma-pingpong: error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> Result<(), String> {
    let mode = if cli.bw {
        format!("bw{}", cli.window)
    } else if cli.oneway {
        "oneway".to_string()
    } else {
        "verify".to_string()
    };
    let plan = Plan::from_parts(&cli.ops, &cli.sizes, &cli.iters.to_string(), &mode)
        .map_err(|e| e.to_string())?;
    if cli.timeout == 0 {
        return Err("--timeout must be at least 1 second".into());
    }
    let opts = Options {
        host: cli.host.clone(),
        port: cli.port,
        timeout: Duration::from_secs(cli.timeout),
        len: cli.len.unwrap_or(plan.area_len()),
        start_file: cli.start_file.clone(),
        completion: if cli.events {
            Completion::Events
        } else {
            Completion::Poll
        },
        path: PathAttrs {
            mtu: PathAttrs::mtu_of(cli.mtu)
                .ok_or_else(|| format!("--mtu {}: 256, 512, 1024, 2048 or 4096", cli.mtu))?,
            timeout: cli.qp_timeout,
            retry_cnt: cli.retry_cnt,
            rnr_retry: cli.rnr_retry,
            min_rnr_timer: cli.min_rnr_timer,
        },
        receives_after: cli.receives_after.clone(),
    };
    let ctx = match (&cli.pci, &cli.agent, &cli.socket) {
        (Some(address), _, _) => {
            let address = (!address.is_empty()).then_some(address.as_str());
            Context::open_pci(address).map_err(|e| e.to_string())?
        }
        (None, _, Some(socket)) => Context::connect_process(socket)
            .map_err(|e| format!("opening vrdma at {}: {e}", socket.display()))?,
        (None, Some(agent), None) => Context::connect_agent(agent).map_err(|e| {
            format!(
                "opening vrdma through the agent at {}: {e}",
                agent.display()
            )
        })?,
        (None, None, None) => {
            return Err("give --socket (or VRDMA_SOCKET), --agent (or VRDMA_AGENT) or --pci".into())
        }
    };
    match cli.role {
        Role::Server => {
            let served = run_server(&ctx, &opts).map_err(|e| e.to_string())?;
            println!(
                "server: {} steps of {} iterations verified",
                served.steps,
                served.plan.iters()
            );
            if served.completion == Completion::Events {
                println!("server: completion: events; {}", served.events.summary());
            }
            // Only now: destroying the resources needs the backend.
            drop(served.resources);
        }
        Role::Client => {
            let report = run_client(&ctx, &plan, &opts).map_err(|e| e.to_string())?;
            print!("{}", report.to_table());
            if let Some(path) = &cli.json {
                std::fs::write(path, report.to_json())
                    .map_err(|e| format!("writing {}: {e}", path.display()))?;
            }
        }
    }
    Ok(())
}

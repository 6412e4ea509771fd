//! vrdma-hostile: a hostile guest for the malicious-guest suite. Runs attacks on the device
//! (see `vrdma_tools::hostile`), prints one line per attack and a JSON report, and exits 0
//! only if every attack was refused and every control succeeded.

use std::net::Ipv6Addr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use vrdma::verbs::{AccessFlags, Context};
use vrdma_tools::hostile::{self, Attack, Targets};

#[derive(Debug, Parser)]
#[command(
    name = "vrdma-hostile",
    about = "attacks a vrdma device; every attack must fail"
)]
struct Args {
    /// The attacker's vhost-user socket (process transport).
    #[arg(long, env = "VRDMA_SOCKET")]
    socket: PathBuf,
    /// Attacks to run (default: those that need no target).
    #[arg(long, value_enum, value_delimiter = ',')]
    attack: Vec<Attack>,
    /// Another guest's socket, where cross-guest attacks create their victims.
    #[arg(long)]
    victim_socket: Option<PathBuf>,
    /// Pages of the scattered and repeated page lists.
    #[arg(long, default_value_t = 4096)]
    pages: u32,
    /// A traffic class outside the attacker's allowed set.
    #[arg(long, default_value_t = 0xb8)]
    bad_traffic_class: u8,
    /// Malformed commands of the log flood.
    #[arg(long, default_value_t = 20_000)]
    flood: u32,
    /// Bytes of each MR of the pinned-memory attack.
    #[arg(long, default_value_t = 16 << 20)]
    pin_chunk: usize,
    /// Most UD QPs of the staged-queue attack (reaching it: nothing bounded them).
    #[arg(long, default_value_t = 1024)]
    queue_bound: u32,
    /// A destination outside the attacker's allowed peers.
    #[arg(long)]
    forbidden_peer: Option<Ipv6Addr>,
    /// Write the outcomes as JSON to this file.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Instead of attacking: register large MRs in a loop and exit abruptly after this many
    /// milliseconds, most likely in the middle of a command (the daemon must discard cleanly).
    #[arg(long)]
    die_during_commands_ms: Option<u64>,
}

/// Attacks that need nothing but the attacker's own device.
const SELF_CONTAINED: [Attack; 10] = [
    Attack::SgidAv,
    Attack::SgidAltPath,
    Attack::SgidAh,
    Attack::ForgedUdAv,
    Attack::ForeignAhNum,
    Attack::ScatteredPages,
    Attack::RepeatedPages,
    Attack::PinBudget,
    Attack::StagedQueues,
    Attack::LogFlood,
];

fn die_during_commands(ctx: &Context, after: Duration) -> ! {
    let ctx = ctx.clone();
    std::thread::spawn(move || {
        let pd = ctx.alloc_pd().expect("ALLOC_PD");
        let mut held = Vec::new();
        loop {
            let Ok(buffer) = ctx.alloc_buffer(8 << 20) else {
                held.clear();
                continue;
            };
            match pd.register_owned(buffer, AccessFlags::LOCAL_WRITE) {
                Ok(mr) => held.push(mr),
                Err(_) => held.clear(),
            }
        }
    });
    std::thread::sleep(after);
    println!("exiting in the middle of the registrations");
    std::process::exit(0)
}

fn main() -> ExitCode {
    env_logger::init();
    let args = Args::parse();
    let ctx = match Context::connect_process(&args.socket) {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!(
                "vrdma-hostile: connecting to {}: {e}",
                args.socket.display()
            );
            return ExitCode::from(2);
        }
    };
    if let Some(ms) = args.die_during_commands_ms {
        die_during_commands(&ctx, Duration::from_millis(ms));
    }
    let targets = Targets {
        victim_socket: args.victim_socket.clone(),
        pages: args.pages,
        bad_traffic_class: args.bad_traffic_class,
        flood: args.flood,
        pin_chunk: args.pin_chunk,
        queue_bound: args.queue_bound,
        forbidden_peer: args.forbidden_peer.map(|a| a.octets()),
    };
    let attacks = if args.attack.is_empty() {
        SELF_CONTAINED.to_vec()
    } else {
        args.attack.clone()
    };
    let mut outcomes = Vec::new();
    for attack in attacks {
        let outcome = hostile::run(&ctx, attack, &targets);
        println!(
            "{:<16} {} attempts={} refused={} by={:?} accepted={:?} controls_passed={} controls_failed={:?} notes={:?}",
            format!("{attack:?}"),
            if outcome.held() { "HELD" } else { "BREACHED" },
            outcome.attempts,
            outcome.refused,
            outcome.refusals,
            outcome.accepted,
            outcome.controls_passed,
            outcome.controls_failed,
            outcome.notes,
        );
        outcomes.push(outcome);
    }
    if let Some(path) = &args.report {
        let json = serde_json::to_string_pretty(&outcomes).expect("outcomes serialize");
        if let Err(e) = std::fs::write(path, json) {
            eprintln!("vrdma-hostile: writing {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    if outcomes.iter().all(|o| o.held()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

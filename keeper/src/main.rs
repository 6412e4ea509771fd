//! `vrdma-keeper`: listens on a VM's vhost-user socket and relays it to vrdma-backend, which
//! may restart underneath (see the crate documentation).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use log::error;

use vrdma_keeper::relay::{DaemonSocket, Keeper};

#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The socket QEMU connects to (its `-chardev socket,path=`).
    #[arg(long)]
    socket: PathBuf,
    /// The daemon's socket for this VM (vrdma-backend's `--socket` or a guest's `socket`).
    #[arg(long)]
    backend: PathBuf,
    /// Milliseconds between two attempts to reach a daemon.
    #[arg(long, default_value_t = 100)]
    retry_ms: u64,
    /// Longest wait, in milliseconds, for one answer of a daemon taking a connection over.
    #[arg(long, default_value_t = 10_000)]
    replay_timeout_ms: u64,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = Args::parse();
    let daemon = DaemonSocket {
        path: args.backend,
        retry: Duration::from_millis(args.retry_ms.max(1)),
        replay_timeout: Duration::from_millis(args.replay_timeout_ms.max(1)),
    };
    let result = Keeper::bind(&args.socket, daemon).and_then(|keeper| keeper.run());
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}

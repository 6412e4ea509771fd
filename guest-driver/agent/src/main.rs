//! `vrdma-guestd`: the guest agent. It alone drives the vrdma device and serves any number of
//! unprivileged application processes over a unix socket whose owner, group and mode decide
//! who may use RDMA. Control verbs go through it; each process's data path stays in that
//! process (see `vrdma::transport::agent`).
//!
//! Process mode (`--backend`): the agent opens one vhost-user session with the backend per
//! application process, so that each process has its own guest RAM, handle namespace, quotas
//! and host verbs context, all released by the backend when the process goes.

use std::path::PathBuf;
use std::sync::Arc;
use std::thread;

use clap::Parser;
use log::{error, info, warn};
use vrdma::transport::agent::DEFAULT_AGENT_SOCKET;

mod admission;
mod listener;
mod session;

use admission::Admission;
use session::{Peer, SessionOptions};

/// The vrdma guest agent.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The vrdma backend's vhost-user socket (process mode: one session per application
    /// process).
    #[arg(long, env = "VRDMA_BACKEND_SOCKET")]
    backend: PathBuf,

    /// Where applications connect.
    #[arg(long, default_value = DEFAULT_AGENT_SOCKET)]
    socket: PathBuf,

    /// Group that owns the socket (its members may use RDMA).
    #[arg(long)]
    group: Option<String>,

    /// Mode of the socket (octal).
    #[arg(long, default_value = "660", value_parser = parse_mode)]
    mode: u32,

    /// Guest RAM of each application process (its registrable memory), in MiB.
    #[arg(long, default_value_t = 1024)]
    guest_ram_mib: usize,

    /// Application processes served at once; further ones are refused.
    #[arg(long, default_value_t = 256)]
    max_processes: usize,

    /// Application processes of any one user served at once.
    #[arg(long, default_value_t = 64)]
    max_processes_per_user: usize,
}

fn parse_mode(text: &str) -> Result<u32, String> {
    u32::from_str_radix(text, 8)
        .ok()
        .filter(|mode| *mode <= 0o777)
        .ok_or_else(|| format!("{text:?} is not an octal mode"))
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = Args::parse();
    if let Err(e) = run(&args) {
        error!("{e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), String> {
    let options = SessionOptions {
        backend: args.backend.clone(),
        guest_ram_size: args
            .guest_ram_mib
            .checked_mul(1 << 20)
            .filter(|size| *size > 0)
            .ok_or("--guest-ram-mib must be a positive size")?,
    };
    // Fail at start, with the reason, rather than at each application's first verb.
    session::probe(&options).map_err(|e| {
        format!(
            "the vrdma backend at {} is not usable: {e}",
            options.backend.display()
        )
    })?;
    let listener = listener::listen(&args.socket, args.group.as_deref(), args.mode)
        .map_err(|e| e.to_string())?;
    info!(
        "serving {} for the backend at {}",
        args.socket.display(),
        options.backend.display()
    );
    let options = Arc::new(options);
    let admission = Admission::new(args.max_processes, args.max_processes_per_user);
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(stream) => stream,
            Err(e) => {
                warn!("accept: {e}");
                continue;
            }
        };
        let peer = match Peer::of(&stream) {
            Ok(peer) => peer,
            Err(e) => {
                warn!("SO_PEERCRED: {e}");
                continue;
            }
        };
        let ticket = match admission.admit(peer.uid) {
            Ok(ticket) => ticket,
            Err(why) => {
                warn!("process {} (uid {}) refused: {why}", peer.pid, peer.uid);
                session::refuse(&stream, &why.to_string());
                continue;
            }
        };
        let options = options.clone();
        // The ticket goes with the thread (or with the closure if no thread starts).
        let spawned = thread::Builder::new()
            .name(format!("process-{}", peer.pid))
            .spawn(move || {
                session::serve(stream, peer, &options);
                drop(ticket);
            });
        if let Err(e) = spawned {
            warn!("cannot serve process {}: {e}", peer.pid);
        }
    }
    Ok(())
}

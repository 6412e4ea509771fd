//! vrdma-backend: the vhost-user daemon of the vrdma device (see spec/README.md). The daemon
//! is the library's ([`vrdma_backend::daemon`]); this is its process.

use std::process::ExitCode;

use clap::Parser;
use vrdma_backend::daemon::{self, Args};

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_micros()
        .init();
    let args = Args::parse();
    match daemon::run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vrdma-backend: {e}");
            ExitCode::FAILURE
        }
    }
}

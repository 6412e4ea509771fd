//! `vrdma-deb`: builds `vrdma-guest_<version>_<arch>.deb`, the package that installs vrdma's
//! guest side as a Debian user expects: the drop-in `libibverbs.so.1`/`librdmacm.so.1` for
//! every program (no `LD_LIBRARY_PATH`), the guest agent `vrdma-guestd` with its systemd
//! unit and settings, and the group `rdma` whose members use the device.
//!
//! ```sh
//! cargo build --release -p vrdma-ibverbs -p vrdma-guestd
//! cargo run -p vrdma-packaging -- --artifacts target/release --out target/debian
//! dpkg -i target/debian/vrdma-guest_*.deb     # in the guest
//! ```

mod contents;
mod control;
mod deb;
mod elf;
mod error;
mod rdmacm_forwarder;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Builds the vrdma-guest Debian package from a cargo build.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Where cargo put `libvrdma_ibverbs.so` and `vrdma-guestd`.
    #[arg(long, default_value = "target/release")]
    artifacts: PathBuf,

    /// Where the package goes.
    #[arg(long, default_value = "target/debian")]
    out: PathBuf,

    /// The package's version.
    #[arg(long = "package-version", default_value = env!("CARGO_PKG_VERSION"))]
    package_version: String,

    /// Compression of the archive's members.
    #[arg(long, value_enum, default_value = "xz")]
    compression: deb::Compression,

    /// Keep the binaries' debugging information.
    #[arg(long)]
    no_strip: bool,

    /// The C compiler that links the librdmacm forwarder.
    #[arg(long, env = "CC", default_value = "cc")]
    cc: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = std::fs::create_dir_all(&args.out) {
        eprintln!("vrdma-deb: {}: {e}", args.out.display());
        return ExitCode::FAILURE;
    }
    let options = deb::Options {
        artifacts: args.artifacts,
        out: args.out,
        version: args.package_version,
        compression: args.compression,
        strip: !args.no_strip,
        cc: args.cc,
    };
    match deb::build_guest_package(&options) {
        Ok(path) => {
            println!("{}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vrdma-deb: {e}");
            ExitCode::FAILURE
        }
    }
}

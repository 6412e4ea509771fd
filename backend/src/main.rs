//! vrdma-backend: the vhost-user daemon of the vrdma device (see spec/README.md).

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "vrdma-backend: not implemented yet: the device is specified in spec/README.md; \
         the daemon lands with the data-path work"
    );
    ExitCode::FAILURE
}

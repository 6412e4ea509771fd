//! vrdma-tools: test tools over the vrdma guest library, kept out of the library itself so that
//! `libibverbs.so.1` links no command-line or JSON dependencies.
//!
//! [`pingpong`] is the data-path ping-pong protocol; [`hostile`] the attacks of the
//! malicious-guest suite (bin `vrdma-hostile`); the binaries `vrdma-pingpong` (that
//! protocol's command line) and `vrdma-ctlbench` (the control-path and doorbell benches of
//! `vrdma-vm bench`) live in `src/bin/`.

pub mod hostile;
pub mod pingpong;

//! The drop-in libibverbs.so.1 against real rdma_rxe, in the VM.

mod common;

#[test]
fn unmodified_verbs_programs_run_over_vrdma() {
    common::vrdma_vm(&["test", "dropin", "--no-build"]);
}

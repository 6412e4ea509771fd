//! The backend's host-device layer against real rdma_rxe, in the VM.

mod common;

#[test]
fn backend_device_layer_works_on_rxe() {
    // `cargo test --workspace` has built the backend's device_rxe test binary by now: cargo
    // builds every test target before it runs any.
    common::vrdma_vm(&["test", "backend-device"]);
}

//! Test scenarios that run inside the rxe VM against a live vrdma-backend.

pub mod backend;
pub mod binaries;
pub mod isolation;
pub mod perftest_over_vrdma;
pub mod pingpong_peer;
pub mod process_pingpong;
pub mod qtest_pingpong;
pub mod rdmacm_utils;
pub mod readme_qemu;
pub mod real_guest;
pub mod tenants;
pub mod verbs_utils;
